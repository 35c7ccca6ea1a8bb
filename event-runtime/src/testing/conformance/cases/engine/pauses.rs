//! The engine's cases on pauses and stopping: a paused destination, one that pauses itself while unavailable, workers stopped by the application's token or an aborted shutdown.

use super::*;

pub async fn a_paused_destination_is_not_claimed_and_uses_no_attempts(db: &Case) {
    let calls = Arc::new(Calls::default());
    let outbox = outbox_with(
        db,
        &calls,
        Dispatcher::builder_empty()
            .handler::<external>()
            .handler::<external2>(),
        |b| b,
    )
    .await;
    let s = outbox.store();
    s.pause_destination("engine.ext", "the mail provider is down")
        .await
        .unwrap();
    let ids = commit(&outbox, "ps", 1, vec![Act::Ok, Act::Ok]).await;
    outbox.drain(DRAIN).await.unwrap();
    for id in &ids {
        assert!(
            status_is(s, "engine.ext2", *id, "completed").await,
            "{}",
            db.label()
        );
        assert!(
            status_is(s, "engine.ext", *id, "pending").await,
            "{}",
            db.label()
        );
        assert_eq!(attempts(s, "engine.ext", *id).await, 0);
    }
    let paused = s.paused_destinations().await.unwrap();
    assert_eq!(paused.len(), 1);
    assert_eq!(
        (paused[0].destination.as_str(), paused[0].paused_by.as_str()),
        ("engine.ext", "operator")
    );
    let stats = s.stats().await.unwrap();
    assert!(stats
        .handlers
        .iter()
        .any(|h| h.handler == "engine.ext" && h.paused));
    // The backlog the gauges read agrees: the paused destination's two deliveries wait.
    let backlog = s.backlog().await.unwrap();
    let pending: Vec<(&str, u64)> = backlog
        .destinations
        .iter()
        .map(|d| (d.destination.as_str(), d.pending))
        .collect();
    assert_eq!(pending, [("engine.ext", 2)], "{}", db.label());
    assert_eq!(backlog.pending(), stats.pending, "{}", db.label());
    let age = backlog.oldest_pending_age_secs().unwrap();
    assert!((0.0..60.0).contains(&age), "{}: {age}", db.label());
    assert_eq!(backlog.paused, ["engine.ext"], "{}", db.label());
    assert_eq!(backlog.dead_letters, stats.dead_letters, "{}", db.label());
    // A second process sees the pause too.
    let other = db.open().await;
    assert_eq!(other.paused_destinations().await.unwrap().len(), 1);

    assert!(s.resume_destination("engine.ext").await.unwrap());
    outbox.drain(DRAIN).await.unwrap();
    let backlog = s.backlog().await.unwrap();
    assert!(
        backlog.destinations.is_empty(),
        "{}: {backlog:?}",
        db.label()
    );
    assert!(backlog.paused.is_empty(), "{}: {backlog:?}", db.label());
    for id in &ids {
        assert!(
            status_is(s, "engine.ext", *id, "completed").await,
            "{}",
            db.label()
        );
        assert_eq!(attempts(s, "engine.ext", *id).await, 1);
    }
}

/// A transport's destination whose broker can be switched off.
struct Flaky {
    up: AtomicBool,
    delivered: Mutex<Vec<Uuid>>,
}

#[async_trait]
impl Destination for Flaky {
    fn name(&self) -> &str {
        "engine.relay"
    }

    fn route(&self, event: &EventDescriptor) -> Option<Routing> {
        (event.name == "engine.ticked").then_some(Routing { ordered: true })
    }

    async fn deliver(&self, d: &Delivery<'_>) -> Result<(), DeliveryError> {
        if !self.up.load(Ordering::SeqCst) {
            return Err(DeliveryError::Unavailable {
                reason: "connection refused".into(),
                retry_after: Duration::from_millis(100),
            });
        }
        self.delivered.lock().unwrap().push(d.event_id);
        Ok(())
    }

    async fn available(&self) -> bool {
        self.up.load(Ordering::SeqCst)
    }
}

pub async fn an_unavailable_destination_pauses_itself_until_it_is_back(db: &Case) {
    let calls = Arc::new(Calls::default());
    let store = db.open().await;
    setup(&store).await;
    let relay = Arc::new(Flaky {
        up: AtomicBool::new(false),
        delivered: Mutex::new(Vec::new()),
    });
    let outbox = Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().handler::<external2>())
        .destination(Arc::clone(&relay) as Arc<dyn Destination>)
        .resource_arc(Arc::clone(&calls))
        .config(fast())
        .build()
        .unwrap();
    let ids = commit(&outbox, "u", 1, vec![Act::Ok, Act::Ok, Act::Ok]).await;
    outbox.drain(DRAIN).await.unwrap();
    let s = outbox.store();
    let paused = s.paused_destinations().await.unwrap();
    assert_eq!(paused.len(), 1, "{}", db.label());
    assert_eq!(paused[0].destination, "engine.relay");
    assert_eq!(paused[0].reason, "connection refused");
    for id in &ids {
        assert!(status_is(s, "engine.ext2", *id, "completed").await);
        assert!(status_is(s, "engine.relay", *id, "pending").await);
        assert_eq!(attempts(s, "engine.relay", *id).await, 0, "no attempt used");
    }
    // An outage of any length dead-letters nothing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.stats().await.unwrap().dead_letters, 0);
    relay.up.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(150)).await;
    outbox.drain(DRAIN).await.unwrap();
    assert_eq!(
        *relay.delivered.lock().unwrap(),
        ids,
        "{}: in order",
        db.label()
    );
    assert!(s.paused_destinations().await.unwrap().is_empty());
}

pub async fn workers_stop_with_the_applications_cancellation_token(db: &Case) {
    let calls = Arc::new(Calls::default());
    let outbox = outbox(db, &calls, fast()).await;
    let token = CancellationToken::new();
    let workers = outbox.spawn_workers_with(2, token.clone());
    let ids = commit(&outbox, "w", 1, vec![Act::Ok, Act::Ok]).await;
    wait_until("delivered", async || {
        outbox.store().stats().await.unwrap().pending == 0
    })
    .await;
    token.cancel();
    tokio::time::timeout(Duration::from_secs(10), workers.wait())
        .await
        .expect("the workers stopped");
    // They gave their leases back.
    assert_eq!(
        scalar(outbox.store(), "SELECT COUNT(*) FROM event_leases", &[]).await,
        0,
        "{}",
        db.label()
    );
    for id in ids {
        assert_eq!(effects(outbox.store(), id).await, 1);
    }
}

pub async fn an_aborted_shutdown_gives_its_deliveries_back_at_once(db: &Case) {
    let calls = Arc::new(Calls::default());
    let outbox = outbox_with(
        db,
        &calls,
        Dispatcher::builder_empty().handler::<external>(),
        |b| b.config(fast().lease(Duration::from_secs(30))),
    )
    .await;
    let id = commit(&outbox, "a", 1, vec![Act::SleepOnce(5_000)]).await[0];
    let workers = outbox.spawn_workers(1);
    calls.started().await;
    let released = workers.shutdown(Duration::from_millis(100)).await.unwrap();
    assert_eq!(released, 1, "{}", db.label());
    // Due again at once, not after the 30 s lease; the attempt did not count.
    let r = outbox.deliver_batch().await.unwrap();
    assert_eq!((r.claimed, r.completed), (1, 1), "{}", db.label());
    assert_eq!(attempts(outbox.store(), "engine.ext", id).await, 1);
}

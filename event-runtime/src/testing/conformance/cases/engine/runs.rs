//! The engine's cases on leases and runs: a slow handler keeps its lease, a lost lease records nothing, handlers without a transaction, a claim takes a whole run, a failing head costs its run nothing.

use super::*;

pub async fn a_handler_slower_than_the_lease_is_not_taken_over_by_other_workers(db: &Case) {
    // Each delivery runs for 1.5 lease lengths; three workers compete. A lease that is not
    // renewed is taken over and the handler runs again (0.1.0: livelock on PostgreSQL).
    let calls = Arc::new(Calls::default());
    let outbox = outbox(db, &calls, fast()).await;
    let mut ids = Vec::new();
    for s in ["s1", "s2", "s3"] {
        ids.extend(commit(&outbox, s, 1, vec![Act::Sleep(1_500)]).await);
    }
    let workers = outbox.spawn_workers(3);
    wait_until("every delivery completed", async || {
        outbox.store().stats().await.unwrap().pending == 0
    })
    .await;
    workers.shutdown(Duration::from_secs(10)).await.unwrap();
    for id in ids {
        // engine.tx and engine.ext each ran once per event.
        for h in ["tx", "ext"] {
            assert_eq!(calls.of_in(h, id), 1, "{}: {h} of event {id}", db.label());
        }
        assert_eq!(effects(outbox.store(), id).await, 1, "{}", db.label());
    }
}

pub async fn a_worker_that_lost_its_lease_records_nothing_and_undoes_only_what_was_taken_over(
    db: &Case,
) {
    let calls = Arc::new(Calls::default());
    // One worker delivers both aggregates in one claim.
    let config = fast().concurrency(4);
    // Where an open write transaction holds the database's one write lock (SQLite), a handler
    // inside the batch transaction holds it while it runs, so nothing else can write (take
    // its delivery over, or drop the lease row) until it ends: there the case is made with
    // the handlers outside a transaction.
    let with_tx = db.fixtures().concurrent_writes;
    let open = async |config: OutboxConfig| {
        let store = db.open().await;
        setup(&store).await;
        let d = Dispatcher::builder_empty()
            .handler::<external>()
            .handler::<external2>();
        let d = if with_tx { d.handler::<in_tx>() } else { d };
        Outbox::builder(store)
            .dispatcher(d)
            .resource_arc(Arc::clone(&calls))
            .config(config)
            .build()
            .unwrap()
    };
    let a = open(config.clone()).await;
    let b = open(config).await;
    // The gated event runs in both handlers; `y` is quick.
    let x = commit(&a, "x", 1, vec![Act::Gate]).await[0];
    let y = commit(&a, "y", 1, vec![Act::Ok]).await[0];
    let stalled = tokio::spawn({
        let a = a.clone();
        async move { a.deliver_batch().await }
    });
    calls.started().await;
    wait_until("the gated call started", async || calls.of(x) >= 1).await;
    // Worker a stalls (a paused process, a partition): its lease row disappears, as when it
    // lapsed and was cleaned up. Worker b takes the gated deliveries over.
    let mut tx = a.store().begin().await.unwrap();
    tx.execute("DELETE FROM event_leases", &[]).await.unwrap();
    tx.commit().await.unwrap();
    let taken = b.deliver_batch().await.unwrap();
    assert!(taken.claimed >= 1, "{}: {taken:?}", db.label());
    calls.open_gate();
    let stalled = stalled.await.unwrap().unwrap();
    assert!(stalled.lease_lost >= 1, "{}: {stalled:?}", db.label());
    a.drain(DRAIN).await.unwrap();
    // Every delivery completed once; the gated one ran twice (at-least-once), and its
    // database effect stands once: the stalled worker's was undone, the quick one kept.
    let handlers: &[&str] = if with_tx {
        &["engine.tx", "engine.ext"]
    } else {
        &["engine.ext"]
    };
    for &h in handlers {
        assert!(
            status_is(a.store(), h, x, "completed").await,
            "{}",
            db.label()
        );
        assert!(
            status_is(a.store(), h, y, "completed").await,
            "{}",
            db.label()
        );
    }
    if with_tx {
        assert_eq!(effects(a.store(), y).await, 1, "{}", db.label());
        assert_eq!(effects(a.store(), x).await, 1, "{}", db.label());
    }
}

pub async fn a_handler_without_a_transaction_does_not_hold_back_application_writes(db: &Case) {
    let calls = Arc::new(Calls::default());
    let store = db.open().await;
    setup(&store).await;
    // Only the handler without a transaction.
    let outbox = Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().handler::<external>())
        .resource_arc(Arc::clone(&calls))
        .config(fast())
        .build()
        .unwrap();
    commit(&outbox, "slow", 1, vec![Act::Sleep(2_000)]).await;
    let workers = outbox.spawn_workers(1);
    calls.started().await;
    // While the 2 s call runs, the application commits (on SQLite: takes the write lock).
    let started = Instant::now();
    commit(&outbox, "other", 1, vec![Act::Ok]).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(1_000),
        "{}: an application commit waited {took:?} behind a handler without a transaction",
        db.label()
    );
    workers.shutdown(Duration::from_secs(10)).await.unwrap();
}

pub async fn handlers_without_a_transaction_run_concurrently_across_aggregates(db: &Case) {
    let calls = Arc::new(Calls::default());
    let outbox = outbox_with(
        db,
        &calls,
        Dispatcher::builder_empty().handler::<external>(),
        |b| b.config(fast().concurrency(16)),
    )
    .await;
    for s in 0..16 {
        commit(
            &outbox,
            &format!("c{s}"),
            1,
            vec![Act::Sleep(100), Act::Sleep(100)],
        )
        .await;
    }
    outbox.drain(DRAIN).await.unwrap();
    assert!(
        calls.max_running() >= 8,
        "{}: at most {} calls at once",
        db.label(),
        calls.max_running()
    );
    assert!(
        !calls.overlap_within_aggregate.load(Ordering::SeqCst),
        "{}: two calls of one aggregate overlapped",
        db.label()
    );
    for s in 0..16 {
        assert_eq!(calls.order(&format!("c{s}")), [1, 2], "{}", db.label());
    }
}

pub async fn a_claim_takes_a_whole_run_of_one_aggregate(db: &Case) {
    let calls = Arc::new(Calls::default());
    let outbox = outbox_with(
        db,
        &calls,
        Dispatcher::builder_empty().handler::<in_tx>(),
        |b| b.config(fast().batch_size(128)),
    )
    .await;
    commit(&outbox, "hot", 1, vec![Act::Ok; 100]).await;
    let r = outbox.deliver_batch().await.unwrap();
    // 0.1.0 claimed one delivery of an aggregate per batch: 2,000 events of one aggregate
    // took 36-80 s on PostgreSQL.
    assert_eq!((r.claimed, r.completed), (100, 100), "{}", db.label());
    assert_eq!(calls.order("hot"), (1..=100).collect::<Vec<u64>>());
}

pub async fn a_failing_head_uses_no_attempt_of_the_run_behind_it(db: &Case) {
    let calls = Arc::new(Calls::default());
    let outbox = outbox_with(
        db,
        &calls,
        Dispatcher::builder_empty().handler::<external>(),
        |b| b,
    )
    .await;
    let ids = commit(
        &outbox,
        "h",
        1,
        vec![Act::Fail, Act::Ok, Act::Ok, Act::Ok, Act::Ok],
    )
    .await;
    let r = outbox.deliver_batch().await.unwrap();
    assert_eq!(
        (r.claimed, r.retried, r.completed),
        (5, 1, 0),
        "{}",
        db.label()
    );
    let s = outbox.store();
    assert_eq!(attempts(s, "engine.ext", ids[0]).await, 1, "{}", db.label());
    for id in &ids[1..] {
        assert_eq!(attempts(s, "engine.ext", *id).await, 0, "{}", db.label());
        assert_eq!(calls.of(*id), 0);
    }
}

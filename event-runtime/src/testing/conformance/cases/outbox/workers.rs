//! The outbox's cases on workers: background delivery and graceful shutdown, expired and live leases, unordered handlers, a process without the handler.

use super::*;

pub async fn workers_deliver_in_the_background_and_shut_down_gracefully(db: &Case) {
    if db.effects_table().is_none() {
        return;
    }
    let outbox = outbox(db).await;
    let workers = outbox.spawn_workers(2);
    let mut ids = Vec::new();
    for n in 0..20 {
        ids.extend(
            commit(
                &outbox,
                vec![deposit(&format!("w{n}"), 1, Fail::Transient(1))],
            )
            .await
            .unwrap(),
        );
    }
    let deadline = std::time::Instant::now() + DRAIN;
    while outbox.store().stats().await.unwrap().pending > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "workers did not finish"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let released = workers.shutdown(Duration::from_secs(5)).await.unwrap();
    assert_eq!(released, 0);
    for id in ids {
        assert_eq!(effects_of(outbox.store(), id).await, 1, "{}", db.label());
    }
}

pub async fn an_expired_lease_is_claimed_again_and_a_live_one_is_not(db: &Case) {
    if db.effects_table().is_none() {
        return;
    }
    let store = db.open().await;
    setup(&store, db).await;
    let outbox = Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().handler::<apply>())
        .resource(Attempts::default())
        .config(fast_retries().lease(Duration::from_secs(1)))
        .build()
        .unwrap();
    let id = commit(&outbox, vec![deposit("l", 1, Fail::Never)])
        .await
        .unwrap()[0];
    // A worker claims the delivery and dies before finishing: simulate with a claim that
    // is never completed, by leasing through a second outbox that crashes after handlers.
    let mut tx = outbox.store().begin().await.unwrap();
    let now = chrono::Utc::now().timestamp_millis();
    tx.execute(
        "INSERT INTO event_leases (token, owner, acquired_at, expires_at) VALUES ('dead-worker', 'test', $1, $2)",
        &[SqlValue::Int(now), SqlValue::Int(now + 1_000)],
    )
    .await
    .unwrap();
    tx.execute(
        "UPDATE event_deliveries SET lease_token = 'dead-worker', attempts = 1",
        &[],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        outbox.deliver_batch().await.unwrap().claimed,
        0,
        "live lease"
    );
    tokio::time::sleep(Duration::from_millis(1_050)).await;
    let r = outbox.deliver_batch().await.unwrap();
    assert_eq!((r.claimed, r.completed), (1, 1), "{}", db.label());
    assert_eq!(effects_of(outbox.store(), id).await, 1);
}

pub async fn an_unordered_handler_is_not_held_back_by_a_dead_letter(db: &Case) {
    if db.effects_table().is_none() {
        return;
    }
    let outbox = outbox_of(
        db,
        Dispatcher::builder_empty()
            .handler::<apply>()
            .handler::<export>(),
    )
    .await;
    commit(
        &outbox,
        vec![
            deposit("u", 1, Fail::Permanent),
            deposit("u", 2, Fail::Never),
            deposit("u", 3, Fail::Never),
        ],
    )
    .await
    .unwrap();
    outbox.drain(DRAIN).await.unwrap();
    let stats = outbox.store().stats().await.unwrap();
    let per: HashMap<_, _> = stats
        .handlers
        .iter()
        .map(|h| (h.handler.as_str(), (h.completed, h.dead, h.pending)))
        .collect();
    assert_eq!(
        per["export"],
        (2, 1, 0),
        "{}: export flows past its dead letter",
        db.label()
    );
    assert_eq!(
        per["apply"],
        (0, 1, 2),
        "{}: apply keeps order and waits",
        db.label()
    );
    assert_eq!(stats.blocked, 2);
}

pub async fn a_process_without_a_handler_leaves_its_deliveries_to_one_that_has_it(db: &Case) {
    if db.effects_table().is_none() {
        return;
    }
    let full = outbox_of(
        db,
        Dispatcher::builder_empty()
            .handler::<apply>()
            .handler::<export>(),
    )
    .await;
    let id = commit(&full, vec![deposit("fh", 1, Fail::Never)])
        .await
        .unwrap()[0];
    // An older deploy that has `apply` only.
    let older = outbox(db).await;
    older.drain(DRAIN).await.unwrap(); // export's delivery stays pending: not its own
    let stats = older.store().stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.dead_letters),
        (1, 0),
        "{}",
        db.label()
    );
    full.drain(DRAIN).await.unwrap();
    assert_eq!(
        effects_of(full.store(), id).await,
        2,
        "apply and export, once each"
    );
}

//! The outbox's cases on committing and delivering once: effects, rollback of an in-transaction failure, an event id twice, a sequence conflict, retries of transient failures.

use super::*;

pub async fn committed_events_are_delivered_once_with_their_effects(db: &Case) {
    if db.effects_table().is_none() {
        return;
    }
    let outbox = outbox(db).await;
    let ids = commit(
        &outbox,
        vec![deposit("a", 5, Fail::Never), deposit("a", 7, Fail::Never)],
    )
    .await
    .unwrap();
    let store = outbox.store();
    assert_eq!(
        count(store, "SELECT COUNT(*) FROM event_outbox", &[]).await,
        2
    );
    assert_eq!(
        count(
            store,
            "SELECT COUNT(*) FROM event_deliveries WHERE handler = 'apply'",
            &[]
        )
        .await,
        2,
        "one delivery per (event, after-commit handler); none for in-transaction handlers"
    );
    assert_eq!(
        count(store, "SELECT CAST(SUM(amount) AS BIGINT) FROM ledger", &[]).await,
        12
    );
    assert_eq!(
        effects_of(store, ids[0]).await,
        0,
        "nothing runs before delivery"
    );

    let report = outbox.drain(DRAIN).await.unwrap();
    assert_eq!(report.completed, 2, "{}", db.label());
    for id in &ids {
        assert_eq!(effects_of(store, *id).await, 1, "{}", db.label());
    }
    // Draining again does nothing.
    assert_eq!(outbox.drain(DRAIN).await.unwrap().claimed, 0);
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead_letters), (0, 0));
    assert_eq!(stats.handlers[0].completed, 2);
}

pub async fn an_in_transaction_failure_rolls_back_state_outbox_and_deliveries(db: &Case) {
    if db.effects_table().is_none() {
        return;
    }
    let outbox = outbox(db).await;
    let err = commit(
        &outbox,
        vec![deposit("b", 5, Fail::Never), deposit("b", -1, Fail::Never)],
    )
    .await
    .unwrap_err();
    match &err {
        OutboxError::Aborted(e) => {
            assert_eq!(e.handler, "check_amount");
            // The commit error says which handler failed; the handler's error is its source,
            // printed once by the chain.
            assert!(!e.to_string().contains("negative deposit"), "{e}");
            let chain = event_core::ErrorChain(&**e).to_string();
            assert_eq!(chain.matches("negative deposit").count(), 1, "{chain}");
        }
        other => panic!("{other:?}"),
    }
    let store = outbox.store();
    for table in [
        "SELECT COUNT(*) FROM accounts",
        "SELECT COUNT(*) FROM ledger",
        "SELECT COUNT(*) FROM event_outbox",
        "SELECT COUNT(*) FROM event_deliveries",
    ] {
        assert_eq!(count(store, table, &[]).await, 0, "{}: {table}", db.label());
    }
}

pub async fn appending_an_event_id_twice_has_one_effect(db: &Case) {
    if db.effects_table().is_none() {
        return;
    }
    let outbox = outbox(db).await;
    let envelope = Envelope::new(deposit("c", 1, Fail::Never)).with_sequence(1);
    let mut duplicates = Vec::new();
    for _ in 0..2 {
        let mut uow = outbox.begin().await.unwrap();
        uow.add(envelope.clone());
        let report = uow.commit().await.unwrap();
        duplicates.push((report.appended, report.duplicates));
    }
    assert_eq!(duplicates, [(1, 0), (0, 1)]);
    outbox.drain(DRAIN).await.unwrap();
    assert_eq!(effects_of(outbox.store(), envelope.id()).await, 1);
    assert_eq!(
        count(outbox.store(), "SELECT COUNT(*) FROM ledger", &[]).await,
        1,
        "the in-transaction handler ran once"
    );
    assert_eq!(
        count(outbox.store(), "SELECT COUNT(*) FROM event_deliveries", &[]).await,
        1
    );

    // Twice in one unit of work, with a sequence and without: one event, no conflict with
    // itself, its in-transaction handler run once.
    for sequenced in [true, false] {
        let e = Envelope::new(deposit("twice", 1, Fail::Never));
        let e = if sequenced { e.with_sequence(1) } else { e };
        let mut uow = outbox.begin().await.unwrap();
        uow.add(e.clone());
        uow.add(e.clone());
        let report = uow.commit().await.unwrap();
        assert_eq!(
            (
                report.appended,
                report.duplicates,
                report.in_transaction.len()
            ),
            (1, 1, 1),
            "{}: sequenced {sequenced}",
            db.label()
        );
    }
    assert_eq!(
        count(outbox.store(), "SELECT COUNT(*) FROM ledger", &[]).await,
        3,
        "{}: the in-transaction handler ran once for each",
        db.label()
    );
}

pub async fn a_second_commit_of_the_same_aggregate_sequence_is_a_conflict(db: &Case) {
    if db.effects_table().is_none() {
        return;
    }
    let outbox = outbox(db).await;
    commit(&outbox, vec![deposit("d", 1, Fail::Never)])
        .await
        .unwrap();
    // A stale copy of the aggregate records sequence 1 again.
    let err = commit(&outbox, vec![deposit("d", 2, Fail::Never)])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            OutboxError::Store(StoreError::Conflict { sequence: 1, .. })
        ),
        "{}: {err:?}",
        db.label()
    );
}

pub async fn transient_failures_and_panics_are_retried_and_their_effects_rolled_back(db: &Case) {
    if db.effects_table().is_none() {
        return;
    }
    let outbox = outbox(db).await;
    let ids = [
        commit(&outbox, vec![deposit("e1", 1, Fail::Transient(2))])
            .await
            .unwrap()[0],
        commit(&outbox, vec![deposit("e2", 1, Fail::Panic(1))])
            .await
            .unwrap()[0],
    ];
    let report = outbox.drain(DRAIN).await.unwrap();
    assert_eq!(report.completed, 2, "{}: {report:?}", db.label());
    assert_eq!(report.retried, 3, "{}: {report:?}", db.label());
    for id in ids {
        assert_eq!(effects_of(outbox.store(), id).await, 1, "{}", db.label());
    }
    let attempts = count(
        outbox.store(),
        "SELECT attempts FROM event_deliveries WHERE event_id = $1",
        &[SqlValue::Text(&ids[0].to_string())],
    )
    .await;
    assert_eq!(attempts, 3);
}

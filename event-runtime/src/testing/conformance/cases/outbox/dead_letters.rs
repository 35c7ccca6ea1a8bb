//! The outbox's cases on dead letters: what becomes one, replay, the aggregate held behind one, purge, unknown types and undecodable payloads.

use super::*;

pub async fn permanent_and_exhausted_failures_go_to_the_dead_letter_queue_untouched(db: &Case) {
    if db.effects_table().is_none() {
        return;
    }
    let outbox = outbox(db).await;
    if !db.needs(outbox.store(), &[Capability::Inspection]) {
        return;
    }
    let permanent = commit(&outbox, vec![deposit("f1", 1, Fail::Permanent)])
        .await
        .unwrap()[0];
    let exhausted = commit(&outbox, vec![deposit("f2", 1, Fail::Transient(99))])
        .await
        .unwrap()[0];
    let fine = commit(&outbox, vec![deposit("f3", 1, Fail::Never)])
        .await
        .unwrap()[0];
    let report = outbox.drain(DRAIN).await.unwrap();
    assert_eq!(report.dead_lettered, 2, "{}: {report:?}", db.label());
    assert_eq!(effects_of(outbox.store(), fine).await, 1);
    assert_eq!(effects_of(outbox.store(), permanent).await, 0);

    let dead = outbox
        .store()
        .dead_letters(&DeadLetterFilter::default())
        .await
        .unwrap();
    assert_eq!(dead.len(), 2);
    let p = dead.iter().find(|d| d.event_id == permanent).unwrap();
    assert_eq!((p.reason.as_str(), p.attempts), ("permanent", 1));
    assert_eq!(p.error_chain, ["account is closed"]);
    let original: String = outbox
        .store()
        .query("SELECT envelope FROM event_outbox WHERE event_id = $1")
        .bind(permanent.to_string())
        .fetch_one()
        .await
        .unwrap()
        .get("envelope")
        .unwrap();
    assert_eq!(p.envelope, original, "kept byte for byte");
    assert_eq!(p.event_name, "account.deposited");
    let x = dead.iter().find(|d| d.event_id == exhausted).unwrap();
    assert_eq!((x.reason.as_str(), x.attempts), ("exhausted", 4));
    assert!(x.first_failed_at <= x.last_failed_at);
    assert_eq!(x.error_chain, ["attempt 4: downstream busy"]);
    let filtered = outbox
        .store()
        .dead_letters(&DeadLetterFilter {
            handler: Some("apply".into()),
            event_name: Some("nope".into()),
            ..DeadLetterFilter::default()
        })
        .await
        .unwrap();
    assert!(filtered.is_empty());
}

pub async fn replay_keeps_the_event_id_resets_attempts_and_is_audited(db: &Case) {
    if db.effects_table().is_none() {
        return;
    }
    let outbox = outbox(db).await;
    if !db.needs(
        outbox.store(),
        &[Capability::Inspection, Capability::DeadLetterOperations],
    ) {
        return;
    }
    let id = commit(&outbox, vec![deposit("g", 1, Fail::Transient(4))])
        .await
        .unwrap()[0];
    outbox.drain(DRAIN).await.unwrap();
    let dead = outbox
        .store()
        .dead_letters(&DeadLetterFilter::default())
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    // Nothing is replayed automatically.
    assert_eq!(outbox.drain(DRAIN).await.unwrap().claimed, 0);

    let done = outbox
        .store()
        .resolve_dead_letters(
            &[dead[0].id, 999_999],
            Resolution::Replay,
            "ops@example",
            "downstream fixed",
        )
        .await
        .unwrap();
    assert_eq!(done, [dead[0].id]);
    let report = outbox.drain(DRAIN).await.unwrap();
    assert_eq!(report.completed, 1, "{}: {report:?}", db.label());
    assert_eq!(effects_of(outbox.store(), id).await, 1, "same event id");
    let audit = outbox.store().audit_log(10).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(
        (
            audit[0].action.as_str(),
            audit[0].actor.as_str(),
            audit[0].reason.as_str()
        ),
        ("replay", "ops@example", "downstream fixed")
    );
    assert_eq!(audit[0].dead_letter_ids, [dead[0].id]);
    let resolved = outbox
        .store()
        .dead_letter_by_id(dead[0].id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resolved.resolution.as_deref(), Some("replayed"));
    assert!(outbox
        .store()
        .dead_letters(&DeadLetterFilter::default())
        .await
        .unwrap()
        .is_empty());
}

/// The order in which `apply` ran for `account`.
async fn applied_sequences(store: &Store, account: &str) -> Vec<i64> {
    store
        .query("SELECT seq FROM effects WHERE aggregate = $1 ORDER BY id")
        .bind(account)
        .fetch_all()
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<i64>("seq").unwrap())
        .collect()
}

pub async fn later_events_of_an_aggregate_wait_for_a_dead_lettered_earlier_one(db: &Case) {
    if db.effects_table().is_none() {
        return;
    }
    let outbox = outbox(db).await;
    if !db.needs(
        outbox.store(),
        &[Capability::Inspection, Capability::DeadLetterOperations],
    ) {
        return;
    }
    commit(
        &outbox,
        vec![
            deposit("h", 1, Fail::Transient(4)),
            deposit("h", 2, Fail::Never),
            deposit("h", 3, Fail::Never),
        ],
    )
    .await
    .unwrap();
    commit(&outbox, vec![deposit("other", 1, Fail::Never)])
        .await
        .unwrap();
    outbox.drain(DRAIN).await.unwrap();
    assert_eq!(applied_sequences(outbox.store(), "other").await, [1]);
    assert!(applied_sequences(outbox.store(), "h").await.is_empty());
    let stats = outbox.store().stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.blocked, stats.dead_letters),
        (2, 2, 1),
        "h's later events wait behind the dead letter; {}",
        db.label()
    );

    let dead = outbox
        .store()
        .dead_letters(&DeadLetterFilter::default())
        .await
        .unwrap();
    assert_eq!(
        dead[0].held_back,
        2,
        "the dead letter says what it holds back; {}",
        db.label()
    );
    outbox
        .store()
        .resolve_dead_letters(&[dead[0].id], Resolution::Replay, "t", "fixed")
        .await
        .unwrap();
    outbox.drain(DRAIN).await.unwrap();
    assert_eq!(
        applied_sequences(outbox.store(), "h").await,
        [1, 2, 3],
        "{}",
        db.label()
    );
}

pub async fn purging_a_dead_letter_lets_the_aggregate_flow_and_is_audited(db: &Case) {
    if db.effects_table().is_none() {
        return;
    }
    let outbox = outbox(db).await;
    if !db.needs(
        outbox.store(),
        &[Capability::Inspection, Capability::DeadLetterOperations],
    ) {
        return;
    }
    commit(
        &outbox,
        vec![
            deposit("i", 1, Fail::Permanent),
            deposit("i", 2, Fail::Never),
        ],
    )
    .await
    .unwrap();
    outbox.drain(DRAIN).await.unwrap();
    let dead = outbox
        .store()
        .dead_letters(&DeadLetterFilter::default())
        .await
        .unwrap();
    outbox
        .store()
        .resolve_dead_letters(
            &[dead[0].id],
            Resolution::Purge,
            "ops",
            "account closed for good",
        )
        .await
        .unwrap();
    outbox.drain(DRAIN).await.unwrap();
    assert_eq!(applied_sequences(outbox.store(), "i").await, [2]);
    let audit = outbox.store().audit_log(1).await.unwrap();
    assert_eq!(audit[0].action, "purge");
    let stats = outbox.store().stats().await.unwrap();
    assert_eq!((stats.dead_letters, stats.handlers[0].purged), (0, 1));
}

pub async fn unknown_event_types_and_undecodable_payloads_are_dead_lettered_with_the_reason(
    db: &Case,
) {
    if db.effects_table().is_none() {
        return;
    }
    let outbox = outbox(db).await;
    if !db.needs(outbox.store(), &[Capability::Inspection]) {
        return;
    }
    let good = Envelope::new(deposit("j", 1, Fail::Never)).with_sequence(1);
    let mut uow = outbox.begin().await.unwrap();
    uow.add(good.clone());
    uow.commit().await.unwrap();
    // Rewrite the stored rows as a newer producer (version 9) and a broken one would.
    let mut newer = good.to_raw().unwrap();
    newer.version = 9;
    let mut broken: RawEnvelope = good.to_raw().unwrap();
    broken.meta.id = Uuid::now_v7();
    broken.data = serde_json::value::RawValue::from_string(r#"{"account":"j"}"#.into()).unwrap();
    let mut tx = outbox.store().begin().await.unwrap();
    tx.execute(
        "UPDATE event_outbox SET envelope = $1, version = 9 WHERE event_id = $2",
        &[
            SqlValue::Text(&newer.to_json()),
            SqlValue::Text(&good.id().to_string()),
        ],
    )
    .await
    .unwrap();
    tx.execute(
        "INSERT INTO event_outbox (event_id, name, version, aggregate_type, aggregate_id, sequence, occurred_at, recorded_at, envelope) VALUES ($1, 'account.deposited', 1, 'account', 'k', 0, 0, 0, $2)",
        &[SqlValue::Text(&broken.meta.id.to_string()), SqlValue::Text(&broken.to_json())],
    )
    .await
    .unwrap();
    tx.execute(
        "INSERT INTO event_deliveries (handler, event_id, aggregate_type, aggregate_id, sequence, next_attempt_at, created_at) VALUES ('apply', $1, 'account', 'k', 0, 0, 0)",
        &[SqlValue::Text(&broken.meta.id.to_string())],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let report = outbox.drain(DRAIN).await.unwrap();
    assert_eq!(report.dead_lettered, 2, "{}: {report:?}", db.label());
    let dead = outbox
        .store()
        .dead_letters(&DeadLetterFilter::default())
        .await
        .unwrap();
    let unknown = dead.iter().find(|d| d.event_id == good.id()).unwrap();
    assert_eq!(unknown.reason, "unknown_event");
    assert!(
        unknown.error_chain[0].contains("unknown version 9"),
        "{:?}",
        unknown.error_chain
    );
    let bad = dead.iter().find(|d| d.event_id == broken.meta.id).unwrap();
    assert_eq!(bad.reason, "undecodable");
    assert!(
        bad.error_chain
            .iter()
            .any(|e| e.contains("missing field `amount`")),
        "{:?}",
        bad.error_chain
    );
}

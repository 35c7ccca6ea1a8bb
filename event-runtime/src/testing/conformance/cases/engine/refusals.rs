//! The engine's cases on limits and refusals: time limits of handlers and statements, error text the database cannot store, an outcome the database refuses, a conflict.

use super::*;

pub async fn a_handler_over_its_time_limit_is_retried(db: &Case) {
    let calls = Arc::new(Calls::default());
    let outbox = outbox_with(
        db,
        &calls,
        Dispatcher::builder_empty().handler::<external>(),
        |b| {
            b.handler_options(
                "engine.ext",
                HandlerOptions::new().timeout(Duration::from_millis(200)),
            )
            .config(fast())
        },
    )
    .await;
    let id = commit(&outbox, "t", 1, vec![Act::SleepOnce(10_000)]).await[0];
    let started = Instant::now();
    outbox.drain(DRAIN).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "{}", db.label());
    assert_eq!(calls.of(id), 2);
    assert_eq!(attempts(outbox.store(), "engine.ext", id).await, 2);
    assert!(status_is(outbox.store(), "engine.ext", id, "completed").await);
}

pub async fn a_statement_over_the_time_limit_is_stopped_in_the_database(db: &Case) {
    let Some(long_statement) = db.long_statement() else {
        return;
    };
    let calls = Arc::new(Calls {
        long_statement: Some(long_statement),
        ..Calls::default()
    });
    let outbox = outbox_with(
        db,
        &calls,
        Dispatcher::builder_empty().handler::<in_tx>(),
        |b| {
            b.handler_options(
                "engine.tx",
                HandlerOptions::new().timeout(Duration::from_millis(500)),
            )
            .config(fast())
        },
    )
    .await;
    let id = commit(&outbox, "st", 1, vec![Act::LongStatement]).await[0];
    let started = Instant::now();
    outbox.drain(DRAIN).await.unwrap();
    // The statement would run for minutes: the database stopped it at the limit, and the
    // retry found the connection usable.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{}: took {:?}",
        db.label(),
        started.elapsed()
    );
    assert_eq!(attempts(outbox.store(), "engine.tx", id).await, 2);
    assert_eq!(effects(outbox.store(), id).await, 1, "{}", db.label());
}

pub async fn an_error_message_with_nul_is_stored_and_the_rest_of_the_batch_completes(db: &Case) {
    // PostgreSQL refuses U+0000 in text: 0.1.0 abandoned the whole batch, for ever.
    let calls = Arc::new(Calls::default());
    let outbox = outbox(db, &calls, fast()).await;
    if !db.needs(outbox.store(), &[Capability::Inspection]) {
        return;
    }
    let bad = commit(&outbox, "nul", 1, vec![Act::Refuse("bad\0byte".into())]).await[0];
    let mut fine = Vec::new();
    for s in 0..4 {
        fine.extend(commit(&outbox, &format!("ok{s}"), 1, vec![Act::Ok]).await);
    }
    let r = outbox.deliver_batch().await.unwrap();
    // Three handlers: the refused event's two that refuse are dead letters, the rest of the
    // batch (its third handler, and every handler of the four others) completes.
    assert_eq!(
        (r.completed, r.dead_lettered),
        (13, 2),
        "{}: {r:?}",
        db.label()
    );
    for id in fine {
        assert_eq!(effects(outbox.store(), id).await, 1);
    }
    let dead = outbox
        .store()
        .dead_letters(&DeadLetterFilter::default())
        .await
        .unwrap();
    assert_eq!(dead.len(), 2);
    for d in dead {
        assert_eq!(d.event_id, bad);
        assert_eq!(d.reason, "permanent");
        assert!(
            d.error_chain[0].starts_with("bad\u{FFFD}byte")
                && d.error_chain[0].contains("1 NUL character replaced"),
            "{:?}",
            d.error_chain
        );
    }
}

pub async fn an_outcome_the_database_refuses_is_dead_lettered_alone(db: &Case) {
    let Some(refuse) = db.refuse_dead_letter() else {
        return;
    };
    let calls = Arc::new(Calls::default());
    let outbox = outbox(db, &calls, fast()).await;
    if !db.needs(outbox.store(), &[Capability::Inspection]) {
        return;
    }
    // A trigger refuses the dead letter of one delivery: what any database refusal of
    // bookkeeping looks like to the engine.
    let mut tx = outbox.store().begin().await.unwrap();
    for &sql in refuse {
        tx.execute(sql, &[]).await.unwrap();
    }
    tx.commit().await.unwrap();
    let poison = commit(&outbox, "p", 1, vec![Act::Refuse("poison".into())]).await[0];
    let fine = commit(&outbox, "q", 1, vec![Act::Ok]).await[0];
    let r = outbox.deliver_batch().await.unwrap();
    assert_eq!(
        (r.completed, r.dead_lettered),
        (4, 2),
        "{}: {r:?}",
        db.label()
    );
    assert_eq!(effects(outbox.store(), fine).await, 1);
    let dead = outbox
        .store()
        .dead_letters(&DeadLetterFilter::default())
        .await
        .unwrap();
    assert_eq!(dead.len(), 2, "{}", db.label());
    for d in dead {
        assert_eq!(d.event_id, poison);
        assert_eq!(d.reason, "unrecordable", "{}", db.label());
        assert!(
            d.error_chain[0].contains("could not be recorded")
                && d.error_chain[0].contains("refused by the test trigger"),
            "{:?}",
            d.error_chain
        );
    }
    // Nothing is left leased or pending.
    assert_eq!(outbox.store().stats().await.unwrap().pending, 0);
}

pub async fn a_conflict_names_the_rejected_event(db: &Case) {
    let calls = Arc::new(Calls::default());
    let outbox = outbox(db, &calls, fast()).await;
    commit(&outbox, "k", 1, vec![Act::Ok, Act::Ok, Act::Ok]).await;
    // A stale copy of the aggregate records 4, 5 and (again) 2.
    let mut uow = outbox.begin().await.unwrap();
    for n in [4, 5, 2] {
        uow.add(
            Envelope::new(Ticked {
                stream: "k".into(),
                n,
                act: Act::Ok,
            })
            .with_sequence(n),
        );
    }
    let err = uow.commit().await.unwrap_err();
    match err {
        OutboxError::Store(StoreError::Conflict {
            aggregate_type,
            aggregate_id,
            sequence,
        }) => {
            assert_eq!(
                (aggregate_type.as_str(), aggregate_id.as_str(), sequence),
                ("engine", "k", 2),
                "{}",
                db.label()
            );
        }
        other => panic!("{}: {other:?}", db.label()),
    }
}

//! Start-up and commit checks of the outbox that do not depend on the backend: configuration
//! errors, URLs that would open a throwaway database, opening for operations, oversized
//! envelopes.

mod common;

use std::time::Duration;

use event_runtime::{Dispatcher, Outbox, OutboxConfig, OutboxError, Store, StoreError};
use fixtures::*;

#[tokio::test]
async fn retention_shorter_than_the_retry_horizon_is_a_start_up_error() {
    let (_, store) = common::sqlite("retention").await;
    let err = Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().handler::<apply>())
        .resource(Attempts::default())
        .config(OutboxConfig::default().retention(Duration::from_secs(10)))
        .build()
        .unwrap_err();
    let err = event_core::ErrorChain(&err).to_string();
    assert!(err.contains("longest retry horizon"), "{err}");
}

#[tokio::test]
async fn an_empty_sqlite_path_is_refused_instead_of_a_throwaway_database() {
    for url in ["sqlite://", "sqlite:", "sqlite://?mode=rwc"] {
        match Store::connect(url).await {
            Err(StoreError::UnsupportedUrl { url: u, .. }) => assert_eq!(u, url),
            other => panic!("{url}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn opening_for_operations_creates_nothing() {
    let path = common::temp_dir().join(format!("{}.db", common::unique("open_nothing")));
    let url = format!("sqlite://{}", path.display());
    assert!(Store::open(&url, None).await.is_err());
    assert!(!path.exists(), "open must not create the file");
    if let Some((pg, _, _)) = common::postgres("open_nothing").await {
        let schema = common::unique("no_such_schema");
        match Store::open(&pg, Some(&schema)).await {
            Err(e @ StoreError::NotAnOutbox { .. }) => {
                assert!(e.to_string().contains(&schema), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn zero_batch_size_lease_poll_or_metrics_interval_is_a_start_up_error() {
    let (_, store) = common::sqlite("zero_config").await;
    for config in [
        OutboxConfig::default().batch_size(0),
        OutboxConfig::default().lease(Duration::ZERO),
        OutboxConfig::default().poll_interval(Duration::ZERO),
        OutboxConfig::default().metrics_interval(Duration::ZERO),
    ] {
        let err = Outbox::builder(store.clone())
            .dispatcher(Dispatcher::builder_empty().handler::<apply>())
            .resource(Attempts::default())
            .config(config)
            .build()
            .unwrap_err();
        assert!(matches!(err, OutboxError::Config(_)), "{err}");
    }
}

#[tokio::test]
async fn an_oversized_envelope_fails_the_commit_and_writes_nothing() {
    let (_, store) = common::sqlite("oversized").await;
    setup(&store).await;
    let outbox = Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().handler::<apply>())
        .resource(Attempts::default())
        .config(OutboxConfig::default().max_envelope_bytes(4_096))
        .build()
        .unwrap();
    let err = commit(
        &outbox,
        vec![
            deposit("big", 1, Fail::Never),
            deposit(&"x".repeat(5_000), 2, Fail::Never),
        ],
    )
    .await
    .unwrap_err();
    match &err {
        OutboxError::TooLarge { bytes, limit, .. } => assert!(*bytes > *limit && *limit == 4_096),
        other => panic!("{other:?}"),
    }
    assert!(
        err.to_string().contains("over the limit of 4096 bytes"),
        "{err}"
    );
    assert_eq!(
        count(outbox.store(), "SELECT COUNT(*) FROM event_outbox", &[]).await,
        0
    );
    assert_eq!(
        count(outbox.store(), "SELECT COUNT(*) FROM accounts", &[]).await,
        0
    );
}

#[tokio::test]
async fn a_sequence_above_i64_max_is_refused_at_commit() {
    for store in both_stores("sequence_range").await {
        let label = store.backend_name();
        let outbox = Outbox::builder(store.clone())
            .dispatcher(Dispatcher::builder_empty().handler::<apply>())
            .resource(Attempts::default())
            .build()
            .unwrap();
        let sequence = i64::MAX as u64 + 1;
        let mut uow = outbox.begin().await.unwrap();
        uow.add(
            event_core::Envelope::new(Deposited {
                account: "acc-huge".into(),
                amount: 1,
                fail: Fail::Never,
            })
            .with_sequence(sequence),
        );
        match uow.commit().await {
            Err(OutboxError::Store(StoreError::SequenceOutOfRange {
                aggregate_id,
                sequence: s,
                ..
            })) => {
                assert_eq!(
                    (aggregate_id.as_str(), s),
                    ("acc-huge", sequence),
                    "{label}"
                );
            }
            other => panic!("{label}: {other:?}"),
        }
        assert_eq!(
            store.stats().await.unwrap().events,
            0,
            "{label}: nothing written"
        );
    }
}

/// A database error other than missing tables (here: no privilege on the schema) is passed
/// through, not reported as "not an outbox".
#[tokio::test]
async fn opening_an_outbox_without_privileges_reports_the_database_error() {
    let Some((url, schema, store)) = common::postgres("open_no_privilege").await else {
        return;
    };
    let role = "events_test_no_privilege";
    const CREATE: &str = "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'events_test_no_privilege') THEN CREATE ROLE events_test_no_privilege LOGIN; END IF; END $$";
    // Two tests creating the role at once: the loser's error is harmless.
    let mut tx = store.begin().await.unwrap();
    let _ = tx.execute(CREATE, &[]).await;
    let _ = tx.commit().await;
    let as_role = match url.split_once("://") {
        Some((scheme, rest)) => {
            let host = rest.split_once('@').map_or(rest, |(_, h)| h);
            format!("{scheme}://{role}@{host}")
        }
        None => panic!("{url}"),
    };
    match Store::open(&as_role, Some(&schema)).await {
        Err(e @ StoreError::NotAnOutbox { .. }) => {
            panic!("a permission error reported as a missing outbox: {e}")
        }
        Err(e) => {
            let chain = event_core::ErrorChain(&e).to_string();
            assert!(chain.contains("permission denied"), "{chain}");
        }
        Ok(_) => panic!("{role} could open {schema} without privileges"),
    }
}

/// PostgreSQL cannot store U+0000 in text: an aggregate id holding one is refused at commit on
/// every store, naming the field, before anything is written.
#[tokio::test]
async fn a_nul_in_an_aggregate_id_is_refused_at_commit_on_every_store() {
    for store in both_stores("nul_aggregate").await {
        let label = store.backend_name();
        let outbox = Outbox::builder(store.clone())
            .dispatcher(Dispatcher::builder_empty().handler::<apply>())
            .resource(Attempts::default())
            .build()
            .unwrap();
        let mut uow = outbox.begin().await.unwrap();
        uow.add(event_core::Envelope::new(Deposited {
            account: "acc\0nul".into(),
            amount: 1,
            fail: Fail::Never,
        }));
        match uow.commit().await {
            Err(
                e @ OutboxError::Unstorable {
                    field: "aggregate id",
                    ..
                },
            ) => {
                assert!(e.to_string().contains("U+0000"), "{label}: {e}")
            }
            other => panic!("{label}: {other:?}"),
        }
        assert_eq!(
            store.stats().await.unwrap().events,
            0,
            "{label}: nothing written"
        );
    }
}

/// A fresh SQLite store, and a fresh PostgreSQL one when PostgreSQL is configured.
async fn both_stores(test: &str) -> Vec<Store> {
    let (_, sqlite) = common::sqlite(test).await;
    let mut stores = vec![sqlite];
    if let Some((_, _, pg)) = common::postgres(test).await {
        stores.push(pg);
    }
    stores
}

/// The outbox conformance cases' event and handler, for the checks above (the suite's own
/// are `event_runtime::testing::conformance`'s, not reachable from here).
#[allow(dead_code)]
mod fixtures {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use event_core::{event_handler, DomainEvent, Envelope, EventRecorder, HandlerError};
    use event_runtime::testing::conformance::SqlFixtures;
    use event_runtime::{OutboxError, SqlValue, Store, Tx};
    use serde::{Deserialize, Serialize};
    use uuid::Uuid;

    /// How the `apply` handler behaves for one event.
    #[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
    pub enum Fail {
        Never,
        /// Fails transiently on the first `n` attempts.
        Transient(u32),
        /// Panics on the first `n` attempts.
        Panic(u32),
        Permanent,
    }

    #[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
    #[event(name = "account.deposited", version = 1)]
    pub struct Deposited {
        #[event(aggregate_id)]
        pub account: String,
        pub amount: i64,
        pub fail: Fail,
    }

    /// Attempts per event id, across retries.
    #[derive(Default)]
    pub struct Attempts(Mutex<HashMap<Uuid, u32>>);

    impl Attempts {
        fn bump(&self, id: Uuid) -> u32 {
            let mut m = self.0.lock().unwrap();
            let n = m.entry(id).or_default();
            *n += 1;
            *n
        }
    }

    /// After commit: records its effect in the same transaction as the delivery's completion,
    /// then fails as the event says (so the effect must be rolled back then).
    #[event_handler(name = "apply")]
    pub async fn apply(
        envelope: &Envelope<Deposited>,
        tx: &mut Tx,
        attempts: &Attempts,
    ) -> Result<(), HandlerError> {
        let e = envelope.event();
        tx.execute(
            "INSERT INTO effects (event_id, handler, aggregate, seq) VALUES ($1, 'apply', $2, $3)",
            &[
                SqlValue::Text(&envelope.id().to_string()),
                SqlValue::Text(&e.account),
                SqlValue::Int(envelope.sequence() as i64),
            ],
        )
        .await?;
        let n = attempts.bump(envelope.id());
        match e.fail {
            Fail::Transient(k) if n <= k => Err(HandlerError::transient_msg(format!(
                "attempt {n}: downstream busy"
            ))),
            Fail::Panic(k) if n <= k => panic!("attempt {n}: handler bug"),
            Fail::Permanent => Err(HandlerError::permanent_msg("account is closed")),
            _ => Ok(()),
        }
    }

    /// The tables of `apply` and `commit`, on an SQLite store.
    pub async fn setup(store: &Store) {
        let effects = SqlFixtures::SQLITE.effects_table.unwrap();
        let mut tx = store.begin().await.unwrap();
        tx.execute(effects, &[]).await.unwrap();
        tx.execute(
            "CREATE TABLE IF NOT EXISTS ledger (account TEXT NOT NULL, amount BIGINT NOT NULL)",
            &[],
        )
        .await
        .unwrap();
        tx.execute(
            "CREATE TABLE IF NOT EXISTS accounts (account TEXT PRIMARY KEY)",
            &[],
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }

    pub fn deposit(account: &str, amount: i64, fail: Fail) -> Deposited {
        Deposited {
            account: account.into(),
            amount,
            fail,
        }
    }

    /// Commits `events` for one new aggregate, with the application's own write.
    pub async fn commit(
        outbox: &event_runtime::Outbox,
        events: Vec<Deposited>,
    ) -> Result<Vec<Uuid>, OutboxError> {
        let mut uow = outbox.begin().await?;
        let account = events[0].account.clone();
        uow.tx()
            .execute(
                "INSERT INTO accounts (account) VALUES ($1) ON CONFLICT DO NOTHING",
                &[SqlValue::Text(&account)],
            )
            .await?;
        let mut recorder = EventRecorder::new();
        for e in events {
            recorder.record(e);
        }
        let ids = recorder.pending().iter().map(|e| e.metadata().id).collect();
        uow.extend(recorder.take());
        uow.commit().await?;
        Ok(ids)
    }

    pub async fn count(store: &Store, sql: &'static str, args: &[SqlValue<'_>]) -> i64 {
        let mut tx = store.begin().await.unwrap();
        let n = tx.fetch_i64(sql, args).await.unwrap().unwrap_or(0);
        tx.commit().await.unwrap();
        n
    }
}

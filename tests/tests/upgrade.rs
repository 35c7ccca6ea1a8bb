//! Upgrading an existing outbox: a database written by release 0.1.0 (`tests/upgrade/v0.1.0`),
//! holding completed, pending, leased and dead-lettered deliveries, is opened by the current
//! code — which moves the outbox's migration rows to its own table and applies the new
//! migrations — and delivers everything, on SQLite and on the real PostgreSQL server. An
//! application running its own sqlx migrations on the same database is not refused.

mod common;

use std::time::Duration;

use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
use event_runtime::{
    Dispatcher, Outbox, OutboxConfig, Resolution, RetryPolicy, SqlValue, Store, Tx,
};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "upgrade.deposited", version = 1)]
struct Deposited {
    #[event(aggregate_id)]
    account: String,
    amount: i64,
    refuse: bool,
}

#[event_handler(name = "upgrade.ledger")]
async fn ledger(envelope: &Envelope<Deposited>, tx: &mut Tx) -> Result<(), HandlerError> {
    if envelope.event().refuse {
        return Err(HandlerError::permanent_msg("account frozen"));
    }
    let e = envelope.event();
    book(tx, envelope.id(), &e.account, envelope.sequence(), e.amount).await
}

/// One row of `upgrade_ledger`.
async fn book(
    tx: &mut Tx,
    event_id: uuid::Uuid,
    account: &str,
    seq: u64,
    amount: i64,
) -> Result<(), HandlerError> {
    tx.execute(
        "INSERT INTO upgrade_ledger (event_id, account, seq, amount) VALUES ($1, $2, $3, $4)",
        &[
            SqlValue::Text(&event_id.to_string()),
            SqlValue::Text(account),
            SqlValue::Int(seq as i64),
            SqlValue::Int(amount),
        ],
    )
    .await?;
    Ok(())
}

#[event_handler(name = "upgrade.notify")]
fn notify(_: &Deposited) {}

/// Unknown to the code that wrote `tests/upgrade/inbox-8a9a71f`: its message is an
/// `unknown_event` dead letter there, replayed here.
#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "upgrade.withdrawn", version = 1)]
struct Withdrawn {
    #[event(aggregate_id)]
    account: String,
    amount: i64,
    refuse: bool,
}

#[event_handler(name = "upgrade.withdrawals")]
async fn withdrawals(envelope: &Envelope<Withdrawn>, tx: &mut Tx) -> Result<(), HandlerError> {
    if envelope.event().refuse {
        return Err(HandlerError::permanent_msg("account frozen"));
    }
    let e = envelope.event();
    book(
        tx,
        envelope.id(),
        &e.account,
        envelope.sequence(),
        -e.amount,
    )
    .await
}

const SQLITE: &str = include_str!("../upgrade/v0.1.0/sqlite.sql");
const POSTGRES: &str = include_str!("../upgrade/v0.1.0/postgres.sql");
const INBOX_SQLITE: &str = include_str!("../upgrade/inbox-8a9a71f/sqlite.sql");
const INBOX_POSTGRES: &str = include_str!("../upgrade/inbox-8a9a71f/postgres.sql");

/// The 0.1.0 fixture loaded into a fresh database.
async fn load(db: &common::Db) {
    load_fixture(db, SQLITE, POSTGRES).await
}

/// A fixture (its SQLite and PostgreSQL dumps) loaded into a fresh database.
async fn load_fixture(db: &common::Db, sqlite: &str, postgres: &str) {
    match db {
        common::Db::Sqlite(url) => {
            let path = url.trim_start_matches("sqlite://");
            let _ = std::fs::remove_file(path);
            let mut conn =
                <sqlx::SqliteConnection as sqlx::Connection>::connect(&format!("{url}?mode=rwc"))
                    .await
                    .unwrap();
            sqlx::raw_sql(sqlx::AssertSqlSafe(sqlite.to_owned()))
                .execute(&mut conn)
                .await
                .unwrap();
        }
        common::Db::Postgres { url, schema } => {
            let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(url)
                .await
                .unwrap();
            let sql = postgres.replace("__SCHEMA__", &format!("\"{schema}\""));
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE; {sql}"
            )))
            .execute(&mut conn)
            .await
            .unwrap();
        }
    }
}

async fn count(store: &Store, sql: &'static str) -> i64 {
    let mut tx = store.begin().await.unwrap();
    let n = tx.fetch_i64(sql, &[]).await.unwrap().unwrap_or(0);
    tx.rollback().await.unwrap();
    n
}

async fn ledger_of(store: &Store, account: &str) -> Vec<i64> {
    let mut out = Vec::new();
    for seq in 1..=4 {
        let mut tx = store.begin().await.unwrap();
        let n = tx
            .fetch_i64(
                "SELECT COUNT(*) FROM upgrade_ledger WHERE account = $1 AND seq = $2",
                &[SqlValue::Text(account), SqlValue::Int(seq)],
            )
            .await
            .unwrap()
            .unwrap_or(0);
        tx.rollback().await.unwrap();
        for _ in 0..n {
            out.push(seq);
        }
    }
    out
}

async fn databases(test: &str) -> Vec<common::Db> {
    let mut out = vec![common::Db::Sqlite(common::sqlite_url(test))];
    if let Some(url) = common::postgres_url(test) {
        out.push(common::Db::Postgres {
            url,
            schema: common::unique(test),
        });
    }
    out
}

#[tokio::test]
async fn an_outbox_written_by_release_0_1_0_is_migrated_and_delivers_everything() {
    for db in databases("upgrade_0_1_0").await {
        load(&db).await;
        let store = db.open().await; // migrates
        let label = db.label();
        // The outbox's migrations moved to its own table; none is left in the application's.
        assert_eq!(
            count(&store, "SELECT COUNT(*) FROM _sqlx_migrations").await,
            0,
            "{label}"
        );
        assert!(
            count(&store, "SELECT COUNT(*) FROM _event_outbox_migrations").await >= 3,
            "{label}"
        );
        let outbox = Outbox::builder(store.clone())
            .dispatcher(
                Dispatcher::builder_empty()
                    .handler::<ledger>()
                    .handler::<notify>(),
            )
            .config(OutboxConfig::default().retry(RetryPolicy {
                max_attempts: 3,
                initial_backoff: Duration::from_millis(5),
                max_backoff: Duration::from_millis(10),
            }))
            .build()
            .unwrap();
        // Pending and leased rows (their 0.1.0 lease long expired) are delivered; b waits
        // behind its dead letter.
        outbox.drain(Duration::from_secs(30)).await.unwrap();
        assert_eq!(ledger_of(&store, "a").await, [1, 2, 3], "{label}");
        assert_eq!(ledger_of(&store, "c").await, [1, 2, 3, 4], "{label}");
        assert_eq!(ledger_of(&store, "d").await, [1, 2, 3, 4], "{label}");
        assert_eq!(ledger_of(&store, "b").await, Vec::<i64>::new(), "{label}");
        let stats = store.stats().await.unwrap();
        assert_eq!(
            (stats.pending, stats.blocked, stats.dead_letters),
            (2, 2, 1),
            "{label}"
        );
        assert_eq!(stats.unknown_status, 0, "{label}");
        let notify = stats
            .handlers
            .iter()
            .find(|h| h.handler == "upgrade.notify")
            .unwrap();
        assert_eq!((notify.pending, notify.completed), (0, 14), "{label}");

        // The dead letter written by 0.1.0 reads as today's, and purging it lets b flow.
        let dead = store.dead_letters(&Default::default()).await.unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].reason, "permanent");
        assert_eq!(dead[0].error_chain, ["account frozen"]);
        // Schema v3 (inbox dead letters): a delivery's dead letter of 0.1.0 is of kind
        // `delivery`, with no broker metadata (schema v5: no origin).
        assert_eq!(dead[0].origin, None, "{label}");
        assert_eq!(
            count(
                &store,
                "SELECT COUNT(*) FROM event_dead_letters WHERE kind = 'delivery' AND origin IS NULL"
            )
            .await,
            1,
            "{label}"
        );
        store
            .resolve_dead_letters(&[dead[0].id], Resolution::Purge, "test", "frozen for good")
            .await
            .unwrap();
        outbox.drain(Duration::from_secs(30)).await.unwrap();
        assert_eq!(ledger_of(&store, "b").await, [2, 3], "{label}");
        assert_eq!(store.stats().await.unwrap().pending, 0, "{label}");

        // Opening it again migrates nothing and changes nothing.
        let again = db.open().await;
        assert_eq!(again.stats().await.unwrap().pending, 0);
    }
}

#[tokio::test]
async fn an_application_with_its_own_sqlx_migrations_shares_the_database() {
    for db in databases("own_migrations").await {
        load(&db).await;
        let store = db.open().await;
        // The application's own migrator, on sqlx's default table, before and after ours.
        let migration = sqlx::migrate::Migration::new(
            20990101000001,
            "app accounts".into(),
            sqlx::migrate::MigrationType::Simple,
            sqlx::SqlSafeStr::into_sql_str("CREATE TABLE app_accounts (id BIGINT PRIMARY KEY)"),
            false,
        );
        let migrator = sqlx::migrate::Migrator::with_migrations(vec![migration]);
        match (
            &db,
            event_runtime::store::sqlite::pool(&store),
            event_runtime::store::postgres::pool(&store),
        ) {
            (_, Some(pool), _) => migrator.run(pool).await.unwrap(),
            (_, _, Some(pool)) => migrator.run(pool).await.unwrap(),
            _ => unreachable!(),
        }
        store.migrate().await.unwrap();
        let reopened = db.open().await; // runs the outbox's migrations again
        assert_eq!(
            count(&reopened, "SELECT COUNT(*) FROM _sqlx_migrations").await,
            1,
            "{}",
            db.label()
        );
        match (
            event_runtime::store::sqlite::pool(&reopened),
            event_runtime::store::postgres::pool(&reopened),
        ) {
            (Some(pool), _) => migrator.run(pool).await.unwrap(),
            (_, Some(pool)) => migrator.run(pool).await.unwrap(),
            _ => unreachable!(),
        }
    }
}

#[tokio::test]
async fn a_worker_of_release_0_1_0_fails_its_claims_instead_of_taking_deliveries_over() {
    // What 0.1.0's claim statement ran (SQLite form): against the upgraded schema it fails,
    // so a worker of that release still running during a rolling deploy delivers nothing
    // and logs the error, rather than taking over deliveries that live workers hold.
    for db in databases("old_worker").await {
        load(&db).await;
        let store = db.open().await;
        let mut tx = store.begin().await.unwrap();
        let err = tx
            .execute(
                "UPDATE event_deliveries SET lease_token = 'old', lease_until = 1, attempts = attempts + 1 WHERE status = 'pending' AND (lease_until IS NULL OR lease_until < 1)",
                &[],
            )
            .await
            .unwrap_err();
        let message = event_core::ErrorChain(&err).to_string();
        assert!(message.contains("lease_until"), "{}: {message}", db.label());
    }
}

/// A consuming service's outbox written by the release before the transport-neutral inbox
/// core (`tests/upgrade/inbox-8a9a71f`: events its NATS inbox received, three inbox dead
/// letters with NATS broker metadata) keeps reading: the dead letters read with their origin,
/// the received events are delivered, and a dead letter is replayed through the core with no
/// broker at all.
#[tokio::test]
async fn an_inbox_written_before_the_core_keeps_reading_and_replays_without_a_broker() {
    for db in databases("upgrade_inbox").await {
        load_fixture(&db, INBOX_SQLITE, INBOX_POSTGRES).await;
        let store = db.open().await; // migrates
        let label = db.label();
        let mut tx = store.begin().await.unwrap();
        tx.execute(
            "CREATE TABLE upgrade_ledger (event_id TEXT NOT NULL, account TEXT NOT NULL, seq BIGINT NOT NULL, amount BIGINT NOT NULL)",
            &[],
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();

        // The dead letters read, their NATS broker metadata as an origin.
        let dead = store.dead_letters(&Default::default()).await.unwrap();
        let reasons: Vec<&str> = dead.iter().map(|d| d.reason.as_str()).collect();
        assert_eq!(
            reasons,
            ["unknown_event", "undecodable", "conflict"],
            "{label}"
        );
        for (d, position) in dead.iter().zip(3..) {
            assert_eq!(d.handler, "nats-inbox:billing", "{label}");
            let o = d.origin.as_ref().expect("an origin");
            assert_eq!(
                (
                    o.transport.as_str(),
                    o.source.as_str(),
                    o.position,
                    o.delivery_count
                ),
                ("nats", "UPGRADE_INBOX", position, 1),
                "{label}"
            );
            let subject = if position == 3 {
                "upgrade.withdrawn"
            } else {
                "upgrade.deposited"
            };
            assert_eq!(o.attributes["subject"], subject, "{label}");
        }
        // `events dlq list --json` names it `origin` (it was `broker`).
        let json = serde_json::to_value(&dead[0]).unwrap();
        assert_eq!(json["origin"]["source"], "UPGRADE_INBOX", "{label}");
        assert_eq!(json["origin"]["position"], 3, "{label}");
        // The inbox's identity reads as written.
        let identity = store
            .inbox_identity("nats-inbox:billing")
            .await
            .unwrap()
            .expect("the recorded identity");
        assert_eq!(identity.stream, "UPGRADE_INBOX", "{label}");
        // Events received before origins were stored have none.
        let first = uuid::Uuid::from_u64_pair(2, 1);
        assert_eq!(store.received_origin(first).await.unwrap(), None, "{label}");

        // The received events are delivered.
        let outbox = Outbox::builder(store.clone())
            .dispatcher(
                Dispatcher::builder_empty()
                    .handler::<ledger>()
                    .handler::<notify>()
                    .handler::<withdrawals>(),
            )
            .build()
            .unwrap();
        outbox.drain(Duration::from_secs(30)).await.unwrap();
        assert_eq!(ledger_of(&store, "e").await, [1, 2], "{label}");

        // The unknown event's dead letter is replayed through the core, no broker needed: its
        // event is committed with its origin and delivered.
        let r = outbox
            .replay_inbox_dead_letters(&[dead[0].id], "test", "upgrade.withdrawn deployed")
            .await
            .unwrap();
        assert_eq!((r.appended, r.duplicates), (1, 0), "{label}");
        outbox.drain(Duration::from_secs(30)).await.unwrap();
        assert_eq!(ledger_of(&store, "e").await, [1, 2, 3], "{label}");
        let third = uuid::Uuid::from_u64_pair(2, 3);
        let o = store.received_origin(third).await.unwrap().expect("origin");
        assert_eq!(
            (o.source.as_str(), o.position),
            ("UPGRADE_INBOX", 3),
            "{label}"
        );
        let audit = store.audit_log(10).await.unwrap();
        assert_eq!(audit[0].action, "replay", "{label}");
        assert_eq!(audit[0].dead_letter_ids, [dead[0].id], "{label}");

        // The body that never was an envelope still is not: nothing changes.
        let e = outbox
            .replay_inbox_dead_letters(&[dead[1].id], "test", "again")
            .await
            .unwrap_err();
        assert!(
            matches!(e, event_runtime::OutboxError::NotReplayable { dead_letter, .. } if dead_letter == dead[1].id),
            "{label}: {e}"
        );
        let open = store.dead_letters(&Default::default()).await.unwrap();
        assert_eq!(open.len(), 2, "{label}");
        assert_eq!(store.audit_log(10).await.unwrap().len(), 1, "{label}");
    }
}

//! The SQLite backend (feature `sqlite`, on by default): an SQLite file or in-memory database,
//! no server. Owns its connection options, its migrations (`migrations/sqlite`) and what SQLite
//! does its own way; the statements it shares with other SQL databases live in `store::sql`.
//!
//! - Writes are serialised by SQLite (one writer at a time): transactions begin with
//!   `BEGIN IMMEDIATE` and wait up to 30 s for the write lock (`busy_timeout`).
//! - Files use the WAL journal with `synchronous = NORMAL`: a committed transaction survives a
//!   crash of the process; one committed just before a power loss may be lost (SQLite's
//!   documented trade-off for WAL + NORMAL).
//! - A handler's time limit stops a statement it left running through SQLite's progress
//!   handler (`sqlite3_progress_handler`): the statement fails with `SQLITE_INTERRUPT`.
//! - `sqlite::memory:` is one connection: the engine's statements then take turns on it.
//!   Prefer a file (a temporary one in tests).

use std::str::FromStr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

/// The instant SQLite statement deadlines count from (microseconds since it).
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

use sqlx::migrate::Migrator;
use sqlx::sqlite::SqliteRow;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Pool, Row as _, Sqlite, TypeInfo as _, ValueRef as _};

use super::backend::{Backend, ClaimRequest, ClaimedDelivery};
use super::sql::exec::SqlxQuery;
use super::sql::{claim, db, Conn, Dialect, SqlStore, MIGRATIONS_TABLE};
use super::value::{timestamp_text, Datum, SqlType};
use super::{BackendEntry, ConnectOptions, Store, StoreError};

/// The URL schemes of this backend: `sqlite://PATH`, `sqlite:PATH`, `sqlite::memory:`.
pub const URL_SCHEMES: &[&str] = super::SQLITE.url_schemes;

pub(crate) const ENTRY: BackendEntry = BackendEntry {
    known: &super::SQLITE,
    connect: |url, options| Box::pin(connect(url.to_owned(), options.clone())),
};

/// The SQLite dialect.
#[derive(Debug)]
pub(crate) struct SqliteDialect;

async fn connect(url: String, options: ConnectOptions) -> Result<Arc<dyn Backend>, StoreError> {
    if options.schema.is_some() {
        return Err(StoreError::UnsupportedOption {
            backend: "sqlite",
            option: "schema",
        });
    }
    let memory = url.contains(":memory:") || url.contains("mode=memory");
    let path = url
        .trim_start_matches("sqlite:")
        .trim_start_matches("//")
        .split('?')
        .next()
        .unwrap_or_default();
    if path.is_empty() && !memory {
        // sqlx would open a private temporary database per connection: a commit would
        // "succeed" into a database nobody reads again.
        return Err(StoreError::UnsupportedUrl {
            url: url.clone(),
            hint: "an SQLite URL needs a non-empty path (sqlite://PATH) or sqlite::memory:".into(),
        });
    }
    if !options.create && !memory && !std::path::Path::new(path).exists() {
        return Err(StoreError::NoSuchDatabase { url: url.clone() });
    }
    let connect = SqliteConnectOptions::from_str(&url)
        .map_err(db)?
        .create_if_missing(options.create)
        .foreign_keys(true)
        .busy_timeout(Duration::from_secs(30));
    let connect = if memory {
        connect
    } else {
        connect
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
    };
    let pool_options = SqlitePoolOptions::new()
        .max_connections(if memory {
            1
        } else {
            options.max_connections.unwrap_or(4)
        })
        .min_connections(if memory { 1 } else { 0 })
        .idle_timeout((!memory).then_some(Duration::from_secs(600)))
        .max_lifetime((!memory).then_some(Duration::from_secs(1800)))
        .acquire_timeout(Duration::from_secs(60));
    // Another process creating the same fresh file at this moment can make the first
    // connection's set-up (switching the file to WAL) find it locked, which SQLite reports at
    // once rather than after the busy timeout: try again, a few times.
    let mut tries = 0;
    let pool = loop {
        match pool_options.clone().connect_with(connect.clone()).await {
            Ok(pool) => break pool,
            Err(e) if tries < 8 && busy(&e) => {
                tries += 1;
                tracing::debug!(error = %e, tries, "opening SQLite raced another process; trying again");
                tokio::time::sleep(Duration::from_millis(50 * tries)).await;
            }
            Err(e) => return Err(db(e)),
        }
    };
    Ok(Arc::new(SqlStore::<SqliteDialect>::new(pool)))
}

/// SQLITE_BUSY, or one of its extended codes (`database is locked`).
fn busy(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) => d
            .code()
            .and_then(|c| c.parse::<i64>().ok())
            .is_some_and(|c| c & 0xff == 5),
        _ => false,
    }
}

/// A [`Store`] over an SQLite pool you configured yourself (its size, timeouts, TLS): no
/// migration is applied, call [`Store::migrate`] before the first outbox.
pub fn store_from_pool(pool: sqlx::SqlitePool) -> Store {
    SqlStore::<SqliteDialect>::store(pool)
}

/// The SQLite pool under `store`; `None` when the store is another backend. For queries
/// of the application's own that need sqlx (`sqlx::query(..).fetch_all(pool)`).
pub fn pool(store: &Store) -> Option<&sqlx::SqlitePool> {
    SqlStore::<SqliteDialect>::pool_of(store)
}

/// The SQLite connection of the transaction `tx` (`None` on another backend): for SQL the
/// portable [`Tx::execute`](crate::Tx::execute) cannot express, written in the same
/// transaction as the events. The same as `tx.native::<sqlx::SqliteConnection>()`.
pub fn connection(tx: &mut crate::Tx) -> Option<&mut sqlx::SqliteConnection> {
    tx.native::<sqlx::SqliteConnection>()
}

impl Dialect for SqliteDialect {
    type DB = Sqlite;
    const NAME: &'static str = "sqlite";
    const RELAXED_COMMIT: Option<&'static str> = None;
    const SINGLE_WRITER: bool = true;
    const PROMOTE_AFTER_COMMIT: bool = false;

    fn rows_affected(result: &sqlx::sqlite::SqliteQueryResult) -> u64 {
        result.rows_affected()
    }

    async fn begin(pool: &Pool<Sqlite>) -> Result<sqlx::Transaction<'static, Sqlite>, sqlx::Error> {
        pool.begin_with("BEGIN IMMEDIATE").await
    }

    fn migrator() -> Migrator {
        let mut m = sqlx::migrate!("migrations/sqlite");
        m.dangerous_set_table_name(MIGRATIONS_TABLE);
        m
    }

    const OLD_MIGRATIONS_TABLE: &'static str =
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'";

    const MIGRATIONS_COLUMNS: &'static str =
        "(version BIGINT PRIMARY KEY, description TEXT NOT NULL, \
         installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, success BOOLEAN NOT NULL, \
         checksum BLOB NOT NULL, execution_time BIGINT NOT NULL)";

    async fn migrate(pool: &Pool<Sqlite>) -> Result<(), StoreError> {
        // sqlx's migrator takes no lock on SQLite: two processes starting on a fresh file both
        // find a migration missing, and the second one's transaction fails on what the first
        // one created (`table event_outbox already exists`) and rolls back, or finds the file
        // locked (`database is locked`: a deferred transaction that must upgrade to a write
        // while another process writes gets SQLITE_BUSY at once, whatever the busy timeout).
        // Each migration is one transaction, so running again finds it applied: try again
        // (adopting the 0.1.0 migration rows too), a few times.
        let migrator = Self::migrator();
        let versions: Vec<i64> = migrator.iter().map(|m| m.version).collect();
        let mut tries = 0;
        loop {
            let attempt = async {
                adopt_migrations(pool, &versions).await?;
                migrator.run(pool).await.map_err(StoreError::from)
            };
            match attempt.await {
                Ok(()) => return Ok(()),
                Err(e) if tries < 8 => {
                    tries += 1;
                    tracing::debug!(error = %e, tries, "migrating raced another process; trying again");
                    tokio::time::sleep(std::time::Duration::from_millis(50 * tries)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    // SQLite keeps any value in any column: a column the engine reads as an integer (or a
    // text) that holds another storage class is never compared or decoded as it wrote it (a
    // text `next_attempt_at` sorts after every integer: never due).
    const UNREADABLE_DELIVERY: &'static str = "typeof(d.next_attempt_at) <> 'integer' \
         OR typeof(d.attempts) <> 'integer' OR typeof(d.sequence) <> 'integer' \
         OR typeof(d.created_at) <> 'integer' OR typeof(d.ready) <> 'integer' \
         OR typeof(d.aggregate_type) <> 'text' OR typeof(d.aggregate_id) <> 'text' \
         OR typeof(d.event_id) <> 'text' \
         OR (d.first_failed_at IS NOT NULL AND typeof(d.first_failed_at) <> 'integer') \
         OR (d.lease_token IS NOT NULL AND typeof(d.lease_token) <> 'text') \
         OR d.event_id NOT GLOB '[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]-\
[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-\
[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]'";

    // SQLite's planner prefers the primary key (`handler IN (…)` is an equality) and would
    // read every delivery of the destinations, completed ones included.
    const HEADS_TABLE: &'static str = "event_deliveries d INDEXED BY event_deliveries_ready";

    fn json_text_array(param: &str) -> String {
        format!("(SELECT value FROM json_each({param}))")
    }

    fn text_in(column: &str, param: &str) -> String {
        format!("{column} IN (SELECT value FROM json_each({param}))")
    }

    async fn claim(
        pool: &Pool<Sqlite>,
        req: &ClaimRequest<'_>,
    ) -> Result<Vec<ClaimedDelivery>, StoreError> {
        claim::claim_in_steps::<Self>(pool, req).await
    }

    type TimeLimit = Option<Arc<AtomicI64>>;

    async fn set_time_limit(
        conn: &mut Conn<Self>,
        state: &mut Self::TimeLimit,
        limit: Option<Duration>,
    ) -> Result<bool, sqlx::Error> {
        // One progress handler per transaction, reading a deadline that later calls move
        // without a round trip to the connection's thread. Called every 1,000 virtual machine
        // instructions: returning false interrupts the statement (SQLITE_INTERRUPT).
        let deadline = match state {
            Some(d) => Arc::clone(d),
            None => {
                let d = Arc::new(AtomicI64::new(0));
                let read = Arc::clone(&d);
                let epoch = *EPOCH;
                conn.lock_handle()
                    .await?
                    .set_progress_handler(1_000, move || {
                        let at = read.load(Ordering::Relaxed);
                        at == 0 || (epoch.elapsed().as_micros() as i64) < at
                    });
                *state = Some(Arc::clone(&d));
                d
            }
        };
        let at = limit.map_or(0, |l| (EPOCH.elapsed() + l).as_micros() as i64);
        deadline.store(at.max(i64::from(limit.is_some())), Ordering::Relaxed);
        Ok(true)
    }

    async fn lock_purger(_: &mut Conn<Self>) -> Result<bool, sqlx::Error> {
        // One writer at a time already.
        Ok(true)
    }

    async fn refresh_statistics(_: &Pool<Sqlite>) -> Result<(), sqlx::Error> {
        Ok(())
    }

    fn is_conflict(error: &dyn sqlx::error::DatabaseError) -> bool {
        // SQLITE_BUSY (5, and 517 BUSY_SNAPSHOT) after the busy timeout, SQLITE_LOCKED (6).
        matches!(error.code().as_deref(), Some("5" | "6" | "517"))
    }

    fn bind<'q>(q: SqlxQuery<'q, Sqlite>, value: &Datum) -> SqlxQuery<'q, Sqlite> {
        match value {
            Datum::Null(_) => q.bind(None::<i64>),
            Datum::Int(v) => q.bind(*v),
            Datum::Float(v) => q.bind(*v),
            Datum::Bool(v) => q.bind(*v),
            Datum::Text(v) => q.bind(v.as_str()),
            Datum::Bytes(v) => q.bind(v.as_slice()),
            Datum::Uuid(v) => q.bind(v.hyphenated().to_string()),
            Datum::Timestamp(v) => q.bind(timestamp_text(v)),
            #[cfg(feature = "decimal")]
            Datum::Decimal(v) => q.bind(v.to_string()),
            Datum::Unsupported(t) => q.bind(t.as_str()),
        }
    }

    fn datum(row: &SqliteRow, index: usize) -> Datum {
        // SQLite types values, not columns: read each as the storage class it has.
        let Ok(value) = row.try_get_raw(index) else {
            return Datum::Unsupported("unknown".into());
        };
        if value.is_null() {
            return Datum::Null(SqlType::Text);
        }
        let class = value.type_info().name().to_owned();
        let read = match class.as_str() {
            "INTEGER" => row.try_get_unchecked(index).map(Datum::Int),
            "REAL" => row.try_get_unchecked(index).map(Datum::Float),
            "TEXT" => row.try_get_unchecked(index).map(Datum::Text),
            "BLOB" => row.try_get_unchecked(index).map(Datum::Bytes),
            _ => return Datum::Unsupported(class),
        };
        read.unwrap_or(Datum::Unsupported(class))
    }

    #[cfg(feature = "fault-injection")]
    async fn kill(_: &mut Conn<Self>) {
        // Dropping the transaction is what a killed process does to an SQLite file.
    }
}

async fn adopt_migrations(pool: &Pool<Sqlite>, versions: &[i64]) -> Result<(), StoreError> {
    let mut tx = SqliteDialect::begin(pool).await.map_err(db)?;
    super::sql::maintenance::adopt_migrations::<SqliteDialect>(&mut tx, versions).await?;
    tx.commit().await.map_err(db)
}

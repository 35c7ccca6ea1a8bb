//! The outbox store: connection, migrations and every SQL statement of the outbox, deliveries,
//! dead letters and audit log, for SQLite and PostgreSQL. Runs no handler.
//!
//! Both backends share one schema (see `migrations/`), one set of statements (`$N`
//! placeholders work in both), and times stored as milliseconds since the Unix epoch (UTC).

use std::any::{Any, TypeId};
use std::collections::HashSet;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
#[cfg(feature = "postgres")]
use sqlx::AssertSqlSafe;
use sqlx::Row;
use uuid::Uuid;

use crate::dispatch::dispatcher::TransactionSource;

#[cfg(not(any(feature = "sqlite", feature = "postgres")))]
compile_error!("event-runtime needs at least one store feature: `sqlite` (default) or `postgres`");

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database URL names no supported backend (or one whose feature is off).
    #[error("unsupported database URL {0:?}: expected sqlite://PATH (a non-empty path), sqlite::memory:, or postgres://… with event-runtime's `postgres` feature enabled")]
    UnsupportedUrl(String),
    /// The database refused a statement or could not be reached.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Applying the bundled migrations failed.
    #[error("migrating the outbox schema failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// Another commit already recorded this sequence number for the aggregate (optimistic
    /// concurrency: reload the aggregate and retry the command).
    #[error("concurrent modification: {aggregate_type} {aggregate_id} already has an event with sequence {sequence}")]
    Conflict {
        /// The aggregate type.
        aggregate_type: String,
        /// The aggregate id.
        aggregate_id: String,
        /// The sequence recorded twice.
        sequence: u64,
    },
    /// The database holds no outbox tables ([`Store::open`] creates none).
    #[error("{url} holds no outbox tables{}: run the application (or Store::connect) once to create them, or check the URL and schema", schema.as_ref().map(|s| format!(" in schema {s:?}")).unwrap_or_default())]
    NotAnOutbox {
        /// The URL.
        url: String,
        /// The PostgreSQL schema, if one was given.
        schema: Option<String>,
    },
    /// A row holds data this version cannot read (a corrupted or foreign table).
    #[error("corrupt outbox row: {0}")]
    Corrupt(String),
}

/// An open transaction of the store: the application's writes, the outbox rows and the
/// delivery rows of one unit of work go through it, and so do a delivery's handler writes and
/// its completion record.
///
/// A handler that takes `&mut Tx` works on either backend; one that takes
/// `&mut sqlx::SqliteConnection` or `&mut sqlx::PgConnection` gets the connection of the open
/// transaction directly (and only runs on that backend: start-up says so otherwise).
///
/// Dropping a `Tx` without [`commit`](Self::commit) rolls it back.
#[derive(Debug)]
#[non_exhaustive]
pub enum Tx {
    /// An SQLite transaction (`BEGIN IMMEDIATE`: SQLite has one writer at a time).
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::Transaction<'static, sqlx::Sqlite>),
    /// A PostgreSQL transaction (READ COMMITTED).
    #[cfg(feature = "postgres")]
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
}

/// Runs `$body` with `$c` bound to the backend transaction, whichever it is.
macro_rules! on_tx {
    ($tx:expr, |$c:ident| $body:expr) => {
        match $tx {
            #[cfg(feature = "sqlite")]
            Tx::Sqlite($c) => $body,
            #[cfg(feature = "postgres")]
            Tx::Postgres($c) => $body,
        }
    };
}

/// Runs `$body` with `$p` bound to the backend pool, whichever it is.
macro_rules! on_pool {
    ($store:expr, |$p:ident| $body:expr) => {
        match &$store.backend {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite($p) => $body,
            #[cfg(feature = "postgres")]
            Backend::Postgres($p) => $body,
        }
    };
}

/// The subquery behind per-aggregate order: an earlier delivery of the same (handler,
/// aggregate) whose status is one of `$statuses`. Claims, drain and stats all use this one
/// definition (a string literal, since sqlx takes `&'static str`).
macro_rules! earlier_delivery {
    ($statuses:literal) => {
        concat!(
            "SELECT 1 FROM event_deliveries p WHERE p.handler = d.handler",
            " AND p.aggregate_type = d.aggregate_type AND p.aggregate_id = d.aggregate_id",
            " AND p.sequence < d.sequence AND p.status IN (",
            $statuses,
            ")"
        )
    };
}

/// The handler names of a JSON-array parameter, as a subquery, in each dialect.
macro_rules! handlers_in {
    (sqlite, $param:literal) => {
        concat!("(SELECT value FROM json_each(", $param, "))")
    };
    (postgres, $param:literal) => {
        concat!("(SELECT jsonb_array_elements_text(", $param, "::jsonb))")
    };
}

/// Due, unleased deliveries of the handlers in `$5` that no earlier pending or dead delivery
/// holds back, oldest first, at most `$4`.
macro_rules! due_deliveries {
    ($dialect:ident) => {
        concat!(
            "SELECT d.handler, d.event_id FROM event_deliveries d",
            " WHERE d.status = 'pending' AND d.next_attempt_at <= $3",
            " AND (d.lease_until IS NULL OR d.lease_until < $3)",
            " AND d.handler IN ",
            handlers_in!($dialect, "$5"),
            " AND NOT EXISTS (",
            earlier_delivery!("'pending', 'dead'"),
            ") ORDER BY d.next_attempt_at LIMIT $4"
        )
    };
}

/// Pending deliveries of the handlers in `$1` not waiting behind a dead letter.
macro_rules! progressing {
    ($dialect:ident) => {
        concat!(
            "SELECT COUNT(*) FROM event_deliveries d WHERE d.status = 'pending' AND d.handler IN ",
            handlers_in!($dialect, "$1"),
            " AND NOT EXISTS (",
            earlier_delivery!("'dead'"),
            ")"
        )
    };
}

impl Tx {
    /// Commits.
    ///
    /// # Errors
    /// The database refused the commit (connection lost, serialization failure).
    pub async fn commit(self) -> Result<(), StoreError> {
        on_tx!(self, |t| t.commit().await?);
        Ok(())
    }

    /// Rolls back.
    ///
    /// # Errors
    /// The connection was lost (the server rolls back by itself then).
    pub async fn rollback(self) -> Result<(), StoreError> {
        on_tx!(self, |t| t.rollback().await?);
        Ok(())
    }

    /// The SQLite connection of this transaction, if it is one.
    #[cfg(feature = "sqlite")]
    pub fn sqlite(&mut self) -> Option<&mut sqlx::SqliteConnection> {
        #[allow(unreachable_patterns)]
        match self {
            Tx::Sqlite(t) => Some(&mut **t),
            _ => None,
        }
    }

    /// The PostgreSQL connection of this transaction, if it is one.
    #[cfg(feature = "postgres")]
    pub fn postgres(&mut self) -> Option<&mut sqlx::PgConnection> {
        #[allow(unreachable_patterns)]
        match self {
            Tx::Postgres(t) => Some(&mut **t),
            _ => None,
        }
    }

    /// Runs one statement with `$N` placeholders bound to `args`, on either backend.
    /// Returns the number of rows affected.
    ///
    /// # Errors
    /// The database refused the statement.
    pub async fn execute(
        &mut self,
        sql: &'static str,
        args: &[SqlValue<'_>],
    ) -> Result<u64, StoreError> {
        Ok(on_tx!(self, |t| {
            let mut q = sqlx::query(sql);
            for a in args {
                q = match a {
                    SqlValue::Int(v) => q.bind(*v),
                    SqlValue::Text(v) => q.bind(*v),
                    SqlValue::Null => q.bind(None::<i64>),
                };
            }
            q.execute(&mut **t).await?.rows_affected()
        }))
    }

    /// Runs one query with `$N` placeholders and returns the first column of the first row
    /// as an integer, if there is a row (`SELECT count(*) …`, `SELECT amount …`). On
    /// PostgreSQL `SUM` of a `BIGINT` is `NUMERIC`: write `CAST(SUM(x) AS BIGINT)`.
    ///
    /// # Errors
    /// The database refused the query, or the column is not an integer.
    pub async fn fetch_i64(
        &mut self,
        sql: &'static str,
        args: &[SqlValue<'_>],
    ) -> Result<Option<i64>, StoreError> {
        Ok(on_tx!(self, |t| {
            let mut q = sqlx::query_scalar::<_, i64>(sql);
            for a in args {
                q = match a {
                    SqlValue::Int(v) => q.bind(*v),
                    SqlValue::Text(v) => q.bind(*v),
                    SqlValue::Null => q.bind(None::<i64>),
                };
            }
            q.fetch_optional(&mut **t).await?
        }))
    }
}

/// A value bound to a `$N` placeholder by [`Tx::execute`] and [`Tx::fetch_i64`].
#[derive(Debug, Clone, Copy)]
pub enum SqlValue<'a> {
    /// A 64-bit integer (`BIGINT` / `INTEGER`).
    Int(i64),
    /// Text.
    Text(&'a str),
    /// SQL NULL.
    Null,
}

impl TransactionSource for Tx {
    fn param(&mut self, type_id: TypeId) -> Option<&mut (dyn Any + Send)> {
        if type_id == TypeId::of::<Tx>() {
            return Some(self);
        }
        match self {
            #[cfg(feature = "sqlite")]
            Tx::Sqlite(t) if type_id == TypeId::of::<sqlx::SqliteConnection>() => {
                Some(&mut **t as &mut (dyn Any + Send))
            }
            #[cfg(feature = "postgres")]
            Tx::Postgres(t) if type_id == TypeId::of::<sqlx::PgConnection>() => {
                Some(&mut **t as &mut (dyn Any + Send))
            }
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
enum Backend {
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
}

/// Which database a [`Store`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// SQLite.
    Sqlite,
    /// PostgreSQL.
    Postgres,
}

/// The outbox tables of one database, SQLite or PostgreSQL, chosen by URL.
///
/// The schema (applied by [`migrate`](Self::migrate), versioned with `sqlx::migrate`, in the
/// `_sqlx_migrations` table):
///
/// | table | one row per | key columns |
/// |---|---|---|
/// | `event_outbox` | accepted event | `event_id`, `name`, `version`, aggregate type / id / `sequence`, `envelope` (CloudEvents JSON, byte for byte) |
/// | `event_deliveries` | (event, after-commit handler) | `(handler, event_id)` primary key — the durable idempotency key; `status` (`pending`, `completed`, `dead`, `purged`), `attempts`, `next_attempt_at`, `lease_token`, `lease_until` |
/// | `event_dead_letters` | delivery that failed for good | original `envelope`, `handler`, `attempts`, first and last failure time, `reason`, `error_chain` (JSON array), `resolved_at` / `resolution` after a replay or purge |
/// | `event_audit_log` | replay or purge | `action`, `actor`, `reason`, `at`, `dead_letter_ids` (JSON array), `count` |
///
/// Times are `BIGINT` milliseconds since the Unix epoch, UTC, taken from the clock of the
/// process that writes them.
#[derive(Debug, Clone)]
pub struct Store {
    backend: Backend,
}

impl Store {
    /// Connects to `url` and applies the bundled migrations.
    ///
    /// - `sqlite://PATH` (created when missing; WAL journal; writes serialised with
    ///   `BEGIN IMMEDIATE` and a 30 s busy timeout), `sqlite::memory:` (one connection, gone
    ///   when the store is dropped);
    /// - `postgres://USER@HOST:PORT/DB` (needs the `postgres` feature).
    ///
    /// # Errors
    /// [`StoreError::UnsupportedUrl`], [`StoreError::Database`] when the database cannot be
    /// reached or opened, [`StoreError::Migrate`] when the schema cannot be applied.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        let store = Self::connect_lazy_schema(url, None, true).await?;
        store.migrate().await?;
        Ok(store)
    }

    /// Opens an existing outbox for reading and operations (the `events` tool): creates no
    /// file, schema or table and applies no migration.
    ///
    /// # Errors
    /// As [`connect`](Self::connect), and [`StoreError::NotAnOutbox`] when the database (or
    /// `schema`, for PostgreSQL) holds no outbox tables.
    pub async fn open(url: &str, schema: Option<&str>) -> Result<Store, StoreError> {
        if schema.is_some() && !is_postgres(url) {
            return Err(StoreError::UnsupportedUrl(url.to_owned()));
        }
        let store = Self::connect_lazy_schema(url, schema, false).await?;
        let probe = on_pool!(store, |p| sqlx::query("SELECT 1 FROM event_outbox LIMIT 1")
            .fetch_optional(p)
            .await
            .map(|_| ()));
        match probe {
            Ok(()) => Ok(store),
            Err(sqlx::Error::Database(_)) => Err(StoreError::NotAnOutbox {
                url: url.to_owned(),
                schema: schema.map(str::to_owned),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Connects to a PostgreSQL database and keeps every table in `schema` (created when
    /// missing; set as the connections' `search_path`), then migrates. Lets several
    /// applications — or tests running in parallel — share one database.
    ///
    /// # Errors
    /// As [`connect`](Self::connect); [`StoreError::UnsupportedUrl`] for a non-PostgreSQL URL.
    pub async fn connect_postgres_schema(url: &str, schema: &str) -> Result<Store, StoreError> {
        if !is_postgres(url) {
            return Err(StoreError::UnsupportedUrl(url.to_owned()));
        }
        let store = Self::connect_lazy_schema(url, Some(schema), true).await?;
        store.migrate().await?;
        Ok(store)
    }

    async fn connect_lazy_schema(
        url: &str,
        schema: Option<&str>,
        create: bool,
    ) -> Result<Store, StoreError> {
        #[cfg(feature = "sqlite")]
        if url.starts_with("sqlite:") {
            use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
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
                return Err(StoreError::UnsupportedUrl(url.to_owned()));
            }
            let options = SqliteConnectOptions::from_str(url)?
                .create_if_missing(create)
                .foreign_keys(true)
                .busy_timeout(Duration::from_secs(30));
            let options = if memory {
                options
            } else {
                options
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(sqlx::sqlite::SqliteSynchronous::Normal)
            };
            let pool = SqlitePoolOptions::new()
                .max_connections(if memory { 1 } else { 4 })
                .min_connections(if memory { 1 } else { 0 })
                .idle_timeout(if memory {
                    None
                } else {
                    Some(Duration::from_secs(600))
                })
                .max_lifetime(if memory {
                    None
                } else {
                    Some(Duration::from_secs(1800))
                })
                .acquire_timeout(Duration::from_secs(60))
                .connect_with(options)
                .await?;
            return Ok(Store {
                backend: Backend::Sqlite(pool),
            });
        }
        #[cfg(feature = "postgres")]
        if is_postgres(url) {
            use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
            let mut options = PgConnectOptions::from_str(url)?;
            if let Some(schema) = schema.filter(|_| create) {
                let ident = quote_ident(schema);
                let mut conn =
                    <sqlx::PgConnection as sqlx::Connection>::connect_with(&options).await?;
                sqlx::query(AssertSqlSafe(format!(
                    "CREATE SCHEMA IF NOT EXISTS {ident}"
                )))
                .execute(&mut conn)
                .await?;
                sqlx::Connection::close(conn).await?;
            }
            if let Some(schema) = schema {
                options = options.options([("search_path", schema)]);
            }
            let pool = PgPoolOptions::new()
                .max_connections(8)
                .acquire_timeout(Duration::from_secs(30))
                .connect_with(options)
                .await?;
            return Ok(Store {
                backend: Backend::Postgres(pool),
            });
        }
        let _ = schema;
        Err(StoreError::UnsupportedUrl(url.to_owned()))
    }

    /// A store over an SQLite pool you configured (migrate it with [`migrate`](Self::migrate)).
    #[cfg(feature = "sqlite")]
    pub fn from_sqlite_pool(pool: sqlx::SqlitePool) -> Store {
        Store {
            backend: Backend::Sqlite(pool),
        }
    }

    /// A store over a PostgreSQL pool you configured (migrate it with
    /// [`migrate`](Self::migrate)).
    #[cfg(feature = "postgres")]
    pub fn from_pg_pool(pool: sqlx::PgPool) -> Store {
        Store {
            backend: Backend::Postgres(pool),
        }
    }

    /// Applies the bundled migrations that are not applied yet. Idempotent.
    ///
    /// # Errors
    /// [`StoreError::Migrate`] when a migration fails or the database holds a migration this
    /// version does not know (a newer version of the crate migrated it).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match &self.backend {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(p) => sqlx::migrate!("migrations/sqlite").run(p).await?,
            #[cfg(feature = "postgres")]
            Backend::Postgres(p) => sqlx::migrate!("migrations/postgres").run(p).await?,
        }
        Ok(())
    }

    /// Which backend this is.
    pub fn kind(&self) -> BackendKind {
        match &self.backend {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(_) => BackendKind::Sqlite,
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => BackendKind::Postgres,
        }
    }

    /// The SQLite pool, if this is SQLite.
    #[cfg(feature = "sqlite")]
    pub fn sqlite_pool(&self) -> Option<&sqlx::SqlitePool> {
        #[allow(unreachable_patterns)]
        match &self.backend {
            Backend::Sqlite(p) => Some(p),
            _ => None,
        }
    }

    /// The PostgreSQL pool, if this is PostgreSQL.
    #[cfg(feature = "postgres")]
    pub fn pg_pool(&self) -> Option<&sqlx::PgPool> {
        #[allow(unreachable_patterns)]
        match &self.backend {
            Backend::Postgres(p) => Some(p),
            _ => None,
        }
    }

    /// Begins a write transaction.
    ///
    /// # Errors
    /// [`StoreError::Database`] when no connection can be had.
    pub async fn begin(&self) -> Result<Tx, StoreError> {
        Ok(match &self.backend {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(p) => Tx::Sqlite(p.begin_with("BEGIN IMMEDIATE").await?),
            #[cfg(feature = "postgres")]
            Backend::Postgres(p) => Tx::Postgres(p.begin().await?),
        })
    }

    /// Closes every connection.
    pub async fn close(&self) {
        on_pool!(self, |p| p.close().await)
    }

    // ---- outbox ------------------------------------------------------------------------

    /// Inserts outbox rows in `tx` and returns the ids of those that were new: an event id
    /// already present is skipped (appending is idempotent). On PostgreSQL a concurrent
    /// transaction inserting the same id makes this one wait for it, then skip.
    pub(crate) async fn insert_events(
        tx: &mut Tx,
        events: &[OutboxRow],
        now: i64,
    ) -> Result<HashSet<String>, StoreError> {
        let mut inserted = HashSet::with_capacity(events.len());
        for chunk in events.chunks(200) {
            let result = on_tx!(tx, |t| {
                let mut qb = sqlx::QueryBuilder::new(
                    "INSERT INTO event_outbox (event_id, name, version, aggregate_type, aggregate_id, sequence, occurred_at, recorded_at, envelope) ",
                );
                qb.push_values(chunk, |mut b, e| {
                    b.push_bind(e.event_id.to_string())
                        .push_bind(e.name)
                        .push_bind(i64::from(e.version))
                        .push_bind(e.aggregate_type.clone())
                        .push_bind(e.aggregate_id.clone())
                        .push_bind(to_i64(e.sequence))
                        .push_bind(e.occurred_at)
                        .push_bind(now)
                        .push_bind(e.envelope.clone());
                });
                qb.push(" ON CONFLICT (event_id) DO NOTHING RETURNING event_id");
                qb.build_query_scalar::<String>().fetch_all(&mut **t).await
            });
            match result {
                Ok(ids) => inserted.extend(ids),
                Err(e) => return Err(conflict_or(e, chunk)),
            }
        }
        Ok(inserted)
    }

    /// Inserts one delivery row per (event, after-commit handler) of `events`.
    pub(crate) async fn insert_deliveries(
        tx: &mut Tx,
        events: &[&OutboxRow],
        now: i64,
    ) -> Result<(), StoreError> {
        let deliveries: Vec<(&OutboxRow, &str, bool)> = events
            .iter()
            .flat_map(|e| {
                e.handlers
                    .iter()
                    .map(move |(h, ordered)| (*e, *h, *ordered))
            })
            .collect();
        for chunk in deliveries.chunks(200) {
            on_tx!(tx, |t| {
                let mut qb = sqlx::QueryBuilder::new(
                    "INSERT INTO event_deliveries (handler, event_id, aggregate_type, aggregate_id, sequence, next_attempt_at, created_at) ",
                );
                qb.push_values(chunk, |mut b, (e, h, ordered)| {
                    // Sequence 0 is never held back by, nor holds back, another delivery.
                    let sequence = if *ordered { to_i64(e.sequence) } else { 0 };
                    b.push_bind(h.to_string())
                        .push_bind(e.event_id.to_string())
                        .push_bind(e.aggregate_type.clone())
                        .push_bind(e.aggregate_id.clone())
                        .push_bind(sequence)
                        .push_bind(now)
                        .push_bind(now);
                });
                qb.push(" ON CONFLICT (handler, event_id) DO NOTHING");
                qb.build().execute(&mut **t).await?.rows_affected()
            });
        }
        Ok(())
    }

    /// Leases up to `limit` due deliveries of `handlers` (a JSON array of handler names: those
    /// this process can run) to `token` until `now + lease_ms`, respecting per-aggregate order
    /// per handler, and returns them with their envelopes.
    pub(crate) async fn claim(
        &self,
        token: &str,
        limit: u32,
        lease_ms: i64,
        now: i64,
        handlers: &str,
    ) -> Result<Vec<Claimed>, StoreError> {
        const SQLITE: &str = concat!(
            "UPDATE event_deliveries SET lease_token = $1, lease_until = $2, attempts = attempts + 1",
            " WHERE (handler, event_id) IN (",
            due_deliveries!(sqlite),
            ")"
        );
        const POSTGRES: &str = concat!(
            "UPDATE event_deliveries u SET lease_token = $1, lease_until = $2, attempts = u.attempts + 1",
            " FROM (",
            due_deliveries!(postgres),
            " FOR UPDATE SKIP LOCKED) due",
            " WHERE u.handler = due.handler AND u.event_id = due.event_id"
        );
        const FETCH: &str = "SELECT d.handler, d.event_id, d.attempts, d.first_failed_at, o.envelope, o.name, o.version
            FROM event_deliveries d JOIN event_outbox o ON o.event_id = d.event_id
            WHERE d.lease_token = $1
            ORDER BY d.aggregate_type, d.aggregate_id, d.sequence";
        let until = now + lease_ms;
        let rows = on_pool!(self, |p| {
            let sql = match self.kind() {
                BackendKind::Sqlite => SQLITE,
                BackendKind::Postgres => POSTGRES,
            };
            let n = sqlx::query(sql)
                .bind(token)
                .bind(until)
                .bind(now)
                .bind(i64::from(limit))
                .bind(handlers)
                .execute(p)
                .await?
                .rows_affected();
            if n == 0 {
                return Ok(Vec::new());
            }
            sqlx::query(FETCH)
                .bind(token)
                .fetch_all(p)
                .await?
                .into_iter()
                .map(|r| {
                    Ok(Claimed {
                        handler: r.try_get("handler")?,
                        event_id: r.try_get("event_id")?,
                        attempts: r.try_get("attempts")?,
                        first_failed_at: r.try_get("first_failed_at")?,
                        envelope: r.try_get("envelope")?,
                        name: r.try_get("name")?,
                        version: r.try_get("version")?,
                    })
                })
                .collect::<Result<Vec<_>, sqlx::Error>>()?
        });
        Ok(rows)
    }

    /// Schedules a retry of a leased delivery. Returns false when the lease was lost.
    pub(crate) async fn retry_later(
        tx: &mut Tx,
        claimed: &Claimed,
        token: &str,
        next_attempt_at: i64,
        error: &str,
        now: i64,
    ) -> Result<bool, StoreError> {
        const SQL: &str = "UPDATE event_deliveries SET lease_token = NULL, lease_until = NULL,
                next_attempt_at = $1, last_error = $2, first_failed_at = COALESCE(first_failed_at, $3), last_failed_at = $3
            WHERE handler = $4 AND event_id = $5 AND lease_token = $6";
        let n = on_tx!(tx, |t| sqlx::query(SQL)
            .bind(next_attempt_at)
            .bind(error)
            .bind(now)
            .bind(&claimed.handler)
            .bind(&claimed.event_id)
            .bind(token)
            .execute(&mut **t)
            .await?
            .rows_affected());
        Ok(n == 1)
    }

    /// Moves a leased delivery to the dead letter queue. Returns false when the lease was
    /// lost.
    pub(crate) async fn dead_letter(
        tx: &mut Tx,
        claimed: &Claimed,
        token: &str,
        reason: &str,
        chain: &[String],
        now: i64,
    ) -> Result<bool, StoreError> {
        const UPDATE: &str = "UPDATE event_deliveries SET status = 'dead', lease_token = NULL, lease_until = NULL,
                last_error = $1, first_failed_at = COALESCE(first_failed_at, $2), last_failed_at = $2
            WHERE handler = $3 AND event_id = $4 AND lease_token = $5";
        const INSERT: &str = "INSERT INTO event_dead_letters
                (event_id, handler, name, version, envelope, attempts, first_failed_at, last_failed_at, reason, error_chain, dead_at)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $8)";
        let chain_json = serde_json::to_string(chain).unwrap_or_else(|_| "[]".into());
        let last = chain.join(": ");
        let first_failed = claimed.first_failed_at.unwrap_or(now);
        let n = on_tx!(tx, |t| {
            let n = sqlx::query(UPDATE)
                .bind(&last)
                .bind(now)
                .bind(&claimed.handler)
                .bind(&claimed.event_id)
                .bind(token)
                .execute(&mut **t)
                .await?
                .rows_affected();
            if n == 1 {
                sqlx::query(INSERT)
                    .bind(&claimed.event_id)
                    .bind(&claimed.handler)
                    .bind(&claimed.name)
                    .bind(claimed.version)
                    .bind(&claimed.envelope)
                    .bind(claimed.attempts)
                    .bind(first_failed)
                    .bind(now)
                    .bind(reason)
                    .bind(&chain_json)
                    .execute(&mut **t)
                    .await?;
            }
            n
        });
        Ok(n == 1)
    }

    /// Marks every delivery still leased to `token` completed. Returns how many.
    pub(crate) async fn complete_leased(
        tx: &mut Tx,
        token: &str,
        now: i64,
    ) -> Result<u64, StoreError> {
        const SQL: &str = "UPDATE event_deliveries SET status = 'completed', completed_at = $1,
                lease_token = NULL, lease_until = NULL
            WHERE lease_token = $2 AND status = 'pending'";
        Ok(on_tx!(tx, |t| sqlx::query(SQL)
            .bind(now)
            .bind(token)
            .execute(&mut **t)
            .await?
            .rows_affected()))
    }

    /// Gives back deliveries leased to `token` that were not processed (shutdown): they are
    /// due again at once, and the claim does not count as an attempt.
    pub(crate) async fn release(&self, token: &str) -> Result<u64, StoreError> {
        const SQL: &str = "UPDATE event_deliveries SET lease_token = NULL, lease_until = NULL,
                attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END
            WHERE lease_token = $1 AND status = 'pending'";
        Ok(on_pool!(self, |p| sqlx::query(SQL)
            .bind(token)
            .execute(p)
            .await?
            .rows_affected()))
    }

    /// Deletes up to `batch` completed deliveries older than `cutoff` (ms), then outbox rows
    /// older than `cutoff` that no delivery refers to any more. Returns deliveries deleted.
    pub(crate) async fn purge_completed(&self, cutoff: i64, batch: u32) -> Result<u64, StoreError> {
        const DELIVERIES: &str = "DELETE FROM event_deliveries WHERE (handler, event_id) IN (
                SELECT handler, event_id FROM event_deliveries
                WHERE status = 'completed' AND completed_at < $1 LIMIT $2)";
        const OUTBOX: &str = "DELETE FROM event_outbox WHERE event_id IN (
                SELECT o.event_id FROM event_outbox o
                WHERE o.recorded_at < $1
                  AND NOT EXISTS (SELECT 1 FROM event_deliveries d WHERE d.event_id = o.event_id)
                  AND NOT EXISTS (SELECT 1 FROM event_dead_letters l WHERE l.event_id = o.event_id AND l.resolved_at IS NULL)
                LIMIT $2)";
        let mut tx = self.begin().await?;
        // One purger at a time: PostgreSQL advisory lock for the transaction; SQLite has one
        // writer anyway.
        #[cfg(feature = "postgres")]
        if let Tx::Postgres(t) = &mut tx {
            let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(7243012201)")
                .fetch_one(&mut **t)
                .await?;
            if !got {
                return Ok(0);
            }
        }
        let n = on_tx!(&mut tx, |t| {
            let n = sqlx::query(DELIVERIES)
                .bind(cutoff)
                .bind(i64::from(batch))
                .execute(&mut **t)
                .await?
                .rows_affected();
            sqlx::query(OUTBOX)
                .bind(cutoff)
                .bind(i64::from(batch))
                .execute(&mut **t)
                .await?;
            n
        });
        tx.commit().await?;
        Ok(n)
    }

    /// Pending deliveries of `handlers` (a JSON array) that are not waiting behind a dead
    /// letter: those that will run (now, after a retry delay, or after another worker's lease).
    pub(crate) async fn progressing(&self, handlers: &str) -> Result<u64, StoreError> {
        const SQLITE: &str = progressing!(sqlite);
        const POSTGRES: &str = progressing!(postgres);
        let sql = match self.kind() {
            BackendKind::Sqlite => SQLITE,
            BackendKind::Postgres => POSTGRES,
        };
        let n: i64 = on_pool!(self, |p| sqlx::query_scalar(sql)
            .bind(handlers)
            .fetch_one(p)
            .await?);
        Ok(n as u64)
    }

    /// Refreshes the planner statistics of the deliveries table (PostgreSQL `ANALYZE`; a
    /// no-op on SQLite), so that claims keep using the due index after a burst of commits.
    pub(crate) async fn refresh_statistics(&self) -> Result<(), StoreError> {
        #[cfg(feature = "postgres")]
        if let Backend::Postgres(p) = &self.backend {
            sqlx::query("ANALYZE event_deliveries").execute(p).await?;
        }
        Ok(())
    }

    /// Backlog and dead letter counts.
    ///
    /// # Errors
    /// [`StoreError::Database`].
    pub async fn stats(&self) -> Result<OutboxStats, StoreError> {
        const PER_HANDLER: &str = "SELECT handler, status, COUNT(*) AS n, MIN(created_at) AS oldest
            FROM event_deliveries GROUP BY handler, status ORDER BY handler, status";
        const DEAD: &str = "SELECT COUNT(*) FROM event_dead_letters WHERE resolved_at IS NULL";
        const EVENTS: &str = "SELECT COUNT(*) FROM event_outbox";
        const BLOCKED: &str = concat!(
            "SELECT COUNT(*) FROM event_deliveries d WHERE d.status = 'pending' AND EXISTS (",
            earlier_delivery!("'dead'"),
            ")"
        );
        let now = now_ms();
        let (rows, dead, events, blocked) = on_pool!(self, |p| {
            let rows = sqlx::query(PER_HANDLER).fetch_all(p).await?;
            let rows = rows
                .into_iter()
                .map(|r| {
                    Ok((
                        r.try_get::<String, _>("handler")?,
                        r.try_get::<String, _>("status")?,
                        r.try_get::<i64, _>("n")?,
                        r.try_get::<Option<i64>, _>("oldest")?,
                    ))
                })
                .collect::<Result<Vec<_>, sqlx::Error>>()?;
            let dead: i64 = sqlx::query_scalar(DEAD).fetch_one(p).await?;
            let events: i64 = sqlx::query_scalar(EVENTS).fetch_one(p).await?;
            let blocked: i64 = sqlx::query_scalar(BLOCKED).fetch_one(p).await?;
            (rows, dead, events, blocked)
        });
        let mut stats = OutboxStats {
            events: events as u64,
            dead_letters: dead as u64,
            blocked: blocked as u64,
            ..OutboxStats::default()
        };
        let mut oldest: Option<i64> = None;
        for (handler, status, n, first) in rows {
            let entry = match stats.handlers.iter_mut().find(|h| h.handler == handler) {
                Some(e) => e,
                None => {
                    stats.handlers.push(HandlerStats {
                        handler,
                        ..HandlerStats::default()
                    });
                    stats.handlers.last_mut().expect("just pushed")
                }
            };
            let n = n as u64;
            match status.as_str() {
                "pending" => {
                    entry.pending += n;
                    stats.pending += n;
                    if let Some(f) = first {
                        oldest = Some(oldest.map_or(f, |o| o.min(f)));
                    }
                }
                "completed" => entry.completed += n,
                "dead" => entry.dead += n,
                _ => entry.purged += n,
            }
        }
        stats.oldest_pending_age_secs = oldest.map(|o| ((now - o).max(0) as f64) / 1000.0);
        Ok(stats)
    }

    // ---- dead letters ------------------------------------------------------------------

    /// Dead letters matching `filter`, oldest first.
    ///
    /// # Errors
    /// [`StoreError::Database`], [`StoreError::Corrupt`].
    pub async fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        const SQL: &str =
            "SELECT id, event_id, handler, name, version, envelope, attempts, first_failed_at,
                last_failed_at, reason, error_chain, dead_at, resolved_at, resolution
            FROM event_dead_letters
            WHERE ($1 OR resolved_at IS NULL)
              AND ($2 IS NULL OR handler = $2)
              AND ($3 IS NULL OR name = $3)
              AND ($4 IS NULL OR dead_at >= $4)
              AND ($5 IS NULL OR dead_at < $5)
              AND ($6 IS NULL OR id = $6)
            ORDER BY id
            LIMIT $7";
        let rows = on_pool!(self, |p| sqlx::query(SQL)
            .bind(filter.include_resolved)
            .bind(filter.handler.as_deref())
            .bind(filter.event_name.as_deref())
            .bind(filter.since.map(|t| t.timestamp_millis()))
            .bind(filter.until.map(|t| t.timestamp_millis()))
            .bind(filter.id)
            .bind(filter.limit.map_or(i64::MAX, |l| l as i64))
            .fetch_all(p)
            .await?
            .into_iter()
            .map(|r| dead_letter_from_row(&r))
            .collect::<Result<Vec<_>, StoreError>>()?);
        Ok(rows)
    }

    /// The dead letter `id`, resolved or not.
    ///
    /// # Errors
    /// [`StoreError::Database`], [`StoreError::Corrupt`].
    pub async fn dead_letter_by_id(&self, id: i64) -> Result<Option<DeadLetter>, StoreError> {
        let filter = DeadLetterFilter {
            id: Some(id),
            include_resolved: true,
            ..DeadLetterFilter::default()
        };
        Ok(self.dead_letters(&filter).await?.into_iter().next())
    }

    /// Replays (`Replay`) or gives up on (`Purge`) the open dead letters `ids`, in one
    /// transaction with one audit row. Replay makes each delivery due now with attempts reset
    /// and the same event id; purge marks the delivery `purged` so that later events of the
    /// aggregate flow. Returns the ids acted on (ids not open are skipped).
    ///
    /// # Errors
    /// [`StoreError::Database`].
    pub async fn resolve_dead_letters(
        &self,
        ids: &[i64],
        action: Resolution,
        actor: &str,
        reason: &str,
    ) -> Result<Vec<i64>, StoreError> {
        let entry = self
            .resolve_dead_letters_with_progress(ids, action, actor, reason, |_| {})
            .await?;
        Ok(entry.dead_letter_ids)
    }

    /// As [`resolve_dead_letters`](Self::resolve_dead_letters) — one transaction, one audit
    /// row — for long operations: calls `progress(n)` once each of the `ids` is handled (`n`
    /// of them so far), and returns the audit row written.
    ///
    /// # Errors
    /// [`StoreError::Database`]; nothing is changed then.
    pub async fn resolve_dead_letters_with_progress(
        &self,
        ids: &[i64],
        action: Resolution,
        actor: &str,
        reason: &str,
        mut progress: impl FnMut(usize) + Send,
    ) -> Result<AuditEntry, StoreError> {
        const MARK: &str = "UPDATE event_dead_letters SET resolved_at = $1, resolution = $2
            WHERE id = $3 AND resolved_at IS NULL";
        const KEY: &str = "SELECT handler, event_id FROM event_dead_letters WHERE id = $1";
        const REPLAY: &str = "UPDATE event_deliveries SET status = 'pending', attempts = 0, next_attempt_at = $1,
                lease_token = NULL, lease_until = NULL, last_error = NULL, first_failed_at = NULL, last_failed_at = NULL
            WHERE handler = $2 AND event_id = $3 AND status = 'dead'";
        const PURGE: &str =
            "UPDATE event_deliveries SET status = 'purged', lease_token = NULL, lease_until = NULL
            WHERE handler = $2 AND event_id = $3 AND status = 'dead' AND $1 >= 0";
        const AUDIT: &str =
            "INSERT INTO event_audit_log (action, actor, reason, at, dead_letter_ids, count)
            VALUES ($1, $2, $3, $4, $5, $6) RETURNING id";
        let now = now_ms();
        let (label, delivery_sql) = match action {
            Resolution::Replay => ("replayed", REPLAY),
            Resolution::Purge => ("purged", PURGE),
        };
        let action_name = match action {
            Resolution::Replay => "replay",
            Resolution::Purge => "purge",
        };
        let mut done = Vec::new();
        let mut tx = self.begin().await?;
        let audit_id = on_tx!(&mut tx, |t| {
            for (i, &id) in ids.iter().enumerate() {
                let n = sqlx::query(MARK)
                    .bind(now)
                    .bind(label)
                    .bind(id)
                    .execute(&mut **t)
                    .await?
                    .rows_affected();
                if n == 0 {
                    progress(i + 1);
                    continue;
                }
                let (handler, event_id): (String, String) =
                    sqlx::query_as(KEY).bind(id).fetch_one(&mut **t).await?;
                sqlx::query(delivery_sql)
                    .bind(now)
                    .bind(&handler)
                    .bind(&event_id)
                    .execute(&mut **t)
                    .await?;
                done.push(id);
                progress(i + 1);
            }
            sqlx::query_scalar::<_, i64>(AUDIT)
                .bind(action_name)
                .bind(actor)
                .bind(reason)
                .bind(now)
                .bind(serde_json::to_string(&done).unwrap_or_default())
                .bind(done.len() as i64)
                .fetch_one(&mut **t)
                .await?
        });
        tx.commit().await?;
        Ok(AuditEntry {
            id: audit_id,
            action: action_name.to_owned(),
            actor: actor.to_owned(),
            reason: reason.to_owned(),
            at: from_ms(now),
            count: done.len() as u64,
            dead_letter_ids: done,
        })
    }

    /// The audit log, newest first.
    ///
    /// # Errors
    /// [`StoreError::Database`], [`StoreError::Corrupt`].
    pub async fn audit_log(&self, limit: u32) -> Result<Vec<AuditEntry>, StoreError> {
        const SQL: &str = "SELECT id, action, actor, reason, at, dead_letter_ids, count
            FROM event_audit_log ORDER BY id DESC LIMIT $1";
        let rows = on_pool!(self, |p| sqlx::query(SQL)
            .bind(i64::from(limit))
            .fetch_all(p)
            .await?
            .into_iter()
            .map(|r| {
                let ids: String = r.try_get("dead_letter_ids")?;
                Ok(AuditEntry {
                    id: r.try_get("id")?,
                    action: r.try_get("action")?,
                    actor: r.try_get("actor")?,
                    reason: r.try_get("reason")?,
                    at: from_ms(r.try_get("at")?),
                    dead_letter_ids: serde_json::from_str(&ids)
                        .map_err(|e| StoreError::Corrupt(format!("audit dead_letter_ids: {e}")))?,
                    count: r.try_get::<i64, _>("count")? as u64,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?);
        Ok(rows)
    }

    /// Every pending delivery's envelope and handler (for pre-deploy decode checks).
    ///
    /// # Errors
    /// [`StoreError::Database`].
    pub async fn pending_envelopes(&self) -> Result<Vec<(String, String, String)>, StoreError> {
        const SQL: &str = "SELECT d.handler, d.event_id, o.envelope FROM event_deliveries d
            JOIN event_outbox o ON o.event_id = d.event_id WHERE d.status = 'pending' ORDER BY o.recorded_at";
        Ok(on_pool!(self, |p| sqlx::query_as::<
            _,
            (String, String, String),
        >(SQL)
        .fetch_all(p)
        .await?))
    }
}

fn dead_letter_from_row<R: Row>(r: &R) -> Result<DeadLetter, StoreError>
where
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    i64: sqlx::Type<R::Database> + for<'d> sqlx::Decode<'d, R::Database>,
    String: sqlx::Type<R::Database> + for<'d> sqlx::Decode<'d, R::Database>,
    Option<i64>: sqlx::Type<R::Database> + for<'d> sqlx::Decode<'d, R::Database>,
    Option<String>: sqlx::Type<R::Database> + for<'d> sqlx::Decode<'d, R::Database>,
{
    let chain: String = r.try_get("error_chain")?;
    let event_id: String = r.try_get("event_id")?;
    Ok(DeadLetter {
        id: r.try_get("id")?,
        event_id: Uuid::parse_str(&event_id)
            .map_err(|e| StoreError::Corrupt(format!("dead letter event_id {event_id:?}: {e}")))?,
        handler: r.try_get("handler")?,
        event_name: r.try_get("name")?,
        event_version: r.try_get::<i64, _>("version")? as u32,
        envelope: r.try_get("envelope")?,
        attempts: r.try_get::<i64, _>("attempts")? as u32,
        first_failed_at: from_ms(r.try_get("first_failed_at")?),
        last_failed_at: from_ms(r.try_get("last_failed_at")?),
        reason: r.try_get("reason")?,
        error_chain: serde_json::from_str(&chain)
            .map_err(|e| StoreError::Corrupt(format!("dead letter error_chain: {e}")))?,
        dead_at: from_ms(r.try_get("dead_at")?),
        resolved_at: r.try_get::<Option<i64>, _>("resolved_at")?.map(from_ms),
        resolution: r.try_get("resolution")?,
    })
}

fn conflict_or(e: sqlx::Error, chunk: &[OutboxRow]) -> StoreError {
    if let sqlx::Error::Database(db) = &e {
        if db.is_unique_violation() {
            // The event_id conflict is absorbed by ON CONFLICT; what is left is the
            // (aggregate, sequence) index.
            if let Some(row) = chunk.first() {
                return StoreError::Conflict {
                    aggregate_type: row.aggregate_type.clone(),
                    aggregate_id: row.aggregate_id.clone(),
                    sequence: row.sequence,
                };
            }
        }
    }
    StoreError::Database(e)
}

fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

#[cfg(feature = "postgres")]
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

pub(crate) fn from_ms(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

/// One event as written to the outbox.
#[derive(Debug, Clone)]
pub(crate) struct OutboxRow {
    pub(crate) event_id: Uuid,
    pub(crate) name: &'static str,
    pub(crate) version: u32,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) sequence: u64,
    pub(crate) occurred_at: i64,
    pub(crate) envelope: String,
    /// After-commit handlers: (name, keeps per-aggregate order).
    pub(crate) handlers: Vec<(&'static str, bool)>,
}

/// A delivery leased to a worker.
#[derive(Debug, Clone)]
pub(crate) struct Claimed {
    pub(crate) handler: String,
    pub(crate) event_id: String,
    /// Including this attempt.
    pub(crate) attempts: i64,
    pub(crate) first_failed_at: Option<i64>,
    pub(crate) envelope: String,
    pub(crate) name: String,
    pub(crate) version: i64,
}

/// Outbox backlog, as `events outbox stats` prints it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct OutboxStats {
    /// Rows in the outbox (events not purged by retention).
    pub events: u64,
    /// Deliveries not completed yet (due, leased or waiting for a retry).
    pub pending: u64,
    /// Pending deliveries that wait behind a dead letter of the same (handler, aggregate):
    /// they flow once it is replayed or purged.
    pub blocked: u64,
    /// Age of the oldest pending delivery, in seconds.
    pub oldest_pending_age_secs: Option<f64>,
    /// Dead letters not replayed or purged.
    pub dead_letters: u64,
    /// Per-handler delivery counts.
    pub handlers: Vec<HandlerStats>,
}

/// Delivery counts of one handler.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct HandlerStats {
    /// The handler name.
    pub handler: String,
    /// Pending deliveries.
    pub pending: u64,
    /// Completed deliveries (until retention purges them).
    pub completed: u64,
    /// Deliveries in the dead letter queue.
    pub dead: u64,
    /// Deliveries given up on by a purge.
    pub purged: u64,
}

/// Selects dead letters. The default selects every open (not replayed, not purged) one.
#[derive(Debug, Clone, Default)]
pub struct DeadLetterFilter {
    /// Only this dead letter.
    pub id: Option<i64>,
    /// Only this handler.
    pub handler: Option<String>,
    /// Only this event name.
    pub event_name: Option<String>,
    /// Dead-lettered at or after.
    pub since: Option<DateTime<Utc>>,
    /// Dead-lettered before.
    pub until: Option<DateTime<Utc>>,
    /// Include replayed and purged ones.
    pub include_resolved: bool,
    /// At most this many.
    pub limit: Option<u32>,
}

/// A delivery that failed for good.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeadLetter {
    /// Id in the dead letter queue.
    pub id: i64,
    /// The event id (kept on replay).
    pub event_id: Uuid,
    /// The handler that failed.
    pub handler: String,
    /// The event name.
    pub event_name: String,
    /// The event version.
    pub event_version: u32,
    /// The original envelope, byte for byte.
    pub envelope: String,
    /// Attempts made.
    pub attempts: u32,
    /// First failure.
    pub first_failed_at: DateTime<Utc>,
    /// Last failure.
    pub last_failed_at: DateTime<Utc>,
    /// Why: `permanent`, `exhausted`, `undecodable`, `unknown_event`, `unknown_handler`.
    pub reason: String,
    /// The error and its sources, outermost first.
    pub error_chain: Vec<String>,
    /// When it entered the queue.
    pub dead_at: DateTime<Utc>,
    /// When it was replayed or purged.
    pub resolved_at: Option<DateTime<Utc>>,
    /// `replayed` or `purged`.
    pub resolution: Option<String>,
}

/// What to do with dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Deliver again, same event id, attempts reset.
    Replay,
    /// Give up; later events of the aggregate flow.
    Purge,
}

/// A row of the replay audit log.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AuditEntry {
    /// Row id.
    pub id: i64,
    /// `replay` or `purge`.
    pub action: String,
    /// Who.
    pub actor: String,
    /// Why.
    pub reason: String,
    /// When.
    pub at: DateTime<Utc>,
    /// Which dead letters.
    pub dead_letter_ids: Vec<i64>,
    /// How many.
    pub count: u64,
}

//! The store layer: [`Store`], the handle the outbox and the `events` tool work through; the
//! boundary a database backend implements ([`backend`]); and the backends, one module each
//! behind its cargo feature. Runs no handler: the delivery engine decides, the store records.
//!
//! # Adding a backend
//! Outside this crate, a backend implements [`Backend`], its supertrait
//! [`backend::ChainStore`], [`BackendTransaction`] and the optional capabilities it offers
//! (see [`backend`]), is opened with [`Store::from_backend`], and proves itself with the
//! conformance suite (`event_runtime::conformance_suite!`, one line); nothing here changes.
//! Inside it, an sqlx-based one implements the crate's SQL dialect instead and gets every
//! trait, declares its name and URL schemes once (a `KnownBackend`), gets one line in the
//! table of [`Store::connect`]'s backends and one feature in `Cargo.toml` (DESIGN.md, "A
//! third store backend", counts the files).
//!
//! # Times
//! Every time the store writes is milliseconds since the Unix epoch, UTC, as `BIGINT`, given by
//! the caller: the outbox's clock (the process's, or an injected one in tests).
//!
#![doc = include_str!("portable_sql.md")]

pub mod backend;
mod capability;
mod conflicts;
mod error;
mod gaps;
mod group;
mod inbox;
mod operator;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
mod query;
mod republish;
mod resolve;
mod retarget;
pub(crate) mod sql;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;
mod tx;
mod types;
mod unrouted;
mod value;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;

pub(crate) use backend::InboxDeadLetter;
pub use backend::{AuditStamp, Backend, BackendTransaction, PendingEnvelope, RepublishSelection};
pub(crate) use conflicts::Place;
pub use error::{DatabaseError, StoreError};
pub use gaps::GapAcceptance;
pub use group::{GroupMember, GroupView, PartitionLease};
pub use inbox::InboxIdentity;
pub use query::{Query, Row};
pub use republish::RepublishReport;
pub use resolve::RESOLVE_PAGE;
pub use tx::{SqlValue, Tx};
pub use types::{
    AuditEntry, Backlog, CatalogRecord, DeadLetter, DeadLetterCount, DeadLetterFilter,
    DeadLetterReason, DestinationBacklog, DestinationReport, HandlerStats, OutboxStats,
    PausedDestination, Resolution,
};
pub use unrouted::UNROUTED_CAP;
pub use value::{timestamp_text, Datum, FromSql, SqlType, ToSql};

#[cfg(not(any(feature = "sqlite", feature = "postgres")))]
compile_error!("event-runtime needs at least one store feature: `sqlite` (default) or `postgres`");

/// How [`Store::connect_with`] opens a store: the defaults, changed with one setter per field
/// (`ConnectOptions::default().schema("billing").max_connections(4)`).
///
/// `#[non_exhaustive]`: fields are added in minor releases, so build it from
/// [`default`](Default::default) and the setters, never with a struct literal.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConnectOptions {
    /// Create what is missing (the SQLite file, the PostgreSQL schema) and apply the
    /// migrations (default `true`); `false` opens an existing outbox only, as
    /// [`Store::open`] does.
    pub create: bool,
    /// PostgreSQL: keep every table in this schema (created when missing; the connections'
    /// `search_path`), so that several applications or tests share one database. Refused by
    /// other backends.
    pub schema: Option<String>,
    /// How long connecting may take (default 10 s). A server that refuses connections fails
    /// at once with [`StoreError::Unreachable`].
    pub connect_timeout: Duration,
    /// Connections in the pool (default: SQLite 4, PostgreSQL 8).
    pub max_connections: Option<u32>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            create: true,
            schema: None,
            connect_timeout: Duration::from_secs(10),
            max_connections: None,
        }
    }
}

impl ConnectOptions {
    /// With [`schema`](Self::schema) set: PostgreSQL keeps every table in this schema.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// With [`create`](Self::create) set: `false` opens an existing outbox only.
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// With [`connect_timeout`](Self::connect_timeout) set.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// With [`max_connections`](Self::max_connections) set: the pool's size.
    pub fn max_connections(mut self, connections: u32) -> Self {
        self.max_connections = Some(connections);
        self
    }
}

/// A backend this crate has, compiled in or not: its name (also its feature's), its URL
/// schemes and the URL shape an error message shows. The one place schemes are declared:
/// the backend modules re-export theirs (`store::sqlite::URL_SCHEMES`).
pub(crate) struct KnownBackend {
    pub(crate) name: &'static str,
    pub(crate) url_schemes: &'static [&'static str],
    pub(crate) url_shape: &'static str,
}

pub(crate) const SQLITE: KnownBackend = KnownBackend {
    name: "sqlite",
    url_schemes: &["sqlite"],
    url_shape: "sqlite://PATH (a non-empty path) or sqlite::memory:",
};

pub(crate) const POSTGRES: KnownBackend = KnownBackend {
    name: "postgres",
    url_schemes: &["postgres", "postgresql"],
    url_shape: "postgres://USER@HOST:PORT/DB",
};

/// Every backend this crate has, one line each.
const KNOWN_BACKENDS: &[KnownBackend] = &[SQLITE, POSTGRES];

/// A backend this build has: which one, and how to connect.
pub(crate) struct BackendEntry {
    pub(crate) known: &'static KnownBackend,
    #[allow(clippy::type_complexity)]
    pub(crate) connect:
        fn(&str, &ConnectOptions) -> BoxFuture<'static, Result<Arc<dyn Backend>, StoreError>>,
}

/// The backends of this build, one line each.
const BACKENDS: &[BackendEntry] = &[
    #[cfg(feature = "sqlite")]
    sqlite::ENTRY,
    #[cfg(feature = "postgres")]
    postgres::ENTRY,
];

fn scheme(url: &str) -> &str {
    url.split(':').next().unwrap_or_default()
}

fn backend_for(url: &str) -> Result<&'static BackendEntry, StoreError> {
    let s = scheme(url);
    if let Some(b) = BACKENDS.iter().find(|b| b.known.url_schemes.contains(&s)) {
        return Ok(b);
    }
    let hint = match KNOWN_BACKENDS.iter().find(|k| k.url_schemes.contains(&s)) {
        Some(k) => format!(
            "this build has no {0} support: enable the `{0}` feature of event-runtime",
            k.name
        ),
        None => format!(
            "expected {}",
            BACKENDS
                .iter()
                .map(|b| b.known.url_shape)
                .collect::<Vec<_>>()
                .join(", or ")
        ),
    };
    Err(StoreError::UnsupportedUrl {
        url: redact(url),
        hint,
    })
}

/// The outbox tables of one database, chosen by URL: SQLite by default, PostgreSQL with the
/// feature `postgres`.
///
/// The schema (applied by [`migrate`](Self::migrate), versioned with `sqlx::migrate` in the
/// outbox's own table `_event_outbox_migrations`, so that an application's own migrations in
/// `_sqlx_migrations` live beside it):
///
/// | table | one row per | key columns |
/// |---|---|---|
/// | `event_outbox` | accepted event | `event_id`, `name`, `version`, aggregate type / id / `sequence`, `envelope` (CloudEvents JSON, byte for byte), `origin` (a received event's [`Origin`](crate::inbox::Origin), JSON) |
/// | `event_deliveries` | (event, destination) | `(handler, event_id)` primary key — the durable idempotency key; `status` (`pending`, `completed`, `dead`, `purged`), `attempts`, `next_attempt_at`, `ready` (the head of its run), `held` (its received event waits for a predecessor), `lease_token` |
/// | `event_leases` | delivery worker | `token`, `owner` (`host:pid`), `expires_at`: a delivery is leased while its token names a lease not expired |
/// | `event_paused_destinations` | pause of a destination | `destination`, `paused_by`, `reason`, `expires_at` (runtime pauses) |
/// | `event_dead_letters` | delivery that failed for good, or message an inbox could not accept | original `envelope`, `handler` (the inbox's name for `kind` `inbox`), `attempts`, first and last failure time, `reason`, `error_chain` (JSON array), `resolved_at` / `resolution` after a replay or purge, `origin` (inbox dead letters) |
/// | `event_audit_log` | operator action (replay, purge, pause, resume, handler purge / re-target, inbox adopt) | `action`, `actor`, `reason`, `at`, `dead_letter_ids` (JSON array), `count` |
/// | `event_inbox_members` | instance of a group of inboxes | `group_name`, `member`, `started_at`, `renewed_at`, `expires_at` (its lease: [`GroupMember`]) |
/// | `event_inbox_partitions` | partition a group consumed | `group_name`, `partition_no`, `owner` (`NULL`: released), `taken_at`, `expires_at` ([`PartitionLease`]) |
/// | `event_inbox_identity` | transport inbox | `inbox`, `stream`, `stream_created`, `consumer_created` (the broker's creation times: [`InboxIdentity`]) |
/// | `event_relay_chain` | (relay, aggregate) | the last sequence the relay published and the predecessor it named (`prevsequence`), `published_at` |
/// | `event_inbox_chain` | place of a received aggregate's chain | aggregate, `sequence`, `previous`, `state` (`released`, `held`, `dead`, `skipped`), `event_id` |
/// | `event_inbox_chain_aggregates` | received aggregate | locked by each commit that links its events; `last_at` (retention) |
/// | `event_catalog` | (event name, version) a service on this database knows | `rust_type`, `sensitive` (JSON array of the payload fields marked `#[event(sensitive)]`), `schema` (with `x-sensitive`), `recorded_at` ([`CatalogRecord`]) |
/// | `event_inbox_gaps` | gap (a held event whose predecessor did not come within `gap_after`) | aggregate, `missing_sequence`, the waiting event, `dead_letter_id`, `closed_at` / `resolution` (`arrived`, `accepted`), `audit_id` |
///
/// Cheap to clone (an `Arc`).
///
/// Operators' methods rest on optional capabilities of the backend ([`inspection`](Self::inspection)
/// for listing, [`dead_letter_operations`](Self::dead_letter_operations) for replay and
/// purge, [`destination_operations`](Self::destination_operations) for audited pauses,
/// re-targeting and re-publishing, [`operation_log`](Self::operation_log) for paged
/// operations, [`partition_leases`](Self::partition_leases) for instance groups). SQLite and
/// PostgreSQL offer every one; over a backend that lacks one, those methods fail with
/// [`StoreError::Unsupported`] naming it, before touching anything.
///
/// # Examples
///
/// Connecting creates the outbox tables; the application's own tables live in the same
/// database, written in the same transactions:
///
/// ```
/// use event_runtime::{SqlValue, Store};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let path = std::env::temp_dir().join(format!("store-doc-{}.db", uuid::Uuid::now_v7()));
/// # let url = format!("sqlite://{}", path.display());
/// // `sqlite://PATH`, or `postgres://USER@HOST/DB` with the feature `postgres`.
/// let store = Store::connect(&url).await?;
/// assert_eq!(store.backend_name(), "sqlite");
///
/// let mut tx = store.begin().await?;
/// tx.execute("CREATE TABLE accounts (id TEXT PRIMARY KEY, balance BIGINT NOT NULL)", &[])
///     .await?;
/// tx.execute(
///     "INSERT INTO accounts VALUES ($1, $2)",
///     &[SqlValue::Text("acc-1"), SqlValue::Int(100)],
/// )
/// .await?;
/// tx.commit().await?;
///
/// // Nothing was committed through an outbox yet.
/// assert_eq!(store.stats().await?.events, 0);
/// # drop(store); std::fs::remove_file(path).ok();
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Store {
    backend: Arc<dyn Backend>,
}

impl Store {
    /// Connects to `url` and applies the bundled migrations.
    ///
    /// - `sqlite://PATH` (created when missing; WAL journal; writes serialised with
    ///   `BEGIN IMMEDIATE` and a 30 s busy timeout), `sqlite::memory:` (one connection, gone
    ///   when the store is dropped) — feature `sqlite`, on by default;
    /// - `postgres://USER@HOST:PORT/DB` — feature `postgres`.
    ///
    /// # Errors
    /// [`StoreError::UnsupportedUrl`]; [`StoreError::Unreachable`] or
    /// [`StoreError::ConnectTimeout`] when the server cannot be reached;
    /// [`StoreError::Database`] when the database refuses the connection;
    /// [`StoreError::Migrate`] when the schema cannot be applied (a newer release migrated
    /// it, for one).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is left behind but a migration that completed.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        Self::connect_with(url, &ConnectOptions::default()).await
    }

    /// Connects to `url` with `options`; migrates unless `options.create` is false.
    ///
    /// # Errors
    /// As [`connect`](Self::connect); [`StoreError::UnsupportedOption`] for an option the
    /// backend does not have; [`StoreError::InvalidOption`] for `max_connections` 0 or a
    /// schema name PostgreSQL's `search_path` cannot hold; with `create: false`, [`StoreError::NoSuchDatabase`] and
    /// [`StoreError::NotAnOutbox`].
    ///
    /// # Cancel safety
    /// As [`connect`](Self::connect).
    pub async fn connect_with(url: &str, options: &ConnectOptions) -> Result<Store, StoreError> {
        let entry = backend_for(url)?;
        if options.max_connections == Some(0) {
            return Err(StoreError::InvalidOption {
                option: "max_connections",
                reason: "a pool needs at least one connection".into(),
            });
        }
        let backend = (entry.connect)(url, options).await?;
        let store = Store { backend };
        if options.create {
            store.migrate().await?;
        } else if !store.backend.has_outbox().await? {
            return Err(StoreError::NotAnOutbox {
                url: redact(url),
                schema: options.schema.clone(),
            });
        }
        Ok(store)
    }

    /// Opens an existing outbox for reading and operations (the `events` tool): creates no
    /// file, schema or table and applies no migration.
    ///
    /// # Errors
    /// As [`connect_with`](Self::connect_with) with `create: false`:
    /// [`StoreError::NotAnOutbox`] only when the outbox tables are missing; any other
    /// database error (a permission refused, say) as it is.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn open(url: &str, schema: Option<&str>) -> Result<Store, StoreError> {
        let mut options = ConnectOptions::default().create(false);
        options.schema = schema.map(str::to_owned);
        Self::connect_with(url, &options).await
    }

    /// Which backend `url` names, without connecting: `sqlite`, `postgres`.
    ///
    /// # Errors
    /// [`StoreError::UnsupportedUrl`] when this build has none for it.
    pub fn backend_name_for(url: &str) -> Result<&'static str, StoreError> {
        backend_for(url).map(|b| b.known.name)
    }

    /// A store over a backend of your own (see [`backend`]).
    pub fn from_backend(backend: Arc<dyn Backend>) -> Store {
        Store { backend }
    }

    /// The backend.
    pub fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// The backend's name: `sqlite`, `postgres`.
    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// Applies the bundled migrations that are not applied yet. Idempotent. On a database
    /// migrated by release 0.1.0, first moves the outbox's rows from `_sqlx_migrations` to
    /// its own table.
    ///
    /// # Errors
    /// [`StoreError::Migrate`] when a migration fails or the database holds a migration this
    /// version does not know (a newer release migrated it).
    ///
    /// # Cancel safety
    /// Cancel safe: each migration applies in its own transaction, or not at all.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.backend.migrate().await
    }

    /// Begins a write transaction.
    ///
    /// # Errors
    /// [`StoreError::Database`] when no connection can be had.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn begin(&self) -> Result<Tx, StoreError> {
        self.backend.begin().await
    }

    /// A portable statement on a pooled connection, outside any transaction (reads of a
    /// report, say, which need no write lock): bind its `$N` values with
    /// [`Query::bind`], then fetch or execute it. A write through it commits on its own. See
    /// [`Tx::query`] for the types and what is portable.
    pub fn query(&self, sql: &'static str) -> Query<'_> {
        Query::on_store(self, sql)
    }

    /// Closes every connection.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn close(&self) {
        self.backend.close().await
    }

    /// Backlog and dead letter counts.
    ///
    /// # Errors
    /// [`StoreError::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn stats(&self) -> Result<OutboxStats, StoreError> {
        self.backend.stats(now_ms()).await
    }

    /// What the workers' gauges show now: pending deliveries per destination with the age of
    /// each one's oldest (a relay's lag), open dead letters, pauses. Reads only pending
    /// deliveries and open dead letters, so it is cheap to call often, unlike
    /// [`stats`](Self::stats).
    ///
    /// # Errors
    /// [`StoreError::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn backlog(&self) -> Result<Backlog, StoreError> {
        self.backend.backlog(now_ms()).await
    }

    /// Dead letters matching `filter`, oldest first.
    ///
    /// # Errors
    /// [`StoreError::Database`], [`StoreError::Corrupt`].
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        self.inspecting()?.dead_letters(filter).await
    }

    /// The dead letter `id`, resolved or not.
    ///
    /// # Errors
    /// [`StoreError::Database`], [`StoreError::Corrupt`].
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
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
    /// aggregate flow. Returns the ids acted on (ids not open are skipped). A message that a
    /// transport's inbox could not accept ([`DeadLetter::origin`] is set) has no delivery to
    /// replay and is skipped by `Replay`: replaying it needs the application's registry to
    /// decode it, which [`Outbox::replay_inbox_dead_letters`](crate::Outbox::replay_inbox_dead_letters)
    /// has (it commits it into the outbox as if just received); `Purge` purges it.
    ///
    /// # Errors
    /// [`StoreError::Database`]; nothing is changed then.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped before its COMMIT, nothing is changed.
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
    ///
    /// # Cancel safety
    /// As [`resolve_dead_letters`](Self::resolve_dead_letters).
    pub async fn resolve_dead_letters_with_progress(
        &self,
        ids: &[i64],
        action: Resolution,
        actor: &str,
        reason: &str,
        mut progress: impl FnMut(usize) + Send,
    ) -> Result<AuditEntry, StoreError> {
        self.resolving()?
            .resolve_dead_letters(ids, action, &AuditStamp::now(actor, reason), &mut progress)
            .await
    }

    /// The audit log, newest first.
    ///
    /// # Errors
    /// [`StoreError::Database`], [`StoreError::Corrupt`].
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn audit_log(&self, limit: u32) -> Result<Vec<AuditEntry>, StoreError> {
        self.inspecting()?.audit_log(limit).await
    }

    /// Every pending delivery's destination, event id and envelope (for pre-deploy decode
    /// checks), in no particular order.
    ///
    /// # Errors
    /// [`StoreError::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn pending_envelopes(&self) -> Result<Vec<PendingEnvelope>, StoreError> {
        self.inspecting()?.pending_envelopes().await
    }

    /// Pauses the destination (handler) `destination` as an operator: no worker of any
    /// process claims its deliveries until [`resume_destination`](Self::resume_destination)
    /// (deliveries already claimed finish). No attempt is used; other destinations flow. An
    /// `in_transaction` handler has no deliveries, so pausing its name holds nothing back
    /// (the `events` tool refuses it).
    ///
    /// # Errors
    /// [`StoreError::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn pause_destination(
        &self,
        destination: &str,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.backend
            .pause(&backend::Pause {
                destination: destination.to_owned(),
                paused_by: OPERATOR.to_owned(),
                reason: reason.to_owned(),
                at: now_ms(),
                expires_at: None,
                probe_at: None,
            })
            .await
    }

    /// Lifts an operator's pause of `destination`. Returns whether it was paused by one.
    ///
    /// # Errors
    /// [`StoreError::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn resume_destination(&self, destination: &str) -> Result<bool, StoreError> {
        self.backend.resume(destination, OPERATOR).await
    }

    /// Every pause in force, by the operator or by the runtime.
    ///
    /// # Errors
    /// [`StoreError::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn paused_destinations(&self) -> Result<Vec<PausedDestination>, StoreError> {
        self.backend.paused(now_ms()).await
    }

    /// Records event types in the database's catalog (`event_catalog`), replacing what was
    /// recorded for the same (name, version): what the standalone `events` tool, which knows
    /// no types, masks by. [`Outbox::record_catalog`](crate::Outbox::record_catalog) records
    /// an outbox's registry; the workers do it when they start.
    ///
    /// # Errors
    /// [`StoreError::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: one transaction; dropped before its COMMIT, nothing is recorded.
    pub async fn record_catalog(&self, entries: &[CatalogRecord]) -> Result<(), StoreError> {
        self.backend.record_catalog(entries, now_ms()).await
    }

    /// The event types recorded in the database's catalog, by name then version; empty before
    /// any outbox recorded its own, and on a backend without the catalog.
    ///
    /// # Errors
    /// [`StoreError::Database`]; [`StoreError::Corrupt`] for a row that does not read.
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn catalog(&self) -> Result<Vec<CatalogRecord>, StoreError> {
        self.backend.catalog().await
    }
}

/// `paused_by` of an operator's pause.
pub const OPERATOR: &str = "operator";

/// `paused_by` of a circuit breaker's pause: written by a worker when a handler's transient
/// failures trip its breaker ([`CircuitBreaker`](crate::CircuitBreaker)), lifted by the probe
/// that finds it back, or by hand (`events handler resume`).
pub const BREAKER: &str = "breaker";

/// `url` with its password masked, for messages.
pub(crate) fn redact(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let end = url[start..]
        .find(['/', '?'])
        .map_or(url.len(), |i| start + i);
    let authority = &url[start..end];
    match authority.rfind('@') {
        Some(at) => match authority[..at].find(':') {
            Some(colon) => format!(
                "{}{}:***{}",
                &url[..start],
                &authority[..colon],
                &url[start + at..]
            ),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// Milliseconds since the Unix epoch, by the process's clock.
pub(crate) fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

pub(crate) fn from_ms(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/orders?sslmode=require"),
            "postgres://app:***@db:5432/orders?sslmode=require"
        );
        assert_eq!(
            redact("postgres://app@db/orders"),
            "postgres://app@db/orders"
        );
        assert_eq!(redact("sqlite://orders.db"), "sqlite://orders.db");
    }

    #[test]
    fn urls_name_their_backend() {
        assert_eq!(Store::backend_name_for("sqlite://x.db").unwrap(), "sqlite");
        assert_eq!(
            Store::backend_name_for("sqlite::memory:").unwrap(),
            "sqlite"
        );
        let e = Store::backend_name_for("mysql://u:pw@h/db").unwrap_err();
        assert!(e.to_string().contains("u:***@h"), "{e}");
    }
}

//! What the store's operations fail with ([`StoreError`]), and the database's own message
//! ([`DatabaseError`]). Types only: nothing here talks to a database.

use std::time::Duration;

use super::sql;

/// Errors of the store.
///
/// `Display` says what failed at this level; the cause, when there is one, is the error's
/// `source()` (print the chain, as `event_core::ErrorChain` does).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database URL names no backend this build has.
    #[error("unsupported database URL {url}: {hint}")]
    UnsupportedUrl {
        /// The URL, password masked.
        url: String,
        /// What would work.
        hint: String,
    },
    /// An option does not apply to this backend (`schema` on SQLite).
    #[error("the {option} option does not apply to the {backend} backend")]
    UnsupportedOption {
        /// The backend.
        backend: &'static str,
        /// The option.
        option: &'static str,
    },
    /// An option's value cannot work (a pool of no connections, a schema name PostgreSQL's
    /// `search_path` cannot hold): refused before connecting, nothing created.
    #[error("the {option} option cannot be used: {reason}")]
    InvalidOption {
        /// The option.
        option: &'static str,
        /// Why, and what would work.
        reason: String,
    },
    /// Opening an existing outbox, the database (an SQLite file) does not exist.
    #[error("database {url} does not exist")]
    NoSuchDatabase {
        /// The URL.
        url: String,
    },
    /// The database server could not be reached (refused, unknown host, TLS).
    #[error("cannot reach the database at {url}")]
    Unreachable {
        /// The URL, password masked.
        url: String,
        /// Why (the operating system's or TLS's error).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Connecting took longer than [`ConnectOptions::connect_timeout`](super::ConnectOptions::connect_timeout).
    #[error("no answer from the database at {url} within {after:?}")]
    ConnectTimeout {
        /// The URL, password masked.
        url: String,
        /// The timeout.
        after: Duration,
    },
    /// The store's backend does not offer a capability the operation needs (a backend
    /// outside this crate that implements only the core
    /// [`Backend`](super::Backend); see [`Store::inspection`](super::Store::inspection) and
    /// its siblings).
    #[error("the {backend} store does not offer {capability}, which this operation needs")]
    Unsupported {
        /// The backend's name.
        backend: &'static str,
        /// The capability, as its trait is named (`Inspection`, `DeadLetterOperations`, …).
        capability: &'static str,
    },
    /// The database refused a statement or the connection failed: the database's message is
    /// the [`DatabaseError`] (its `source()`).
    #[error("database error")]
    Database(#[from] DatabaseError),
    /// Applying the bundled migrations failed: the migrator's message (sqlx's, for the SQL
    /// backends), printed here, with the whole error in [`DatabaseError::backend_error`].
    #[error("migrating the outbox schema failed: {0}")]
    Migrate(DatabaseError),
    /// Another commit already recorded this sequence number for the aggregate (optimistic
    /// concurrency: reload the aggregate and retry the command). Names the event whose row
    /// the unique index rejected.
    #[error("concurrent modification: {aggregate_type} {aggregate_id} already has an event with sequence {sequence}")]
    Conflict {
        /// The aggregate type.
        aggregate_type: String,
        /// The aggregate id.
        aggregate_id: String,
        /// The sequence recorded twice.
        sequence: u64,
    },
    /// A sequence does not fit the stores' signed 64-bit column.
    #[error("{aggregate_type} {aggregate_id}: sequence {sequence} is above the largest the outbox stores ({max})", max = i64::MAX)]
    SequenceOutOfRange {
        /// The aggregate type.
        aggregate_type: String,
        /// The aggregate id.
        aggregate_id: String,
        /// The sequence.
        sequence: u64,
    },
    /// The database holds no outbox tables ([`Store::open`](super::Store::open) creates none).
    #[error("{url} holds no outbox tables{}: run the application (or Store::connect) once to create them, or check the URL and schema", schema.as_ref().map(|s| format!(" in schema {s:?}")).unwrap_or_default())]
    NotAnOutbox {
        /// The URL.
        url: String,
        /// The PostgreSQL schema, if one was given.
        schema: Option<String>,
    },
    /// [`Store::resume_resolution`](super::Store::resume_resolution): no replay or purge over a selection has this audit id.
    #[error("no replay or purge over a selection has audit id {audit_id} (dlq audit lists them)")]
    NoSuchResolution {
        /// The audit id asked for.
        audit_id: i64,
    },
    /// [`Store::purge_destination`](super::Store::purge_destination) or [`Store::retarget_destination`](super::Store::retarget_destination): a delivery of the
    /// destination is leased by a live worker, so a process still delivers to it; nothing was
    /// changed.
    #[error("{leased} deliveries of `{destination}` are leased by a live worker: a process still delivers to it; nothing was changed")]
    DestinationInUse {
        /// The destination.
        destination: String,
        /// Its deliveries leased under a live lease.
        leased: u64,
    },
    /// [`Store::retarget_destination`](super::Store::retarget_destination) onto the destination itself; nothing was changed.
    #[error("cannot re-target `{destination}` onto itself; nothing was changed")]
    SameDestination {
        /// The destination.
        destination: String,
    },
    /// An operation over a selection that selects nothing it may: a re-publish
    /// ([`Store::republish`](super::Store::republish)) naming neither aggregates nor a time.
    /// Nothing was changed.
    #[error("invalid selection: {0}; nothing was changed")]
    InvalidSelection(String),
    /// A savepoint name other than lower-case ASCII letters, digits and `_` (savepoint names
    /// are written into the statement, so they are checked instead of quoted). Nothing ran.
    #[error("invalid savepoint name {name:?}: a-z, 0-9 and _ only")]
    InvalidSavepointName {
        /// The name refused.
        name: String,
    },
    /// A row holds data this version cannot read (a corrupted or foreign table).
    #[error("corrupt outbox row: {0}")]
    Corrupt(String),
    /// A column of a portable query's row does not read as the Rust type asked for
    /// ([`Row::get`](super::Row::get)).
    #[error("column {column:?}: cannot read {found} as {expected}")]
    Decode {
        /// The column.
        column: String,
        /// The Rust type asked for (`i32`, `Option<String>`).
        expected: String,
        /// What the column holds instead (`NULL`, `text`, `integer 70000 (out of range)`).
        found: String,
    },
    /// A portable query's row has no such column ([`Row::get`](super::Row::get)).
    #[error("no column {column:?} in the row; its columns: {columns}")]
    NoSuchColumn {
        /// The name asked for (`#N` for an index).
        column: String,
        /// The row's columns, comma-separated.
        columns: String,
    },
    /// [`Query::fetch_one`](super::Query::fetch_one) found no row.
    #[error("the query returned no row")]
    NoRow,
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        StoreError::Database(DatabaseError::from(e))
    }
}

/// What the database said, as [`StoreError::Database`]'s source: the database's own message
/// and its error code (`relation "orders" does not exist (code 42P01)`), without sqlx's
/// `error returned from database: ` prefix and without the `at line N` that sqlx appends to a
/// PostgreSQL error, which is the line of the *server's* C source that raised it (its
/// `pg_*.c` file), not a line of the SQL, and only misleads. The backend's whole error (for
/// the SQL backends a `sqlx::Error`, with the server's file, line and routine) is
/// [`backend_error`](Self::backend_error) (and `Debug`).
///
/// Names no database: a backend outside this crate makes one with [`new`](Self::new).
#[derive(Debug)]
pub struct DatabaseError {
    message: String,
    code: Option<String>,
    error: Box<dyn std::error::Error + Send + Sync>,
}

impl DatabaseError {
    /// What a backend's driver said: `message` as printed (the database's own words),
    /// `code` the database's error code if it gave one, `error` the driver's whole error.
    pub fn new(
        message: impl Into<String>,
        code: Option<String>,
        error: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        DatabaseError {
            message: message.into(),
            code,
            error: error.into(),
        }
    }

    /// The backend's whole error: a `sqlx::Error` from the SQLite and PostgreSQL backends
    /// (`err.backend_error().downcast_ref::<sqlx::Error>()`).
    pub fn backend_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.error
    }

    /// The backend's whole error, owned.
    pub fn into_backend_error(self) -> Box<dyn std::error::Error + Send + Sync> {
        self.error
    }

    /// The database's error code when the database refused something (a SQLSTATE on
    /// PostgreSQL, SQLite's extended result code).
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }
}

impl From<sqlx::Error> for DatabaseError {
    fn from(e: sqlx::Error) -> Self {
        let (message, code) = match e.as_database_error() {
            Some(db) => (db.message().to_owned(), db.code().map(|c| c.into_owned())),
            None => (sql::sqlx_message(&e), None),
        };
        DatabaseError::new(message, code, e)
    }
}

impl From<sqlx::migrate::MigrateError> for DatabaseError {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        DatabaseError::new(sql::migrate_message(&e), None, e)
    }
}

impl std::fmt::Display for DatabaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        match &self.code {
            Some(code) => write!(f, " (code {code})"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for DatabaseError {
    /// None: `Display` says it whole. sqlx prints the cause of its other errors (an I/O or TLS
    /// error) inside its own message too, so a source would print it twice.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        None
    }
}

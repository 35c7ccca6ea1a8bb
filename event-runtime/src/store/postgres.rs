//! The PostgreSQL backend (feature `postgres`): the production store, shared safely by many
//! worker processes. Owns its connection options and schemas, its migrations
//! (`migrations/postgres`) and what PostgreSQL does its own way; the statements it shares with
//! other SQL databases live in `store::sql`.
//!
//! - Transactions are READ COMMITTED. Claims lock run heads with `FOR UPDATE SKIP LOCKED`, so
//!   workers never wait for each other's claims; a commit and a settlement that race on one
//!   run both promote its head again after COMMIT, so that neither can leave it unready.
//! - A handler's time limit is also enforced in the server with `SET LOCAL
//!   statement_timeout` (SQLSTATE `57014` when it fires).
//! - A deadlock (`40P01`) or serialization failure (`40001`) rolls the whole batch back.
//! - One purger at a time: `pg_try_advisory_xact_lock`.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::PgRow;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, Pool, Postgres, Row as _, TypeInfo as _, ValueRef as _};

use super::backend::{Backend, ClaimRequest, ClaimedDelivery};
use super::sql::claim::{claimed_from_row, heads_sql, in_run_order, CLAIMED_COLUMNS};
use super::sql::exec::{Arg, SqlExec as _, SqlxQuery};
use super::sql::{db, rows, Conn, Dialect, SqlStore, MIGRATIONS_TABLE};
use super::value::{Datum, SqlType};
use super::{redact, BackendEntry, ConnectOptions, Store, StoreError};

/// The URL schemes of this backend: `postgres://USER@HOST:PORT/DB`, `postgresql://…`.
pub const URL_SCHEMES: &[&str] = super::POSTGRES.url_schemes;

pub(crate) const ENTRY: BackendEntry = BackendEntry {
    known: &super::POSTGRES,
    connect: |url, options| Box::pin(connect(url.to_owned(), options.clone())),
};

/// The PostgreSQL dialect.
#[derive(Debug)]
pub(crate) struct PostgresDialect;

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Refuses a schema name `search_path` cannot hold, before anything is created: an empty one,
/// one longer than PostgreSQL keeps (63 bytes, `NAMEDATALEN` − 1: a longer one is cut,
/// silently naming another schema), one with a double quote, a comma or a control character
/// (`search_path` is a list of names).
fn check_schema(schema: &str) -> Result<(), StoreError> {
    let why = if schema.is_empty() {
        "a schema name cannot be empty"
    } else if schema.len() > 63 {
        "PostgreSQL keeps 63 bytes of a name; this one is longer"
    } else if schema
        .chars()
        .any(|c| c == '"' || c == ',' || c.is_control())
    {
        "a schema name in search_path cannot hold a double quote, a comma or a control character"
    } else {
        return Ok(());
    };
    Err(StoreError::InvalidOption {
        option: "schema",
        reason: format!("{why} ({schema:?})"),
    })
}

async fn connect(url: String, options: ConnectOptions) -> Result<Arc<dyn Backend>, StoreError> {
    if let Some(schema) = &options.schema {
        check_schema(schema)?;
    }
    let mut connect = PgConnectOptions::from_str(&url).map_err(db)?;
    // sqlx's own message repeats its cause: keep the cause alone.
    let unreachable = |e: sqlx::Error| StoreError::Unreachable {
        url: redact(&url),
        source: match e {
            sqlx::Error::Io(io) => Box::new(io),
            sqlx::Error::Tls(tls) => tls,
            other => Box::new(other),
        },
    };
    // One plain connection first: a refused or unknown host fails now, with its cause, rather
    // than after the pool's acquire timeout of retrying in silence.
    let probe = tokio::time::timeout(options.connect_timeout, async {
        let mut conn = sqlx::PgConnection::connect_with(&connect).await?;
        if let (Some(schema), true) = (options.schema.as_deref(), options.create) {
            // `CREATE SCHEMA IF NOT EXISTS` run by two sessions at once can fail on the
            // catalog's unique index (`pg_namespace_nspname_index`): one creator at a time.
            let mut tx = sqlx::Connection::begin(&mut conn).await?;
            sqlx::query("SELECT pg_advisory_xact_lock(72430123, hashtext($1))")
                .bind(schema)
                .execute(&mut *tx)
                .await?;
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "CREATE SCHEMA IF NOT EXISTS {}",
                quote_ident(schema)
            )))
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
        }
        conn.close().await
    })
    .await;
    match probe {
        Ok(Ok(())) => {}
        Ok(Err(e @ (sqlx::Error::Io(_) | sqlx::Error::Tls(_)))) => return Err(unreachable(e)),
        Ok(Err(e)) => return Err(db(e)),
        Err(_) => {
            return Err(StoreError::ConnectTimeout {
                url: redact(&url),
                after: options.connect_timeout,
            })
        }
    }
    if let Some(schema) = &options.schema {
        connect = connect.options([("search_path", schema.as_str())]);
    }
    let pool = PgPoolOptions::new()
        .max_connections(options.max_connections.unwrap_or(8))
        .acquire_timeout(options.connect_timeout.max(Duration::from_secs(30)))
        .connect_with(connect)
        .await
        .map_err(db)?;
    Ok(Arc::new(SqlStore::<PostgresDialect>::new(pool)))
}

/// A [`Store`] over a PostgreSQL pool you configured yourself (its size, timeouts, TLS): no
/// migration is applied, call [`Store::migrate`] before the first outbox.
pub fn store_from_pool(pool: sqlx::PgPool) -> Store {
    SqlStore::<PostgresDialect>::store(pool)
}

/// The PostgreSQL pool under `store`; `None` when the store is another backend. For queries
/// of the application's own that need sqlx (`sqlx::query(..).fetch_all(pool)`).
pub fn pool(store: &Store) -> Option<&sqlx::PgPool> {
    SqlStore::<PostgresDialect>::pool_of(store)
}

/// The PostgreSQL connection of the transaction `tx` (`None` on another backend): for SQL the
/// portable [`Tx::execute`](crate::Tx::execute) cannot express, written in the same
/// transaction as the events. The same as `tx.native::<sqlx::PgConnection>()`.
pub fn connection(tx: &mut crate::Tx) -> Option<&mut sqlx::PgConnection> {
    tx.native::<sqlx::PgConnection>()
}

/// Connects to a PostgreSQL database keeping every table in `schema` (created when missing),
/// then migrates: [`Store::connect_with`] with [`ConnectOptions::schema`], so that several
/// services or tests share one database.
///
/// # Errors
/// As [`Store::connect`].
///
/// # Cancel safety
/// As [`Store::connect`].
pub async fn connect_in_schema(url: &str, schema: &str) -> Result<Store, StoreError> {
    Store::connect_with(url, &ConnectOptions::default().schema(schema)).await
}

impl Dialect for PostgresDialect {
    type DB = Postgres;
    const NAME: &'static str = "postgres";
    const RELAXED_COMMIT: Option<&'static str> = Some("SET LOCAL synchronous_commit = off");
    const SINGLE_WRITER: bool = false;
    const PROMOTE_AFTER_COMMIT: bool = true;

    fn rows_affected(result: &sqlx::postgres::PgQueryResult) -> u64 {
        result.rows_affected()
    }

    async fn begin(
        pool: &Pool<Postgres>,
    ) -> Result<sqlx::Transaction<'static, Postgres>, sqlx::Error> {
        pool.begin().await
    }

    fn migrator() -> Migrator {
        let mut m = sqlx::migrate!("migrations/postgres");
        m.dangerous_set_table_name(MIGRATIONS_TABLE);
        m
    }

    // `_sqlx_migrations` of the schema the connections see first (search_path).
    const OLD_MIGRATIONS_TABLE: &'static str = "SELECT 1 AS present FROM pg_catalog.pg_class c \
        JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
        WHERE c.relname = '_sqlx_migrations' AND n.nspname = current_schema()";

    const MIGRATIONS_COLUMNS: &'static str =
        "(version BIGINT PRIMARY KEY, description TEXT NOT NULL, \
         installed_on TIMESTAMPTZ NOT NULL DEFAULT now(), success BOOLEAN NOT NULL, \
         checksum BYTEA NOT NULL, execution_time BIGINT NOT NULL)";

    async fn migrate(pool: &Pool<Postgres>) -> Result<(), StoreError> {
        let mut conn = pool.acquire().await.map_err(db)?;
        // One process migrates a schema at a time. sqlx's own lock waits inside the server,
        // and a waiting session is a transaction that `CREATE INDEX CONCURRENTLY` (a later
        // migration) would wait for in turn: a deadlock. So the lock is only ever tried, with
        // the wait between tries spent outside any statement.
        let started = std::time::Instant::now();
        loop {
            let got: bool = sqlx::query_scalar(
                "SELECT pg_try_advisory_lock(72430122, hashtext(current_schema()))",
            )
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?;
            if got {
                break;
            }
            if started.elapsed() > Duration::from_secs(600) {
                return Err(StoreError::Corrupt(
                    "another process has held the outbox migration lock for 10 minutes".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut migrator = Self::migrator();
        migrator.set_locking(false);
        let versions: Vec<i64> = migrator.iter().map(|m| m.version).collect();
        let result = async {
            adopt_migrations(&mut conn, &versions).await?;
            // `run` with a connection trips rustc's higher-ranked `Send` inference inside an
            // async trait method; `run_direct` is sqlx's own way around it (sqlx is pinned).
            migrator.run_direct(None, &mut *conn, false).await?;
            Ok(())
        }
        .await;
        let _ = sqlx::query("SELECT pg_advisory_unlock(72430122, hashtext(current_schema()))")
            .execute(&mut *conn)
            .await;
        result
    }

    // Column types are enforced: what is left is an event id the engine did not write.
    const UNREADABLE_DELIVERY: &'static str =
        "d.event_id !~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'";

    const HEADS_TABLE: &'static str = "event_deliveries d";

    fn json_text_array(param: &str) -> String {
        format!("(SELECT jsonb_array_elements_text({param}::jsonb))")
    }

    fn text_in(column: &str, param: &str) -> String {
        // An array built once (an InitPlan) and compared with `= ANY`: an index lookup per
        // element, or one hashed pass over the rows; never a join the planner could re-run
        // per row on a misestimate (seen: a lease token estimated at one row turned a
        // 200-row completion into a million comparisons).
        format!("{column} = ANY(ARRAY(SELECT jsonb_array_elements_text({param}::jsonb)))")
    }

    async fn claim(
        pool: &Pool<Postgres>,
        req: &ClaimRequest<'_>,
    ) -> Result<Vec<ClaimedDelivery>, StoreError> {
        // A claim given up whole (the race below) is made again at once with a new snapshot,
        // a few times: the work it found is still there for it or for the other worker.
        for _ in 0..3 {
            // Heads are locked with SKIP LOCKED (another worker's claim in progress is passed
            // over, never waited for), then each is extended into its run through the
            // (handler, aggregate, sequence) index: the cost follows what is claimed, not the
            // backlog behind it. Runs share `max_deliveries` evenly.
            let sql = format!(
                "WITH heads AS ({heads}), \
                 quota AS (SELECT GREATEST(1, $4 / GREATEST(COUNT(*), 1)) AS n FROM heads), \
                 runs AS ( \
                     SELECT r.handler, r.event_id, h.event_id AS head_id, h.prior_token FROM heads h CROSS JOIN LATERAL ( \
                         SELECT x.handler, x.event_id FROM event_deliveries x \
                         WHERE h.sequence > 0 AND x.handler = h.handler AND x.aggregate_type = h.aggregate_type \
                           AND x.aggregate_id = h.aggregate_id AND x.status = 'pending' AND x.sequence >= h.sequence \
                           AND x.sequence < COALESCE(h.held_at, 9223372036854775807) \
                         ORDER BY x.sequence LIMIT (SELECT n FROM quota)) r \
                     UNION ALL SELECT h.handler, h.event_id, h.event_id, h.prior_token FROM heads h WHERE h.sequence = 0) \
                 UPDATE event_deliveries d SET lease_token = $5, \
                     attempts = CASE WHEN d.lease_token IS NOT NULL AND d.event_id = runs.head_id THEN d.attempts + 1 ELSE d.attempts END \
                 FROM runs, event_outbox o \
                 WHERE d.handler = runs.handler AND d.event_id = runs.event_id AND o.event_id = d.event_id \
                 RETURNING {CLAIMED_COLUMNS}, runs.prior_token",
                heads = heads_sql(
                    Self::HEADS_TABLE,
                    &Self::json_text_array("$2"),
                    "FOR UPDATE OF d SKIP LOCKED"
                ),
            );
            let destinations =
                serde_json::to_string(req.destinations).unwrap_or_else(|_| "[]".into());
            // Losing a claim in a server crash is harmless (its lease token is never settled
            // against), so it need not wait for the WAL flush.
            let mut tx = super::sql::begin_relaxed::<Self>(pool).await?;
            let found = rows::<Self>(
                &mut tx,
                &sql,
                &[
                    Arg::I64(req.now),
                    Arg::Str(&destinations),
                    Arg::I64(req.max_runs.max(1) as i64),
                    Arg::I64(req.max_deliveries.max(1) as i64),
                    Arg::Str(req.token),
                ],
            )
            .await?;
            if found.is_empty() {
                // Nothing claimed: nothing written, no lease row.
                return Ok(Vec::new());
            }
            // A head another worker claimed after this statement's snapshot was taken, and
            // committed before this one reached it, is locked in its new version and passes the
            // recheck of its own columns (PostgreSQL re-evaluates a locked row's conditions on its
            // latest version, READ COMMITTED), but the lease subquery still reads the snapshot,
            // where that worker's lease row does not exist yet: the claim would take a live lease
            // over. This statement runs with a new snapshot: if a lease this claim replaced is live
            // after all, the claim is given up whole (it is rare and the next claim finds other
            // work); nothing was written.
            let mut prior = Vec::new();
            for r in &found {
                let token = Postgres::get_opt_string(r, "prior_token").map_err(db)?;
                prior.extend(token.filter(|t| t != req.token));
            }
            prior.sort_unstable();
            prior.dedup();
            if !prior.is_empty() {
                let list = serde_json::to_string(&prior).unwrap_or_else(|_| "[]".into());
                let live = rows::<Self>(
                    &mut tx,
                    &format!(
                        "SELECT COUNT(*) AS n FROM event_leases WHERE expires_at >= $1 AND {}",
                        Self::text_in("token", "$2")
                    ),
                    &[Arg::I64(req.now), Arg::Str(&list)],
                )
                .await?;
                let n = live
                    .first()
                    .map(|r| Postgres::get_i64(r, "n"))
                    .transpose()
                    .map_err(db)?
                    .unwrap_or(0);
                if n > 0 {
                    tx.rollback().await.map_err(db)?;
                    tracing::debug!(
                        taken = n,
                        "claim raced another worker's commit; given up whole, claiming again"
                    );
                    continue;
                }
            }
            super::sql::delivery::upsert_lease::<Self>(&mut tx, req).await?;
            let claimed = found
                .iter()
                .map(claimed_from_row::<Self>)
                .collect::<Result<Vec<_>, _>>()?;
            tx.commit().await.map_err(db)?;
            return Ok(in_run_order(claimed));
        }
        Ok(Vec::new())
    }

    type TimeLimit = Option<Duration>;

    async fn set_time_limit(
        conn: &mut Conn<Self>,
        state: &mut Self::TimeLimit,
        limit: Option<Duration>,
    ) -> Result<bool, sqlx::Error> {
        // `statement_timeout` limits each statement on its own; the transaction's own
        // statements are short, so a limit may stay in force: set it only when it changes
        // (once per batch, not twice per delivery).
        if limit.is_none() || limit == *state {
            return Ok(true);
        }
        *state = limit;
        let ms = limit.map_or(0, |l| l.as_millis().clamp(1, i32::MAX as u128) as i64);
        // SET does not take parameters; the value is a number formatted here.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SET LOCAL statement_timeout = {ms}"
        )))
        .execute(conn)
        .await?;
        Ok(true)
    }

    async fn why_no_outbox(pool: &Pool<Postgres>) -> Result<(), sqlx::Error> {
        // Name the schema: an unqualified name skips a schema without USAGE, a qualified one
        // raises "permission denied for schema" (42501); a schema that does not exist or
        // holds no outbox is what the caller reports.
        let path: String = sqlx::query_scalar("SELECT current_setting('search_path')")
            .fetch_one(pool)
            .await?;
        let Some(first) = path.split(',').map(str::trim).find(|s| !s.is_empty()) else {
            return Ok(());
        };
        let schema = first.trim_matches('"').replace('"', "\"\"");
        if schema == "$user" {
            return Ok(());
        }
        let probe = format!("SELECT 1 FROM \"{schema}\".event_outbox LIMIT 0");
        match sqlx::raw_sql(sqlx::AssertSqlSafe(probe))
            .execute(pool)
            .await
        {
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42501") => {
                Err(sqlx::Error::Database(e))
            }
            _ => Ok(()),
        }
    }

    async fn lock_purger(conn: &mut Conn<Self>) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(7243012201)")
            .fetch_one(conn)
            .await
    }

    async fn refresh_statistics(pool: &Pool<Postgres>) -> Result<(), sqlx::Error> {
        // The claim only stops early (index scan in next_attempt_at order) when the planner
        // knows how many rows are due: a backlog that grew within seconds needs fresh
        // statistics. Only then, though, and only of what the claim filters and orders by,
        // from a small sample (3,000 rows: the proportions of pending, ready and due rows are
        // all the plan needs): a full ANALYZE of a 100,000-row table took 430 ms here, this
        // one 37 ms. It runs when the rows changed since the last one exceed a tenth of the
        // table (autovacuum's default threshold too, but autovacuum looks once a minute).
        const STALE: &str = "SELECT COALESCE((SELECT n_mod_since_analyze > 1000 + n_live_tup / 10 \
             FROM pg_stat_user_tables WHERE relid = to_regclass('event_deliveries')), TRUE)";
        let stale: bool = sqlx::query_scalar(STALE).fetch_one(pool).await?;
        if stale {
            let mut tx = pool.begin().await?;
            sqlx::query("SET LOCAL default_statistics_target = 10")
                .execute(&mut *tx)
                .await?;
            sqlx::query("ANALYZE event_deliveries (status, ready, next_attempt_at, handler)")
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
        }
        Ok(())
    }

    fn is_conflict(error: &dyn sqlx::error::DatabaseError) -> bool {
        matches!(error.code().as_deref(), Some("40P01" | "40001"))
    }

    fn bind<'q>(q: SqlxQuery<'q, Postgres>, value: &Datum) -> SqlxQuery<'q, Postgres> {
        match value {
            Datum::Null(t) => match t {
                SqlType::Int => q.bind(None::<i64>),
                SqlType::Float => q.bind(None::<f64>),
                SqlType::Bool => q.bind(None::<bool>),
                SqlType::Bytes => q.bind(None::<Vec<u8>>),
                SqlType::Uuid => q.bind(None::<uuid::Uuid>),
                SqlType::Timestamp => q.bind(None::<chrono::DateTime<chrono::Utc>>),
                #[cfg(feature = "decimal")]
                SqlType::Decimal => q.bind(None::<rust_decimal::Decimal>),
                _ => q.bind(None::<String>),
            },
            Datum::Int(v) => q.bind(*v),
            Datum::Float(v) => q.bind(*v),
            Datum::Bool(v) => q.bind(*v),
            Datum::Text(v) => q.bind(v.as_str()),
            Datum::Bytes(v) => q.bind(v.as_slice()),
            Datum::Uuid(v) => q.bind(*v),
            Datum::Timestamp(v) => q.bind(*v),
            #[cfg(feature = "decimal")]
            Datum::Decimal(v) => q.bind(*v),
            Datum::Unsupported(t) => q.bind(t.as_str()),
        }
    }

    fn datum(row: &PgRow, index: usize) -> Datum {
        let Ok(value) = row.try_get_raw(index) else {
            return Datum::Unsupported("unknown".into());
        };
        if value.is_null() {
            return Datum::Null(SqlType::Text);
        }
        let name = value.type_info().name().to_owned();
        let read = match name.as_str() {
            "INT8" => row.try_get(index).map(Datum::Int),
            "INT4" => row.try_get(index).map(|v: i32| Datum::Int(v.into())),
            "INT2" => row.try_get(index).map(|v: i16| Datum::Int(v.into())),
            "FLOAT8" => row.try_get(index).map(Datum::Float),
            "FLOAT4" => row.try_get(index).map(|v: f32| Datum::Float(v.into())),
            "BOOL" => row.try_get(index).map(Datum::Bool),
            "TEXT" | "VARCHAR" | "BPCHAR" | "NAME" => row.try_get(index).map(Datum::Text),
            "BYTEA" => row.try_get(index).map(Datum::Bytes),
            "UUID" => row.try_get(index).map(Datum::Uuid),
            "TIMESTAMPTZ" => row.try_get(index).map(Datum::Timestamp),
            // A time without zone is read as UTC, which is what the portable API writes.
            "TIMESTAMP" => row
                .try_get(index)
                .map(|t: chrono::NaiveDateTime| Datum::Timestamp(t.and_utc())),
            #[cfg(feature = "decimal")]
            "NUMERIC" => row.try_get(index).map(Datum::Decimal),
            #[cfg(not(feature = "decimal"))]
            "NUMERIC" => {
                return Datum::Unsupported(
                    "NUMERIC (enable event-runtime's feature `decimal`, or CAST it to BIGINT)"
                        .into(),
                )
            }
            _ => return Datum::Unsupported(format!("{name} (not a portable type)")),
        };
        read.unwrap_or(Datum::Unsupported(name))
    }

    #[cfg(feature = "fault-injection")]
    async fn kill(conn: &mut Conn<Self>) {
        let _ = sqlx::query("SELECT pg_terminate_backend(pg_backend_pid())")
            .execute(conn)
            .await;
    }
}

async fn adopt_migrations(
    conn: &mut sqlx::PgConnection,
    versions: &[i64],
) -> Result<(), StoreError> {
    let mut tx = conn.begin().await.map_err(db)?;
    super::sql::maintenance::adopt_migrations::<PostgresDialect>(&mut tx, versions).await?;
    tx.commit().await.map_err(db)
}

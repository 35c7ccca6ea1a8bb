//! The `orders` example: imports the Superstore orders data set into a database through the
//! `Order` aggregate and a transactional outbox, delivers the events to durable handlers,
//! and reports what their projections hold.
//!
//! ```text
//! CSV row ─► outbox.begin() ─► row already imported? skip (by row id)
//!                            ─► load Order (state + version) ─► add_line ─► recorder
//!                            ─► save state + imported row ─► add events ─► commit:
//!                                 ├─ in the transaction: directory, revenue by region
//!                                 └─ one delivery row per after-commit handler
//! after the last row: Order::ship for every placed order not shipped yet, one unit of work each
//!   (`--batch N` puts N commands, rows or shipments, in one unit of work)
//! delivery (a task beside the import, then drain): customer stats, ERP export, lead time,
//!   confirmation — each handler's write commits with its delivery's completion;
//!   transient failures (--flaky-rate) are retried, the ERP's refusals are dead-lettered
//! every Nth envelope: appended again (same event id) in a later unit of work, as a retried
//!   command or a redelivered message would be; the outbox skips it as a duplicate
//! ```
//!
//! The database (`--database`, default `sqlite://orders.db`) is the state: running again on
//! it skips the rows it already holds, finishes any delivery a crash left undone
//! (`--crash-after`), and reports the same totals.
//!
//! # Event versions
//!
//! `order.placed` has two versions ([`domain`]): earlier releases recorded version 1
//! ([`domain::OrderPlaced`]); the aggregate now records version 2 ([`domain::OrderPlacedV2`]),
//! which adds the `currency` of the order's country and declares an upcast from version 1.
//! Every `order.placed` handler takes version 2, and the runtime upcasts the version-1
//! envelopes a database already holds (committed events, pending deliveries, dead letters)
//! before calling them, so a database written by an earlier release goes on being imported
//! into and delivered from (`examples/tests/upcasting.rs`). The report's revenue by currency
//! comes from `orders.order_summary`, which reads the currency of version 2.
//!
//! # Schema catalog
//!
//! Every event type derives `schemars::JsonSchema`, so the registry's catalog has the JSON
//! Schema of each (name, version): `cargo run --example orders -- events catalog [--json]`
//! prints it. Its snapshot is committed at `examples/events.catalog.json`, and
//! `examples/tests/catalog.rs` checks the current catalog against it (BACKWARD compatibility,
//! the Confluent Schema Registry rules): a required field added to an existing version, a
//! type changed or a version removed fails `cargo test`, naming the event, the field and the
//! rule, and so does a snapshot that is merely out of date. To record a change on purpose,
//! rewrite the snapshot, review the diff and commit it with the change:
//!
//! ```text
//! EVENTS_CATALOG=bless cargo test -p examples --test catalog
//! git diff examples/events.catalog.json
//! ```
//!
//! An incompatible change to an event is made as a new version with an upcaster instead, as
//! `order.placed` version 2 was.
//!
//! [`run`] does the work and returns a [`Report`]; the `orders` example binary prints it with
//! [`report::render`] and ends with the [`Summary`] line. `orders events …` is the runtime's
//! operations tool, embedded ([`cli_app`]).

pub mod csv_input;
pub mod domain;
pub mod handlers;
pub mod persistence;
pub mod progress;
pub mod read_model;
pub mod report;
pub mod sql;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use event_core::{AnyEnvelope, DecodeError, DeliveryMode, RawEnvelope};
use event_runtime::cli::App;
use event_runtime::topology::Topology;
use event_runtime::transport::nats::RelayConfig;
use event_runtime::{
    BatchReport, Outbox, OutboxConfig, OutboxError, OutboxUnitOfWork, Registry, RegistryError,
    RetryPolicy, Store, StoreError,
};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use self::csv_input::{InputError, OrderRow};
use self::domain::{AddLine, Order, OrderError, PlaceOrder};
use self::handlers::{Flaky, ERP_EXPORT, HANDLER_COUNT};
use self::persistence::StoredOrder;
use self::read_model::{
    CurrencySales, Customer, LeadTimes, ReadModel, Rejection, Revenue, Segment,
};

/// The database used when `--database` is not given: a file in the working directory.
pub const DEFAULT_DATABASE: &str = "sqlite://orders.db";

/// The seed of `--flaky-rate` failures when `--seed` is not given.
pub const DEFAULT_SEED: u64 = 20_190_103;

/// Commands per unit of work when `--batch` is not given: one, the textbook rule.
pub const DEFAULT_BATCH: usize = 1;

/// The bundled data set, resolved at compile time so the example runs from any directory.
pub fn default_input() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/superstore-orders.csv"
    ))
}

/// Command-line arguments of the `orders` example.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "orders",
    about = "Imports retail orders into a database through an Order aggregate and a transactional outbox, delivers the events to durable handlers (retries, dead letters), and reports the projections.",
    after_help = "Operations on the same database (dead letters, backlog): orders events --help"
)]
pub struct Args {
    /// The orders CSV (Superstore layout: UTF-8, a header line, dates as dd/mm/yy).
    #[arg(long, value_name = "PATH", default_value_os_t = default_input())]
    pub input: PathBuf,
    /// The database: sqlite://PATH (created when missing) or postgres://USER@HOST/DB. Running
    /// again on the same database skips the rows it already holds.
    #[arg(long, value_name = "URL", default_value = DEFAULT_DATABASE)]
    pub database: String,
    /// PostgreSQL only: keep every table in this schema (created when missing).
    #[arg(long, value_name = "NAME")]
    pub schema: Option<String>,
    /// Append every Nth envelope a second time (same event id) in a later unit of work, as a
    /// retried command or a redelivered message would; 0 turns it off.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub redeliver_every: u64,
    /// Fraction of after-commit handler attempts that fail transiently (0 to 1).
    #[arg(long, value_name = "P", default_value_t = 0.05)]
    pub flaky_rate: f64,
    /// Seed of the --flaky-rate failures.
    #[arg(long, value_name = "S", default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Abort the process (as a crash would) once this many deliveries have completed, at the
    /// end of the delivery batch that reaches the count (so a few more may have completed);
    /// run again on the same database to finish.
    #[arg(long, value_name = "N")]
    pub crash_after: Option<u64>,
    /// Commands per unit of work (rows while importing, orders while shipping). Each stays
    /// one command, applied once (a row is recognised by its row id); more per commit make
    /// fewer, larger transactions, which PostgreSQL (one flush per commit) runs much faster.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_BATCH)]
    pub batch: usize,
    /// Customers listed in the top-customers table.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
    /// Also publish every event to a broker, through the relay: NATS JetStream
    /// (`nats://127.0.0.1:4222`, or a cluster's servers comma-separated) or RabbitMQ
    /// (`amqp://guest:guest@127.0.0.1:5672/%2f`). The `billing` example consumes them.
    /// `--nats URL` is the same option.
    #[arg(long = "broker", visible_alias = "nats", value_name = "URL")]
    pub broker: Option<String>,
    /// The JetStream stream (created when missing, on `<subject prefix>.>`), or on RabbitMQ the
    /// exchange (declared when missing: a durable topic exchange).
    #[arg(long, value_name = "NAME", default_value = DEFAULT_STREAM)]
    pub stream: String,
    /// The first subject token(s) of the published events: `order.placed` goes to
    /// `<prefix>.order.placed`. Two streams on one server cannot capture the same subjects,
    /// so a second pair of services on the same server takes another prefix.
    #[arg(long, value_name = "PREFIX", default_value = DEFAULT_SUBJECT_PREFIX)]
    pub subject_prefix: String,
    /// Copies of the stream when `orders` creates it: 3 on a three-server cluster (`--nats`
    /// then lists the servers, comma-separated), so that it survives one server's loss. An
    /// existing stream with fewer is refused (the stream is not changed).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub stream_replicas: usize,
    /// Partitions of the stream: each order's events go to its partition (a token after the
    /// subject's first one), so that several `billing` instances (`--partitions` too) share
    /// them. The stream must have this count (created with it when missing).
    #[arg(long, value_name = "P", default_value_t = 1)]
    pub partitions: u32,
    /// Serve the metrics (Prometheus text format) at `http://HOST:PORT/metrics` while it
    /// runs: the outbox's backlog and oldest pending age, retries, dead letters, each
    /// destination's lag (the relay's too), delivery durations.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
}

/// The subject prefix used when `--subject-prefix` is not given.
pub const DEFAULT_SUBJECT_PREFIX: &str = "events";

/// The stream used when `--stream` is not given.
pub const DEFAULT_STREAM: &str = "EVENTS";

impl Default for Args {
    fn default() -> Self {
        Args {
            input: default_input(),
            database: DEFAULT_DATABASE.to_owned(),
            schema: None,
            redeliver_every: 10,
            flaky_rate: 0.05,
            seed: DEFAULT_SEED,
            crash_after: None,
            batch: DEFAULT_BATCH,
            top: 10,
            broker: None,
            stream: DEFAULT_STREAM.to_owned(),
            subject_prefix: DEFAULT_SUBJECT_PREFIX.to_owned(),
            stream_replicas: 1,
            partitions: 1,
            metrics_addr: None,
        }
    }
}

/// Why a run stopped. Each message is complete on its own (it names the file and line where
/// there is one).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The input could not be read.
    #[error(transparent)]
    Input(#[from] InputError),
    /// An option is out of range.
    #[error("{0}")]
    Usage(String),
    /// The database could not be opened or migrated.
    #[error("cannot open database {url}")]
    Open {
        /// The URL, password masked.
        url: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// The outbox refused its configuration or its handlers at start-up.
    #[error("cannot start the outbox")]
    Start(#[source] OutboxError),
    /// A command's unit of work failed (an in-transaction handler refused an event, or the
    /// database failed): nothing of it was written.
    #[error("{}:{line}: the command's unit of work failed", path.display())]
    Commit {
        /// The input file.
        path: PathBuf,
        /// The line of the row whose command failed.
        line: u64,
        /// What failed.
        #[source]
        source: Box<OutboxError>,
    },
    /// An order could not ship with the ship date and mode of its first row.
    #[error("{}:{line}: the order cannot ship", path.display())]
    Ship {
        /// The input file.
        path: PathBuf,
        /// The line of the order's first row.
        line: u64,
        /// The aggregate's refusal.
        #[source]
        source: Box<OrderError>,
    },
    /// Another process changed an order while this one imported a row of it.
    #[error("{}:{line}: order {order_id} was changed by another process meanwhile; run again", path.display())]
    Conflict {
        /// The input file.
        path: PathBuf,
        /// The line of the row.
        line: u64,
        /// The order.
        order_id: String,
    },
    /// An envelope could not be encoded for redelivery.
    #[error("cannot encode event `{event}` for redelivery")]
    Encode {
        /// The event name.
        event: &'static str,
        /// serde's error.
        #[source]
        source: serde_json::Error,
    },
    /// An envelope kept for redelivery could not be decoded again.
    #[error("cannot decode an envelope for redelivery")]
    Redeliver(#[from] DecodeError),
    /// Delivering the events failed (the database failed; what was committed stays, and the
    /// next run delivers it).
    #[error("delivery failed")]
    Deliver(#[source] OutboxError),
    /// Reading the totals back failed.
    #[error("cannot read the projections")]
    Read(#[source] StoreError),
    /// NATS JetStream could not be reached, or its stream refused the relay's checks.
    #[error("NATS JetStream cannot be reached, or refused the stream or the relay")]
    Nats(#[source] event_runtime::transport::nats::NatsError),
    /// RabbitMQ could not be reached, or refused the exchange.
    #[error("RabbitMQ cannot be reached, or refused the exchange")]
    Rabbitmq(#[source] Box<event_runtime::transport::rabbitmq::AmqpError>),
}

/// Connects to NATS at `url` (one server, or a cluster's servers comma-separated) and
/// creates (or checks) the stream `stream` on `<subject_prefix>.>` with `replicas` copies and
/// `partitions` partitions.
///
/// # Errors
/// [`RunError::Nats`]: the server is unreachable, or refuses the stream (a stream of that name
/// with another shape, or another stream that already captures those subjects).
pub async fn connect_nats(
    url: &str,
    stream: &str,
    subject_prefix: &str,
    replicas: usize,
    partitions: u32,
) -> Result<async_nats::Client, RunError> {
    use event_runtime::transport::nats::StreamSpec;
    let client = event_runtime::transport::nats::connect(url, "orders")
        .await
        .map_err(RunError::Nats)?;
    let js = async_nats::jetstream::new(client.clone());
    StreamSpec::new(stream)
        .subjects([format!("{subject_prefix}.>")])
        .replicas(replicas)
        .partitions(partitions)
        .create(&js)
        .await
        .map_err(RunError::Nats)?;
    Ok(client)
}

/// The last line of the output, `summary: {…}`: the totals a test or a script checks.
///
/// Every total is read from the database (the projections the handlers wrote, the outbox and
/// delivery tables), so it is the same after a crash and a restart, and on a rerun. Only
/// `rows_already_imported`, `redelivered`, `duplicates_skipped` and `elapsed_ms` describe
/// this run alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Data rows in the input file.
    pub rows: u64,
    /// This run: rows skipped because the database already held them.
    pub rows_already_imported: u64,
    /// Orders placed, as counted by `orders.order_summary`.
    pub orders_placed: u64,
    /// Lines added, as counted by `orders.revenue_by_region`.
    pub lines_added: u64,
    /// Rows the aggregate refused (recorded, so a rerun reports them too).
    pub rejected: u64,
    /// Their row ids, in file order.
    pub rejected_row_ids: Vec<u64>,
    /// Orders shipped, as counted by `orders.shipping_lead_time`.
    pub orders_shipped: u64,
    /// Sales of all lines added, exact (a decimal string).
    pub sales_total: Decimal,
    /// Profit of all lines added, exact (a decimal string).
    pub profit_total: Decimal,
    /// Sales by region, exact (decimal strings).
    pub revenue_by_region: BTreeMap<String, Decimal>,
    /// Sales by the currency of their order (`order.placed` version 2, or version 1 upcast),
    /// exact (decimal strings), as `orders.order_summary`
    /// recorded them.
    pub revenue_by_currency: BTreeMap<String, Decimal>,
    /// Distinct customers with at least one order.
    pub customers: u64,
    /// Shortest, mean and longest lead time in days over all shipped orders.
    pub lead_time_days: LeadTimeSummary,
    /// Confirmations in the mail queue (`orders.send_confirmation`).
    pub notifications_sent: u64,
    /// Lines the ERP took (`orders.erp_export`).
    pub erp_exported: u64,
    /// Events committed to the outbox (each once, whatever was appended twice).
    pub events_dispatched: u64,
    /// Handler runs whose effects committed: in-transaction runs (one per committed event
    /// per in-transaction handler) plus completed deliveries.
    pub handler_runs: u64,
    /// This run: envelopes appended a second time (same event id).
    pub redelivered: u64,
    /// This run: appended envelopes the outbox skipped because their event id was already
    /// there (no handler ran for them, in the transaction or after).
    pub duplicates_skipped: u64,
    /// Deliveries in the dead letter queue (not replayed or purged).
    pub dead_lettered: u64,
    /// Delivery attempts beyond the first (transient failures retried), over all deliveries
    /// on record.
    pub retries: u64,
    /// Wall time of this run, reading the file included.
    pub elapsed_ms: u64,
}

/// Lead time over all shipped orders, in days.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeadTimeSummary {
    /// Shortest.
    pub min: i64,
    /// Mean, two decimals.
    pub mean: Decimal,
    /// Longest.
    pub max: i64,
}

impl Summary {
    /// The summary line: `summary: ` and one JSON object.
    pub fn line(&self) -> String {
        // Serialising plain data with string keys cannot fail.
        format!(
            "summary: {}",
            serde_json::to_string(self).unwrap_or_default()
        )
    }
}

/// One handler's work over the life of the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerTally {
    /// The handler name (its idempotency key).
    pub name: &'static str,
    /// The events it handles: one, or each of an event union's.
    pub events: Vec<&'static str>,
    /// In transaction or after commit.
    pub mode: DeliveryMode,
    /// Whether its deliveries keep per-aggregate order.
    pub ordered: bool,
    /// Its priority.
    pub priority: i32,
    /// Runs whose effects committed: events committed (in transaction), or deliveries
    /// completed (after commit).
    pub ran: u64,
    /// Attempts beyond the first.
    pub retries: u64,
    /// Deliveries in the dead letter queue.
    pub dead: u64,
    /// Deliveries not finished.
    pub pending: u64,
}

/// The deliveries of a transport's relay: events published (completed), failed attempts,
/// dead letters, and events not published yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayTally {
    /// The destination name (`nats:<stream>`).
    pub name: String,
    /// Events published (the broker acknowledged them).
    pub published: u64,
    /// Attempts beyond the first.
    pub retries: u64,
    /// Deliveries in the dead letter queue.
    pub dead: u64,
    /// Events not published yet.
    pub pending: u64,
}

/// What this run did, beside the totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Rows committed by this run.
    pub rows_imported: u64,
    /// Orders shipped by this run.
    pub orders_shipped: u64,
    /// Events committed by this run (appended for the first time).
    pub events_committed: u64,
    /// Deliveries this process completed, retried and dead-lettered.
    pub delivery: BatchReport,
    /// Transient failures `--flaky-rate` injected.
    pub flaky_failures: u64,
}

/// Everything the job computed: the [`Summary`] and the detail behind the report tables.
#[derive(Debug, Clone)]
pub struct Report {
    /// The totals.
    pub summary: Summary,
    /// The input file.
    pub input: PathBuf,
    /// The database, password masked.
    pub database: String,
    /// What this run did.
    pub run: RunStats,
    /// Revenue per region.
    pub regions: BTreeMap<String, Revenue>,
    /// Orders, lines and sales per currency.
    pub currencies: BTreeMap<String, CurrencySales>,
    /// Orders, customers and sales per segment.
    pub segments: BTreeMap<String, Segment>,
    /// The customers with the highest sales, highest first.
    pub top_customers: Vec<(String, Customer)>,
    /// Lead times per ship mode.
    pub lead_times: BTreeMap<String, LeadTimes>,
    /// Per handler, in registry order.
    pub handlers: Vec<HandlerTally>,
    /// Per transport relay the outbox has (`--nats`: `nats:<stream>`), by name: its deliveries
    /// are the events it publishes.
    pub relays: Vec<RelayTally>,
    /// Events in the outbox, by name.
    pub events_by_name: BTreeMap<String, u64>,
    /// Refused rows.
    pub rejections: Vec<Rejection>,
    /// Open dead letters by (handler, reason, first line of the error).
    pub dead_letters: BTreeMap<(String, String), u64>,
    /// Open dead letters of handlers other than the ERP export and the relay: events some
    /// projection misses, so the totals are incomplete (replay them with `orders events dlq
    /// replay`).
    pub projection_dead_letters: u64,
    /// The NATS relay's destination name (`nats:<stream>`), with `--nats`.
    pub relay: Option<String>,
    /// Open dead letters of the relay: events that never reached NATS.
    pub relay_dead_letters: u64,
    /// Confirmations that repeat an order (0 unless an effect ran twice).
    pub repeated_notifications: u64,
    /// The confirmation of the order shipped first, as a sample.
    pub sample_confirmation: Option<String>,
}

/// The retry policy of every handler: enough attempts that `--flaky-rate` failures are
/// absorbed (at rate 0.2, twelve failures in a row happen about once in 4 × 10⁸
/// deliveries), with short waits so that a run is not slowed down by them.
pub fn retry_policy() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 12,
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(100),
    }
}

/// The registry of the example's events and handlers, for `orders events …`.
///
/// # Errors
/// As [`Registry::from_inventory`]'s `build`.
pub fn registry() -> Result<Registry, RegistryError> {
    Registry::from_inventory()
        .expect_handlers(HANDLER_COUNT)
        .build()
}

/// `orders events …`: the runtime's operations tool embedded in this example, on the
/// example's default database. Pass it to [`event_runtime::cli::run`] or
/// [`event_runtime::cli::run_with_output`].
pub fn cli_app<'a>(registry: &'a Registry, topology: &'a Topology) -> App<'a> {
    App::embedded("orders events", registry)
        .default_database(DEFAULT_DATABASE)
        .topology(topology)
}

/// The outbox's configuration.
pub fn outbox_config() -> OutboxConfig {
    OutboxConfig::default()
        // Names this producer on every envelope (CloudEvents `source`): consumers key its
        // aggregates, and their chains, by it.
        .source("urn:example:orders")
        .retry(retry_policy())
        .poll_interval(Duration::from_millis(20))
        // A batch takes well under a second; a process killed mid-batch leaves its claims to
        // the next run after this long.
        .lease(Duration::from_secs(10))
}

/// Whether `url` names a RabbitMQ broker (`amqp://`, `amqps://`) rather than NATS.
pub fn is_amqp(url: &str) -> bool {
    url.starts_with("amqp://") || url.starts_with("amqps://")
}

/// The relay's destination name with `--broker`: `nats:<stream>`, or `amqp:<exchange>` on
/// RabbitMQ.
pub fn relay_name(args: &Args) -> Option<String> {
    args.broker.as_deref().map(|url| {
        if is_amqp(url) {
            format!("amqp:{}", args.stream)
        } else {
            format!("nats:{}", args.stream)
        }
    })
}

/// The RabbitMQ relay's configuration (`--broker amqp://…`): every event to the exchange
/// `--stream` with the routing key `<prefix>.<name>` (partitioned with `--partitions`).
pub fn amqp_relay_config(args: &Args) -> event_runtime::transport::rabbitmq::RelayConfig {
    event_runtime::transport::rabbitmq::RelayConfig::new(&args.stream)
        .routing_key_prefix(args.subject_prefix.clone())
        .partitions(args.partitions)
}

/// The NATS relay's configuration (`--nats`): every event to `<prefix>.<name>` in `stream`.
pub fn relay_config(args: &Args) -> RelayConfig {
    RelayConfig::new(&args.stream)
        .subject_prefix(args.subject_prefix.clone())
        .partitions(args.partitions)
}

/// Where the events of a run with `args` go, for `orders events asyncapi` and `orders events
/// flow`: the relay of `--nats` (on `--nats`'s first server, else the default one).
pub fn topology(args: &Args) -> Topology {
    let server = args
        .broker
        .as_deref()
        .filter(|url| !is_amqp(url))
        .unwrap_or("nats://127.0.0.1:4222");
    Topology::new("orders", env!("CARGO_PKG_VERSION"))
        .description(
            "The orders service of the examples: imports a retail data set as orders, commits \
             their events through its transactional outbox, and publishes every one to NATS \
             JetStream for the billing service.",
        )
        .outbox_config(&outbox_config())
        .server("nats", server)
        .nats_relay(&relay_config(args))
}

/// `url` with its password, if any, replaced by `***`.
pub fn mask_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((credentials, host)) = rest.split_once('@') else {
        return url.to_owned();
    };
    match credentials.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

async fn open(args: &Args) -> Result<Store, RunError> {
    let opened = match &args.schema {
        Some(schema) => {
            if !args.database.starts_with("postgres") {
                return Err(RunError::Usage(format!(
                    "--schema {schema} needs a postgres:// database, not {}",
                    mask_password(&args.database)
                )));
            }
            event_runtime::store::postgres::connect_in_schema(&args.database, schema).await
        }
        None => Store::connect(&args.database).await,
    };
    let store = opened.map_err(|source| RunError::Open {
        url: mask_password(&args.database),
        source,
    })?;
    sql::create_tables(&store)
        .await
        .map_err(|source| RunError::Open {
            url: mask_password(&args.database),
            source,
        })?;
    Ok(store)
}

/// The warning `--nats` prints when the database already holds `missed` events that were
/// committed before the relay was added (a database an earlier run without `--nats` filled):
/// the relay publishes only what is committed from now on, and a run that skips the rows it
/// already holds commits nothing, so `billing` would receive nothing and say so with exit 0.
pub fn unpublished_warning(missed: u64, database: &str) -> Option<String> {
    (missed > 0).then(|| {
        let more = if missed >= 10_000 { " or more" } else { "" };
        format!(
            "warning: {} already holds {missed}{more} events committed without --nats; the NATS relay \
             was added after them and never publishes them (only events committed from now on), \
             so billing will not receive them. To publish the whole job, run `orders --nats` on \
             a fresh database (another --database, such as sqlite://orders-nats.db).",
            mask_password(database)
        )
    })
}

/// Runs the job: imports `args.input` into `args.database`, delivers every event, and reads
/// the totals back.
///
/// With `args.crash_after`, the process aborts once that many deliveries have completed, at
/// the end of the delivery batch that reaches the count (`std::process::abort`: no destructor, no flush, as a crash) — do not set it in a process
/// that should survive, such as a test.
///
/// # Errors
/// [`RunError`]: unreadable or malformed input (naming file, line and column, before the
/// database is touched), a database that cannot be opened, a command whose unit of work
/// failed (naming the row's line), or a database failure during delivery. A row the aggregate
/// refuses is not an error: it is recorded and listed in [`Report::rejections`].
pub async fn run(args: &Args) -> Result<Report, RunError> {
    let started = Instant::now();
    if !(0.0..=1.0).contains(&args.flaky_rate) {
        return Err(RunError::Usage(format!(
            "--flaky-rate must be between 0 and 1, not {}",
            args.flaky_rate
        )));
    }
    let rows = csv_input::read_rows(&args.input)?;
    // Before anything is written: a port in use stops the run with nothing done.
    if let Some(addr) = &args.metrics_addr {
        crate::serve_metrics(addr).map_err(RunError::Usage)?;
    }
    let store = open(args).await?;
    let flaky = Arc::new(Flaky::new(args.flaky_rate, args.seed));
    // The relay, and the NATS one again for its own start-up checks.
    let (relay, nats_relay): (Option<Arc<dyn event_runtime::Destination>>, _) = match &args.broker {
        Some(url) if is_amqp(url) => {
            let relay = event_runtime::transport::rabbitmq::AmqpRelay::new(
                url.as_str(),
                amqp_relay_config(args),
            );
            relay
                .declare_exchange()
                .await
                .map_err(|e| RunError::Rabbitmq(Box::new(e)))?;
            relay
                .check()
                .await
                .map_err(|e| RunError::Rabbitmq(Box::new(e)))?;
            (Some(relay as Arc<dyn event_runtime::Destination>), None)
        }
        Some(url) => {
            let client = connect_nats(
                url,
                &args.stream,
                &args.subject_prefix,
                args.stream_replicas,
                args.partitions,
            )
            .await?;
            let relay = event_runtime::transport::nats::NatsRelay::new(client, relay_config(args));
            (
                Some(relay.clone() as Arc<dyn event_runtime::Destination>),
                Some(relay),
            )
        }
        None => (None, None),
    };
    let mut builder = Outbox::builder(store);
    if let Some(relay) = &relay {
        builder = builder.destination(relay.clone());
    }
    let outbox = builder
        .resource_arc(Arc::clone(&flaky))
        .expect_handlers(HANDLER_COUNT)
        .config(outbox_config())
        .build()
        .map_err(RunError::Start)?;
    if let Some(relay) = &nats_relay {
        relay.check(&outbox).await.map_err(RunError::Nats)?;
        let missed = relay
            .unpublished_before(&outbox)
            .await
            .map_err(RunError::Nats)?;
        if let Some(warning) = unpublished_warning(missed, &args.database) {
            eprintln!("{warning}");
        }
    }
    let imported = persistence::imported_row_ids(outbox.store())
        .await
        .map_err(|source| RunError::Open {
            url: mask_password(&args.database),
            source,
        })?;

    // Its own delivery loop (`deliver_batch`) sets no gauges: a task sets them every second.
    let gauges = match args.metrics_addr {
        Some(_) => {
            let outbox = outbox.clone();
            Some(tokio::spawn(async move {
                loop {
                    if let Err(e) = outbox.update_gauges().await {
                        eprintln!("orders: reading the backlog for the gauges failed: {e}");
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }))
        }
        None => None,
    };
    let delivery = Delivery::start(&outbox, args.crash_after);
    let to_import = rows
        .iter()
        .filter(|r| !imported.contains(&r.row_id))
        .count();
    let progress = progress::Progress::start(to_import as u64, Arc::clone(&delivery.completed));
    let mut import = Import::new(&outbox, args);
    let imported_result = import.all(&rows, &imported, &progress).await;
    let delivered = delivery.finish().await;
    progress.finish();
    if let Some(gauges) = gauges {
        gauges.abort();
        let _ = outbox.update_gauges().await;
    }
    imported_result?;
    let delivered = delivered?;

    let model = read_model::read(outbox.store())
        .await
        .map_err(RunError::Read)?;
    let run = RunStats {
        rows_imported: import.rows_imported,
        orders_shipped: import.orders_shipped,
        events_committed: import.events,
        delivery: delivered,
        flaky_failures: flaky.injected(),
    };
    let elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(report(
        args, &outbox, model, &rows, &imported, &import, run, elapsed_ms,
    ))
}

/// The import: rows to commands, commands to units of work, and the envelopes it appends a
/// second time.
struct Import<'o> {
    outbox: &'o Outbox,
    input: PathBuf,
    redeliver_every: u64,
    batch: usize,
    /// Events recorded and committed by this run.
    events: u64,
    /// Envelopes to append again in the next unit of work.
    redeliveries: Vec<RawEnvelope>,
    redelivered: u64,
    duplicates: u64,
    rows_imported: u64,
    orders_shipped: u64,
}

/// An order a unit of work has loaded or placed, and what to write back.
struct Touched {
    order: Order,
    /// The version it was loaded at; `None` when placed in this unit of work.
    loaded_version: Option<u64>,
    /// The first row's line, ship date and mode (kept from the store, or from the placing
    /// row).
    first_line: u64,
    ship_date: chrono::NaiveDate,
    ship_mode: String,
}

impl<'o> Import<'o> {
    fn new(outbox: &'o Outbox, args: &Args) -> Self {
        Import {
            outbox,
            input: args.input.clone(),
            redeliver_every: args.redeliver_every,
            batch: args.batch.max(1),
            events: 0,
            redeliveries: Vec::new(),
            redelivered: 0,
            duplicates: 0,
            rows_imported: 0,
            orders_shipped: 0,
        }
    }

    async fn all(
        &mut self,
        rows: &[OrderRow],
        imported: &HashSet<u64>,
        progress: &progress::Progress,
    ) -> Result<(), RunError> {
        let new: Vec<&OrderRow> = rows
            .iter()
            .filter(|r| !imported.contains(&r.row_id))
            .collect();
        for chunk in new.chunks(self.batch) {
            self.rows(chunk).await?;
            progress.imported(chunk.len() as u64);
        }
        self.ship_all().await?;
        if !self.redeliveries.is_empty() {
            // The last envelopes to redeliver get a unit of work of their own.
            let line = rows.last().map_or(0, |r| r.line);
            let uow = self.begin(line).await?;
            self.commit(uow, Vec::new(), &HashMap::new(), line).await?;
        }
        Ok(())
    }

    fn failed(&self, line: u64) -> impl Fn(OutboxError) -> RunError + '_ {
        move |e| RunError::Commit {
            path: self.input.clone(),
            line,
            source: Box::new(e),
        }
    }

    fn store_failed(&self, line: u64) -> impl Fn(StoreError) -> RunError + '_ {
        move |e| self.failed(line)(OutboxError::Store(e))
    }

    fn conflict(&self, line: u64, order_id: &str) -> RunError {
        RunError::Conflict {
            path: self.input.clone(),
            line,
            order_id: order_id.to_owned(),
        }
    }

    async fn begin(&self, line: u64) -> Result<OutboxUnitOfWork<'o>, RunError> {
        self.outbox.begin().await.map_err(self.failed(line))
    }

    /// Each row is one command — place the order if it is new, then add the line — and
    /// `rows` (`--batch`, one by default) commit in one unit of work. A row already recorded as imported
    /// is skipped inside the transaction, so each row is imported once however often, and
    /// however concurrently, the import runs.
    async fn rows(&mut self, rows: &[&OrderRow]) -> Result<(), RunError> {
        let Some(first) = rows.first() else {
            return Ok(());
        };
        let mut uow = self.begin(first.line).await?;
        let mut touched: Vec<Touched> = Vec::new();
        let mut by_id: HashMap<String, usize> = HashMap::new();
        let mut events = Vec::new();
        let mut lines = HashMap::new();
        let mut claimed = 0;
        for row in rows {
            let failed = self.store_failed(row.line);
            if !persistence::claim_row(uow.tx(), row.row_id, &row.order_id, row.line)
                .await
                .map_err(&failed)?
            {
                // Another process imported it since this one started.
                continue;
            }
            claimed += 1;
            let i = match by_id.get(&row.order_id) {
                Some(&i) => i,
                None => {
                    let t = match persistence::load_order(uow.tx(), &row.order_id)
                        .await
                        .map_err(&failed)?
                    {
                        Some(stored) => Touched {
                            loaded_version: Some(stored.state.version),
                            order: Order::load(stored.state),
                            first_line: stored.first_line,
                            ship_date: stored.ship_date,
                            ship_mode: stored.ship_mode,
                        },
                        None => Touched {
                            order: Order::place(PlaceOrder {
                                order_id: row.order_id.clone(),
                                customer_id: row.customer_id.clone(),
                                segment: row.segment.clone(),
                                region: row.region.clone(),
                                country: row.country.clone(),
                                order_date: row.order_date,
                            }),
                            loaded_version: None,
                            first_line: row.line,
                            ship_date: row.ship_date,
                            ship_mode: row.ship_mode.clone(),
                        },
                    };
                    touched.push(t);
                    by_id.insert(row.order_id.clone(), touched.len() - 1);
                    touched.len() - 1
                }
            };
            let order = &mut touched[i].order;
            let added = order.add_line(AddLine {
                customer_id: row.customer_id.clone(),
                row_id: row.row_id,
                product_id: row.product_id.clone(),
                product_name: row.product_name.clone(),
                category: row.category.clone(),
                quantity: row.quantity,
                sales: row.sales,
                discount: row.discount,
                profit: row.profit,
            });
            // A refused line records nothing; a new order's placement still commits.
            for envelope in order.take_events() {
                lines.insert(envelope.metadata().id, row.line);
                events.push(envelope);
            }
            if let Err(refused) = added {
                // Recorded, so that a rerun reports the row again.
                persistence::reject_row(uow.tx(), row.row_id, &refused.to_string())
                    .await
                    .map_err(&failed)?;
            }
        }
        for t in &touched {
            let failed = self.store_failed(t.first_line);
            match t.loaded_version {
                None => persistence::insert_order(
                    uow.tx(),
                    &StoredOrder {
                        state: t.order.state(),
                        first_line: t.first_line,
                        ship_date: t.ship_date,
                        ship_mode: t.ship_mode.clone(),
                    },
                )
                .await
                .map_err(&failed)?,
                Some(v) if v != t.order.version() => {
                    if !persistence::update_order(uow.tx(), &t.order.state(), v)
                        .await
                        .map_err(&failed)?
                    {
                        return Err(self.conflict(t.first_line, t.order.id()));
                    }
                }
                Some(_) => {}
            }
        }
        self.commit(uow, events, &lines, first.line).await?;
        self.rows_imported += claimed;
        Ok(())
    }

    /// After the last row: every placed order not shipped yet ships, as its first row says,
    /// in the order of the orders' first rows: one command per order, `--batch` of them per
    /// unit of work.
    async fn ship_all(&mut self) -> Result<(), RunError> {
        let unshipped = persistence::unshipped_orders(self.outbox.store())
            .await
            .map_err(self.store_failed(0))?;
        for chunk in unshipped.chunks(self.batch) {
            let Some(first) = chunk.first() else {
                continue;
            };
            let mut uow = self.begin(first.first_line).await?;
            let mut events = Vec::new();
            let mut lines = HashMap::new();
            let mut shipped = 0;
            for stored in chunk {
                let line = stored.first_line;
                // Loaded again inside the unit of work: the list may be stale.
                let current = persistence::load_order(uow.tx(), &stored.state.id)
                    .await
                    .map_err(self.store_failed(line))?;
                let Some(current) = current.filter(|c| !c.state.shipped) else {
                    continue;
                };
                let loaded_version = current.state.version;
                let mut order = Order::load(current.state);
                order
                    .ship(current.ship_date, &current.ship_mode)
                    .map_err(|source| RunError::Ship {
                        path: self.input.clone(),
                        line,
                        source: Box::new(source),
                    })?;
                if !persistence::update_order(uow.tx(), &order.state(), loaded_version)
                    .await
                    .map_err(self.store_failed(line))?
                {
                    return Err(self.conflict(line, order.id()));
                }
                for envelope in order.take_events() {
                    lines.insert(envelope.metadata().id, line);
                    events.push(envelope);
                }
                shipped += 1;
            }
            self.commit(uow, events, &lines, first.first_line).await?;
            self.orders_shipped += shipped;
        }
        Ok(())
    }

    /// Adds `events`, and the envelopes kept for redelivery, to `uow` and commits it; keeps
    /// every Nth of `events` to append again in the next unit of work. A failed commit is
    /// reported at the line of the row whose event failed (`lines`), else at `line`.
    async fn commit(
        &mut self,
        mut uow: OutboxUnitOfWork<'_>,
        events: Vec<Box<dyn AnyEnvelope>>,
        lines: &HashMap<uuid::Uuid, u64>,
        line: u64,
    ) -> Result<(), RunError> {
        let mut keep = Vec::new();
        for envelope in &events {
            self.events += 1;
            if self.redeliver_every > 0 && self.events % self.redeliver_every == 0 {
                // What a retried command or a broker that lost an acknowledgement hands
                // back: the same envelope, with the same event id.
                keep.push(envelope.to_raw().map_err(|source| RunError::Encode {
                    event: envelope.name(),
                    source,
                })?);
            }
        }
        uow.extend(events);
        let again = std::mem::replace(&mut self.redeliveries, keep);
        for raw in &again {
            uow.extend([self.outbox.dispatcher().registry().decode(raw)?]);
        }
        let committed = match uow.commit().await {
            Ok(c) => c,
            Err(e) => {
                let at = match &e {
                    OutboxError::Aborted(c) => lines.get(&c.event_id).copied().unwrap_or(line),
                    _ => line,
                };
                return Err(self.failed(at)(e));
            }
        };
        self.redelivered += again.len() as u64;
        self.duplicates += committed.duplicates as u64;
        Ok(())
    }
}

/// The delivery loop beside the import: claims and runs batches; once told that the import
/// is over, it stops at its first batch that finds nothing due. Completed deliveries are
/// counted for `--crash-after`.
///
/// One loop: SQLite has one writer anyway, and on PostgreSQL parallel delivery transactions
/// that update the same projection rows (a region, a ship mode) in different orders deadlock.
struct Delivery {
    outbox: Outbox,
    crash_after: Option<u64>,
    completed: Arc<AtomicU64>,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<BatchReport, OutboxError>>,
}

impl Delivery {
    fn start(outbox: &Outbox, crash_after: Option<u64>) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let completed = Arc::new(AtomicU64::new(0));
        let task = {
            let outbox = outbox.clone();
            let completed = Arc::clone(&completed);
            tokio::spawn(async move {
                let idle = outbox.config().poll_interval;
                let mut total = BatchReport::default();
                loop {
                    let r = outbox.deliver_batch().await?;
                    total += r;
                    count(&completed, r.completed, crash_after);
                    if r.claimed > 0 {
                        continue;
                    }
                    if *stopped.borrow() {
                        return Ok(total);
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(idle) => {}
                        _ = stopped.changed() => {}
                    }
                }
            })
        };
        Delivery {
            outbox: outbox.clone(),
            crash_after,
            completed,
            stop,
            task,
        }
    }

    /// Lets the loop run out of due deliveries, then waits in this task until nothing is left
    /// but dead letters (and what waits behind them), retries included ([`Outbox::drain`]).
    async fn finish(self) -> Result<BatchReport, RunError> {
        let _ = self.stop.send(true);
        let mut total = match self.task.await {
            Ok(r) => r.map_err(RunError::Deliver)?,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => {
                return Err(RunError::Usage(format!(
                    "the delivery task ended early: {e}"
                )))
            }
        };
        let r = self
            .outbox
            .drain(Duration::from_secs(300))
            .await
            .map_err(RunError::Deliver)?;
        total += r;
        count(&self.completed, r.completed, self.crash_after);
        Ok(total)
    }
}

/// Adds `n` completed deliveries; aborts the process once `crash_after` is reached.
fn count(completed: &AtomicU64, n: usize, crash_after: Option<u64>) {
    let now = completed.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
    if crash_after.is_some_and(|limit| now >= limit) {
        eprintln!("--crash-after: {now} deliveries completed; aborting");
        std::process::abort();
    }
}

#[allow(clippy::too_many_arguments)]
fn report(
    args: &Args,
    outbox: &Outbox,
    m: ReadModel,
    rows: &[OrderRow],
    imported: &HashSet<u64>,
    import: &Import<'_>,
    run: RunStats,
    elapsed_ms: u64,
) -> Report {
    let registry = outbox.dispatcher().registry();
    let handlers: Vec<HandlerTally> = registry
        .handlers()
        .iter()
        .map(|h| {
            let d = m.deliveries.get(h.name).copied().unwrap_or_default();
            let ran = match h.mode {
                DeliveryMode::InTransaction => h
                    .events
                    .iter()
                    .map(|e| m.events_by_name.get(e().name).copied().unwrap_or(0))
                    .sum(),
                _ => d.completed,
            };
            HandlerTally {
                name: h.name,
                events: h.events.iter().map(|e| e().name).collect(),
                mode: h.mode,
                ordered: h.ordered,
                priority: h.priority,
                ran,
                retries: d.retries,
                dead: d.dead,
                pending: d.pending,
            }
        })
        .collect();
    let relays: Vec<RelayTally> = outbox
        .destinations()
        .iter()
        .filter(|d| !registry.handlers().iter().any(|h| h.name == d.as_str()))
        .map(|name| {
            let d = m.deliveries.get(name).copied().unwrap_or_default();
            RelayTally {
                name: name.clone(),
                published: d.completed,
                retries: d.retries,
                dead: d.dead,
                pending: d.pending,
            }
        })
        .collect();

    let mut all_lead_times = LeadTimes::default();
    for lt in m.lead_times.values() {
        all_lead_times.merge(lt);
    }
    let mut top_customers: Vec<(String, Customer)> = m
        .customers
        .iter()
        .map(|(id, c)| (id.clone(), c.clone()))
        .collect();
    top_customers.sort_by(|a, b| b.1.sales.cmp(&a.1.sales).then_with(|| a.0.cmp(&b.0)));
    top_customers.truncate(args.top);

    let mut dead_letters: BTreeMap<(String, String), u64> = BTreeMap::new();
    for d in &m.dead_letters {
        *dead_letters
            .entry((d.handler.clone(), d.reason.to_string()))
            .or_default() += 1;
    }
    let relay = relay_name(args);
    let is_relay =
        |h: &str| relay.as_deref() == Some(h) || h.starts_with("nats:") || h.starts_with("amqp:");
    let projection_dead_letters = m
        .dead_letters
        .iter()
        .filter(|d| d.handler != ERP_EXPORT && !is_relay(&d.handler))
        .count() as u64;
    let relay_dead_letters = m
        .dead_letters
        .iter()
        .filter(|d| is_relay(&d.handler))
        .count() as u64;

    let summary = Summary {
        rows: rows.len() as u64,
        rows_already_imported: rows.iter().filter(|r| imported.contains(&r.row_id)).count() as u64,
        orders_placed: m.customers.values().map(|c| c.orders).sum(),
        lines_added: m.regions.values().map(|r| r.lines).sum(),
        rejected: m.rejections.len() as u64,
        rejected_row_ids: m.rejections.iter().map(|r| r.row_id).collect(),
        orders_shipped: all_lead_times.orders,
        sales_total: m.regions.values().map(|r| r.sales).sum(),
        profit_total: m.regions.values().map(|r| r.profit).sum(),
        // Normalised (no trailing zeros), as `billing` prints it: equal as text, not only as
        // numbers.
        revenue_by_region: m
            .regions
            .iter()
            .map(|(k, r)| (k.clone(), r.sales.normalize()))
            .collect(),
        revenue_by_currency: m
            .currencies
            .iter()
            .map(|(k, c)| (k.clone(), c.sales))
            .collect(),
        customers: m.customers.values().filter(|c| c.orders > 0).count() as u64,
        lead_time_days: LeadTimeSummary {
            min: all_lead_times.min_days,
            mean: all_lead_times.mean_days(),
            max: all_lead_times.max_days,
        },
        notifications_sent: m.notifications,
        erp_exported: m.erp_exported,
        events_dispatched: m.events_by_name.values().sum(),
        handler_runs: handlers.iter().map(|h| h.ran).sum(),
        redelivered: import.redelivered,
        duplicates_skipped: import.duplicates,
        dead_lettered: m.dead_letters.len() as u64,
        retries: m.deliveries.values().map(|d| d.retries).sum(),
        elapsed_ms,
    };
    Report {
        summary,
        input: args.input.clone(),
        database: match &args.schema {
            Some(schema) => format!("{} (schema {schema})", mask_password(&args.database)),
            None => mask_password(&args.database),
        },
        run,
        regions: m.regions,
        currencies: m.currencies,
        segments: m.segments,
        top_customers,
        lead_times: m.lead_times,
        handlers,
        relays,
        events_by_name: m.events_by_name,
        rejections: m.rejections,
        dead_letters,
        projection_dead_letters,
        relay,
        relay_dead_letters,
        repeated_notifications: m.notifications - m.notified_orders,
        sample_confirmation: m.first_confirmation,
    }
}

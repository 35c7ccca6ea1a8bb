//! `cargo run --release --example billing -- --broker URL --stream NAME --database URL
//! --idle-exit SECS [--crash-after N] [--subject-prefix PREFIX] [--partitions P [--member NAME]]`
//!
//! The second service: consumes the events `orders --broker URL` publishes — to JetStream,
//! through a durable pull consumer (`billing`), or to RabbitMQ (`--broker amqp://…`), through
//! the queue `billing` bound to the exchange — into this service's own outbox (its own SQLite
//! file or PostgreSQL schema), and invoices every shipped order. `--nats URL` is the same as
//! `--broker URL`. Each fetched batch is
//! committed once into the outbox (an event id already there is skipped) and only then
//! acknowledged; the outbox's workers run the three handlers below, exactly once each.
//! It stops when no message has arrived for `--idle-exit` seconds, prints a report and, last,
//! `summary: {…}` (JSON) with `invoices`, `revenue_by_region` (sales of invoiced orders,
//! exact decimal strings: equal to what `orders` reports once every order shipped),
//! `received`, `duplicates_skipped` and `dead_lettered`.
//!
//! With `--partitions P` (a stream `orders --partitions P` made), any number of billing
//! processes on one database form a group: they share the partitions, each consuming its
//! share through a durable consumer per partition (`<consumer>-<k>`; on RabbitMQ the queue
//! `<consumer>.<k>`); one that stops or is
//! killed has its share taken over by the others. Each prints the database's totals when it
//! leaves, with `others_running` (instances still at work then): the last one to leave prints
//! them all.
//!
//! `billing events …` is the runtime's operations tool on billing's database (as `events`, with
//! billing's event types and outbox): `billing events dlq replay ID --reason …` replays a
//! message the inbox dead-lettered (an event type this build did not know) through the inbox
//! core, with no broker connection.
//!
//! `--crash-after N` aborts the process after N received messages are committed, before
//! they are acknowledged; running it again redelivers them, skips them as duplicates, and
//! finishes with exact totals.
//!
//! It never ends in a silent partial result: it exits non-zero, saying why on standard error,
//! when the broker lost or re-created the stream or the consumer it consumes (the identity
//! recorded in its database on its first start differs: `events nats inbox adopt` after a
//! check), when the stream removed messages it had not received, and when it would idle out
//! while NATS is unreachable. Warnings of the framework (broker outages, retries, dead letters)
//! are logged on standard error; `RUST_LOG` changes the level (default `warn`). Its tables are
//! created under a lock, so that any number of instances can start together on a fresh
//! database.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::{Duration, Instant};

use clap::Parser;
use event_runtime::cli::App;
use event_runtime::topology::Topology;
use event_runtime::transport::nats::{
    self, GroupConfig, InboxConfig, InboxReport, NatsGroup, NatsInbox, RelayConfig,
};
use event_runtime::transport::rabbitmq::{self, AmqpError, AmqpGroup, AmqpInbox, BrokerTopology};
use event_runtime::{CancellationToken, ConnectOptions, Outbox, Registry, Store};
use examples::orders::domain::{LineAdded, OrderPlacedV2, OrderShipped};
use handlers::{create_tables, invoice, outbox, record_line, record_order};

mod handlers;
use rust_decimal::Decimal;

/// Command-line arguments.
#[derive(Debug, clap::Parser)]
#[command(
    name = "billing",
    about = "Consumes the orders service's events from NATS JetStream or RabbitMQ into its own outbox and invoices every shipped order."
)]
struct Args {
    /// The broker `orders` publishes to: a NATS server (`nats://…`, or a cluster's servers
    /// comma-separated) or RabbitMQ (`amqp://guest:guest@127.0.0.1:5672/%2f`: its queue
    /// `--consumer`, declared with its topology when missing). `--nats URL` is the same option.
    #[arg(
        long = "broker",
        visible_alias = "nats",
        value_name = "URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    broker: String,
    /// The JetStream stream `orders` publishes to, or on RabbitMQ its exchange.
    #[arg(long, value_name = "NAME", default_value = "EVENTS")]
    stream: String,
    /// This service's database: sqlite://PATH or postgres://USER@HOST/DB.
    #[arg(long, value_name = "URL", default_value = DEFAULT_DATABASE)]
    database: String,
    /// PostgreSQL only: keep every table in this schema.
    #[arg(long, value_name = "NAME")]
    schema: Option<String>,
    /// Stop once no new message has arrived for this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 5)]
    idle_exit: u64,
    /// Abort (as a crash would) once this many messages are committed, before their ack.
    #[arg(long, value_name = "N")]
    crash_after: Option<usize>,
    /// The durable consumer's name.
    #[arg(long, value_name = "NAME", default_value = "billing")]
    consumer: String,
    /// Instances of billing that consume through this durable consumer at once (the
    /// consumer hands out `instances` × 256 messages unacknowledged at most, so that none
    /// waits for another's batch). NATS only: on RabbitMQ instances share `--partitions`.
    #[arg(long, value_name = "N", default_value_t = 1)]
    instances: i64,
    /// The first subject token(s) `orders` publishes under (its `--subject-prefix`): this
    /// service reads `<prefix>.order.>`.
    #[arg(long, value_name = "PREFIX", default_value = "events")]
    subject_prefix: String,
    /// The stream's partitions (`orders --partitions`): with more than one, this process is
    /// an instance of the group `--consumer`, sharing the partitions with the others that run
    /// on the same database (each partition's durable consumer is `<consumer>-<k>`, on
    /// RabbitMQ its queue `<consumer>.<k>`); Ctrl-C or SIGTERM hands its partitions over;
    /// `--crash-after` and `--instances` take one partition only.
    #[arg(long, value_name = "P", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    partitions: u32,
    /// Serve the metrics (Prometheus text format) at `http://HOST:PORT/metrics` while it
    /// runs: received messages, held events, open gaps, the outbox's backlog, retries and
    /// dead letters.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<String>,
    /// This instance's name in the group (default: host, process id and a random suffix).
    #[arg(long, value_name = "NAME")]
    member: Option<String>,
}

/// The (handler, order) pairs whose counter does not grow with the sequence: an order's
/// events handled out of the producer's order.
const OUT_OF_ORDER: &str = "SELECT COUNT(*) FROM (SELECT DISTINCT a.handler, a.order_id \
     FROM billing_seen a JOIN billing_seen b ON b.order_id = a.order_id AND b.handler = a.handler \
     WHERE a.sequence < b.sequence AND a.n > b.n) AS x";

/// The invoiced sales per region: lines of orders that have an invoice.
const INVOICED: &str = "SELECT o.region, l.sales FROM billing_lines l
    JOIN billing_orders o ON o.order_id = l.order_id
    JOIN billing_invoices i ON i.order_id = l.order_id";

async fn invoiced(store: &Store) -> Result<Vec<(String, String)>, event_runtime::sqlx::Error> {
    if let Some(pool) = event_runtime::store::sqlite::pool(store) {
        return event_runtime::sqlx::query_as(INVOICED)
            .fetch_all(pool)
            .await;
    }
    let pool = event_runtime::store::postgres::pool(store).expect("a SQLite or PostgreSQL store");
    event_runtime::sqlx::query_as(INVOICED)
        .fetch_all(pool)
        .await
}

async fn count(store: &Store, sql: &'static str) -> Result<i64, event_runtime::StoreError> {
    let mut tx = store.begin().await?;
    let n = tx.fetch_i64(sql, &[]).await?.unwrap_or(0);
    tx.rollback().await?;
    Ok(n)
}

#[derive(serde::Serialize)]
struct Summary {
    invoices: i64,
    revenue_by_region: BTreeMap<String, Decimal>,
    revenue_total: Decimal,
    received: usize,
    appended: usize,
    duplicates_skipped: usize,
    dead_lettered: i64,
    /// (handler, order) pairs handled out of the producer's order (must be 0).
    out_of_order: i64,
    /// Other instances of the group still running when this one left (`--partitions`): the
    /// totals are then the database's so far, and the last instance to leave has them all.
    others_running: usize,
    elapsed_ms: u64,
}

/// `billing events …`: the runtime's operations tool with billing's event types and outbox,
/// so that `dlq replay ID` replays the inbox's dead letters too (through the inbox core, no
/// broker needed), on billing's default database.
async fn events(argv: Vec<std::ffi::OsString>) -> ExitCode {
    let registry = match Registry::builder()
        .event::<OrderPlacedV2>()
        .event::<LineAdded>()
        .event::<OrderShipped>()
        .handler::<record_order>()
        .handler::<record_line>()
        .handler::<invoice>()
        .build()
    {
        Ok(registry) => registry,
        Err(e) => {
            eprintln!("error: {}", event_core::ErrorChain(&e));
            return ExitCode::FAILURE;
        }
    };
    let topology = topology(&Args::parse_from(["billing"]));
    let app = App::embedded("billing events", &registry)
        .default_database(DEFAULT_DATABASE)
        .outbox(&outbox)
        .topology(&topology);
    // `events` takes the place of the program name: `billing events dlq list` runs `dlq list`.
    event_runtime::cli::run(argv.into_iter().skip(1), app).await
}

/// The inbox's configuration: `<prefix>.order.>` of the stream, in batches of 256.
fn inbox_config(args: &Args) -> InboxConfig {
    InboxConfig::new(&args.stream, &args.consumer)
        .filter_subject(format!("{}.order.>", args.subject_prefix))
        .partitions(args.partitions)
        .batch(256)
        .ack_wait(Duration::from_secs(10))
}

/// Where billing's events come from, for `billing events asyncapi` and `billing events flow`:
/// its inbox, reading what the orders relay publishes (`orders --nats` with the same stream,
/// prefix and partitions).
fn topology(args: &Args) -> Topology {
    let producer = RelayConfig::new(&args.stream)
        .subject_prefix(args.subject_prefix.clone())
        .partitions(args.partitions);
    Topology::new("billing", env!("CARGO_PKG_VERSION"))
        .description(
            "The billing service of the examples: receives the orders service's events from \
             NATS JetStream into its own outbox and invoices every shipped order.",
        )
        .outbox_config(&handlers::outbox_config())
        .server("nats", &args.broker)
        .nats_inbox(&inbox_config(args), &producer)
}

/// The database `--database` defaults to.
const DEFAULT_DATABASE: &str = "sqlite://billing.db";

async fn run(args: &Args) -> Result<Summary, Box<dyn std::error::Error>> {
    let started = Instant::now();
    let mut options = ConnectOptions::default();
    if let Some(schema) = &args.schema {
        options = options.schema(schema);
    }
    // Before anything is written: a port in use stops the run with nothing done.
    if let Some(addr) = &args.metrics_addr {
        examples::serve_metrics(addr)?;
    }
    let store = Store::connect_with(&args.database, &options).await?;
    create_tables(&store).await?;
    let outbox = outbox(store.clone())?;
    let amqp = examples::orders::is_amqp(&args.broker);
    if amqp && args.instances > 1 {
        // A queue has one active consumer: a second instance would wait, idle out and report
        // nothing.
        return Err(
            "--instances is for NATS (instances on one durable consumer): on RabbitMQ, instances share the queues of --partitions P".into(),
        );
    }
    let workers = outbox.spawn_workers(2);
    let (total, others_running) = if amqp && args.partitions > 1 {
        consume_amqp_group(args, &outbox).await?
    } else if amqp {
        (consume_amqp(args, &outbox).await?, 0)
    } else {
        let client = nats::connect(&args.broker, "billing").await?;
        let js = async_nats::jetstream::new(client.clone());
        if args.partitions > 1 {
            consume_group(args, &js, &outbox).await?
        } else {
            (consume(args, &js, &outbox).await?, 0)
        }
    };
    workers.shutdown(Duration::from_secs(30)).await?;
    outbox.drain(Duration::from_secs(300)).await?;
    // Events stored but waiting for a predecessor that never came: the totals would be
    // silently short. (While other instances run, a held event may await one they are
    // committing: the last instance to leave checks.)
    let held = outbox.held_events().await?;
    if held > 0 && others_running == 0 {
        return Err(format!(
            "{held} received events wait for earlier events of their orders that never arrived (the broker lost them?): the summary would be partial; a billing run after they waited longer than gap_after (5 min) reports them as gaps, which `billing events inbox gaps` lists"
        )
        .into());
    }

    let mut revenue_by_region: BTreeMap<String, Decimal> = BTreeMap::new();
    for (region, sales) in invoiced(&store).await? {
        *revenue_by_region.entry(region).or_default() += Decimal::from_str(&sales)?;
    }
    // Normalised (no trailing zeros), as `orders` prints it: equal as text.
    for revenue in revenue_by_region.values_mut() {
        *revenue = revenue.normalize();
    }
    Ok(Summary {
        invoices: count(&store, "SELECT COUNT(*) FROM billing_invoices").await?,
        revenue_total: revenue_by_region.values().sum::<Decimal>().normalize(),
        revenue_by_region,
        received: total.received,
        appended: total.appended,
        duplicates_skipped: total.duplicates,
        dead_lettered: count(
            &store,
            "SELECT COUNT(*) FROM event_dead_letters WHERE resolved_at IS NULL",
        )
        .await?,
        out_of_order: count(&store, OUT_OF_ORDER).await?,
        others_running,
        elapsed_ms: started.elapsed().as_millis() as u64,
    })
}

/// Refuses to idle out when the broker has been unreachable since `since` for the idle time:
/// the summary would be partial.
fn idle_while_unreachable(
    args: &Args,
    since: Instant,
    e: &(dyn std::error::Error + 'static),
) -> Result<(), Box<dyn std::error::Error>> {
    if since.elapsed() < Duration::from_secs(args.idle_exit) {
        return Ok(());
    }
    let broker = if examples::orders::is_amqp(&args.broker) {
        "RabbitMQ"
    } else {
        "NATS"
    };
    Err(format!(
        "{broker} at {} has been unreachable for {} s and billing would idle out: the summary would be partial ({})",
        redact_broker(&args.broker),
        since.elapsed().as_secs(),
        event_core::ErrorChain(e)
    )
    .into())
}

/// `url` with its password masked, whichever the broker.
fn redact_broker(url: &str) -> String {
    if examples::orders::is_amqp(url) {
        rabbitmq::redact_url(url)
    } else {
        nats::redact_url(url)
    }
}

/// On RabbitMQ: the queues of `--consumer` (`--partitions` of them), bound to
/// `<prefix>.order.#` of the exchange `--stream`; declared when missing.
async fn amqp_topology(args: &Args) -> Result<BrokerTopology, AmqpError> {
    let topology = BrokerTopology::new(&args.stream, &args.consumer)
        .routing_key_prefix(&args.subject_prefix)
        .partitions(args.partitions)
        .bindings(["order.#"]);
    topology.create(&args.broker).await?;
    Ok(topology)
}

/// On RabbitMQ, one partition: the queue `--consumer`, consumed by one inbox until idle, or
/// `--crash-after`.
async fn consume_amqp(
    args: &Args,
    outbox: &Outbox,
) -> Result<InboxReport, Box<dyn std::error::Error>> {
    let topology = amqp_topology(args).await?;
    let inbox = AmqpInbox::new(
        &args.broker,
        outbox.clone(),
        topology.inbox_config(0).batch(256),
    )
    .await?;
    let mut total = InboxReport::default();
    let mut last = Instant::now();
    let idle = Duration::from_secs(args.idle_exit);
    let mut unreachable_since: Option<Instant> = None;
    loop {
        if last.elapsed() >= idle {
            // Idle because nothing arrives, not because the broker is away.
            match inbox.verify().await {
                Ok(()) => break,
                Err(e @ AmqpError::NoQueue { .. }) => return Err(e.into()),
                Err(e) => {
                    let since = *unreachable_since.get_or_insert_with(Instant::now);
                    idle_while_unreachable(args, since, &e)?;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            }
        }
        let committed = match inbox.fetch_and_commit().await {
            Ok(committed) => committed,
            Err(e @ AmqpError::NoQueue { .. }) => return Err(e.into()),
            Err(e) => {
                eprintln!(
                    "billing: a batch failed ({}); retrying",
                    event_core::ErrorChain(&e)
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        unreachable_since = None;
        let r = committed.report();
        crash_if_due(args, total.received + r.received);
        let failed = committed
            .error()
            .map(|e| event_core::ErrorChain(e).to_string());
        total += committed.settle().await;
        if let Some(failed) = failed {
            eprintln!("billing: a batch failed ({failed}); retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        if r.received > 0 {
            last = Instant::now();
        }
    }
    Ok(total)
}

/// `--crash-after N`: aborts the process (no destructor, no ack) once `committed` messages,
/// committed and not yet acknowledged, reach N.
fn crash_if_due(args: &Args, committed: usize) {
    if args.crash_after.is_some_and(|n| committed >= n) {
        eprintln!("--crash-after: {committed} messages committed, not acked; aborting");
        std::process::abort();
    }
}

/// This instance's place in the group: `--member`, or a name of its own.
fn group_config(args: &Args) -> GroupConfig {
    match &args.member {
        Some(member) => GroupConfig::new().member(member),
        None => GroupConfig::new(),
    }
}

/// The live members of `view` other than `me`.
fn others_running(view: &event_runtime::GroupView, me: &str) -> usize {
    view.live_members()
        .iter()
        .filter(|m| m.as_str() != me)
        .count()
}

/// A token cancelled on Ctrl-C or SIGTERM: a group's graceful stop, handing its partitions
/// over at once.
fn stop_on_signal() -> CancellationToken {
    let cancel = CancellationToken::new();
    tokio::spawn({
        let cancel = cancel.clone();
        async move {
            let Ok(mut term) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            else {
                return;
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            eprintln!("billing: stopping: handing the partitions over");
            cancel.cancel();
        }
    });
    cancel
}

/// On RabbitMQ, an instance of the group `--consumer` over its `--partitions` queues, as
/// [`consume_group`] on NATS. Returns what it received, and how many other instances were
/// still running when it left.
async fn consume_amqp_group(
    args: &Args,
    outbox: &Outbox,
) -> Result<(InboxReport, usize), Box<dyn std::error::Error>> {
    if args.crash_after.is_some() {
        return Err(
            "--crash-after takes one partition: kill an instance of a group instead".into(),
        );
    }
    let topology = amqp_topology(args).await?;
    let cancel = stop_on_signal();
    let inbox = topology.inbox_config(0).batch(256);
    let group = AmqpGroup::new(
        &args.broker,
        outbox.clone(),
        topology.clone(),
        inbox,
        group_config(args),
    )?;
    let idle = Duration::from_secs(args.idle_exit);
    let total = group.run(cancel.clone(), Some(idle)).await?;
    let others = others_running(&group.view().await?, group.member());
    if others == 0 && !cancel.is_cancelled() {
        // The last to leave: what the queues still hold would be missing from its totals.
        let left: Vec<String> = topology
            .ready(&args.broker)
            .await?
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(queue, n)| format!("{queue}: {n}"))
            .collect();
        if !left.is_empty() {
            return Err(format!(
                "the last instance to leave, with messages still to consume ({}): the summary would be partial; run billing again",
                left.join(", ")
            )
            .into());
        }
    }
    Ok((total, others))
}

/// One inbox, on the durable consumer itself (one partition): until idle, or
/// `--crash-after`.
async fn consume(
    args: &Args,
    js: &async_nats::jetstream::Context,
    outbox: &Outbox,
) -> Result<InboxReport, Box<dyn std::error::Error>> {
    let inbox = NatsInbox::new(
        js,
        outbox.clone(),
        inbox_config(args)
            .partitions(1)
            .max_ack_pending(256 * args.instances.max(1)),
    )
    .await?;
    let mut total = InboxReport::default();
    let mut last = Instant::now();
    // A crashed run's batch is redelivered after ack_wait: wait for it before idling out.
    let mut idle = Duration::from_secs(args.idle_exit);
    if inbox.ack_pending().await? > 0 {
        idle += inbox.config().ack_wait;
    }
    let mut unreachable_since: Option<Instant> = None;
    loop {
        if last.elapsed() >= idle {
            // Idle because nothing arrives, not because the broker is away.
            match inbox.verify().await {
                Ok(()) => break,
                Err(e) if e.is_fatal() => return Err(e.into()),
                Err(e) => {
                    let since = *unreachable_since.get_or_insert_with(Instant::now);
                    idle_while_unreachable(args, since, &e)?;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            }
        }
        let batch = match inbox.fetch_and_commit().await {
            Ok(batch) => batch,
            Err(e) if e.is_fatal() => return Err(e.into()),
            Err(e) => {
                // Logged by the connection's own lines too; retried, its messages redelivered.
                eprintln!(
                    "billing: a batch failed ({}); retrying",
                    event_core::ErrorChain(&e)
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        unreachable_since = None;
        let r = batch.report();
        crash_if_due(args, total.received + r.received);
        total += batch.ack().await;
        if r.received > 0 {
            last = Instant::now();
            idle = Duration::from_secs(args.idle_exit);
        }
    }
    Ok(total)
}

/// An instance of the group `--consumer` over a stream of `--partitions` partitions: it
/// consumes its share of the partitions until none of them received anything for
/// `--idle-exit` seconds. Returns what it received, and how many other instances were still
/// running when it left.
async fn consume_group(
    args: &Args,
    js: &async_nats::jetstream::Context,
    outbox: &Outbox,
) -> Result<(InboxReport, usize), Box<dyn std::error::Error>> {
    if args.crash_after.is_some() {
        return Err(
            "--crash-after takes one partition: kill an instance of a group instead".into(),
        );
    }
    let cancel = stop_on_signal();
    let group = NatsGroup::new(js, outbox.clone(), inbox_config(args), group_config(args))?;
    let idle = Duration::from_secs(args.idle_exit);
    let total = group.run(cancel.clone(), Some(idle)).await?;
    let others = others_running(&group.view().await?, group.member());
    if others == 0 && !cancel.is_cancelled() {
        // The last to leave: what the partitions still hold would be missing from its totals.
        let stream = js.get_stream(&args.stream).await?;
        let mut left = Vec::new();
        for p in 0..args.partitions {
            let durable = nats::partition_durable(&args.consumer, p);
            if let Ok(i) = stream.consumer_info(&durable).await {
                let n = i.num_pending + i.num_ack_pending as u64;
                if n > 0 {
                    left.push(format!("{durable}: {n}"));
                }
            }
        }
        if !left.is_empty() {
            return Err(format!(
                "the last instance to leave, with messages still to consume ({}): the summary would be partial; run billing again",
                left.join(", ")
            )
            .into());
        }
    }
    Ok((total, others))
}

#[tokio::main]
async fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == "events") {
        return events(argv).await;
    }
    examples::init_logging("warn,lapin=error");
    let args = Args::parse();
    match run(&args).await {
        Ok(s) => {
            println!("billing: {} invoices", s.invoices);
            for (region, revenue) in &s.revenue_by_region {
                println!("  {region:<10} {revenue:>14}");
            }
            println!(
                "this run received {} messages: {} new events, {} duplicates skipped; {} open dead letters in the queue",
                s.received, s.appended, s.duplicates_skipped, s.dead_lettered
            );
            if s.others_running > 0 {
                println!(
                    "{} other instance(s) of the group still running: these are the totals so far",
                    s.others_running
                );
            }
            println!("summary: {}", serde_json::to_string(&s).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("billing: error: {}", event_core::ErrorChain(&*e));
            // Which servers it talked to, credentials masked.
            eprintln!(
                "billing: database {}{}, broker {} (stream or exchange {}, consumer {})",
                examples::orders::mask_password(&args.database),
                args.schema
                    .as_deref()
                    .map(|s| format!(" (schema {s})"))
                    .unwrap_or_default(),
                redact_broker(&args.broker),
                args.stream,
                args.consumer
            );
            ExitCode::FAILURE
        }
    }
}

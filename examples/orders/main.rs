//! `cargo run --release --example orders [-- --database URL --input PATH --flaky-rate P …]`
//!
//! Imports the bundled Superstore orders (10,194 rows) into a database (default
//! `sqlite://orders.db`, created and migrated) through the `Order` aggregate and a
//! transactional outbox, delivers the events to seven durable handlers, prints report tables,
//! and ends with one line `summary: {…}` (JSON). Running it again on the same database skips
//! what is already there and prints the same totals.
//!
//! `cargo run --example orders -- events …` is the runtime's operations tool on the same
//! database: `events dlq list`, `events dlq replay …`, `events outbox stats`, `events catalog`
//! (every event version with its JSON Schema; `--json`), `events check`.
//!
//! This binary is thin on purpose: the job lives in the `examples` library
//! (`examples/src/orders/`), so that the tests run exactly this code in-process.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use examples::orders::{self, report, Args};

#[tokio::main]
async fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == "events") {
        return events(argv).await;
    }
    // Warnings (a broker outage, a paused relay) on standard error; the per-delivery lines
    // of the engine (each dead letter the ERP export refuses by design) are in the report
    // instead: `RUST_LOG=warn` shows them too.
    examples::init_logging("warn,event_runtime::outbox::engine=off,lapin=error");
    let args = Args::parse_from(argv);
    let report = match orders::run(&args).await {
        Ok(report) => report,
        Err(e) => {
            eprintln!("error: {}", event_core::ErrorChain(&e));
            // Which servers it talked to, credentials masked.
            eprintln!(
                "orders: database {}{}{}",
                orders::mask_password(&args.database),
                args.schema
                    .as_deref()
                    .map(|s| format!(" (schema {s})"))
                    .unwrap_or_default(),
                args.broker
                    .as_deref()
                    .map(|n| if orders::is_amqp(n) {
                        format!(
                            ", RabbitMQ {} (exchange {})",
                            event_runtime::transport::rabbitmq::redact_url(n),
                            args.stream
                        )
                    } else {
                        format!(
                            ", NATS {} (stream {})",
                            event_runtime::transport::nats::redact_url(n),
                            args.stream
                        )
                    })
                    .unwrap_or_default()
            );
            return ExitCode::FAILURE;
        }
    };
    let mut stdout = std::io::stdout().lock();
    let printed = write!(stdout, "{}", report::render(&report))
        .and_then(|()| writeln!(stdout, "{}", report.summary.line()))
        .and_then(|()| stdout.flush());
    if let Err(e) = printed {
        eprintln!("error: cannot write the report: {e}");
        return ExitCode::FAILURE;
    }
    let unpublished: u64 = report.relays.iter().map(|r| r.pending).sum();
    if unpublished > 0 {
        eprintln!(
            "error: {unpublished} events are not published to the broker yet (the relay is paused: the broker, its stream or exchange, or a queue bound to it is unavailable; see the warnings above); run orders again with the same --database to publish them"
        );
        return ExitCode::FAILURE;
    }
    if report.relay_dead_letters > 0 {
        eprintln!(
            "error: {} events never reached the broker: the relay's deliveries are in the dead letter queue; see `orders events dlq list --handler {}`",
            report.relay_dead_letters,
            report.relay.as_deref().unwrap_or("nats:…")
        );
        return ExitCode::FAILURE;
    }
    if report.projection_dead_letters > 0 {
        eprintln!(
            "error: {} deliveries to projection handlers are in the dead letter queue, so the totals are incomplete; see `orders events dlq list`",
            report.projection_dead_letters
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// `orders events …`: the runtime's operations tool, with this example's event types and
/// default database.
async fn events(argv: Vec<std::ffi::OsString>) -> ExitCode {
    let registry = match orders::registry() {
        Ok(registry) => registry,
        Err(e) => {
            eprintln!("error: {}", event_core::ErrorChain(&e));
            return ExitCode::FAILURE;
        }
    };
    // `events` takes the place of the program name: `orders events dlq list` runs `dlq list`.
    let topology = orders::topology(&Args::default());
    event_runtime::cli::run(
        argv.into_iter().skip(1),
        orders::cli_app(&registry, &topology),
    )
    .await
}

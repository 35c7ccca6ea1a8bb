//! Runnable programs for the domain-events framework.
//!
//! The example binaries under `examples/` are thin: each parses its arguments and calls the
//! library part here, so that the integration tests run the same code in-process.
//!
//! - [`orders`]: the main job. Imports a public retail data set (Superstore orders) into a
//!   database (SQLite by default, PostgreSQL too) through an `Order` aggregate, one unit of
//!   work of the transactional outbox per command, and seven durable handlers (projections,
//!   a confirmation sender, an ERP export whose refusals land in the dead letter queue), with
//!   simulated transient failures, at-least-once re-appends and crashes. Run it with
//!   `cargo run --release --example orders`; run it again and it reports the same totals.
#![warn(missing_docs, unreachable_pub)]

pub mod orders;

/// Logs the framework's lines (broker outages, paused destinations, dead letters) on standard
/// error, filtered by `RUST_LOG` when it is set (`RUST_LOG=info` adds retries,
/// `RUST_LOG=event_runtime=debug` more) and by `default` otherwise (`"warn"`). Call it once,
/// first thing in `main`.
pub fn init_logging(default: &str) {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default)),
        )
        .init();
}

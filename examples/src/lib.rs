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

/// Serves the runtime's metrics ([`event_runtime::METRICS`]) in the Prometheus text format at
/// `http://{addr}/metrics`, through `metrics-exporter-prometheus` installed as the global
/// recorder, with the delivery duration histogram's buckets. `addr` is `HOST:PORT`: an IP
/// address (`127.0.0.1:9091`, `[::1]:9091`) or a host name (`localhost:9091`, its first
/// address). Call it once, inside the tokio runtime (the listener runs on it).
///
/// # Errors
/// `addr` is not `HOST:PORT` or its host does not resolve, the address cannot be bound (in
/// use, not this machine's), or a recorder is installed already: the message says which.
pub fn serve_metrics(addr: &str) -> Result<(), String> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    use std::net::ToSocketAddrs;
    let resolved = addr
        .to_socket_addrs()
        .map_err(|e| format!("--metrics-addr {addr}: {e} (HOST:PORT, whose host resolves)"))?
        .next()
        .ok_or_else(|| format!("--metrics-addr {addr}: the host has no address"))?;
    let mut builder = PrometheusBuilder::new().with_http_listener(resolved);
    for m in event_runtime::METRICS {
        if let Some(buckets) = m.buckets {
            builder = builder
                .set_buckets_for_metric(Matcher::Full(m.name.to_owned()), buckets)
                .map_err(|e| format!("--metrics-addr {addr}: {e}"))?;
        }
    }
    builder
        .install()
        .map_err(|e| format!("--metrics-addr {addr}: {e}"))?;
    event_runtime::describe_metrics();
    Ok(())
}

/// Logs the framework's lines (broker outages, paused destinations, dead letters) on standard
/// error, filtered by `RUST_LOG` when it is set (`RUST_LOG=info` adds retries,
/// `RUST_LOG=event_runtime=debug` more) and by `default` otherwise (`"warn"`). Call it once,
/// first thing in `main`.
pub fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default))
        // lapin logs a message the broker returns as unroutable with its body: payloads stay
        // out of the log whatever `RUST_LOG` says (the relay logs the return itself, without
        // the body).
        .add_directive(
            "lapin::returned_messages=off"
                .parse()
                .expect("a valid directive"),
        );
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(filter)
        .init();
}

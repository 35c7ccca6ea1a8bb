//! The runtime of `event-core`: collects every event and handler of the program into a
//! validated [`Registry`], and dispatches envelopes to handlers with an idempotency guard and
//! failure isolation.
//!
//! ```
//! use std::sync::Mutex;
//! use event_core::{event_handler, DomainEvent, EventRecorder};
//! use event_runtime::Dispatcher;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Debug, Serialize, Deserialize, DomainEvent)]
//! #[event(name = "order.placed", version = 1)]
//! struct OrderPlaced {
//!     #[event(aggregate_id)]
//!     order_id: String,
//!     total_cents: u64,
//! }
//!
//! #[derive(Default)]
//! struct Revenue(Mutex<u64>);
//!
//! #[event_handler(priority = 1)]
//! fn add_revenue(event: &OrderPlaced, revenue: &Revenue) {
//!     *revenue.0.lock().unwrap() += event.total_cents;
//! }
//!
//! #[event_handler(priority = 2)]
//! async fn confirm(event: &OrderPlaced) -> Result<(), std::io::Error> {
//!     println!("confirming {}", event.order_id);
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dispatcher = Dispatcher::builder()
//!     .resource(Revenue::default())
//!     .expect_handlers(2)
//!     .build()?;
//!
//! let mut recorder = EventRecorder::new();
//! recorder.record(OrderPlaced { order_id: "A-1".into(), total_cents: 1250 });
//! let mut uow = dispatcher.unit_of_work();
//! uow.extend(recorder.take());
//! let reports = uow.commit().await?;
//! assert_eq!(reports[0].ran(), 2);
//! assert_eq!(*dispatcher.resource::<Revenue>().unwrap().0.lock().unwrap(), 1250);
//! # Ok(())
//! # }
//! ```
//!
//! # Durable delivery
//! [`Outbox`] carries events reliably over a [`Store`] (SQLite by default — feature `sqlite`,
//! a file or `sqlite::memory:`, no server — or PostgreSQL with the feature `postgres`):
//!
//! 1. [`Outbox::begin`] opens a unit of work over a database transaction ([`Tx`]); the
//!    application writes its state through [`OutboxUnitOfWork::tx`] and adds the events its
//!    aggregates recorded;
//! 2. [`OutboxUnitOfWork::commit`] appends one outbox row per event (an event id already
//!    present is skipped whole), runs the `in_transaction` handlers inside the transaction (an
//!    error rolls everything back), writes one delivery row per (event, after-commit handler),
//!    and COMMITs — nothing runs, and nothing leaves the process, before that;
//! 3. delivery workers ([`Outbox::spawn_workers`], or [`Outbox::drain`] /
//!    [`Outbox::deliver_batch`] in your own loop) claim runs of due deliveries — per
//!    (handler, aggregate), in sequence order — under a lease the worker renews while it works
//!    (PostgreSQL: `FOR UPDATE SKIP LOCKED`). A handler that takes `&mut Tx` (or
//!    `&mut sqlx::SqliteConnection` / `&mut sqlx::PgConnection`) runs inside the batch's
//!    transaction, in a savepoint of its own, and its completion commits with its writes, so
//!    its database effects happen exactly once. A handler that takes no transaction (an HTTP
//!    call, a mail) runs outside any transaction, concurrently across aggregates up to
//!    [`OutboxConfig::concurrency`], and is settled as it finishes: a crash repeats only the
//!    calls in flight. Every run has a time limit ([`OutboxConfig::handler_timeout`]).
//!
//! Delivery is at-least-once per (event, handler), in per-aggregate sequence order per handler
//! (opt out with `#[event_handler(unordered)]`). The order comes from the envelope's sequence:
//! record events through an [`event_core::EventRecorder`] created with
//! `EventRecorder::at_version(v)`, where `v` is the sequence of the aggregate's last event,
//! kept with the aggregate's state (a new aggregate starts at 0). Two commits that record the
//! same (aggregate, sequence) conflict — [`StoreError::Conflict`], optimistic concurrency:
//! reload and retry. An envelope with sequence 0 (`Envelope::new` without `with_sequence`) is
//! neither ordered nor checked. A worker claims only the deliveries of handlers its process
//! has, so an older deploy or another service sharing the tables leaves the others alone. A transient failure or a panic is retried
//! with exponential backoff and full jitter ([`RetryPolicy`]); a permanent error, an
//! undecodable payload, an unknown event name or version, or the last attempt's failure puts
//! the delivery in the dead letter queue ([`Store::dead_letters`]), which keeps the envelope
//! byte for byte. Nothing is replayed automatically: [`Store::resolve_dead_letters`] replays
//! or purges, with an audit row. Completed deliveries are purged after
//! [`OutboxConfig::retention`], which must exceed the longest retry horizon.
//!
//! # Observability
//! **Metrics** go through the `metrics` facade: install the recorder of your choice (the
//! `metrics-exporter-prometheus` crate serves them to Prometheus; the `orders` and `billing`
//! examples do it on `--metrics-addr`), then call [`describe_metrics`] for the units and help
//! texts. [`METRICS`] lists every one with its kind, unit and labels, and gives the buckets
//! to export the histogram with ([`DELIVERY_DURATION_BUCKETS`]: the Prometheus exporter
//! renders a summary unless buckets are set). Labels name a destination (`destination`: a
//! handler or a transport's relay), an inbox group or a failure reason — never a payload
//! value.
//!
//! ```no_run
//! use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // `GET http://127.0.0.1:9091/metrics`, served on this tokio runtime.
//! let mut builder = PrometheusBuilder::new().with_http_listener(([127, 0, 0, 1], 9091));
//! for m in event_runtime::METRICS {
//!     if let Some(buckets) = m.buckets {
//!         builder = builder.set_buckets_for_metric(Matcher::Full(m.name.to_owned()), buckets)?;
//!     }
//! }
//! builder.install()?;
//! event_runtime::describe_metrics();
//! # Ok(())
//! # }
//! ```
//!
//! | metric | kind | labels | what |
//! |---|---|---|---|
//! | `events_outbox_backlog` | gauge | | pending deliveries |
//! | `events_outbox_oldest_pending_age_seconds` | gauge | | age of the oldest pending delivery since its commit (0: none) |
//! | `events_dead_letters` | gauge | | open dead letters |
//! | `events_destination_oldest_pending_age_seconds` | gauge | `destination` | the same per destination: for a relay, its lag |
//! | `events_destination_paused` | gauge | `destination` | 1 while paused, else 0 |
//! | `events_circuit_breaker_open` | gauge | `destination` | 1 while this process holds the handler's breaker open ([`CircuitBreaker`]) |
//! | `events_circuit_breaker_trips_total` | counter | `destination` | times this process opened the breaker |
//! | `events_inbox_held` | gauge | | received events waiting for their predecessor |
//! | `events_inbox_open_gaps` | gauge | | open gaps ([`inbox`]) |
//! | `events_deliveries_completed_total` | counter | `destination` | deliveries completed |
//! | `events_deliveries_failed_total` | counter | `destination` | failed attempts |
//! | `events_delivery_retries_total` | counter | `destination` | failed attempts to be retried |
//! | `events_delivery_timeouts_total` | counter | `destination` | attempts over the time limit |
//! | `events_deliveries_dead_lettered_total` | counter | `destination` | deliveries dead-lettered |
//! | `events_delivery_lease_lost_total` | counter | `destination` | deliveries another worker took over |
//! | `events_delivery_duration_seconds` | histogram | `destination` | duration of a completed attempt |
//! | `events_inbox_gaps_opened_total` | counter | | gaps opened |
//! | `events_inbox_invalid_prevsequence_total` | counter | | `prevsequence` naming no earlier event |
//! | `events_nats_published_total`, `events_nats_published_duplicates_total` | counter | | relay publications acknowledged; of them, duplicates |
//! | `events_nats_publish_failures_total` | counter | `reason` | relay publications that failed |
//! | `events_nats_in_flight` | gauge | | publications awaiting their acknowledgement |
//! | `events_nats_received_total`, `events_nats_duplicates_total`, `events_nats_dead_lettered_total` | counter | | inbox: fetched; already committed; dead-lettered |
//! | `events_nats_acked_total`, `events_nats_terminated_total`, `events_nats_naked_total` | counter | | inbox: acknowledged; terminated; nak'ed after a failed commit |
//! | `events_nats_partition_mismatches_total` | counter | | messages on another partition than their aggregate's |
//! | `events_nats_group_partitions_held` | gauge | `group` | partitions this instance holds |
//! | `events_rabbitmq_group_partitions_held` | gauge | `group` | partition queues this instance of an `AmqpGroup` holds |
//! | `events_rabbitmq_parked_messages` | gauge | `queue` | messages in a RabbitMQ parking queue (given up on after the delivery limit) |
//!
//! The gauges of the outbox are set by the workers every [`OutboxConfig::metrics_interval`]
//! (5 s) from a query of pending deliveries, held events and open gaps only
//! ([`Store::backlog`]; [`Outbox::update_gauges`] for your own delivery loop). They describe
//! the whole store, so every worker process sharing it reports the same values: aggregate them
//! across processes with `max`, not `sum`. A destination's counters are registered at 0 when
//! the workers first see it, a relay's when it is checked, an inbox's when it is created, so
//! that a scrape tells "none" from "not reported".
//!
//! **Tracing**: each delivery attempt runs in a `tracing` span `delivery` (event name, event
//! id, handler, attempt), a relay's publication in `publish`, a NATS inbox's batch in
//! `receive` and its acknowledgement in `settle`. With the feature `otel` and a
//! `tracing-opentelemetry` layer, they are spans of the OpenTelemetry messaging semantic
//! conventions v1.44, and a trace runs from the command to the remote handler:
//!
//! - at commit, each new envelope without a trace context gets one when the unit of work
//!   commits inside a traced span: a `create {event name}` span (PRODUCER, child of the
//!   current span) whose context is stored in the envelope as `traceparent`/`tracestate` (the
//!   CloudEvents distributed tracing extension) — with the outbox row, so that a delivery
//!   hours later still joins the command's trace. A received envelope keeps its producer's;
//! - each delivery attempt is `process {destination}` (CONSUMER), a child of the creation
//!   context and linked to it: a retry is a sibling of the first attempt, not its child;
//! - a relay's publication is `send {subject}` (CLIENT: the message's creation context is
//!   the create span's), linked to the creation context; a NATS inbox's fetched batch is
//!   `receive {stream}` (CONSUMER) and its acknowledgement `settle {stream}` (CLIENT), each
//!   linked to every message's creation context;
//! - attributes: `messaging.system` (`outbox` for the outbox's own spans; `nats` for the
//!   transport's — neither is a well-known value of the conventions' registry, which allows
//!   custom ones), `messaging.operation.type` and `messaging.operation.name` (the operation:
//!   `create`, `send`, `receive`, `process`, `settle`), `messaging.destination.name` (event
//!   name, destination, subject or stream), `messaging.message.id` (the event id),
//!   `messaging.consumer.group.name` (the destination; the durable consumer),
//!   `messaging.batch.message_count`, and on failure `error.type` (`transient`, `permanent`,
//!   `panic`, `timeout`, `unavailable`, a dead letter reason, `store`, `ack_unconfirmed`)
//!   with status ERROR; a create span of an event the outbox already held has
//!   `messaging.outbox.duplicate` = true, and those of a refused commit `error.type`
//!   (`conflict`, `aborted`, `too_large`, `store`…).
//!
//! An envelope's own valid context (`Envelope::with_trace_context`, or a received event's) is
//! kept and no create span is made for it; one that is not a valid W3C `traceparent` is
//! replaced at commit, with a warning, and ignored wherever it is read. With the feature but
//! no OpenTelemetry layer, nothing is stored and the spans are plain `tracing` spans (which
//! then show the fields `otel.name` and `otel.kind` in a log line's span context).
//!
//! # Transports
//! With the feature `nats`, `transport::nats` carries events between services through NATS
//! JetStream: `NatsRelay` is a [`Destination`] that publishes committed events (CloudEvents
//! structured mode, `Nats-Msg-Id` = the event id) and completes each delivery on the broker's
//! acknowledgement, and `NatsInbox` commits what a consuming service receives into that
//! service's own outbox before acknowledging it, so its handlers run with the same guarantees.
//! What an inbox does with a received batch is transport-neutral: the [`inbox`] core
//! ([`Outbox::receive`]), which another transport's inbox calls the same way.
//!
//! # Other databases
//! The store is a boundary a third backend implements: the core [`store::Backend`] (with its
//! supertrait [`store::backend::ChainStore`]) and the optional capabilities
//! ([`store::backend::Inspection`] and its siblings) an operator's tool uses. Wrap it with
//! [`Store::from_backend`] and prove it with one line of the conformance suite
//! (`event_runtime::conformance_suite!`, module `testing::conformance`, feature `testing`).
//! What is SQLite's or PostgreSQL's own lives in [`store::sqlite`] and [`store::postgres`]
//! (a pool of your own, the native connection of a transaction).
//!
//! # Operations
//! The `events` command-line tool (module `cli` and the `events` binary, feature `cli`) lists,
//! shows, replays and purges dead letters, prints outbox statistics, and — embedded in your
//! application's binary so that it knows your event types — prints the schema catalog and
//! checks, before a deploy, that every pending delivery and dead letter still decodes.
//!
//! # Protection
//! - **A circuit breaker per handler** ([`CircuitBreaker`], opt-in with
//!   [`OutboxConfig::circuit_breaker`]): on an outage downstream — transient failures of
//!   several distinct events — the handler's deliveries pause in the store for every process,
//!   using no attempts; one delivery store-wide probes after the cool-down.
//! - **Schema validation at the boundary** ([`DispatcherBuilder::validate_schemas`], opt-in):
//!   an envelope from outside the process whose payload breaks its JSON Schema is
//!   [`DispatchError::Invalid`], or an inbox dead letter [`invalid`](DeadLetterReason::Invalid)
//!   naming the JSON pointer of the first violation ([`schema::SchemaViolation`]).
//! - **Private payloads** ([`privacy`]): no payload value in logs, span attributes or metric
//!   labels — decode errors withhold what serde quotes ([`event_core::JsonError`]); fields
//!   marked `#[event(sensitive)]` are masked as `"***"` wherever the `events` tool prints a
//!   payload, which it does only with `--payload`.
//!
//! # Schema evolution
//! An event is (name, version); each version is its own type, and a newer one declares
//! `#[event(version = 2, upcast_from = OrderPlacedV1)]` with an `impl From<OrderPlacedV1>`
//! (see [`event_core::Upcaster`]). The runtime's rules:
//!
//! - **Handlers take the newest version.** An envelope of an older version is upcast step by
//!   step (v1 → v2 → v3, a copy; the metadata and event id are the original's) before the
//!   handlers of the newest version run: in [`Dispatcher::dispatch`],
//!   [`dispatch_raw`](Dispatcher::dispatch_raw) / [`dispatch_json`](Dispatcher::dispatch_json),
//!   both units of work, and durable delivery, where committing a v1 event creates deliveries
//!   for the handlers of the newest version and the worker upcasts the stored envelope before
//!   calling each. The outbox and the dead letter queue keep the event as it was recorded.
//!   Typed dispatch of the newest version pays nothing for this.
//! - **Never downcast.** A handler of an older version than the newest registered is a
//!   start-up error ([`RegistryError::HandlerTakesOldVersion`]) rather than a handler that
//!   silently misses every event recorded as the newer version.
//! - **One chain per name, without gaps**, checked at start-up: every registered version but
//!   the lowest upcasts from the version registered just below it
//!   ([`RegistryError::MissingUpcast`], [`RegistryError::UpcastGap`]); no version is upcast from
//!   twice ([`RegistryError::DuplicateUpcast`]). The version a type upcasts from is registered
//!   with it, as a handler's event is: a registry that knows v3 decodes v1 and v2.
//!   [`Registry::upcast`] and [`Registry::decode_latest`] do the same conversion by hand.
//!
//! The decoding policy (unknown fields ignored unless `#[event(deny_unknown_fields)]`, serde
//! defaults for missing fields, exact integers beyond 2^53) is stated in
//! [`event_core`'s documentation](event_core#decoding-policy). An envelope that does not decode
//! is never a crash and never dropped: [`Dispatcher::dispatch_raw`] returns the error, and a
//! delivery goes to the dead letter queue with the reason — `unknown_event` for a name or a
//! version this code does not know (a newer producer, or a newer instance during a rolling
//! deploy), `undecodable` for a payload that does not fit (a missing required field, named in
//! the error chain) — so that replaying it after deploying code that knows the version
//! succeeds.
//!
//! [`schema::Catalog`] lists every registered (name, version) with its JSON Schema (for events that
//! derive `schemars::JsonSchema`); [`schema::CatalogCheck`] compares it with a committed snapshot under
//! the Confluent Schema Registry compatibility modes ([`schema::Compatibility`]), so that an
//! incompatible change fails a test before it ships.
//!
//! # Start-up validation
//! [`DispatcherBuilder::build`] checks, before any event flows: no two Rust types share an
//! event (name, version); the versions of each event form one upcast chain without gaps, and
//! every handler takes the newest version; handler names (the idempotency keys) are unique;
//! every resource a handler takes was provided; and, with
//! [`DispatcherBuilder::expect_handlers`], that at least that many handlers are registered.
//! Each error names the types or handlers involved.
//!
//! # Ordering
//! The handlers of an event run one after another, by `priority` (lower first), then by name.
//! Link order never matters.
//!
//! # Linking
//! Registration goes through [`inventory`](https://docs.rs/inventory), which collects statics
//! from every crate linked into the final binary. Rust links a dependency only when the binary
//! uses something from it: a crate that holds nothing but `#[event_handler]` functions, which
//! the binary never names, is left out, and its handlers silently do not register. Force it in
//! with one line in the binary (or any crate it uses):
//!
//! ```text
//! use my_handlers_crate as _;
//! ```
//!
//! and guard against the mistake with `.expect_handlers(n)`, which makes `build` fail with
//! [`RegistryError::TooFewHandlers`] listing the handlers it did find. Where `inventory` cannot
//! run (some embedded and WebAssembly targets), register by hand with
//! [`Dispatcher::builder_empty`], [`DispatcherBuilder::event`] and
//! [`DispatcherBuilder::handler`].
#![warn(missing_docs, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings))))]

#[cfg(feature = "cli")]
#[cfg_attr(docsrs, doc(cfg(feature = "cli")))]
pub mod cli;
mod dispatch;
pub mod inbox;
mod outbox;
pub mod privacy;
pub mod schema;
pub mod store;
mod telemetry;
#[cfg(any(feature = "testing", feature = "fault-injection"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "testing", feature = "fault-injection")))
)]
pub mod testing;
pub mod topology;
pub mod transport;

pub use dispatch::{
    CommitError, Dispatch, DispatchError, DispatchReport, Dispatcher, DispatcherBuilder,
    HandlerErrorSource, HandlerOutcome, Outcome, Outcomes, OutcomesIter, PanicMessage, Registry,
    RegistryBuilder, RegistryError, UnitOfWork, DEFAULT_GUARD_CAPACITY,
};
pub use outbox::retry::RetryPolicy;
pub use outbox::{
    BatchReport, CircuitBreaker, Clock, CommitReport, ConfigError, Delivery, DeliveryError,
    Destination, HandlerOptions, Outbox, OutboxBuilder, OutboxConfig, OutboxError,
    OutboxUnitOfWork, PurgeReport, Routing, SystemClock, Workers, MAX_ERROR_BYTES, MIN_LEASE,
};
pub use store::{
    AuditEntry, Backlog, CatalogRecord, ConnectOptions, DatabaseError, DeadLetter,
    DeadLetterFilter, DeadLetterReason, DestinationBacklog, DestinationReport, FromSql,
    GroupMember, GroupView, HandlerStats, InboxIdentity, OutboxStats, PartitionLease,
    PausedDestination, Query, RepublishReport, RepublishSelection, Resolution, Row, SqlValue,
    Store, StoreError, ToSql, Tx,
};
pub use telemetry::catalog::{
    describe_metrics, Metric, MetricKind, DELIVERY_DURATION_BUCKETS, METRICS,
};
/// Re-exported: the token [`Outbox::spawn_workers_with`] stops on.
pub use tokio_util::sync::CancellationToken;

/// Re-exported so that handlers can name `sqlx::SqliteConnection` / `sqlx::PgConnection`
/// without a version mismatch.
pub use sqlx;

// The README's examples are compiled and run as doc tests (with the features they use:
// `testing` for the quick start's harness, `cli`, `nats` and `rabbitmq` for the transports and
// the embedded tool; `cargo test --workspace` enables them all).
#[cfg(all(
    doctest,
    feature = "testing",
    feature = "cli",
    feature = "nats",
    feature = "rabbitmq"
))]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

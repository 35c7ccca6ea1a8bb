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
//! # Start-up validation
//! [`DispatcherBuilder::build`] checks, before any event flows: no two Rust types share an
//! event (name, version); handler names (the idempotency keys) are unique; every resource a
//! handler takes was provided; and, with [`DispatcherBuilder::expect_handlers`], that at least
//! that many handlers are registered. Each error names the types or handlers involved.
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
#![doc(test(attr(deny(warnings))))]

mod catalog;
#[cfg(feature = "cli")]
pub mod cli;
mod compat;
mod dispatcher;
mod guard;
mod outbox;
mod registry;
mod report;
mod retry;
mod store;
mod uow;

pub use catalog::{Catalog, CatalogCheck, CatalogError, CatalogReport, BLESS_VAR};
pub use compat::{
    check_catalog, check_schema, CatalogEntry, Compatibility, Direction, ParseCompatibilityError,
    Rule, Violation,
};
pub use dispatcher::{DispatchError, Dispatcher, DispatcherBuilder};
pub use guard::DEFAULT_GUARD_CAPACITY;
pub use outbox::{
    BatchReport, CommitReport, FaultAction, FaultPoint, Outbox, OutboxBuilder, OutboxConfig,
    OutboxError, OutboxUnitOfWork, Workers,
};
pub use registry::{Registry, RegistryBuilder, RegistryError};
pub use report::{DispatchReport, HandlerOutcome, Outcome};
pub use retry::RetryPolicy;
pub use store::{
    AuditEntry, BackendKind, DeadLetter, DeadLetterFilter, HandlerStats, OutboxStats, Resolution,
    SqlValue, Store, StoreError, Tx,
};
pub use uow::{CommitError, HandlerErrorSource, UnitOfWork};

/// Re-exported so that handlers can name `sqlx::SqliteConnection` / `sqlx::PgConnection`
/// without a version mismatch.
pub use sqlx;

// The README's examples are compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

//! The outbox layer: the store-backed unit of work (transactional outbox), the delivery
//! engine that claims runs of deliveries under a renewed lease and delivers them to their
//! destinations (local handlers, transports' relays), retries with backoff, the dead letter
//! decisions, pauses, and the workers that run it all. The SQL lives in `store`, the handler
//! calls in `dispatch`.

/// Stops at a fault point when the crash-safety suite asks (feature `fault-injection`); a
/// no-op otherwise. `fault!(self, Point, tx)` passes the open transaction through.
macro_rules! fault {
    ($outbox:expr, $point:ident, $tx:expr) => {{
        #[cfg(feature = "fault-injection")]
        let tx = $outbox
            .inject_tx(crate::testing::FaultPoint::$point, $tx)
            .await?;
        #[cfg(not(feature = "fault-injection"))]
        let tx = $tx;
        tx
    }};
    ($outbox:expr, $point:ident) => {{
        #[cfg(feature = "fault-injection")]
        $outbox.inject(crate::testing::FaultPoint::$point).await?;
    }};
}

mod breaker;
pub(crate) mod clock;
mod commit;
mod config;
mod delivery_loop;
pub(crate) mod destination;
mod engine;
mod error;
mod gauges;
mod lease;
pub(crate) mod pause;
mod resolve;
mod retention;
pub(crate) mod retry;
mod runs;
mod settle;
pub(crate) mod text;
mod unregistered;
mod workers;

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

pub use breaker::CircuitBreaker;
pub use clock::{Clock, SystemClock};
pub use commit::{CommitReport, OutboxUnitOfWork};
pub use config::{HandlerOptions, OutboxConfig, MIN_LEASE};
pub use destination::{Delivery, DeliveryError, Destination, Routing};
pub use error::{ConfigError, OutboxError};
pub use retention::PurgeReport;
pub use text::MAX_ERROR_BYTES;
pub use workers::Workers;

use self::destination::Resolved;
use self::resolve::Resolver;
use self::retry::RetryPolicy;
use crate::dispatch::{Dispatcher, DispatcherBuilder};
use crate::store::backend::Route;
use crate::store::{Store, Tx};

#[cfg(feature = "fault-injection")]
type FaultHook =
    Arc<dyn Fn(crate::testing::FaultPoint) -> crate::testing::FaultAction + Send + Sync>;

pub(crate) struct Inner {
    pub(crate) store: Store,
    pub(crate) dispatcher: Dispatcher,
    pub(crate) config: OutboxConfig,
    pub(crate) clock: Arc<dyn Clock>,
    /// Every destination this process delivers to, by name.
    pub(crate) destinations: HashMap<String, Arc<Resolved>>,
    /// The destinations of each event type, as written at commit. An event of an older
    /// version goes to the handlers of the newest version of its name: the engine upcasts
    /// it before calling them.
    pub(crate) routes: HashMap<TypeId, Vec<Route>>,
    /// The destinations this process claims deliveries of: an instance without a handler
    /// (an older deploy, another service sharing the tables) leaves its deliveries to one
    /// that has it.
    pub(crate) claimable: Vec<String>,
    pub(crate) wake: Notify,
    pub(crate) rng: Mutex<fastrand::Rng>,
    /// The lease tokens of this process's running delivery loops.
    pub(crate) live_leases: Mutex<Vec<String>>,
    /// Destinations this process paused as unavailable: when to look again, how often.
    pub(crate) runtime_paused: Mutex<HashMap<String, pause::Outage>>,
    /// The circuit breakers of this process's handlers.
    pub(crate) breakers: breaker::Breakers,
    /// Whether this outbox recorded its event types in the database's catalog.
    pub(crate) catalog_recorded: std::sync::atomic::AtomicBool,
    #[cfg(feature = "fault-injection")]
    pub(crate) fault: Option<FaultHook>,
}

/// The transactional outbox and its delivery engine over one [`Store`].
///
/// ```
/// use std::time::Duration;
/// use event_core::{event_handler, DomainEvent, EventRecorder};
/// use event_runtime::{Outbox, Store, Tx, SqlValue};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, DomainEvent)]
/// #[event(name = "doc.account_opened", version = 1)]
/// struct Opened { #[event(aggregate_id)] account: String }
///
/// // Runs after COMMIT, durably; its writes commit with its delivery record: exactly once.
/// #[event_handler]
/// async fn count_accounts(_: &Opened, tx: &mut Tx) -> Result<(), event_runtime::StoreError> {
///     tx.execute("UPDATE doc_counts SET n = n + 1", &[]).await?;
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let path = std::env::temp_dir().join(format!("outbox-doc-{}.db", uuid::Uuid::now_v7()));
/// # let url = format!("sqlite://{}", path.display());
/// let store = Store::connect(&url).await?;
/// let outbox = Outbox::builder(store).build()?;
///
/// let mut uow = outbox.begin().await?;
/// uow.tx().execute("CREATE TABLE doc_counts (n BIGINT NOT NULL)", &[]).await?;
/// uow.tx().execute("INSERT INTO doc_counts VALUES ($1)", &[SqlValue::Int(0)]).await?;
/// let mut recorder = EventRecorder::new();
/// recorder.record(Opened { account: "acc-1".into() });
/// uow.extend(recorder.take());
/// uow.commit().await?;
///
/// outbox.drain(Duration::from_secs(10)).await?;
/// let mut tx = outbox.store().begin().await?;
/// assert_eq!(tx.fetch_i64("SELECT n FROM doc_counts", &[]).await?, Some(1));
/// # drop(tx); std::fs::remove_file(path).ok();
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Outbox {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("store", &self.inner.store.backend_name())
            .field("dispatcher", &self.inner.dispatcher)
            .field("destinations", &self.inner.claimable)
            .field("config", &self.inner.config)
            .finish()
    }
}

/// Configures an [`Outbox`].
pub struct OutboxBuilder {
    store: Store,
    dispatcher: DispatcherBuilder,
    config: OutboxConfig,
    options: HashMap<String, HandlerOptions>,
    external: Vec<Arc<dyn Destination>>,
    clock: Arc<dyn Clock>,
    #[cfg(feature = "fault-injection")]
    fault: Option<FaultHook>,
}

impl std::fmt::Debug for OutboxBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxBuilder")
            .field("dispatcher", &self.dispatcher)
            .field("config", &self.config)
            .field("options", &self.options)
            .finish()
    }
}

impl OutboxBuilder {
    /// Replaces the dispatcher configuration (resources, expected handler count, hand
    /// registration). The idempotency guard is turned off: the store deduplicates.
    pub fn dispatcher(mut self, dispatcher: DispatcherBuilder) -> Self {
        self.dispatcher = dispatcher;
        self
    }

    /// Validates the envelopes this outbox's inbox receives against their JSON Schema (see
    /// [`DispatcherBuilder::validate_schemas`]). Off by default.
    pub fn validate_schemas(mut self, on: bool) -> Self {
        self.dispatcher = self.dispatcher.validate_schemas(on);
        self
    }

    /// Provides a resource to handlers (see [`DispatcherBuilder::resource`]).
    pub fn resource<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.dispatcher = self.dispatcher.resource(value);
        self
    }

    /// Provides a shared resource (see [`DispatcherBuilder::resource_arc`]).
    pub fn resource_arc<T: Send + Sync + 'static>(mut self, value: Arc<T>) -> Self {
        self.dispatcher = self.dispatcher.resource_arc(value);
        self
    }

    /// Fails [`build`](Self::build) when fewer handlers are registered.
    pub fn expect_handlers(mut self, count: usize) -> Self {
        self.dispatcher = self.dispatcher.expect_handlers(count);
        self
    }

    /// Sets the delivery configuration.
    pub fn config(mut self, config: OutboxConfig) -> Self {
        self.config = config;
        self
    }

    /// Sets the retry policy of the handler (or destination) named `handler`.
    pub fn retry_policy(self, handler: impl Into<String>, policy: RetryPolicy) -> Self {
        let handler = handler.into();
        let options = self.options.get(&handler).copied().unwrap_or_default();
        self.handler_options(handler, options.retry(policy))
    }

    /// Sets the options of the handler (or destination) named `handler`: its retry policy,
    /// its time limit, its concurrency.
    pub fn handler_options(mut self, handler: impl Into<String>, options: HandlerOptions) -> Self {
        self.options.insert(handler.into(), options);
        self
    }

    /// Adds a transport's destination (a relay to a broker): the events it routes get a
    /// delivery to it at commit.
    pub fn destination(mut self, destination: Arc<dyn Destination>) -> Self {
        self.external.push(destination);
        self
    }

    /// Sets the clock every stamp the outbox writes comes from (default [`SystemClock`]).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Test-only: calls `hook` at every [`FaultPoint`](crate::testing::FaultPoint).
    #[cfg(feature = "fault-injection")]
    #[cfg_attr(docsrs, doc(cfg(feature = "fault-injection")))]
    pub fn fault_injection(
        mut self,
        hook: impl Fn(crate::testing::FaultPoint) -> crate::testing::FaultAction + Send + Sync + 'static,
    ) -> Self {
        self.fault = Some(Arc::new(hook));
        self
    }

    /// Validates and builds.
    ///
    /// # Errors
    /// [`OutboxError::Config`]: [`ConfigError::Registry`] for a registry error (see
    /// [`RegistryError`](crate::RegistryError)); [`ConfigError::NotPositive`] or
    /// [`ConfigError::LeaseTooShort`] for the configuration; [`ConfigError::UnknownDestination`],
    /// [`ConfigError::ZeroAttempts`] or [`ConfigError::DestinationNotPositive`] for handler
    /// options; [`ConfigError::DuplicateDestination`]; [`ConfigError::RetentionTooShort`]
    /// when the retention is not longer than the longest retry horizon.
    pub fn build(self) -> Result<Outbox, OutboxError> {
        let dispatcher = outbox_dispatcher(self.dispatcher, &self.store)?;
        self.config.validate()?;
        let resolver = Resolver {
            config: &self.config,
            options: &self.options,
            external: &self.external,
        };
        let destinations = resolver.destinations(&dispatcher)?;
        resolver.check(&destinations)?;
        let routes = resolver.routes(dispatcher.registry());
        let mut claimable: Vec<String> = destinations.keys().cloned().collect();
        claimable.sort();
        Ok(Outbox {
            inner: Arc::new(Inner {
                store: self.store,
                dispatcher,
                config: self.config,
                clock: self.clock,
                destinations,
                routes,
                claimable,
                wake: Notify::new(),
                rng: Mutex::new(fastrand::Rng::new()),
                runtime_paused: Mutex::new(HashMap::new()),
                breakers: breaker::Breakers::default(),
                catalog_recorded: std::sync::atomic::AtomicBool::new(false),
                live_leases: Mutex::new(Vec::new()),
                #[cfg(feature = "fault-injection")]
                fault: self.fault,
            }),
        })
    }
}

/// The dispatcher of an outbox: without the idempotency guard (the store deduplicates), and
/// with the transaction types the store can hand to handlers.
fn outbox_dispatcher(
    dispatcher: DispatcherBuilder,
    store: &Store,
) -> Result<Dispatcher, ConfigError> {
    let mut tx_types = vec![TypeId::of::<Tx>()];
    tx_types.extend(store.backend().native_transaction_types());
    dispatcher
        .idempotency_capacity(0)
        .provide_transactions(&tx_types)
        .build()
        .map_err(ConfigError::from)
}

/// What delivery did: one claim ([`Outbox::deliver_batch`]) or a drain.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Deliveries claimed.
    pub claimed: usize,
    /// Completed.
    pub completed: usize,
    /// Scheduled for a retry.
    pub retried: usize,
    /// Moved to the dead letter queue.
    pub dead_lettered: usize,
    /// Taken over by another worker (this worker's lease had lapsed); they run there.
    pub lease_lost: usize,
    /// Given back because a handler met a deadlock or serialization failure (the batch was
    /// rolled back; they are due again at once and the attempt does not count).
    pub conflicts: usize,
}

impl std::ops::AddAssign for BatchReport {
    fn add_assign(&mut self, o: Self) {
        self.claimed += o.claimed;
        self.completed += o.completed;
        self.retried += o.retried;
        self.dead_lettered += o.dead_lettered;
        self.lease_lost += o.lease_lost;
        self.conflicts += o.conflicts;
    }
}

impl Outbox {
    /// A builder over every event and handler registered through `inventory`.
    pub fn builder(store: Store) -> OutboxBuilder {
        OutboxBuilder {
            store,
            dispatcher: Dispatcher::builder(),
            config: OutboxConfig::default(),
            options: HashMap::new(),
            external: Vec::new(),
            clock: Arc::new(SystemClock),
            #[cfg(feature = "fault-injection")]
            fault: None,
        }
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// The dispatcher (guard off).
    pub fn dispatcher(&self) -> &Dispatcher {
        &self.inner.dispatcher
    }

    /// The configuration.
    pub fn config(&self) -> &OutboxConfig {
        &self.inner.config
    }

    /// Records this outbox's event types in the database's catalog ([`Store::record_catalog`]):
    /// their schemas and the fields marked `#[event(sensitive)]`, which the standalone `events`
    /// tool masks by. The workers of [`spawn_workers`](Self::spawn_workers) do it when they
    /// start, and [`receive`](Self::receive) before its first batch; call it yourself when
    /// you do neither.
    ///
    /// # Errors
    /// [`OutboxError::Store`] when the database refuses it.
    ///
    /// # Cancel safety
    /// Cancel safe: one transaction; dropped before its COMMIT, nothing is recorded.
    pub async fn record_catalog(&self) -> Result<(), OutboxError> {
        let records: Vec<_> = self
            .dispatcher()
            .registry()
            .events()
            .iter()
            .map(crate::privacy::record_of)
            .collect();
        self.inner.store.record_catalog(&records).await?;
        self.inner
            .catalog_recorded
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// [`record_catalog`](Self::record_catalog) once per outbox, a failure logged (what it
    /// protects is the operator's tool, not the delivery).
    pub(crate) async fn record_catalog_once(&self) {
        if self
            .inner
            .catalog_recorded
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        if let Err(e) = self.record_catalog().await {
            tracing::warn!(error = %event_core::ErrorChain(&e), "recording the event catalog failed; the standalone `events` tool masks no field of these types until it is");
        }
    }

    /// The destinations this outbox delivers to: its after-commit handlers and its
    /// transports' destinations, by name.
    pub fn destinations(&self) -> &[String] {
        &self.inner.claimable
    }

    /// The clock the outbox stamps with.
    pub fn clock(&self) -> &dyn Clock {
        &*self.inner.clock
    }

    /// Begins a unit of work: a store transaction the application writes its state through,
    /// and the events to commit with it.
    ///
    /// # Errors
    /// [`OutboxError::Store`] when no transaction can be begun.
    ///
    /// # Cancel safety
    /// Cancel safe: a transaction begun and dropped is rolled back.
    pub async fn begin(&self) -> Result<OutboxUnitOfWork<'_>, OutboxError> {
        Ok(OutboxUnitOfWork::new(self, self.inner.store.begin().await?))
    }

    #[cfg(feature = "fault-injection")]
    fn fault_action(&self, point: crate::testing::FaultPoint) -> crate::testing::FaultAction {
        self.inner
            .fault
            .as_ref()
            .map_or(crate::testing::FaultAction::Continue, |f| f(point))
    }

    #[cfg(feature = "fault-injection")]
    pub(crate) async fn inject_tx(
        &self,
        point: crate::testing::FaultPoint,
        tx: Tx,
    ) -> Result<Tx, OutboxError> {
        use crate::testing::FaultAction;
        match self.fault_action(point) {
            FaultAction::Continue => Ok(tx),
            FaultAction::Pause(wait) => {
                tokio::time::sleep(wait).await;
                Ok(tx)
            }
            // Abandon the transaction as a dying process would.
            FaultAction::Crash => {
                tx.into_backend().abandon(false).await;
                Err(OutboxError::Injected(point))
            }
            FaultAction::DropConnection => {
                tx.into_backend().abandon(true).await;
                Err(OutboxError::Injected(point))
            }
        }
    }

    #[cfg(feature = "fault-injection")]
    pub(crate) async fn inject(
        &self,
        point: crate::testing::FaultPoint,
    ) -> Result<(), OutboxError> {
        match self.fault_action(point) {
            crate::testing::FaultAction::Continue => Ok(()),
            crate::testing::FaultAction::Pause(wait) => {
                tokio::time::sleep(wait).await;
                Ok(())
            }
            _ => Err(OutboxError::Injected(point)),
        }
    }
}

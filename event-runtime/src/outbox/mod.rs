//! Durable delivery: the store-backed unit of work (transactional outbox) and the delivery
//! workers that claim, run, retry and dead-letter each (event, handler) pair. The SQL lives in
//! `store`; the handler calls in `dispatcher`.

pub(crate) mod retry;

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use event_core::{AnyEnvelope, DecodeError, DeliveryMode, DomainEvent, Envelope, RawEnvelope};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tracing::Instrument;
use uuid::Uuid;

use crate::dispatch::dispatcher::{Dispatcher, DispatcherBuilder, Phase};
use crate::dispatch::registry::RegistryError;
use crate::dispatch::report::{DispatchReport, Outcome};
use crate::dispatch::uow::CommitError;
use crate::outbox::retry::RetryPolicy;
use crate::store::{now_ms, Claimed, OutboxRow, Store, StoreError, Tx};

/// Errors of the outbox runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An in-transaction handler failed: the transaction was rolled back, nothing was written.
    #[error(transparent)]
    Aborted(Box<CommitError>),
    /// An event's payload could not be serialised.
    #[error("event {event_id} ({name}) cannot be serialised: {source}")]
    Encode {
        /// The event id.
        event_id: Uuid,
        /// The event name.
        name: &'static str,
        /// serde's error.
        #[source]
        source: serde_json::Error,
    },
    /// The configuration is invalid.
    #[error("invalid outbox configuration: {0}")]
    Config(String),
    /// An envelope is larger than [`OutboxConfig::max_envelope_bytes`]; the commit was rolled
    /// back.
    #[error("event {event_id} ({name}) is {bytes} bytes as JSON, over the limit of {limit} bytes (OutboxConfig::max_envelope_bytes): store large data elsewhere and put a reference in the event")]
    TooLarge {
        /// The event id.
        event_id: Uuid,
        /// The event name.
        name: &'static str,
        /// Its size in bytes.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// [`Outbox::drain`] ran out of time with deliveries still able to progress.
    #[error("drain timed out with {pending} deliveries still pending")]
    Timeout {
        /// Deliveries still pending (not counting those waiting behind a dead letter).
        pending: u64,
    },
    /// A fault was injected at this point (test builds only).
    #[error("fault injected at {0:?}")]
    Injected(FaultPoint),
}

/// Where the crash-safety suite can stop the runtime (feature `fault-injection`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// Unit of work: rows written, before COMMIT.
    BeforeCommit,
    /// Unit of work: after COMMIT, before any delivery.
    AfterCommit,
    /// Delivery: a handler ran and its writes are in the open transaction.
    DuringHandler,
    /// Delivery: every handler of the batch ran, before completion is recorded and committed.
    AfterHandler,
}

/// What an injected fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Nothing.
    Continue,
    /// Stop here as a killed process would: the open transaction is abandoned (rolled back
    /// by the database), leases are left to expire, and the call returns
    /// [`OutboxError::Injected`].
    Crash,
    /// Kill the database connection under the open transaction (PostgreSQL:
    /// `pg_terminate_backend`; SQLite: the transaction is dropped), then as `Crash`.
    DropConnection,
}

type FaultHook = Arc<dyn Fn(FaultPoint) -> FaultAction + Send + Sync>;

/// Tuning of delivery.
#[derive(Debug, Clone)]
pub struct OutboxConfig {
    /// Deliveries claimed per batch (default 128).
    pub batch_size: u32,
    /// How long a claim is held before another worker may take it over (default 30 s). Must
    /// exceed the longest batch.
    pub lease: Duration,
    /// How long an idle worker waits before looking again, unless woken by a commit in this
    /// process (default 250 ms).
    pub poll_interval: Duration,
    /// The retry policy of handlers without their own (default [`RetryPolicy::default`]).
    pub retry: RetryPolicy,
    /// How long completed deliveries are kept (default 7 days). Must exceed the longest retry
    /// horizon.
    pub retention: Duration,
    /// How often a worker purges completed deliveries (default 60 s).
    pub retention_interval: Duration,
    /// Rows deleted per purge statement (default 1,000).
    pub retention_batch: u32,
    /// The CloudEvents `source` written on envelopes that still have the default.
    pub source: Option<String>,
    /// The largest envelope a commit accepts, in bytes of its JSON text (default 1 MiB, as
    /// NATS's default maximum payload). A larger one fails the commit with
    /// [`OutboxError::TooLarge`] before anything is written.
    pub max_envelope_bytes: usize,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            batch_size: 128,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_millis(250),
            retry: RetryPolicy::default(),
            retention: Duration::from_secs(7 * 24 * 3600),
            retention_interval: Duration::from_secs(60),
            retention_batch: 1_000,
            source: None,
            max_envelope_bytes: 1 << 20,
        }
    }
}

struct Inner {
    store: Store,
    dispatcher: Dispatcher,
    config: OutboxConfig,
    policies: HashMap<String, RetryPolicy>,
    /// The after-commit handlers of each event type: (name, keeps per-aggregate order).
    destinations: HashMap<TypeId, Vec<(&'static str, bool)>>,
    /// The after-commit handlers this process runs, as a JSON array: a worker claims only
    /// their deliveries, so that an instance without a handler (an older deploy, another
    /// service sharing the tables) leaves them to one that has it.
    claimable: String,
    wake: Notify,
    rng: Mutex<fastrand::Rng>,
    fault: Option<FaultHook>,
}

/// The transactional outbox and its delivery workers over one [`Store`].
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
/// let store = Store::connect("sqlite::memory:").await?;
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
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Outbox {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("store", &self.inner.store.kind())
            .field("dispatcher", &self.inner.dispatcher)
            .field("config", &self.inner.config)
            .finish()
    }
}

/// Configures an [`Outbox`].
pub struct OutboxBuilder {
    store: Store,
    dispatcher: DispatcherBuilder,
    config: OutboxConfig,
    policies: HashMap<String, RetryPolicy>,
    fault: Option<FaultHook>,
}

impl std::fmt::Debug for OutboxBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxBuilder")
            .field("dispatcher", &self.dispatcher)
            .field("config", &self.config)
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

    /// Sets the retry policy of the handler named `handler`.
    pub fn retry_policy(mut self, handler: impl Into<String>, policy: RetryPolicy) -> Self {
        self.policies.insert(handler.into(), policy);
        self
    }

    /// Test-only: calls `hook` at every [`FaultPoint`].
    #[cfg(feature = "fault-injection")]
    pub fn fault_injection(
        mut self,
        hook: impl Fn(FaultPoint) -> FaultAction + Send + Sync + 'static,
    ) -> Self {
        self.fault = Some(Arc::new(hook));
        self
    }

    /// Validates and builds.
    ///
    /// # Errors
    /// [`OutboxError::Config`] for a registry error (see [`RegistryError`]), a zero
    /// `batch_size`, `lease` or `poll_interval`, a retry policy naming no handler, a policy with zero attempts, or a retention not longer than the
    /// longest retry horizon.
    pub fn build(self) -> Result<Outbox, OutboxError> {
        let mut tx_types = vec![TypeId::of::<Tx>()];
        match self.store.kind() {
            #[cfg(feature = "sqlite")]
            crate::store::BackendKind::Sqlite => {
                tx_types.push(TypeId::of::<sqlx::SqliteConnection>())
            }
            #[cfg(feature = "postgres")]
            crate::store::BackendKind::Postgres => {
                tx_types.push(TypeId::of::<sqlx::PgConnection>())
            }
            #[allow(unreachable_patterns)]
            _ => {}
        }
        let dispatcher = self
            .dispatcher
            .idempotency_capacity(0)
            .provide_transactions(&tx_types)
            .build()
            .map_err(|e: RegistryError| OutboxError::Config(e.to_string()))?;
        let c = &self.config;
        if c.batch_size == 0 || c.lease.is_zero() || c.poll_interval.is_zero() {
            return Err(OutboxError::Config(format!(
                "batch_size ({}), lease ({:?}) and poll_interval ({:?}) must all be positive",
                c.batch_size, c.lease, c.poll_interval
            )));
        }
        for name in self.policies.keys() {
            if dispatcher.handler_index(name).is_none() {
                return Err(OutboxError::Config(format!(
                    "a retry policy names handler `{name}`, which is not registered"
                )));
            }
        }
        let policies = std::iter::once(&self.config.retry).chain(self.policies.values());
        let mut longest = Duration::ZERO;
        for p in policies {
            if p.max_attempts == 0 {
                return Err(OutboxError::Config(
                    "max_attempts must be at least 1".into(),
                ));
            }
            longest = longest.max(p.horizon());
        }
        if self.config.retention <= longest {
            return Err(OutboxError::Config(format!(
                "retention ({:?}) must be longer than the longest retry horizon ({longest:?}); otherwise the record that a delivery completed could be purged while a retry of it is still possible",
                self.config.retention
            )));
        }
        // An event of an older version goes to the handlers of the newest version of its
        // name: the worker upcasts it before calling them.
        let mut destinations: HashMap<TypeId, Vec<(&'static str, bool)>> = HashMap::new();
        let registry = dispatcher.registry();
        for event in registry.events() {
            let handlers = registry
                .handlers_for((event.type_id)())
                .filter(|h| h.mode == DeliveryMode::AfterCommit)
                .map(|h| (h.name, h.ordered))
                .collect();
            destinations.insert((event.type_id)(), handlers);
        }
        let claimable = serde_json::to_string(
            &dispatcher
                .registry()
                .handlers()
                .iter()
                .filter(|h| h.mode == DeliveryMode::AfterCommit)
                .map(|h| h.name)
                .collect::<Vec<_>>(),
        )
        .unwrap_or_else(|_| "[]".into());
        Ok(Outbox {
            inner: Arc::new(Inner {
                store: self.store,
                dispatcher,
                config: self.config,
                policies: self.policies,
                claimable,
                destinations,
                wake: Notify::new(),
                rng: Mutex::new(fastrand::Rng::new()),
                fault: self.fault,
            }),
        })
    }
}

/// What a unit of work's commit did.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct CommitReport {
    /// Events written to the outbox.
    pub appended: usize,
    /// Events skipped because their id was already in the outbox.
    pub duplicates: usize,
    /// The in-transaction handlers' outcomes, one report per appended event.
    pub in_transaction: Vec<DispatchReport>,
}

/// What one delivery batch did.
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
    /// Lost to another worker because the lease expired (rolled back, will run again).
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
            policies: HashMap::new(),
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

    fn policy(&self, handler: &str) -> RetryPolicy {
        self.inner
            .policies
            .get(handler)
            .copied()
            .unwrap_or(self.inner.config.retry)
    }

    fn fault(&self, point: FaultPoint) -> FaultAction {
        self.inner
            .fault
            .as_ref()
            .map_or(FaultAction::Continue, |f| f(point))
    }

    async fn inject(&self, point: FaultPoint, tx: Option<Tx>) -> Result<Option<Tx>, OutboxError> {
        match self.fault(point) {
            FaultAction::Continue => Ok(tx),
            FaultAction::Crash => {
                // Abandon the transaction as a dying process would.
                drop(tx);
                Err(OutboxError::Injected(point))
            }
            FaultAction::DropConnection => {
                #[cfg(feature = "postgres")]
                if let Some(Tx::Postgres(mut t)) = tx {
                    let _ = sqlx::query("SELECT pg_terminate_backend(pg_backend_pid())")
                        .execute(&mut *t)
                        .await;
                    drop(t);
                    return Err(OutboxError::Injected(point));
                }
                drop(tx);
                Err(OutboxError::Injected(point))
            }
        }
    }

    /// Begins a unit of work: a store transaction the application writes its state through,
    /// and the events to commit with it.
    ///
    /// # Errors
    /// [`OutboxError::Store`] when no transaction can be begun.
    pub async fn begin(&self) -> Result<OutboxUnitOfWork<'_>, OutboxError> {
        Ok(OutboxUnitOfWork {
            outbox: self,
            tx: Some(self.inner.store.begin().await?),
            pending: Vec::new(),
        })
    }

    /// Claims one batch of due deliveries, runs each handler, and records the outcomes: in one
    /// transaction with the handlers' own writes (each delivery in a savepoint, so that one
    /// failure rolls back only its own writes). Returns what happened.
    ///
    /// # Errors
    /// [`OutboxError::Store`] when the database fails; the claimed deliveries are then
    /// retried after their lease expires.
    pub async fn deliver_batch(&self) -> Result<BatchReport, OutboxError> {
        let token = Uuid::now_v7().to_string();
        self.deliver_batch_with(&token).await
    }

    async fn deliver_batch_with(&self, token: &str) -> Result<BatchReport, OutboxError> {
        let inner = &*self.inner;
        let lease_ms = inner.config.lease.as_millis() as i64;
        let claimed = inner
            .store
            .claim(
                token,
                inner.config.batch_size,
                lease_ms,
                now_ms(),
                &inner.claimable,
            )
            .await?;
        let mut report = BatchReport {
            claimed: claimed.len(),
            ..BatchReport::default()
        };
        if claimed.is_empty() {
            return Ok(report);
        }
        let mut tx = inner.store.begin().await?;
        let mut completed_handlers: Vec<(&str, Duration)> = Vec::new();
        for c in &claimed {
            let span = tracing::info_span!(
                "delivery",
                event = %c.name,
                event_id = %c.event_id,
                handler = %c.handler,
                attempt = c.attempts
            );
            match self.deliver_one(c, token, &mut tx).instrument(span).await? {
                Step::Completed(d) => {
                    report.completed += 1;
                    completed_handlers.push((&c.handler, d));
                }
                Step::Retry => report.retried += 1,
                Step::Dead => report.dead_lettered += 1,
                Step::LeaseLost => report.lease_lost += 1,
                Step::Conflict => {
                    // A deadlock or serialization failure between this batch and another
                    // transaction: the batch's locks are part of the cycle, so retrying the
                    // one delivery inside it would meet the same cycle. Undo the whole batch
                    // and give the deliveries back, due at once and without using an attempt.
                    tx.rollback().await?;
                    inner.store.release(token).await?;
                    tracing::warn!("delivery batch rolled back after a database conflict");
                    return Ok(BatchReport {
                        claimed: report.claimed,
                        conflicts: report.claimed,
                        ..BatchReport::default()
                    });
                }
            }
            tx = self
                .inject(FaultPoint::DuringHandler, Some(tx))
                .await?
                .expect("inject returns the transaction on Continue");
        }
        let mut tx = self
            .inject(FaultPoint::AfterHandler, Some(tx))
            .await?
            .expect("inject returns the transaction on Continue");
        let now = now_ms();
        let n = Store::complete_leased(&mut tx, token, now).await? as usize;
        if n != report.completed || report.lease_lost > 0 {
            // Another worker took over some of these deliveries (our lease expired): undo
            // this batch's effects; they run again under the new lease.
            tx.rollback().await?;
            tracing::warn!(
                expected = report.completed,
                recorded = n,
                "delivery leases expired during the batch; rolled back"
            );
            return Ok(BatchReport {
                claimed: report.claimed,
                lease_lost: report.claimed,
                ..BatchReport::default()
            });
        }
        tx.commit().await?;
        for (handler, d) in completed_handlers {
            metrics::counter!("events_deliveries_completed_total", "handler" => handler.to_owned())
                .increment(1);
            metrics::histogram!("events_handler_duration_seconds", "handler" => handler.to_owned())
                .record(d.as_secs_f64());
        }
        Ok(report)
    }

    async fn deliver_one(
        &self,
        c: &Claimed,
        token: &str,
        tx: &mut Tx,
    ) -> Result<Step, OutboxError> {
        let now = now_ms();
        let (envelope, index) = match self.decode(c) {
            Ok(v) => v,
            Err(Undeliverable { reason, chain }) => {
                return dead_letter(tx, c, token, reason, &chain, now).await;
            }
        };
        let uses_tx = self
            .inner
            .dispatcher
            .handler_descriptor(index)
            .transaction
            .is_some();
        if uses_tx {
            tx.execute("SAVEPOINT event_delivery", &[]).await?;
        }
        let started = Instant::now();
        let outcome = self
            .inner
            .dispatcher
            .call_one(index, &*envelope, Some(tx))
            .await;
        let elapsed = started.elapsed();
        let now = now_ms();
        let (permanent, chain) = match outcome {
            Outcome::Ran => {
                if uses_tx {
                    tx.execute("RELEASE SAVEPOINT event_delivery", &[]).await?;
                }
                return Ok(Step::Completed(elapsed));
            }
            Outcome::Failed(e) if is_conflict(&e) => {
                if uses_tx {
                    tx.execute("ROLLBACK TO SAVEPOINT event_delivery", &[])
                        .await?;
                }
                return Ok(Step::Conflict);
            }
            Outcome::Failed(e) => (e.is_permanent(), e.chain()),
            Outcome::Panicked(m) => (false, vec![format!("handler panicked: {m}")]),
            Outcome::Duplicate => unreachable!("the outbox dispatcher has no guard"),
        };
        if uses_tx {
            tx.execute("ROLLBACK TO SAVEPOINT event_delivery", &[])
                .await?;
            tx.execute("RELEASE SAVEPOINT event_delivery", &[]).await?;
        }
        metrics::counter!("events_deliveries_failed_total", "handler" => c.handler.clone())
            .increment(1);
        let policy = self.policy(&c.handler);
        let attempts = u32::try_from(c.attempts).unwrap_or(u32::MAX);
        if permanent || attempts >= policy.max_attempts {
            let reason = if permanent { "permanent" } else { "exhausted" };
            return dead_letter(tx, c, token, reason, &chain, now).await;
        }
        let wait = {
            let mut rng = self.inner.rng.lock().unwrap_or_else(|e| e.into_inner());
            policy.backoff(attempts, &mut rng)
        };
        tracing::warn!(
            event = %c.name,
            event_id = %c.event_id,
            handler = %c.handler,
            attempts,
            retry_in_ms = wait.as_millis() as u64,
            error = %chain.join(": "),
            "delivery failed; will retry"
        );
        metrics::counter!("events_delivery_retries_total", "handler" => c.handler.clone())
            .increment(1);
        let next = now + wait.as_millis() as i64;
        Ok(
            if Store::retry_later(tx, c, token, next, &chain.join(": "), now).await? {
                Step::Retry
            } else {
                Step::LeaseLost
            },
        )
    }

    /// Decodes a claimed delivery's envelope and finds its handler.
    fn decode(&self, c: &Claimed) -> Result<(Box<dyn AnyEnvelope>, u32), Undeliverable> {
        let dead = |reason: &'static str, chain: Vec<String>| Undeliverable { reason, chain };
        let raw = RawEnvelope::from_json(&c.envelope)
            .map_err(|e| dead("undecodable", vec![e.to_string()]))?;
        let envelope = self
            .inner
            .dispatcher
            .registry()
            .decode(&raw)
            .map_err(|e| match e {
                DecodeError::UnknownName { .. } | DecodeError::UnknownVersion { .. } => {
                    dead("unknown_event", vec![e.to_string()])
                }
                e => dead("undecodable", error_chain(&e)),
            })?;
        let index = self
            .inner
            .dispatcher
            .handler_index(&c.handler)
            .ok_or_else(|| {
                dead(
                    "unknown_handler",
                    vec![format!("no handler named `{}` is registered", c.handler)],
                )
            })?;
        // The envelope may be of an older version than the handler takes (recorded before the
        // event's last version was added): upcast it step by step.
        let wanted = ((self.inner.dispatcher.handler_descriptor(index).event)().type_id)();
        let envelope = if envelope.event_type_id() == wanted {
            envelope
        } else {
            self.inner
                .dispatcher
                .registry()
                .upcast(envelope, wanted)
                .map_err(|e| dead("undecodable", error_chain(&e)))?
        };
        Ok((envelope, index))
    }

    /// Delivers in this task until no delivery of this process's handlers can make progress:
    /// every one is completed, dead-lettered, or waits behind a dead letter of its (handler,
    /// aggregate) (see
    /// [`OutboxStats::blocked`](crate::OutboxStats::blocked)). Waits for scheduled retries.
    /// Returns the totals.
    ///
    /// # Errors
    /// [`OutboxError::Store`]; [`OutboxError::Timeout`] when `timeout` passes with deliveries
    /// still pending.
    pub async fn drain(&self, timeout: Duration) -> Result<BatchReport, OutboxError> {
        let deadline = Instant::now() + timeout;
        let mut total = BatchReport::default();
        let mut analyzed = Instant::now();
        self.inner.store.refresh_statistics().await?;
        loop {
            let r = self.deliver_batch().await?;
            total += r;
            if analyzed.elapsed() >= Duration::from_secs(10) {
                analyzed = Instant::now();
                self.inner.store.refresh_statistics().await?;
            }
            if r.claimed > 0 {
                continue;
            }
            let waiting = self.inner.store.progressing(&self.inner.claimable).await?;
            if waiting == 0 {
                return Ok(total);
            }
            if Instant::now() >= deadline {
                return Err(OutboxError::Timeout { pending: waiting });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Starts `count` delivery workers on the current tokio runtime. Worker 0 also purges
    /// completed deliveries older than the retention.
    pub fn spawn_workers(&self, count: usize) -> Workers {
        let (stop, stopped) = watch::channel(false);
        let tokens: Arc<Mutex<Vec<Option<String>>>> = Arc::new(Mutex::new(vec![None; count]));
        let handles = (0..count)
            .map(|i| {
                let outbox = self.clone();
                let mut stopped = stopped.clone();
                let tokens = Arc::clone(&tokens);
                tokio::spawn(async move { outbox.worker(i, &mut stopped, &tokens).await })
            })
            .collect();
        Workers {
            outbox: self.clone(),
            stop,
            handles,
            tokens,
        }
    }

    async fn worker(
        &self,
        index: usize,
        stopped: &mut watch::Receiver<bool>,
        tokens: &Mutex<Vec<Option<String>>>,
    ) {
        let config = &self.inner.config;
        let mut last_purge = Instant::now();
        let mut last_stats = Instant::now();
        while !*stopped.borrow() {
            let token = Uuid::now_v7().to_string();
            set_token(tokens, index, Some(token.clone()));
            let result = self.deliver_batch_with(&token).await;
            set_token(tokens, index, None);
            let idle = match result {
                Ok(r) => r.claimed == 0,
                Err(e) => {
                    tracing::error!(error = %e, "delivery batch failed; retrying after the poll interval");
                    true
                }
            };
            if index == 0 && last_purge.elapsed() >= config.retention_interval {
                last_purge = Instant::now();
                let cutoff = now_ms() - config.retention.as_millis() as i64;
                match self
                    .inner
                    .store
                    .purge_completed(cutoff, config.retention_batch)
                    .await
                {
                    Ok(n) if n > 0 => tracing::info!(deleted = n, "purged completed deliveries"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "retention purge failed"),
                }
            }
            if index == 0 && last_stats.elapsed() >= Duration::from_secs(5) {
                last_stats = Instant::now();
                if let Ok(stats) = self.inner.store.stats().await {
                    record_backlog(&stats);
                }
                if let Err(e) = self.inner.store.refresh_statistics().await {
                    tracing::warn!(error = %e, "refreshing outbox statistics failed");
                }
            }
            if idle {
                tokio::select! {
                    _ = self.inner.wake.notified() => {}
                    _ = tokio::time::sleep(config.poll_interval) => {}
                    _ = stopped.changed() => {}
                }
            }
        }
    }
}

fn set_token(tokens: &Mutex<Vec<Option<String>>>, index: usize, token: Option<String>) {
    tokens.lock().unwrap_or_else(|e| e.into_inner())[index] = token;
}

fn record_backlog(stats: &crate::store::OutboxStats) {
    metrics::gauge!("events_outbox_backlog").set(stats.pending as f64);
    metrics::gauge!("events_outbox_oldest_pending_age_seconds")
        .set(stats.oldest_pending_age_secs.unwrap_or(0.0));
    metrics::gauge!("events_dead_letters").set(stats.dead_letters as f64);
}

fn error_chain(e: &dyn std::error::Error) -> Vec<String> {
    let mut out = vec![e.to_string()];
    let mut next = e.source();
    while let Some(s) = next {
        out.push(s.to_string());
        next = s.source();
    }
    out
}

/// Moves a leased delivery to the dead letter queue, with its log line and metric.
async fn dead_letter(
    tx: &mut Tx,
    c: &Claimed,
    token: &str,
    reason: &'static str,
    chain: &[String],
    now: i64,
) -> Result<Step, OutboxError> {
    tracing::error!(
        event = %c.name,
        event_id = %c.event_id,
        handler = %c.handler,
        reason,
        attempts = c.attempts,
        error = %chain.join(": "),
        "delivery dead-lettered"
    );
    metrics::counter!("events_deliveries_dead_lettered_total", "handler" => c.handler.clone())
        .increment(1);
    Ok(
        if Store::dead_letter(tx, c, token, reason, chain, now).await? {
            Step::Dead
        } else {
            Step::LeaseLost
        },
    )
}

/// Why a delivery cannot be attempted at all: dead-lettered at once.
struct Undeliverable {
    reason: &'static str,
    chain: Vec<String>,
}

/// A deadlock (`40P01`) or serialization failure (`40001`) somewhere in the handler error's
/// chain: the database asks for the whole transaction to be retried.
fn is_conflict(error: &event_core::HandlerError) -> bool {
    fn conflict(db: &dyn sqlx::error::DatabaseError) -> bool {
        matches!(db.code().as_deref(), Some("40P01" | "40001"))
    }
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error.source_error());
    while let Some(e) = next {
        match (
            e.downcast_ref::<StoreError>(),
            e.downcast_ref::<sqlx::Error>(),
        ) {
            (Some(StoreError::Database(sqlx::Error::Database(db))), _)
            | (_, Some(sqlx::Error::Database(db)))
                if conflict(db.as_ref()) =>
            {
                return true
            }
            _ => {}
        }
        next = e.source();
    }
    false
}

enum Step {
    /// Roll the batch back: a deadlock or serialization failure.
    Conflict,
    Completed(Duration),
    Retry,
    Dead,
    LeaseLost,
}

/// Running delivery workers. Dropping this handle leaves them running; call
/// [`shutdown`](Self::shutdown) to stop them.
#[derive(Debug)]
pub struct Workers {
    outbox: Outbox,
    stop: watch::Sender<bool>,
    handles: Vec<JoinHandle<()>>,
    tokens: Arc<Mutex<Vec<Option<String>>>>,
}

impl Workers {
    /// Stops claiming, lets in-flight batches finish within `deadline`, then aborts the rest
    /// and releases their leases so that they are due again at once (their aborted
    /// transactions roll back). Returns how many deliveries were released.
    ///
    /// # Errors
    /// [`OutboxError::Store`] when releasing leases fails (they then expire by themselves).
    pub async fn shutdown(self, deadline: Duration) -> Result<u64, OutboxError> {
        let _ = self.stop.send(true);
        let until = tokio::time::Instant::now() + deadline;
        for mut h in self.handles {
            if tokio::time::timeout_at(until, &mut h).await.is_err() {
                h.abort();
                let _ = h.await;
            }
        }
        let leftover: Vec<String> = self
            .tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .flatten()
            .cloned()
            .collect();
        let mut released = 0;
        for token in leftover {
            released += self.outbox.inner.store.release(&token).await?;
        }
        Ok(released)
    }
}

/// The events of one command and the store transaction that carries them and the
/// application's own writes.
///
/// [`commit`](Self::commit): 1. runs the `in_transaction` handlers of every event inside the
/// transaction — an error rolls everything back; 2. writes one outbox row per event and one
/// delivery row per (event, after-commit handler) in one statement each; 3. COMMITs. No handler
/// runs, and nothing leaves the process, before COMMIT for after-commit handlers. Dropping the
/// unit of work without committing rolls back.
#[derive(Debug)]
pub struct OutboxUnitOfWork<'o> {
    outbox: &'o Outbox,
    tx: Option<Tx>,
    pending: Vec<Box<dyn AnyEnvelope>>,
}

impl OutboxUnitOfWork<'_> {
    /// The open transaction, for the application's own writes.
    pub fn tx(&mut self) -> &mut Tx {
        self.tx
            .as_mut()
            .expect("the transaction is taken only by commit")
    }

    /// Adds one envelope.
    pub fn add<E: DomainEvent>(&mut self, envelope: Envelope<E>) {
        self.pending.push(Box::new(envelope));
    }

    /// Adds envelopes taken from a recorder.
    pub fn extend(&mut self, envelopes: impl IntoIterator<Item = Box<dyn AnyEnvelope>>) {
        self.pending.extend(envelopes);
    }

    /// The envelopes added so far.
    pub fn pending(&self) -> &[Box<dyn AnyEnvelope>] {
        &self.pending
    }

    /// Rolls back.
    ///
    /// # Errors
    /// [`OutboxError::Store`] when the connection was lost (the database rolls back anyway).
    pub async fn rollback(mut self) -> Result<(), OutboxError> {
        if let Some(tx) = self.tx.take() {
            tx.rollback().await?;
        }
        Ok(())
    }

    /// Commits: appends the events to the outbox, runs the in-transaction handlers of the
    /// events that were new, writes their delivery rows, and COMMITs — all in the one
    /// transaction. An event whose id is already in the outbox (a retried command, a
    /// redelivered message) is skipped whole: no in-transaction handler, no delivery, no second
    /// effect.
    ///
    /// # Errors
    /// [`OutboxError::Aborted`] when an in-transaction handler failed or panicked (rolled
    /// back); [`OutboxError::Encode`] when a payload cannot be serialised, or
    /// [`OutboxError::TooLarge`] when an envelope exceeds the size limit (rolled back);
    /// [`OutboxError::Store`] — [`StoreError::Conflict`] when another commit recorded the same
    /// aggregate sequence, or a database failure (rolled back).
    pub async fn commit(mut self) -> Result<CommitReport, OutboxError> {
        let outbox = self.outbox;
        let mut tx = self.tx.take().expect("commit takes the transaction once");
        let mut rows = Vec::with_capacity(self.pending.len());
        for envelope in &mut self.pending {
            if let Some(source) = &outbox.inner.config.source {
                if envelope.metadata().source == event_core::DEFAULT_SOURCE {
                    envelope.metadata_mut().source = source.clone();
                }
            }
            let meta = envelope.metadata();
            let json = envelope.to_json().map_err(|source| OutboxError::Encode {
                event_id: meta.id,
                name: envelope.name(),
                source,
            })?;
            let limit = outbox.inner.config.max_envelope_bytes;
            if json.len() > limit {
                return Err(OutboxError::TooLarge {
                    event_id: meta.id,
                    name: envelope.name(),
                    bytes: json.len(),
                    limit,
                });
            }
            rows.push(OutboxRow {
                event_id: meta.id,
                name: envelope.name(),
                version: envelope.version(),
                aggregate_type: meta.aggregate_type.clone(),
                aggregate_id: meta.aggregate_id.clone(),
                sequence: meta.sequence,
                occurred_at: meta.occurred_at.timestamp_millis(),
                envelope: json,
                handlers: outbox
                    .inner
                    .destinations
                    .get(&envelope.event_type_id())
                    .cloned()
                    .unwrap_or_default(),
            });
        }
        let now = now_ms();
        let new_ids = Store::insert_events(&mut tx, &rows, now).await?;
        let mut report = CommitReport::default();
        let mut new_rows = Vec::with_capacity(new_ids.len());
        for (envelope, row) in self.pending.iter().zip(&rows) {
            if !new_ids.contains(&row.event_id.to_string()) {
                report.duplicates += 1;
                continue;
            }
            new_rows.push(row);
            let dispatched = outbox
                .inner
                .dispatcher
                .dispatch_phase(
                    &**envelope,
                    Phase::Only(DeliveryMode::InTransaction),
                    Some(&mut tx),
                )
                .await;
            let dispatched = match CommitError::check(dispatched, &**envelope) {
                Ok(report) => report,
                Err(e) => {
                    tx.rollback().await?;
                    return Err(OutboxError::Aborted(Box::new(e)));
                }
            };
            report.in_transaction.push(dispatched);
        }
        report.appended = new_rows.len();
        Store::insert_deliveries(&mut tx, &new_rows, now).await?;
        let tx = outbox
            .inject(FaultPoint::BeforeCommit, Some(tx))
            .await?
            .expect("inject returns the transaction on Continue");
        tx.commit().await?;
        outbox.inject(FaultPoint::AfterCommit, None).await?;
        outbox.inner.wake.notify_waiters();
        Ok(report)
    }
}

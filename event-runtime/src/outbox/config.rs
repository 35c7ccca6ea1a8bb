//! The outbox's tuning ([`OutboxConfig`]) and its validation at start-up. Plain data: the
//! engine reads it, nothing here runs.

use std::time::Duration;

use super::breaker::CircuitBreaker;
use super::error::ConfigError;
use super::retry::RetryPolicy;

/// The shortest lease [`OutboxConfig::lease`] accepts.
pub const MIN_LEASE: Duration = Duration::from_secs(1);

/// Tuning of delivery: the defaults, changed with one setter per field.
///
/// ```
/// use std::time::Duration;
/// use event_runtime::{OutboxConfig, RetryPolicy};
///
/// let config = OutboxConfig::default()
///     .lease(Duration::from_secs(30))
///     .retry(RetryPolicy::default().max_attempts(10))
///     .source("urn:example:orders");
/// assert_eq!(config.retry.max_attempts, 10);
/// ```
///
/// `#[non_exhaustive]`: fields are added in minor releases, so build it from
/// [`default`](Default::default) and the setters, never with a struct literal.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OutboxConfig {
    /// Deliveries claimed at once by a worker, shared by the runs of one claim (default 128).
    pub batch_size: u32,
    /// How long a worker's lease lasts unless renewed (default 10 s, at least [`MIN_LEASE`]).
    ///
    /// A live worker renews its lease every `lease / 3` from a connection of its own (the
    /// renewal touches only the worker's lease row, never a delivery row, so it never waits
    /// on the worker's own batch transaction). A worker that dies stops renewing, and its
    /// deliveries are claimed again by another worker at most `lease` later. Every outcome is
    /// recorded only if the delivery is still leased to the worker's token, so a worker that
    /// was taken over (paused, partitioned) changes nothing; only the deliveries another
    /// worker took over are undone.
    ///
    /// Leases are stamped by the clock of the process that writes them and compared with the
    /// clock of the process that claims: they tolerate a clock skew between worker hosts of up
    /// to `lease / 3` (a renewal is at most that old). Run NTP (skew of milliseconds); raise
    /// the lease on hosts whose clocks may drift further.
    pub lease: Duration,
    /// How long an idle worker waits before looking again, unless woken by a commit in this
    /// process (default 250 ms).
    pub poll_interval: Duration,
    /// The retry policy of destinations without their own (default [`RetryPolicy::default`]).
    pub retry: RetryPolicy,
    /// The time limit of one handler run or one external delivery, unless the destination
    /// has its own (default 30 s). A run that exceeds it is a transient failure, retried with
    /// backoff. For a handler that takes the transaction the limit also stops a statement it
    /// left running in the database (PostgreSQL `statement_timeout`, SQLite's progress
    /// handler).
    pub handler_timeout: Duration,
    /// Runs of handlers that take no transaction (and of transports' relays) delivered at
    /// once by one worker, across aggregates (default 16). One aggregate's run is always
    /// delivered in order, one delivery at a time.
    pub concurrency: usize,
    /// How long completed deliveries are kept (default 7 days). Must exceed the longest retry
    /// horizon.
    pub retention: Duration,
    /// How often a worker purges completed deliveries (default 60 s).
    pub retention_interval: Duration,
    /// Rows deleted per purge statement (default 1,000).
    pub retention_batch: u32,
    /// How often the workers of a process read the backlog
    /// ([`Backend::backlog`](crate::store::Backend::backlog): pending deliveries, open dead
    /// letters and pauses, never the completed history) and set their gauges, among them
    /// `events_destination_oldest_pending_age_seconds` (default 5 s; at least 100 ms in
    /// effect, the upkeep's pace).
    pub metrics_interval: Duration,
    /// The CloudEvents `source` written on envelopes that still have the default.
    pub source: Option<String>,
    /// The largest envelope a commit accepts, in bytes of its JSON text (default 1 MiB less
    /// 1 KiB: NATS's default maximum payload, 1 MiB, less room for the relay's headers, which
    /// count against it). A larger one fails the commit with
    /// [`OutboxError::TooLarge`](crate::OutboxError::TooLarge) before anything is written.
    pub max_envelope_bytes: usize,
    /// How long a received event may wait for its predecessor in its aggregate's chain before
    /// the wait is reported as a gap (default 5 min): a warning naming the aggregate and the
    /// missing sequence, a row in `event_inbox_gaps` (`events dlq list` kind `gap`), and
    /// `events_inbox_gaps_opened_total`. A transport's inbox refuses to start unless it
    /// exceeds the broker's redelivery delay (NATS: the consumer's ack wait plus the fetch
    /// wait, plus a cluster's failover,
    /// `transport::nats::FAILOVER_ALLOWANCE`, 45 s), so that a
    /// message merely waiting for redelivery or for a new leader is never reported.
    pub gap_after: Duration,
    /// The circuit breaker of every handler without its own (default `None`: none, as in
    /// MassTransit and Wolverine, where it is opt-in). See [`CircuitBreaker`] for what trips it
    /// and what follows. Relays are never subject to it.
    pub circuit_breaker: Option<CircuitBreaker>,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            batch_size: 128,
            lease: Duration::from_secs(10),
            poll_interval: Duration::from_millis(250),
            retry: RetryPolicy::default(),
            handler_timeout: Duration::from_secs(30),
            concurrency: 16,
            retention: Duration::from_secs(7 * 24 * 3600),
            retention_interval: Duration::from_secs(60),
            retention_batch: 1_000,
            metrics_interval: Duration::from_secs(5),
            source: None,
            max_envelope_bytes: (1 << 20) - 1024,
            gap_after: Duration::from_secs(300),
            circuit_breaker: None,
        }
    }
}

/// `pub fn field(self, value) -> Self` for plain fields, each documented as setting its field.
macro_rules! setters {
    ($ty:ident: $($field:ident: $t:ty),* $(,)?) => {
        impl $ty {
            $(
                #[doc = concat!("With [`", stringify!($field), "`](Self::", stringify!($field), ") set to `value` (see the field for its unit and default).")]
                pub fn $field(mut self, value: $t) -> Self {
                    self.$field = value;
                    self
                }
            )*
        }
    };
}
pub(crate) use setters;

setters!(OutboxConfig:
    batch_size: u32,
    lease: Duration,
    poll_interval: Duration,
    retry: RetryPolicy,
    handler_timeout: Duration,
    concurrency: usize,
    retention: Duration,
    retention_interval: Duration,
    retention_batch: u32,
    metrics_interval: Duration,
    max_envelope_bytes: usize,
    gap_after: Duration,
);

impl OutboxConfig {
    /// With [`circuit_breaker`](Self::circuit_breaker) set: every handler without its own
    /// breaker gets `breaker`.
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.circuit_breaker = Some(breaker);
        self
    }

    /// With [`source`](Self::source) set: the CloudEvents `source` written on envelopes that
    /// still have the default (a URI reference, such as `urn:example:orders`).
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.source = Some(source.into());
        self
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        for (field, zero) in [
            ("batch_size", self.batch_size == 0),
            ("poll_interval", self.poll_interval.is_zero()),
            ("handler_timeout", self.handler_timeout.is_zero()),
            ("concurrency", self.concurrency == 0),
            ("retention_batch", self.retention_batch == 0),
            ("metrics_interval", self.metrics_interval.is_zero()),
        ] {
            if zero {
                return Err(ConfigError::NotPositive { field });
            }
        }
        if let Some((field, rule)) = self.circuit_breaker.and_then(|b| b.invalid()) {
            return Err(ConfigError::CircuitBreaker {
                of: "the outbox".into(),
                field,
                rule,
            });
        }
        if self.lease < MIN_LEASE {
            return Err(ConfigError::LeaseTooShort {
                lease: self.lease,
                min: MIN_LEASE,
            });
        }
        Ok(())
    }
}

/// What one destination overrides of [`OutboxConfig`] (set with
/// [`OutboxBuilder::handler_options`](crate::OutboxBuilder::handler_options)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HandlerOptions {
    /// Its retry policy.
    pub retry: Option<RetryPolicy>,
    /// Its time limit per run.
    pub timeout: Option<Duration>,
    /// How many of its runs one worker delivers at once (handlers without a transaction and
    /// relays).
    pub concurrency: Option<usize>,
    /// Its circuit breaker, instead of [`OutboxConfig::circuit_breaker`] (a handler only: a
    /// relay is never subject to one).
    pub circuit_breaker: Option<CircuitBreaker>,
    /// No circuit breaker for it, whatever [`OutboxConfig::circuit_breaker`] says.
    pub no_circuit_breaker: bool,
}

impl HandlerOptions {
    /// No overrides.
    pub fn new() -> Self {
        HandlerOptions::default()
    }

    /// With a retry policy.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }

    /// With a time limit per run.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// With a concurrency limit per worker.
    pub fn concurrency(mut self, runs: usize) -> Self {
        self.concurrency = Some(runs);
        self
    }

    /// With a circuit breaker of its own (a handler only).
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.circuit_breaker = Some(breaker);
        self
    }

    /// Without a circuit breaker, whatever [`OutboxConfig::circuit_breaker`] says.
    pub fn no_circuit_breaker(mut self) -> Self {
        self.no_circuit_breaker = true;
        self
    }
}

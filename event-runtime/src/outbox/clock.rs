//! Where the outbox gets the time it writes: every stamp of a delivery (due times, leases,
//! failures, completion) comes from one [`Clock`], the process's by default. Holds no state of
//! the engine.

use std::fmt;

/// The source of every time the outbox writes to its store, in milliseconds since the Unix
/// epoch (UTC).
///
/// The default is [`SystemClock`]. A test harness injects one it can move forward, so that
/// "retried three times, then dead-lettered" runs in milliseconds: tokio's paused clock does
/// not move the wall-clock stamps the store compares.
///
/// Leases are compared across processes by these stamps: see [`OutboxConfig::lease`] for the
/// clock skew this tolerates.
///
/// [`OutboxConfig::lease`]: crate::OutboxConfig::lease
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Now, in milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
}

/// The process's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        chrono::Utc::now().timestamp_millis()
    }
}

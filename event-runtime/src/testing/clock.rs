//! A clock a test moves by hand: what every stamp the outbox writes (due times, leases,
//! failures) reads when it is injected. Holds nothing but the time.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use crate::outbox::clock::{Clock, SystemClock};

/// A [`Clock`] that stands still until [`advance`](Self::advance) or [`set`](Self::set)
/// moves it, so that a retry due in ten minutes is due as soon as the test says so.
/// Starts at the wall clock's now. Shared between the test and the outbox through an `Arc`.
#[derive(Debug)]
pub struct ManualClock {
    now_ms: AtomicI64,
}

impl ManualClock {
    /// A clock standing at the wall clock's now.
    pub fn new() -> Self {
        ManualClock::at(SystemClock.now_ms())
    }

    /// A clock standing at `now_ms`, milliseconds since the Unix epoch.
    pub fn at(now_ms: i64) -> Self {
        ManualClock {
            now_ms: AtomicI64::new(now_ms),
        }
    }

    /// Moves the clock forward by `by` (whole milliseconds).
    pub fn advance(&self, by: Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock to `now_ms`, milliseconds since the Unix epoch (backwards too: a clock
    /// skew between processes).
    pub fn set(&self, now_ms: i64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

//! Retry policy: how many attempts a delivery gets and how long it waits between them
//! (exponential backoff with full jitter). Pure arithmetic; the worker applies it.

use std::time::Duration;

/// How a handler's failed deliveries are retried.
///
/// The wait before attempt `n + 1` is drawn uniformly from `[0, min(max_backoff,
/// initial_backoff × 2^(n−1))]` — "full jitter", as described in the AWS Architecture Blog post
/// *Exponential Backoff And Jitter* (Marc Brooker, 2015) — so that many deliveries failing
/// together do not retry together. After `max_attempts` attempts the delivery goes to the dead
/// letter queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (default 5). `1` means no retry.
    pub max_attempts: u32,
    /// Cap of the first wait (default 1 s).
    pub initial_backoff: Duration,
    /// Cap of any wait (default 60 s).
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
        }
    }
}

super::config::setters!(RetryPolicy:
    max_attempts: u32,
    initial_backoff: Duration,
    max_backoff: Duration,
);

impl RetryPolicy {
    /// The cap of the wait after failed attempt `attempt` (1-based), before jitter.
    pub fn backoff_cap(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.saturating_sub(1));
        self.initial_backoff
            .checked_mul(factor)
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff)
    }

    /// The wait after failed attempt `attempt`: uniform in `[0, backoff_cap(attempt)]`.
    pub fn backoff(&self, attempt: u32, rng: &mut fastrand::Rng) -> Duration {
        let cap = self.backoff_cap(attempt).as_millis() as u64;
        Duration::from_millis(rng.u64(0..=cap))
    }

    /// The longest a delivery can spend being retried: the sum of every wait cap. Retention
    /// must be longer than this.
    pub fn horizon(&self) -> Duration {
        (1..self.max_attempts).map(|a| self.backoff_cap(a)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_and_jitter_stays_below_it() {
        let p = RetryPolicy {
            max_attempts: 6,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(500),
        };
        let caps: Vec<u128> = (1..=5).map(|a| p.backoff_cap(a).as_millis()).collect();
        assert_eq!(caps, [100, 200, 400, 500, 500]);
        assert_eq!(p.horizon(), Duration::from_millis(1700));
        let mut rng = fastrand::Rng::with_seed(7);
        let draws: Vec<Duration> = (0..1000).map(|_| p.backoff(3, &mut rng)).collect();
        assert!(draws.iter().all(|d| *d <= Duration::from_millis(400)));
        assert!(
            draws.iter().any(|d| *d < Duration::from_millis(100)),
            "full jitter reaches low"
        );
        assert!(
            draws.iter().any(|d| *d > Duration::from_millis(300)),
            "and high"
        );
        assert_eq!(p.backoff_cap(u32::MAX), Duration::from_millis(500));
    }
}

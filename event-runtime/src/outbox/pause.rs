//! Pauses the engine writes itself: a destination that says it is unavailable (a broker that
//! cannot be reached) is paused in the store — so that every worker process holds it back and
//! no attempt is used — until this process's probe finds it available again. Operators'
//! pauses are the store's (`Store::pause_destination`); this is the runtime's.

use std::time::{Duration, Instant};

use event_core::ErrorChain;

use super::destination::{Resolved, Target};
use super::text::storable;
use super::Outbox;
use crate::store::backend::Pause;

/// `paused_by` of the pauses the engine writes when a destination is unavailable.
pub(crate) const RUNTIME: &str = "runtime";

/// How often a destination that stays unavailable is logged again.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// One destination this process paused as unavailable.
pub(crate) struct Outage {
    /// When to ask the destination again.
    next_probe: Instant,
    /// How often to ask.
    every: Duration,
    /// Since when it is unavailable.
    since: Instant,
    /// When it was last logged as unavailable.
    logged: Instant,
    /// Why, as the destination first said.
    reason: String,
}

impl Outbox {
    /// Pauses `dest` in the store (for every worker) because it is unavailable, until this
    /// process sees it available again. Logged when the outage starts, then at most once a
    /// minute while it lasts.
    pub(crate) async fn pause_unavailable(
        &self,
        dest: &Resolved,
        reason: &str,
        retry_after: Duration,
    ) {
        let newly = {
            let mut paused = self
                .inner
                .runtime_paused
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            match paused.get_mut(&dest.name) {
                Some(o) => {
                    o.next_probe = now + retry_after;
                    o.every = retry_after;
                    false
                }
                None => {
                    paused.insert(
                        dest.name.clone(),
                        Outage {
                            next_probe: now + retry_after,
                            every: retry_after,
                            since: now,
                            logged: now,
                            reason: reason.to_owned(),
                        },
                    );
                    true
                }
            }
        };
        if newly {
            tracing::warn!(handler = %dest.name, reason, retry_after_ms = retry_after.as_millis() as u64, "destination unavailable: paused until it is back (no attempts are used)");
            metrics::gauge!("events_destination_paused", "destination" => dest.name.clone())
                .set(1.0);
        }
        self.record_pause(dest, reason, retry_after).await;
    }

    async fn record_pause(&self, dest: &Resolved, reason: &str, retry_after: Duration) {
        let now = self.inner.clock.now_ms();
        let pause = Pause {
            destination: dest.name.clone(),
            paused_by: RUNTIME.to_owned(),
            reason: storable(reason),
            at: now,
            // Lapses by itself if this process dies before resuming it.
            expires_at: Some(now + (retry_after.as_millis() as i64).max(1_000) * 3),
            probe_at: None,
        };
        if let Err(e) = self.inner.store.backend().pause(&pause).await {
            tracing::warn!(handler = %dest.name, error = %ErrorChain(&e), "recording the pause failed; this process holds the destination back anyway");
        }
    }

    /// Whether this process holds `name` back: paused as unavailable here, or its circuit
    /// breaker open (tripped here or seen paused in the store) and not being probed here.
    pub(crate) fn locally_paused(&self, name: &str) -> bool {
        self.inner
            .runtime_paused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(name)
            || self.inner.breakers.is_open(name)
    }

    /// Asks every destination this process paused whether it is back; resumes those that
    /// are (logged with the outage's length) and renews the pause of the others (logged at
    /// most once a minute).
    pub(crate) async fn probe_paused(&self) {
        let due: Vec<String> = {
            let paused = self
                .inner
                .runtime_paused
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            paused
                .iter()
                .filter(|(_, o)| o.next_probe <= now)
                .map(|(name, _)| name.clone())
                .collect()
        };
        for name in due {
            let Some(dest) = self.inner.destinations.get(&name).cloned() else {
                continue;
            };
            let back = match &dest.target {
                Target::External(d) => d.available().await,
                Target::Handler { .. } => true,
            };
            // Decided under the lock, written to the store after it.
            let step = {
                let mut paused = self
                    .inner
                    .runtime_paused
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                let Some(outage) = paused.get_mut(&name) else {
                    continue;
                };
                let now = Instant::now();
                let lasted = now - outage.since;
                if back {
                    paused.remove(&name);
                    Ok(lasted)
                } else {
                    outage.next_probe = now + outage.every;
                    if now - outage.logged >= LOG_EVERY {
                        outage.logged = now;
                        tracing::warn!(handler = %name, outage_s = lasted.as_secs_f64().round(), reason = %outage.reason, "destination still unavailable after {}: deliveries held back (no attempts are used)", human(lasted));
                    }
                    Err((outage.every, outage.reason.clone()))
                }
            };
            match step {
                Ok(lasted) => match self.inner.store.backend().resume(&name, RUNTIME).await {
                    Ok(_) => {
                        // At the outage's level, so that a log showing the pause shows its end.
                        tracing::warn!(handler = %name, outage_s = lasted.as_secs_f64().round(), "destination available again after {}: resumed", human(lasted));
                        metrics::gauge!("events_destination_paused", "destination" => name.clone())
                            .set(0.0);
                        self.inner.wake.notify_waiters();
                    }
                    Err(e) => {
                        tracing::warn!(handler = %name, error = %ErrorChain(&e), "lifting the pause failed; it lapses by itself")
                    }
                },
                Err((every, reason)) => {
                    self.record_pause(&dest, &format!("still unavailable: {reason}"), every)
                        .await
                }
            }
        }
    }
}

/// A duration as an operator reads it in a log line: `42 s`, `3 min 5 s`.
pub(crate) fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{:.1} s", d.as_secs_f64()),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

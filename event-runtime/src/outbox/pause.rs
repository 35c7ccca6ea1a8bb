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

impl Outbox {
    /// Pauses `dest` in the store (for every worker) because it is unavailable, until this
    /// process sees it available again.
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
            paused
                .insert(
                    dest.name.clone(),
                    (Instant::now() + retry_after, retry_after),
                )
                .is_none()
        };
        if newly {
            tracing::warn!(handler = %dest.name, reason, retry_after_ms = retry_after.as_millis() as u64, "destination unavailable: paused until it is back (no attempts are used)");
            metrics::gauge!("events_destination_paused", "handler" => dest.name.clone()).set(1.0);
        }
        let now = self.inner.clock.now_ms();
        let pause = Pause {
            destination: dest.name.clone(),
            paused_by: RUNTIME.to_owned(),
            reason: storable(reason),
            at: now,
            // Lapses by itself if this process dies before resuming it.
            expires_at: Some(now + (retry_after.as_millis() as i64).max(1_000) * 3),
        };
        if let Err(e) = self.inner.store.backend().pause(&pause).await {
            tracing::warn!(handler = %dest.name, error = %ErrorChain(&e), "recording the pause failed; this process holds the destination back anyway");
        }
    }

    pub(crate) fn locally_paused(&self, name: &str) -> bool {
        self.inner
            .runtime_paused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(name)
    }

    /// Asks every destination this process paused whether it is back; resumes those that
    /// are and renews the pause of the others.
    pub(crate) async fn probe_paused(&self) {
        let due: Vec<(String, Duration)> = {
            let paused = self
                .inner
                .runtime_paused
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            paused
                .iter()
                .filter(|(_, (at, _))| *at <= now)
                .map(|(name, (_, every))| (name.clone(), *every))
                .collect()
        };
        for (name, every) in due {
            let Some(dest) = self.inner.destinations.get(&name).cloned() else {
                continue;
            };
            let back = match &dest.target {
                Target::External(d) => d.available().await,
                Target::Handler { .. } => true,
            };
            if back {
                self.inner
                    .runtime_paused
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&name);
                match self.inner.store.backend().resume(&name, RUNTIME).await {
                    Ok(_) => {
                        tracing::info!(handler = %name, "destination available again: resumed");
                        metrics::gauge!("events_destination_paused", "handler" => name.clone())
                            .set(0.0);
                        self.inner.wake.notify_waiters();
                    }
                    Err(e) => {
                        tracing::warn!(handler = %name, error = %ErrorChain(&e), "lifting the pause failed; it lapses by itself")
                    }
                }
            } else {
                self.pause_unavailable(&dest, "still unavailable", every)
                    .await;
                if let Some(entry) = self
                    .inner
                    .runtime_paused
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_mut(&name)
                {
                    entry.0 = Instant::now() + every;
                }
            }
        }
    }
}

//! The circuit breaker of each handler ([`CircuitBreaker`]): counts this process's attempts
//! of a handler in a sliding window, and when enough of them fail transiently on enough
//! distinct events, pauses the handler in the store (`paused_by` `breaker`) so that no worker
//! of any process burns attempts against a downstream that is down. After the cool-down one
//! delivery store-wide probes (the pause row's probe is taken by one worker); its success
//! lifts the pause, its transient failure starts another cool-down — without using an
//! attempt of the probed event.
//!
//! The counting is per process (each process trips on what it saw; the pause it writes holds
//! every process back); the pause and its probe are the store's.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use event_core::ErrorChain;
use uuid::Uuid;

use super::destination::Resolved;
use super::pause::human;
use super::text::storable;
use super::Outbox;
use crate::store::backend::{ClaimedDelivery, Pause, ProbeClaim, ProbeRequest};
use crate::store::BREAKER;

/// How often a process reads the breakers' pauses from the store (other processes' trips,
/// probes due, pauses lifted by hand).
const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// When a handler's deliveries pause because it keeps failing transiently — a downstream
/// API that is down — instead of each delivery burning its attempts against it (set with
/// [`OutboxConfig::circuit_breaker`](crate::OutboxConfig::circuit_breaker) for every handler,
/// or [`HandlerOptions::circuit_breaker`](crate::HandlerOptions::circuit_breaker) for one).
///
/// It trips when, within the last [`window`](Self::window), this process made at least
/// [`minimum_attempts`](Self::minimum_attempts) attempts of the handler, at least
/// [`failure_percent`](Self::failure_percent) % of them failed transiently (an error that is
/// not permanent, a time-out, a panic), and the failures were on at least
/// [`distinct_events`](Self::distinct_events) different events — one poison message retried
/// is not an outage. Successes and permanent failures count as attempts, not failures; an
/// event that cannot be decoded counts as neither.
///
/// Tripping writes a pause of the handler in the store (`paused_by` `breaker`, shown by
/// `events handler list`) that every worker of every process honours: deliveries already
/// running finish, the rest wait, no attempt is used. After [`cool_down`](Self::cool_down)
/// one worker store-wide takes the pause's probe and delivers one event — the handler's
/// oldest waiting one, whether its retry is due or not. Success (or a permanent failure: the
/// handler ran and decided) lifts the pause and the backlog flows; a transient failure gives
/// the event back without using an attempt and starts another cool-down. A probe that finds
/// nothing to deliver lifts the pause. `events handler resume NAME` lifts it by hand.
///
/// Each process reads the breakers' pauses once a second, so a probe starts within a second
/// after its cool-down (a cool-down under a second probes about once a second).
///
/// Attempts are counted per process: with several processes, each trips on what it saw
/// (so a threshold holds per process, not in total), and the pause one writes holds them all.
/// A process starts with an empty window, and a trip or a lifted pause empties it.
///
/// Relays are not subject to a breaker: a broker they cannot reach already pauses them
/// without using attempts ([`DeliveryError::Unavailable`](crate::DeliveryError::Unavailable)).
///
/// # Defaults, beside MassTransit's and Wolverine's
///
/// | | this crate | MassTransit kill switch | Wolverine listener breaker |
/// |---|---|---|---|
/// | attempts before it may trip | 20 | 100 (`ActivationThreshold`) | 10 (`MinimumThreshold`) |
/// | failure ratio | 50 % of transient failures | 10 % (`TripThreshold`) | 15 % |
/// | distinct events | 5 | — | — |
/// | window | 60 s | 1 min (`TrackingPeriod`) | 10 min |
/// | cool-down | 30 s, then one probe | 60 s (`RestartTimeout`), then the whole endpoint | 5 min, then the whole listener |
///
/// Why they differ: both count every failure of a consumer that has no retry of its own
/// behind the breaker, so they trip on a low ratio. Here the engine already retries each
/// delivery with backoff, and permanent failures go to the dead letter queue at once, so only
/// transient failures count and ordinary flakiness (a few percent of lost connections) is
/// the retries' job; an outage shows as nearly every attempt failing, so 50 % trips within
/// the first `minimum_attempts` of an outage and never on flakiness the retries absorb. 20
/// attempts is enough to tell the two apart at that ratio and reached within seconds by a
/// handler with a backlog. Distinct events stop one event that fails every time (its retries
/// are few and spaced) from passing for an outage. The window is MassTransit's; Wolverine's
/// 10 minutes would keep counting failures the retries have long recovered from. The
/// cool-down is shorter than both because what follows it is one probe, not the whole
/// backlog, and a failed probe costs no attempt.
///
/// ```
/// use std::time::Duration;
/// use event_runtime::{CircuitBreaker, OutboxConfig};
///
/// let config = OutboxConfig::default().circuit_breaker(
///     CircuitBreaker::default()
///         .failure_percent(80)
///         .cool_down(Duration::from_secs(60)),
/// );
/// assert_eq!(config.circuit_breaker.unwrap().minimum_attempts, 20);
/// ```
///
/// `#[non_exhaustive]`: build it from [`default`](Default::default) and the setters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CircuitBreaker {
    /// Attempts within the window before the breaker may trip (default 20, at least 1).
    pub minimum_attempts: u32,
    /// Percentage of those attempts that failed transiently at which it trips (default 50,
    /// 1 to 100).
    pub failure_percent: u8,
    /// Different events the transient failures must be on (default 5, at least 1).
    pub distinct_events: u32,
    /// The sliding window attempts are counted in (default 60 s).
    pub window: Duration,
    /// How long the handler stays paused before one delivery probes it (default 30 s), and
    /// again after each failed probe.
    pub cool_down: Duration,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        CircuitBreaker {
            minimum_attempts: 20,
            failure_percent: 50,
            distinct_events: 5,
            window: Duration::from_secs(60),
            cool_down: Duration::from_secs(30),
        }
    }
}

super::config::setters!(CircuitBreaker:
    minimum_attempts: u32,
    failure_percent: u8,
    distinct_events: u32,
    window: Duration,
    cool_down: Duration,
);

impl CircuitBreaker {
    /// The first setting out of range, as (field, rule).
    pub(crate) fn invalid(&self) -> Option<(&'static str, &'static str)> {
        [
            (
                "minimum_attempts",
                self.minimum_attempts == 0,
                "must be at least 1",
            ),
            (
                "failure_percent",
                !(1..=100).contains(&self.failure_percent),
                "must be between 1 and 100",
            ),
            (
                "distinct_events",
                self.distinct_events == 0,
                "must be at least 1",
            ),
            ("window", self.window.is_zero(), "must be positive"),
            ("cool_down", self.cool_down.is_zero(), "must be positive"),
        ]
        .into_iter()
        .find(|(_, bad, _)| *bad)
        .map(|(field, _, rule)| (field, rule))
    }
}

/// What an attempt of a handler came to, as its breaker counts it.
pub(crate) enum Seen {
    /// It ran.
    Success,
    /// It failed permanently: the handler ran and decided.
    Permanent,
    /// It failed transiently (an error, a time-out, a panic): the error's text.
    Transient(String),
    /// Neither (it could not be decoded): not counted.
    Inconclusive,
}

/// One handler's breaker in this process.
#[derive(Default)]
struct State {
    /// Attempts within the window: when, and the event of a transient failure.
    window: VecDeque<(Instant, Option<Uuid>)>,
    /// Paused by a breaker (this process's or another's) and not being probed here.
    open: bool,
    /// The event this process is probing the handler with.
    probe: Option<Uuid>,
}

/// The breakers of this process's handlers, and the breaker pauses read from the store.
#[derive(Default)]
pub(crate) struct Breakers {
    states: Mutex<HashMap<String, State>>,
    /// `probe_at` (ms) of every breaker pause in the store, by destination, as last read.
    pauses: Mutex<HashMap<String, i64>>,
    refreshed: Mutex<Option<Instant>>,
}

/// A store write a breaker decided, done outside any batch transaction.
pub(crate) enum Action {
    /// Pause the handler; probe after the cool-down.
    Trip { reason: String },
    /// The probe failed: stay paused, probe again after the cool-down.
    Reopen { reason: String },
    /// The probe succeeded: lift the pause.
    Close,
    /// The probe told nothing: probe again at once.
    Again,
}

impl Breakers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, State>> {
        self.states.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `destination` is paused by a breaker and not being probed by this process:
    /// its runs in flight stop between deliveries.
    pub(crate) fn is_open(&self, destination: &str) -> bool {
        self.lock().get(destination).is_some_and(|s| s.open)
    }

    /// Whether `event_id` is this process's probe of `destination`.
    pub(crate) fn is_probe(&self, destination: &str, event_id: Uuid) -> bool {
        self.lock()
            .get(destination)
            .is_some_and(|s| s.probe == Some(event_id))
    }

    /// Counts an attempt of `dest` on `event_id`; returns what to write when it trips the
    /// breaker or ends this process's probe.
    pub(crate) fn observe(&self, dest: &Resolved, event_id: Uuid, seen: &Seen) -> Option<Action> {
        let config = dest.breaker?;
        let mut states = self.lock();
        let state = states.entry(dest.name.clone()).or_default();
        if state.probe == Some(event_id) {
            state.probe = None;
            return Some(match seen {
                Seen::Success | Seen::Permanent => Action::Close,
                Seen::Transient(error) => {
                    state.open = true;
                    Action::Reopen {
                        reason: format!("circuit breaker: the probe failed: {error}"),
                    }
                }
                Seen::Inconclusive => {
                    state.open = true;
                    Action::Again
                }
            });
        }
        let failed = match seen {
            Seen::Success | Seen::Permanent => None,
            Seen::Transient(_) => Some(event_id),
            Seen::Inconclusive => return None,
        };
        if state.open || state.probe.is_some() {
            // Already tripped: attempts that were running when it tripped do not count.
            return None;
        }
        let now = Instant::now();
        state.window.push_back((now, failed));
        while state
            .window
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > config.window)
        {
            state.window.pop_front();
        }
        let attempts = state.window.len() as u64;
        let failures: Vec<Uuid> = state.window.iter().filter_map(|(_, e)| *e).collect();
        let distinct = failures.iter().collect::<HashSet<_>>().len() as u64;
        let trips = attempts >= u64::from(config.minimum_attempts)
            && failures.len() as u64 * 100 >= u64::from(config.failure_percent) * attempts
            && distinct >= u64::from(config.distinct_events);
        if !trips {
            return None;
        }
        state.window.clear();
        state.open = true;
        let error = match seen {
            Seen::Transient(e) => e.as_str(),
            _ => "",
        };
        Some(Action::Trip {
            reason: format!(
                "circuit breaker: {} of {attempts} attempts within {} failed transiently, on \
                 {distinct} events; last: {error}",
                failures.len(),
                human(config.window)
            ),
        })
    }
}

impl Outbox {
    /// Counts an attempt and writes what it decided (outside any batch transaction).
    pub(crate) async fn breaker_observe(&self, dest: &Resolved, event_id: Uuid, seen: &Seen) {
        if let Some(action) = self.inner.breakers.observe(dest, event_id, seen) {
            self.breaker_apply(dest, action).await;
        }
    }

    /// Writes the decisions a batch transaction collected, once it has ended.
    pub(crate) async fn breaker_apply_all(&self, actions: Vec<(std::sync::Arc<Resolved>, Action)>) {
        for (dest, action) in actions {
            self.breaker_apply(&dest, action).await;
        }
    }

    /// Writes a breaker's decision to the store, with its log line and metrics.
    pub(crate) async fn breaker_apply(&self, dest: &Resolved, action: Action) {
        let Some(config) = dest.breaker else {
            return;
        };
        let name = &dest.name;
        let now = self.inner.clock.now_ms();
        let cool_down_ms = config.cool_down.as_millis() as i64;
        let pause = |reason: &str, probe_at: i64| Pause {
            destination: name.clone(),
            paused_by: BREAKER.to_owned(),
            reason: storable(reason),
            at: now,
            expires_at: None,
            probe_at: Some(probe_at),
        };
        let store = self.inner.store.backend();
        let written = match &action {
            Action::Trip { reason } => {
                tracing::warn!(handler = %name, cool_down_s = config.cool_down.as_secs_f64(), reason = %reason, "circuit breaker tripped: deliveries to the handler are paused in every process (no attempts are used); one delivery probes it after the cool-down");
                metrics::counter!("events_circuit_breaker_trips_total", "destination" => name.clone())
                    .increment(1);
                metrics::gauge!("events_circuit_breaker_open", "destination" => name.clone())
                    .set(1.0);
                store.pause(&pause(reason, now + cool_down_ms)).await
            }
            Action::Reopen { reason } => {
                tracing::warn!(handler = %name, cool_down_s = config.cool_down.as_secs_f64(), reason = %reason, "circuit breaker probe failed: the handler stays paused; the probed event was given back without using an attempt");
                store.pause(&pause(reason, now + cool_down_ms)).await
            }
            Action::Again => {
                store
                    .pause(&pause("circuit breaker: probing again", now))
                    .await
            }
            Action::Close => {
                tracing::warn!(handler = %name, "circuit breaker closed: the probe succeeded, deliveries to the handler resume");
                self.breaker_closed(name);
                store.resume(name, BREAKER).await.map(|_| ())
            }
        };
        if let Err(e) = written {
            tracing::warn!(handler = %name, error = %ErrorChain(&e), "recording the circuit breaker's pause failed");
        }
        self.inner.wake.notify_waiters();
    }

    fn breaker_closed(&self, name: &str) {
        self.inner.breakers.lock().remove(name);
        self.inner
            .breakers
            .pauses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        metrics::gauge!("events_circuit_breaker_open", "destination" => name.to_owned()).set(0.0);
    }

    /// Reads the breakers' pauses from the store, at most once a second for the process:
    /// another process's trip stops this one's runs in flight, a pause lifted by hand or by
    /// another process's probe empties this one's window.
    async fn refresh_breakers(&self) {
        let breakers = &self.inner.breakers;
        {
            let mut refreshed = breakers.refreshed.lock().unwrap_or_else(|e| e.into_inner());
            if refreshed.is_some_and(|t| t.elapsed() < REFRESH_EVERY) {
                return;
            }
            *refreshed = Some(Instant::now());
        }
        let paused = match self
            .inner
            .store
            .backend()
            .paused(self.inner.clock.now_ms())
            .await
        {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %ErrorChain(&e), "reading the circuit breakers' pauses failed");
                return;
            }
        };
        let rows: HashMap<String, i64> = paused
            .into_iter()
            .filter(|p| p.paused_by == BREAKER)
            .filter(|p| {
                self.inner
                    .destinations
                    .get(&p.destination)
                    .is_some_and(|d| d.breaker.is_some())
            })
            .map(|p| {
                let at = p.probe_at.map_or(i64::MAX, |t| t.timestamp_millis());
                (p.destination, at)
            })
            .collect();
        let mut lifted = Vec::new();
        {
            let mut states = breakers.lock();
            for (name, state) in states.iter_mut() {
                let paused = rows.contains_key(name);
                if paused && !state.open && state.probe.is_none() {
                    state.open = true;
                    state.window.clear();
                } else if !paused && (state.open || state.probe.is_some()) {
                    lifted.push(name.clone());
                }
            }
            for name in rows.keys() {
                if !states.contains_key(name) {
                    states.insert(
                        name.clone(),
                        State {
                            open: true,
                            ..State::default()
                        },
                    );
                }
            }
            for name in &lifted {
                states.remove(name);
            }
        }
        for name in lifted {
            tracing::info!(handler = %name, "circuit breaker's pause lifted (by hand or by another process's probe)");
            metrics::gauge!("events_circuit_breaker_open", "destination" => name).set(0.0);
        }
        *breakers.pauses.lock().unwrap_or_else(|e| e.into_inner()) = rows;
    }

    /// Takes the probes that are due among the breakers' pauses, leasing one delivery each to
    /// `token`. Reads the pauses first (at most once a second).
    pub(crate) async fn claim_probes(&self, token: &str, owner: &str) -> Vec<ClaimedDelivery> {
        if !self
            .inner
            .destinations
            .values()
            .any(|d| d.breaker.is_some())
        {
            return Vec::new();
        }
        self.refresh_breakers().await;
        let now = self.inner.clock.now_ms();
        let due: Vec<String> = self
            .inner
            .breakers
            .pauses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(name, _)| name.clone())
            .collect();
        let mut claimed = Vec::new();
        for name in due {
            let Some(dest) = self.inner.destinations.get(&name).cloned() else {
                continue;
            };
            let lease = self.inner.config.lease.as_millis() as i64;
            let req = ProbeRequest {
                destination: &name,
                token,
                owner,
                lease_expires_at: now + lease,
                probe_until: now + dest.timeout.as_millis() as i64 + lease,
                now,
            };
            let result = self.inner.store.backend().claim_probe(&req).await;
            // Whatever came of it, not again before the next read of the pauses.
            if let Some(at) = self
                .inner
                .breakers
                .pauses
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_mut(&name)
            {
                *at = req.probe_until;
            }
            match result {
                Ok(ProbeClaim::Claimed(d)) => {
                    tracing::info!(handler = %name, event_id = %d.event_id, "circuit breaker probe: delivering one event");
                    let mut states = self.inner.breakers.lock();
                    let state = states.entry(name.clone()).or_default();
                    state.open = false;
                    state.probe = Some(d.event_id);
                    claimed.push(d);
                }
                Ok(ProbeClaim::Nothing) => {
                    tracing::warn!(handler = %name, "circuit breaker closed: nothing was waiting to probe it with");
                    self.breaker_closed(&name);
                    self.inner.wake.notify_waiters();
                }
                Ok(ProbeClaim::NotDue) => {}
                Err(e) => {
                    tracing::warn!(handler = %name, error = %ErrorChain(&e), "taking a circuit breaker's probe failed")
                }
            }
        }
        claimed
    }
}

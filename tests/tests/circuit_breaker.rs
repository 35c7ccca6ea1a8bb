//! The circuit breaker of a handler: an outage (every attempt failing transiently) trips it,
//! its pause holds back every process's workers without using attempts, one delivery
//! store-wide probes after each cool-down — a failed probe uses no attempt — and the first
//! probe that succeeds lets the backlog flow; one poison event never trips it; an operator
//! lifts it by hand; settings out of range are start-up errors. Runs on SQLite and on
//! PostgreSQL.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
use event_runtime::{
    CircuitBreaker, ConfigError, Dispatcher, HandlerOptions, Outbox, OutboxConfig, OutboxError,
    RetryPolicy, SqlValue, Store,
};
use serde::{Deserialize, Serialize};

const DOWNSTREAM: &str = "breaker.downstream";

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "breaker.shipped", version = 1)]
struct Shipped {
    #[event(aggregate_id)]
    parcel: String,
    /// The test case: its downstream's state.
    case: String,
}

/// One case's downstream API.
#[derive(Default)]
struct Downstream {
    /// Down: every call fails transiently.
    down: AtomicBool,
    /// The parcel that always fails transiently (a poison message), if any.
    poison: Mutex<Option<String>>,
    calls: AtomicU32,
    /// Parcels whose call succeeded.
    done: Mutex<HashSet<String>>,
    /// Calls of the other handler.
    other: AtomicU32,
}

fn case(name: &str) -> Arc<Downstream> {
    static CASES: OnceLock<Mutex<HashMap<String, Arc<Downstream>>>> = OnceLock::new();
    let mut cases = CASES.get_or_init(Default::default).lock().unwrap();
    Arc::clone(cases.entry(name.to_owned()).or_default())
}

/// Calls the downstream API (no transaction).
#[event_handler(name = "breaker.downstream")]
async fn downstream(e: &Envelope<Shipped>) -> Result<(), HandlerError> {
    let api = case(&e.event().case);
    api.calls.fetch_add(1, Ordering::SeqCst);
    let poisoned = api.poison.lock().unwrap().as_deref() == Some(&e.event().parcel);
    if api.down.load(Ordering::SeqCst) || poisoned {
        return Err(HandlerError::transient_msg("503 Service Unavailable"));
    }
    api.done.lock().unwrap().insert(e.event().parcel.clone());
    Ok(())
}

/// Another handler of the same event, always fine.
#[event_handler(name = "breaker.other")]
async fn other(e: &Envelope<Shipped>) {
    case(&e.event().case).other.fetch_add(1, Ordering::SeqCst);
}

fn outbox(store: Store, breaker: CircuitBreaker, retry: RetryPolicy) -> Outbox {
    Outbox::builder(store)
        .dispatcher(
            Dispatcher::builder_empty()
                .handler::<downstream>()
                .handler::<other>(),
        )
        .config(
            OutboxConfig::default()
                .poll_interval(Duration::from_millis(20))
                .lease(Duration::from_secs(2))
                .retry(retry)
                .circuit_breaker(breaker),
        )
        .build()
        .unwrap()
}

async fn commit(outbox: &Outbox, case: &str, parcels: usize) {
    let mut uow = outbox.begin().await.unwrap();
    for i in 0..parcels {
        uow.add(Envelope::new(Shipped {
            parcel: format!("p{i}"),
            case: case.to_owned(),
        }));
    }
    uow.commit().await.unwrap();
}

/// The breaker's pause of the downstream handler, if any: its `probe_at`.
async fn breaker_pause(store: &Store) -> Option<Option<chrono::DateTime<chrono::Utc>>> {
    store
        .paused_destinations()
        .await
        .unwrap()
        .into_iter()
        .find(|p| p.destination == DOWNSTREAM && p.paused_by == "breaker")
        .map(|p| p.probe_at)
}

async fn wait_for(what: &str, timeout: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Attempts recorded on the downstream handler's deliveries, in all.
async fn attempts(store: &Store) -> i64 {
    let mut tx = store.begin().await.unwrap();
    let n = tx
        .fetch_i64(
            "SELECT COALESCE(SUM(attempts), 0) FROM event_deliveries WHERE handler = $1",
            &[SqlValue::Text(DOWNSTREAM)],
        )
        .await
        .unwrap()
        .unwrap_or(0);
    tx.rollback().await.unwrap();
    n
}

fn stats_of<'a>(
    stats: &'a event_runtime::OutboxStats,
    handler: &str,
) -> &'a event_runtime::HandlerStats {
    stats
        .handlers
        .iter()
        .find(|h| h.handler == handler)
        .expect("handler stats")
}

#[test]
fn an_outage_pauses_every_process_probes_one_delivery_per_cool_down_and_resumes() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for db in rt.block_on(common::databases("breaker_outage")) {
        let gauges = common::Gauges::new();
        metrics::with_local_recorder(&gauges, || {
            rt.block_on(async {
                let label = db.label();
                let name = format!("outage-{label}");
                let api = case(&name);
                api.down.store(true, Ordering::SeqCst);
                let cool_down = Duration::from_millis(500);
                let breaker = CircuitBreaker::default()
                    .minimum_attempts(10)
                    .failure_percent(50)
                    .distinct_events(3)
                    .cool_down(cool_down);
                // Without the breaker, 60 events × 6 fast attempts would reach the dead
                // letter queue within seconds.
                let retry = RetryPolicy::default()
                    .max_attempts(6)
                    .initial_backoff(Duration::from_millis(100))
                    .max_backoff(Duration::from_millis(200));
                // Two "processes": two outboxes over the same database.
                let a = outbox(db.open().await, breaker, retry);
                let b = outbox(db.open().await, breaker, retry);
                commit(&a, &name, 60).await;
                let wa = a.spawn_workers(2);
                let wb = b.spawn_workers(2);
                let store = db.open().await;

                wait_for("the breaker to trip", Duration::from_secs(30), async || {
                    breaker_pause(&store).await.is_some()
                })
                .await;
                let tripped = api.calls.load(Ordering::SeqCst);
                assert!(
                    tripped >= 10,
                    "{label}: tripped after {tripped} calls, fewer than minimum_attempts"
                );
                let probe_at = breaker_pause(&store).await.unwrap();
                assert!(probe_at.is_some(), "{label}: a breaker pause has a probe time");

                // The other handler keeps flowing.
                wait_for("the other handler", Duration::from_secs(30), async || {
                    api.other.load(Ordering::SeqCst) >= 60
                })
                .await;

                // What was running at the trip has finished before the first probe.
                tokio::time::sleep(cool_down / 2).await;
                let tripped = api.calls.load(Ordering::SeqCst);
                let used = attempts(&store).await;

                // Held for eight cool-downs: one probe per cool-down, store-wide, and none
                // of them uses an attempt.
                let held = cool_down * 8;
                tokio::time::sleep(held).await;
                let during = api.calls.load(Ordering::SeqCst) - tripped;
                assert_eq!(
                    attempts(&store).await,
                    used,
                    "{label}: the failed probes used attempts"
                );
                assert!(
                    (2..=9).contains(&during),
                    "{label}: {during} calls in {held:?} while paused: expected at most one probe per {cool_down:?}, and some"
                );
                assert!(
                    breaker_pause(&store).await.is_some(),
                    "{label}: failed probes keep the pause"
                );
                let stats = store.stats().await.unwrap();
                assert_eq!(
                    stats_of(&stats, DOWNSTREAM).dead,
                    0,
                    "{label}: no event reached the dead letter queue: probes use no attempt"
                );
                assert_eq!(
                    gauges.get("events_circuit_breaker_open", DOWNSTREAM),
                    Some(1.0),
                    "{label}"
                );

                // Back up: the next probe succeeds and the backlog flows.
                api.down.store(false, Ordering::SeqCst);
                wait_for("the backlog to flow", Duration::from_secs(30), async || {
                    api.done.lock().unwrap().len() == 60
                })
                .await;
                wait_for("the pause to be lifted", Duration::from_secs(10), async || {
                    breaker_pause(&store).await.is_none()
                })
                .await;
                wa.shutdown(Duration::from_secs(10)).await.unwrap();
                wb.shutdown(Duration::from_secs(10)).await.unwrap();
                let stats = store.stats().await.unwrap();
                let s = stats_of(&stats, DOWNSTREAM);
                assert_eq!((s.completed, s.pending, s.dead), (60, 0, 0), "{label}");
                assert_eq!(
                    gauges.get("events_circuit_breaker_open", DOWNSTREAM),
                    Some(0.0),
                    "{label}"
                );
            })
        });
    }
}

#[tokio::test]
async fn one_poison_event_retried_never_trips_the_breaker() {
    for db in common::databases("breaker_poison").await {
        let label = db.label();
        let name = format!("poison-{label}");
        let api = case(&name);
        *api.poison.lock().unwrap() = Some("p0".into());
        // Trips at 10 % over 5 attempts — but only on failures of 2 events or more.
        let breaker = CircuitBreaker::default()
            .minimum_attempts(5)
            .failure_percent(10)
            .distinct_events(2);
        let retry = RetryPolicy::default()
            .max_attempts(8)
            .initial_backoff(Duration::from_millis(10))
            .max_backoff(Duration::from_millis(20));
        let outbox = outbox(db.open().await, breaker, retry);
        commit(&outbox, &name, 30).await;
        let report = outbox.drain(Duration::from_secs(60)).await.unwrap();
        assert_eq!(
            report.dead_lettered, 1,
            "{label}: the poison event, exhausted"
        );
        let store = db.open().await;
        assert!(breaker_pause(&store).await.is_none(), "{label}");
        assert_eq!(api.done.lock().unwrap().len(), 29, "{label}");
        assert_eq!(api.calls.load(Ordering::SeqCst), 29 + 8, "{label}");
    }
}

#[tokio::test]
async fn an_operator_lifts_the_breakers_pause_with_handler_resume() {
    for db in common::databases("breaker_resume").await {
        let label = db.label();
        let name = format!("resume-{label}");
        let api = case(&name);
        api.down.store(true, Ordering::SeqCst);
        let breaker = CircuitBreaker::default()
            .minimum_attempts(4)
            .distinct_events(2)
            .cool_down(Duration::from_secs(3600));
        let retry = RetryPolicy::default()
            .max_attempts(10)
            .initial_backoff(Duration::from_millis(10))
            .max_backoff(Duration::from_millis(20));
        let outbox = outbox(db.open().await, breaker, retry);
        commit(&outbox, &name, 10).await;
        let workers = outbox.spawn_workers(1);
        let store = db.open().await;
        wait_for("the breaker to trip", Duration::from_secs(30), async || {
            breaker_pause(&store).await.is_some()
        })
        .await;

        let mut argv = vec!["events".to_owned(), "handler".to_owned(), "list".to_owned()];
        argv.extend(db.cli_args());
        let (ok, out, err) = common::events_tool(argv).await;
        assert!(ok, "{label}: {err}");
        assert!(out.contains("by breaker"), "{label}: {out}");
        assert!(out.contains("probe at"), "{label}: {out}");

        api.down.store(false, Ordering::SeqCst);
        let mut argv: Vec<String> = [
            "events",
            "handler",
            "resume",
            DOWNSTREAM,
            "--reason",
            "the API is back",
            "--actor",
            "alice",
        ]
        .map(String::from)
        .to_vec();
        argv.extend(db.cli_args());
        let (ok, out, err) = common::events_tool(argv).await;
        assert!(ok, "{label}: {err}");
        assert!(
            out.contains("the circuit breaker's pause is lifted"),
            "{label}: {out}"
        );
        wait_for("the backlog to flow", Duration::from_secs(30), async || {
            api.done.lock().unwrap().len() == 10
        })
        .await;
        workers.shutdown(Duration::from_secs(10)).await.unwrap();
        let audit = store.audit_log(10).await.unwrap();
        assert!(
            audit
                .iter()
                .any(|e| e.action == "resume" && e.actor == "alice"),
            "{label}: {audit:?}"
        );
    }
}

#[tokio::test]
async fn a_breaker_setting_out_of_range_is_a_start_up_error() {
    let (_, store) = common::sqlite("breaker_config").await;
    for (breaker, field) in [
        (
            CircuitBreaker::default().failure_percent(0),
            "failure_percent",
        ),
        (
            CircuitBreaker::default().failure_percent(101),
            "failure_percent",
        ),
        (
            CircuitBreaker::default().minimum_attempts(0),
            "minimum_attempts",
        ),
        (
            CircuitBreaker::default().distinct_events(0),
            "distinct_events",
        ),
        (CircuitBreaker::default().window(Duration::ZERO), "window"),
        (
            CircuitBreaker::default().cool_down(Duration::ZERO),
            "cool_down",
        ),
    ] {
        let e = Outbox::builder(store.clone())
            .dispatcher(Dispatcher::builder_empty().handler::<downstream>())
            .config(OutboxConfig::default().circuit_breaker(breaker))
            .build()
            .unwrap_err();
        match &e {
            OutboxError::Config(ConfigError::CircuitBreaker { field: f, .. }) => {
                assert_eq!(*f, field, "{e}")
            }
            other => panic!("{field}: {other}"),
        }
        assert!(e.to_string().contains(field) || format!("{:?}", e).contains(field));
    }
    // A handler given a breaker and told to have none is asked to choose.
    let e = Outbox::builder(store.clone())
        .dispatcher(Dispatcher::builder_empty().handler::<downstream>())
        .handler_options(
            "breaker.downstream",
            HandlerOptions::default()
                .circuit_breaker(CircuitBreaker::default())
                .no_circuit_breaker(),
        )
        .build()
        .unwrap_err();
    assert!(
        matches!(
            e,
            OutboxError::Config(ConfigError::CircuitBreaker {
                field: "no_circuit_breaker",
                ..
            })
        ),
        "{e}"
    );
}

//! A worker process killed with SIGKILL while it delivers to a handler that takes no
//! transaction (an HTTP call): after a restart every event is delivered, only the calls that
//! were in flight at the kill are made again, and the restart does not wait longer than one
//! lease for the dead process's deliveries. Runs on SQLite and on PostgreSQL.
//!
//! The worker is this test binary run again (`child` below, which does nothing unless
//! `KILL_TEST_CHILD` is set); both processes append one line per handler start and end to a
//! shared file (`O_APPEND` writes of one short line do not interleave).

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use event_core::{event_handler, DomainEvent, Envelope};
use event_runtime::{Dispatcher, Outbox, OutboxConfig, Store};
use serde::{Deserialize, Serialize};

const EVENTS: usize = 24;
const CONCURRENCY: usize = 4;
const CALL: Duration = Duration::from_millis(250);
const LEASE: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "kill.ordered", version = 1)]
struct Ordered {
    #[event(aggregate_id)]
    order: String,
}

static LOG: OnceLock<PathBuf> = OnceLock::new();

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

fn log(line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(LOG.get().expect("log path set"))
        .unwrap();
    f.write_all(format!("{line}\n").as_bytes()).unwrap();
}

/// An external call: takes no transaction, lasts [`CALL`].
#[event_handler(name = "kill.notify")]
async fn notify(e: &Envelope<Ordered>) {
    let (id, pid, order) = (e.id(), std::process::id(), &e.event().order);
    log(&format!("start {id} {pid} {} {order}", now_ms()));
    tokio::time::sleep(CALL).await;
    log(&format!("end {id} {pid} {} {order}", now_ms()));
}

fn outbox(store: Store) -> Outbox {
    Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().handler::<notify>())
        .config(
            OutboxConfig::default()
                .lease(LEASE)
                .concurrency(CONCURRENCY)
                .batch_size(8)
                .poll_interval(Duration::from_millis(20)),
        )
        .build()
        .unwrap()
}

async fn open(url: &str, schema: Option<&str>) -> Store {
    match schema {
        Some(s) => event_runtime::store::postgres::connect_in_schema(url, s)
            .await
            .unwrap(),
        None => Store::connect(url).await.unwrap(),
    }
}

/// The worker process: delivers until it is killed.
#[tokio::test]
async fn child() {
    let Ok(url) = std::env::var("KILL_TEST_CHILD") else {
        return;
    };
    LOG.set(std::env::var("KILL_TEST_LOG").unwrap().into())
        .unwrap();
    let schema = std::env::var("KILL_TEST_SCHEMA").ok();
    let outbox = outbox(open(&url, schema.as_deref()).await);
    let _workers = outbox.spawn_workers(1);
    tokio::time::sleep(Duration::from_secs(120)).await;
}

struct Line {
    start: bool,
    id: String,
    pid: u32,
    at: u128,
    order: String,
}

/// The lines of one test's events (both tests of this binary share its log file).
fn lines(path: &Path, label: &str) -> Vec<Line> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut p = l.split(' ');
            Some(Line {
                start: p.next()? == "start",
                id: p.next()?.to_string(),
                pid: p.next()?.parse().ok()?,
                at: p.next()?.parse().ok()?,
                order: p.next()?.to_string(),
            })
        })
        .filter(|l| l.order.starts_with(&format!("{label}-")))
        .collect()
}

async fn killed_worker(label: &str, url: &str, schema: Option<&str>) {
    let log_path = LOG
        .get_or_init(|| common::temp_dir().join(format!("{}.log", common::unique("kill"))))
        .clone();
    let producer = outbox(open(url, schema).await);
    let mut uow = producer.begin().await.unwrap();
    for i in 0..EVENTS {
        uow.add(Envelope::new(Ordered {
            order: format!("{label}-{i}"),
        }));
    }
    uow.commit().await.unwrap();

    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["child", "--exact", "--nocapture", "--test-threads=1"])
        .env("KILL_TEST_CHILD", url)
        .env("KILL_TEST_LOG", &log_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(s) = schema {
        cmd.env("KILL_TEST_SCHEMA", s);
    }
    let mut child = cmd.spawn().unwrap();
    let pid = child.id();

    // Kill it in the middle: after some calls have ended, while others run.
    let waited = Instant::now();
    while lines(&log_path, label)
        .iter()
        .filter(|l| !l.start && l.pid == pid)
        .count()
        < 8
    {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "{label}: the worker process made no progress"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(CALL / 2).await;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let killed_at = now_ms();
    let before = lines(&log_path, label);

    // The restarted process (this one) delivers the rest.
    let restarted = Instant::now();
    let report = producer.drain(Duration::from_secs(60)).await.unwrap();
    let took = restarted.elapsed();
    let after = lines(&log_path, label);

    let mut calls: std::collections::HashMap<&str, (u32, u32)> = Default::default();
    for l in after.iter().filter(|l| l.start) {
        let c = calls.entry(&l.id).or_default();
        if l.pid == pid {
            c.0 += 1;
        } else {
            c.1 += 1;
        }
    }
    assert_eq!(calls.len(), EVENTS, "{label}: every event was called");
    let repeated: Vec<&str> = calls
        .iter()
        .filter(|(_, (killed, restarted))| killed + restarted > 1)
        .map(|(id, _)| *id)
        .collect();
    // A call repeated must have been in flight at the kill: started and not ended, or ended
    // just before it (its outcome not yet settled).
    let ended_long_before: Vec<&str> = before
        .iter()
        .filter(|l| !l.start && l.pid == pid && l.at + 200 < killed_at)
        .map(|l| l.id.as_str())
        .collect();
    for id in &repeated {
        assert!(
            !ended_long_before.contains(id),
            "{label}: {id} was called again although its call had ended well before the kill"
        );
    }
    assert!(
        repeated.len() <= CONCURRENCY + 2,
        "{label}: {} calls repeated, more than were in flight ({CONCURRENCY} at a time)",
        repeated.len()
    );
    let ended_before = before.iter().filter(|l| !l.start).count();
    assert!(
        report.completed as usize <= EVENTS - ended_before + CONCURRENCY + 2,
        "{label}: the restart redelivered completed events ({report:?})"
    );
    // The dead process's leases are given up within one lease; the rest is call time.
    let remaining = (EVENTS - ended_before) as u32;
    let bound = LEASE + CALL * (remaining / CONCURRENCY as u32 + 2) + Duration::from_secs(2);
    assert!(
        took <= bound,
        "{label}: the restart took {took:?} (bound {bound:?}: one lease of {LEASE:?} and the calls)"
    );
    eprintln!(
        "{label}: {ended_before} calls had ended before the kill, {} repeated, restart took {took:?}",
        repeated.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_repeats_only_its_calls_in_flight_sqlite() {
    let url = common::sqlite_url("kill");
    killed_worker("sqlite", &url, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_repeats_only_its_calls_in_flight_postgres() {
    let Some(url) = common::postgres_url("a_killed_worker_repeats_only_its_calls_in_flight") else {
        return;
    };
    let schema = common::unique("kill");
    killed_worker("postgres", &url, Some(&schema)).await;
}

//! The RabbitMQ relay through the broker's own faults, on the machine's broker
//! (`EVENTS_TEST_AMQP_URL`, driven with `rabbitmqctl`): a restart (`stop_app` / `start_app`)
//! and a memory alarm that blocks publishers (the high watermark set near zero). The relay
//! pauses while the broker is away or blocking, says why, uses no attempt, and resumes by
//! itself; every event reaches the durable queue, each aggregate's first copies in order (a
//! publish the broker stored but could not confirm is sent again: a duplicate the consumer's
//! inbox drops by its event id). Its own test binary, one case at a time: a fault would disturb
//! any other RabbitMQ test running beside it. Guards start the broker again and restore the
//! watermark whatever happens.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::process::Command;
use std::time::{Duration, Instant};

use event_core::{DomainEvent, Envelope};
use event_runtime::transport::rabbitmq::{AmqpRelay, RelayConfig};
use event_runtime::{DeadLetterFilter, Dispatcher, Outbox, RetryPolicy};
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "amqpfault.parcel.moved", version = 1)]
struct Moved {
    #[event(aggregate_id)]
    parcel: String,
    hop: u32,
}

fn rabbitmqctl(args: &[&str]) -> Result<(), String> {
    let output = Command::new("rabbitmqctl")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run rabbitmqctl: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "rabbitmqctl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// One fault at a time in this binary.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Starts the broker's application again when dropped, whatever happened.
struct StartAgain;

impl Drop for StartAgain {
    fn drop(&mut self) {
        let _ = rabbitmqctl(&["start_app"]);
        let _ = rabbitmqctl(&["await_startup"]);
    }
}

async fn channel(url: &str) -> (Connection, Channel) {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| panic!("RabbitMQ at {url} is unreachable: {e}"));
    let channel = connection.create_channel().await.unwrap();
    (connection, channel)
}

/// The broker's URL, or `None` after saying why the case is skipped (no URL, or no
/// `rabbitmqctl` to drive the broker with).
fn broker(test: &str) -> Option<String> {
    let url = common::amqp_url(test)?;
    if let Err(why) = rabbitmqctl(&["status"]) {
        assert!(
            std::env::var("EVENTS_TEST_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "{test}: EVENTS_TEST_REQUIRE_SERVICES=1 but the broker cannot be driven: {why}"
        );
        common::say_once("rabbitmqctl", &format!("{test}: skipped: {why}"));
        return None;
    }
    Some(url)
}

const PARCELS: usize = 20;
const HOPS: u32 = 15;

/// A durable exchange and a durable queue bound to `events.#`, and an outbox whose relay
/// publishes there, holding `PARCELS` × `HOPS` committed events.
async fn setup(test: &str, url: &str) -> (String, String, Outbox, event_runtime::Store) {
    setup_with(test, url, PARCELS).await
}

/// [`setup`] with `parcels` parcels.
async fn setup_with(
    test: &str,
    url: &str,
    parcels: usize,
) -> (String, String, Outbox, event_runtime::Store) {
    let id = common::unique(test);
    let (exchange, queue) = (format!("x-{id}"), format!("q-{id}"));
    let (_connection, ch) = channel(url).await;
    ch.exchange_declare(
        exchange.as_str().into(),
        ExchangeKind::Topic,
        ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_declare(
        queue.as_str().into(),
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_bind(
        queue.as_str().into(),
        exchange.as_str().into(),
        "events.#".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();

    let relay = AmqpRelay::new(
        url,
        RelayConfig::new(&exchange).retry(RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(50),
        }),
    );
    let (_, store) = common::sqlite(test).await;
    let outbox = Outbox::builder(store.clone())
        .dispatcher(Dispatcher::builder_empty().event::<Moved>())
        .destination(relay)
        .build()
        .unwrap();
    for hop in 1..=HOPS {
        let mut uow = outbox.begin().await.unwrap();
        for p in 0..parcels {
            uow.add(
                Envelope::new(Moved {
                    parcel: format!("p{p}"),
                    hop,
                })
                .with_sequence(u64::from(hop)),
            );
        }
        uow.commit().await.unwrap();
    }
    (exchange, queue, outbox, store)
}

#[tokio::test]
async fn a_broker_restart_pauses_the_relay_and_loses_nothing() {
    const TEST: &str = "amqp_restart";
    let Some(url) = broker(TEST) else {
        return;
    };
    let _alone = ALONE.lock().await;
    let (exchange, queue, outbox, store) = setup(TEST, &url).await;
    let total = PARCELS * HOPS as usize;

    let workers = outbox.spawn_workers(1);
    // Stop the broker once some are out, for a few seconds.
    let start = Instant::now();
    while store.stats().await.unwrap().pending as usize > total * 2 / 3 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "nothing published"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let guard = StartAgain;
    rabbitmqctl(&["stop_app"]).unwrap();
    let start = Instant::now();
    loop {
        let paused = store
            .paused_destinations()
            .await
            .unwrap()
            .into_iter()
            .any(|p| p.destination == format!("amqp:{exchange}"));
        if paused {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "never paused");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pending_while_away = store.stats().await.unwrap().pending;
    assert!(pending_while_away > 0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    drop(guard);

    all_published_none_dead(&store, workers, "after the restart").await;
    expect_all_in_order(&url, &exchange, &queue, total).await;
}

/// Waits until nothing is pending (60 s at most), stops `workers`, and finds no dead letter.
async fn all_published_none_dead(
    store: &event_runtime::Store,
    workers: event_runtime::Workers,
    when: &str,
) {
    let start = Instant::now();
    while store.stats().await.unwrap().pending > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "not all published {when}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    workers.shutdown(Duration::from_secs(10)).await.unwrap();
    let dead = store
        .dead_letters(&DeadLetterFilter::default())
        .await
        .unwrap();
    assert!(dead.is_empty(), "{dead:?}");
}

/// Every event of the run in the durable queue `queue`, each aggregate's first copies in order;
/// then the queue and `exchange` deleted.
async fn expect_all_in_order(url: &str, exchange: &str, queue: &str, total: usize) {
    let (_connection, ch) = channel(url).await;
    let mut seen = HashSet::new();
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    let mut copies = 0;
    while let Some(m) = ch
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        copies += 1;
        let body: serde_json::Value = serde_json::from_slice(&m.delivery.data).unwrap();
        if !seen.insert(body["id"].as_str().unwrap().to_owned()) {
            continue;
        }
        let parcel = body["subject"].as_str().unwrap().to_owned();
        let sequence: u64 = body["sequence"].as_str().unwrap().parse().unwrap();
        let before = last.insert(parcel.clone(), sequence).unwrap_or(0);
        assert_eq!(sequence, before + 1, "{parcel}: out of order");
    }
    assert_eq!(
        seen.len(),
        total,
        "{copies} messages, {} distinct",
        seen.len()
    );
    let _ = ch
        .queue_delete(queue.into(), QueueDeleteOptions::default())
        .await;
    let _ = ch
        .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
        .await;
}

/// Closes every client connection of the broker (`rabbitmqctl close_connection`): this test's
/// relay's among them, with publishes in flight.
fn close_all_connections() -> usize {
    let out = Command::new("rabbitmqctl")
        .args(["list_connections", "pid", "--quiet", "--no-table-headers"])
        .output()
        .unwrap();
    let pids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('<'))
        .map(str::to_owned)
        .collect();
    for pid in &pids {
        let _ = rabbitmqctl(&["close_connection", pid, "test: connection dropped"]);
    }
    pids.len()
}

#[tokio::test]
async fn connections_dropped_under_64_publishes_in_flight_lose_nothing() {
    const TEST: &str = "amqp_dropped";
    const MANY: usize = 64;
    let Some(url) = broker(TEST) else {
        return;
    };
    let _alone = ALONE.lock().await;
    // 64 aggregates: one publish of each in flight at once, on one channel.
    let (exchange, queue, outbox, store) = setup_with(TEST, &url, MANY).await;
    let total = MANY * HOPS as usize;
    let workers = outbox.spawn_workers(2);
    for cut in 1..=3 {
        let start = Instant::now();
        while store.stats().await.unwrap().pending as usize > total * (4 - cut) / 4 {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "nothing published"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let closed = close_all_connections();
        assert!(closed > 0, "no connection to close");
    }
    all_published_none_dead(&store, workers, "after the connections dropped").await;
    // A publish the broker never got is never reported as confirmed: every event is there.
    expect_all_in_order(&url, &exchange, &queue, total).await;
}

/// Restores the memory high watermark when dropped, whatever happened.
struct Watermark(String);

impl Drop for Watermark {
    fn drop(&mut self) {
        let _ = rabbitmqctl(&["set_vm_memory_high_watermark", &self.0]);
    }
}

#[tokio::test]
async fn a_memory_alarm_pauses_the_relay_and_says_so_until_it_clears() {
    const TEST: &str = "amqp_alarm";
    let Some(url) = broker(TEST) else {
        return;
    };
    let _alone = ALONE.lock().await;
    let (exchange, queue, outbox, store) = setup(TEST, &url).await;
    let total = PARCELS * HOPS as usize;
    let before = Command::new("rabbitmqctl")
        .args(["eval", "vm_memory_monitor:get_vm_memory_high_watermark()."])
        .output()
        .unwrap();
    let before = String::from_utf8_lossy(&before.stdout).trim().to_owned();
    let before = if before.parse::<f64>().is_ok() {
        before
    } else {
        "0.4".to_owned()
    };
    let restore = Watermark(before);
    rabbitmqctl(&["set_vm_memory_high_watermark", "0.0000001"]).unwrap();

    let workers = outbox.spawn_workers(1);
    let destination = format!("amqp:{exchange}");
    let start = Instant::now();
    loop {
        let reason = store
            .paused_destinations()
            .await
            .unwrap()
            .into_iter()
            .find(|p| p.destination == destination)
            .map(|p| p.reason);
        if reason
            .as_deref()
            .is_some_and(|r| r.contains("blocks publishers"))
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never paused for the alarm: {reason:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(store.stats().await.unwrap().pending > 0);
    drop(restore);

    all_published_none_dead(&store, workers, "after the alarm cleared").await;
    expect_all_in_order(&url, &exchange, &queue, total).await;
}

#[tokio::test]
async fn a_new_process_drains_everything_once_a_memory_alarm_has_cleared() {
    const TEST: &str = "amqp_alarm_then_drain";
    let Some(url) = broker(TEST) else {
        return;
    };
    let _alone = ALONE.lock().await;
    let (exchange, queue, outbox, store) = setup(TEST, &url).await;
    let total = PARCELS * HOPS as usize;
    {
        let _restore = Watermark("0.4".into());
        rabbitmqctl(&["set_vm_memory_high_watermark", "0.0000001"]).unwrap();
        // The first process: the broker blocks it; drain returns with the relay paused.
        let _ = outbox.drain(Duration::from_secs(5)).await.unwrap();
        drop(outbox);
    }
    // Past the alarm (cleared when the watermark is restored) and the pause's own expiry.
    let start = Instant::now();
    while !Command::new("rabbitmqctl")
        .args(["eval", "rabbit_alarm:get_alarms()."])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "[]")
        .unwrap_or(true)
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the alarm never cleared"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    // A new process on the same database: drain publishes every event.
    let relay = AmqpRelay::new(&url, RelayConfig::new(&exchange));
    let again = Outbox::builder(store.clone())
        .dispatcher(Dispatcher::builder_empty().event::<Moved>())
        .destination(relay)
        .build()
        .unwrap();
    again.drain(Duration::from_secs(60)).await.unwrap();
    assert_eq!(
        store.stats().await.unwrap().pending,
        0,
        "drain returned with deliveries pending"
    );
    expect_all_in_order(&url, &exchange, &queue, total).await;
}

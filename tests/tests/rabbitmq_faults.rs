//! The RabbitMQ relay through a broker restart (`rabbitmqctl stop_app` / `start_app` on the
//! machine's broker, `EVENTS_TEST_AMQP_URL`): the relay pauses while the broker is away, uses
//! no attempt, and resumes by itself; every event reaches the durable queue, each aggregate's
//! first copies in order (a publish the broker stored but could not confirm before it stopped
//! is sent again: a duplicate the consumer's inbox drops by its event id). Its own test binary:
//! the restart would disturb any other RabbitMQ test running beside it. A guard starts the
//! broker again whatever happens.

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

#[tokio::test]
async fn a_broker_restart_pauses_the_relay_and_loses_nothing() {
    const TEST: &str = "amqp_restart";
    let Some(url) = common::amqp_url(TEST) else {
        return;
    };
    if let Err(why) = rabbitmqctl(&["status"]) {
        assert!(
            std::env::var("EVENTS_TEST_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "{TEST}: EVENTS_TEST_REQUIRE_SERVICES=1 but the broker cannot be restarted: {why}"
        );
        common::say_once("RabbitMQ restart", &format!("{TEST}: skipped: {why}"));
        return;
    }
    let id = common::unique(TEST);
    let (exchange, queue) = (format!("x-{id}"), format!("q-{id}"));
    let (_connection, ch) = channel(&url).await;
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
        &url,
        RelayConfig::new(&exchange).retry(RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(50),
        }),
    );
    let (_, store) = common::sqlite(TEST).await;
    let outbox = Outbox::builder(store.clone())
        .dispatcher(Dispatcher::builder_empty().event::<Moved>())
        .destination(relay)
        .build()
        .unwrap();
    const PARCELS: usize = 20;
    const HOPS: u32 = 15;
    for hop in 1..=HOPS {
        let mut uow = outbox.begin().await.unwrap();
        for p in 0..PARCELS {
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

    let start = Instant::now();
    while store.stats().await.unwrap().pending > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "not all published after the restart"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    workers.shutdown(Duration::from_secs(10)).await.unwrap();
    let dead = store
        .dead_letters(&DeadLetterFilter::default())
        .await
        .unwrap();
    assert!(dead.is_empty(), "{dead:?}");

    // Every event in the durable queue; each aggregate's first copies in order.
    let (_connection, ch) = channel(&url).await;
    let mut seen = HashSet::new();
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    let mut copies = 0;
    while let Some(m) = ch
        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
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
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    let _ = ch
        .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
        .await;
}

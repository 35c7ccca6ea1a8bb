//! The RabbitMQ relay against the real broker (`EVENTS_TEST_AMQP_URL`, skipped when unset,
//! failing with `EVENTS_TEST_REQUIRE_SERVICES=1`): each event published once per delivery as a
//! persistent CloudEvents message with its event id and aggregate chain, each aggregate in
//! order; a missing exchange, an unroutable event and an unreachable broker pause the relay
//! without using attempts, and it resumes by itself once the topology is there; a nack is a
//! transient failure. Each test uses exchanges and queues of its own, deleted at the end.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use event_core::{DomainEvent, Envelope};
use event_runtime::transport::rabbitmq::{AmqpError, AmqpRelay, RelayConfig};
use event_runtime::{DeadLetterFilter, Dispatcher, Outbox, RetryPolicy, Store};
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "amqptest.parcel.moved", version = 1)]
struct Moved {
    #[event(aggregate_id)]
    parcel: String,
    hop: u32,
}

fn fast_retry(attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts: attempts,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
    }
}

/// The broker, an exchange name and a queue name of this test's own, and a channel to set
/// the topology up and read the queue; both are deleted when dropped.
struct Broker {
    url: String,
    exchange: String,
    queue: String,
    channel: Channel,
    _connection: Connection,
}

impl Broker {
    async fn new(test: &str) -> Option<Broker> {
        let url = common::amqp_url(test)?;
        let connection = Connection::connect(&url, ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| panic!("{test}: RabbitMQ at {url} is unreachable: {e}"));
        let channel = connection.create_channel().await.unwrap();
        let id = common::unique(test);
        Some(Broker {
            url,
            exchange: format!("x-{id}"),
            queue: format!("q-{id}"),
            channel,
            _connection: connection,
        })
    }

    async fn declare_exchange(&self) {
        self.channel
            .exchange_declare(
                self.exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }

    /// A queue bound to `events.#`, with these arguments.
    async fn declare_queue(&self, arguments: FieldTable) {
        self.channel
            .queue_declare(
                self.queue.as_str().into(),
                QueueDeclareOptions::default(),
                arguments,
            )
            .await
            .unwrap();
        self.channel
            .queue_bind(
                self.queue.as_str().into(),
                self.exchange.as_str().into(),
                "events.#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }

    /// Every message in the queue, acknowledged.
    async fn drain_queue(&self) -> Vec<lapin::message::BasicGetMessage> {
        let mut out = Vec::new();
        while let Some(m) = self
            .channel
            .basic_get(self.queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            out.push(m);
        }
        out
    }

    async fn delete(&self) {
        let _ = self
            .channel
            .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
            .await;
        let _ = self
            .channel
            .exchange_delete(
                self.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await;
    }
}

async fn producer(test: &str, relay: Arc<AmqpRelay>) -> Outbox {
    let (_, store) = common::sqlite(test).await;
    Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().event::<Moved>())
        .destination(relay)
        .build()
        .unwrap()
}

async fn commit(outbox: &Outbox, parcels: usize, hops: u32) {
    for hop in 1..=hops {
        let mut uow = outbox.begin().await.unwrap();
        for p in 0..parcels {
            uow.add(
                Envelope::new(Moved {
                    parcel: format!("p{p}"),
                    hop,
                })
                .with_sequence(u64::from(hop))
                .with_source("urn:test:parcels"),
            );
        }
        uow.commit().await.unwrap();
    }
}

/// Waits until `check` holds, up to `limit`.
async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The reason of the pause of `destination`, if it is paused.
async fn paused(store: &Store, destination: &str) -> Option<String> {
    store
        .paused_destinations()
        .await
        .unwrap()
        .into_iter()
        .find(|p| p.destination == destination)
        .map(|p| p.reason)
}

#[tokio::test]
async fn each_event_is_published_once_confirmed_persistent_and_in_its_aggregates_order() {
    let Some(broker) = Broker::new("amqp_publish").await else {
        return;
    };
    broker.declare_exchange().await;
    broker.declare_queue(FieldTable::default()).await;
    let relay = AmqpRelay::new(&broker.url, RelayConfig::new(&broker.exchange));
    relay.check().await.unwrap();
    let outbox = producer("amqp_publish", relay).await;
    commit(&outbox, 5, 10).await;
    outbox.drain(Duration::from_secs(60)).await.unwrap();

    let messages = broker.drain_queue().await;
    assert_eq!(messages.len(), 50);
    let mut ids = HashSet::new();
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for m in &messages {
        let p = &m.delivery.properties;
        assert_eq!(
            p.content_type().as_ref().map(|c| c.as_str()),
            Some("application/cloudevents+json")
        );
        assert_eq!(*p.delivery_mode(), Some(2), "persistent");
        assert_eq!(
            m.delivery.routing_key.as_str(),
            "events.amqptest.parcel.moved"
        );
        let body: serde_json::Value = serde_json::from_slice(&m.delivery.data).unwrap();
        let id = p.message_id().as_ref().unwrap().as_str().to_owned();
        assert_eq!(body["id"], id.as_str(), "message-id is the event id");
        assert!(ids.insert(id), "published twice");
        assert_eq!(body["specversion"], "1.0");
        assert_eq!(body["type"], "amqptest.parcel.moved");
        // Each aggregate's chain: the previous event published of the aggregate.
        let parcel = body["subject"].as_str().unwrap().to_owned();
        let sequence: u64 = body["sequence"].as_str().unwrap().parse().unwrap();
        let previous: u64 = body["prevsequence"].as_str().unwrap().parse().unwrap();
        let before = last.insert(parcel.clone(), sequence).unwrap_or(0);
        assert_eq!(previous, before, "{parcel}: chain");
        assert_eq!(sequence, before + 1, "{parcel}: out of order");
    }
    assert_eq!(last.len(), 5);
    broker.delete().await;
}

#[tokio::test]
async fn a_missing_exchange_and_an_unroutable_event_pause_the_relay_until_the_topology_is_there() {
    let Some(broker) = Broker::new("amqp_topology").await else {
        return;
    };
    let relay = AmqpRelay::new(
        &broker.url,
        RelayConfig::new(&broker.exchange).retry(fast_retry(2)),
    );
    // The start-up check names the exchange and the broker, without the password.
    let e = relay.check().await.unwrap_err();
    assert!(matches!(e, AmqpError::NoExchange { .. }), "{e:?}");
    let message = event_core::ErrorChain(&e).to_string();
    assert!(message.contains(&broker.exchange), "{message}");
    let password = broker
        .url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .and_then(|(credentials, _)| credentials.split_once(':'))
        .map(|(_, password)| password.to_owned());
    if let Some(password) = password.filter(|p| !p.is_empty()) {
        assert!(!message.contains(&format!(":{password}@")), "{message}");
    }

    let outbox = producer("amqp_topology", relay.clone()).await;
    let store = outbox.store().clone();
    let name = relay.config().name.clone();
    commit(&outbox, 3, 1).await;
    let workers = outbox.spawn_workers(1);
    // No exchange: paused, attempts unused, nothing dead.
    eventually(
        Duration::from_secs(15),
        "paused for the exchange",
        || async {
            paused(&store, &name)
                .await
                .is_some_and(|r| r.contains("has no exchange"))
        },
    )
    .await;
    // The exchange without a queue bound: the events come back unroutable; still paused.
    broker.declare_exchange().await;
    eventually(Duration::from_secs(20), "paused as unroutable", || async {
        paused(&store, &name)
            .await
            .is_some_and(|r| r.contains("unroutable"))
    })
    .await;
    // The queue bound: the relay resumes by itself and every event goes out once.
    broker.declare_queue(FieldTable::default()).await;
    eventually(Duration::from_secs(20), "all published", || async {
        outbox.store().stats().await.unwrap().pending == 0
    })
    .await;
    workers.shutdown(Duration::from_secs(10)).await.unwrap();
    assert_eq!(broker.drain_queue().await.len(), 3);
    let dead = store
        .dead_letters(&DeadLetterFilter::default())
        .await
        .unwrap();
    assert!(dead.is_empty(), "{dead:?}");
    broker.delete().await;
}

#[tokio::test]
async fn an_unreachable_broker_pauses_the_relay_and_names_it_without_the_password() {
    let Some(_) = common::amqp_url("amqp_unreachable") else {
        return;
    };
    // Nothing listens on port 1.
    let url = "amqp://guest:s3cret-pass@127.0.0.1:1/%2f";
    let relay = AmqpRelay::new(url, RelayConfig::new("nowhere").retry(fast_retry(2)));
    let e = relay.check().await.unwrap_err();
    let message = event_core::ErrorChain(&e).to_string();
    assert!(matches!(e, AmqpError::Connect { .. }), "{message}");
    assert!(
        message.contains("amqp://guest:***@127.0.0.1:1/%2f"),
        "{message}"
    );
    assert!(!message.contains("s3cret-pass"), "{message}");

    let outbox = producer("amqp_unreachable", relay.clone()).await;
    let store = outbox.store().clone();
    commit(&outbox, 2, 1).await;
    let workers = outbox.spawn_workers(1);
    eventually(
        Duration::from_secs(15),
        "paused while unreachable",
        || async {
            paused(&store, "amqp:nowhere")
                .await
                .is_some_and(|r| r.contains("unreachable") && !r.contains("s3cret-pass"))
        },
    )
    .await;
    // However long it lasts: nothing dead, nothing lost.
    tokio::time::sleep(Duration::from_secs(2)).await;
    workers.shutdown(Duration::from_secs(10)).await.unwrap();
    assert_eq!(store.stats().await.unwrap().pending, 2);
    let dead = store
        .dead_letters(&DeadLetterFilter::default())
        .await
        .unwrap();
    assert!(dead.is_empty(), "{dead:?}");
}

#[tokio::test]
async fn a_nack_is_a_transient_failure_retried_then_dead_lettered() {
    let Some(broker) = Broker::new("amqp_nack").await else {
        return;
    };
    broker.declare_exchange().await;
    // A queue that takes nothing: it rejects every publish, which the broker nacks.
    let mut arguments = FieldTable::default();
    arguments.insert("x-max-length".into(), AMQPValue::LongInt(0));
    arguments.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    broker.declare_queue(arguments).await;
    let relay = AmqpRelay::new(
        &broker.url,
        RelayConfig::new(&broker.exchange).retry(fast_retry(3)),
    );
    let outbox = producer("amqp_nack", relay).await;
    commit(&outbox, 1, 1).await;
    outbox.drain(Duration::from_secs(30)).await.unwrap();
    let dead = outbox
        .store()
        .dead_letters(&DeadLetterFilter::default())
        .await
        .unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].attempts, 3, "retried with the relay's policy");
    let error = dead[0].error_chain.join(": ");
    assert!(error.contains("nack"), "{error}");
    broker.delete().await;
}

const PYTHON_READER: &str = r#"
import json, sys
import pika
try:
    from cloudevents.v1.http import from_json  # cloudevents 2.x
except ImportError:
    from cloudevents.http import from_json  # 1.x

connection = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
channel = connection.channel()
out = []
while True:
    method, properties, body = channel.basic_get(sys.argv[2], auto_ack=True)
    if method is None:
        break
    event = from_json(body)
    out.append({
        "message_id": properties.message_id,
        "content_type": properties.content_type,
        "delivery_mode": properties.delivery_mode,
        "routing_key": method.routing_key,
        "id": event["id"],
        "type": event["type"],
        "source": event["source"],
        "subject": event["subject"],
        "data": event.data,
    })
connection.close()
print(json.dumps(out))
"#;

#[tokio::test]
async fn the_python_amqp_client_and_cloudevents_sdk_read_every_published_event() {
    let Some(broker) = Broker::new("amqp_python").await else {
        return;
    };
    broker.declare_exchange().await;
    broker.declare_queue(FieldTable::default()).await;
    let relay = AmqpRelay::new(&broker.url, RelayConfig::new(&broker.exchange));
    let outbox = producer("amqp_python", relay).await;
    commit(&outbox, 2, 3).await;
    outbox.drain(Duration::from_secs(30)).await.unwrap();

    let require = std::env::var("EVENTS_TEST_REQUIRE_SERVICES").as_deref() == Ok("1");
    let out = std::process::Command::new("python3")
        .args(["-c", PYTHON_READER, &broker.url, &broker.queue])
        .output();
    let out = match out {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            let stderr = String::from_utf8_lossy(&o.stderr);
            if !require && stderr.contains("ModuleNotFoundError") {
                common::say_once(
                    "pika",
                    &format!("Python reader skipped (pip install pika cloudevents): {stderr}"),
                );
                broker.delete().await;
                return;
            }
            panic!("the Python reader failed: {stderr}")
        }
        Err(e) if require => panic!("python3: {e}"),
        Err(e) => {
            common::say_once("python3", &format!("Python reader skipped: {e}"));
            broker.delete().await;
            return;
        }
    };
    let read: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(read.len(), 6, "each once: {read:?}");
    let mut ids = HashSet::new();
    for m in &read {
        assert_eq!(m["message_id"], m["id"]);
        assert!(ids.insert(m["id"].as_str().unwrap().to_owned()));
        assert_eq!(m["content_type"], "application/cloudevents+json");
        assert_eq!(m["delivery_mode"], 2);
        assert_eq!(m["routing_key"], "events.amqptest.parcel.moved");
        assert_eq!(m["type"], "amqptest.parcel.moved");
        assert_eq!(m["source"], "urn:test:parcels");
        assert!(m["subject"].as_str().unwrap().starts_with('p'));
        assert!(m["data"]["hop"]
            .as_u64()
            .is_some_and(|h| (1..=3).contains(&h)));
    }
    broker.delete().await;
}

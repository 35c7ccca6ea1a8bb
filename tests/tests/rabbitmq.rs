//! The RabbitMQ relay and inbox against the real broker (`EVENTS_TEST_AMQP_URL`, skipped when
//! unset, failing with `EVENTS_TEST_REQUIRE_SERVICES=1`): each event published once per
//! delivery as a persistent CloudEvents message with its event id and aggregate chain, each
//! aggregate in order; a missing exchange, an unroutable event and an unreachable broker pause
//! the relay without using attempts, and it resumes by itself once the topology is there; a
//! nack is a transient failure. The inbox applies each event once and in its aggregate's order
//! (after a redelivery of what another consumer held unacknowledged, and of what was committed
//! but not acknowledged), dead-letters what the core refuses with the broker's metadata, and
//! stops naming a queue deleted under it. Each test uses exchanges and queues of its own,
//! deleted at the end.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
use event_runtime::inbox::{Incoming, Origin};
use event_runtime::transport::rabbitmq::{
    AmqpError, AmqpInbox, AmqpRelay, BrokerTopology, InboxConfig, RelayConfig,
};
use event_runtime::{CancellationToken, DeadLetterFilter, Dispatcher, Outbox, RetryPolicy, Store};
use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
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
    common::eventually(
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
    common::eventually(Duration::from_secs(20), "paused as unroutable", || async {
        paused(&store, &name)
            .await
            .is_some_and(|r| r.contains("unroutable"))
    })
    .await;
    // The queue bound: the relay resumes by itself and every event goes out once.
    broker.declare_queue(FieldTable::default()).await;
    common::eventually(Duration::from_secs(20), "all published", || async {
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
    common::eventually(
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

/// What the consuming service's handler saw: each parcel's hops in the order it ran them.
#[derive(Default)]
struct Seen(std::sync::Mutex<BTreeMap<String, Vec<u32>>>);

#[event_handler(name = "amqptest.track")]
async fn track(e: &Envelope<Moved>, seen: &Seen) -> Result<(), HandlerError> {
    let mut seen = seen.0.lock().unwrap();
    seen.entry(e.event().parcel.clone())
        .or_default()
        .push(e.event().hop);
    Ok(())
}

/// The consuming service: `Moved` tracked into `seen`.
async fn consumer(test: &str, seen: &Arc<Seen>) -> Outbox {
    let (_, store) = common::sqlite(test).await;
    Outbox::builder(store)
        .dispatcher(
            Dispatcher::builder_empty()
                .event::<Moved>()
                .handler::<track>(),
        )
        .resource_arc(Arc::clone(seen))
        .build()
        .unwrap()
}

/// Runs `inbox` until idle for a second, then the consumer's workers until done.
async fn consume(inbox: &AmqpInbox, outbox: &Outbox) -> event_runtime::inbox::InboxReport {
    let report = inbox
        .run(CancellationToken::new(), Some(Duration::from_secs(2)))
        .await
        .unwrap();
    outbox.drain(Duration::from_secs(30)).await.unwrap();
    report
}

/// Each parcel's hops 1..=`hops`, each once, in order.
fn assert_each_once_in_order(seen: &Seen, parcels: usize, hops: u32) {
    let seen = seen.0.lock().unwrap();
    assert_eq!(seen.len(), parcels, "{seen:?}");
    for (parcel, got) in seen.iter() {
        assert_eq!(*got, (1..=hops).collect::<Vec<_>>(), "{parcel}");
    }
}

#[tokio::test]
async fn the_inbox_applies_each_event_once_in_its_aggregates_order_through_redeliveries() {
    let Some(broker) = Broker::new("amqp_inbox").await else {
        return;
    };
    broker.declare_exchange().await;
    broker.declare_queue(FieldTable::default()).await;
    let relay = AmqpRelay::new(&broker.url, RelayConfig::new(&broker.exchange));
    let producer = producer("amqp_inbox_p", relay).await;
    commit(&producer, 4, 6).await;
    producer.drain(Duration::from_secs(30)).await.unwrap();

    // Another consumer takes some messages and dies without acknowledging them: they come
    // back, out of the queue's order.
    {
        let connection = Connection::connect(&broker.url, ConnectionProperties::default())
            .await
            .unwrap();
        let channel = connection.create_channel().await.unwrap();
        channel
            .basic_qos(5, lapin::options::BasicQosOptions::default())
            .await
            .unwrap();
        let mut held = channel
            .basic_consume(
                broker.queue.as_str().into(),
                "crashing".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        use futures_util::StreamExt;
        for _ in 0..5 {
            held.next().await.unwrap().unwrap();
        }
        drop(held);
        connection.close(200, "crash".into()).await.unwrap();
    }

    let seen = Arc::new(Seen::default());
    let outbox = consumer("amqp_inbox_c", &seen).await;
    let inbox = AmqpInbox::new(
        &broker.url,
        outbox.clone(),
        InboxConfig::new(&broker.queue).batch(7),
    )
    .await
    .unwrap();
    let report = consume(&inbox, &outbox).await;
    assert_eq!(report.received, 24, "{report:?}");
    assert_eq!(report.appended, 24, "{report:?}");
    assert_eq!(report.acked, 24, "{report:?}");
    assert_each_once_in_order(&seen, 4, 6);

    broker.delete().await;
}

#[tokio::test]
async fn a_message_the_core_refuses_is_a_dead_letter_with_the_brokers_metadata() {
    let Some(broker) = Broker::new("amqp_refused").await else {
        return;
    };
    broker.declare_exchange().await;
    broker.declare_queue(FieldTable::default()).await;
    let seen = Arc::new(Seen::default());
    let outbox = consumer("amqp_refused", &seen).await;
    let inbox = AmqpInbox::new(&broker.url, outbox.clone(), InboxConfig::new(&broker.queue))
        .await
        .unwrap();
    // Garbage, then a valid event twice (the second a duplicate).
    let publish = |body: Vec<u8>| {
        let channel = broker.channel.clone();
        let exchange = broker.exchange.clone();
        async move {
            channel
                .basic_publish(
                    exchange.as_str().into(),
                    "events.amqptest.parcel.moved".into(),
                    BasicPublishOptions::default(),
                    &body,
                    BasicProperties::default()
                        .with_content_type("application/cloudevents+json".into()),
                )
                .await
                .unwrap()
                .await
                .unwrap();
        }
    };
    publish(b"not an envelope".to_vec()).await;
    let event = serde_json::to_vec(
        &Envelope::new(Moved {
            parcel: "p0".into(),
            hop: 1,
        })
        .with_sequence(1)
        .with_source("urn:test:parcels"),
    )
    .unwrap();
    publish(event.clone()).await;
    publish(event).await;

    let report = consume(&inbox, &outbox).await;
    assert_eq!(
        (
            report.received,
            report.appended,
            report.duplicates,
            report.dead_lettered,
            report.acked
        ),
        (3, 1, 1, 1, 3),
        "{report:?}"
    );
    assert_each_once_in_order(&seen, 1, 1);
    let dead = outbox
        .store()
        .dead_letters(&DeadLetterFilter::default())
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].handler, format!("rabbitmq-inbox:{}", broker.queue));
    let origin = dead[0].origin.as_ref().expect("the broker's metadata");
    assert_eq!(origin.transport, "rabbitmq");
    assert_eq!(origin.source, broker.queue);
    assert_eq!(origin.attributes["exchange"], broker.exchange);
    assert_eq!(
        origin.attributes["routing_key"],
        "events.amqptest.parcel.moved"
    );
    assert_eq!(origin.attributes["queue"], broker.queue);
    // Acknowledged: the broker forgot them.
    assert!(broker.drain_queue().await.is_empty());
    broker.delete().await;
}

#[tokio::test]
async fn committed_but_unacknowledged_messages_come_back_as_duplicates() {
    let Some(broker) = Broker::new("amqp_unacked").await else {
        return;
    };
    broker.declare_exchange().await;
    broker.declare_queue(FieldTable::default()).await;
    let relay = AmqpRelay::new(&broker.url, RelayConfig::new(&broker.exchange));
    let producer = producer("amqp_unacked_p", relay).await;
    commit(&producer, 2, 3).await;
    producer.drain(Duration::from_secs(30)).await.unwrap();

    let seen = Arc::new(Seen::default());
    let outbox = consumer("amqp_unacked_c", &seen).await;
    // A consumer that committed every message through the inbox core and crashed before its
    // acks: what the queue holds now.
    let messages = broker.drain_queue().await;
    let batch: Vec<Incoming> = messages
        .iter()
        .map(|m| {
            Incoming::new(
                m.delivery.data.clone(),
                Origin::new("rabbitmq", broker.queue.as_str(), 0),
            )
        })
        .collect();
    let receipt = outbox
        .receive(&format!("rabbitmq-inbox:{}", broker.queue), batch)
        .await;
    assert!(receipt.error.is_none());
    for m in &messages {
        broker
            .channel
            .basic_publish(
                broker.exchange.as_str().into(),
                m.delivery.routing_key.clone(),
                BasicPublishOptions::default(),
                &m.delivery.data,
                m.delivery.properties.clone(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let inbox = AmqpInbox::new(&broker.url, outbox.clone(), InboxConfig::new(&broker.queue))
        .await
        .unwrap();
    let report = consume(&inbox, &outbox).await;
    assert_eq!(
        (
            report.received,
            report.appended,
            report.duplicates,
            report.acked
        ),
        (6, 0, 6, 6),
        "{report:?}"
    );
    assert_each_once_in_order(&seen, 2, 3);
    broker.delete().await;
}

#[tokio::test]
async fn a_queue_deleted_under_the_inbox_stops_it_naming_the_queue() {
    let Some(broker) = Broker::new("amqp_deleted").await else {
        return;
    };
    broker.declare_exchange().await;
    broker.declare_queue(FieldTable::default()).await;
    let seen = Arc::new(Seen::default());
    let outbox = consumer("amqp_deleted", &seen).await;
    // A queue that does not exist is refused at once.
    let e = AmqpInbox::new(
        &broker.url,
        outbox.clone(),
        InboxConfig::new("no-such-queue-x"),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, AmqpError::NoQueue { .. }), "{e:?}");
    assert!(e.to_string().contains("no-such-queue-x"), "{e}");

    let inbox = AmqpInbox::new(&broker.url, outbox.clone(), InboxConfig::new(&broker.queue))
        .await
        .unwrap();
    let running = tokio::spawn(async move { inbox.run(CancellationToken::new(), None).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    broker.delete().await;
    let stopped = tokio::time::timeout(Duration::from_secs(15), running)
        .await
        .expect("the inbox went on as if idle")
        .unwrap();
    let e = stopped.unwrap_err();
    assert!(matches!(e, AmqpError::NoQueue { .. }), "{e:?}");
    assert!(e.to_string().contains(&broker.queue), "{e}");
}

#[event_handler(name = "amqptest.at_commit", in_transaction)]
async fn at_commit(_: &Envelope<Moved>) -> Result<(), HandlerError> {
    Ok(())
}

#[tokio::test]
async fn the_inbox_refuses_in_transaction_handlers_unless_allowed() {
    let Some(broker) = Broker::new("amqp_in_tx").await else {
        return;
    };
    broker.declare_exchange().await;
    broker.declare_queue(FieldTable::default()).await;
    let (_, store) = common::sqlite("amqp_in_tx").await;
    let outbox = Outbox::builder(store)
        .dispatcher(
            Dispatcher::builder_empty()
                .event::<Moved>()
                .handler::<at_commit>(),
        )
        .build()
        .unwrap();
    let e = AmqpInbox::new(&broker.url, outbox.clone(), InboxConfig::new(&broker.queue))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("amqptest.at_commit"), "{e}");
    AmqpInbox::new(
        &broker.url,
        outbox,
        InboxConfig::new(&broker.queue).allow_in_transaction_handlers(true),
    )
    .await
    .unwrap();
    broker.delete().await;
}

/// `events ARGS…` (the standalone tool): success, standard output, standard error.
async fn events(args: &[&str]) -> (bool, String, String) {
    let mut argv = vec!["events".to_owned()];
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    common::events_tool(argv).await
}

#[tokio::test]
async fn the_topology_is_created_and_checked_and_each_partition_queue_gets_its_aggregates() {
    let Some(broker) = Broker::new("amqp_partitions").await else {
        return;
    };
    let consumer = format!("c-{}", common::unique("amqp_partitions"));
    let topology = BrokerTopology::new(&broker.exchange, &consumer)
        .partitions(3)
        .delivery_limit(2);
    let common_args = [
        "--amqp",
        broker.url.as_str(),
        "--exchange",
        broker.exchange.as_str(),
        "--partitions",
        "3",
    ];
    let mut create = vec!["rabbitmq", "topology", "create", consumer.as_str()];
    create.extend(common_args);
    create.extend(["--delivery-limit", "2"]);
    let (ok, out, err) = events(&create).await;
    assert!(ok, "{err}");
    assert!(out.starts_with("created: "), "{out}");
    assert!(!out.contains("guest:guest@"), "the password: {out}");
    let mut check = vec!["rabbitmq", "topology", "check", consumer.as_str()];
    check.extend(common_args);
    check.extend(["--delivery-limit", "2"]);
    let (ok, out, err) = events(&check).await;
    assert!(ok, "{err}");
    assert!(out.starts_with("ok: "), "{out}");
    // Another delivery limit: refused, naming the queue and the setting.
    let mut other = vec!["rabbitmq", "topology", "check", consumer.as_str()];
    other.extend(common_args);
    other.extend(["--delivery-limit", "5"]);
    let (ok, _, err) = events(&other).await;
    assert!(!ok);
    assert!(
        err.contains("x-delivery-limit") && err.contains(&consumer),
        "{err}"
    );
    // A consumer whose queues do not exist: the first missing one named.
    let mut missing = vec!["rabbitmq", "topology", "check", "nobody-here-x"];
    missing.extend(common_args);
    let (ok, _, err) = events(&missing).await;
    assert!(!ok);
    assert!(err.contains("nobody-here-x"), "{err}");

    // A relay with the same partitions: each event in its aggregate's partition queue.
    let relay = AmqpRelay::new(
        &broker.url,
        RelayConfig::new(&broker.exchange).partitions(3),
    );
    let producer = producer("amqp_partitions", relay).await;
    commit(&producer, 6, 2).await;
    producer.drain(Duration::from_secs(30)).await.unwrap();
    let mut total = 0;
    for (k, queue) in topology.queues().iter().enumerate() {
        // Through a consumer: the queues' single active consumer refuses `basic.get`.
        for m in common::amqp_take(&broker.channel, queue).await {
            total += 1;
            let body: serde_json::Value = serde_json::from_slice(&m.data).unwrap();
            let parcel = body["subject"].as_str().unwrap();
            let partition = event_runtime::transport::partition_of(
                body["aggregatetype"].as_str().unwrap(),
                parcel,
                3,
            );
            assert_eq!(partition as usize, k, "{parcel} in {queue}");
            assert_eq!(
                m.routing_key.as_str(),
                format!("events.{k}.amqptest.parcel.moved")
            );
        }
    }
    assert_eq!(total, 12);

    // A message given back more often than the limit is parked by the broker.
    let queue = topology.queue(0);
    broker
        .channel
        .basic_publish(
            broker.exchange.as_str().into(),
            "events.0.amqptest.parcel.moved".into(),
            BasicPublishOptions::default(),
            b"poison",
            BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    // Taken and given back until the broker parks it.
    let mut consumer = broker
        .channel
        .basic_consume(
            queue.as_str().into(),
            "poison-taker".into(),
            lapin::options::BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let start = Instant::now();
    let parked = loop {
        if let Ok(Some(Ok(m))) =
            tokio::time::timeout(Duration::from_millis(100), consumer.next()).await
        {
            m.acker
                .nack(lapin::options::BasicNackOptions {
                    multiple: false,
                    requeue: true,
                })
                .await
                .unwrap();
        }
        if topology.parked(&broker.url).await.unwrap() == 1 {
            let m = broker
                .channel
                .basic_get(
                    topology.parking_queue().as_str().into(),
                    BasicGetOptions { no_ack: true },
                )
                .await
                .unwrap()
                .unwrap();
            break m;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "never parked");
    };
    assert_eq!(parked.delivery.data, b"poison");

    for q in topology
        .queues()
        .into_iter()
        .chain([topology.parking_queue()])
    {
        let _ = broker
            .channel
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    let _ = broker
        .channel
        .exchange_delete(
            topology.dead_letter_exchange().as_str().into(),
            ExchangeDeleteOptions::default(),
        )
        .await;
    broker.delete().await;
}

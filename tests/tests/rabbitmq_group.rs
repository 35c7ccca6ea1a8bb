//! The RabbitMQ transport's scale-out and its edges, against the real broker
//! (`EVENTS_TEST_AMQP_URL`; skipped with a note without it, failing with
//! `EVENTS_TEST_REQUIRE_SERVICES=1`): a group of instances sharing the partition queues
//! through leases, a prefix of several tokens with partitions, an unroutable event published
//! once its queue is bound, a batch its database cannot commit held rather than parked, the
//! retention check, and `amqps://` never used in the clear.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
use event_runtime::inbox::GroupConfig;
use event_runtime::transport::rabbitmq::{
    AmqpError, AmqpGroup, AmqpInbox, AmqpRelay, BrokerTopology, InboxConfig, RelayConfig,
};
use event_runtime::{CancellationToken, Dispatcher, Outbox, OutboxConfig, RetryPolicy, Store};
use lapin::options::{
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use serde::{Deserialize, Serialize};

/// A parcel moved one hop further.
#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "amqpgroup.parcel.moved", version = 1)]
struct Moved {
    #[event(aggregate_id)]
    parcel: String,
    hop: u32,
}

/// The broker and a channel to look at it, with this test's own exchange; what the test
/// declared is deleted by [`Broker::clean`].
struct Broker {
    url: String,
    exchange: String,
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
        Some(Broker {
            url,
            exchange: format!("x-{}", common::unique(test)),
            channel,
            _connection: connection,
        })
    }

    /// Deletes `topology`'s queues and exchanges, and the exchange.
    async fn clean(&self, topology: &BrokerTopology) {
        for q in topology
            .queues()
            .into_iter()
            .chain([topology.parking_queue()])
        {
            let _ = self
                .channel
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        for x in [topology.dead_letter_exchange(), self.exchange.clone()] {
            let _ = self
                .channel
                .exchange_delete(x.as_str().into(), ExchangeDeleteOptions::default())
                .await;
        }
    }

    /// The messages in `queue`, taken (acknowledged) through a consumer: a quorum queue with
    /// a single active consumer refuses `basic.get`.
    async fn take(&self, queue: &str) -> Vec<lapin::message::Delivery> {
        common::amqp_take(&self.channel, queue).await
    }
}

/// The producing service: `Moved` relayed by `relay`.
async fn producer(test: &str, relay: Arc<AmqpRelay>) -> Outbox {
    let (_, store) = common::sqlite(test).await;
    Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().event::<Moved>())
        .config(OutboxConfig::default().poll_interval(Duration::from_millis(20)))
        .destination(relay)
        .build()
        .unwrap()
}

/// `parcels` parcels, each moved through `hops` (one transaction per hop).
async fn commit(outbox: &Outbox, parcels: usize, hops: std::ops::RangeInclusive<u32>) {
    for hop in hops {
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

/// What the consuming service's handler saw: each parcel's hops in the order it ran them.
#[derive(Default)]
struct Seen(std::sync::Mutex<BTreeMap<String, Vec<u32>>>);

#[event_handler(name = "amqpgroup.track")]
async fn track(e: &Envelope<Moved>, seen: &Seen) -> Result<(), HandlerError> {
    let mut seen = seen.0.lock().unwrap();
    seen.entry(e.event().parcel.clone())
        .or_default()
        .push(e.event().hop);
    Ok(())
}

/// An instance of the consuming service on the database `url`, `Moved` tracked into `seen`.
async fn consumer(url: &str, seen: &Arc<Seen>) -> Outbox {
    let store = Store::connect(url).await.unwrap();
    Outbox::builder(store)
        .dispatcher(
            Dispatcher::builder_empty()
                .event::<Moved>()
                .handler::<track>(),
        )
        .config(OutboxConfig::default().poll_interval(Duration::from_millis(20)))
        .resource_arc(Arc::clone(seen))
        .build()
        .unwrap()
}

/// Each parcel's hops 1..=`hops`, each once, in order.
fn assert_each_once_in_order(seen: &Seen, parcels: usize, hops: u32) {
    let seen = seen.0.lock().unwrap();
    assert_eq!(seen.len(), parcels, "{seen:?}");
    for (parcel, got) in seen.iter() {
        assert_eq!(*got, (1..=hops).collect::<Vec<_>>(), "{parcel}");
    }
}

const LEASE: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_shares_the_partition_queues_through_leases_and_hands_them_over() {
    const T: &str = "amqp_group";
    let Some(broker) = Broker::new(T).await else {
        return;
    };
    const PARTITIONS: u32 = 4;
    let consumer_name = format!("g-{}", common::unique(T));
    let topology = BrokerTopology::new(&broker.exchange, &consumer_name).partitions(PARTITIONS);
    topology.create(&broker.url).await.unwrap();
    let relay = AmqpRelay::new(
        &broker.url,
        RelayConfig::new(&broker.exchange).partitions(PARTITIONS),
    );
    let producer = producer(T, relay).await;
    let producing = producer.spawn_workers(2);
    commit(&producer, 40, 1..=2).await;

    let db = common::sqlite_url(T);
    let seen = Arc::new(Seen::default());
    let (a_outbox, b_outbox) = (consumer(&db, &seen).await, consumer(&db, &seen).await);
    let a_workers = a_outbox.spawn_workers(2);
    let group = |outbox: &Outbox, member: &str| {
        AmqpGroup::new(
            &broker.url,
            outbox.clone(),
            topology.clone(),
            topology.inbox_config(0).batch(16),
            GroupConfig::new().member(member).lease(LEASE),
        )
        .unwrap()
    };
    let (a, b) = (
        Arc::new(group(&a_outbox, "a")),
        Arc::new(group(&b_outbox, "b")),
    );
    let (a_stop, b_stop) = (CancellationToken::new(), CancellationToken::new());
    let a_run = tokio::spawn({
        let (a, stop) = (Arc::clone(&a), a_stop.clone());
        async move { a.run(stop, None).await }
    });
    common::eventually(Duration::from_secs(20), "a holds every queue", || async {
        a.view().await.unwrap().held_by("a").len() == PARTITIONS as usize
    })
    .await;
    let b_run = tokio::spawn({
        let (b, stop) = (Arc::clone(&b), b_stop.clone());
        async move { b.run(stop, None).await }
    });
    // Each consumes only the queues it holds: two each.
    common::eventually(Duration::from_secs(20), "the queues shared", || async {
        let view = a.view().await.unwrap();
        view.held_by("a").len() == 2 && view.held_by("b").len() == 2
    })
    .await;
    commit(&producer, 40, 3..=3).await;
    common::eventually(
        Duration::from_secs(30),
        "the third hop received",
        || async { seen.0.lock().unwrap().values().map(Vec::len).sum::<usize>() == 120 },
    )
    .await;
    // b leaves: its queues are handed over at once.
    b_stop.cancel();
    let b_report = b_run.await.unwrap().unwrap();
    common::eventually(
        Duration::from_secs(20),
        "a holds every queue again",
        || async { a.view().await.unwrap().held_by("a").len() == PARTITIONS as usize },
    )
    .await;
    commit(&producer, 40, 4..=4).await;
    producer.drain(Duration::from_secs(30)).await.unwrap();
    common::eventually(Duration::from_secs(30), "every event received", || async {
        seen.0.lock().unwrap().values().map(Vec::len).sum::<usize>() == 160
    })
    .await;
    a_stop.cancel();
    let a_report = a_run.await.unwrap().unwrap();
    a_outbox.drain(Duration::from_secs(30)).await.unwrap();
    assert_each_once_in_order(&seen, 40, 4);
    assert!(b_report.received > 0, "b consumed its share: {b_report:?}");
    assert_eq!(
        a_report.appended + b_report.appended,
        160,
        "{a_report:?} {b_report:?}"
    );
    assert!(a.view().await.unwrap().held_by("a").is_empty(), "a left");
    a_workers.shutdown(Duration::from_secs(10)).await.unwrap();
    producing.shutdown(Duration::from_secs(10)).await.unwrap();
    broker.clean(&topology).await;
}

#[tokio::test]
async fn a_prefix_of_several_tokens_with_partitions_routes_every_event_to_its_queue() {
    const T: &str = "amqp_prefix";
    let Some(broker) = Broker::new(T).await else {
        return;
    };
    let topology = BrokerTopology::new(&broker.exchange, format!("c-{}", common::unique(T)))
        .partitions(3)
        .routing_key_prefix("acme.events");
    topology.create(&broker.url).await.unwrap();
    let relay = AmqpRelay::new(
        &broker.url,
        RelayConfig::new(&broker.exchange)
            .routing_key_prefix("acme.events")
            .partitions(3)
            .retry(RetryPolicy {
                max_attempts: 2,
                initial_backoff: Duration::from_millis(10),
                max_backoff: Duration::from_millis(10),
            }),
    );
    let producer = producer(T, relay).await;
    commit(&producer, 6, 1..=2).await;
    producer.drain(Duration::from_secs(30)).await.unwrap();
    let mut total = 0;
    for (k, queue) in topology.queues().iter().enumerate() {
        for m in broker.take(queue).await {
            total += 1;
            assert_eq!(
                m.routing_key.as_str(),
                format!("acme.{k}.events.amqpgroup.parcel.moved")
            );
        }
    }
    assert_eq!(total, 12, "every event routed to a partition queue");
    broker.clean(&topology).await;
}

#[tokio::test]
async fn an_unroutable_event_is_published_once_when_its_queue_is_bound() {
    const T: &str = "amqp_unroutable_once";
    let Some(broker) = Broker::new(T).await else {
        return;
    };
    broker
        .channel
        .exchange_declare(
            broker.exchange.as_str().into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let relay = AmqpRelay::new(&broker.url, RelayConfig::new(&broker.exchange));
    let name = relay.config().name.clone();
    let producer = producer(T, relay).await;
    let workers = producer.spawn_workers(1);
    commit(&producer, 1, 1..=1).await;
    let store = producer.store().clone();
    common::eventually(Duration::from_secs(10), "the relay paused", || async {
        store
            .paused_destinations()
            .await
            .unwrap()
            .iter()
            .any(|p| p.destination == name && p.reason.contains("unroutable"))
    })
    .await;
    let queue = format!("q-{}", common::unique(T));
    broker
        .channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    broker
        .channel
        .queue_bind(
            queue.as_str().into(),
            broker.exchange.as_str().into(),
            "events.#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    // Asked again every 5 s with the returned message itself: resumed once it routes.
    common::eventually(Duration::from_secs(20), "the relay resumed", || async {
        !store
            .paused_destinations()
            .await
            .unwrap()
            .iter()
            .any(|p| p.destination == name)
    })
    .await;
    producer.drain(Duration::from_secs(30)).await.unwrap();
    workers.shutdown(Duration::from_secs(10)).await.unwrap();
    // The probe's publish completed the delivery: not published a second time.
    assert_eq!(broker.take(&queue).await.len(), 1);
    let _ = broker
        .channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    let _ = broker
        .channel
        .exchange_delete(
            broker.exchange.as_str().into(),
            ExchangeDeleteOptions::default(),
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_its_database_cannot_commit_is_held_not_given_back_until_parked() {
    const T: &str = "amqp_hold";
    let Some(broker) = Broker::new(T).await else {
        return;
    };
    // Two deliveries at most: giving the batch back each second would park it in two.
    let topology =
        BrokerTopology::new(&broker.exchange, format!("c-{}", common::unique(T))).delivery_limit(2);
    topology.create(&broker.url).await.unwrap();
    let relay = AmqpRelay::new(&broker.url, RelayConfig::new(&broker.exchange));
    let producer = producer(T, relay).await;
    commit(&producer, 5, 1..=1).await;
    producer.drain(Duration::from_secs(30)).await.unwrap();

    let db = common::sqlite_url(&format!("{T}_consumer"));
    let seen = Arc::new(Seen::default());
    let outbox = consumer(&db, &seen).await;
    let inbox = AmqpInbox::new(&broker.url, outbox.clone(), topology.inbox_config(0))
        .await
        .unwrap();
    // The consuming database refuses every commit for a while.
    let mut admin = <sqlx::SqliteConnection as sqlx::Connection>::connect(&db)
        .await
        .unwrap();
    sqlx::query("ALTER TABLE event_outbox RENAME TO event_outbox_away")
        .execute(&mut admin)
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { inbox.run(stop, None).await }
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        topology.parked(&broker.url).await.unwrap(),
        0,
        "held, not given back until parked"
    );
    sqlx::query("ALTER TABLE event_outbox_away RENAME TO event_outbox")
        .execute(&mut admin)
        .await
        .unwrap();
    let workers = outbox.spawn_workers(1);
    common::eventually(
        Duration::from_secs(20),
        "the held batch committed",
        || async { seen.0.lock().unwrap().len() == 5 },
    )
    .await;
    stop.cancel();
    let report = run.await.unwrap().unwrap();
    assert_eq!(report.appended, 5, "{report:?}");
    assert_eq!(topology.parked(&broker.url).await.unwrap(), 0);
    assert_each_once_in_order(&seen, 5, 1);
    workers.shutdown(Duration::from_secs(10)).await.unwrap();
    broker.clean(&topology).await;
}

#[tokio::test]
async fn an_inbox_whose_retention_is_shorter_than_the_redelivery_bound_is_refused() {
    const T: &str = "amqp_retention";
    let Some(broker) = Broker::new(T).await else {
        return;
    };
    let (_, store) = common::sqlite(T).await;
    let outbox = Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().event::<Moved>())
        .config(OutboxConfig::default().retention(Duration::from_secs(3600)))
        .build()
        .unwrap();
    // 21 deliveries × 30 min may pass before the last redelivery: 1 h forgets too early.
    let e = AmqpInbox::new(
        &broker.url,
        outbox.clone(),
        InboxConfig::new("never-reached"),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(e, AmqpError::RetentionTooShort { bound, .. } if bound == Duration::from_secs(37_800)),
        "{e}"
    );
    // A shorter consumer timeout on the broker: the bound follows it.
    let e = AmqpInbox::new(
        &broker.url,
        outbox,
        InboxConfig::new("never-reached-either").consumer_timeout(Duration::from_secs(60)),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, AmqpError::NoQueue { .. }), "{e}");
}

#[tokio::test]
async fn amqps_is_refused_without_tls_never_used_in_the_clear() {
    const T: &str = "amqp_tls";
    let Some(broker) = Broker::new(T).await else {
        return;
    };
    // The broker's plain port under an amqps:// URL: without TLS the relay would have
    // connected in the clear and said nothing.
    let url = broker.url.replacen("amqp://", "amqps://", 1);
    let relay = AmqpRelay::new(&url, RelayConfig::new("events"));
    let e = relay.check().await.unwrap_err();
    let shown = event_core::ErrorChain(&e).to_string();
    assert!(matches!(e, AmqpError::Connect { .. }), "{shown}");
    assert!(!shown.contains("guest:guest@"), "the password: {shown}");
    // Without the feature `rabbitmq-tls` it says so; with it, the TLS handshake with a plain
    // port fails. Either way, never connected.
    if !shown.contains("rabbitmq-tls") {
        assert!(
            shown.to_lowercase().contains("tls") || shown.contains("handshake"),
            "{shown}"
        );
    }
    let outbox = Outbox::builder(common::sqlite(T).await.1)
        .dispatcher(Dispatcher::builder_empty().event::<Moved>())
        .build()
        .unwrap();
    let e = AmqpInbox::new(&url, outbox, InboxConfig::new("q"))
        .await
        .unwrap_err();
    assert!(matches!(e, AmqpError::Connect { .. }), "{e}");
}

#[tokio::test]
async fn another_partition_count_than_the_brokers_is_refused_naming_both() {
    const T: &str = "amqp_partition_count";
    let Some(broker) = Broker::new(T).await else {
        return;
    };
    let consumer = format!("c-{}", common::unique(T));
    let four = BrokerTopology::new(&broker.exchange, &consumer).partitions(4);
    four.create(&broker.url).await.unwrap();
    four.check(&broker.url).await.unwrap();
    for other in [1, 2, 8] {
        let topology = BrokerTopology::new(&broker.exchange, &consumer).partitions(other);
        for (what, e) in [
            ("check", topology.check(&broker.url).await.unwrap_err()),
            ("create", topology.create(&broker.url).await.unwrap_err()),
        ] {
            assert!(
                matches!(
                    e,
                    AmqpError::PartitionsMismatch { configured, found: 4, .. } if configured == other
                ),
                "{what} with {other}: {e}"
            );
            assert!(e.to_string().contains(&consumer), "{e}");
        }
    }
    // Nothing was created by the refused `create`: no queue past the fourth.
    let eight = BrokerTopology::new(&broker.exchange, &consumer).partitions(8);
    assert!(broker
        .channel
        .queue_declare(
            eight.queue(4).as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .is_err());
    // A group configured for two of the four queues does not start.
    let (_, store) = common::sqlite(T).await;
    let outbox = Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().event::<Moved>())
        .build()
        .unwrap();
    let two = BrokerTopology::new(&broker.exchange, &consumer).partitions(2);
    let group = AmqpGroup::new(
        &broker.url,
        outbox,
        two.clone(),
        two.inbox_config(0),
        GroupConfig::new(),
    )
    .unwrap();
    let e = group
        .run(CancellationToken::new(), Some(Duration::from_secs(1)))
        .await
        .unwrap_err();
    assert!(
        matches!(e, AmqpError::PartitionsMismatch { found: 4, .. }),
        "{e}"
    );
    // The channel the failed passive declaration closed: a new one to clean up with.
    let broker = Broker::new(T).await.unwrap();
    let broker = Broker {
        exchange: four.exchange.clone(),
        ..broker
    };
    broker.clean(&four).await;
}

//! `EVENTS_BENCH_AMQP_URL=… EVENTS_BENCH_POSTGRES_URL=… cargo bench -p event-runtime --features
//! rabbitmq,postgres --bench rabbitmq`: the RabbitMQ relay draining n = 1,000 outbox deliveries
//! on PostgreSQL (100 aggregates × 10) to an exchange (`relay_publish`), against raw `lapin`
//! publishing the same messages pipelined on one confirm-mode channel and awaiting every
//! confirm, with no database (`raw_publish`), and one publish awaited at a time
//! (`raw_confirm_latency`, n = 100: the per-aggregate ceiling is min(aggregates, in flight) ÷
//! that latency); and one `AmqpInbox` consuming a quorum queue of n = 10,000 chained events
//! (1,000 aggregates × 10) into a new PostgreSQL schema (`inbox_postgres_1`), against raw
//! `lapin` consuming and acknowledging the same queue with the same prefetch
//! (`raw_consume`). Skipped, saying so, without both URLs. See BENCHMARKS.md.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use event_core::{DomainEvent, Envelope};
use event_runtime::transport::rabbitmq::{
    AmqpInbox, AmqpRelay, BrokerTopology, RelayConfig, CONTENT_TYPE,
};
use event_runtime::{Delivery, Dispatcher, Outbox, OutboxConfig};
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use serde::{Deserialize, Serialize};
use tokio::runtime::Runtime;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "bench.relayed", version = 1)]
struct Relayed {
    #[event(aggregate_id)]
    stream: String,
    value: u64,
}

const AGGREGATES: usize = 100;
const PER_AGGREGATE: u64 = 10;
const N: usize = AGGREGATES * PER_AGGREGATE as usize;
const LATENCY_N: usize = 100;
const INBOX_AGGREGATES: usize = 1_000;
const INBOX_N: usize = INBOX_AGGREGATES * PER_AGGREGATE as usize;
const PREFETCH: u16 = 256;

/// `aggregates` × 10 events, each aggregate's in order, as (event id, routing key, body).
fn messages(aggregates: usize, prefix: &str) -> Vec<(String, String, String)> {
    let run = Uuid::now_v7().simple().to_string();
    let mut out = Vec::with_capacity(aggregates * PER_AGGREGATE as usize);
    for seq in 1..=PER_AGGREGATE {
        for a in 0..aggregates {
            let e = Envelope::new(Relayed {
                stream: format!("agg-{a}-{run}"),
                value: seq,
            })
            .with_sequence(seq)
            .with_source("urn:bench:producer");
            let json = serde_json::to_string(&e).unwrap();
            let body = Delivery::new(e.id(), "bench.relayed", &json)
                .previous_sequence(seq - 1)
                .wire_envelope()
                .into_owned();
            out.push((e.id().to_string(), format!("{prefix}.bench.relayed"), body));
        }
    }
    out
}

async fn relay_publish(outbox: &Outbox) -> Duration {
    let mut uow = outbox.begin().await.unwrap();
    let ids: Vec<String> = (0..AGGREGATES)
        .map(|a| format!("agg-{a}-{}", Uuid::now_v7().simple()))
        .collect();
    for seq in 1..=PER_AGGREGATE {
        for id in &ids {
            uow.add(
                Envelope::new(Relayed {
                    stream: id.clone(),
                    value: seq,
                })
                .with_sequence(seq),
            );
        }
    }
    uow.commit().await.unwrap();
    let start = Instant::now();
    let r = outbox.drain(Duration::from_secs(600)).await.unwrap();
    assert_eq!(r.completed, N);
    start.elapsed()
}

/// Publishes `messages` to `exchange` pipelined on `channel` (confirm mode), awaiting every
/// confirm at the end; with `one_at_a_time`, each confirm before the next publish.
async fn raw_publish(
    channel: &Channel,
    exchange: &str,
    messages: &[(String, String, String)],
    one_at_a_time: bool,
) -> Duration {
    let start = Instant::now();
    let mut confirms = Vec::with_capacity(messages.len());
    for (id, key, body) in messages {
        let confirm = channel
            .basic_publish(
                exchange.into(),
                key.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                body.as_bytes(),
                BasicProperties::default()
                    .with_content_type(CONTENT_TYPE.into())
                    .with_delivery_mode(2)
                    .with_message_id(id.as_str().into()),
            )
            .await
            .unwrap();
        if one_at_a_time {
            assert!(confirm.await.unwrap().is_ack());
        } else {
            confirms.push(confirm);
        }
    }
    for c in futures_util::future::join_all(confirms).await {
        assert!(c.unwrap().is_ack());
    }
    start.elapsed()
}

/// Empties `queue` (the relay benches' sink), not timed.
async fn purge(channel: &Channel, queue: &str) {
    channel
        .queue_purge(queue.into(), Default::default())
        .await
        .unwrap();
}

/// A new quorum queue of one partition holding the inbox bench's n events; returns its
/// topology.
async fn filled_queue(url: &str, channel: &Channel, exchange: &str) -> BrokerTopology {
    let consumer = format!("bench-{}", Uuid::now_v7().simple());
    let prefix = format!("p{}", Uuid::now_v7().simple());
    let topology = BrokerTopology::new(exchange, consumer).routing_key_prefix(&prefix);
    topology.create(url).await.unwrap();
    let messages = messages(INBOX_AGGREGATES, &prefix);
    for chunk in messages.chunks(1_000) {
        raw_publish(channel, exchange, chunk, false).await;
    }
    topology
}

async fn drop_queue(channel: &Channel, topology: &BrokerTopology) {
    for q in [topology.queue(0), topology.parking_queue()] {
        channel
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }
}

async fn inbox_postgres(url: &str, pg: &str, topology: &BrokerTopology) -> Duration {
    let store = event_runtime::store::postgres::connect_in_schema(
        pg,
        &format!("amqp_inbox_bench_{}", Uuid::now_v7().simple()),
    )
    .await
    .unwrap();
    let outbox = Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().event::<Relayed>())
        .build()
        .unwrap();
    let start = Instant::now();
    let inbox = AmqpInbox::new(url, outbox, topology.inbox_config(0).batch(PREFETCH))
        .await
        .unwrap();
    let mut appended = 0;
    while appended < INBOX_N {
        let r = inbox.receive().await.unwrap();
        appended += r.appended;
    }
    start.elapsed()
}

async fn raw_consume(connection: &Connection, queue: &str) -> Duration {
    let start = Instant::now();
    let channel = connection.create_channel().await.unwrap();
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "raw".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut seen = 0;
    while seen < INBOX_N {
        let d = consumer.next().await.unwrap().unwrap();
        seen += 1;
        // One ack per batch of the prefetch, as the inbox settles a batch.
        if seen % usize::from(PREFETCH) == 0 || seen == INBOX_N {
            d.acker
                .ack(BasicAckOptions { multiple: true })
                .await
                .unwrap();
        }
    }
    channel.close(200, "done".into()).await.unwrap();
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    let (Ok(url), Ok(pg)) = (
        std::env::var("EVENTS_BENCH_AMQP_URL"),
        std::env::var("EVENTS_BENCH_POSTGRES_URL"),
    ) else {
        eprintln!("rabbitmq skipped: set EVENTS_BENCH_AMQP_URL and EVENTS_BENCH_POSTGRES_URL");
        return;
    };
    let rt = Runtime::new().unwrap();
    let id = Uuid::now_v7().simple().to_string();
    let exchange = format!("bench-{id}");
    let sink = format!("bench-sink-{id}");
    let prefix = format!("bench{id}");
    let (connection, channel) = rt.block_on(async {
        let connection = Connection::connect(&url, ConnectionProperties::default())
            .await
            .unwrap();
        let channel = connection.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        (connection, channel)
    });
    let relay_config = RelayConfig::new(&exchange)
        .routing_key_prefix(prefix.clone())
        .in_flight(AGGREGATES);
    let relay = AmqpRelay::new(&url, relay_config);
    rt.block_on(async {
        relay.declare_exchange().await.unwrap();
        // The sink: a durable classic queue bound to every routing key, emptied between runs.
        channel
            .queue_declare(
                sink.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        channel
            .queue_bind(
                sink.as_str().into(),
                exchange.as_str().into(),
                format!("{prefix}.#").as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    });
    let store = rt
        .block_on(event_runtime::store::postgres::connect_in_schema(
            &pg,
            &format!("amqp_relay_bench_{id}"),
        ))
        .unwrap();
    let outbox = Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().event::<Relayed>())
        .destination(relay.clone())
        .config(OutboxConfig::default().batch_size(1000))
        .build()
        .unwrap();

    let mut g = c.benchmark_group("rabbitmq");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(10))
        .warm_up_time(Duration::from_secs(1))
        .throughput(Throughput::Elements(N as u64));
    g.bench_function("relay_publish", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let (outbox, channel, sink) = (outbox.clone(), channel.clone(), sink.clone());
            async move {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    t += relay_publish(&outbox).await;
                    purge(&channel, &sink).await;
                }
                t
            }
        })
    });
    g.bench_function("raw_publish", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let (channel, exchange, sink) = (channel.clone(), exchange.clone(), sink.clone());
            let prefix = prefix.clone();
            async move {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    let m = messages(AGGREGATES, &prefix);
                    t += raw_publish(&channel, &exchange, &m, false).await;
                    purge(&channel, &sink).await;
                }
                t
            }
        })
    });
    g.throughput(Throughput::Elements(LATENCY_N as u64));
    g.bench_function("raw_confirm_latency", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let (channel, exchange, sink) = (channel.clone(), exchange.clone(), sink.clone());
            let prefix = prefix.clone();
            async move {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    let m = messages(LATENCY_N / PER_AGGREGATE as usize, &prefix);
                    t += raw_publish(&channel, &exchange, &m, true).await;
                    purge(&channel, &sink).await;
                }
                t
            }
        })
    });
    g.throughput(Throughput::Elements(INBOX_N as u64));
    g.bench_function("inbox_postgres_1", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let (url, pg, channel, exchange) =
                (url.clone(), pg.clone(), channel.clone(), exchange.clone());
            async move {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    let topology = filled_queue(&url, &channel, &exchange).await;
                    t += inbox_postgres(&url, &pg, &topology).await;
                    drop_queue(&channel, &topology).await;
                }
                t
            }
        })
    });
    g.bench_function("raw_consume", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let (url, channel, exchange) = (url.clone(), channel.clone(), exchange.clone());
            let connection = &connection;
            async move {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    let topology = filled_queue(&url, &channel, &exchange).await;
                    t += raw_consume(connection, &topology.queue(0)).await;
                    drop_queue(&channel, &topology).await;
                }
                t
            }
        })
    });
    g.finish();
    rt.block_on(async {
        let _ = channel
            .queue_delete(sink.as_str().into(), QueueDeleteOptions::default())
            .await;
        let _ = channel
            .exchange_delete(exchange.as_str().into(), Default::default())
            .await;
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);

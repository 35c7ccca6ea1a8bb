//! `EVENTS_BENCH_NATS_URL=… EVENTS_BENCH_POSTGRES_URL=… cargo bench -p event-runtime --features
//! nats,postgres --bench inbox`: consuming a partitioned stream (4 partitions, n = 10,000
//! events of 1,000 aggregates, chained as a relay publishes them) into an outbox with a group
//! of inbox instances — 1 and 2 of them, on PostgreSQL and on SQLite (`inbox_<store>_<N>`;
//! `…_validated`: one instance with schema validation on, `validate_schemas`) —
//! against raw `async-nats` on the same stream, in one run: one durable pull consumer per
//! partition, filtered, each batch's acks confirmed (`raw_partitions`: what the inbox does on
//! the wire, without a database), and one durable pull consumer of the whole stream,
//! acknowledging each message without confirmation (`raw_fetch_ack`). Each iteration consumes the
//! whole stream through new durable consumers into a new database: the time from the
//! instances' start until the outbox holds every event. Skipped, saying so, without both
//! URLs. See BENCHMARKS.md.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, message::PublishMessage};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use event_core::{DomainEvent, Envelope};
use event_runtime::transport::nats::{
    self, GroupConfig, InboxConfig, NatsGroup, StreamSpec, CONTENT_TYPE,
};
use event_runtime::{CancellationToken, Delivery, Dispatcher, Outbox, Store};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::runtime::Runtime;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent, schemars::JsonSchema)]
#[event(name = "bench.consumed", version = 1)]
struct Consumed {
    #[event(aggregate_id)]
    account: String,
    value: u64,
}

const AGGREGATES: usize = 1_000;
const PER_AGGREGATE: u64 = 10;
const N: usize = AGGREGATES * PER_AGGREGATE as usize;
const PARTITIONS: u32 = 4;

/// Publishes the n events, each aggregate's in order with its predecessor named
/// (`prevsequence`), on its partition's subject.
async fn fill(js: &jetstream::Context, prefix: &str) {
    let run = Uuid::now_v7().simple().to_string();
    let mut acks = Vec::with_capacity(N);
    for seq in 1..=PER_AGGREGATE {
        for a in 0..AGGREGATES {
            let account = format!("A{a}-{run}");
            let e = Envelope::new(Consumed {
                account: account.clone(),
                value: seq,
            })
            .with_sequence(seq)
            .with_source("urn:bench:producer");
            let json = serde_json::to_string(&e).unwrap();
            let body = Delivery::new(e.id(), "bench.consumed", &json)
                .previous_sequence(seq - 1)
                .wire_envelope()
                .into_owned();
            let p = nats::partition_of(Consumed::AGGREGATE_TYPE, &account, PARTITIONS);
            let message = PublishMessage::build()
                .payload(body.into())
                .message_id(e.id().to_string())
                .header("Content-Type", CONTENT_TYPE);
            acks.push(
                js.send_publish(format!("{prefix}.{p}.bench.consumed"), message)
                    .await
                    .unwrap(),
            );
            if acks.len() >= 512 {
                for ack in acks.drain(..) {
                    ack.await.unwrap();
                }
            }
        }
    }
    for ack in acks {
        ack.await.unwrap();
    }
}

/// A new consuming database of the kind `db`.
async fn store(db: &Db, tag: &str) -> (Store, Db) {
    match db {
        Db::Postgres(url) => {
            let schema = format!("inbox_bench_{tag}");
            let s = event_runtime::store::postgres::connect_in_schema(url, &schema)
                .await
                .unwrap();
            (s, Db::PostgresSchema(url.clone(), schema))
        }
        Db::Sqlite(dir) => {
            let url = format!("sqlite://{dir}/inbox_bench_{tag}.db");
            let s = Store::connect(&url).await.unwrap();
            (s, Db::Sqlite(url))
        }
        Db::PostgresSchema(..) => unreachable!(),
    }
}

#[derive(Clone)]
enum Db {
    Postgres(String),
    PostgresSchema(String, String),
    /// A folder, or (once made) a database URL.
    Sqlite(String),
}

impl Db {
    async fn open(&self) -> Store {
        match self {
            Db::PostgresSchema(url, schema) => {
                event_runtime::store::postgres::connect_in_schema(url, schema)
                    .await
                    .unwrap()
            }
            Db::Sqlite(url) => Store::connect(url).await.unwrap(),
            Db::Postgres(_) => unreachable!(),
        }
    }
}

fn consuming(store: Store, validate: bool) -> Outbox {
    Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().event::<Consumed>())
        .validate_schemas(validate)
        .build()
        .unwrap()
}

/// `instances` group members consume the stream into a new database of the kind `db`; the
/// time until the outbox holds all n events.
async fn group_consume(
    js: &jetstream::Context,
    stream: &str,
    prefix: &str,
    db: &Db,
    instances: usize,
    validate: bool,
) -> Duration {
    let tag = Uuid::now_v7().simple().to_string();
    let durable = format!("b{tag}");
    let (first, made) = store(db, &tag).await;
    let lease = Duration::from_secs(10);
    let members: Vec<String> = (0..instances).map(|i| format!("m{i}")).collect();
    // Every member known from the first round: each takes its share at once.
    for m in &members {
        first.group_heartbeat(&durable, m, lease).await.unwrap();
    }
    let cancel = CancellationToken::new();
    let start = Instant::now();
    let mut runs = Vec::new();
    for m in &members {
        let outbox = consuming(made.open().await, validate);
        let group = NatsGroup::new(
            js,
            outbox,
            InboxConfig::new(stream, &durable)
                .filter_subject(format!("{prefix}.>"))
                .partitions(PARTITIONS)
                .batch(256)
                .fetch_wait(Duration::from_millis(500)),
            GroupConfig::new().group(&durable).member(m).lease(lease),
        )
        .unwrap();
        let cancel = cancel.clone();
        runs.push(tokio::spawn(async move { group.run(cancel, None).await }));
    }
    loop {
        let n = first
            .query("SELECT COUNT(*) FROM event_outbox")
            .fetch_one()
            .await
            .unwrap()
            .get_at::<i64>(0)
            .unwrap();
        if n as usize >= N {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = start.elapsed();
    cancel.cancel();
    for r in runs {
        r.await.unwrap().unwrap();
    }
    first.close().await;
    took
}

/// Raw `async-nats`: one durable pull consumer, batches of 256, each message acknowledged.
async fn raw_fetch_ack(js: &jetstream::Context, stream: &str) -> Duration {
    let durable = format!("raw{}", Uuid::now_v7().simple());
    let s = js.get_stream(stream).await.unwrap();
    let consumer: jetstream::consumer::Consumer<pull::Config> = s
        .create_consumer(pull::Config {
            durable_name: Some(durable.clone()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            max_ack_pending: 256,
            ..Default::default()
        })
        .await
        .unwrap();
    let start = Instant::now();
    let mut received = 0;
    while received < N {
        let mut batch = consumer
            .batch()
            .max_messages(256)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .unwrap();
        while let Some(m) = batch.next().await {
            m.unwrap().ack().await.unwrap();
            received += 1;
        }
    }
    let took = start.elapsed();
    s.delete_consumer(&durable).await.unwrap();
    took
}

/// Raw, as the inbox reads: one filtered durable consumer per partition, concurrently,
/// each message's ack confirmed (double ack).
async fn raw_partitions(js: &jetstream::Context, stream: &str, prefix: &str) -> Duration {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..PARTITIONS {
        let durable = format!("rawp{}", Uuid::now_v7().simple());
        let s = js.get_stream(stream).await.unwrap();
        let consumer: jetstream::consumer::Consumer<pull::Config> = s
            .create_consumer(pull::Config {
                durable_name: Some(durable.clone()),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                max_ack_pending: 256,
                filter_subject: format!("{prefix}.{p}.>"),
                ..Default::default()
            })
            .await
            .unwrap();
        tasks.push(tokio::spawn(async move {
            loop {
                let batch = consumer.fetch().max_messages(256).messages().await.unwrap();
                let ms: Vec<_> = batch.map(|m| m.unwrap()).collect().await;
                // Drained: the stream holds nothing more for this partition.
                if ms.is_empty() {
                    break;
                }
                futures_util::future::join_all(ms.iter().map(|m| m.double_ack())).await;
            }
            s.delete_consumer(&durable).await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    let (Ok(nats_url), Ok(pg)) = (
        std::env::var("EVENTS_BENCH_NATS_URL"),
        std::env::var("EVENTS_BENCH_POSTGRES_URL"),
    ) else {
        eprintln!("inbox skipped: set EVENTS_BENCH_NATS_URL and EVENTS_BENCH_POSTGRES_URL");
        return;
    };
    let rt = Runtime::new().unwrap();
    let _guard = rt.enter();
    let client = rt.block_on(async_nats::connect(&nats_url)).unwrap();
    let js = jetstream::new(client);
    let id = Uuid::now_v7().simple().to_string();
    let (stream, prefix) = (format!("INBOX{id}"), format!("inbox{id}"));
    rt.block_on(
        StreamSpec::new(&stream)
            .subjects([format!("{prefix}.>")])
            .partitions(PARTITIONS)
            .create(&js),
    )
    .unwrap();
    rt.block_on(fill(&js, &prefix));
    let dir = std::env::temp_dir().join(format!("inbox-bench-{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    let sqlite = Db::Sqlite(dir.display().to_string());
    let postgres = Db::Postgres(pg);

    let mut g = c.benchmark_group("inbox");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(20))
        .warm_up_time(Duration::from_secs(1))
        .throughput(Throughput::Elements(N as u64));
    for (name, db, instances, validate) in [
        ("inbox_postgres_1", &postgres, 1, false),
        ("inbox_postgres_1_validated", &postgres, 1, true),
        ("inbox_postgres_2", &postgres, 2, false),
        ("inbox_sqlite_1", &sqlite, 1, false),
        ("inbox_sqlite_1_validated", &sqlite, 1, true),
        ("inbox_sqlite_2", &sqlite, 2, false),
    ] {
        g.bench_function(name, |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let (js, stream, db, prefix) =
                    (js.clone(), stream.clone(), db.clone(), prefix.clone());
                async move {
                    let mut t = Duration::ZERO;
                    for _ in 0..iters {
                        t += group_consume(&js, &stream, &prefix, &db, instances, validate).await;
                    }
                    t
                }
            })
        });
    }
    g.bench_function("raw_partitions", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let (js, stream, prefix) = (js.clone(), stream.clone(), prefix.clone());
            async move {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    t += raw_partitions(&js, &stream, &prefix).await;
                }
                t
            }
        })
    });
    g.bench_function("raw_fetch_ack", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let (js, stream) = (js.clone(), stream.clone());
            async move {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    t += raw_fetch_ack(&js, &stream).await;
                }
                t
            }
        })
    });
    g.finish();
    rt.block_on(js.delete_stream(&stream)).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);

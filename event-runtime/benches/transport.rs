//! `EVENTS_BENCH_NATS_URL=… EVENTS_BENCH_POSTGRES_URL=… cargo bench -p event-runtime --features
//! nats,postgres --bench transport`: the NATS relay draining n outbox deliveries on PostgreSQL
//! to JetStream (`relay_publish`), against the same rows claimed and completed by hand-written
//! SQL and published with raw `async-nats` pipelining and message ids (`raw_publish`), in one
//! run, each on a stream of its own. Skipped, saying so, without both URLs. See BENCHMARKS.md.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, message::PublishMessage};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use event_core::{DomainEvent, Envelope};
use event_runtime::sqlx::{self, PgPool};
use event_runtime::transport::nats::{NatsRelay, RelayConfig, StreamSpec};
use event_runtime::{Dispatcher, Outbox, OutboxConfig};
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
const PER_AGGREGATE: usize = 10;
const N: usize = AGGREGATES * PER_AGGREGATE;

fn envelopes() -> Vec<Envelope<Relayed>> {
    let mut out = Vec::with_capacity(N);
    for seq in 1..=PER_AGGREGATE as u64 {
        for a in 0..AGGREGATES {
            out.push(
                Envelope::new(Relayed {
                    stream: format!("agg-{a}-{}", Uuid::now_v7().simple()),
                    value: seq,
                })
                .with_sequence(0),
            );
        }
    }
    out
}

async fn relay_publish(outbox: &Outbox) -> Duration {
    // Sequenced per aggregate: ten events of each of a hundred aggregates.
    let mut uow = outbox.begin().await.unwrap();
    let ids: Vec<String> = (0..AGGREGATES)
        .map(|a| format!("agg-{a}-{}", Uuid::now_v7().simple()))
        .collect();
    for seq in 1..=PER_AGGREGATE as u64 {
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

async fn raw_publish(pool: &PgPool, js: &jetstream::Context, subject: &str) -> Duration {
    let rows: Vec<(String, String)> = envelopes()
        .iter()
        .map(|e| (e.id().to_string(), serde_json::to_string(e).unwrap()))
        .collect();
    for chunk in rows.chunks(500) {
        let mut q = sqlx::QueryBuilder::new("INSERT INTO raw_relay (event_id, envelope) ");
        q.push_values(chunk, |mut b, (id, env)| {
            b.push_bind(id).push_bind(env);
        });
        q.build().execute(pool).await.unwrap();
    }
    let start = Instant::now();
    loop {
        let claimed: Vec<(i64, String, String)> = sqlx::query_as(
            "UPDATE raw_relay SET status = 'leased' WHERE id IN (
                SELECT id FROM raw_relay WHERE status = 'pending' ORDER BY id LIMIT 128
                FOR UPDATE SKIP LOCKED)
             RETURNING id, event_id, envelope",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        if claimed.is_empty() {
            break;
        }
        let mut acks = Vec::with_capacity(claimed.len());
        for (_, id, env) in &claimed {
            let m = PublishMessage::build()
                .payload(bytes::Bytes::copy_from_slice(env.as_bytes()))
                .message_id(id)
                .header("Content-Type", "application/cloudevents+json");
            acks.push(js.send_publish(subject.to_owned(), m).await.unwrap());
        }
        for a in futures_util::future::join_all(
            acks.into_iter().map(std::future::IntoFuture::into_future),
        )
        .await
        {
            a.unwrap();
        }
        let done: Vec<i64> = claimed.iter().map(|c| c.0).collect();
        sqlx::query("DELETE FROM raw_relay WHERE id = ANY($1)")
            .bind(&done)
            .execute(pool)
            .await
            .unwrap();
    }
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    let (Ok(nats), Ok(pg)) = (
        std::env::var("EVENTS_BENCH_NATS_URL"),
        std::env::var("EVENTS_BENCH_POSTGRES_URL"),
    ) else {
        eprintln!("transport skipped: set EVENTS_BENCH_NATS_URL and EVENTS_BENCH_POSTGRES_URL");
        return;
    };
    let rt = Runtime::new().unwrap();
    // A JetStream context spawns its acker task: build it inside the runtime.
    let _guard = rt.enter();
    let client = rt.block_on(async_nats::connect(&nats)).unwrap();
    let js = jetstream::new(client.clone());
    let id = Uuid::now_v7().simple().to_string();
    let (stream, prefix) = (format!("BENCH{id}"), format!("bench{id}"));
    rt.block_on(
        StreamSpec::new(&stream)
            .subjects([format!("{prefix}.>")])
            .create(&js),
    )
    .unwrap();
    let store = rt
        .block_on(event_runtime::store::postgres::connect_in_schema(
            &pg,
            &format!("transport_bench_{id}"),
        ))
        .unwrap();
    let relay = NatsRelay::new(
        client.clone(),
        RelayConfig::new(&stream)
            .subject_prefix(prefix.clone())
            .in_flight(AGGREGATES),
    );
    let outbox = Outbox::builder(store.clone())
        .dispatcher(Dispatcher::builder_empty().event::<Relayed>())
        .destination(relay.clone())
        .config(OutboxConfig::default().batch_size(1000))
        .build()
        .unwrap();
    rt.block_on(relay.check(&outbox)).unwrap();
    let pool = event_runtime::store::postgres::pool(&store)
        .unwrap()
        .clone();
    rt.block_on(
        sqlx::query(
            "CREATE TABLE raw_relay (id BIGSERIAL PRIMARY KEY, event_id TEXT NOT NULL,
             envelope TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending')",
        )
        .execute(&pool),
    )
    .unwrap();
    let subject = format!("{prefix}.bench.relayed");

    let mut g = c.benchmark_group("transport");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(10))
        .warm_up_time(Duration::from_secs(1))
        .throughput(Throughput::Elements(N as u64));
    g.bench_function("relay_publish", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let outbox = outbox.clone();
            async move {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    t += relay_publish(&outbox).await;
                }
                t
            }
        })
    });
    g.bench_function("raw_publish", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let (pool, js, subject) = (pool.clone(), js.clone(), subject.clone());
            async move {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    t += raw_publish(&pool, &js, &subject).await;
                }
                t
            }
        })
    });
    g.finish();
    rt.block_on(js.delete_stream(&stream)).unwrap();
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! `cargo bench -p event-runtime --bench outbox --features postgres`: the outbox's unit of
//! work and delivery against the same statements written by hand with sqlx, in one run, on
//! SQLite (a temporary file) and PostgreSQL (`EVENTS_BENCH_POSTGRES_URL`, else
//! `EVENTS_TEST_POSTGRES_URL`; the group is skipped when neither is set). See BENCHMARKS.md.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use event_core::{event_handler, DomainEvent, Envelope};
use event_runtime::{Dispatcher, Outbox, OutboxConfig, Store};
use serde::{Deserialize, Serialize};
use tokio::runtime::Runtime;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "bench.recorded", version = 1)]
struct Recorded {
    #[event(aggregate_id)]
    stream: String,
    value: u64,
}

#[event_handler(name = "bench.noop")]
fn noop(_: &Recorded) {}

fn envelopes(n: usize) -> Vec<Envelope<Recorded>> {
    let stream = Uuid::now_v7().to_string();
    (1..=n)
        .map(|i| {
            Envelope::new(Recorded {
                stream: stream.clone(),
                value: i as u64,
            })
            .with_sequence(i as u64)
        })
        .collect()
}

fn outbox(store: Store) -> Outbox {
    Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().handler::<noop>())
        .config(OutboxConfig {
            batch_size: 250,
            ..OutboxConfig::default()
        })
        .build()
        .expect("valid outbox")
}

async fn uow_commit(outbox: &Outbox, n: usize) {
    let mut uow = outbox.begin().await.unwrap();
    for e in envelopes(n) {
        uow.add(e);
    }
    uow.commit().await.unwrap();
}

/// The same rows as `uow_commit`, inserted by hand: serialise, one multi-row INSERT for the
/// outbox and one for the deliveries, in one transaction.
async fn raw_insert(store: &Store, n: usize) {
    let now = chrono::Utc::now().timestamp_millis();
    let rows: Vec<(String, String, Envelope<Recorded>)> = envelopes(n)
        .into_iter()
        .map(|e| (e.id().to_string(), serde_json::to_string(&e).unwrap(), e))
        .collect();
    let mut tx = store.begin().await.unwrap();
    macro_rules! insert {
        ($t:expr) => {{
            let mut qb = sqlx::QueryBuilder::new(
                "INSERT INTO event_outbox (event_id, name, version, aggregate_type, aggregate_id, sequence, occurred_at, recorded_at, envelope) ",
            );
            qb.push_values(&rows, |mut b, (id, json, e)| {
                b.push_bind(id.clone())
                    .push_bind("bench.recorded")
                    .push_bind(1i64)
                    .push_bind("bench")
                    .push_bind(e.aggregate_id().to_owned())
                    .push_bind(e.sequence() as i64)
                    .push_bind(e.occurred_at().timestamp_millis())
                    .push_bind(now)
                    .push_bind(json.clone());
            });
            qb.build().execute(&mut *$t).await.unwrap();
            let mut qb = sqlx::QueryBuilder::new(
                "INSERT INTO event_deliveries (handler, event_id, aggregate_type, aggregate_id, sequence, next_attempt_at, created_at) ",
            );
            qb.push_values(&rows, |mut b, (id, _, e)| {
                b.push_bind("bench.noop")
                    .push_bind(id.clone())
                    .push_bind("bench")
                    .push_bind(e.aggregate_id().to_owned())
                    .push_bind(e.sequence() as i64)
                    .push_bind(now)
                    .push_bind(now);
            });
            qb.build().execute(&mut *$t).await.unwrap();
        }};
    }
    if let Some(t) = tx.sqlite() {
        insert!(t)
    } else {
        #[cfg(feature = "postgres")]
        if let Some(t) = tx.postgres() {
            insert!(t)
        }
    }
    tx.commit().await.unwrap();
}

/// 1,000 pending deliveries, each of its own aggregate (so that batches are full).
async fn fill(outbox: &Outbox) {
    for chunk in 0..10 {
        let mut uow = outbox.begin().await.unwrap();
        for i in 0..100 {
            uow.add(Envelope::new(Recorded {
                stream: format!("{}-{chunk}-{i}", Uuid::now_v7()),
                value: i,
            }));
        }
        uow.commit().await.unwrap();
    }
}

/// The delivery loop by hand: the same claim, fetch and completion statements as the store,
/// a no-op "handler", no decoding, no savepoints, no bookkeeping.
async fn raw_deliver(store: &Store) -> usize {
    const CLAIM_SQLITE: &str = "UPDATE event_deliveries SET lease_token = $1, lease_until = $2, attempts = attempts + 1
        WHERE (handler, event_id) IN (SELECT d.handler, d.event_id FROM event_deliveries d
            WHERE d.status = 'pending' AND d.next_attempt_at <= $3 AND (d.lease_until IS NULL OR d.lease_until < $3)
              AND NOT EXISTS (SELECT 1 FROM event_deliveries p WHERE p.handler = d.handler AND p.aggregate_type = d.aggregate_type
                  AND p.aggregate_id = d.aggregate_id AND p.sequence < d.sequence AND p.status IN ('pending', 'dead'))
            ORDER BY d.next_attempt_at LIMIT $4)";
    const CLAIM_PG: &str = "UPDATE event_deliveries u SET lease_token = $1, lease_until = $2, attempts = u.attempts + 1
        FROM (SELECT d.handler, d.event_id FROM event_deliveries d
            WHERE d.status = 'pending' AND d.next_attempt_at <= $3 AND (d.lease_until IS NULL OR d.lease_until < $3)
              AND NOT EXISTS (SELECT 1 FROM event_deliveries p WHERE p.handler = d.handler AND p.aggregate_type = d.aggregate_type
                  AND p.aggregate_id = d.aggregate_id AND p.sequence < d.sequence AND p.status IN ('pending', 'dead'))
            ORDER BY d.next_attempt_at LIMIT $4 FOR UPDATE SKIP LOCKED) due
        WHERE u.handler = due.handler AND u.event_id = due.event_id";
    const FETCH: &str = "SELECT d.handler, d.event_id, o.envelope FROM event_deliveries d
        JOIN event_outbox o ON o.event_id = d.event_id WHERE d.lease_token = $1";
    const COMPLETE: &str = "UPDATE event_deliveries SET status = 'completed', completed_at = $1, lease_token = NULL, lease_until = NULL
        WHERE lease_token = $2 AND status = 'pending'";
    let mut done = 0;
    loop {
        let token = Uuid::now_v7().to_string();
        let now = chrono::Utc::now().timestamp_millis();
        macro_rules! batch {
            ($pool:expr, $claim:expr) => {{
                let n = sqlx::query($claim)
                    .bind(&token)
                    .bind(now + 30_000)
                    .bind(now)
                    .bind(250i64)
                    .execute($pool)
                    .await
                    .unwrap()
                    .rows_affected();
                if n == 0 {
                    return done;
                }
                let rows: Vec<(String, String, String)> = sqlx::query_as(FETCH)
                    .bind(&token)
                    .fetch_all($pool)
                    .await
                    .unwrap();
                let mut tx = $pool.begin().await.unwrap();
                for r in &rows {
                    std::hint::black_box(r);
                }
                sqlx::query(COMPLETE)
                    .bind(now)
                    .bind(&token)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                done += rows.len();
            }};
        }
        if let Some(pool) = store.sqlite_pool() {
            batch!(pool, CLAIM_SQLITE);
        } else {
            #[cfg(feature = "postgres")]
            batch!(store.pg_pool().unwrap(), CLAIM_PG);
            #[cfg(not(feature = "postgres"))]
            let _ = CLAIM_PG;
        }
    }
}

fn group(c: &mut Criterion, rt: &Runtime, name: &str, store: Store) {
    let outbox = outbox(store.clone());
    let mut g = c.benchmark_group(name);
    g.sample_size(20)
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_secs(1));
    for n in [1usize, 10] {
        g.bench_function(format!("uow_commit_{n}"), |b| {
            b.to_async(rt).iter(|| uow_commit(&outbox, n))
        });
        g.bench_function(format!("raw_insert_{n}"), |b| {
            b.to_async(rt).iter(|| raw_insert(&store, n))
        });
    }
    g.sample_size(10).measurement_time(Duration::from_secs(8));
    g.bench_function("deliver_1000", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    rt_drain_rest(&outbox).await;
                    fill(&outbox).await;
                    let start = Instant::now();
                    let r = outbox.drain(Duration::from_secs(120)).await.unwrap();
                    total += start.elapsed();
                    assert_eq!(r.completed, 1000);
                }
                total
            })
        })
    });
    g.bench_function("raw_deliver_1000", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    rt_drain_rest(&outbox).await;
                    fill(&outbox).await;
                    let start = Instant::now();
                    let n = raw_deliver(&store).await;
                    total += start.elapsed();
                    assert_eq!(n, 1000);
                }
                total
            })
        })
    });
    g.finish();
}

/// Completes what earlier benchmarks left pending (the commit benchmarks leave deliveries).
async fn rt_drain_rest(outbox: &Outbox) {
    outbox.drain(Duration::from_secs(600)).await.unwrap();
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let path = std::env::temp_dir().join(format!("outbox-bench-{}.db", Uuid::now_v7()));
    let sqlite = rt
        .block_on(Store::connect(&format!("sqlite://{}", path.display())))
        .unwrap();
    group(c, &rt, "outbox_sqlite", sqlite);

    let url = std::env::var("EVENTS_BENCH_POSTGRES_URL")
        .or_else(|_| std::env::var("EVENTS_TEST_POSTGRES_URL"));
    match url {
        #[cfg(feature = "postgres")]
        Ok(url) => {
            let schema = format!("outbox_bench_{}", Uuid::now_v7().simple());
            let pg = rt
                .block_on(Store::connect_postgres_schema(&url, &schema))
                .unwrap();
            group(c, &rt, "outbox_postgres", pg);
        }
        _ => eprintln!(
            "outbox_postgres skipped: set EVENTS_BENCH_POSTGRES_URL and build with --features postgres"
        ),
    }
    let _ = std::fs::remove_file(path);
}

criterion_group!(benches, bench);
criterion_main!(benches);

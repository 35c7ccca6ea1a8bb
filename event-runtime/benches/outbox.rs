//! `cargo bench -p event-runtime --features postgres --bench outbox`: the outbox's unit of
//! work and delivery engine against hand-written sqlx, in one run, on SQLite (a temporary file)
//! and PostgreSQL (`EVENTS_BENCH_POSTGRES_URL`, else `EVENTS_TEST_POSTGRES_URL`; the group is
//! skipped, and says so, when neither is set). See BENCHMARKS.md.
//!
//! Every delivery benchmark drains with `Outbox::drain` (one delivery loop, in this task), a
//! handler that takes no transaction (it runs outside any transaction and its outcomes are
//! settled as they finish), and `Throughput::Elements` = the deliveries one iteration makes.
//! The hand-written baseline claims with one `UPDATE … RETURNING` statement (heads found by
//! `NOT EXISTS` an earlier pending delivery of the aggregate, the query anyone writes first;
//! `FOR UPDATE SKIP LOCKED` on PostgreSQL) and completes each batch with one `UPDATE`, on a
//! database of its own (same tables, committed through the same outbox) with the two indexes
//! its statements need.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
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

/// Does nothing, takes no transaction.
#[event_handler(name = "bench.noop")]
fn noop(_: &Recorded) {}

/// Awaits 10 ms (an HTTP call), takes no transaction.
#[event_handler(name = "bench.io")]
async fn io(_: &Recorded) {
    tokio::time::sleep(Duration::from_millis(10)).await;
}

#[derive(Clone, Copy)]
enum Handler {
    Noop,
    Io,
}

fn outbox(store: Store, handler: Handler, batch_size: u32, concurrency: usize) -> Outbox {
    let d = match handler {
        Handler::Noop => Dispatcher::builder_empty().handler::<noop>(),
        Handler::Io => Dispatcher::builder_empty().handler::<io>(),
    };
    Outbox::builder(store)
        .dispatcher(d)
        .config(
            OutboxConfig::default()
                .batch_size(batch_size)
                .concurrency(concurrency),
        )
        .build()
        .expect("valid outbox")
}

fn envelopes(stream: &str, n: usize) -> Vec<Envelope<Recorded>> {
    (1..=n)
        .map(|i| {
            Envelope::new(Recorded {
                stream: stream.to_owned(),
                value: i as u64,
            })
            .with_sequence(i as u64)
        })
        .collect()
}

async fn uow_commit(outbox: &Outbox, n: usize) {
    let mut uow = outbox.begin().await.unwrap();
    for e in envelopes(&Uuid::now_v7().to_string(), n) {
        uow.add(e);
    }
    uow.commit().await.unwrap();
}

/// The same rows as `uow_commit`, inserted by hand: serialise, one multi-row INSERT for the
/// outbox and one for the deliveries, in one transaction.
async fn raw_insert(store: &Store, n: usize) {
    let now = chrono::Utc::now().timestamp_millis();
    let rows: Vec<(String, String, Envelope<Recorded>)> = envelopes(&Uuid::now_v7().to_string(), n)
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
    if let Some(t) = event_runtime::store::sqlite::connection(&mut tx) {
        insert!(t)
    } else {
        #[cfg(feature = "postgres")]
        if let Some(t) = event_runtime::store::postgres::connection(&mut tx) {
            insert!(t)
        }
    }
    tx.commit().await.unwrap();
}

/// `aggregates` aggregates of `per_aggregate` pending deliveries each, committed through the
/// outbox (100 events per unit of work).
async fn fill(outbox: &Outbox, aggregates: usize, per_aggregate: usize) {
    let run = Uuid::now_v7().simple().to_string();
    for a in 0..aggregates {
        let stream = format!("{run}-{a}");
        let all = envelopes(&stream, per_aggregate);
        for chunk in all.chunks(100) {
            let mut uow = outbox.begin().await.unwrap();
            for e in chunk {
                uow.add(e.clone());
            }
            uow.commit().await.unwrap();
        }
    }
}

/// The delivery loop by hand: one claim statement with `RETURNING` (heads by `NOT EXISTS`,
/// leases by token), a no-op "handler", one completion statement per batch.
async fn raw_deliver(store: &Store, batch: i64) -> usize {
    const CLAIM_SQLITE: &str = "UPDATE event_deliveries SET lease_token = $1
        WHERE (handler, event_id) IN (SELECT d.handler, d.event_id FROM event_deliveries d
            WHERE d.status = 'pending' AND d.next_attempt_at <= $2 AND d.lease_token IS NULL
              AND NOT EXISTS (SELECT 1 FROM event_deliveries p WHERE p.handler = d.handler AND p.aggregate_type = d.aggregate_type
                  AND p.aggregate_id = d.aggregate_id AND p.sequence < d.sequence AND p.status IN ('pending', 'dead'))
            ORDER BY d.next_attempt_at LIMIT $3)
        RETURNING handler, event_id, (SELECT o.envelope FROM event_outbox o WHERE o.event_id = event_deliveries.event_id) AS envelope";
    const CLAIM_PG: &str = "UPDATE event_deliveries u SET lease_token = $1
        FROM (SELECT d.handler, d.event_id FROM event_deliveries d
            WHERE d.status = 'pending' AND d.next_attempt_at <= $2 AND d.lease_token IS NULL
              AND NOT EXISTS (SELECT 1 FROM event_deliveries p WHERE p.handler = d.handler AND p.aggregate_type = d.aggregate_type
                  AND p.aggregate_id = d.aggregate_id AND p.sequence < d.sequence AND p.status IN ('pending', 'dead'))
            ORDER BY d.next_attempt_at LIMIT $3 FOR UPDATE SKIP LOCKED) due, event_outbox o
        WHERE u.handler = due.handler AND u.event_id = due.event_id AND o.event_id = u.event_id
        RETURNING u.handler, u.event_id, o.envelope";
    const COMPLETE: &str =
        "UPDATE event_deliveries SET status = 'completed', completed_at = $1, lease_token = NULL
        WHERE lease_token = $2";
    let mut done = 0;
    loop {
        let token = Uuid::now_v7().to_string();
        let now = chrono::Utc::now().timestamp_millis();
        macro_rules! batch {
            ($pool:expr, $claim:expr) => {{
                let rows: Vec<(String, String, String)> = sqlx::query_as($claim)
                    .bind(&token)
                    .bind(now)
                    .bind(batch)
                    .fetch_all($pool)
                    .await
                    .unwrap();
                if rows.is_empty() {
                    return done;
                }
                for r in &rows {
                    std::hint::black_box(r);
                }
                sqlx::query(COMPLETE)
                    .bind(now)
                    .bind(&token)
                    .execute($pool)
                    .await
                    .unwrap();
                done += rows.len();
            }};
        }
        if let Some(pool) = event_runtime::store::sqlite::pool(store) {
            batch!(pool, CLAIM_SQLITE);
        } else {
            #[cfg(feature = "postgres")]
            batch!(
                event_runtime::store::postgres::pool(store).unwrap(),
                CLAIM_PG
            );
            #[cfg(not(feature = "postgres"))]
            let _ = CLAIM_PG;
        }
    }
}

/// Times `deliver` after `setup` (untimed) per iteration.
fn timed<S, D>(rt: &Runtime, iters: u64, setup: S, deliver: D) -> Duration
where
    S: AsyncFn(),
    D: AsyncFn() -> usize,
{
    rt.block_on(async {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            setup().await;
            let start = Instant::now();
            let n = deliver().await;
            total += start.elapsed();
            std::hint::black_box(n);
        }
        total
    })
}

/// The indexes the hand-written delivery loop needs (a person writing it would add them): due
/// pending deliveries by time, and leased ones by token. Created on the baseline's own database,
/// so that the engine's tables carry only the engine's indexes.
async fn raw_indexes(store: &Store) {
    const DUE: &str = "CREATE INDEX IF NOT EXISTS raw_due ON event_deliveries (next_attempt_at) WHERE status = 'pending'";
    const LEASE: &str = "CREATE INDEX IF NOT EXISTS raw_lease ON event_deliveries (lease_token) WHERE lease_token IS NOT NULL";
    let mut tx = store.begin().await.unwrap();
    tx.execute(DUE, &[]).await.unwrap();
    tx.execute(LEASE, &[]).await.unwrap();
    tx.commit().await.unwrap();
}

fn group(c: &mut Criterion, rt: &Runtime, name: &str, store: Store, raw_store: Store) {
    rt.block_on(raw_indexes(&raw_store));
    let raw_commits = outbox(raw_store.clone(), Handler::Noop, 128, 16);
    let commits = outbox(store.clone(), Handler::Noop, 128, 16);
    let mut g = c.benchmark_group(name);
    g.sample_size(20)
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_secs(1));
    for n in [1usize, 10] {
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(format!("uow_commit_{n}"), |b| {
            b.to_async(rt).iter(|| uow_commit(&commits, n))
        });
        g.bench_function(format!("raw_insert_{n}"), |b| {
            b.to_async(rt).iter(|| raw_insert(&store, n))
        });
    }
    g.sample_size(10)
        .measurement_time(Duration::from_secs(8))
        .warm_up_time(Duration::from_millis(500));
    // Completes what the commit benchmarks left pending.
    let clear = async || {
        commits.drain(Duration::from_secs(600)).await.unwrap();
    };

    // (name, aggregates, per aggregate, handler, batch, concurrency, raw baseline)
    let cases: [(&str, usize, usize, Handler, u32, usize, bool); 4] = [
        ("deliver_1000", 1000, 1, Handler::Noop, 250, 16, true),
        ("deliver_10000", 100, 100, Handler::Noop, 1000, 100, true),
        (
            "deliver_hot_aggregate",
            1,
            5000,
            Handler::Noop,
            1000,
            16,
            false,
        ),
        // Runs are delivered one delivery at a time, so a claim large enough to take each
        // aggregate's run whole (20 each) lets 64 of them go at once.
        ("deliver_io_10ms", 100, 20, Handler::Io, 2000, 64, false),
    ];
    for (bench, aggregates, per, handler, batch, concurrency, raw) in cases {
        let engine = outbox(store.clone(), handler, batch, concurrency);
        g.throughput(Throughput::Elements((aggregates * per) as u64));
        g.bench_function(bench, |b| {
            b.iter_custom(|iters| {
                timed(
                    rt,
                    iters,
                    async || {
                        clear().await;
                        fill(&engine, aggregates, per).await;
                    },
                    async || {
                        engine
                            .drain(Duration::from_secs(600))
                            .await
                            .unwrap()
                            .completed
                    },
                )
            })
        });
        if raw {
            g.bench_function(format!("raw_{bench}"), |b| {
                b.iter_custom(|iters| {
                    timed(
                        rt,
                        iters,
                        async || {
                            raw_deliver(&raw_store, 1000).await;
                            fill(&raw_commits, aggregates, per).await;
                        },
                        async || raw_deliver(&raw_store, i64::from(batch)).await,
                    )
                })
            });
        }
    }
    g.finish();
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let path = std::env::temp_dir().join(format!("outbox-bench-{}.db", Uuid::now_v7()));
    let raw_path = std::env::temp_dir().join(format!("outbox-bench-raw-{}.db", Uuid::now_v7()));
    let sqlite = rt
        .block_on(Store::connect(&format!("sqlite://{}", path.display())))
        .unwrap();
    let raw_sqlite = rt
        .block_on(Store::connect(&format!("sqlite://{}", raw_path.display())))
        .unwrap();
    group(c, &rt, "outbox_sqlite", sqlite, raw_sqlite);

    let url = std::env::var("EVENTS_BENCH_POSTGRES_URL")
        .or_else(|_| std::env::var("EVENTS_TEST_POSTGRES_URL"));
    match url {
        #[cfg(feature = "postgres")]
        Ok(url) => {
            let schema = format!("outbox_bench_{}", Uuid::now_v7().simple());
            let pg = rt
                .block_on(event_runtime::store::postgres::connect_in_schema(&url, &schema))
                .unwrap();
            let raw_pg = rt
                .block_on(event_runtime::store::postgres::connect_in_schema(&url, &format!("{schema}_raw")))
                .unwrap();
            group(c, &rt, "outbox_postgres", pg, raw_pg);
        }
        _ => eprintln!(
            "outbox_postgres skipped: set EVENTS_BENCH_POSTGRES_URL and build with --features postgres"
        ),
    }
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(raw_path);
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! An inbox receiving a stream it already read, re-published by a producer that started on a
//! fresh database (the same aggregates and sequences under new event ids): every message is a
//! `conflict` dead letter, and a batch of them is cleared in the batch's one transaction, not
//! in one transaction per message competing with the consuming outbox's workers for the
//! write lock. Against the real NATS server (`EVENTS_TEST_NATS_URL`) and both stores.
//!
//! `inbox_conflict_throughput` (ignored) is the measurement BENCHMARKS.md reports:
//! `cargo test -p event-tests --test nats_inbox_conflicts -- --ignored --nocapture`.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
use event_runtime::testing::{FaultAction, FaultPoint};
use event_runtime::transport::nats::{InboxConfig, NatsInbox, StreamSpec};
use event_runtime::{Dispatcher, Outbox, OutboxConfig, RetryPolicy, SqlValue, Store, Tx};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "conflicttest.shipped", version = 1)]
struct Shipped {
    #[event(aggregate_id)]
    order: String,
    cents: i64,
}

#[event_handler(name = "conflicttest.bill")]
async fn bill(envelope: &Envelope<Shipped>, tx: &mut Tx) -> Result<(), HandlerError> {
    tx.execute(
        "INSERT INTO conflict_effects (event_id, cents) VALUES ($1, $2)",
        &[
            SqlValue::Text(&envelope.id().to_string()),
            SqlValue::Int(envelope.event().cents),
        ],
    )
    .await?;
    Ok(())
}

/// A client's JetStream context and a fresh stream (capturing `<prefix>.>`), or `None` after
/// saying why the case is skipped.
async fn with_stream(test: &str) -> Option<(jetstream::Context, String, String)> {
    let url = match std::env::var("EVENTS_TEST_NATS_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => {
            assert!(
                std::env::var("EVENTS_TEST_REQUIRE_SERVICES").as_deref() != Ok("1"),
                "{test}: EVENTS_TEST_REQUIRE_SERVICES=1 but EVENTS_TEST_NATS_URL is not set"
            );
            common::say_once(
                "NATS",
                &format!("NATS cases skipped ({test} and others): EVENTS_TEST_NATS_URL is not set"),
            );
            return None;
        }
    };
    let client = async_nats::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("{test}: NATS at {url} is unreachable: {e}"));
    let js = jetstream::new(client);
    let id = uuid::Uuid::now_v7().simple().to_string();
    let (stream, prefix) = (format!("C{id}"), format!("c{id}"));
    StreamSpec::new(&stream)
        .subjects([format!("{prefix}.>")])
        .create(&js)
        .await
        .unwrap();
    Some((js, stream, prefix))
}

/// The consuming service on `store`: `Shipped` billed in the transaction that receives it,
/// as the billing example's handlers are; `hook` sees every fault point.
async fn consumer(store: Store, commits: Arc<AtomicUsize>) -> Outbox {
    let mut tx = store.begin().await.unwrap();
    tx.execute(
        "CREATE TABLE conflict_effects (event_id TEXT NOT NULL, cents BIGINT NOT NULL)",
        &[],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    Outbox::builder(store)
        .dispatcher(
            Dispatcher::builder_empty()
                .event::<Shipped>()
                .handler::<bill>(),
        )
        .config(
            OutboxConfig::default()
                .retry(RetryPolicy {
                    max_attempts: 5,
                    initial_backoff: Duration::from_millis(10),
                    max_backoff: Duration::from_millis(50),
                })
                // The billing example's.
                .poll_interval(Duration::from_millis(20)),
        )
        .fault_injection(move |point| {
            if point == FaultPoint::AfterCommit {
                commits.fetch_add(1, Ordering::SeqCst);
            }
            FaultAction::Continue
        })
        .build()
        .unwrap()
}

fn inbox_config(stream: &str, batch: usize) -> InboxConfig {
    InboxConfig::new(stream, "billing")
        .batch(batch)
        .ack_wait(Duration::from_secs(30))
        .fetch_wait(Duration::from_millis(200))
}

/// `aggregates` × `per_aggregate` events, sequenced per aggregate, as the producer commits
/// them; the same again under new event ids (a producer started on a fresh database).
fn events(aggregates: usize, per_aggregate: u64) -> (Vec<String>, Vec<String>) {
    let run = uuid::Uuid::now_v7().simple().to_string();
    let (mut first, mut again) = (Vec::new(), Vec::new());
    for a in 0..aggregates {
        for seq in 1..=per_aggregate {
            let e = |cents| {
                Envelope::new(Shipped {
                    order: format!("order-{a}-{run}"),
                    cents,
                })
                .with_sequence(seq)
                .with_source("urn:test:orders")
            };
            first.push(serde_json::to_string(&e(1)).unwrap());
            again.push(serde_json::to_string(&e(2)).unwrap());
        }
    }
    (first, again)
}

/// Publishes `bodies` pipelined, then waits for every ack.
async fn publish(js: &jetstream::Context, subject: &str, bodies: Vec<String>) {
    let mut acks = Vec::with_capacity(bodies.len());
    for body in bodies {
        acks.push(js.publish(subject.to_owned(), body.into()).await.unwrap());
    }
    for ack in acks {
        ack.await.unwrap();
    }
}

/// Receives until `want` messages were dead-lettered (or `deadline` passes); the time it
/// took and the inbox's total.
async fn receive_until_dead_lettered(
    inbox: &NatsInbox,
    want: usize,
    deadline: Duration,
) -> (Duration, event_runtime::transport::nats::InboxReport) {
    let start = Instant::now();
    let mut total = event_runtime::transport::nats::InboxReport::default();
    while total.dead_lettered < want && start.elapsed() < deadline {
        total += inbox.receive().await.unwrap();
    }
    (start.elapsed(), total)
}

/// One batch: fresh events of two aggregates, the conflicting copies of events of eight
/// aggregates the consumer holds, and two messages of the batch claiming one new place. Every
/// conflict is a dead letter, written in the one transaction that commits the rest.
async fn a_batch_of_conflicts_is_cleared_in_one_transaction(store: Store, label: &str) {
    let Some((js, stream, prefix)) = with_stream("batch_of_conflicts").await else {
        return;
    };
    let subject = format!("{prefix}.conflicttest.shipped");
    let commits = Arc::new(AtomicUsize::new(0));
    let billing = consumer(store, commits.clone()).await;
    let (first, again) = events(8, 2);
    publish(&js, &subject, first).await;
    let inbox = NatsInbox::new(&js, billing.clone(), inbox_config(&stream, 64))
        .await
        .unwrap();
    let r = inbox.receive().await.unwrap();
    assert_eq!((r.received, r.appended), (16, 16), "{label}: {r:?}");

    let (fresh, _) = events(2, 1);
    let (twin, twin_again) = events(1, 1);
    let mut batch = fresh;
    batch.extend(again);
    batch.extend(twin);
    batch.extend(twin_again);
    publish(&js, &subject, batch).await;
    commits.store(0, Ordering::SeqCst);
    let r = inbox.receive().await.unwrap();
    assert_eq!(
        (r.received, r.appended, r.dead_lettered, r.acked),
        (20, 3, 17, 3),
        "{label}: {r:?}"
    );
    assert_eq!(
        commits.load(Ordering::SeqCst),
        1,
        "{label}: the batch, its dead letters included, is one transaction"
    );
    let dead = billing
        .store()
        .dead_letters(&Default::default())
        .await
        .unwrap();
    assert_eq!(dead.len(), 17, "{label}");
    assert!(dead.iter().all(|d| d.reason == "conflict"), "{label}");
    assert!(
        dead.iter()
            .all(|d| d.error_chain[0].contains("under another event id")),
        "{label}: {:?}",
        dead[0].error_chain
    );
    billing.drain(Duration::from_secs(30)).await.unwrap();
    let mut tx = billing.store().begin().await.unwrap();
    let billed = tx
        .fetch_i64("SELECT COUNT(*) FROM conflict_effects", &[])
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(billed, Some(19), "{label}: 16 + 3 billed, once each");
    assert_eq!(inbox.ack_pending().await.unwrap(), 0, "{label}");
    js.delete_stream(&stream).await.unwrap();
}

#[tokio::test]
async fn a_batch_of_conflicts_is_cleared_in_one_transaction_sqlite() {
    let (_, store) = common::sqlite("batch_of_conflicts").await;
    a_batch_of_conflicts_is_cleared_in_one_transaction(store, "sqlite").await;
}

#[tokio::test]
async fn a_batch_of_conflicts_is_cleared_in_one_transaction_postgres() {
    let Some((_, _, store)) = common::postgres("batch_of_conflicts").await else {
        return;
    };
    a_batch_of_conflicts_is_cleared_in_one_transaction(store, "postgres").await;
}

/// The measurement of BENCHMARKS.md ("Inbox conflicts"): a consumer whose outbox runs 2
/// workers (poll 20 ms, an in-transaction handler, as the billing example) receives n
/// events in batches of 256, then the n conflicting copies; the time until all n are
/// dead-lettered, per store. `EVENTS_MEASURE_CONFLICTS` sets n (default 1,024).
async fn measure(store: Store, label: &str) {
    let Some((js, stream, prefix)) = with_stream("inbox_conflict_throughput").await else {
        return;
    };
    let n: usize = std::env::var("EVENTS_MEASURE_CONFLICTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let subject = format!("{prefix}.conflicttest.shipped");
    let commits = Arc::new(AtomicUsize::new(0));
    let billing = consumer(store, commits.clone()).await;
    // Orders of 4 events each, as the orders example's (placed, lines, shipped).
    let (first, again) = events(n / 4, 4);
    publish(&js, &subject, first).await;
    let inbox = NatsInbox::new(&js, billing.clone(), inbox_config(&stream, 256))
        .await
        .unwrap();
    let workers = billing.spawn_workers(
        std::env::var("EVENTS_MEASURE_WORKERS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2),
    );
    let mut received = 0;
    while received < n {
        received += inbox.receive().await.unwrap().received;
    }
    publish(&js, &subject, again).await;
    commits.store(0, Ordering::SeqCst);
    let (took, total) = receive_until_dead_lettered(&inbox, n, Duration::from_secs(1800)).await;
    workers.shutdown(Duration::from_secs(30)).await.unwrap();
    println!(
        "inbox_conflict_throughput {label}: {} of {n} conflicting messages dead-lettered in {:.2} s ({:.0} per second), {} commits",
        total.dead_lettered,
        took.as_secs_f64(),
        total.dead_lettered as f64 / took.as_secs_f64(),
        commits.load(Ordering::SeqCst)
    );
    assert_eq!(total.dead_lettered, n, "{label}: {total:?}");
    js.delete_stream(&stream).await.unwrap();
}

#[tokio::test]
#[ignore = "a measurement: run with --ignored --nocapture, see BENCHMARKS.md"]
async fn inbox_conflict_throughput() {
    let (_, store) = common::sqlite("inbox_conflict_throughput").await;
    measure(store, "sqlite").await;
    if let Some((_, _, store)) = common::postgres("inbox_conflict_throughput").await {
        measure(store, "postgres").await;
    }
}

//! Closing gaps across a real NATS JetStream: a missing event still in the stream (a crashed
//! instance fetched it and never acked) is re-fetched and committed through the inbox core;
//! after a wiped broker, nothing in the stream can help and the producer publishes again
//! (`events relay republish`), after which the consumer's totals and per-aggregate order are
//! exact. On SQLite and the real PostgreSQL server; the re-fetch case on the shared server
//! (`EVENTS_TEST_NATS_URL`), the wiped-broker case on a test-owned `nats-server`.
//!
//! Skipped visibly without `EVENTS_TEST_NATS_URL`; failing instead with
//! `EVENTS_TEST_REQUIRE_SERVICES=1`.

mod common;
#[path = "common/nats_server.rs"]
mod nats_server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
use event_runtime::cli::{run_with_output, App};
use event_runtime::testing::ManualClock;
use event_runtime::transport::nats::{
    InboxConfig, NatsError, NatsInbox, NatsRelay, Refetch, RefetchOutcome, RelayConfig, StreamSpec,
};
use event_runtime::{
    CancellationToken, Dispatcher, Outbox, OutboxConfig, OutboxError, Registry, RetryPolicy,
    SqlValue, Store, Tx,
};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use common::Db;
use nats_server::OwnServer;

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "gapstest.line", version = 1)]
struct Line {
    #[event(aggregate_id)]
    order: String,
}

/// Records (order, sequence, a per-database counter) in the handler's transaction.
#[event_handler(name = "gapstest.record")]
async fn record(envelope: &Envelope<Line>, tx: &mut Tx) -> Result<(), HandlerError> {
    tx.execute(
        "INSERT INTO gap_seen (order_id, sequence, n) VALUES ($1, $2, (SELECT COUNT(*) + 1 FROM gap_seen))",
        &[
            SqlValue::Text(&envelope.event().order),
            SqlValue::Int(envelope.sequence() as i64),
        ],
    )
    .await?;
    Ok(())
}

fn enabled(test: &str) -> Option<String> {
    common::nats_url(test, "NATS gap cases")
}

/// The consuming service's outbox on `store`, as its application builds it.
fn consumer(store: Store, clock: Option<Arc<ManualClock>>) -> Result<Outbox, OutboxError> {
    let mut b = Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().handler::<record>())
        .config(OutboxConfig::default().gap_after(Duration::from_secs(120)));
    if let Some(clock) = clock {
        b = b.clock(clock);
    }
    b.build()
}

async fn setup(store: &Store) {
    let mut tx = store.begin().await.unwrap();
    tx.execute(
        "CREATE TABLE gap_seen (order_id TEXT NOT NULL, sequence BIGINT NOT NULL, n BIGINT NOT NULL)",
        &[],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

/// The sequences handled for `order`, in the order they were handled.
async fn seen(store: &Store, order: &str) -> Vec<i64> {
    store
        .query("SELECT sequence FROM gap_seen WHERE order_id = $1 ORDER BY n")
        .bind(order)
        .fetch_all()
        .await
        .unwrap()
        .iter()
        .map(|r| r.get_at::<i64>(0).unwrap())
        .collect()
}

/// Event `seq` of `order` as a relay publishes it, naming `prev`.
fn wire(order: &str, seq: u64, prev: u64) -> Vec<u8> {
    let envelope = Envelope::new(Line {
        order: order.into(),
    })
    .with_sequence(seq)
    .with_source("urn:test:gaps");
    let mut json = serde_json::to_value(&envelope).unwrap();
    json["prevsequence"] = prev.to_string().into();
    serde_json::to_vec(&json).unwrap()
}

/// `events …` on `db` as `app`: (success, stdout, stderr).
async fn events(db: &Db, app: App<'_>, args: &[&str]) -> (bool, String, String) {
    let mut argv: Vec<String> = vec!["events".into()];
    match db {
        Db::Sqlite(url) => argv.extend(["--database".into(), url.clone()]),
        Db::Postgres { url, schema } => argv.extend([
            "--database".into(),
            url.clone(),
            "--schema".into(),
            schema.clone(),
        ]),
    }
    argv.extend(args.iter().map(|a| a.to_string()));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_with_output(argv, app, &mut out, &mut err).await;
    (
        code == std::process::ExitCode::SUCCESS,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_event_still_in_the_stream_is_refetched_and_its_gap_closes() {
    let Some(url) = enabled("refetch") else {
        return;
    };
    for db in common::databases("nats_refetch").await {
        let label = db.label();
        let client = async_nats::connect(&url).await.unwrap();
        let js = jetstream::new(client);
        let id = uuid::Uuid::now_v7().simple().to_string();
        let (stream, prefix) = (format!("G{id}"), format!("g{id}"));
        StreamSpec::new(&stream)
            .subjects([format!("{prefix}.>")])
            .create(&js)
            .await
            .unwrap();
        let store = db.open().await;
        setup(&store).await;
        let clock = Arc::new(ManualClock::new());
        let outbox = consumer(store.clone(), Some(clock.clone())).unwrap();
        let config = InboxConfig::new(&stream, "billing")
            .ack_wait(Duration::from_secs(60))
            .fetch_wait(Duration::from_millis(300));
        let inbox = NatsInbox::new(&js, outbox.clone(), config).await.unwrap();
        for (seq, prev) in [(1, 0), (2, 1), (3, 2)] {
            js.publish(format!("{prefix}.line"), wire("R", seq, prev).into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
        // An instance fetched event 1 and died before acking it: the server redelivers it
        // only after the ack wait (a minute); the inbox gets 2 and 3 meanwhile, and holds them.
        let durable: jetstream::consumer::PullConsumer = js
            .get_stream(&stream)
            .await
            .unwrap()
            .get_consumer("billing")
            .await
            .unwrap();
        let mut lost = durable
            .batch()
            .max_messages(1)
            .expires(Duration::from_secs(1))
            .messages()
            .await
            .unwrap();
        let first = lost.next().await.unwrap().unwrap();
        assert_eq!(first.info().unwrap().stream_sequence, 1, "{label}");
        drop(lost);
        assert_eq!(inbox.receive().await.unwrap().appended, 2, "{label}");
        outbox.drain(Duration::from_secs(10)).await.unwrap();
        assert!(seen(&store, "R").await.is_empty(), "{label}: held");

        // The standalone tool cannot commit what it would find (it has no inbox core).
        let (ok, _, err) = events(
            &db,
            App::standalone(),
            &[
                "inbox",
                "gaps",
                "refetch",
                "--all-open",
                "--consumer",
                "billing",
                "--stream",
                &stream,
                "--nats",
                &url,
                "--reason",
                "instance crashed",
                "--actor",
                "test",
            ],
        )
        .await;
        assert!(!ok, "{label}");
        assert!(err.contains("application's own tool"), "{label}: {err}");

        clock.advance(Duration::from_secs(130));
        let gaps = outbox.detect_gaps().await.unwrap();
        assert_eq!(gaps.len(), 1, "{label}: {gaps:?}");
        assert_eq!(gaps[0].missing_sequence, 1, "{label}");

        // Started past the waiting event, a re-fetch reads nothing and says it did not read
        // it all: "not found" there is not "the broker lost it".
        let r = Refetch::new(stream.clone(), "billing")
            .from(5)
            .run(&js, &outbox, "test", "probe")
            .await
            .unwrap();
        assert_eq!((r.range, r.complete), (None, false), "{label}");
        assert!(
            matches!(r.gaps[0].outcome, RefetchOutcome::NotFound { .. }),
            "{label}"
        );
        assert_eq!(outbox.gaps(false).await.unwrap().len(), 1, "{label}");

        let r = inbox
            .refetch_gaps(None, "test", "instance crashed")
            .await
            .unwrap();
        assert_eq!(
            r.range,
            Some((1, 1)),
            "{label}: from the ack floor to before event 2"
        );
        assert!(r.complete, "{label}");
        assert_eq!(r.committed.appended, 1, "{label}");
        assert_eq!(r.gaps.len(), 1, "{label}");
        assert_eq!(r.gaps[0].outcome, RefetchOutcome::Arrived, "{label}");
        let audit = r.audit.unwrap();
        assert_eq!(
            (audit.action.as_str(), audit.count),
            ("gap-refetch", 1),
            "{label}"
        );
        assert!(audit.finished_at.is_some(), "{label}");
        outbox.drain(Duration::from_secs(10)).await.unwrap();
        assert_eq!(seen(&store, "R").await, [1, 2, 3], "{label}");
        assert!(outbox.gaps(false).await.unwrap().is_empty(), "{label}");
        assert_eq!(outbox.held_events().await.unwrap(), 0, "{label}");
        let origin = store
            .received_origin(first_id(&store, "R", 1).await)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            origin.attributes.get("refetch"),
            Some(&audit.id.to_string()),
            "{label}: {origin:?}"
        );

        // Nothing open any more: nothing read, and the tool says so.
        let r = inbox.refetch_gaps(None, "test", "again").await.unwrap();
        assert!(r.audit.is_none() && r.gaps.is_empty(), "{label}");
        js.delete_stream(&stream).await.unwrap();
        store.close().await;
    }
}

async fn first_id(store: &Store, order: &str, seq: i64) -> uuid::Uuid {
    let id: String = store
        .query("SELECT event_id FROM event_outbox WHERE aggregate_id = $1 AND sequence = $2")
        .bind(order)
        .bind(seq)
        .fetch_one()
        .await
        .unwrap()
        .get_at(0)
        .unwrap();
    id.parse().unwrap()
}

/// Waits until the producer published everything (nothing pending), at most 30 s.
async fn published(outbox: &Outbox, label: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while outbox.store().stats().await.unwrap().pending > 0 {
        assert!(Instant::now() < deadline, "{label}: the relay published");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_wiped_broker_the_producer_republishes_and_the_consumer_totals_are_exact() {
    if enabled("wiped_republish").is_none() {
        return;
    }
    let producers = common::databases("wiped_republish_p").await;
    let consumers = common::databases("wiped_republish_c").await;
    for (pdb, cdb) in producers.into_iter().zip(consumers) {
        let label = pdb.label();
        let Some(mut server) = OwnServer::start() else {
            return;
        };
        let url = server.url();
        let client = server.client().await;
        let js = jetstream::new(client.clone());
        let spec = StreamSpec::new("EVENTS").subjects(["gaps.>"]);
        spec.create(&js).await.unwrap();

        // The producer: R1..R3 and S1..S2, published.
        let relay = NatsRelay::new(
            client.clone(),
            RelayConfig::new("EVENTS")
                .subject_prefix("gaps")
                .retry(RetryPolicy {
                    max_attempts: 5,
                    initial_backoff: Duration::from_millis(10),
                    max_backoff: Duration::from_millis(50),
                }),
        );
        let producer = Outbox::builder(pdb.open().await)
            .dispatcher(Dispatcher::builder_empty().event::<Line>())
            .destination(relay.clone())
            .config(
                OutboxConfig::default()
                    .source("urn:test:gaps")
                    .poll_interval(Duration::from_millis(20)),
            )
            .build()
            .unwrap();
        relay.check(&producer).await.unwrap();
        let workers = producer.spawn_workers(1);
        let since = (chrono::Utc::now() - chrono::Duration::seconds(1)).to_rfc3339();
        let commit = |order: &'static str, seqs: std::ops::RangeInclusive<u64>| {
            let producer = producer.clone();
            async move {
                let mut uow = producer.begin().await.unwrap();
                for s in seqs {
                    uow.add(
                        Envelope::new(Line {
                            order: order.into(),
                        })
                        .with_sequence(s),
                    );
                }
                uow.commit().await.unwrap();
            }
        };
        commit("R", 1..=3).await;
        commit("S", 1..=2).await;
        published(&producer, label).await;

        // The consumer is behind: it received two of the five.
        let cstore = cdb.open().await;
        setup(&cstore).await;
        let clock = Arc::new(ManualClock::new());
        let outbox = consumer(cstore.clone(), Some(clock.clone())).unwrap();
        let config = InboxConfig::new("EVENTS", "billing")
            .batch(2)
            .ack_wait(Duration::from_secs(60))
            .fetch_wait(Duration::from_millis(300));
        let inbox = NatsInbox::new(&js, outbox.clone(), config.clone())
            .await
            .unwrap();
        assert_eq!(inbox.receive().await.unwrap().appended, 2, "{label}");

        // The broker loses its storage; the operator creates the stream again and the
        // producer goes on: R4 and S3 reach the new stream.
        server.wipe();
        assert!(server.up());
        let js2 = jetstream::new(server.client().await);
        spec.create(&js2).await.unwrap();
        commit("R", 4..=4).await;
        commit("S", 3..=3).await;
        published(&producer, label).await;

        // The consumer stops, naming the way out.
        let e = tokio::time::timeout(
            Duration::from_secs(60),
            inbox.run(CancellationToken::new(), Some(Duration::from_secs(50))),
        )
        .await
        .expect("the inbox stops on a wiped broker")
        .expect_err("never a normal result");
        assert!(
            matches!(e, NatsError::IdentityChanged { .. }),
            "{label}: {e}"
        );
        assert!(
            e.to_string().contains("events relay republish"),
            "{label}: {e}"
        );
        let (ok, _, err) = events(
            &cdb,
            App::standalone(),
            &[
                "nats",
                "inbox",
                "adopt",
                "billing",
                "--nats",
                &url,
                "--reason",
                "broker wiped",
                "--actor",
                "test",
            ],
        )
        .await;
        assert!(ok, "{label}: {err}");
        let inbox = NatsInbox::new(&js2, outbox.clone(), config).await.unwrap();
        assert_eq!(
            inbox.receive().await.unwrap().appended,
            2,
            "{label}: R4 and S3"
        );
        outbox.drain(Duration::from_secs(10)).await.unwrap();
        clock.advance(Duration::from_secs(130));
        let gaps = outbox.detect_gaps().await.unwrap();
        assert!(!gaps.is_empty(), "{label}: the lost events are gaps");

        // A re-fetch cannot help: the application's tool says so, and names the command for
        // the producer.
        let registry = Registry::builder().build().unwrap();
        let factory = |s: Store| consumer(s, None);
        let app = App::embedded("billing events", &registry).outbox(&factory);
        let (ok, out, err) = events(
            &cdb,
            app,
            &[
                "inbox",
                "gaps",
                "refetch",
                "--all-open",
                "--consumer",
                "billing",
                "--nats",
                &url,
                "--reason",
                "broker wiped",
                "--actor",
                "test",
            ],
        )
        .await;
        assert!(!ok, "{label}: {out}");
        assert!(out.contains("not in the stream"), "{label}: {out}");
        assert!(
            out.contains("events relay republish --destination nats:EVENTS --aggregate"),
            "{label}: {out}"
        );
        assert!(err.contains("not closed by the stream"), "{label}: {err}");

        // The producer publishes again everything since before the loss.
        let (ok, out, err) = events(
            &pdb,
            App::standalone(),
            &[
                "relay",
                "republish",
                "--destination",
                "nats:EVENTS",
                "--since",
                &since,
                "--reason",
                "broker wiped",
                "--actor",
                "test",
            ],
        )
        .await;
        assert!(ok, "{label}: {err}");
        assert!(out.contains("re-publishing 7 event(s)"), "{label}: {out}");
        published(&producer, label).await;

        let report = inbox
            .run(CancellationToken::new(), Some(Duration::from_secs(2)))
            .await
            .unwrap();
        assert_eq!(report.appended, 3, "{label}: the three lost ones");
        // R4 and S3 are in the new stream's duplicate window: the stream drops them; the two
        // received before the loss are dropped by the inbox's event-id de-duplication.
        assert_eq!(report.duplicates, 2, "{label}: the ones it had");
        outbox.drain(Duration::from_secs(10)).await.unwrap();
        assert_eq!(seen(&cstore, "R").await, [1, 2, 3, 4], "{label}");
        assert_eq!(seen(&cstore, "S").await, [1, 2, 3], "{label}");
        assert!(outbox.gaps(false).await.unwrap().is_empty(), "{label}");
        assert!(
            outbox
                .gaps(true)
                .await
                .unwrap()
                .iter()
                .all(|g| g.resolution.as_deref() == Some("arrived")),
            "{label}"
        );
        assert_eq!(outbox.held_events().await.unwrap(), 0, "{label}");
        workers.shutdown(Duration::from_secs(5)).await.unwrap();
        drop(server);
    }
}

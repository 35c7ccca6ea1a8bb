//! Broker trouble is loud and never ends in a silent success, against test-owned
//! `nats-server`s (killed, wiped, their stream deleted) and both stores: a wiped broker stops
//! the inbox with an error naming the recorded and the found identity (until an operator
//! adopts the new one), messages removed before the consumer acked them stop it too, a deleted
//! stream pauses the relay without using attempts or dead-lettering anything and it resumes by
//! itself once the stream is back, the connection's loss and return are logged, and an
//! inbox's failing batches are logged once per outage and its end with its length.
//!
//! Skipped visibly without `EVENTS_TEST_NATS_URL` (the gate of every NATS suite) or without
//! the `nats-server` binary; failing instead with `EVENTS_TEST_REQUIRE_SERVICES=1`.

mod common;
#[path = "common/nats_server.rs"]
mod nats_server;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
use event_runtime::cli::{run_with_output, App};
use event_runtime::transport::nats::{
    self, InboxConfig, NatsError, NatsInbox, NatsRelay, RelayConfig, StreamSpec,
};
use event_runtime::{Destination, Dispatcher, Outbox, OutboxConfig, RetryPolicy, Store, Tx};
use serde::{Deserialize, Serialize};

use common::Db;
use nats_server::OwnServer;

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "faults.shipped", version = 1)]
struct Shipped {
    #[event(aggregate_id)]
    order: String,
    cents: i64,
}

fn enabled(test: &str) -> bool {
    common::nats_url(test, "NATS broker fault cases").is_some()
}

fn shipped(order: &str, seq: u64) -> Envelope<Shipped> {
    Envelope::new(Shipped {
        order: order.into(),
        cents: 100,
    })
    .with_sequence(seq)
    .with_source("urn:test:faults")
}

async fn publish(js: &jetstream::Context, subject: &str, events: &[Envelope<Shipped>]) {
    for e in events {
        js.publish(subject.to_owned(), serde_json::to_string(e).unwrap().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
}

async fn consumer_outbox(db: &Db) -> Outbox {
    Outbox::builder(db.open().await)
        .dispatcher(Dispatcher::builder_empty().event::<Shipped>())
        .build()
        .unwrap()
}

fn inbox_config(stream: &str) -> InboxConfig {
    InboxConfig::new(stream, "billing")
        .ack_wait(Duration::from_secs(2))
        .fetch_wait(Duration::from_millis(300))
}

fn stream_spec(stream: &str) -> StreamSpec {
    StreamSpec::new(stream).subjects(["faults.>"])
}

/// The relay the producer cases use: `faults.<name>` into `EVENTS`, three quick attempts (so
/// that a fault that used attempts would dead-letter within a second).
fn relay_config() -> RelayConfig {
    RelayConfig::new("EVENTS")
        .subject_prefix("faults")
        .retry(RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(20),
        })
}

/// A producing outbox on `db` whose only destination is a checked relay with `config`.
async fn producer(
    db: &Db,
    client: async_nats::Client,
    config: RelayConfig,
) -> (Arc<NatsRelay>, Outbox) {
    let relay = NatsRelay::new(client, config);
    let outbox = Outbox::builder(db.open().await)
        .dispatcher(Dispatcher::builder_empty().event::<Shipped>())
        .destination(relay.clone())
        .config(OutboxConfig::default().poll_interval(Duration::from_millis(20)))
        .build()
        .unwrap();
    relay.check(&outbox).await.unwrap();
    (relay, outbox)
}

/// The most attempts any delivery (any pending one, with `pending_only`) used; -1 when the
/// query answers nothing.
async fn max_attempts(store: &Store, pending_only: bool) -> i64 {
    let mut tx = store.begin().await.unwrap();
    let sql = if pending_only {
        "SELECT COALESCE(MAX(attempts), 0) FROM event_deliveries WHERE status = 'pending'"
    } else {
        "SELECT COALESCE(MAX(attempts), 0) FROM event_deliveries"
    };
    let attempts = tx.fetch_i64(sql, &[]).await.unwrap().unwrap_or(-1);
    tx.rollback().await.unwrap();
    attempts
}

async fn events_in(store: &Store) -> i64 {
    let mut tx = store.begin().await.unwrap();
    let n = tx
        .fetch_i64("SELECT COUNT(*) FROM event_outbox", &[])
        .await
        .unwrap()
        .unwrap_or(0);
    tx.rollback().await.unwrap();
    n
}

/// `events …` with `args`, on `db`: (success, stdout, stderr).
async fn events(db: &Db, args: &[&str]) -> (bool, String, String) {
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
    let code = run_with_output(argv, App::standalone(), &mut out, &mut err).await;
    (
        code == std::process::ExitCode::SUCCESS,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_broker_stops_the_inbox_naming_both_identities_until_an_operator_adopts_the_new_one(
) {
    if !enabled("wiped_broker") {
        return;
    }
    for db in common::databases("wiped_broker").await {
        let label = db.label();
        let Some(mut server) = OwnServer::start() else {
            return;
        };
        let client = server.client().await;
        let js = jetstream::new(client.clone());
        stream_spec("EVENTS").create(&js).await.unwrap();
        let outbox = consumer_outbox(&db).await;
        let inbox = NatsInbox::new(&js, outbox.clone(), inbox_config("EVENTS"))
            .await
            .unwrap();
        let before = inbox.identity().clone();
        publish(
            &js,
            "faults.shipped",
            &(1..=3).map(|i| shipped("A", i)).collect::<Vec<_>>(),
        )
        .await;
        assert_eq!(inbox.receive().await.unwrap().appended, 3, "{label}");

        // The broker loses its storage; the producer re-creates the stream on its next start
        // and publishes again.
        server.wipe();
        assert!(server.up());
        let js2 = jetstream::new(server.client().await);
        stream_spec("EVENTS").create(&js2).await.unwrap();
        publish(&js2, "faults.shipped", &[shipped("B", 1)]).await;

        let started = Instant::now();
        let stopped = tokio::time::timeout(
            Duration::from_secs(60),
            inbox.run(Default::default(), Some(Duration::from_secs(50))),
        )
        .await
        .unwrap_or_else(|_| panic!("{label}: the inbox did not stop on a wiped broker"));
        let e = stopped.expect_err("a wiped broker must not end in a normal report");
        assert!(
            matches!(e, NatsError::IdentityChanged { .. }),
            "{label}: {e}"
        );
        assert!(e.is_fatal());
        let text = e.to_string();
        assert!(
            text.contains(&before.stream_created),
            "{label}: names the recorded stream: {text}"
        );
        assert!(text.contains("events nats inbox adopt"), "{label}: {text}");
        assert!(
            started.elapsed() < Duration::from_secs(45),
            "{label}: stopped after a failed fetch or a periodic check, not at idle: {:?}",
            started.elapsed()
        );

        // A restart refuses too, and never creates the consumer again on its own.
        let e = NatsInbox::new(&js2, outbox.clone(), inbox_config("EVENTS"))
            .await
            .expect_err("the restarted inbox refuses the new stream");
        let text = e.to_string();
        let now = js2
            .get_stream("EVENTS")
            .await
            .unwrap()
            .cached_info()
            .created;
        assert!(text.contains(&before.stream_created), "{label}: {text}");
        assert!(text.contains("no consumer `billing`"), "{label}: {text}");
        assert!(
            js2.get_stream("EVENTS")
                .await
                .unwrap()
                .consumer_info("billing")
                .await
                .is_err(),
            "{label}: no consumer created"
        );
        assert_ne!(now.unix_timestamp(), 0);

        // The operator looks, then adopts the new stream (audited); the inbox consumes again.
        let url = server.url();
        let (ok, out, err) =
            events(&db, &["nats", "inbox", "show", "billing", "--nats", &url]).await;
        assert!(ok, "{label}: {err}");
        assert!(out.contains("they differ"), "{label}: {out}");
        let (ok, _, err) = events(
            &db,
            &[
                "nats",
                "inbox",
                "adopt",
                "billing",
                "--nats",
                &url,
                "--reason",
                "broker wiped; B re-published",
                "--actor",
                "test",
            ],
        )
        .await;
        assert!(ok, "{label}: {err}");
        let audit = outbox.store().audit_log(5).await.unwrap();
        assert!(
            audit
                .iter()
                .any(|a| a.action == "inbox-adopt" && a.actor == "test"),
            "{label}: {audit:?}"
        );
        let inbox = NatsInbox::new(&js2, outbox.clone(), inbox_config("EVENTS"))
            .await
            .unwrap();
        assert_ne!(inbox.identity().stream_created, before.stream_created);
        assert_eq!(inbox.receive().await.unwrap().appended, 1, "{label}");
        assert_eq!(events_in(outbox.store()).await, 4, "{label}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_the_stream_removed_before_the_consumer_acked_them_stop_the_inbox() {
    if !enabled("messages_lost") {
        return;
    }
    for db in common::databases("messages_lost").await {
        let label = db.label();
        let Some(server) = OwnServer::start() else {
            return;
        };
        let js = jetstream::new(server.client().await);
        // A stream that keeps its last 5 messages only.
        js.create_stream(jetstream::stream::Config {
            name: "EVENTS".into(),
            subjects: vec!["faults.>".into()],
            max_messages: 5,
            ..Default::default()
        })
        .await
        .unwrap();
        let outbox = consumer_outbox(&db).await;
        let inbox = NatsInbox::new(&js, outbox.clone(), inbox_config("EVENTS"))
            .await
            .unwrap();
        inbox.verify().await.unwrap();
        publish(
            &js,
            "faults.shipped",
            &(1..=8).map(|i| shipped("A", i)).collect::<Vec<_>>(),
        )
        .await;
        let e = inbox.verify().await.expect_err("messages 1-3 are gone");
        assert!(matches!(e, NatsError::MessagesLost { .. }), "{label}: {e}");
        assert!(
            e.to_string().contains("messages 1 to 3 were removed"),
            "{label}: {e}"
        );
        let e = inbox
            .run(Default::default(), Some(Duration::from_secs(20)))
            .await
            .expect_err("run stops");
        assert!(e.is_fatal(), "{label}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_stream_pauses_the_relay_dead_letters_nothing_and_it_resumes_when_the_stream_is_back(
) {
    if !enabled("deleted_stream") {
        return;
    }
    for db in common::databases("deleted_stream").await {
        let label = db.label();
        let Some(server) = OwnServer::start() else {
            return;
        };
        let client = server.client().await;
        let js = jetstream::new(client.clone());
        stream_spec("EVENTS").create(&js).await.unwrap();
        let (relay, outbox) = producer(&db, client.clone(), relay_config()).await;
        let commit = |events: Vec<Envelope<Shipped>>| {
            let outbox = outbox.clone();
            async move {
                let mut uow = outbox.begin().await.unwrap();
                for e in events {
                    uow.add(e);
                }
                uow.commit().await.unwrap();
            }
        };
        commit((1..=3).map(|i| shipped("A", i)).collect()).await;
        let workers = outbox.spawn_workers(1);
        let deadline = Instant::now() + Duration::from_secs(20);
        while outbox.store().stats().await.unwrap().pending > 0 {
            assert!(Instant::now() < deadline, "{label}: first events published");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        js.delete_stream("EVENTS").await.unwrap();
        commit((4..=6).map(|i| shipped("A", i)).collect()).await;
        commit(vec![shipped("B", 1)]).await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        let stats = outbox.store().stats().await.unwrap();
        assert_eq!(
            (stats.pending, stats.dead_letters),
            (4, 0),
            "{label}: waiting, nothing dead-lettered"
        );
        let paused = outbox.store().paused_destinations().await.unwrap();
        assert!(
            paused.iter().any(|p| p.destination == relay.name()),
            "{label}: the relay is paused: {paused:?}"
        );
        let attempts = max_attempts(outbox.store(), true).await;
        assert_eq!(
            attempts, 0,
            "{label}: no attempt used while the stream is missing"
        );

        // The operator (or the producer's next start) creates the stream again.
        stream_spec("EVENTS").create(&js).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let stats = outbox.store().stats().await.unwrap();
            if stats.pending == 0 {
                assert_eq!(stats.dead_letters, 0, "{label}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{label}: resumed by itself: {stats:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut s = js.get_stream("EVENTS").await.unwrap();
        assert_eq!(s.info().await.unwrap().state.messages, 4, "{label}");
        workers.shutdown(Duration::from_secs(5)).await.unwrap();
    }
}

/// Every log line of this test binary, as text.
fn captured() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&log);
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || Sink(Arc::clone(&sink)))
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        log
    })
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn logged(what: &str, needles: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = String::from_utf8_lossy(&captured().lock().unwrap()).into_owned();
        if let Some(line) = text.lines().find(|l| needles.iter().all(|n| l.contains(n))) {
            return line.to_owned();
        }
        assert!(Instant::now() < deadline, "{what} never logged:\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_connection_and_getting_it_back_are_logged_with_the_component_url_and_outage() {
    if !enabled("connection_log") {
        return;
    }
    captured();
    let Some(mut server) = OwnServer::start() else {
        return;
    };
    server.client().await;
    let component = format!("probe-{}", uuid::Uuid::now_v7().simple());
    let client = nats::connect(&server.url(), &component).await.unwrap();
    server.down();
    let lost = logged(
        "connection lost",
        &[&component, "NATS connection lost", &server.url()],
    )
    .await;
    assert!(lost.contains("WARN"), "{lost}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(server.up());
    let back = logged(
        "connection back",
        &[&component, "NATS connection back after"],
    )
    .await;
    assert!(back.contains("outage_s"), "{back}");
    drop(client);

    // A connection that cannot be made names the component and the URL, never credentials.
    let e = nats::connect("nats://user:secret@127.0.0.1:1", "billing")
        .await
        .expect_err("nothing listens on port 1");
    let text = e.to_string();
    assert!(
        text.contains("billing") && text.contains("127.0.0.1:1"),
        "{text}"
    );
    assert!(!text.contains("secret"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_broker_pauses_the_relay_without_using_attempts_and_it_resumes_when_it_answers() {
    if !enabled("hung_broker") {
        return;
    }
    captured();
    for db in common::databases("hung_broker").await {
        let label = db.label();
        let Some(server) = OwnServer::start() else {
            return;
        };
        let client = server.client().await;
        let js = jetstream::new(client.clone());
        stream_spec("EVENTS").create(&js).await.unwrap();
        let (relay, outbox) = producer(
            &db,
            client.clone(),
            relay_config()
                .name(format!("nats:hung-{label}-{}", server.port))
                .publish_timeout(Duration::from_secs(1)),
        )
        .await;
        let workers = outbox.spawn_workers(1);

        // A 90 s hang in the field; 8 s here, beyond several publish time-outs.
        server.freeze();
        let mut uow = outbox.begin().await.unwrap();
        for i in 1..=3 {
            uow.add(shipped("H", i));
        }
        uow.commit().await.unwrap();
        tokio::time::sleep(Duration::from_secs(8)).await;
        let stats = outbox.store().stats().await.unwrap();
        assert_eq!(
            (stats.pending, stats.dead_letters),
            (3, 0),
            "{label}: held back"
        );
        let attempts = max_attempts(outbox.store(), false).await;
        assert_eq!(attempts, 0, "{label}: a hung broker uses no attempt");
        let line = logged("the pause", &["destination unavailable", relay.name()]).await;
        assert!(line.contains("WARN"), "{line}");

        server.thaw();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let stats = outbox.store().stats().await.unwrap();
            if stats.pending == 0 {
                assert_eq!(stats.dead_letters, 0, "{label}");
                break;
            }
            assert!(Instant::now() < deadline, "{label}: resumed: {stats:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        logged(
            "the resumption",
            &["destination available again after", relay.name()],
        )
        .await;
        workers.shutdown(Duration::from_secs(5)).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restarted_on_its_own_storage_is_the_same_broker() {
    if !enabled("restarted_broker") {
        return;
    }
    for db in common::databases("restarted_broker").await {
        let label = db.label();
        let Some(mut server) = OwnServer::start() else {
            return;
        };
        let js = jetstream::new(server.client().await);
        stream_spec("EVENTS").create(&js).await.unwrap();
        let outbox = consumer_outbox(&db).await;
        NatsInbox::new(&js, outbox.clone(), inbox_config("EVENTS"))
            .await
            .unwrap();
        // nats-server 2.9 reports the consumer's creation time a little later after its first
        // restart on the same storage: still the same consumer.
        for _ in 0..2 {
            server.down();
            assert!(server.up());
            let js = jetstream::new(server.client().await);
            let inbox = NatsInbox::new(&js, outbox.clone(), inbox_config("EVENTS"))
                .await
                .unwrap_or_else(|e| panic!("{label}: a restart is not a wipe: {e}"));
            inbox.verify().await.unwrap();
        }
    }
}

/// Fails while [`REFUSING`] is set: a store or handler that refuses received events for a
/// while.
#[event_handler(name = "faults.refuse_at_commit", in_transaction)]
async fn refuse_at_commit(_: &Envelope<Shipped>, _: &mut Tx) -> Result<(), HandlerError> {
    if REFUSING.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(HandlerError::transient(std::io::Error::other(
            "refusing for now",
        )));
    }
    Ok(())
}

static REFUSING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// An inbox whose batches fail for a while (its commit refused) logs the outage's first
/// failure, then nothing more for a minute (it retries every second), and its end with its
/// length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbox_logs_an_outage_once_and_its_end() {
    if !enabled("inbox_outage_log") {
        return;
    }
    captured();
    let Some(server) = OwnServer::start() else {
        return;
    };
    let client = server.client().await;
    let js = jetstream::new(client);
    stream_spec("EVENTS").create(&js).await.unwrap();
    let (_, store) = common::sqlite("inbox_outage_log").await;
    let outbox = Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().handler::<refuse_at_commit>())
        .build()
        .unwrap();
    let durable = format!("outage{}", server.port);
    let config = InboxConfig::new("EVENTS", &durable)
        .fetch_wait(Duration::from_millis(300))
        .allow_in_transaction_handlers(true);
    let inbox = NatsInbox::new(&js, outbox, config).await.unwrap();
    let name = inbox.name().to_owned();
    let cancel = event_runtime::CancellationToken::new();
    let running = tokio::spawn({
        let cancel = cancel.clone();
        async move { inbox.run(cancel, None).await }
    });
    publish(&js, "faults.shipped", &[shipped("O", 1)]).await;
    logged("the outage's first failure", &[&name, "inbox batch failed"]).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    REFUSING.store(false, std::sync::atomic::Ordering::SeqCst);
    let back = logged("the outage's end", &[&name, "inbox receiving again after"]).await;
    assert!(back.contains("WARN") && back.contains("outage_s"), "{back}");
    let text = String::from_utf8_lossy(&captured().lock().unwrap()).into_owned();
    let failures = text
        .lines()
        .filter(|l| l.contains(&name) && l.contains("inbox batch failed"))
        .count();
    assert_eq!(failures, 1, "one line for the outage:\n{text}");
    cancel.cancel();
    running.await.unwrap().unwrap();
}

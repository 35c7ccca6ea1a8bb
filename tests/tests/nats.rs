//! The NATS JetStream transport against the real server (`EVENTS_TEST_NATS_URL`; skipped
//! visibly without it, failing with `EVENTS_TEST_REQUIRE_SERVICES=1`), each test on a stream
//! of its own: the relay publishes once (also after a crash between the ack and the
//! completion), the inbox commits once (also after a crash between its commit and the ack),
//! an outage of the broker loses nothing (a test-owned `nats-server`), poison messages go to
//! the dead letter queue, the start-up checks refuse what the broker would, and the official
//! Python client with the CloudEvents SDK reads what the relay published.

mod common;
#[path = "common/nats_server.rs"]
mod nats_server;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use async_trait::async_trait;
use event_core::{event_handler, DomainEvent, Envelope, EventDescriptor, HandlerError};
use event_runtime::transport::nats::{
    InboxConfig, NatsError, NatsInbox, NatsRelay, RelayConfig, StreamSpec, FAILOVER_ALLOWANCE,
};
use event_runtime::{
    Delivery, DeliveryError, Destination, Dispatcher, Outbox, OutboxConfig, OutboxError,
    RetryPolicy, Routing, SqlValue, Store, StoreError, Tx,
};
use serde::{Deserialize, Serialize};

use nats_server::OwnServer;

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "natstest.shipped", version = 1)]
struct Shipped {
    #[event(aggregate_id)]
    order: String,
    cents: i64,
    note: String,
}

#[event_handler(name = "natstest.bill")]
async fn bill(envelope: &Envelope<Shipped>, tx: &mut Tx) -> Result<(), HandlerError> {
    tx.execute(
        "INSERT INTO nats_effects (event_id, cents) VALUES ($1, $2)",
        &[
            SqlValue::Text(&envelope.id().to_string()),
            SqlValue::Int(envelope.event().cents),
        ],
    )
    .await?;
    Ok(())
}

fn require() -> bool {
    std::env::var("EVENTS_TEST_REQUIRE_SERVICES").as_deref() == Ok("1")
}

/// The client of the shared server, or `None` after saying why the test is skipped.
async fn nats(test: &str) -> Option<async_nats::Client> {
    let url = match std::env::var("EVENTS_TEST_NATS_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => {
            assert!(
                !require(),
                "{test}: EVENTS_TEST_REQUIRE_SERVICES=1 but EVENTS_TEST_NATS_URL is not set"
            );
            common::say_once(
                "NATS",
                &format!("NATS cases skipped ({test} and others): EVENTS_TEST_NATS_URL is not set"),
            );
            return None;
        }
    };
    match async_nats::connect(&url).await {
        Ok(c) => Some(c),
        Err(e) if require() => panic!("{test}: NATS at {url} is unreachable: {e}"),
        Err(e) => {
            common::say_once(
                "NATS",
                &format!("NATS cases skipped: {url} is unreachable: {e}"),
            );
            None
        }
    }
}

/// A stream and subject prefix of its own.
/// A client, its JetStream context, and a fresh stream (capturing `<prefix>.>`) with its name
/// and subject prefix; `None` when NATS is not configured (said once).
async fn with_stream(
    test: &str,
) -> Option<(async_nats::Client, jetstream::Context, String, String)> {
    let client = nats(test).await?;
    let js = jetstream::new(client.clone());
    let (stream, prefix) = names();
    StreamSpec::new(&stream)
        .subjects([format!("{prefix}.>")])
        .create(&js)
        .await
        .unwrap();
    Some((client, js, stream, prefix))
}

fn names() -> (String, String) {
    let id = uuid::Uuid::now_v7().simple().to_string();
    (format!("T{id}"), format!("t{id}"))
}

fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 5,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
    }
}

fn relay_config(stream: &str, prefix: &str) -> RelayConfig {
    RelayConfig::new(stream)
        .subject_prefix(prefix.to_owned())
        .retry(fast_retry())
}

async fn producer(test: &str, relay: Arc<dyn Destination>, config: OutboxConfig) -> Outbox {
    let (_, store) = common::sqlite(test).await;
    Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().event::<Shipped>())
        .destination(relay)
        .config(config)
        .build()
        .unwrap()
}

async fn consumer(test: &str) -> Outbox {
    let (_, store) = common::sqlite(test).await;
    consumer_on(store).await
}

/// The consuming service on `store`: `Shipped` billed into `nats_effects`.
async fn consumer_on(store: Store) -> Outbox {
    let mut tx = store.begin().await.unwrap();
    tx.execute(
        "CREATE TABLE nats_effects (event_id TEXT NOT NULL, cents BIGINT NOT NULL)",
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
        .config(OutboxConfig::default().retry(fast_retry()))
        .build()
        .unwrap()
}

fn shipped(order: &str, seq: u64, cents: i64) -> Envelope<Shipped> {
    Envelope::new(Shipped {
        order: order.into(),
        cents,
        note: "ü ✓ \"quoted\"".into(),
    })
    .with_sequence(seq)
    .with_source("urn:test:orders")
}

/// Commits `events`; returns their envelopes as committed (JSON).
async fn commit(outbox: &Outbox, events: Vec<Envelope<Shipped>>) -> Vec<Envelope<Shipped>> {
    let mut uow = outbox.begin().await.unwrap();
    for e in &events {
        uow.add(e.clone());
    }
    uow.commit().await.unwrap();
    events
}

async fn messages_in(js: &jetstream::Context, stream: &str) -> u64 {
    let mut s = js.get_stream(stream).await.unwrap();
    s.info().await.unwrap().state.messages
}

async fn effects(outbox: &Outbox) -> (i64, i64) {
    let mut tx = outbox.store().begin().await.unwrap();
    let n = tx
        .fetch_i64("SELECT COUNT(*) FROM nats_effects", &[])
        .await
        .unwrap()
        .unwrap_or(0);
    let distinct = tx
        .fetch_i64("SELECT COUNT(DISTINCT event_id) FROM nats_effects", &[])
        .await
        .unwrap()
        .unwrap_or(0);
    tx.rollback().await.unwrap();
    (n, distinct)
}

fn inbox_config(stream: &str, durable: &str) -> InboxConfig {
    InboxConfig::new(stream, durable)
        .ack_wait(Duration::from_secs(1))
        .fetch_wait(Duration::from_millis(500))
}

/// The relay, whose first successful publish of each event is followed by a "crash": the
/// completion is not recorded, as when the worker dies after the ack.
struct CrashAfterAck {
    relay: Arc<NatsRelay>,
    crashed: AtomicUsize,
}

#[async_trait]
impl Destination for CrashAfterAck {
    fn name(&self) -> &str {
        self.relay.name()
    }
    fn route(&self, event: &EventDescriptor) -> Option<Routing> {
        self.relay.route(event)
    }
    async fn deliver(&self, d: &Delivery<'_>) -> Result<(), DeliveryError> {
        self.relay.deliver(d).await?;
        if d.attempt == 1 {
            self.crashed.fetch_add(1, Ordering::SeqCst);
            return Err(DeliveryError::Failed(HandlerError::transient_msg(
                "worker died after the ack",
            )));
        }
        Ok(())
    }
    async fn available(&self) -> bool {
        self.relay.available().await
    }
    fn retry_policy(&self) -> Option<RetryPolicy> {
        self.relay.retry_policy()
    }
    fn timeout(&self) -> Option<Duration> {
        self.relay.timeout()
    }
    fn concurrency(&self) -> Option<usize> {
        self.relay.concurrency()
    }
}

#[tokio::test]
async fn relay_crash_after_the_ack_publishes_again_and_the_stream_and_consumer_keep_it_once() {
    let Some((client, js, stream, prefix)) = with_stream("relay_crash_after_ack").await else {
        return;
    };
    let relay = NatsRelay::new(client.clone(), relay_config(&stream, &prefix));
    let crash = Arc::new(CrashAfterAck {
        relay: relay.clone(),
        crashed: AtomicUsize::new(0),
    });
    let outbox = producer("nats_relay_crash", crash.clone(), OutboxConfig::default()).await;
    relay.check(&outbox).await.unwrap();
    let events = commit(
        &outbox,
        vec![
            shipped("A", 1, 100),
            shipped("A", 2, 250),
            shipped("B", 1, 7),
        ],
    )
    .await;
    outbox.drain(Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        crash.crashed.load(Ordering::SeqCst),
        3,
        "every event was published twice"
    );
    assert_eq!(
        messages_in(&js, &stream).await,
        3,
        "the stream holds each once"
    );

    // Headers: CloudEvents structured mode, the message id is the event id, in order per
    // aggregate.
    let s = js.get_stream(&stream).await.unwrap();
    let mut ids = Vec::new();
    for seq in 1..=3 {
        let m = s.get_raw_message(seq).await.unwrap();
        let h = m.headers;
        assert_eq!(
            h.get("Content-Type").unwrap().as_str(),
            "application/cloudevents+json"
        );
        assert_eq!(m.subject.as_str(), format!("{prefix}.natstest.shipped"));
        let body: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
        assert_eq!(
            h.get(async_nats::header::NATS_MESSAGE_ID).unwrap().as_str(),
            body["id"]
        );
        ids.push(body["id"].as_str().unwrap().to_owned());
    }
    let a: Vec<String> = events[..2].iter().map(|e| e.id().to_string()).collect();
    let pos = |id: &str| ids.iter().position(|x| x == id).unwrap();
    assert!(pos(&a[0]) < pos(&a[1]), "A-1 before A-2");

    // The consumer's effects happen once.
    let billing = consumer("nats_relay_crash_billing").await;
    let inbox = NatsInbox::new(&js, billing.clone(), inbox_config(&stream, "billing"))
        .await
        .unwrap();
    let report = inbox.receive().await.unwrap();
    assert_eq!((report.received, report.appended, report.acked), (3, 3, 3));
    billing.drain(Duration::from_secs(30)).await.unwrap();
    assert_eq!(effects(&billing).await, (3, 3));
    js.delete_stream(&stream).await.unwrap();
}

#[tokio::test]
async fn consumer_crash_after_its_commit_before_the_ack_is_redelivered_and_deduplicated() {
    let Some((client, js, stream, prefix)) = with_stream("consumer_crash_before_ack").await else {
        return;
    };
    let relay = NatsRelay::new(client.clone(), relay_config(&stream, &prefix));
    let outbox = producer(
        "nats_consumer_crash",
        relay.clone(),
        OutboxConfig::default(),
    )
    .await;
    relay.check(&outbox).await.unwrap();
    commit(
        &outbox,
        (1..=5).map(|i| shipped("C", i, i as i64)).collect(),
    )
    .await;
    outbox.drain(Duration::from_secs(30)).await.unwrap();

    let billing = consumer("nats_consumer_crash_billing").await;
    let inbox = NatsInbox::new(&js, billing.clone(), inbox_config(&stream, "billing"))
        .await
        .unwrap();
    let batch = inbox.fetch_and_commit().await.unwrap();
    assert_eq!(batch.report().appended, 5);
    drop(batch); // crashed: committed, never acked

    // Redelivered after ack_wait; every event id is known: nothing is appended twice.
    let mut again = Default::default();
    for _ in 0..10 {
        again = inbox.receive().await.unwrap();
        if again.received > 0 {
            break;
        }
    }
    assert_eq!(
        (again.received, again.duplicates, again.appended),
        (5, 5, 0)
    );
    assert_eq!(again.acked, 5);
    assert_eq!(inbox.receive().await.unwrap().received, 0, "acked for good");
    billing.drain(Duration::from_secs(30)).await.unwrap();
    assert_eq!(effects(&billing).await, (5, 5));
    js.delete_stream(&stream).await.unwrap();
}

#[tokio::test]
async fn poison_messages_go_to_the_dead_letter_queue_with_broker_metadata_and_later_ones_flow() {
    let Some((_client, js, stream, prefix)) = with_stream("poison").await else {
        return;
    };
    let good = shipped("P", 1, 42);
    let good_json = serde_json::to_string(&good).unwrap();
    let unknown = good_json
        .replace("natstest.shipped", "natstest.unheard_of")
        .replace(&good.id().to_string(), &uuid::Uuid::now_v7().to_string());
    for body in ["not json at all".to_owned(), unknown, good_json] {
        js.publish(format!("{prefix}.x"), body.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let billing = consumer("nats_poison_billing").await;
    let inbox = NatsInbox::new(&js, billing.clone(), inbox_config(&stream, "billing"))
        .await
        .unwrap();
    let r = inbox.receive().await.unwrap();
    assert_eq!((r.received, r.appended, r.dead_lettered), (3, 1, 2));
    billing.drain(Duration::from_secs(30)).await.unwrap();
    assert_eq!(effects(&billing).await, (1, 1), "the good one flowed");

    let dead = billing
        .store()
        .dead_letters(&Default::default())
        .await
        .unwrap();
    assert_eq!(dead.len(), 2);
    let reasons: Vec<&str> = dead.iter().map(|d| d.reason.as_str()).collect();
    assert_eq!(reasons, ["undecodable", "unknown_event"]);
    for (d, seq) in dead.iter().zip(1..) {
        let b = d.origin.as_ref().expect("broker metadata");
        assert_eq!(
            (b.source.as_str(), b.position, b.delivery_count),
            (stream.as_str(), seq, 1)
        );
        assert_eq!(b.attributes["subject"], format!("{prefix}.x"));
        assert_eq!(d.handler, "nats-inbox:billing");
    }
    assert_eq!(dead[0].envelope, "not json at all");
    assert_eq!(dead[1].event_name, "natstest.unheard_of");
    // Terminated: never delivered again.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(inbox.receive().await.unwrap().received, 0);
    // Replay needs a deploy that knows it; this one does not, and changes nothing.
    let err = inbox
        .replay_dead_letters(&[dead[1].id], "test", "still unknown")
        .await
        .unwrap_err();
    assert!(matches!(err, NatsError::Replay(..)), "{err:?}");
    // The generic replay leaves an inbox dead letter to its inbox.
    let audit = billing
        .store()
        .resolve_dead_letters(&[dead[0].id], event_runtime::Resolution::Replay, "t", "r")
        .await
        .unwrap();
    assert!(audit.is_empty(), "{audit:?}");
    js.delete_stream(&stream).await.unwrap();
}

/// `good` as a second event: another id (and amount), the same aggregate and sequence.
fn same_place_other_id(good: &Envelope<Shipped>, cents: i64) -> String {
    serde_json::to_string(good)
        .unwrap()
        .replace(&good.id().to_string(), &uuid::Uuid::now_v7().to_string())
        .replace("\"cents\":42", &format!("\"cents\":{cents}"))
}

async fn publish(js: &jetstream::Context, subject: &str, bodies: Vec<String>) {
    for body in bodies {
        js.publish(subject.to_owned(), body.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
}

/// A producer that re-published its events with new ids (started on a fresh database): the
/// message that claims an (aggregate, sequence) the consumer holds under another id, in the
/// same batch as the first or after it was stored, is a dead letter; the rest flows, every
/// message is acked, and the next batch is not blocked.
async fn a_conflicting_message_is_dead_lettered_and_the_rest_of_its_batch_flows(
    store: Store,
    label: &str,
) {
    let Some((_client, js, stream, prefix)) = with_stream("conflict").await else {
        return;
    };
    let subject = format!("{prefix}.natstest.shipped");
    let first = shipped("K", 1, 42);
    let conflicting = same_place_other_id(&first, 43);
    let conflicting_id = serde_json::from_str::<serde_json::Value>(&conflicting).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let json = |e: &Envelope<Shipped>| serde_json::to_string(e).unwrap();
    // One batch: K-1, K-1 again under another id, K-2, and L-1 (another aggregate).
    publish(
        &js,
        &subject,
        vec![
            json(&first),
            conflicting,
            json(&shipped("K", 2, 5)),
            json(&shipped("L", 1, 7)),
        ],
    )
    .await;
    let billing = consumer_on(store).await;
    let inbox = NatsInbox::new(&js, billing.clone(), inbox_config(&stream, "billing"))
        .await
        .unwrap();
    let r = inbox.receive().await.unwrap();
    assert_eq!(
        (
            r.received,
            r.appended,
            r.dead_lettered,
            r.acked,
            r.ack_failed
        ),
        (4, 3, 1, 3, 0),
        "{label}: {r:?}"
    );
    billing.drain(Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        effects(&billing).await,
        (3, 3),
        "{label}: the others flowed"
    );

    let dead = billing
        .store()
        .dead_letters(&Default::default())
        .await
        .unwrap();
    assert_eq!(dead.len(), 1, "{label}: {dead:?}");
    let d = &dead[0];
    assert_eq!(d.reason, "conflict", "{label}");
    assert_eq!(d.handler, "nats-inbox:billing");
    assert_eq!(d.event_id.to_string(), conflicting_id);
    assert_eq!(d.event_name, "natstest.shipped");
    let b = d.origin.as_ref().expect("broker metadata");
    assert_eq!(
        (b.source.as_str(), b.position, b.delivery_count),
        (stream.as_str(), 2, 1),
        "{label}"
    );
    assert_eq!(b.attributes["subject"], subject);
    assert!(
        d.error_chain[0].contains("natstest@urn:test:orders K already has sequence 1"),
        "{label}: {:?}",
        d.error_chain
    );

    // Everything was acked or terminated: nothing pending, nothing redelivered.
    assert_eq!(inbox.ack_pending().await.unwrap(), 0, "{label}");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(inbox.receive().await.unwrap().received, 0, "{label}");

    // The next batch: K-1 a third time, now against the stored event, and M-1.
    publish(
        &js,
        &subject,
        vec![same_place_other_id(&first, 44), json(&shipped("M", 1, 9))],
    )
    .await;
    let r = inbox.receive().await.unwrap();
    assert_eq!(
        (r.received, r.appended, r.dead_lettered, r.acked),
        (2, 1, 1, 1),
        "{label}: {r:?}"
    );
    billing.drain(Duration::from_secs(30)).await.unwrap();
    assert_eq!(effects(&billing).await, (4, 4), "{label}");
    let dead = billing
        .store()
        .dead_letters(&Default::default())
        .await
        .unwrap();
    assert_eq!(dead.len(), 2, "{label}");
    assert_eq!(dead[1].reason, "conflict");
    assert_eq!(dead[1].origin.as_ref().unwrap().position, 5);
    assert_eq!(inbox.ack_pending().await.unwrap(), 0, "{label}");
    // Still conflicting: a replay changes nothing.
    let err = inbox
        .replay_dead_letters(&[dead[0].id], "test", "still taken")
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            NatsError::Outbox(OutboxError::Store(StoreError::Conflict { .. }))
        ),
        "{label}: {err:?}"
    );
    js.delete_stream(&stream).await.unwrap();
}

#[tokio::test]
async fn a_conflicting_message_is_dead_lettered_and_the_rest_of_its_batch_flows_sqlite() {
    let (_, store) = common::sqlite("nats_conflict_billing").await;
    a_conflicting_message_is_dead_lettered_and_the_rest_of_its_batch_flows(store, "sqlite").await;
}

#[tokio::test]
async fn a_conflicting_message_is_dead_lettered_and_the_rest_of_its_batch_flows_postgres() {
    let Some((_, _, store)) = common::postgres("nats_conflict_billing").await else {
        return;
    };
    a_conflicting_message_is_dead_lettered_and_the_rest_of_its_batch_flows(store, "postgres").await;
}

/// A message the consuming outbox refuses at commit for another reason than a conflict (here
/// U+0000 in its aggregate id, which PostgreSQL cannot store and every store refuses) is
/// dead-lettered alone; the others of its batch flow, nothing is redelivered.
async fn a_message_refused_at_commit_is_dead_lettered_and_the_rest_flow(store: Store, label: &str) {
    let Some((_client, js, stream, prefix)) = with_stream("refused").await else {
        return;
    };
    let subject = format!("{prefix}.natstest.shipped");
    let json = |e: &Envelope<Shipped>| serde_json::to_string(e).unwrap();
    publish(
        &js,
        &subject,
        vec![
            json(&shipped("R", 1, 1)),
            json(&shipped("bad\u{0}id", 1, 2)),
            // Not JSON, with a raw NUL; and a type that quotes one: their dead letters must
            // be storable (PostgreSQL refuses U+0000 in text).
            "{\"specversion\":\"1.0\"\u{0}}".to_owned(),
            json(&shipped("T", 1, 4)).replace("natstest.shipped", "natstest.shipped\\u0000"),
            json(&shipped("S", 1, 3)),
        ],
    )
    .await;
    let billing = consumer_on(store).await;
    let inbox = NatsInbox::new(&js, billing.clone(), inbox_config(&stream, "billing"))
        .await
        .unwrap();
    let r = inbox.receive().await.unwrap();
    assert_eq!(
        (r.received, r.appended, r.dead_lettered, r.acked),
        (5, 2, 3, 2),
        "{label}: {r:?}"
    );
    billing.drain(Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        effects(&billing).await,
        (2, 2),
        "{label}: the others flowed"
    );
    let dead = billing
        .store()
        .dead_letters(&Default::default())
        .await
        .unwrap();
    assert_eq!(dead.len(), 3, "{label}: {dead:?}");
    assert!(dead.iter().all(|d| d.handler == "nats-inbox:billing"));
    assert!(
        dead.iter()
            .any(|d| d.error_chain.iter().any(|e| e.contains("U+0000"))),
        "{label}: {dead:?}"
    );
    assert_eq!(inbox.ack_pending().await.unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(inbox.receive().await.unwrap().received, 0);
}

#[tokio::test]
async fn a_message_refused_at_commit_is_dead_lettered_and_the_rest_flow_sqlite() {
    let (_, store) = common::sqlite("nats_refused_billing").await;
    a_message_refused_at_commit_is_dead_lettered_and_the_rest_flow(store, "sqlite").await;
}

#[tokio::test]
async fn a_message_refused_at_commit_is_dead_lettered_and_the_rest_flow_postgres() {
    let Some((_, _, store)) = common::postgres("nats_refused_billing").await else {
        return;
    };
    a_message_refused_at_commit_is_dead_lettered_and_the_rest_flow(store, "postgres").await;
}

#[tokio::test]
async fn an_oversize_envelope_is_refused_at_commit_and_limits_the_broker_refuses_fail_the_check() {
    let Some((client, js, stream, prefix)) = with_stream("oversize").await else {
        return;
    };
    // The defaults pass against a default server.
    let relay = NatsRelay::new(client.clone(), relay_config(&stream, &prefix));
    let outbox = producer("nats_oversize", relay.clone(), OutboxConfig::default()).await;
    relay.check(&outbox).await.unwrap();
    let mut uow = outbox.begin().await.unwrap();
    uow.add(Envelope::new(Shipped {
        order: "big".into(),
        cents: 1,
        note: "x".repeat(1 << 20),
    }));
    assert!(matches!(
        uow.commit().await,
        Err(OutboxError::TooLarge { .. })
    ));
    assert_eq!(
        outbox.store().stats().await.unwrap().events,
        0,
        "nothing stored"
    );

    // 1 MiB envelopes plus headers exceed a default server's max_payload.
    let relay = NatsRelay::new(client.clone(), relay_config(&stream, &prefix));
    let config = OutboxConfig::default().max_envelope_bytes(1 << 20);
    let outbox = producer("nats_oversize_payload", relay.clone(), config).await;
    let err = relay.check(&outbox).await.unwrap_err();
    assert!(
        matches!(err, NatsError::EnvelopeTooLarge { what, .. } if what.contains("max_payload")),
        "{err}"
    );

    // A stream with a smaller max_msg_size than the outbox's envelopes.
    let (small, small_prefix) = names();
    StreamSpec::new(&small)
        .subjects([format!("{small_prefix}.>")])
        .max_msg_size(64 * 1024)
        .create(&js)
        .await
        .unwrap();
    let relay = NatsRelay::new(client.clone(), relay_config(&small, &small_prefix));
    let outbox = producer(
        "nats_oversize_stream",
        relay.clone(),
        OutboxConfig::default(),
    )
    .await;
    let err = relay.check(&outbox).await.unwrap_err();
    assert!(
        matches!(err, NatsError::EnvelopeTooLarge { what, limit: 65536, .. } if what.contains("max_msg_size")),
        "{err}"
    );
    js.delete_stream(&stream).await.unwrap();
    js.delete_stream(&small).await.unwrap();
}

#[tokio::test]
async fn a_stream_with_a_duplicate_window_shorter_than_the_retry_horizon_is_refused() {
    let Some(client) = nats("short_window").await else {
        return;
    };
    let js = jetstream::new(client.clone());
    let (stream, prefix) = names();
    StreamSpec::new(&stream)
        .subjects([format!("{prefix}.>")])
        .duplicate_window(Duration::from_secs(5))
        .create(&js)
        .await
        .unwrap();
    let relay = NatsRelay::new(client.clone(), relay_config(&stream, &prefix));
    let outbox = producer("nats_short_window", relay.clone(), OutboxConfig::default()).await;
    let err = relay.check(&outbox).await.unwrap_err();
    assert!(
        matches!(err, NatsError::DuplicateWindowTooShort { .. }),
        "{err}"
    );
    // Unchecked, the relay delivers nothing: its deliveries wait, paused.
    commit(&outbox, vec![shipped("W", 1, 1)]).await;
    let _ = outbox.deliver_batch().await.unwrap();
    assert_eq!(messages_in(&js, &stream).await, 0);
    assert_eq!(outbox.store().stats().await.unwrap().dead_letters, 0);
    // A subject the stream does not capture is refused as well.
    let relay = NatsRelay::new(client.clone(), relay_config(&stream, "elsewhere"));
    let outbox = producer("nats_not_captured", relay.clone(), OutboxConfig::default()).await;
    assert!(matches!(
        relay.check(&outbox).await,
        Err(NatsError::SubjectNotCaptured { .. })
    ));
    js.delete_stream(&stream).await.unwrap();
}

#[tokio::test]
async fn the_broker_down_while_the_producer_commits_loses_nothing_and_dead_letters_nothing() {
    if nats("broker_down").await.is_none() {
        return;
    }
    let Some(mut server) = OwnServer::start() else {
        return;
    };
    let mut client = None;
    for _ in 0..100 {
        if let Ok(c) = async_nats::connect(server.url()).await {
            client = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let client = client.expect("own nats-server up");
    let js = jetstream::new(client.clone());
    let (stream, prefix) = names();
    StreamSpec::new(&stream)
        .subjects([format!("{prefix}.>")])
        .create(&js)
        .await
        .unwrap();
    // Installed before any worker sets a gauge.
    assert_eq!(lag_of(""), None);
    let relay = NatsRelay::new(client.clone(), relay_config(&stream, &prefix));
    let outbox = producer(
        "nats_broker_down",
        relay.clone(),
        OutboxConfig::default().metrics_interval(Duration::from_millis(100)),
    )
    .await;
    relay.check(&outbox).await.unwrap();
    let lag = || lag_of(relay.name());

    server.down();
    // Commits need only the database.
    commit(
        &outbox,
        (1..=10)
            .map(|i| shipped(&format!("D{}", i % 3), i, 1))
            .collect(),
    )
    .await;
    let workers = outbox.spawn_workers(1);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stats = outbox.store().stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.dead_letters),
        (10, 0),
        "waiting, paused"
    );
    // The lag: the oldest unpublished event's age, growing while the broker is away.
    let during = lag();
    assert!(
        during > Some(2.0),
        "lag while the broker is down: {during:?}"
    );

    assert!(server.up());
    let mut held = 0;
    for _ in 0..300 {
        if let Ok(mut s) = js.get_stream(&stream).await {
            if let Ok(info) = s.info().await {
                held = info.state.messages;
                if held == 10 {
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(held, 10, "every event published once the broker is back");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while outbox.store().stats().await.unwrap().pending > 0 && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats = outbox.store().stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead_letters), (0, 0));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while lag() != Some(0.0) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(lag(), Some(0.0), "no lag once everything is published");
    workers.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// The gauge `events_destination_oldest_pending_age_seconds` of destination `name`, as the
/// process-wide recorder (installed on first use) last saw it set.
fn lag_of(name: &str) -> Option<f64> {
    static GAUGES: std::sync::OnceLock<common::Gauges> = std::sync::OnceLock::new();
    GAUGES
        .get_or_init(|| {
            let gauges = common::Gauges::new();
            metrics::set_global_recorder(gauges.clone())
                .expect("no other global recorder in this test binary");
            gauges
        })
        .get("events_destination_oldest_pending_age_seconds", name)
}

const PYTHON_READER: &str = r#"
import asyncio, json, sys
import nats
try:
    from cloudevents.v1.http import from_json  # cloudevents 2.x
except ImportError:
    from cloudevents.http import from_json  # 1.x

async def main(url, stream):
    nc = await nats.connect(url)
    js = nc.jetstream()
    info = await js.stream_info(stream)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        m = await js.get_msg(stream, seq)
        event = from_json(m.data)
        out.append({
            "msg_id": m.headers.get("Nats-Msg-Id"),
            "content_type": m.headers.get("Content-Type"),
            "id": event["id"],
            "type": event["type"],
            "source": event["source"],
            "subject": event["subject"],
            "schemaversion": event["schemaversion"],
            "data": event.data,
        })
    await nc.close()
    print(json.dumps(out))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"#;

#[tokio::test]
async fn the_official_python_client_and_cloudevents_sdk_read_every_published_event_once() {
    let Some((client, js, stream, prefix)) = with_stream("python_reader").await else {
        return;
    };
    let relay = NatsRelay::new(client.clone(), relay_config(&stream, &prefix));
    let outbox = producer("nats_python", relay.clone(), OutboxConfig::default()).await;
    relay.check(&outbox).await.unwrap();
    let events = commit(
        &outbox,
        vec![shipped("Y", 1, 1), shipped("Y", 2, 2), shipped("Z", 1, 3)],
    )
    .await;
    outbox.drain(Duration::from_secs(30)).await.unwrap();

    let url = std::env::var("EVENTS_TEST_NATS_URL").unwrap();
    let out = std::process::Command::new("python3")
        .args(["-c", PYTHON_READER, &url, &stream])
        .output();
    let out = match out {
        Ok(o) if o.status.success() => o,
        Ok(o) => panic!(
            "the Python reader failed: {}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) if require() => panic!("python3: {e}"),
        Err(e) => {
            common::say_once("python3", &format!("Python reader skipped: {e}"));
            return;
        }
    };
    let read: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(read.len(), events.len(), "each once");
    for e in &events {
        let id = e.id().to_string();
        let m = read
            .iter()
            .find(|m| m["id"] == id.as_str())
            .expect("published");
        assert_eq!(m["msg_id"], id.as_str());
        assert_eq!(m["content_type"], "application/cloudevents+json");
        assert_eq!(m["type"], "natstest.shipped");
        assert_eq!(m["source"], "urn:test:orders");
        assert_eq!(m["subject"], e.event().order.as_str());
        assert_eq!(m["schemaversion"], 1);
        assert_eq!(m["data"]["cents"], e.event().cents);
        assert_eq!(m["data"]["note"], e.event().note.as_str());
    }
    js.delete_stream(&stream).await.unwrap();
}

#[tokio::test]
async fn events_nats_stream_create_then_check_and_a_check_that_asks_for_more_fails() {
    let Some(client) = nats("cli_stream").await else {
        return;
    };
    let url = std::env::var("EVENTS_TEST_NATS_URL").unwrap();
    let (stream, prefix) = names();
    let subject = format!("{prefix}.>");
    let cli = |args: &[&str]| {
        let mut argv = vec!["events", "nats", "stream"];
        argv.extend_from_slice(args);
        argv.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let run = common::events_tool;
    let base = ["--nats", &url, "--subject", &subject];
    let mut create = cli(&["create", &stream]);
    create.extend(base.iter().map(|s| s.to_string()));
    let (ok, out, err) = run(create).await;
    assert!(ok, "{err}");
    assert!(out.contains(&format!("stream {stream}: ok")), "{out}");
    assert!(out.contains("duplicate window  120 s"), "{out}");
    let mut check = cli(&["check", &stream]);
    check.extend(base.iter().map(|s| s.to_string()));
    assert!(run(check.clone()).await.0);
    check.extend(["--duplicate-window".to_owned(), "600".to_owned()]);
    let (ok, _, err) = run(check).await;
    assert!(!ok);
    assert!(err.contains("duplicate_window is 120s"), "{err}");
    // One server: one replica, no leader to name; asking for 3 fails the check.
    let mut check = cli(&["check", &stream]);
    check.extend(base.iter().map(|s| s.to_string()));
    let (ok, out, err) = run(check.clone()).await;
    assert!(ok, "{err}");
    assert!(out.contains("replicas          1"), "{out}");
    check.extend(["--replicas".to_owned(), "3".to_owned()]);
    let (ok, _, err) = run(check).await;
    assert!(!ok);
    assert!(err.contains("replicas is 1, expected 3 or more"), "{err}");
    // Creating one of 3 replicas on a server outside a cluster, or of 0: refused, saying why.
    let js = jetstream::new(client.clone());
    for (replicas, says) in [(3, "not part of a cluster"), (0, "replicas must be 1 to 5")] {
        let (other, prefix) = names();
        let e = StreamSpec::new(&other)
            .subjects([format!("{prefix}.>")])
            .replicas(replicas)
            .create(&js)
            .await
            .unwrap_err();
        let text = event_core::ErrorChain(&e).to_string();
        assert!(text.contains(says), "{replicas}: {text}");
    }
    jetstream::new(client).delete_stream(&stream).await.unwrap();
}

#[event_handler(name = "natstest.bill_at_commit", in_transaction)]
async fn bill_at_commit(envelope: &Envelope<Shipped>, tx: &mut Tx) -> Result<(), HandlerError> {
    bill(envelope, tx).await
}

/// An in-transaction handler runs when a received event is committed, before a predecessor
/// it waits for: the inbox refuses to start with one unless the configuration allows it.
#[tokio::test]
async fn the_inbox_refuses_in_transaction_handlers_unless_allowed() {
    let Some((_client, js, stream, _prefix)) = with_stream("inbox_in_transaction").await else {
        return;
    };
    let (_, store) = common::sqlite("nats_inbox_in_transaction").await;
    let outbox = Outbox::builder(store)
        .dispatcher(
            Dispatcher::builder_empty()
                .event::<Shipped>()
                .handler::<bill_at_commit>(),
        )
        .build()
        .unwrap();
    let e = NatsInbox::new(&js, outbox.clone(), inbox_config(&stream, "billing"))
        .await
        .unwrap_err();
    let message = event_core::ErrorChain(&e).to_string();
    assert!(
        message.contains("natstest.bill_at_commit")
            && message.contains("allow_in_transaction_handlers"),
        "{message}"
    );
    NatsInbox::new(
        &js,
        outbox,
        inbox_config(&stream, "billing").allow_in_transaction_handlers(true),
    )
    .await
    .unwrap();
}

/// A `gap_after` within the consumer's redelivery delay (plus a cluster's failover) would
/// report a message merely awaiting redelivery or a new leader as a gap: the inbox refuses to
/// start.
#[tokio::test]
async fn the_inbox_refuses_a_gap_after_within_the_redelivery_delay() {
    let Some((_client, js, stream, _prefix)) = with_stream("inbox_gap_after").await else {
        return;
    };
    let (_, store) = common::sqlite("nats_inbox_gap_after").await;
    let outbox = Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().event::<Shipped>())
        .config(OutboxConfig::default().gap_after(Duration::from_millis(1_200)))
        .build()
        .unwrap();
    // ack wait 1 s + fetch wait 0.5 s = 1.5 s ≥ 1.2 s.
    let e = NatsInbox::new(&js, outbox, inbox_config(&stream, "billing"))
        .await
        .unwrap_err();
    let message = event_core::ErrorChain(&e).to_string();
    assert!(message.contains("gap_after"), "{message}");

    // Above the redelivery delay but within a cluster's failover: refused too, naming it.
    for (gap_after, refused) in [
        (Duration::from_secs(40), true),
        (
            Duration::from_millis(1_500) + FAILOVER_ALLOWANCE + Duration::from_secs(1),
            false,
        ),
    ] {
        let (_, store) = common::sqlite("nats_inbox_gap_after").await;
        let outbox = Outbox::builder(store)
            .dispatcher(Dispatcher::builder_empty().event::<Shipped>())
            .config(OutboxConfig::default().gap_after(gap_after))
            .build()
            .unwrap();
        match NatsInbox::new(&js, outbox, inbox_config(&stream, "billing")).await {
            Err(e) => {
                let message = event_core::ErrorChain(&e).to_string();
                assert!(refused, "{gap_after:?}: {message}");
                assert!(message.contains("FAILOVER_ALLOWANCE"), "{message}");
            }
            Ok(_) => assert!(!refused, "{gap_after:?} accepted"),
        }
    }
}

/// `connect` takes a cluster's servers comma-separated, and reaches the one that answers when
/// another on the list does not.
#[tokio::test]
async fn connect_takes_servers_comma_separated_and_skips_one_that_does_not_answer() {
    if nats("connect_list").await.is_none() {
        return;
    }
    let url = std::env::var("EVENTS_TEST_NATS_URL").unwrap();
    // Port 1 on loopback: nothing listens there.
    let list = format!("nats://127.0.0.1:1, {url}");
    let client = event_runtime::transport::nats::connect(&list, "list")
        .await
        .unwrap_or_else(|e| panic!("{list}: {}", event_core::ErrorChain(&e)));
    assert!(client.server_info().port > 1);
    let e =
        event_runtime::transport::nats::connect("nats://127.0.0.1:1,nats://127.0.0.1:2", "none")
            .await
            .unwrap_err();
    assert!(matches!(e, NatsError::Connect { .. }), "{e}");

    // A host name that does not resolve is left out, whatever order the list is tried in.
    for _ in 0..5 {
        let list = format!("nats://no-such-host.invalid:4222,{url}");
        event_runtime::transport::nats::connect(&list, "list")
            .await
            .unwrap_or_else(|e| panic!("{list}: {}", event_core::ErrorChain(&e)));
    }
    // No server, none that resolves, or an entry that is no NATS URL: said, naming it.
    for (list, says) in [
        (",", "no server given"),
        (" ", "no server given"),
        (
            "nats://no-such-host.invalid:4222",
            "no server's host name resolves",
        ),
        (
            "http://127.0.0.1:4222",
            "`http://127.0.0.1:4222` is not a NATS server URL",
        ),
    ] {
        let e = event_runtime::transport::nats::connect(list, "list")
            .await
            .unwrap_err();
        let text = event_core::ErrorChain(&e).to_string();
        assert!(text.contains(says), "{list}: {text}");
    }
}

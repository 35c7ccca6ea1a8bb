//! The sequence-aware inbox: a relay names each event's predecessor (`prevsequence`) and the
//! consumer releases an aggregate's events to its handlers in that chain's order, whatever
//! order the broker delivers them in; a predecessor that never comes is a gap, reported and
//! never skipped until an operator accepts it. Through `Outbox::receive` (a made-up transport
//! `queue`) and a made-up relay, on SQLite and on the real PostgreSQL server
//! (`EVENTS_TEST_POSTGRES_URL`).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use event_core::{event_handler, DomainEvent, Envelope, EventDescriptor, HandlerError};
use event_runtime::inbox::{Incoming, Origin, Verdict};
use event_runtime::testing::{FaultAction, FaultPoint};
use event_runtime::{
    DeadLetterReason, Delivery, DeliveryError, Destination, Dispatcher, Outbox, OutboxConfig,
    RepublishSelection, Resolution, Routing, SqlValue, Store, StoreError, Tx,
};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "ordertest.line_added", version = 1)]
struct LineAdded {
    #[event(aggregate_id)]
    order: String,
}

/// Records (order, sequence, a per-database counter) in the handler's transaction.
#[event_handler(name = "ordertest.record")]
async fn record(envelope: &Envelope<LineAdded>, tx: &mut Tx) -> Result<(), HandlerError> {
    tx.execute(
        "INSERT INTO order_seen (order_id, sequence, n) VALUES ($1, $2, (SELECT COUNT(*) + 1 FROM order_seen))",
        &[
            SqlValue::Text(&envelope.event().order),
            SqlValue::Int(envelope.sequence() as i64),
        ],
    )
    .await?;
    Ok(())
}

/// The same event at version 2, which the consumer learns in a later deploy.
#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "ordertest.line_added", version = 2)]
struct LineAddedV2 {
    #[event(aggregate_id)]
    order: String,
}

const INBOX: &str = "queue:orders";

fn consumer(store: &Store, gap_after: Duration) -> Outbox {
    Outbox::builder(store.clone())
        .dispatcher(Dispatcher::builder_empty().handler::<record>())
        .config(OutboxConfig::default().gap_after(gap_after))
        .build()
        .unwrap()
}

/// Event `seq` of `order` as a relay publishes it: naming `prev` (`None`: an older
/// producer, no attribute), of type `name`.
fn wire(order: &str, seq: u64, prev: Option<u64>, name: &str, version: u32) -> Incoming {
    // The same event on every redelivery: its id follows from (order, sequence).
    let id = uuid::Uuid::from_u128(order.bytes().fold(u128::from(seq) << 64, |h, b| {
        h.wrapping_mul(31).wrapping_add(u128::from(b))
    }));
    let envelope = Envelope::new(LineAdded {
        order: order.into(),
    })
    .with_id(id)
    .with_sequence(seq)
    .with_source("urn:test:shop");
    let mut json = serde_json::to_value(&envelope).unwrap();
    json["type"] = name.into();
    json["schemaversion"] = version.into();
    if let Some(p) = prev {
        json["prevsequence"] = p.to_string().into();
    }
    Incoming::new(
        serde_json::to_vec(&json).unwrap(),
        Origin::new("queue", "orders", seq),
    )
}

fn line(order: &str, seq: u64, prev: u64) -> Incoming {
    wire(order, seq, Some(prev), "ordertest.line_added", 1)
}

async fn setup(store: &Store) {
    let mut tx = store.begin().await.unwrap();
    tx.execute(
        "CREATE TABLE order_seen (order_id TEXT NOT NULL, sequence BIGINT NOT NULL, n BIGINT NOT NULL)",
        &[],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

/// The sequences handled for `order`, in the order they were handled.
async fn seen(store: &Store, order: &str) -> Vec<i64> {
    let rows = store
        .query("SELECT sequence FROM order_seen WHERE order_id = $1 ORDER BY n")
        .bind(order)
        .fetch_all()
        .await
        .unwrap();
    rows.iter().map(|r| r.get_at::<i64>(0).unwrap()).collect()
}

async fn drain(outbox: &Outbox) {
    outbox.drain(Duration::from_secs(20)).await.unwrap();
}

#[tokio::test]
async fn events_the_broker_redelivers_out_of_order_are_handled_in_the_producers_order() {
    for db in common::databases("inbox_order_reorder").await {
        let label = db.label();
        let store = db.open().await;
        setup(&store).await;
        let outbox = consumer(&store, Duration::from_secs(300));

        // The consumer crashed after fetching 1 and 2: the broker hands over 3..5 first.
        let r = outbox
            .receive(
                INBOX,
                vec![line("A", 3, 2), line("A", 4, 3), line("A", 5, 4)],
            )
            .await;
        assert!(
            r.verdicts.iter().all(|v| *v == Verdict::Accepted),
            "{label}: {r:?}"
        );
        drain(&outbox).await;
        assert!(
            seen(&store, "A").await.is_empty(),
            "{label}: nothing before 1 and 2"
        );
        // An older producer's event (no attribute) is never held, nor holds another.
        let _ = outbox
            .receive(INBOX, vec![wire("B", 7, None, "ordertest.line_added", 1)])
            .await;
        drain(&outbox).await;
        assert_eq!(seen(&store, "B").await, [7], "{label}");

        // Redelivered: 2 first, then 1.
        let _ = outbox.receive(INBOX, vec![line("A", 2, 1)]).await;
        drain(&outbox).await;
        assert!(seen(&store, "A").await.is_empty(), "{label}: 2 waits for 1");
        let _ = outbox.receive(INBOX, vec![line("A", 1, 0)]).await;
        drain(&outbox).await;
        assert_eq!(seen(&store, "A").await, [1, 2, 3, 4, 5], "{label}");
        // A redelivery after all is a duplicate and changes nothing.
        let r = outbox.receive(INBOX, vec![line("A", 3, 2)]).await;
        assert_eq!(r.verdicts, [Verdict::Duplicate], "{label}");
        assert!(outbox.gaps(true).await.unwrap().is_empty(), "{label}");
        store.close().await;
    }
}

#[tokio::test]
async fn a_dead_letter_holds_what_follows_and_an_unknown_name_fills_its_place() {
    for db in common::databases("inbox_order_dead").await {
        let label = db.label();
        let store = db.open().await;
        setup(&store).await;
        let outbox = consumer(&store, Duration::ZERO);

        // 2 is an event this consumer does not take at all: it fills its place.
        let r = outbox
            .receive(
                INBOX,
                vec![
                    line("A", 1, 0),
                    wire("A", 2, Some(1), "ordertest.note_added", 1),
                    line("A", 3, 2),
                ],
            )
            .await;
        assert_eq!(
            r.verdicts[1],
            Verdict::DeadLettered(DeadLetterReason::UnknownEvent),
            "{label}"
        );
        drain(&outbox).await;
        assert_eq!(seen(&store, "A").await, [1, 3], "{label}");

        // 5 is one it should have taken (a version it does not know yet): 6 waits.
        let r = outbox
            .receive(
                INBOX,
                vec![
                    line("A", 4, 3),
                    wire("A", 5, Some(4), "ordertest.line_added", 9),
                    line("A", 6, 5),
                ],
            )
            .await;
        assert_eq!(
            r.verdicts[1],
            Verdict::DeadLettered(DeadLetterReason::UnknownEvent),
            "{label}"
        );
        drain(&outbox).await;
        assert_eq!(seen(&store, "A").await, [1, 3, 4], "{label}: 6 is held");
        // Reported as a gap that names the dead letter.
        let gaps = outbox.detect_gaps().await.unwrap();
        assert_eq!(gaps.len(), 1, "{label}: {gaps:?}");
        assert_eq!(gaps[0].missing_sequence, 5, "{label}");
        assert_eq!(gaps[0].waiting_sequence, 6, "{label}");
        let dead = gaps[0].dead_letter_id.expect("the dead letter is named");
        assert!(
            outbox.detect_gaps().await.unwrap().is_empty(),
            "{label}: reported once"
        );
        // Purging the dead letter accepts the gap: 6 flows.
        store
            .resolve_dead_letters(&[dead], Resolution::Purge, "test", "drop 5")
            .await
            .unwrap();
        drain(&outbox).await;
        assert_eq!(seen(&store, "A").await, [1, 3, 4, 6], "{label}");
        let closed = outbox.gaps(true).await.unwrap();
        assert_eq!(closed[0].resolution.as_deref(), Some("accepted"), "{label}");
        assert!(outbox.gaps(false).await.unwrap().is_empty(), "{label}");
        store.close().await;
    }
}

#[tokio::test]
async fn a_gap_is_reported_never_skipped_until_an_operator_accepts_it() {
    for db in common::databases("inbox_order_gap").await {
        let label = db.label();
        let store = db.open().await;
        setup(&store).await;
        let outbox = consumer(&store, Duration::ZERO);

        // The broker lost 1..4: only 5 arrives.
        let _ = outbox.receive(INBOX, vec![line("A", 5, 4)]).await;
        drain(&outbox).await;
        let gaps = outbox.detect_gaps().await.unwrap();
        assert_eq!(gaps.len(), 1, "{label}");
        assert_eq!(
            (gaps[0].missing_sequence, gaps[0].dead_letter_id),
            (4, None),
            "{label}"
        );
        drain(&outbox).await;
        assert!(seen(&store, "A").await.is_empty(), "{label}: never skipped");
        assert_eq!(outbox.gaps(false).await.unwrap().len(), 1, "{label}");

        let done = outbox
            .accept_gaps(None, "ops", "the broker lost them")
            .await
            .unwrap();
        assert_eq!(done.accepted.len(), 1, "{label}");
        let audit = done.audit.expect("an audit row");
        assert_eq!(audit.action, "gap-accept", "{label}");
        assert_eq!(audit.count, 1, "{label}");
        assert!(audit.finished_at.is_some(), "{label}");
        // Nothing open: nothing written.
        let again = outbox.accept_gaps(None, "ops", "again").await.unwrap();
        assert!(
            again.audit.is_none() && again.accepted.is_empty(),
            "{label}"
        );
        drain(&outbox).await;
        assert_eq!(seen(&store, "A").await, [5], "{label}");
        assert!(outbox.gaps(false).await.unwrap().is_empty(), "{label}");
        let all = outbox.gaps(true).await.unwrap();
        assert_eq!(all[0].resolution.as_deref(), Some("accepted"), "{label}");

        // 4 arrives after all, and 1 (an earlier place, never received): both late,
        // dead-lettered, not handled.
        let r = outbox
            .receive(INBOX, vec![line("A", 4, 3), line("A", 1, 0)])
            .await;
        assert_eq!(
            r.verdicts,
            [
                Verdict::DeadLettered(DeadLetterReason::Late),
                Verdict::DeadLettered(DeadLetterReason::Late)
            ],
            "{label}"
        );
        drain(&outbox).await;
        assert_eq!(seen(&store, "A").await, [5], "{label}");

        // A gap whose event arrives closes itself.
        let _ = outbox.receive(INBOX, vec![line("C", 2, 1)]).await;
        outbox.detect_gaps().await.unwrap();
        let _ = outbox.receive(INBOX, vec![line("C", 1, 0)]).await;
        drain(&outbox).await;
        assert_eq!(seen(&store, "C").await, [1, 2], "{label}");
        let closed: Vec<_> = outbox
            .gaps(true)
            .await
            .unwrap()
            .into_iter()
            .filter(|g| g.aggregate_id == "C")
            .collect();
        assert_eq!(closed[0].resolution.as_deref(), Some("arrived"), "{label}");
        store.close().await;
    }
}

#[tokio::test]
async fn two_instances_committing_adjacent_events_at_once_never_leave_one_held() {
    for db in common::databases("inbox_order_race").await {
        let label = db.label();
        let store = db.open().await;
        setup(&store).await;
        let a = consumer(&store, Duration::from_secs(300));
        let b = consumer(&db.open().await, Duration::from_secs(300));
        for i in 0..40 {
            let order = format!("R-{i}");
            let (ra, rb) = tokio::join!(
                a.receive(INBOX, vec![line(&order, 1, 0)]),
                b.receive(INBOX, vec![line(&order, 2, 1)])
            );
            assert!(
                ra.error.is_none() && rb.error.is_none(),
                "{label}: {ra:?} {rb:?}"
            );
        }
        drain(&a).await;
        for i in 0..40 {
            assert_eq!(
                seen(&store, &format!("R-{i}")).await,
                [1, 2],
                "{label}: R-{i}"
            );
        }
        store.close().await;
    }
}

/// Armed: the next commit of the gated outbox pauses at `BeforeCommit` (its transaction
/// open, its links written) for 500 ms.
static GATE_ARMED: AtomicBool = AtomicBool::new(false);
static GATE_REACHED: AtomicBool = AtomicBool::new(false);

#[tokio::test]
async fn a_predecessor_committed_while_its_successor_commits_releases_it() {
    for db in common::databases("inbox_order_forced").await {
        let label = db.label();
        let store = db.open().await;
        setup(&store).await;
        let gated = Outbox::builder(store.clone())
            .dispatcher(Dispatcher::builder_empty().handler::<record>())
            .fault_injection(|point| {
                if point == FaultPoint::BeforeCommit && GATE_ARMED.swap(false, Ordering::SeqCst) {
                    GATE_REACHED.store(true, Ordering::SeqCst);
                    return FaultAction::Pause(Duration::from_millis(500));
                }
                FaultAction::Continue
            })
            .build()
            .unwrap();
        let other = consumer(&db.open().await, Duration::from_secs(300));
        GATE_REACHED.store(false, Ordering::SeqCst);
        GATE_ARMED.store(true, Ordering::SeqCst);
        // Instance A has linked 2 (held: 1 is not there) and not committed yet ...
        let a = tokio::spawn({
            let gated = gated.clone();
            async move { gated.receive(INBOX, vec![line("F", 2, 1)]).await }
        });
        while !GATE_REACHED.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // ... when instance B commits 1. Without a lock per aggregate, B could not see 2 and
        // A could not see 1: 2 would stay held for ever.
        let rb = other.receive(INBOX, vec![line("F", 1, 0)]).await;
        let ra = a.await.unwrap();
        assert!(
            ra.error.is_none() && rb.error.is_none(),
            "{label}: {ra:?} {rb:?}"
        );
        drain(&gated).await;
        assert_eq!(seen(&store, "F").await, [1, 2], "{label}");
        assert_eq!(gated.held_events().await.unwrap(), 0, "{label}");
        store.close().await;
    }
}

/// A relay that records the predecessor each publish carried on the wire, failing the first
/// attempt of sequence 2.
#[derive(Default)]
struct Wire {
    sent: Mutex<Vec<(u64, Option<String>)>>,
    failed_once: Mutex<bool>,
}

#[async_trait]
impl Destination for Wire {
    fn name(&self) -> &str {
        "wire:orders"
    }

    fn route(&self, event: &EventDescriptor) -> Option<Routing> {
        (event.name == "ordertest.line_added").then_some(Routing { ordered: true })
    }

    async fn deliver(&self, d: &Delivery<'_>) -> Result<(), DeliveryError> {
        let body: serde_json::Value = serde_json::from_str(&d.wire_envelope()).unwrap();
        let prev = body["prevsequence"].as_str().map(str::to_owned);
        self.sent.lock().unwrap().push((d.sequence, prev));
        let mut failed = self.failed_once.lock().unwrap();
        if d.sequence == 2 && !*failed {
            *failed = true;
            return Err(HandlerError::transient_msg("broker hiccup").into());
        }
        Ok(())
    }
}

#[tokio::test]
async fn the_relay_names_the_previous_event_it_published_from_the_store() {
    for db in common::databases("inbox_order_relay").await {
        let label = db.label();
        let store = db.open().await;
        let relay = Arc::new(Wire::default());
        let producer = |store: &Store| {
            Outbox::builder(store.clone())
                .dispatcher(Dispatcher::builder_empty().event::<LineAdded>())
                .destination(relay.clone())
                .config(
                    OutboxConfig::default().retry(
                        event_runtime::RetryPolicy::default()
                            .initial_backoff(Duration::from_millis(1))
                            .max_backoff(Duration::from_millis(1)),
                    ),
                )
                .build()
                .unwrap()
        };
        let outbox = producer(&store);
        let commit = |outbox: &Outbox, seqs: std::ops::RangeInclusive<u64>| {
            let outbox = outbox.clone();
            async move {
                let mut uow = outbox.begin().await.unwrap();
                for s in seqs {
                    uow.add(Envelope::new(LineAdded { order: "A".into() }).with_sequence(s));
                }
                uow.commit().await.unwrap();
            }
        };
        commit(&outbox, 1..=3).await;
        for _ in 0..20 {
            outbox.drain(Duration::from_secs(5)).await.unwrap();
            if relay.sent.lock().unwrap().len() >= 4 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let p = |s: &str| Some(s.to_owned());
        assert_eq!(
            *relay.sent.lock().unwrap(),
            [(1, p("0")), (2, p("1")), (2, p("1")), (3, p("2"))],
            "{label}: a re-published attempt carries the same value"
        );
        // A new process (nothing in memory) continues the chain from the store.
        let outbox = producer(&db.open().await);
        commit(&outbox, 4..=4).await;
        outbox.drain(Duration::from_secs(5)).await.unwrap();
        assert_eq!(
            relay.sent.lock().unwrap().last(),
            Some(&(4, p("3"))),
            "{label}"
        );
        // The stored envelope is unchanged.
        let mut tx = store.begin().await.unwrap();
        let n = tx
            .fetch_i64(
                "SELECT COUNT(*) FROM event_outbox WHERE envelope LIKE '%prevsequence%'",
                &[],
            )
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        assert_eq!(n, Some(0), "{label}");
        store.close().await;
    }
}

#[tokio::test]
async fn a_republish_sends_the_same_events_again_each_naming_what_was_published_before_it() {
    for db in common::databases("inbox_order_republish").await {
        let label = db.label();
        let store = db.open().await;
        let relay = Arc::new(Wire::default());
        *relay.failed_once.lock().unwrap() = true;
        let outbox = Outbox::builder(store.clone())
            .dispatcher(Dispatcher::builder_empty().event::<LineAdded>())
            .destination(relay.clone())
            .build()
            .unwrap();
        let commit = |order: &'static str, seqs: std::ops::RangeInclusive<u64>| {
            let outbox = outbox.clone();
            async move {
                let mut uow = outbox.begin().await.unwrap();
                for s in seqs {
                    uow.add(
                        Envelope::new(LineAdded {
                            order: order.into(),
                        })
                        .with_sequence(s),
                    );
                }
                uow.commit().await.unwrap();
                outbox.drain(Duration::from_secs(5)).await.unwrap();
            }
        };
        // What the relay published since the last look.
        let sent =
            || -> Vec<(u64, Option<String>)> { std::mem::take(&mut *relay.sent.lock().unwrap()) };
        let p = |s: &str| Some(s.to_owned());
        commit("A", 1..=4).await;
        commit("B", 1..=2).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        let later = chrono::Utc::now().timestamp_millis();
        commit("B", 3..=4).await;
        sent();
        let aggregate_type: String = store
            .query("SELECT aggregate_type FROM event_outbox LIMIT 1")
            .fetch_one()
            .await
            .unwrap()
            .get_at(0)
            .unwrap();
        let ids_before: Vec<String> = store
            .query("SELECT event_id FROM event_outbox ORDER BY aggregate_id, sequence")
            .fetch_all()
            .await
            .unwrap()
            .iter()
            .map(|r| r.get_at::<String>(0).unwrap())
            .collect();

        // A whole aggregate, after the relay published all of it: in order, from 0.
        let selection = RepublishSelection::new("wire:orders").aggregate(&aggregate_type, "A");
        let done = store
            .republish(&selection, "test", "broker wiped")
            .await
            .unwrap();
        assert_eq!(
            (done.republished, done.audit.count, done.pending, done.dead),
            (4, 4, 0, 0),
            "{label}"
        );
        assert_eq!(done.audit.action, "relay-republish", "{label}");
        assert!(done.audit.finished_at.is_some(), "{label}");
        outbox.drain(Duration::from_secs(5)).await.unwrap();
        assert_eq!(
            sent(),
            [(1, p("0")), (2, p("1")), (3, p("2")), (4, p("3"))],
            "{label}"
        );
        // The chain goes on after them.
        commit("A", 5..=5).await;
        assert_eq!(sent(), [(5, p("4"))], "{label}");

        // The middle of an aggregate (recorded since a time): each names what the relay
        // published before it, not 0.
        let selection = RepublishSelection::new("wire:orders").since_ms(later);
        let done = store
            .republish(&selection, "test", "lost a part")
            .await
            .unwrap();
        assert_eq!(done.republished, 3, "{label}: B3, B4 and A5");
        outbox.drain(Duration::from_secs(5)).await.unwrap();
        let mut again = sent();
        again.sort();
        assert_eq!(again, [(3, p("2")), (4, p("3")), (5, p("4"))], "{label}");
        // The same event ids: nothing new in the outbox.
        let ids_after: Vec<String> = store
            .query("SELECT event_id FROM event_outbox WHERE sequence < 5 ORDER BY aggregate_id, sequence")
            .fetch_all()
            .await
            .unwrap()
            .iter()
            .map(|r| r.get_at::<String>(0).unwrap())
            .collect();
        assert_eq!(ids_after, ids_before, "{label}");

        // A selection naming nothing is refused; one that matches nothing does nothing.
        let e = store
            .republish(&RepublishSelection::new("wire:orders"), "test", "all?")
            .await
            .unwrap_err();
        assert!(matches!(e, StoreError::InvalidSelection(_)), "{label}: {e}");
        let none = RepublishSelection::new("wire:orders").aggregate(&aggregate_type, "Z");
        let done = store.republish(&none, "test", "nothing").await.unwrap();
        assert_eq!(done.republished, 0, "{label}");
        store.close().await;
    }
}

#[tokio::test]
async fn an_aggregate_idle_longer_than_the_retention_starts_a_new_chain() {
    for db in common::databases("inbox_order_idle").await {
        let label = db.label();
        let store = db.open().await;
        let relay = Arc::new(Wire::default());
        let clock = Arc::new(event_runtime::testing::ManualClock::new());
        let producer = Outbox::builder(store.clone())
            .dispatcher(Dispatcher::builder_empty().event::<LineAdded>())
            .destination(relay.clone())
            .clock(clock.clone())
            .build()
            .unwrap();
        for (s, wait) in [
            (1, Duration::ZERO),
            (3, Duration::from_secs(10 * 24 * 3600)),
        ] {
            clock.advance(wait);
            let mut uow = producer.begin().await.unwrap();
            uow.add(Envelope::new(LineAdded { order: "I".into() }).with_sequence(s));
            uow.commit().await.unwrap();
            producer.drain(Duration::from_secs(5)).await.unwrap();
        }
        // Ten days later (retention: 7), the relay's chain row has expired: 3 names none, so
        // a consumer releases it without waiting for a predecessor it may no longer know.
        let p = |s: &str| Some(s.to_owned());
        assert_eq!(
            *relay.sent.lock().unwrap(),
            [(1, p("0")), (3, p("0"))],
            "{label}"
        );
        let consumer_store = db.open().await;
        setup(&consumer_store).await;
        let consumer = consumer(&consumer_store, Duration::ZERO);
        let _ = consumer.receive(INBOX, vec![line("I", 3, 0)]).await;
        drain(&consumer).await;
        assert!(consumer.detect_gaps().await.unwrap().is_empty(), "{label}");
        assert_eq!(seen(&consumer_store, "I").await, [3], "{label}");
        store.close().await;
    }
}

#[test]
fn the_wire_envelope_adds_or_replaces_prevsequence() {
    let id = uuid::Uuid::now_v7();
    let stored = r#"{"specversion":"1.0","id":"x"}"#;
    let d = Delivery::new(id, "a.b", stored);
    assert_eq!(d.wire_envelope(), stored);
    let d = d.previous_sequence(41);
    assert_eq!(
        d.wire_envelope(),
        r#"{"prevsequence":"41","specversion":"1.0","id":"x"}"#
    );
    let forwarded = r#"{"id":"x","prevsequence":"7"}"#;
    let d = Delivery::new(id, "a.b", forwarded).previous_sequence(9);
    let v: serde_json::Value = serde_json::from_str(&d.wire_envelope()).unwrap();
    assert_eq!(v["prevsequence"], "9");
    assert!(event_core::Headers::new()
        .insert("prevsequence", "1")
        .is_err());
}

/// A new producer's wire envelope read by a consumer that knows nothing of chains (the
/// previous release, or any CloudEvents reader of this framework's parser): `prevsequence` is
/// one more extension attribute, kept among the headers, and the event decodes as before.
#[test]
fn a_consumer_that_knows_nothing_of_chains_reads_the_wire_envelope() {
    let envelope = Envelope::new(LineAdded { order: "O".into() })
        .with_sequence(5)
        .with_source("urn:test:shop");
    let stored = serde_json::to_string(&envelope).unwrap();
    let wire = Delivery::new(envelope.id(), "ordertest.line_added", &stored)
        .previous_sequence(4)
        .wire_envelope()
        .into_owned();
    let raw = event_core::RawEnvelope::from_json(&wire).unwrap();
    let typed = Envelope::<LineAdded>::decode(&raw).unwrap();
    assert_eq!(typed.sequence(), 5);
    assert_eq!(typed.event().order, "O");
    assert_eq!(typed.headers().get("prevsequence"), Some("4"));
}

#[tokio::test]
async fn replaying_the_dead_letter_that_holds_a_chain_releases_what_follows() {
    for db in common::databases("inbox_order_replay").await {
        let label = db.label();
        let store = db.open().await;
        setup(&store).await;
        let outbox = consumer(&store, Duration::from_secs(300));
        // 2 arrives at a version this deploy does not know: dead-lettered, it holds 3.
        let r = outbox
            .receive(
                INBOX,
                vec![
                    line("A", 1, 0),
                    wire("A", 2, Some(1), "ordertest.line_added", 2),
                    line("A", 3, 2),
                ],
            )
            .await;
        assert_eq!(
            r.verdicts[1],
            Verdict::DeadLettered(DeadLetterReason::UnknownEvent),
            "{label}"
        );
        drain(&outbox).await;
        assert_eq!(seen(&store, "A").await, [1], "{label}");
        assert_eq!(outbox.held_events().await.unwrap(), 1, "{label}");
        // The next deploy knows version 2: replaying the dead letter takes its place.
        let next = Outbox::builder(store.clone())
            .dispatcher(Dispatcher::builder_empty().event::<LineAddedV2>())
            .build()
            .unwrap();
        let dead = store.dead_letters(&Default::default()).await.unwrap();
        let report = next
            .replay_inbox_dead_letters(&[dead[0].id], "ops", "version 2 deployed")
            .await
            .unwrap();
        assert_eq!(report.appended, 1, "{label}");
        drain(&outbox).await;
        assert_eq!(seen(&store, "A").await, [1, 3], "{label}");
        assert_eq!(outbox.held_events().await.unwrap(), 0, "{label}");
        store.close().await;
    }
}

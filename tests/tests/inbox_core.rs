//! The inbox core as a transport other than NATS uses it (`Outbox::receive`, a made-up
//! transport `queue`): a verdict per message, the origin stored with every received event and
//! every dead letter, redeliveries and copies in one batch are duplicates, conflicts and
//! refusals never block the rest, a store failure leaves messages to retry, and a dead letter
//! is replayed after a deploy that knows its type — with no broker anywhere. On SQLite and on
//! the real PostgreSQL server (`EVENTS_TEST_POSTGRES_URL`).

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
use event_runtime::inbox::{Incoming, Origin, Verdict};
use event_runtime::testing::{FaultAction, FaultPoint};
use event_runtime::{DeadLetterReason, Dispatcher, Outbox, OutboxError, SqlValue, Store, Tx};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "coretest.parcel_sent", version = 1)]
struct ParcelSent {
    #[event(aggregate_id)]
    parcel: String,
    grams: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "coretest.parcel_lost", version = 1)]
struct ParcelLost {
    #[event(aggregate_id)]
    parcel: String,
}

/// Set: in-transaction runs fail transiently (a retry is worth it) until it is cleared.
struct Flaky(AtomicBool);

#[event_handler(name = "coretest.weigh", in_transaction)]
async fn weigh(
    envelope: &Envelope<ParcelSent>,
    tx: &mut Tx,
    flaky: &Flaky,
) -> Result<(), HandlerError> {
    if flaky.0.load(Ordering::SeqCst) {
        return Err(HandlerError::transient_msg("scale busy"));
    }
    tx.execute(
        "INSERT INTO core_weights (event_id, parcel, grams) VALUES ($1, $2, $3)",
        &[
            SqlValue::Text(&envelope.id().to_string()),
            SqlValue::Text(&envelope.event().parcel),
            SqlValue::Int(envelope.event().grams),
        ],
    )
    .await?;
    Ok(())
}

#[event_handler(name = "coretest.lost")]
async fn lost(envelope: &Envelope<ParcelLost>, tx: &mut Tx) -> Result<(), HandlerError> {
    tx.execute(
        "INSERT INTO core_weights (event_id, parcel, grams) VALUES ($1, $2, 0)",
        &[
            SqlValue::Text(&envelope.id().to_string()),
            SqlValue::Text(&envelope.event().parcel),
        ],
    )
    .await?;
    Ok(())
}

const INBOX: &str = "queue:warehouse";

/// Unit-of-work commits, counted by the fault-injection hook.
static COMMITS: AtomicUsize = AtomicUsize::new(0);

/// The consuming service; `knows_lost`: a later deploy that knows `coretest.parcel_lost`.
/// Envelopes over 2 KiB are refused.
fn consumer(store: &Store, knows_lost: bool, flaky: Arc<Flaky>) -> Outbox {
    let mut dispatcher = Dispatcher::builder_empty().handler::<weigh>();
    if knows_lost {
        dispatcher = dispatcher.handler::<lost>();
    }
    Outbox::builder(store.clone())
        .dispatcher(dispatcher)
        .resource_arc(flaky)
        .config(event_runtime::OutboxConfig::default().max_envelope_bytes(2048))
        .fault_injection(|point| {
            if point == FaultPoint::AfterCommit {
                COMMITS.fetch_add(1, Ordering::SeqCst);
            }
            FaultAction::Continue
        })
        .build()
        .unwrap()
}

fn sent(parcel: &str, seq: u64, grams: i64) -> Envelope<ParcelSent> {
    Envelope::new(ParcelSent {
        parcel: parcel.into(),
        grams,
    })
    .with_sequence(seq)
    .with_source("urn:test:shop")
}

fn message<T: Serialize>(envelope: &T, position: u64) -> Incoming {
    Incoming::new(
        serde_json::to_vec(envelope).unwrap(),
        Origin::new("queue", "parcels", position).attribute("routing_key", "parcel.sent"),
    )
}

async fn weights(store: &Store) -> i64 {
    let mut tx = store.begin().await.unwrap();
    let n = tx
        .fetch_i64("SELECT COALESCE(SUM(grams), 0) FROM core_weights", &[])
        .await
        .unwrap()
        .unwrap_or(0);
    tx.rollback().await.unwrap();
    n
}

#[tokio::test]
async fn a_second_transport_is_an_adapter_around_the_core() {
    for db in common::databases("inbox_core").await {
        let label = db.label();
        let store = db.open().await;
        let mut tx = store.begin().await.unwrap();
        tx.execute(
            "CREATE TABLE core_weights (event_id TEXT PRIMARY KEY, parcel TEXT NOT NULL, grams BIGINT NOT NULL)",
            &[],
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        let flaky = Arc::new(Flaky(AtomicBool::new(false)));
        let outbox = consumer(&store, false, flaky.clone());

        let a1 = sent("p-1", 1, 100);
        let a1_again = a1.clone();
        let a2 = sent("p-1", 2, 200);
        // p-1 sequence 2 again under another event id: a producer that re-published.
        let a2_other = sent("p-1", 2, 999);
        let lost_1 = Envelope::new(ParcelLost {
            parcel: "p-2".into(),
        })
        .with_sequence(1)
        .with_source("urn:test:shop");
        let batch = vec![
            message(&a1, 1),
            message(&a1_again, 1),
            message(&a2, 2),
            message(&a2_other, 3),
            message(&lost_1, 4),
            Incoming::new(b"\0 not json".to_vec(), Origin::new("queue", "parcels", 5))
                .message_id("0190d5a0-0000-7000-8000-000000000005"),
            message(&sent("p-3", 1, 7), 6).content_type("application/xml"),
        ];
        let receipt = outbox.receive(INBOX, batch).await;
        assert!(receipt.error.is_none(), "{label}: {:?}", receipt.error);
        assert_eq!(
            receipt.verdicts,
            [
                Verdict::Accepted,
                Verdict::Duplicate,
                Verdict::Accepted,
                Verdict::DeadLettered(DeadLetterReason::Conflict),
                Verdict::DeadLettered(DeadLetterReason::UnknownEvent),
                Verdict::DeadLettered(DeadLetterReason::Undecodable),
                Verdict::DeadLettered(DeadLetterReason::Undecodable),
            ],
            "{label}"
        );
        let r = receipt.report;
        assert_eq!(
            (r.received, r.appended, r.duplicates, r.dead_lettered),
            (7, 2, 1, 4),
            "{label}"
        );
        assert_eq!(receipt.new_dead_letters(), 4, "{label}");

        // Every received event has its origin; so has every dead letter.
        let o = store
            .received_origin(a2.id())
            .await
            .unwrap()
            .expect("origin");
        assert_eq!(
            (o.transport.as_str(), o.source.as_str(), o.position),
            ("queue", "parcels", 2),
            "{label}"
        );
        assert_eq!(o.attributes["routing_key"], "parcel.sent", "{label}");
        let dead = store.dead_letters(&Default::default()).await.unwrap();
        assert_eq!(dead.len(), 4, "{label}");
        let positions: Vec<u64> = dead
            .iter()
            .map(|d| d.origin.as_ref().expect("origin").position)
            .collect();
        assert_eq!(positions, [3, 4, 5, 6], "{label}");
        assert!(dead.iter().all(|d| d.handler == INBOX), "{label}");
        assert_eq!(
            dead[2].event_id.to_string(),
            "0190d5a0-0000-7000-8000-000000000005",
            "{label}: the broker's message id names a body without one"
        );
        assert!(dead[2].envelope.starts_with('\u{FFFD}'), "{label}");

        // A redelivery: all settled as before, nothing written twice.
        let again = outbox
            .receive(INBOX, vec![message(&a1, 1), message(&lost_1, 4)])
            .await;
        assert_eq!(
            again.verdicts,
            [
                Verdict::Duplicate,
                Verdict::DeadLettered(DeadLetterReason::UnknownEvent)
            ],
            "{label}"
        );
        assert_eq!(again.new_dead_letters(), 0, "{label}");

        // A transient failure of an in-transaction handler: to retry, not dead-lettered.
        flaky.0.store(true, Ordering::SeqCst);
        let a3 = sent("p-1", 3, 300);
        let retry = outbox.receive(INBOX, vec![message(&a3, 7)]).await;
        assert_eq!(retry.verdicts, [Verdict::Retry], "{label}");
        assert!(
            matches!(retry.error, Some(OutboxError::Aborted(_))),
            "{label}: {:?}",
            retry.error
        );
        flaky.0.store(false, Ordering::SeqCst);
        let redelivered = outbox.receive(INBOX, vec![message(&a3, 7)]).await;
        assert_eq!(redelivered.verdicts, [Verdict::Accepted], "{label}");

        // What the commit would refuse whatever the rest (an envelope over the limit, U+0000
        // in an aggregate id) is set aside before it: the batch still commits at once.
        let before = COMMITS.load(Ordering::SeqCst);
        let big = sent(&"x".repeat(4096), 1, 1);
        let nul = sent("p-\u{0}", 1, 1);
        let a4 = sent("p-1", 4, 400);
        let mixed = outbox
            .receive(
                INBOX,
                vec![message(&big, 8), message(&a4, 9), message(&nul, 10)],
            )
            .await;
        assert!(mixed.error.is_none(), "{label}: {:?}", mixed.error);
        assert_eq!(
            mixed.verdicts,
            [
                Verdict::DeadLettered(DeadLetterReason::Undecodable),
                Verdict::Accepted,
                Verdict::DeadLettered(DeadLetterReason::Undecodable),
            ],
            "{label}"
        );
        assert_eq!(COMMITS.load(Ordering::SeqCst) - before, 1, "{label}");
        let refused = store.dead_letters(&Default::default()).await.unwrap();
        let (big, nul) = (&refused[refused.len() - 2], &refused[refused.len() - 1]);
        assert!(
            big.error_chain
                .iter()
                .any(|c| c.contains("over the limit of 2048 bytes")),
            "{label}: {:?}",
            big.error_chain
        );
        // Kept truncated to the limit, saying so: huge bodies do not fill the disk.
        assert_eq!(big.envelope.len(), 2048, "{label}");
        assert!(
            big.error_chain
                .iter()
                .any(|c| c.contains("is kept truncated to its first 2048 bytes")),
            "{label}: {:?}",
            big.error_chain
        );
        assert!(
            nul.error_chain[0].contains("was refused when committed into this outbox"),
            "{label}: {:?}",
            nul.error_chain
        );

        outbox.drain(Duration::from_secs(10)).await.unwrap();
        assert_eq!(weights(&store).await, 1000, "{label}");

        // A deploy that knows `coretest.parcel_lost` replays its dead letter: no broker, the
        // origin kept.
        let deployed = consumer(&store, true, flaky.clone());
        let r = deployed
            .replay_inbox_dead_letters(&[dead[1].id], "ops", "parcel_lost deployed")
            .await
            .unwrap();
        assert_eq!((r.received, r.appended), (1, 1), "{label}");
        let o = store
            .received_origin(lost_1.id())
            .await
            .unwrap()
            .expect("origin");
        assert_eq!(o.position, 4, "{label}");
        // Replaying it again: it is no longer open, nothing happens, nothing is audited.
        let audits = store.audit_log(100).await.unwrap().len();
        let r = deployed
            .replay_inbox_dead_letters(&[dead[1].id], "ops", "twice")
            .await
            .unwrap();
        assert_eq!((r.received, r.appended, r.duplicates), (0, 0, 0), "{label}");
        assert_eq!(store.audit_log(100).await.unwrap().len(), audits, "{label}");
        // The conflict's place is still taken: the replay fails and changes nothing.
        let e = deployed
            .replay_inbox_dead_letters(&[dead[0].id], "ops", "try")
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                OutboxError::Store(event_runtime::StoreError::Conflict { .. })
            ),
            "{label}: {e}"
        );
        assert_eq!(
            store.dead_letters(&Default::default()).await.unwrap().len(),
            5,
            "{label}"
        );
        deployed.drain(Duration::from_secs(10)).await.unwrap();
        let mut tx = store.begin().await.unwrap();
        let n = tx
            .fetch_i64(
                "SELECT COUNT(*) FROM core_weights WHERE parcel = 'p-2'",
                &[],
            )
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        assert_eq!(n, Some(1), "{label}");

        // Bodies without a readable event id at one position (a transport without positions,
        // two partitions at one offset): each is a dead letter of its own; one redelivered
        // adds none.
        let at_0 = |body: &[u8], partition: &str| {
            Incoming::new(
                body.to_vec(),
                Origin::new("queue", "parcels", 0).attribute("partition", partition),
            )
        };
        let unnamed = deployed
            .receive(
                INBOX,
                vec![
                    at_0(b"garbage one", "0"),
                    at_0(b"garbage two", "0"),
                    at_0(b"garbage one", "1"),
                ],
            )
            .await;
        assert_eq!(unnamed.new_dead_letters(), 3, "{label}");
        let again = deployed
            .receive(INBOX, vec![at_0(b"garbage two", "0")])
            .await;
        assert_eq!(again.new_dead_letters(), 0, "{label}");

        // A media type is case-insensitive, its parameters do not change it.
        let typed = deployed
            .receive(
                INBOX,
                vec![message(&sent("p-9", 1, 1), 20)
                    .content_type("Application/CloudEvents+JSON; charset=utf-8")],
            )
            .await;
        assert_eq!(typed.verdicts, [Verdict::Accepted], "{label}");
    }
}

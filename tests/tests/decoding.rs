//! The decoding policy: an envelope this code cannot decode is never a crash and never
//! silently dropped (durable delivery dead-letters it with the reason, and replaying it after
//! deploying code that knows it succeeds); unknown payload fields are ignored unless the event
//! says `deny_unknown_fields`; a missing field takes its serde default or is an error naming
//! it; integers beyond 2^53 survive every store and the envelope. Store cases run on SQLite and
//! on PostgreSQL (`EVENTS_TEST_POSTGRES_URL`).
//!
//! Every registry here is built by hand (`builder_empty`): producers and consumers of other
//! deployments are declared side by side in this binary, with the same event names.

mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::{databases, Db};
use event_core::{event_handler, AnyEnvelope, DecodeError, DomainEvent, Envelope, RawEnvelope};
use event_runtime::{
    DeadLetterFilter, DispatchError, Dispatcher, Outbox, Resolution, SqlValue, Store,
};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

async fn commit(outbox: &Outbox, envelopes: Vec<Box<dyn AnyEnvelope>>) {
    let mut uow = outbox.begin().await.unwrap();
    uow.extend(envelopes);
    uow.commit().await.unwrap();
}

async fn stored_sequence(store: &Store, id: Uuid) -> i64 {
    let id = id.to_string();
    let mut tx = store.begin().await.unwrap();
    let n = tx
        .fetch_i64(
            "SELECT sequence FROM event_outbox WHERE event_id = $1",
            &[SqlValue::Text(&id)],
        )
        .await
        .unwrap()
        .unwrap_or(0);
    tx.commit().await.unwrap();
    n
}

// ---- unknown versions and names: dead letter, then replay after the deploy -------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, DomainEvent)]
#[event(name = "invoice.sent", version = 1)]
struct InvoiceV1 {
    #[event(aggregate_id)]
    invoice_id: String,
    amount: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, DomainEvent)]
#[event(name = "invoice.sent", version = 2, upcast_from = InvoiceV1)]
struct InvoiceV2 {
    #[event(aggregate_id)]
    invoice_id: String,
    amount: i64,
    due_days: u32,
}

impl From<InvoiceV1> for InvoiceV2 {
    fn from(v1: InvoiceV1) -> Self {
        InvoiceV2 {
            invoice_id: v1.invoice_id,
            amount: v1.amount,
            due_days: 30,
        }
    }
}

/// Known only to the code deployed later.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, DomainEvent)]
#[event(name = "invoice.sent", version = 3, upcast_from = InvoiceV2)]
struct InvoiceV3 {
    #[event(aggregate_id)]
    invoice_id: String,
    amount: i64,
    due_days: u32,
    currency: String,
}

impl From<InvoiceV2> for InvoiceV3 {
    fn from(v2: InvoiceV2) -> Self {
        InvoiceV3 {
            invoice_id: v2.invoice_id,
            amount: v2.amount,
            due_days: v2.due_days,
            currency: "USD".into(),
        }
    }
}

/// An event whose name the old code has never heard of.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, DomainEvent)]
#[event(name = "refund.issued")]
struct RefundIssued {
    #[event(aggregate_id)]
    refund_id: String,
}

#[derive(Default)]
struct Recorded(Mutex<Vec<String>>);

impl Recorded {
    fn push(&self, what: String) {
        self.0.lock().unwrap().push(what);
    }
    fn take(&self) -> Vec<String> {
        let mut v = std::mem::take(&mut *self.0.lock().unwrap());
        v.sort();
        v
    }
}

/// The old deployment's handler: takes v2, the newest version it knows.
#[event_handler(name = "invoices.record")]
fn record_v2(_: &InvoiceV2) {
    panic!("the old code cannot be handed an event it does not know");
}

/// The new deployment's handler of the same name.
#[event_handler(name = "invoices.record")]
fn record_v3(e: &InvoiceV3, recorded: &Recorded) {
    recorded.push(format!(
        "invoice {} {} {}",
        e.invoice_id, e.amount, e.currency
    ));
}

#[event_handler(name = "refunds.record")]
fn record_refund(e: &RefundIssued, recorded: &Recorded) {
    recorded.push(format!("refund {}", e.refund_id));
}

async fn old_code(db: &Db) -> Outbox {
    Outbox::builder(db.open().await)
        .dispatcher(Dispatcher::builder_empty().handler::<record_v2>())
        .build()
        .unwrap()
}

async fn new_code(db: &Db) -> Outbox {
    Outbox::builder(db.open().await)
        .dispatcher(
            Dispatcher::builder_empty()
                .handler::<record_v3>()
                .handler::<record_refund>(),
        )
        .resource(Recorded::default())
        .build()
        .unwrap()
}

#[test]
fn an_unknown_version_is_dead_lettered_a_foreign_handler_waits_and_both_run_after_the_deploy() {
    block_on(async {
        for db in databases("decode_unknown").await {
            let label = db.label();
            // A newer producer (or a newer instance in a rolling deploy) commits v3 and an
            // event of a new name.
            let producer = new_code(&db).await;
            let invoice = Envelope::new(InvoiceV3 {
                invoice_id: "INV-1".into(),
                amount: 990,
                due_days: 14,
                currency: "EUR".into(),
            });
            let refund = Envelope::new(RefundIssued {
                refund_id: "RF-1".into(),
            });
            let invoice_id = invoice.id();
            commit(&producer, vec![Box::new(invoice), Box::new(refund)]).await;

            // The old instance claims the invoice delivery (it has `invoices.record`, but not
            // v3): no crash, no silent drop — a dead letter. The refund's delivery belongs to
            // `refunds.record`, which the old code does not have: it leaves it pending for an
            // instance that has it, visible in the stats, rather than dead-lettering it.
            let old = old_code(&db).await;
            let report = old.drain(Duration::from_secs(10)).await.unwrap();
            assert_eq!((report.completed, report.dead_lettered), (0, 1), "{label}");
            let store = old.store();
            let dead = store
                .dead_letters(&DeadLetterFilter::default())
                .await
                .unwrap();
            assert_eq!(dead.len(), 1, "{label}");
            let stats = store.stats().await.unwrap();
            let refunds = stats
                .handlers
                .iter()
                .find(|h| h.handler == "refunds.record")
                .unwrap();
            assert_eq!((refunds.pending, refunds.dead), (1, 0), "{label}");
            let dv = dead.iter().find(|d| d.event_id == invoice_id).unwrap();
            assert_eq!(
                (dv.reason.as_str(), dv.event_version),
                ("unknown_event", 3),
                "{label}"
            );
            assert_eq!(
                dv.error_chain,
                vec!["unknown version 3 of event `invoice.sent`: registered versions are [1, 2]"],
                "{label}"
            );
            // The dead letter keeps the envelope byte for byte: the v3 payload is all there.
            let raw = RawEnvelope::from_json(&dv.envelope).unwrap();
            assert_eq!((raw.name.as_str(), raw.version), ("invoice.sent", 3));
            assert!(
                raw.data.get().contains(r#""currency":"EUR""#),
                "{}",
                raw.data.get()
            );
            assert_eq!(store.stats().await.unwrap().dead_letters, 1, "{label}");
            drop(old);

            // Deploy code that knows v3 and `refund.issued`, then replay.
            let new = new_code(&db).await;
            let ids: Vec<i64> = dead.iter().map(|d| d.id).collect();
            let replayed = new
                .store()
                .resolve_dead_letters(&ids, Resolution::Replay, "ops", "deployed invoice v3")
                .await
                .unwrap();
            assert_eq!(replayed.len(), 1, "{label}");
            let report = new.drain(Duration::from_secs(10)).await.unwrap();
            assert_eq!((report.completed, report.dead_lettered), (2, 0), "{label}");
            assert_eq!(
                new.dispatcher().resource::<Recorded>().unwrap().take(),
                vec!["invoice INV-1 990 EUR", "refund RF-1"],
                "{label}"
            );
            assert_eq!(
                new.store().stats().await.unwrap().dead_letters,
                0,
                "{label}"
            );
        }
    });
}

#[test]
fn in_process_dispatch_of_an_unknown_version_or_name_is_an_error_not_a_panic() {
    let d = Dispatcher::builder_empty()
        .handler::<record_v2>()
        .build()
        .unwrap();
    let v3 = Envelope::new(InvoiceV3 {
        invoice_id: "INV-2".into(),
        amount: 1,
        due_days: 1,
        currency: "USD".into(),
    });
    let err = block_on(d.dispatch_json(&serde_json::to_string(&v3).unwrap())).unwrap_err();
    let DispatchError::Decode(DecodeError::UnknownVersion {
        name,
        version,
        known,
    }) = &err
    else {
        panic!("expected UnknownVersion, got {err:?}");
    };
    assert_eq!(
        (name.as_str(), *version, known.as_slice()),
        ("invoice.sent", 3, &[1, 2][..])
    );

    let refund = Envelope::new(RefundIssued {
        refund_id: "RF-2".into(),
    });
    let err = block_on(d.dispatch_raw(&refund.to_raw().unwrap())).unwrap_err();
    assert!(
        matches!(err, DispatchError::Decode(DecodeError::UnknownName { ref name, version: 1 }) if name == "refund.issued"),
        "{err:?}"
    );
}

// ---- unknown and missing payload fields -----------------------------------------------------

fn raw(name: &str, version: u32, data: &str) -> RawEnvelope {
    let json = format!(
        r#"{{"specversion":"1.0","id":"0190b2a0-0000-7000-8000-000000000001","source":"urn:test","type":"{name}","subject":"x","time":"2024-01-01T00:00:00Z","schemaversion":{version},"data":{data}}}"#
    );
    RawEnvelope::from_json(&json).unwrap()
}

#[test]
fn unknown_fields_from_a_newer_producer_are_ignored_by_default() {
    let raw = raw(
        "invoice.sent",
        1,
        r#"{"invoice_id":"INV-3","amount":5,"discount":{"percent":10},"lines":[1,2]}"#,
    );
    let envelope = Envelope::<InvoiceV1>::decode(&raw).unwrap();
    assert_eq!(
        envelope.event(),
        &InvoiceV1 {
            invoice_id: "INV-3".into(),
            amount: 5
        }
    );
    // Through the registry, and upcast: the extra fields are gone, not an error.
    let registry = Dispatcher::builder_empty()
        .event::<InvoiceV2>()
        .build()
        .unwrap();
    let latest = registry.registry().decode_latest(&raw).unwrap();
    assert_eq!(latest.version(), 2);
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Card {
    last4: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, DomainEvent)]
#[event(name = "payment.captured", deny_unknown_fields)]
struct PaymentCaptured {
    #[event(aggregate_id)]
    payment_id: String,
    amount: i64,
    card: Card,
    #[serde(default)]
    tags: Vec<String>,
}

#[test]
fn deny_unknown_fields_makes_an_unknown_field_an_error_naming_it_and_the_event() {
    let ok = raw(
        "payment.captured",
        1,
        r#"{"payment_id":"P-1","amount":5,"card":{"last4":"4242"}}"#,
    );
    let envelope = Envelope::<PaymentCaptured>::decode(&ok).unwrap();
    assert!(envelope.event().tags.is_empty());

    for (data, field) in [
        (
            r#"{"payment_id":"P-1","amount":5,"card":{"last4":"4242"},"tip":1}"#,
            "tip",
        ),
        // Nested: serde's own `deny_unknown_fields` would have to be repeated on `Card`.
        (
            r#"{"payment_id":"P-1","amount":5,"card":{"last4":"4242","brand":"visa"}}"#,
            "card.brand",
        ),
        (
            r#"{"tip":null,"payment_id":"P-1","amount":5,"card":{"last4":"4242"},"fee":2}"#,
            "tip",
        ),
    ] {
        let err =
            Envelope::<PaymentCaptured>::decode(&raw("payment.captured", 1, data)).unwrap_err();
        match &err {
            DecodeError::UnknownField {
                name,
                version,
                type_name,
                field: f,
                ..
            } => {
                assert_eq!(
                    (name.as_str(), *version, f.as_str()),
                    ("payment.captured", 1, field)
                );
                assert!(type_name.ends_with("::PaymentCaptured"), "{type_name}");
            }
            other => panic!("{data}: expected UnknownField, got {other:?}"),
        }
        let message = err.to_string();
        assert!(
            message.contains(&format!("unknown field `{field}`"))
                && message.contains("`payment.captured` v1")
                && message.contains("deny_unknown_fields"),
            "{message}"
        );
    }
}

/// No payload field but the aggregate id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, DomainEvent)]
#[event(name = "session.closed", deny_unknown_fields)]
struct SessionClosed {
    #[event(aggregate_id)]
    session_id: String,
}

#[test]
fn deny_unknown_fields_holds_for_an_event_whose_payload_is_only_its_aggregate_id() {
    let ok =
        Envelope::<SessionClosed>::decode(&raw("session.closed", 1, r#"{"session_id":"S-1"}"#))
            .unwrap();
    assert_eq!(ok.event().session_id, "S-1");
    for (data, field) in [
        (r#"{"session_id":"S-1","reason":"timeout"}"#, "reason"),
        (r#"{"reason":{"code":1},"session_id":"S-1"}"#, "reason"),
        (r#"{"session_id":"S-1","session_id2":null}"#, "session_id2"),
    ] {
        let err = Envelope::<SessionClosed>::decode(&raw("session.closed", 1, data)).unwrap_err();
        assert!(
            matches!(&err, DecodeError::UnknownField { field: f, .. } if f == field),
            "{data}: {err:?}"
        );
    }
    // The aggregate id itself is still required.
    let err = Envelope::<SessionClosed>::decode(&raw("session.closed", 1, "{}")).unwrap_err();
    let chain = event_core::ErrorChain(&err).to_string();
    assert!(chain.contains("missing field `session_id`"), "{chain}");
    // And the payload must be an object.
    assert!(matches!(
        Envelope::<SessionClosed>::decode(&raw("session.closed", 1, "[]")).unwrap_err(),
        DecodeError::Payload { .. }
    ));
}

/// The consumer's view of `payment.received` v1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, DomainEvent)]
#[event(name = "payment.received")]
struct PaymentReceived {
    #[event(aggregate_id)]
    payment_id: String,
    amount: i64,
    currency: String,
    #[serde(default)]
    note: String,
    #[serde(default = "one")]
    attempts: u32,
}

fn one() -> u32 {
    1
}

#[test]
fn a_missing_field_with_a_serde_default_decodes_and_a_missing_required_one_is_named() {
    let with_defaults = raw(
        "payment.received",
        1,
        r#"{"payment_id":"P-2","amount":7,"currency":"EUR"}"#,
    );
    let e = Envelope::<PaymentReceived>::decode(&with_defaults).unwrap();
    assert_eq!((e.event().note.as_str(), e.event().attempts), ("", 1));

    let missing = raw("payment.received", 1, r#"{"payment_id":"P-2","amount":7}"#);
    let err = Envelope::<PaymentReceived>::decode(&missing).unwrap_err();
    assert!(matches!(err, DecodeError::Payload { .. }), "{err:?}");
    // The decode error says which event failed; serde's message, naming the field, is its
    // source, printed once by the chain.
    let message = err.to_string();
    assert!(message.contains("`payment.received` v1"), "{message}");
    let chain = event_core::ErrorChain(&err).to_string();
    assert_eq!(
        chain.matches("missing field `currency`").count(),
        1,
        "{chain}"
    );
}

// ---- through the outbox ---------------------------------------------------------------------

/// The producer's view of the same event: a currency it may leave out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, DomainEvent)]
#[event(name = "payment.received")]
struct PaymentProduced {
    #[event(aggregate_id)]
    payment_id: String,
    amount: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    currency: Option<String>,
}

#[event_handler(name = "payments.ledger")]
fn ledger_producer_side(_: &PaymentProduced) {
    panic!("only the consumer delivers");
}

#[event_handler(name = "payments.ledger")]
fn ledger(e: &PaymentReceived, recorded: &Recorded) {
    recorded.push(format!(
        "{} {} {} {:?} {}",
        e.payment_id, e.amount, e.currency, e.note, e.attempts
    ));
}

#[test]
fn a_delivery_missing_a_required_field_is_dead_lettered_naming_it() {
    block_on(async {
        for db in databases("decode_missing").await {
            let label = db.label();
            let producer = Outbox::builder(db.open().await)
                .dispatcher(Dispatcher::builder_empty().handler::<ledger_producer_side>())
                .build()
                .unwrap();
            let payment = |id: &str, currency: Option<&str>| {
                Box::new(Envelope::new(PaymentProduced {
                    payment_id: id.into(),
                    amount: 100,
                    currency: currency.map(Into::into),
                })) as Box<dyn AnyEnvelope>
            };
            let missing = payment("P-4", None);
            let missing_id = missing.metadata().id;
            commit(
                &producer,
                vec![
                    payment("P-3", Some("EUR")),
                    missing,
                    payment("P-5", Some("USD")),
                ],
            )
            .await;

            let consumer = Outbox::builder(db.open().await)
                .dispatcher(Dispatcher::builder_empty().handler::<ledger>())
                .resource(Recorded::default())
                .build()
                .unwrap();
            let report = consumer.drain(Duration::from_secs(10)).await.unwrap();
            assert_eq!((report.completed, report.dead_lettered), (2, 1), "{label}");
            // `note` and `attempts` were never sent: their defaults.
            assert_eq!(
                consumer.dispatcher().resource::<Recorded>().unwrap().take(),
                vec![r#"P-3 100 EUR "" 1"#, r#"P-5 100 USD "" 1"#],
                "{label}"
            );
            let dead = consumer
                .store()
                .dead_letters(&DeadLetterFilter::default())
                .await
                .unwrap();
            assert_eq!(dead.len(), 1, "{label}");
            assert_eq!(
                (dead[0].event_id, dead[0].reason.as_str()),
                (missing_id, "undecodable")
            );
            // Each cause once: the decode error names the event, serde's message the field.
            let chain = &dead[0].error_chain;
            assert!(chain[0].contains("payment.received"), "{label}: {chain:?}");
            assert_eq!(
                chain
                    .iter()
                    .filter(|e| e.contains("missing field `currency`"))
                    .count(),
                1,
                "{label}: {chain:?}"
            );
        }
    });
}

// ---- integers beyond 2^53 -------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, DomainEvent)]
#[event(name = "ledger.extremes")]
struct Extremes {
    #[event(aggregate_id)]
    account: u64,
    max_u64: u64,
    min_i64: i64,
    max_i64: i64,
    above_2_53: u64,
    below_minus_2_53: i64,
    max_u128: u128,
    min_i128: i128,
    amounts: Vec<u64>,
}

const ABOVE_2_53: u64 = (1 << 53) + 1;

fn extremes() -> Extremes {
    Extremes {
        account: u64::MAX,
        max_u64: u64::MAX,
        min_i64: i64::MIN,
        max_i64: i64::MAX,
        above_2_53: ABOVE_2_53,
        below_minus_2_53: -(ABOVE_2_53 as i64),
        max_u128: u128::MAX,
        min_i128: i128::MIN,
        amounts: vec![ABOVE_2_53, u64::MAX - 1],
    }
}

#[test]
fn integers_beyond_2_53_survive_the_envelope() {
    let envelope = Envelope::new(extremes()).with_sequence(ABOVE_2_53);
    let json = serde_json::to_string(&envelope).unwrap();
    // Written as exact JSON integers (a JSON text, not a JavaScript number).
    for digits in [
        "18446744073709551615",
        "-9223372036854775808",
        "9223372036854775807",
        "9007199254740993",
        "-9007199254740993",
        "340282366920938463463374607431768211455",
        "-170141183460469231731687303715884105728",
    ] {
        assert!(json.contains(digits), "{digits} not in {json}");
    }
    // The sequence is a zero-padded string attribute, exact too.
    assert!(
        json.contains(r#""sequence":"00009007199254740993""#),
        "{json}"
    );
    // The aggregate id (`subject`) is a string.
    assert!(
        json.contains(r#""subject":"18446744073709551615""#),
        "{json}"
    );

    let raw = RawEnvelope::from_json(&json).unwrap();
    assert_eq!(
        raw.to_json(),
        json,
        "the raw envelope keeps the text byte for byte"
    );
    let back = Envelope::<Extremes>::decode(&raw).unwrap();
    assert_eq!(back, envelope);
}

#[derive(Default)]
struct Received(Mutex<Vec<(u64, Extremes)>>);

#[event_handler(name = "ledger.audit")]
fn audit(envelope: &Envelope<Extremes>, received: &Received) {
    received
        .0
        .lock()
        .unwrap()
        .push((envelope.sequence(), envelope.event().clone()));
}

#[test]
fn integers_beyond_2_53_survive_both_stores() {
    block_on(async {
        for db in databases("decode_numbers").await {
            let label = db.label();
            let outbox = Outbox::builder(db.open().await)
                .dispatcher(Dispatcher::builder_empty().handler::<audit>())
                .resource(Received::default())
                .build()
                .unwrap();
            let envelope = Envelope::new(extremes()).with_sequence(ABOVE_2_53);
            let id = envelope.id();
            commit(&outbox, vec![Box::new(envelope)]).await;
            // The stored sequence column is exact too.
            assert_eq!(
                stored_sequence(outbox.store(), id).await,
                ABOVE_2_53 as i64,
                "{label}"
            );
            let report = outbox.drain(Duration::from_secs(10)).await.unwrap();
            assert_eq!(report.completed, 1, "{label}");
            let received = std::mem::take(
                &mut *outbox
                    .dispatcher()
                    .resource::<Received>()
                    .unwrap()
                    .0
                    .lock()
                    .unwrap(),
            );
            assert_eq!(received, vec![(ABOVE_2_53, extremes())], "{label}");
        }
    });
}

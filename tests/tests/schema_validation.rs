//! Schema validation at the boundary (`validate_schemas`): an envelope from a foreign producer
//! whose payload breaks its event type's JSON Schema is an inbox dead letter `invalid` naming
//! the JSON pointer of the first violation, never a handler call, and it holds back its
//! aggregate's later events; `dispatch_json` refuses it the same way. Off, nothing changes.
//! Through `Outbox::receive` (a made-up transport `queue`), on SQLite and on the real
//! PostgreSQL server (`EVENTS_TEST_POSTGRES_URL`).

mod common;

use std::time::Duration;

use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
use event_runtime::inbox::{Incoming, Origin, Verdict};
use event_runtime::{
    DeadLetterReason, DispatchError, Dispatcher, Outbox, OutboxError, RegistryError, SqlValue,
    Store, Tx,
};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent, schemars::JsonSchema)]
#[event(name = "valtest.item_added", version = 1)]
struct ItemAdded {
    #[event(aggregate_id)]
    cart: String,
    /// At least one: a rule serde does not check.
    #[schemars(range(min = 1))]
    quantity: u32,
    sku: String,
    /// A map: its keys are payload, never shown in an error.
    #[serde(default)]
    tags: std::collections::BTreeMap<String, u32>,
}

/// A closed content model: its schema allows no other property.
#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[event(name = "valtest.closed", version = 1)]
struct Closed {
    #[event(aggregate_id)]
    cart: String,
}

#[event_handler(name = "valtest.record")]
async fn record(envelope: &Envelope<ItemAdded>, tx: &mut Tx) -> Result<(), HandlerError> {
    tx.execute(
        "INSERT INTO cart_seen (sequence) VALUES ($1)",
        &[SqlValue::Int(envelope.sequence() as i64)],
    )
    .await?;
    Ok(())
}

const INBOX: &str = "queue:carts";
/// A value of the producer's that must not appear in the error a dead letter keeps.
const MARKER: &str = "SECRET-SKU-7731";

/// Event `seq` of cart `C` as a foreign producer sends it, its payload `data`.
fn wire(seq: u64, data: serde_json::Value) -> Incoming {
    let envelope = Envelope::new(ItemAdded {
        cart: "C".into(),
        quantity: 1,
        sku: "x".into(),
        tags: Default::default(),
    })
    .with_id(uuid::Uuid::from_u128(0xC000 + u128::from(seq)))
    .with_sequence(seq)
    .with_source("urn:test:foreign-shop");
    let mut json = serde_json::to_value(&envelope).unwrap();
    json["data"] = data;
    json["prevsequence"] = (seq - 1).to_string().into();
    Incoming::new(
        serde_json::to_vec(&json).unwrap(),
        Origin::new("queue", "carts", seq),
    )
}

fn good(seq: u64) -> Incoming {
    wire(
        seq,
        serde_json::json!({"cart": "C", "quantity": 2, "sku": "A-1"}),
    )
}

fn consumer(store: &Store, validate: bool) -> Outbox {
    Outbox::builder(store.clone())
        .dispatcher(Dispatcher::builder_empty().handler::<record>())
        .validate_schemas(validate)
        .build()
        .unwrap()
}

async fn setup(store: &Store) {
    let mut tx = store.begin().await.unwrap();
    tx.execute("CREATE TABLE cart_seen (sequence BIGINT NOT NULL)", &[])
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

async fn seen(store: &Store) -> Vec<i64> {
    let rows = store
        .query("SELECT sequence FROM cart_seen ORDER BY sequence")
        .fetch_all()
        .await
        .unwrap();
    rows.iter().map(|r| r.get_at::<i64>(0).unwrap()).collect()
}

#[tokio::test]
async fn a_payload_that_breaks_its_schema_is_an_invalid_dead_letter_that_holds_its_successors() {
    for db in common::databases("schema_validation_inbox").await {
        let label = db.label();
        let store = db.open().await;
        setup(&store).await;
        let outbox = consumer(&store, true);
        // 2 decodes into the Rust type (0 is a u32) but breaks the schema's minimum; 3 waits.
        let bad = wire(
            2,
            serde_json::json!({"cart": "C", "quantity": 0, "sku": MARKER}),
        );
        let r = outbox.receive(INBOX, vec![good(1), bad, good(3)]).await;
        assert_eq!(
            r.verdicts,
            [
                Verdict::Accepted,
                Verdict::DeadLettered(DeadLetterReason::Invalid),
                Verdict::Accepted
            ],
            "{label}"
        );
        outbox.drain(Duration::from_secs(20)).await.unwrap();
        assert_eq!(seen(&store).await, [1], "{label}: 3 is held behind 2");
        assert_eq!(outbox.held_events().await.unwrap(), 1, "{label}");

        let dead = store.dead_letters(&Default::default()).await.unwrap();
        assert_eq!(dead.len(), 1, "{label}");
        assert_eq!(dead[0].reason, DeadLetterReason::Invalid, "{label}");
        assert_eq!(dead[0].handler, INBOX, "{label}");
        let error = dead[0].error_chain.join(" / ");
        assert!(
            error.contains("valtest.item_added") && error.contains("/quantity"),
            "{label}: {error}"
        );
        assert!(!error.contains(MARKER), "{label}: {error}");

        // The same schema still refuses it on replay: nothing changes.
        let err = outbox
            .replay_inbox_dead_letters(&[dead[0].id], "ops", "try again")
            .await
            .unwrap_err();
        assert!(
            matches!(err, OutboxError::NotValid { .. }),
            "{label}: {err}"
        );
        // A deploy without validation takes it (the Rust type accepts 0), releasing 3.
        let lenient = consumer(&store, false);
        let report = lenient
            .replay_inbox_dead_letters(&[dead[0].id], "ops", "accepted as is")
            .await
            .unwrap();
        assert_eq!(report.appended, 1, "{label}");
        lenient.drain(Duration::from_secs(20)).await.unwrap();
        assert_eq!(seen(&store).await, [1, 2, 3], "{label}");
        store.close().await;
    }
}

#[tokio::test]
async fn without_validation_the_same_payload_is_handled() {
    for db in common::databases("schema_validation_off").await {
        let label = db.label();
        let store = db.open().await;
        setup(&store).await;
        let outbox = consumer(&store, false);
        let bad = wire(
            2,
            serde_json::json!({"cart": "C", "quantity": 0, "sku": "s"}),
        );
        let r = outbox.receive(INBOX, vec![good(1), bad]).await;
        assert_eq!(
            r.verdicts,
            [Verdict::Accepted, Verdict::Accepted],
            "{label}"
        );
        outbox.drain(Duration::from_secs(20)).await.unwrap();
        assert_eq!(seen(&store).await, [1, 2], "{label}");
        store.close().await;
    }
}

#[tokio::test]
async fn dispatch_json_refuses_a_payload_that_breaks_its_schema_with_its_place() {
    let dispatcher = Dispatcher::builder_empty()
        .event::<ItemAdded>()
        .event::<Closed>()
        .validate_schemas(true)
        .build()
        .unwrap();
    assert!(dispatcher.validates_schemas());
    let body = |data: serde_json::Value| {
        let mut json = serde_json::to_value(Envelope::new(ItemAdded {
            cart: "C".into(),
            quantity: 1,
            sku: "x".into(),
            tags: Default::default(),
        }))
        .unwrap();
        json["data"] = data;
        json.to_string()
    };
    // A wrong type deep inside: the pointer names it; the value is not quoted.
    let err = dispatcher
        .dispatch_json(&body(
            serde_json::json!({"cart": "C", "quantity": MARKER, "sku": "s"}),
        ))
        .await
        .unwrap_err();
    let DispatchError::Invalid(v) = &err else {
        panic!("{err}")
    };
    assert_eq!(
        (v.event.as_str(), v.version, v.path.as_str()),
        ("valtest.item_added", 1, "/quantity")
    );
    assert!(!err.to_string().contains(MARKER), "{err}");
    // A required field missing: the pointer is the payload itself.
    let err = dispatcher
        .dispatch_json(&body(serde_json::json!({"cart": "C", "quantity": 1})))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("at the top level") && err.to_string().contains("sku"),
        "{err}"
    );
    // A map's key is payload: the pointer does not show it.
    let err = dispatcher
        .dispatch_json(&body(
            serde_json::json!({"cart": "C", "quantity": 1, "sku": "s", "tags": {MARKER: "x"}}),
        ))
        .await
        .unwrap_err();
    let DispatchError::Invalid(v) = &err else {
        panic!("{err}")
    };
    assert_eq!(v.path, "/tags/*", "{err}");
    assert!(!err.to_string().contains(MARKER), "{err}");
    // An unexpected property's name is payload too.
    let mut closed = serde_json::to_value(Envelope::new(Closed { cart: "C".into() })).unwrap();
    closed["data"][MARKER] = 1.into();
    let err = dispatcher
        .dispatch_json(&closed.to_string())
        .await
        .unwrap_err();
    assert!(
        matches!(err, DispatchError::Invalid(_)) && err.to_string().contains("1 of them"),
        "{err}"
    );
    assert!(!err.to_string().contains(MARKER), "{err}");
    // A valid one dispatches.
    dispatcher
        .dispatch_json(&body(
            serde_json::json!({"cart": "C", "quantity": 3, "sku": "s"}),
        ))
        .await
        .unwrap();
    // Off (the default), only decoding decides.
    let lenient = Dispatcher::builder_empty()
        .event::<ItemAdded>()
        .build()
        .unwrap();
    assert!(!lenient.validates_schemas());
    lenient
        .dispatch_json(&body(
            serde_json::json!({"cart": "C", "quantity": 0, "sku": "s"}),
        ))
        .await
        .unwrap();
}

/// A schema the validator cannot compile is a build error, not a surprise at the first event.
#[test]
fn a_schema_that_does_not_compile_fails_the_build() {
    #[derive(Serialize, Deserialize, DomainEvent)]
    #[event(name = "valtest.broken", version = 1)]
    struct Broken {
        #[event(aggregate_id)]
        id: String,
    }
    impl schemars::JsonSchema for Broken {
        fn schema_name() -> std::borrow::Cow<'static, str> {
            "Broken".into()
        }
        fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
            schemars::json_schema!({"type": "object", "properties": {"id": {"type": 12}}})
        }
    }
    let err = Dispatcher::builder_empty()
        .event::<Broken>()
        .validate_schemas(true)
        .build()
        .unwrap_err();
    assert!(
        matches!(
            err,
            RegistryError::InvalidSchema {
                name: "valtest.broken",
                ..
            }
        ),
        "{err}"
    );
}

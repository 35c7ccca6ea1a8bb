//! Payloads stay private: a value of a field marked `#[event(sensitive)]`, and any payload
//! value a decode error would quote, never reaches the captured logs and spans (every level,
//! span fields included) or the output of the standalone `events` tool — `dlq show` withholds
//! the payload, `--payload` masks the sensitive field by the database's catalog — and the
//! schema catalog marks the field `x-sensitive`. On SQLite and on the real PostgreSQL server
//! (`EVENTS_TEST_POSTGRES_URL`).

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
use event_runtime::inbox::{Incoming, Origin, Verdict};
use event_runtime::schema::Catalog;
use event_runtime::{DeadLetterReason, Dispatcher, Outbox, Registry};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
#[event(name = "privtest.customer_registered", version = 1)]
struct CustomerRegistered {
    #[event(aggregate_id)]
    customer_id: String,
    #[event(sensitive)]
    email_address: String,
    age: u32,
    country: String,
}

/// The value that must never be printed.
const SECRET: &str = "SECRET-7731@example.com";
/// A value quoted by serde when it refuses it.
const QUOTED: &str = "SECRET-AGE-4410";

#[event_handler(name = "privtest.crm")]
async fn crm(_: &Envelope<CustomerRegistered>) -> Result<(), HandlerError> {
    Err(HandlerError::permanent_msg("the CRM refused the customer"))
}

/// Everything the subscriber is given, as text: every event with its fields and the fields
/// of the spans around it, and every span's creation and close with its fields.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

async fn events(db: &common::Db, args: &[&str]) -> (String, String) {
    let mut argv: Vec<String> = vec!["events".into()];
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    argv.extend(db.cli_args());
    let (ok, out, err) = common::events_tool(argv.clone()).await;
    assert!(ok, "{argv:?}: {err}");
    (out, err)
}

fn registered(customer: &str, data: serde_json::Value, seq: u64) -> Incoming {
    let envelope = Envelope::new(CustomerRegistered {
        customer_id: customer.into(),
        email_address: "x".into(),
        age: 1,
        country: "x".into(),
    })
    .with_sequence(seq)
    .with_source("urn:test:signup");
    let mut json = serde_json::to_value(&envelope).unwrap();
    json["data"] = data;
    Incoming::new(
        serde_json::to_vec(&json).unwrap(),
        Origin::new("queue", "signup", seq),
    )
}

#[test]
fn the_catalog_marks_the_sensitive_field() {
    let registry = Registry::builder()
        .event::<CustomerRegistered>()
        .build()
        .unwrap();
    let catalog = Catalog::from_registry(&registry);
    let schema = &catalog.events[0].schema;
    assert_eq!(
        schema["properties"]["emailAddress"]["x-sensitive"],
        serde_json::json!(true),
        "{schema}"
    );
    assert!(schema["properties"]["age"].get("x-sensitive").is_none());
    assert_eq!(CustomerRegistered::SENSITIVE_FIELDS, ["emailAddress"]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_sensitive_value_never_reaches_logs_spans_or_the_events_tool() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::FULL)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    for db in common::databases("privacy").await {
        let label = db.label();
        let store = db.open().await;
        let outbox = Outbox::builder(store.clone())
            .dispatcher(Dispatcher::builder_empty().handler::<crm>())
            .build()
            .unwrap();
        // A good event (its handler refuses it: a dead letter with the whole payload) and a
        // bad one whose refused value serde would quote.
        let r = outbox
            .receive(
                "queue:signup",
                vec![
                    registered(
                        "C-1",
                        serde_json::json!({"customerId": "C-1", "emailAddress": SECRET, "age": 41, "country": "Norway"}),
                        1,
                    ),
                    registered(
                        "C-2",
                        serde_json::json!({"customerId": "C-2", "emailAddress": SECRET, "age": QUOTED, "country": "Chile"}),
                        1,
                    ),
                    // A version this service does not know (a newer producer's).
                    {
                        let mut json: serde_json::Value = serde_json::from_slice(
                            &registered(
                                "C-3",
                                serde_json::json!({"customerId": "C-3", "emailAddress": SECRET, "age": 3, "country": "Peru"}),
                                1,
                            )
                            .body,
                        )
                        .unwrap();
                        json["schemaversion"] = 9.into();
                        Incoming::new(
                            serde_json::to_vec(&json).unwrap(),
                            Origin::new("queue", "signup", 3),
                        )
                    },
                ],
            )
            .await;
        assert_eq!(
            r.verdicts,
            [
                Verdict::Accepted,
                Verdict::DeadLettered(DeadLetterReason::Undecodable),
                Verdict::DeadLettered(DeadLetterReason::UnknownEvent)
            ],
            "{label}"
        );
        // The workers record the catalog when they start, then deliver.
        let workers = outbox.spawn_workers(1);
        tokio::time::timeout(Duration::from_secs(20), async {
            while store.dead_letters(&Default::default()).await.unwrap().len() < 3 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("both dead-lettered");
        workers.shutdown(Duration::from_secs(10)).await.unwrap();
        let catalog = store.catalog().await.unwrap();
        assert_eq!(catalog.len(), 1, "{label}");
        assert_eq!(catalog[0].sensitive, ["emailAddress"], "{label}");

        let dead = store.dead_letters(&Default::default()).await.unwrap();
        let undecodable = dead
            .iter()
            .find(|d| d.reason == DeadLetterReason::Undecodable)
            .unwrap();
        let permanent = dead
            .iter()
            .find(|d| d.reason == DeadLetterReason::Permanent)
            .unwrap();
        let chain = undecodable.error_chain.join(" / ");
        assert!(
            chain.contains("(value withheld), expected u32"),
            "{label}: {chain}"
        );
        assert!(!chain.contains(QUOTED), "{label}: {chain}");

        // The standalone tool: no payload without --payload; with it, the sensitive field
        // masked by the catalog the workers recorded, the rest printed.
        let id = permanent.id.to_string();
        let (show, _) = events(&db, &["dlq", "show", &id]).await;
        assert!(show.contains("payload withheld"), "{label}: {show}");
        assert!(!show.contains("Norway"), "{label}: {show}");
        let (list, _) = events(&db, &["dlq", "list", "--json"]).await;
        assert!(
            !list.contains("Norway") && !list.contains("Chile"),
            "{label}: {list}"
        );
        let (shown, warning) = events(&db, &["dlq", "show", &id, "--payload"]).await;
        assert!(
            shown.contains("Norway") && shown.contains("\"emailAddress\": \"***\""),
            "{label}: {shown}"
        );
        assert!(warning.is_empty(), "{label}: {warning}");
        let (listed, _) = events(&db, &["dlq", "list", "--json", "--payload"]).await;
        assert!(listed.contains("Norway"), "{label}: {listed}");
        let (shown_json, _) = events(&db, &["dlq", "show", &id, "--json", "--payload"]).await;
        let (bad, _) = events(
            &db,
            &["dlq", "show", &undecodable.id.to_string(), "--payload"],
        )
        .await;
        assert!(bad.contains("(value withheld)"), "{label}: {bad}");
        // v9 is in no catalog: masked by what v1 marks, with a warning.
        let newer = dead
            .iter()
            .find(|d| d.reason == DeadLetterReason::UnknownEvent)
            .unwrap();
        let (newer_shown, warning) =
            events(&db, &["dlq", "show", &newer.id.to_string(), "--payload"]).await;
        assert!(
            newer_shown.contains("Peru") && newer_shown.contains("\"emailAddress\": \"***\""),
            "{label}: {newer_shown}"
        );
        assert!(
            warning.contains("v9 is in no catalog"),
            "{label}: {warning}"
        );
        let (_, warning) = events(&db, &["dlq", "list", "--json", "--payload"]).await;
        assert!(
            warning.contains("v9 is in no catalog"),
            "{label}: {warning}"
        );
        for (what, text) in [
            ("dlq show", &show),
            ("dlq list --json", &list),
            ("dlq show --payload", &shown),
            ("dlq list --json --payload", &listed),
            ("dlq show --json --payload", &shown_json),
            ("dlq show --payload (undecodable)", &bad),
            ("dlq show --payload (unknown version)", &newer_shown),
        ] {
            assert!(!text.contains(SECRET), "{label}: {what}: {text}");
            assert!(
                !text.contains(QUOTED) || what.contains("--payload"),
                "{label}: {what}: {text}"
            );
        }
        store.close().await;
    }
    let logs = captured.text();
    assert!(
        logs.contains("privtest.crm"),
        "the capture saw the deliveries: {logs}"
    );
    assert!(!logs.contains(SECRET), "{logs}");
    assert!(!logs.contains(QUOTED), "{logs}");
}

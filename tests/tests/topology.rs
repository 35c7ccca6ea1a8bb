//! The application's topology as documents: `events asyncapi` writes an AsyncAPI 3.0.0
//! document that the official parser (`@asyncapi/parser`, run with Node.js) accepts — the
//! examples' committed documents too — and `events flow` a Mermaid picture that, with
//! `--database`, shows each handler's backlog, dead letters and pause (SQLite and the real
//! PostgreSQL server). Both are the same text on every run, and `--check FILE` fails on a stale
//! copy.
//!
//! The parser runs from `tests/asyncapi` (`npm ci --prefix tests/asyncapi`, which `.ci/run`
//! does). Without Node.js or that install the parser cases say they were skipped; with
//! `EVENTS_TEST_REQUIRE_SERVICES=1` they fail instead.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
use event_runtime::cli::{run_with_output, App};
use event_runtime::topology::{self, Topology};
use event_runtime::transport::nats::{InboxConfig, RelayConfig};
use event_runtime::{Dispatcher, HandlerOptions, Outbox, OutboxConfig, Registry, RetryPolicy};
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent, schemars::JsonSchema)]
#[event(name = "topotest.shipment.created", version = 1)]
struct CreatedV1 {
    #[event(aggregate_id)]
    shipment: String,
}

/// A nested type, so that schemars writes `$defs`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
struct Address {
    street: String,
    country: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent, schemars::JsonSchema)]
#[event(name = "topotest.shipment.created", version = 2, upcast_from = CreatedV1)]
struct CreatedV2 {
    #[event(aggregate_id)]
    shipment: String,
    #[event(sensitive)]
    recipient: String,
    to: Address,
    from: Option<Address>,
}

impl From<CreatedV1> for CreatedV2 {
    fn from(v1: CreatedV1) -> Self {
        CreatedV2 {
            shipment: v1.shipment,
            recipient: String::new(),
            to: Address {
                street: String::new(),
                country: String::new(),
            },
            from: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent, schemars::JsonSchema)]
#[event(name = "topotest.shipment.delivered", version = 1)]
struct Delivered {
    #[event(aggregate_id)]
    shipment: String,
}

/// Two names whose identifiers would meet (`.` and `_` both become `_`).
#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent, schemars::JsonSchema)]
#[event(name = "topotest.order_placed", version = 1)]
struct DotUnderscore {
    #[event(aggregate_id)]
    order: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent, schemars::JsonSchema)]
#[event(name = "topotest_order.placed", version = 1)]
struct UnderscoreDot {
    #[event(aggregate_id)]
    order: String,
    total: u64,
}

/// A definition whose name a JSON Pointer must escape and a URI percent-encode.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename = "Money/Amount Ü")]
struct Money {
    cents: i64,
}

/// A recursive event: schemars refers to the schema itself as `#`.
#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent, schemars::JsonSchema)]
#[event(name = "topotest.comment.posted", version = 1)]
struct CommentPosted {
    #[event(aggregate_id)]
    comment: String,
    tip: Option<Money>,
    replies: Vec<CommentPosted>,
}

fn odd_registry() -> Registry {
    Registry::builder()
        .event::<DotUnderscore>()
        .event::<UnderscoreDot>()
        .event::<CommentPosted>()
        .build()
        .unwrap()
}

fn odd_topology() -> Topology {
    Topology::new("odd", "1.0.0").nats_relay(&RelayConfig::new("ODD"))
}

#[event_handler(name = "topotest.label", in_transaction)]
fn label(_: &CreatedV2) -> Result<(), HandlerError> {
    Ok(())
}

#[event_handler(name = "topotest.track")]
async fn track(_: &Envelope<CreatedV2>) -> Result<(), HandlerError> {
    Ok(())
}

#[event_handler(name = "topotest.notify")]
async fn notify(_: &Envelope<Delivered>) -> Result<(), HandlerError> {
    Err(HandlerError::permanent_msg("the mail server refused it"))
}

fn registry() -> Registry {
    Registry::builder()
        .event::<CreatedV1>()
        .event::<CreatedV2>()
        .event::<Delivered>()
        .handler::<label>()
        .handler::<track>()
        .handler::<notify>()
        .build()
        .unwrap()
}

const NOTIFY_RETRY: RetryPolicy = RetryPolicy {
    max_attempts: 3,
    initial_backoff: Duration::from_millis(250),
    max_backoff: Duration::from_secs(4),
};

/// A producer's relay: partitioned, with the aggregate token, one event on a subject of its
/// own; on a server whose URL has a password.
fn producer_relay() -> RelayConfig {
    RelayConfig::new("SHIPPING")
        .subject_prefix("shipping")
        .partitions(4)
        .aggregate_token(true)
        .subject("topotest.shipment.delivered", "deliveries.done")
}

fn producer() -> Topology {
    Topology::new("shipping", "2.1.0")
        .outbox_config(&OutboxConfig::default())
        .handler_options(
            "topotest.notify",
            &HandlerOptions::new().retry(NOTIFY_RETRY),
        )
        .server("nats", "nats://svc:hunter2@broker.internal:4222")
        .nats_relay(&producer_relay())
}

/// A consumer's inbox on `shipping.topotest.>`: it receives `created` (both versions), not
/// `delivered` (on `deliveries.done`), whose handler stays local.
fn consumer() -> Topology {
    Topology::new("tracking", "0.3.0")
        .outbox_config(&OutboxConfig::default().retry(RetryPolicy {
            max_attempts: 9,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
        }))
        .server("nats", "nats://127.0.0.1:4222")
        .nats_inbox(
            &InboxConfig::new("SHIPPING", "tracking")
                .filter_subject("shipping.topotest.>")
                .partitions(4),
            &producer_relay(),
        )
}

fn text(doc: &Value) -> String {
    serde_json::to_string_pretty(doc).unwrap()
}

#[test]
fn the_asyncapi_document_has_channels_operations_messages_and_the_delivery_extensions() {
    let registry = registry();
    let doc = topology::asyncapi(&registry, &producer());
    assert_eq!(doc["asyncapi"], "3.0.0");
    assert_eq!(doc["info"]["title"], "shipping");
    assert_eq!(doc["info"]["version"], "2.1.0");
    // The server without its credentials.
    assert_eq!(doc["servers"]["nats"]["host"], "broker.internal:4222");
    assert_eq!(doc["servers"]["nats"]["protocol"], "nats");
    assert!(!text(&doc).contains("hunter2"), "the password leaked");

    // Channels: the partition and the aggregate as parameters; the override kept.
    let created = &doc["channels"]["shipping_topotest_shipment_created"];
    assert_eq!(
        created["address"],
        "shipping.{partition}.topotest.shipment.created.{aggregate}"
    );
    assert_eq!(
        created["parameters"]["partition"]["enum"],
        serde_json::json!(["0", "1", "2", "3"])
    );
    assert!(created["parameters"]["aggregate"]["description"].is_string());
    assert_eq!(created["x-events-stream"], "SHIPPING");
    let versions: Vec<&String> = created["messages"].as_object().unwrap().keys().collect();
    assert_eq!(
        versions,
        [
            "topotest_shipment_created_v1",
            "topotest_shipment_created_v2"
        ]
    );
    assert_eq!(
        doc["channels"]["deliveries_done"]["address"],
        "deliveries.{partition}.done.{aggregate}"
    );

    // One send operation per channel, the newest version, the relay's retry limits.
    let send = &doc["operations"]["send_shipping_topotest_shipment_created"];
    assert_eq!(send["action"], "send");
    assert_eq!(
        send["channel"]["$ref"],
        "#/channels/shipping_topotest_shipment_created"
    );
    assert_eq!(
        send["messages"],
        serde_json::json!([{
            "$ref": "#/channels/shipping_topotest_shipment_created/messages/topotest_shipment_created_v2"
        }])
    );
    assert_eq!(send["x-events-relay"]["destination"], "nats:SHIPPING");
    assert_eq!(send["x-events-retry"]["maxAttempts"], 6);
    assert_eq!(send["x-events-dead-letter"]["handler"], "nats:SHIPPING");
    assert_eq!(doc["operations"].as_object().unwrap().len(), 2);

    // Messages: the CloudEvents envelope around the payload's schema, its definitions moved
    // to the components and the sensitive field marked.
    let message = &doc["components"]["messages"]["topotest_shipment_created_v2"];
    assert_eq!(message["name"], "topotest.shipment.created");
    assert_eq!(message["contentType"], "application/cloudevents+json");
    assert_eq!(message["x-events-upcast-from"], 1);
    assert_eq!(
        message["x-events-sensitive-fields"],
        serde_json::json!(["recipient"])
    );
    let payload = &message["payload"];
    assert_eq!(
        payload["properties"]["type"]["const"],
        "topotest.shipment.created"
    );
    assert_eq!(payload["properties"]["schemaversion"]["const"], 2);
    assert_eq!(
        payload["properties"]["data"]["$ref"],
        "#/components/schemas/topotest_shipment_created_v2"
    );
    assert!(message["headers"]["properties"]["Nats-Msg-Id"].is_object());
    let schema = &doc["components"]["schemas"]["topotest_shipment_created_v2"];
    assert_eq!(schema["properties"]["recipient"]["x-sensitive"], true);
    assert_eq!(
        schema["properties"]["to"]["$ref"],
        "#/components/schemas/Address"
    );
    assert_eq!(
        doc["components"]["schemas"]["Address"]["properties"]["street"]["type"],
        "string"
    );
    let whole = text(&doc);
    assert!(
        !whole.contains("\"$defs\""),
        "a definition stayed in place: {whole}"
    );
    assert!(!whole.contains("$schema"), "a schema kept its $schema");

    // Handlers of the producer's own events are local: their delivery, retry and dead letters.
    let local = doc["x-events-local-handlers"].as_array().unwrap();
    let by_name = |name: &str| {
        local
            .iter()
            .find(|h| h["handler"]["name"] == name)
            .unwrap_or_else(|| panic!("{name} is not a local handler: {local:?}"))
    };
    assert_eq!(
        by_name("topotest.label")["handler"]["delivery"],
        "in-transaction"
    );
    assert!(by_name("topotest.label")["x-events-retry"].is_null());
    assert_eq!(
        by_name("topotest.notify")["x-events-retry"]["maxAttempts"],
        3
    );
    assert_eq!(
        by_name("topotest.notify")["x-events-retry"]["initialBackoffMs"],
        250
    );
    assert_eq!(
        by_name("topotest.notify")["x-events-dead-letter"]["handler"],
        "topotest.notify"
    );
    assert_eq!(
        by_name("topotest.track")["x-events-retry"]["maxAttempts"],
        5
    );

    // The same text on every run.
    assert_eq!(whole, text(&topology::asyncapi(&registry, &producer())));
}

#[test]
fn an_inbox_receives_what_its_filter_takes_and_each_handler_is_an_operation() {
    let doc = topology::asyncapi(&registry(), &consumer());
    let operations = doc["operations"].as_object().unwrap();
    let mut ids: Vec<&String> = operations.keys().collect();
    ids.sort();
    assert_eq!(
        ids,
        [
            "receive_topotest_label_shipping_topotest_shipment_created",
            "receive_topotest_track_shipping_topotest_shipment_created",
        ]
    );
    let track = &operations["receive_topotest_track_shipping_topotest_shipment_created"];
    assert_eq!(track["action"], "receive");
    // Both versions: v1 reaches the handler through its upcaster.
    assert_eq!(track["messages"].as_array().unwrap().len(), 2);
    assert_eq!(track["x-events-retry"]["maxAttempts"], 9);
    assert_eq!(track["x-events-dead-letter"]["handler"], "topotest.track");
    assert_eq!(track["x-events-inbox"]["durable"], "tracking");
    assert_eq!(
        track["x-events-inbox"]["filterSubject"],
        "shipping.topotest.>"
    );
    assert_eq!(
        track["x-events-inbox"]["deadLetter"]["handler"],
        "nats-inbox:tracking"
    );
    // An in-transaction handler's refusal is the inbox's dead letter.
    let label = &operations["receive_topotest_label_shipping_topotest_shipment_created"];
    assert!(label["x-events-retry"].is_null());
    assert_eq!(
        label["x-events-dead-letter"]["handler"],
        "nats-inbox:tracking"
    );
    // `delivered` travels on a subject outside the filter: its handler is local.
    assert!(doc["channels"].get("deliveries_done").is_none());
    let local = doc["x-events-local-handlers"].as_array().unwrap();
    assert_eq!(local.len(), 1);
    assert_eq!(local[0]["handler"]["name"], "topotest.notify");
}

/// `node tests/asyncapi/validate.mjs FILES…`, or `None` after saying why it cannot run
/// (failing with `EVENTS_TEST_REQUIRE_SERVICES=1`).
fn validate(test: &str, files: &[PathBuf]) -> Option<std::process::Output> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("asyncapi");
    let require = std::env::var("EVENTS_TEST_REQUIRE_SERVICES").as_deref() == Ok("1");
    let why = if !dir.join("node_modules/@asyncapi/parser").exists() {
        Some(format!(
            "the AsyncAPI parser is not installed: run `npm ci --prefix {}`",
            dir.display()
        ))
    } else {
        None
    };
    let output = match why {
        Some(why) => Err(why),
        None => Command::new("node")
            .arg(dir.join("validate.mjs"))
            .arg("--")
            .args(files)
            .output()
            .map_err(|e| format!("cannot run node (Node.js 20 or later): {e}")),
    };
    match output {
        Ok(output) => Some(output),
        Err(why) => {
            assert!(!require, "{test}: EVENTS_TEST_REQUIRE_SERVICES=1 but {why}");
            common::say_once(
                "AsyncAPI",
                &format!("AsyncAPI parser cases skipped ({test} and others): {why}"),
            );
            None
        }
    }
}

fn write(test: &str, name: &str, doc: &Value) -> PathBuf {
    let path = common::temp_dir().join(format!("{}-{name}.asyncapi.json", common::unique(test)));
    std::fs::write(&path, text(doc)).unwrap();
    path
}

#[test]
fn the_official_parser_accepts_the_documents_and_refuses_a_broken_one() {
    const TEST: &str = "asyncapi_parser";
    let registry = registry();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let files = vec![
        write(
            TEST,
            "producer",
            &topology::asyncapi(&registry, &producer()),
        ),
        write(
            TEST,
            "consumer",
            &topology::asyncapi(&registry, &consumer()),
        ),
        write(
            TEST,
            "odd",
            &topology::asyncapi(&odd_registry(), &odd_topology()),
        ),
        write(
            TEST,
            "rabbitmq",
            &topology::asyncapi(&registry, &rabbitmq_producer()),
        ),
        examples.join("orders.asyncapi.json"),
        examples.join("billing.asyncapi.json"),
    ];
    let Some(output) = validate(TEST, &files) else {
        return;
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the parser refused: {stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(stdout.matches("ok: ").count(), 6, "{stdout}{stderr}");
    // Nothing but the note that 3.1.0 exists (3.0.0 is what Backstage and others read).
    for line in stderr.lines() {
        assert!(
            line.contains("asyncapi-latest-version"),
            "a diagnostic: {line}"
        );
    }

    // The check can fail: an operation whose message is not its channel's.
    let mut broken = topology::asyncapi(&registry, &producer());
    broken["operations"]["send_shipping_topotest_shipment_created"]["messages"] =
        serde_json::json!([{ "$ref": "#/components/messages/topotest_shipment_created_v2" }]);
    let output = validate(TEST, &[write(TEST, "broken", &broken)]).unwrap();
    assert!(!output.status.success(), "a broken document passed");
}

async fn cli(app: App<'_>, args: &[&str]) -> (ExitCode, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let argv = std::iter::once("events").chain(args.iter().copied());
    let code = run_with_output(argv, app, &mut out, &mut err).await;
    (
        code,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

#[tokio::test]
async fn check_passes_on_the_current_copy_and_fails_on_a_stale_one() {
    let registry = registry();
    let topology = producer();
    let app = App::embedded("shipping events", &registry).topology(&topology);
    for command in ["asyncapi", "flow"] {
        let (code, current, err) = cli(app, &[command]).await;
        assert_eq!(code, ExitCode::SUCCESS, "{err}");
        assert!(err.is_empty(), "{err}");
        let path = common::temp_dir().join(format!("{}.{command}", common::unique(command)));
        std::fs::write(&path, &current).unwrap();
        let file = path.to_str().unwrap();
        let (code, out, err) = cli(app, &[command, "--check", file]).await;
        assert_eq!(code, ExitCode::SUCCESS, "{err}");
        assert!(out.starts_with("ok: "), "{out}");
        // A checkout with CRLF line endings and no final newline is the same copy.
        std::fs::write(&path, current.trim_end().replace('\n', "\r\n")).unwrap();
        let (code, _, err) = cli(app, &[command, "--check", file]).await;
        assert_eq!(code, ExitCode::SUCCESS, "{err}");
        // One line changed: refused, with the line and the command that rewrites it.
        let stale = current.replacen("topotest", "topotest-old", 1);
        let line = current
            .lines()
            .position(|l| l.contains("topotest"))
            .unwrap()
            + 1;
        std::fs::write(&path, stale).unwrap();
        let (code, _, err) = cli(app, &[command, "--check", file]).await;
        assert_eq!(code, ExitCode::FAILURE);
        assert!(
            err.contains(&format!("first difference at line {line}"))
                && err.contains(&format!("shipping events {command} > {file}")),
            "{err}"
        );
        let (code, _, err) = cli(app, &[command, "--check", "/nonexistent/x.json"]).await;
        assert_eq!(code, ExitCode::FAILURE);
        assert!(err.contains("cannot read it"), "{err}");
    }
    // Without the registry (the standalone tool) there is nothing to describe; without a
    // topology, a warning says what is missing.
    let (code, _, err) = cli(App::standalone(), &["asyncapi"]).await;
    assert_eq!(code, ExitCode::FAILURE);
    assert!(err.contains("knows no application event types"), "{err}");
    let (code, out, err) = cli(App::embedded("shipping events", &registry), &["flow"]).await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(err.contains("declares no topology"), "{err}");
    assert!(
        out.contains("shipping_h_topotest_notify") && !out.contains("relay"),
        "{out}"
    );
}

#[test]
fn the_flow_joins_a_producer_and_a_consumer_on_their_subjects() {
    let registry = registry();
    let producer = topology::flow(&registry, &producer(), None);
    let consumer = topology::flow(&registry, &consumer(), None);
    assert!(producer.starts_with("flowchart LR\n"));
    // The subject's id: readable, then a fingerprint of transport, stream and address.
    let subject = producer
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("shipping_relay_nats_SHIPPING --> ")
                .filter(|s| s.starts_with("subject_shipping__partition__topotest_shipment_created"))
        })
        .unwrap_or_else(|| panic!("no relay edge to the created subject in\n{producer}"));
    assert!(
        consumer.contains(&format!("{subject} --> tracking_inbox_tracking")),
        "{consumer}"
    );
    for line in [
        "shipping_agg_topotest([\"aggregate topotest\"])",
        "shipping_ev_topotest_shipment_created_v1 -. upcast .-> shipping_ev_topotest_shipment_created_v2",
        // Thick: in-transaction; thin: after-commit; longer: to the relay.
        "shipping_ev_topotest_shipment_created_v2 ==> shipping_h_topotest_label",
        "shipping_h_topotest_label[\"topotest.label<br/>in-transaction\"]",
        "shipping_ev_topotest_shipment_delivered_v1 --> shipping_h_topotest_notify",
        "shipping_ev_topotest_shipment_created_v2 ---> shipping_relay_nats_SHIPPING",
        "tracking_inbox_tracking --> tracking_ev_topotest_shipment_created_v1",
        // The filter's `>` as Mermaid's entity code, not as markup.
        "filter shipping.topotest.#gt;",
    ] {
        let found = producer.contains(line) || consumer.contains(line);
        assert!(found, "no `{line}` in\n{producer}\n{consumer}");
    }
    assert!(!producer.contains("pending"), "counts without a database");
}

#[tokio::test]
async fn the_flow_shows_backlog_dead_letters_and_pauses_from_the_database() {
    for db in common::databases("flow_live").await {
        let store = db.open().await;
        let outbox = Outbox::builder(store.clone())
            .dispatcher(
                Dispatcher::builder_empty()
                    .event::<CreatedV2>()
                    .event::<Delivered>()
                    .handler::<label>()
                    .handler::<track>()
                    .handler::<notify>(),
            )
            .build()
            .unwrap();
        let commit = |n: &'static str| {
            let outbox = outbox.clone();
            async move {
                let mut uow = outbox.begin().await.unwrap();
                uow.add(Envelope::new(Delivered { shipment: n.into() }));
                uow.commit().await.unwrap();
            }
        };
        commit("s1").await;
        outbox.drain(Duration::from_secs(30)).await.unwrap();
        store
            .pause_destination_audited("topotest.notify", "tester", "mail server down")
            .await
            .unwrap();
        commit("s2").await;
        commit("s3").await;

        let registry = registry();
        let topology = producer();
        let app = App::embedded("shipping events", &registry).topology(&topology);
        let mut args = vec!["flow".to_owned()];
        args.extend(db.cli_args());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, out, err) = cli(app, &args).await;
        assert_eq!(code, ExitCode::SUCCESS, "{}: {err}", db.label());
        let node = out
            .lines()
            .find(|l| l.trim_start().starts_with("shipping_h_topotest_notify["))
            .unwrap_or_else(|| panic!("{}: no notify node in\n{out}", db.label()));
        assert!(
            node.contains("pending 2 (oldest ")
                && node.contains("dead letters 1")
                && node.contains("PAUSED"),
            "{}: {node}",
            db.label()
        );
        let relay = out
            .lines()
            .find(|l| l.contains("shipping_relay_nats_SHIPPING[["))
            .unwrap();
        assert!(relay.contains("pending 0 · dead letters 0"), "{relay}");
        // `track` has no delivery of `delivered`: nothing pending, nothing dead.
        let track = out
            .lines()
            .find(|l| l.trim_start().starts_with("shipping_h_topotest_track["))
            .unwrap();
        assert!(track.contains("pending 0 · dead letters 0") && !track.contains("PAUSED"));

        // An application that no longer has `notify`: the flow says what it does not show.
        let without = Registry::builder()
            .event::<CreatedV2>()
            .event::<Delivered>()
            .handler::<track>()
            .build()
            .unwrap();
        let app = App::embedded("shipping events", &without).topology(&topology);
        let (code, _, err) = cli(app, &args).await;
        assert_eq!(code, ExitCode::SUCCESS, "{err}");
        assert!(
            err.contains("does not show: topotest.notify (2 pending, 1 dead letters)"),
            "{}: {err}",
            db.label()
        );
    }
}

#[test]
fn names_that_meet_as_identifiers_stay_apart_and_references_stay_in_the_document() {
    let registry = odd_registry();
    let doc = topology::asyncapi(&registry, &odd_topology());
    let messages = doc["components"]["messages"].as_object().unwrap();
    let names: Vec<&str> = messages
        .values()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        messages.len(),
        3,
        "{:?}",
        messages.keys().collect::<Vec<_>>()
    );
    assert!(names.contains(&"topotest.order_placed") && names.contains(&"topotest_order.placed"));
    // Each channel carries its own event's message.
    for channel in doc["channels"].as_object().unwrap().values() {
        let title = channel["title"].as_str().unwrap();
        for reference in channel["messages"].as_object().unwrap().values() {
            let id = reference["$ref"]
                .as_str()
                .unwrap()
                .rsplit('/')
                .next()
                .unwrap();
            assert_eq!(messages[id]["name"], title, "{channel}");
        }
    }
    // Every reference points inside the document's components, and resolves.
    fn refs<'v>(value: &'v Value, out: &mut Vec<&'v str>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(r)) = map.get("$ref") {
                    out.push(r);
                }
                map.values().for_each(|v| refs(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    refs(&doc["components"], &mut found);
    assert!(found.len() >= 4, "{found:?}");
    for r in found {
        let pointer = r
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("{r} leaves the document"));
        assert!(pointer.starts_with("/components/"), "{r}");
        assert!(doc.pointer(pointer).is_some(), "{r} does not resolve");
    }
    let comment = doc["components"]["schemas"]["topotest_comment_posted_v1"].clone();
    assert_eq!(
        comment["properties"]["replies"]["items"]["$ref"],
        "#/components/schemas/topotest_comment_posted_v1"
    );

    // In the flow too: two event nodes, three subjects.
    let flow = topology::flow(&registry, &odd_topology(), None);
    assert!(
        flow.contains("odd_ev_topotest_order_placed_v1[\"topotest.order_placed v1\"]"),
        "{flow}"
    );
    assert!(
        flow.contains("odd_ev_topotest_order_placed_v1_2[\"topotest_order.placed v1\"]"),
        "{flow}"
    );
    let subjects = flow
        .lines()
        .filter(|l| l.trim_start().starts_with("subject_"))
        .count();
    assert_eq!(subjects, 3, "{flow}");
    // A title that is a Mermaid keyword on its own never becomes an id on its own.
    let keyword = topology::flow(&registry, &Topology::new("default", "1"), None);
    assert!(
        keyword.contains("subgraph default_service[\"default\"]"),
        "{keyword}"
    );
}

#[tokio::test]
async fn options_and_inboxes_that_fit_nothing_are_warned_about() {
    let registry = registry();
    let topology = consumer()
        .handler_options("topotest.notfy", &HandlerOptions::new().retry(NOTIFY_RETRY))
        .nats_inbox(
            &InboxConfig::new("SHIPPING", "nobody").filter_subject("nothing.>"),
            &producer_relay(),
        );
    let warnings = topology.warnings(&registry);
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings[0].contains("handler_options(\"topotest.notfy\")"));
    assert!(warnings[1].contains("inbox nats-inbox:nobody (filter nothing.>) receives none"));
    let app = App::embedded("tracking events", &registry).topology(&topology);
    let (code, _, err) = cli(app, &["asyncapi"]).await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(
        err.contains("warning: handler_options(\"topotest.notfy\")"),
        "{err}"
    );
    // A relay's options are its own: they replace its configuration's retry policy.
    let doc = topology::asyncapi(
        &registry,
        &producer().handler_options("nats:SHIPPING", &HandlerOptions::new().retry(NOTIFY_RETRY)),
    );
    let send = &doc["operations"]["send_shipping_topotest_shipment_created"];
    assert_eq!(send["x-events-retry"]["maxAttempts"], 3);
}

/// A producer whose relay is RabbitMQ's.
fn rabbitmq_producer() -> Topology {
    Topology::new("shipping", "2.1.0")
        .server("rabbitmq", "amqp://guest:guest@127.0.0.1:5672/%2f")
        .amqp_relay(
            &event_runtime::transport::rabbitmq::RelayConfig::new("shipping")
                .routing_key("topotest.shipment.delivered", "done.delivered"),
        )
}

#[test]
fn a_rabbitmq_relay_publishes_on_routing_keys_of_its_exchange() {
    let registry = registry();
    let doc = topology::asyncapi(&registry, &rabbitmq_producer());
    assert_eq!(doc["servers"]["rabbitmq"]["protocol"], "amqp");
    assert_eq!(doc["servers"]["rabbitmq"]["host"], "127.0.0.1:5672");
    let created = &doc["channels"]["events_topotest_shipment_created"];
    assert_eq!(created["address"], "events.topotest.shipment.created");
    assert!(
        created["description"]
            .as_str()
            .unwrap()
            .contains("RabbitMQ exchange `shipping`"),
        "{created}"
    );
    assert_eq!(created["servers"][0]["$ref"], "#/servers/rabbitmq");
    assert_eq!(
        doc["channels"]["done_delivered"]["address"],
        "done.delivered"
    );
    let send = &doc["operations"]["send_events_topotest_shipment_created"];
    assert_eq!(send["x-events-relay"]["destination"], "amqp:shipping");
    let message = &doc["components"]["messages"]["topotest_shipment_created_v2"];
    assert!(message["headers"]["properties"]["message-id"].is_object());
    let flow = topology::flow(&registry, &rabbitmq_producer(), None);
    assert!(
        flow.contains("relay amqp:shipping<br/>exchange shipping"),
        "{flow}"
    );
}

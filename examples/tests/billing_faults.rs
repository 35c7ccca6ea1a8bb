//! The built `billing` binary never ends a broker fault in a silent success, and starts with
//! any number of instances at once: two instances starting together on a fresh PostgreSQL
//! database both start (10 tries out of 10), a stream deleted and created anew ends the next
//! run with an error naming both identities, and a broker stopped while it runs ends it with an
//! error instead of a partial summary. `billing events dlq replay` replays an inbox dead letter
//! with no broker.
//!
//! Needs `EVENTS_TEST_NATS_URL` (and `EVENTS_TEST_POSTGRES_URL` for the PostgreSQL case) and the
//! built examples (`cargo test -p examples` builds them); says why it is skipped without them,
//! and fails instead with `EVENTS_TEST_REQUIRE_SERVICES=1`.

#[path = "../../tests/tests/common/nats_server.rs"]
mod nats_server;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use nats_server::OwnServer;

fn require() -> bool {
    std::env::var("EVENTS_TEST_REQUIRE_SERVICES").as_deref() == Ok("1")
}

fn skip(test: &str, why: &str) {
    assert!(!require(), "{test}: {why}");
    let _ = writeln!(std::io::stderr(), "note: {test}: skipped: {why}");
}

fn env(test: &str, name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            skip(test, &format!("{name} is not set"));
            None
        }
    }
}

fn billing_binary(test: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe
        .parent()?
        .parent()?
        .join("examples")
        .join(format!("billing{}", std::env::consts::EXE_SUFFIX));
    if bin.exists() {
        return Some(bin);
    }
    skip(
        test,
        "the billing example is not built (`cargo test -p examples` builds it)",
    );
    None
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Creates (again) the stream `stream` on `<prefix>.>` at `url`.
fn create_stream(url: &str, stream: &str, prefix: &str, delete_first: bool) {
    runtime().block_on(async {
        let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
        if delete_first {
            js.delete_stream(stream).await.unwrap();
        }
        js.create_stream(async_nats::jetstream::stream::Config {
            name: stream.into(),
            subjects: vec![format!("{prefix}.>")],
            ..Default::default()
        })
        .await
        .unwrap();
    });
}

fn billing(
    bin: &PathBuf,
    url: &str,
    stream: &str,
    prefix: &str,
    db: &[&str],
    idle: &str,
) -> Command {
    let mut c = Command::new(bin);
    c.args([
        "--nats",
        url,
        "--stream",
        stream,
        "--subject-prefix",
        prefix,
    ])
    .args(["--idle-exit", idle])
    .args(db)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    c
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn unique(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::now_v7().simple())
}

#[test]
fn two_instances_start_together_on_a_fresh_postgres_database_every_time() {
    let test = "two_instances_start_together";
    let (Some(nats), Some(pg), Some(bin)) = (
        env(test, "EVENTS_TEST_NATS_URL"),
        env(test, "EVENTS_TEST_POSTGRES_URL"),
        billing_binary(test),
    ) else {
        return;
    };
    for i in 0..10 {
        let (stream, prefix, schema) = (unique("BT"), unique("bt"), unique("billing_start_"));
        create_stream(&nats, &stream, &prefix, false);
        let db = ["--database", &pg, "--schema", &schema];
        let a = billing(&bin, &nats, &stream, &prefix, &db, "1")
            .spawn()
            .unwrap();
        let b = billing(&bin, &nats, &stream, &prefix, &db, "1")
            .spawn()
            .unwrap();
        for (which, child) in [("first", a), ("second", b)] {
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "try {i}: the {which} instance failed to start:\n{}",
                text(&out)
            );
        }
    }
}

#[test]
fn a_stream_created_anew_ends_the_next_run_with_an_error_naming_both_identities() {
    let test = "stream_created_anew";
    let (Some(nats), Some(bin)) = (env(test, "EVENTS_TEST_NATS_URL"), billing_binary(test)) else {
        return;
    };
    let (stream, prefix) = (unique("BW"), unique("bw"));
    let dir = std::env::temp_dir().join(unique("billing-wiped-"));
    std::fs::create_dir_all(&dir).unwrap();
    let database = format!("sqlite://{}", dir.join("billing.db").display());
    let db = ["--database", database.as_str()];
    create_stream(&nats, &stream, &prefix, false);
    let first = billing(&bin, &nats, &stream, &prefix, &db, "1")
        .output()
        .unwrap();
    assert!(first.status.success(), "{}", text(&first));

    create_stream(&nats, &stream, &prefix, true);
    let again = billing(&bin, &nats, &stream, &prefix, &db, "1")
        .output()
        .unwrap();
    let shown = text(&again);
    assert!(!again.status.success(), "must not exit 0:\n{shown}");
    assert!(
        !String::from_utf8_lossy(&again.stdout).contains("invoices"),
        "no summary:\n{shown}"
    );
    assert!(
        shown.contains("recorded: stream") && shown.contains("found: stream"),
        "names both identities:\n{shown}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_broker_stopped_while_billing_runs_ends_it_with_an_error_not_a_partial_summary() {
    let test = "broker_stopped";
    let (Some(_), Some(bin)) = (env(test, "EVENTS_TEST_NATS_URL"), billing_binary(test)) else {
        return;
    };
    let Some(mut server) = OwnServer::start() else {
        return;
    };
    runtime().block_on(server.client());
    let (stream, prefix) = ("EVENTS", "events");
    create_stream(&server.url(), stream, prefix, false);
    let dir = std::env::temp_dir().join(unique("billing-stopped-"));
    std::fs::create_dir_all(&dir).unwrap();
    let database = format!("sqlite://{}", dir.join("billing.db").display());
    let url = server.url();
    let child = billing(&bin, &url, stream, prefix, &["--database", &database], "3")
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1_500));
    server.down();
    let started = Instant::now();
    let out = child.wait_with_output().unwrap();
    let shown = text(&out);
    assert!(!out.status.success(), "must not exit 0:\n{shown}");
    assert!(
        shown.contains("unreachable") && shown.contains(&server.url()),
        "says the broker is unreachable, with its URL:\n{shown}"
    );
    assert!(
        shown.contains("NATS connection lost"),
        "the connection's loss is logged:\n{shown}"
    );
    assert!(started.elapsed() < Duration::from_secs(60), "{shown}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `billing events dlq replay ID` replays a message billing's inbox dead-lettered — here an
/// `order.shipped` received by a build that did not know that event — through the inbox core,
/// with no broker: the event is committed with its origin, its dead letter resolved, and its
/// delivery to `billing.invoice` waits for billing's workers.
#[test]
fn billing_events_replays_an_inbox_dead_letter_without_a_broker() {
    let test = "billing_events_replay";
    let Some(bin) = billing_binary(test) else {
        return;
    };
    use event_runtime::inbox::{Incoming, Origin, Verdict};
    let path = std::env::temp_dir().join(format!("{}.db", unique("billing_events_")));
    let url = format!("sqlite://{}", path.display());
    let envelope = event_core::Envelope::new(examples::orders::domain::OrderShipped {
        order_id: "CA-2017-1".into(),
        ship_date: chrono::NaiveDate::from_ymd_opt(2017, 1, 3).unwrap(),
        ship_mode: "Same Day".into(),
    })
    .with_sequence(3)
    .with_source("urn:example:orders");
    let id = runtime().block_on(async {
        let store = event_runtime::Store::connect(&url).await.unwrap();
        let unaware = event_runtime::Outbox::builder(store.clone())
            .dispatcher(event_runtime::Dispatcher::builder_empty())
            .build()
            .unwrap();
        let body = serde_json::to_vec(&envelope).unwrap();
        let origin = Origin::new("nats", "EVENTS", 42).attribute("subject", "events.order.shipped");
        let receipt = unaware
            .receive("nats-inbox:billing", vec![Incoming::new(body, origin)])
            .await;
        assert!(matches!(receipt.verdicts[0], Verdict::DeadLettered(_)));
        store.dead_letters(&Default::default()).await.unwrap()[0].id
    });
    let out = Command::new(&bin)
        .args(["events", "--database", &url, "dlq", "replay"])
        .arg(id.to_string())
        .args(["--reason", "order.shipped deployed", "--actor", "ops"])
        .output()
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains(&format!(
            "replayed 1 inbox dead letter through the inbox core: {id} (1 new events"
        )),
        "{t}"
    );
    runtime().block_on(async {
        let store = event_runtime::Store::connect(&url).await.unwrap();
        assert!(store
            .dead_letters(&Default::default())
            .await
            .unwrap()
            .is_empty());
        let origin = store
            .received_origin(envelope.id())
            .await
            .unwrap()
            .expect("the replayed event keeps its origin");
        assert_eq!((origin.source.as_str(), origin.position), ("EVENTS", 42));
        let stats = store.stats().await.unwrap();
        let invoice = stats
            .handlers
            .iter()
            .find(|h| h.handler == "billing.invoice")
            .expect("a delivery to billing.invoice");
        assert_eq!(invoice.pending, 1, "{stats:?}");
    });
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

/// A broker that lost data: billing receives `order.shipped` (sequence 5, naming 4 as its
/// predecessor) with none of the order's earlier events. It never ends in success: the event
/// is held, the run exits 1 saying so; once the wait exceeds `gap_after` the gap is listed
/// (`billing events inbox gaps`), a re-fetch from the stream cannot close it and names the
/// producer's re-publish command, and an operator's accept lets the next run invoice it.
#[test]
fn an_event_whose_predecessors_never_came_ends_billing_with_an_error_then_a_gap() {
    let test = "billing_gap";
    let (Some(bin), Some(url)) = (billing_binary(test), env(test, "EVENTS_TEST_NATS_URL")) else {
        return;
    };
    let stream = unique("GAP");
    let prefix = unique("gap");
    create_stream(&url, &stream, &prefix, false);
    let envelope = event_core::Envelope::new(examples::orders::domain::OrderShipped {
        order_id: "CA-2017-9".into(),
        ship_date: chrono::NaiveDate::from_ymd_opt(2017, 1, 3).unwrap(),
        ship_mode: "Same Day".into(),
    })
    .with_sequence(5)
    .with_source("urn:example:orders");
    let mut body = serde_json::to_value(&envelope).unwrap();
    body["prevsequence"] = "4".into();
    runtime().block_on(async {
        let js = async_nats::jetstream::new(async_nats::connect(&url).await.unwrap());
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Content-Type", "application/cloudevents+json");
        headers.insert("Nats-Msg-Id", envelope.id().to_string().as_str());
        js.publish_with_headers(
            format!("{prefix}.order.shipped"),
            headers,
            serde_json::to_vec(&body).unwrap().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    });
    let path = std::env::temp_dir().join(format!("{}.db", unique("billing_gap_")));
    let db = format!("sqlite://{}", path.display());
    let run = || {
        billing(&bin, &url, &stream, &prefix, &["--database", &db], "2")
            .output()
            .unwrap()
    };
    let out = run();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("1 received events wait for earlier events of their orders that never arrived"),
        "{t}"
    );
    assert!(!t.contains("summary: "), "{t}");

    // Five minutes later (here: an outbox whose gap_after is 0), the wait is a gap.
    runtime().block_on(async {
        let store = event_runtime::Store::connect(&db).await.unwrap();
        let outbox = event_runtime::Outbox::builder(store)
            .dispatcher(event_runtime::Dispatcher::builder_empty())
            .config(event_runtime::OutboxConfig::default().gap_after(Duration::ZERO))
            .build()
            .unwrap();
        assert_eq!(outbox.detect_gaps().await.unwrap().len(), 1);
    });
    let events = |args: &[&str]| {
        let out = Command::new(&bin)
            .args(["events", "--database", &db])
            .args(args)
            .output()
            .unwrap();
        (out.status.success(), text(&out))
    };
    let (ok, t) = events(&["inbox", "gaps"]);
    assert!(ok, "{t}");
    assert!(
        t.contains("order@urn:example:orders CA-2017-9") && t.contains("gap"),
        "{t}"
    );
    let (ok, t) = events(&["dlq", "list"]);
    assert!(ok && t.contains("1 open gap"), "{t}");
    // Billing's own tool re-fetches through its inbox core: the stream holds nothing before
    // event 5 that the consumer has not acknowledged, so the report names the producer's
    // command, and the gap stays open.
    let (ok, t) = events(&[
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
        "the broker lost 1-4",
        "--actor",
        "ops",
    ]);
    assert!(!ok, "{t}");
    let republish = format!(
        "not in the stream: the broker no longer has it; on the producer run: events relay republish --destination nats:{stream} --aggregate order CA-2017-9"
    );
    assert!(t.contains(&republish), "{t}");
    let (ok, t) = events(&["dlq", "list"]);
    assert!(ok && t.contains("1 open gap"), "{t}");
    let (ok, t) = events(&[
        "inbox",
        "gaps",
        "accept",
        "--all-open",
        "--reason",
        "the broker lost 1-4",
        "--actor",
        "ops",
    ]);
    assert!(ok && t.contains("accepted 1 gap(s)"), "{t}");

    let out = run();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("billing: 1 invoices"), "{t}");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    runtime().block_on(async {
        let js = async_nats::jetstream::new(async_nats::connect(&url).await.unwrap());
        let _ = js.delete_stream(&stream).await;
    });
}

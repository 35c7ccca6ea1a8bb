//! CloudEvents interoperability: every envelope the `orders` example stores is a CloudEvents
//! 1.0 structured event that the official CloudEvents Python SDK parses, with `id`, `source`,
//! `type`, `subject`, `time`, the data and every extension attribute unchanged.
//!
//! The example runs on a slice of the bundled CSV into a fresh SQLite database (with
//! re-appended envelopes, `--redeliver-every`), which gives every event type it records:
//! `order.placed` version 2, `order.line_added` and `order.shipped`. Two more envelopes join
//! them: an `order.placed` version 1 committed the way the release before version 2 did (an
//! outbox whose registry knows version 1 only), and a version 2 that carries a correlation id,
//! a causation id and an application header, the extension attributes the example's own
//! envelopes do not use. Every row of `event_outbox.envelope` goes, one per line, to
//! `tests/interop/cloudevents_check.py`, which checks them with the SDK.
//!
//! The SDK is installed by CI (`pip install cloudevents` in `.ci/run`). Without it the test
//! says that it was skipped and why — unless `EVENTS_TEST_REQUIRE_SERVICES=1`, where it fails.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use event_core::Envelope;
use event_runtime::{sqlx, Dispatcher, Outbox, Store};
use examples::orders::domain::{OrderPlaced, OrderPlacedV2};
use examples::orders::{self, Args};

const CHECKER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/interop/cloudevents_check.py"
);

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("orders-cloudevents-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `Ok` when `python3` can import the SDK; otherwise why not.
fn sdk_available() -> Result<(), String> {
    match Command::new("python3")
        .args(["-c", "import cloudevents.core"])
        .output()
    {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "`python3 -c \"import cloudevents.core\"` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .rfind(|l| !l.trim().is_empty())
                .unwrap_or("no error message")
                .trim()
        )),
        Err(e) => Err(format!("cannot run python3: {e}")),
    }
}

/// `true` when the SDK is there. Otherwise fails the test when
/// `EVENTS_TEST_REQUIRE_SERVICES=1`, and else prints that it is skipped, and why.
fn sdk_or_skip(test: &str) -> bool {
    let Err(why) = sdk_available() else {
        return true;
    };
    assert_ne!(
        std::env::var("EVENTS_TEST_REQUIRE_SERVICES").as_deref(),
        Ok("1"),
        "{test}: EVENTS_TEST_REQUIRE_SERVICES=1 but the CloudEvents Python SDK is missing: {why} \
         (pip install cloudevents)"
    );
    eprintln!(
        "{test}: skipped: the CloudEvents Python SDK is missing: {why} (pip install cloudevents)"
    );
    false
}

/// The header and the first `rows` data rows of the bundled file.
fn first_rows(rows: usize) -> PathBuf {
    let bytes = std::fs::read(orders::default_input()).unwrap();
    let out: Vec<u8> = bytes
        .split_inclusive(|&b| b == b'\n')
        .take(rows + 1)
        .flatten()
        .copied()
        .collect();
    let path = temp_dir().join(format!("first-{rows}.csv"));
    std::fs::write(&path, out).unwrap();
    path
}

fn placed(order_id: &str, country: &str) -> OrderPlaced {
    OrderPlaced {
        order_id: order_id.into(),
        customer_id: "ZZ-00001".into(),
        segment: "Consumer".into(),
        region: "West".into(),
        country: country.into(),
        order_date: chrono::NaiveDate::from_ymd_opt(2019, 2, 1).unwrap(),
    }
}

/// Commits the two extra envelopes, each through an outbox without handlers.
async fn commit_extra_envelopes(database: &str) {
    // The release before version 2: its registry knew `order.placed` version 1 only.
    let old = Outbox::builder(Store::connect(database).await.unwrap())
        .dispatcher(Dispatcher::builder_empty().event::<OrderPlaced>())
        .build()
        .unwrap();
    assert!(old
        .dispatcher()
        .registry()
        .event_by_name("order.placed", 2)
        .is_err());
    let v1 = Envelope::new(placed("CA-2019-900001", "Canada")).with_sequence(1);
    let cause = v1.metadata().clone();
    let mut uow = old.begin().await.unwrap();
    uow.add(v1);
    uow.commit().await.unwrap();

    // Version 2 with the extension attributes the example does not set.
    let current = Outbox::builder(Store::connect(database).await.unwrap())
        .dispatcher(Dispatcher::builder_empty().event::<OrderPlacedV2>())
        .build()
        .unwrap();
    let v2 = OrderPlacedV2::from(placed("US-2019-900002", "United States"));
    assert_eq!(v2.currency, "USD");
    let envelope = Envelope::new(v2)
        .with_sequence(1)
        .with_source("urn:orders-example:interop-test")
        .caused_by(&cause)
        .with_header("importfile", "superstore-orders.csv")
        .unwrap();
    let mut uow = current.begin().await.unwrap();
    uow.add(envelope);
    uow.commit().await.unwrap();
}

/// Every stored envelope, in the order they were recorded.
async fn stored_envelopes(database: &str) -> Vec<String> {
    let store = Store::connect(database).await.unwrap();
    sqlx::query_scalar("SELECT envelope FROM event_outbox ORDER BY recorded_at, event_id")
        .fetch_all(event_runtime::store::sqlite::pool(&store).unwrap())
        .await
        .unwrap()
}

/// Runs the checker on `jsonl`: its exit status, its standard output, and both outputs for a
/// failure message.
fn run_checker(jsonl: &Path) -> (std::process::ExitStatus, String, String) {
    let out = Command::new("python3")
        .arg(CHECKER)
        .arg(jsonl)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let both = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    (out.status, stdout, both)
}

#[test]
fn every_envelope_of_the_example_parses_with_the_cloudevents_python_sdk() {
    if !sdk_or_skip("every_envelope_of_the_example_parses_with_the_cloudevents_python_sdk") {
        return;
    }

    let input = first_rows(150);
    let database = format!(
        "sqlite://{}",
        temp_dir()
            .join(format!("{}.db", uuid::Uuid::now_v7().simple()))
            .display()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let report = runtime
        .block_on(orders::run(&Args {
            input,
            database: database.clone(),
            redeliver_every: 3,
            ..Args::default()
        }))
        .unwrap();
    assert!(report.summary.redelivered > 0);
    assert_eq!(
        report.summary.duplicates_skipped,
        report.summary.redelivered
    );
    runtime.block_on(commit_extra_envelopes(&database));
    let envelopes = runtime.block_on(stored_envelopes(&database));
    assert_eq!(
        envelopes.len() as u64,
        report.summary.events_dispatched + 2,
        "the example's events, each once, and the two extra envelopes"
    );

    // What the file holds, read here as plain JSON: every event type and version of the
    // example, and the extension attributes beyond the three every envelope carries.
    let mut kinds = BTreeSet::new();
    let mut extensions = BTreeSet::new();
    for e in &envelopes {
        let v: serde_json::Value = serde_json::from_str(e).unwrap();
        kinds.insert(format!(
            "{} v{}",
            v["type"].as_str().unwrap(),
            v["schemaversion"]
        ));
        extensions.extend(v.as_object().unwrap().keys().cloned());
    }
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        [
            "order.line_added v1",
            "order.placed v1",
            "order.placed v2",
            "order.shipped v1"
        ]
    );
    for name in ["correlationid", "causationid", "importfile"] {
        assert!(extensions.contains(name), "{name} in {extensions:?}");
    }

    let jsonl = temp_dir().join("envelopes.jsonl");
    let mut file = std::fs::File::create(&jsonl).unwrap();
    for e in &envelopes {
        assert!(!e.contains('\n'), "one envelope per line: {e}");
        writeln!(file, "{e}").unwrap();
    }
    drop(file);

    let (status, stdout, output) = run_checker(&jsonl);
    assert!(status.success(), "{CHECKER} failed ({status}):\n{output}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines.contains(&"types: order.line_added, order.placed, order.shipped"),
        "{output}"
    );
    let versions = lines
        .iter()
        .find_map(|l| l.strip_prefix("versions: "))
        .unwrap_or_else(|| panic!("{output}"));
    for v in ["order.placed v1 (1)", "order.placed v2 ("] {
        assert!(versions.contains(v), "{v} in {versions}");
    }
    let seen = lines
        .iter()
        .find_map(|l| l.strip_prefix("extensions: "))
        .unwrap_or_else(|| panic!("{output}"));
    assert_eq!(
        seen,
        "aggregatetype, causationid, correlationid, importfile, schemaversion, sequence"
    );
    let closing = format!("{} passed, 0 failed", envelopes.len());
    assert_eq!(lines.last().copied(), Some(closing.as_str()), "{output}");
}

#[test]
fn the_checker_fails_on_envelopes_the_sdk_refuses() {
    if !sdk_or_skip("the_checker_fails_on_envelopes_the_sdk_refuses") {
        return;
    }
    let good = Envelope::new(placed("CA-2019-900003", "Canada"))
        .with_sequence(1)
        .to_raw()
        .unwrap()
        .to_json();
    let mut wrong_version: serde_json::Value = serde_json::from_str(&good).unwrap();
    wrong_version["specversion"] = "0.9".into();
    let mut no_source: serde_json::Value = serde_json::from_str(&good).unwrap();
    no_source.as_object_mut().unwrap().remove("source");
    let jsonl = temp_dir().join("refused.jsonl");
    std::fs::write(&jsonl, format!("{good}\n{wrong_version}\n{no_source}\n")).unwrap();
    let (status, stdout, output) = run_checker(&jsonl);
    assert_eq!(status.code(), Some(1), "{output}");
    assert!(
        output.contains("line 2: the SDK refused the envelope"),
        "{output}"
    );
    assert!(
        output.contains("line 3: the SDK refused the envelope"),
        "{output}"
    );
    assert_eq!(
        stdout.lines().last(),
        Some("1 passed, 2 failed"),
        "{output}"
    );
}

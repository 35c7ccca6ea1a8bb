//! The `events` command-line tool, driven through `event_runtime::cli::run_with_output`
//! against a temporary SQLite file and, when `EVENTS_TEST_POSTGRES_URL` is set, the real
//! PostgreSQL server. Dead letters come from real deliveries: a handler that fails for good.
#![cfg(feature = "cli")]

use std::process::ExitCode;
use std::time::Duration;

use event_core::{event_handler, DomainEvent, EventRecorder, HandlerError};
use event_runtime::cli::{run_with_output, App};
use event_runtime::{DeadLetterFilter, Dispatcher, Outbox, Registry, SqlValue, Store};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

#[derive(Debug, Serialize, Deserialize, DomainEvent)]
#[event(name = "parcel.sent", version = 1)]
struct ParcelSent {
    #[event(aggregate_id)]
    parcel: String,
    address: String,
}

/// A legacy carrier API that rejects every parcel: each delivery is dead-lettered at once.
#[event_handler(name = "cli_test.ship")]
fn ship(event: &ParcelSent) -> Result<(), HandlerError> {
    Err(HandlerError::permanent_msg(format!(
        "no carrier serves {}",
        event.address
    )))
}

/// Succeeds, so that the stats have a completed column too.
#[event_handler(name = "cli_test.count")]
fn count(_: &ParcelSent) {}

/// Where a case runs: the URL and, on PostgreSQL, the schema passed as `--schema`.
struct Db {
    url: String,
    schema: Option<String>,
    store: Store,
    /// The SQLite file, removed with its journal at the end.
    file: Option<std::path::PathBuf>,
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Some(file) = &self.file {
            for suffix in ["", "-wal", "-shm"] {
                let mut path = file.clone().into_os_string();
                path.push(suffix);
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

impl Db {
    async fn sqlite(test: &str) -> Db {
        let path = std::env::temp_dir().join(format!("cli_{test}_{}.db", Uuid::now_v7().simple()));
        let url = format!("sqlite://{}", path.display());
        let store = Store::connect(&url).await.expect("open SQLite");
        Db {
            url,
            schema: None,
            store,
            file: Some(path),
        }
    }

    /// Runs `events --database URL [--schema S] ARGS…` and returns (status, stdout, stderr).
    async fn cli(&self, args: &[&str]) -> (ExitCode, String, String) {
        let mut full = vec![
            "events".to_owned(),
            "--database".to_owned(),
            self.url.clone(),
        ];
        if let Some(schema) = &self.schema {
            full.push("--schema".to_owned());
            full.push(schema.clone());
        }
        full.extend(args.iter().map(|a| (*a).to_owned()));
        run(full, App::standalone()).await
    }

    /// Sends `n` parcels (one aggregate each) and delivers until only dead letters are left.
    async fn dead_letters(&self, n: usize) -> Outbox {
        let addresses: Vec<String> = (0..n).map(|i| format!("{i} Rue de Rivoli")).collect();
        self.send_to(&addresses).await
    }

    /// Sends one parcel to each address and delivers until only dead letters are left.
    async fn send_to(&self, addresses: &[String]) -> Outbox {
        let outbox = Outbox::builder(self.store.clone())
            .dispatcher(
                Dispatcher::builder_empty()
                    .handler::<ship>()
                    .handler::<count>(),
            )
            .build()
            .expect("outbox");
        let mut uow = outbox.begin().await.expect("begin");
        let mut recorder = EventRecorder::new();
        for (i, address) in addresses.iter().enumerate() {
            recorder.record(ParcelSent {
                parcel: format!("p-{i}"),
                address: address.clone(),
            });
        }
        uow.extend(recorder.take());
        uow.commit().await.expect("commit");
        outbox.drain(Duration::from_secs(30)).await.expect("drain");
        outbox
    }

    async fn open_dead_letters(&self) -> Vec<event_runtime::DeadLetter> {
        self.store
            .dead_letters(&DeadLetterFilter::default())
            .await
            .unwrap()
    }

    async fn attempts(&self, handler: &str, event_id: Uuid) -> Option<i64> {
        let mut tx = self.store.begin().await.unwrap();
        let n = tx
            .fetch_i64(
                "SELECT attempts FROM event_deliveries WHERE handler = $1 AND event_id = $2",
                &[
                    SqlValue::Text(handler),
                    SqlValue::Text(&event_id.to_string()),
                ],
            )
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        n
    }
}

async fn run(args: Vec<String>, app: App<'_>) -> (ExitCode, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_with_output(args, app, &mut out, &mut err).await;
    (
        code,
        String::from_utf8(out).expect("UTF-8 stdout"),
        String::from_utf8(err).expect("UTF-8 stderr"),
    )
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

fn ok(result: &(ExitCode, String, String)) {
    assert_eq!(
        result.0,
        ExitCode::SUCCESS,
        "stdout:\n{}\nstderr:\n{}",
        result.1,
        result.2
    );
}

fn failed(result: &(ExitCode, String, String), message: &str) {
    assert_ne!(
        result.0,
        ExitCode::SUCCESS,
        "expected a failure; stdout:\n{}",
        result.1
    );
    assert!(
        result.2.starts_with("error: ") && result.2.contains(message),
        "stderr should be `error: …{message}…`, is:\n{}",
        result.2
    );
}

/// list, show, replay, purge, audit and stats on one database, asserting on the store.
async fn dead_letter_workflow(db: &Db) {
    let outbox = db.dead_letters(3).await;
    let open = db
        .store
        .dead_letters(&DeadLetterFilter::default())
        .await
        .unwrap();
    assert_eq!(open.len(), 3, "one dead letter per parcel");
    let (first, second, third) = (&open[0], &open[1], &open[2]);

    // list: a table, and the same rows as JSON.
    let r = db.cli(&["dlq", "list"]).await;
    ok(&r);
    let lines: Vec<&str> = r.1.lines().collect();
    assert_eq!(lines.len(), 4, "header and three rows:\n{}", r.1);
    for column in [
        "ID",
        "EVENT",
        "EVENT ID",
        "HANDLER",
        "ATTEMPTS",
        "REASON",
        "LAST ERROR",
        "DEAD AT",
    ] {
        assert!(
            lines[0].contains(column),
            "missing column {column}: {}",
            lines[0]
        );
    }
    assert!(lines[1].contains("parcel.sent v1"));
    assert!(lines[1].contains(&first.event_id.to_string()));
    assert!(lines[1].contains("cli_test.ship"));
    assert!(lines[1].contains("permanent"));
    assert!(lines[1].contains("no carrier serves 0 Rue de Rivoli"));

    let r = db.cli(&["dlq", "list", "--json"]).await;
    ok(&r);
    let list = json(&r.1);
    assert_eq!(list.as_array().unwrap().len(), 3);
    assert_eq!(list[0]["id"], first.id);
    assert_eq!(list[0]["event_id"], first.event_id.to_string());
    assert_eq!(list[0]["handler"], "cli_test.ship");
    // The payload is withheld; the attributes are the envelope's, in its order.
    let withheld = first.envelope.replace(
        r#"{"parcel":"p-0","address":"0 Rue de Rivoli"}"#,
        r#""***""#,
    );
    assert_ne!(withheld, first.envelope);
    assert_eq!(list[0]["envelope"], withheld.as_str());
    let r = db.cli(&["dlq", "list", "--json", "--payload"]).await;
    ok(&r);
    assert_eq!(
        json(&r.1)[0]["envelope"],
        first.envelope.as_str(),
        "with --payload, the envelope byte for byte (no field is sensitive)"
    );

    // Filters.
    let r = db
        .cli(&["dlq", "list", "--json", "--handler", "cli_test.count"])
        .await;
    ok(&r);
    assert_eq!(json(&r.1), serde_json::json!([]));
    let r = db
        .cli(&[
            "dlq",
            "list",
            "--json",
            "--event",
            "parcel.sent",
            "--limit",
            "2",
        ])
        .await;
    assert_eq!(json(&r.1).as_array().unwrap().len(), 2);
    let r = db
        .cli(&["dlq", "list", "--json", "--since", "2999-01-01"])
        .await;
    assert_eq!(json(&r.1), serde_json::json!([]));
    let r = db
        .cli(&["dlq", "list", "--json", "--until", "2000-01-01T00:00:00Z"])
        .await;
    assert_eq!(json(&r.1), serde_json::json!([]));
    let r = db
        .cli(&[
            "dlq",
            "list",
            "--json",
            "--since",
            "2000-01-01T00:00:00+02:00",
        ])
        .await;
    assert_eq!(json(&r.1).as_array().unwrap().len(), 3);
    // A handler that exists but has no dead letters: an empty list. One that nothing knows:
    // an error naming the handlers that have some.
    let r = db
        .cli(&["dlq", "list", "--handler", "cli_test.count"])
        .await;
    ok(&r);
    assert_eq!(r.1, "no open dead letters of handler `cli_test.count`\n");
    let r = db.cli(&["dlq", "list", "--handler", "nobody"]).await;
    failed(
        &r,
        "no dead letters of handler `nobody`: nothing in this outbox has that name; handlers with open dead letters: cli_test.ship",
    );

    // show: every field, the error chain, the envelope pretty-printed, its payload withheld.
    let r = db.cli(&["dlq", "show", &second.id.to_string()]).await;
    ok(&r);
    for needle in [
        format!("dead letter {} (open)", second.id),
        second.event_id.to_string(),
        "cli_test.ship".into(),
        "first failed".into(),
        "error chain:".into(),
        "error: no carrier serves 1 Rue de Rivoli".into(),
        "\"specversion\": \"1.0\"".into(),
        "\"data\": \"***\"".into(),
        format!("payload withheld: `dlq show {} --payload`", second.id),
    ] {
        assert!(r.1.contains(&needle), "show lacks {needle:?}:\n{}", r.1);
    }
    assert!(!r.1.contains("\"address\""), "{}", r.1);
    let r = db
        .cli(&["dlq", "show", &second.id.to_string(), "--payload"])
        .await;
    ok(&r);
    assert!(r.1.contains("\"address\": \"1 Rue de Rivoli\""), "{}", r.1);
    let r = db
        .cli(&["dlq", "show", &second.id.to_string(), "--json", "--payload"])
        .await;
    ok(&r);
    let shown = json(&r.1);
    assert_eq!(shown["envelope"], second.envelope.as_str());
    assert_eq!(
        shown["error_chain"],
        serde_json::json!(["no carrier serves 1 Rue de Rivoli"])
    );
    failed(
        &db.cli(&["dlq", "show", "999999"]).await,
        "no dead letter with id 999999",
    );

    // replay by id: pending again, same event id, attempts reset, audited.
    let r = db
        .cli(&[
            "dlq",
            "replay",
            &first.id.to_string(),
            "--reason",
            "carrier now serves Paris",
            "--actor",
            "alice",
        ])
        .await;
    ok(&r);
    assert!(
        r.1.contains(&format!("replayed 1 dead letter: {}", first.id)),
        "{}",
        r.1
    );
    assert!(r.1.contains("audit #"), "{}", r.1);
    let replayed = db.store.dead_letter_by_id(first.id).await.unwrap().unwrap();
    assert_eq!(replayed.resolution.as_deref(), Some("replayed"));
    assert!(replayed.resolved_at.is_some());
    assert_eq!(db.attempts("cli_test.ship", first.event_id).await, Some(0));
    let pending = db.store.pending_envelopes().await.unwrap();
    assert_eq!(
        pending
            .iter()
            .map(|p| (p.destination.as_str(), p.event_id.as_str()))
            .collect::<Vec<_>>(),
        vec![("cli_test.ship", first.event_id.to_string().as_str())],
        "exactly the replayed delivery is pending, under its original event id"
    );
    let audit = db.store.audit_log(10).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].action, "replay");
    assert_eq!(audit[0].actor, "alice");
    assert_eq!(audit[0].reason, "carrier now serves Paris");
    assert_eq!(audit[0].dead_letter_ids, vec![first.id]);
    assert_eq!(audit[0].count, 1);
    assert!(
        r.1.contains(&format!("audit #{}: replay by alice", audit[0].id)),
        "{}",
        r.1
    );

    // Refusals change nothing.
    failed(
        &db.cli(&["dlq", "replay", "--all", "--reason", "try again"])
            .await,
        "--yes",
    );
    failed(
        &db.cli(&[
            "dlq",
            "purge",
            "--handler",
            "cli_test.ship",
            "--reason",
            "x",
        ])
        .await,
        "--yes",
    );
    failed(
        &db.cli(&["dlq", "replay", &second.id.to_string(), "--reason", "   "])
            .await,
        "--reason must say why",
    );
    failed(
        &db.cli(&[
            "dlq",
            "replay",
            &second.id.to_string(),
            "424242",
            "--reason",
            "x",
        ])
        .await,
        "no dead letter with id 424242",
    );
    let r = db.cli(&["dlq", "replay", &second.id.to_string()]).await;
    assert_eq!(
        r.0,
        ExitCode::from(2),
        "clap refuses a replay without --reason"
    );
    assert!(r.2.contains("--reason"), "{}", r.2);
    assert_eq!(
        db.store
            .dead_letters(&DeadLetterFilter::default())
            .await
            .unwrap()
            .len(),
        2
    );
    assert_eq!(db.store.audit_log(10).await.unwrap().len(), 1);

    // Replaying what is already replayed: a warning, nothing done.
    let r = db
        .cli(&["dlq", "replay", &first.id.to_string(), "--reason", "again"])
        .await;
    ok(&r);
    assert!(
        r.2.contains(&format!(
            "warning: dead letter {} was already replayed",
            first.id
        )),
        "{}",
        r.2
    );
    assert_eq!(db.store.audit_log(10).await.unwrap().len(), 1);

    // The replayed delivery runs again, fails again, and is dead-lettered with the same event id.
    outbox.drain(Duration::from_secs(30)).await.unwrap();
    let open = db
        .store
        .dead_letters(&DeadLetterFilter::default())
        .await
        .unwrap();
    assert_eq!(open.len(), 3);
    let again = open
        .iter()
        .find(|d| d.id > third.id)
        .expect("a new dead letter");
    assert_eq!(again.event_id, first.event_id);
    assert_eq!(again.attempts, 1, "attempts were reset by the replay");

    // purge by selector, confirmed: audited, deliveries marked purged.
    let r = db
        .cli(&[
            "dlq",
            "purge",
            "--handler",
            "cli_test.ship",
            "--reason",
            "parcels lost",
            "--actor",
            "bob",
            "--yes",
        ])
        .await;
    ok(&r);
    assert!(r.1.contains("purged 3 dead letters"), "{}", r.1);
    for id in [second.id, third.id, again.id] {
        let d = db.store.dead_letter_by_id(id).await.unwrap().unwrap();
        assert_eq!(d.resolution.as_deref(), Some("purged"), "dead letter {id}");
    }
    let audit = db.store.audit_log(10).await.unwrap();
    assert_eq!(audit.len(), 2);
    assert_eq!(audit[0].action, "purge");
    assert_eq!(audit[0].actor, "bob");
    assert_eq!(audit[0].reason, "parcels lost");
    // An operation over a selection records the selection, in pages; the dead letters name
    // its audit row.
    assert_eq!(audit[0].count, 3);
    assert!(audit[0].dead_letter_ids.is_empty());
    let selection = audit[0].selection.as_deref().unwrap();
    assert!(selection.contains("cli_test.ship"), "{selection}");
    assert!(audit[0].finished_at.is_some());
    let r = db.cli(&["dlq", "list"]).await;
    ok(&r);
    assert_eq!(r.1, "no open dead letters\n");
    let r = db
        .cli(&["dlq", "replay", "--all", "--reason", "x", "--yes"])
        .await;
    ok(&r);
    assert_eq!(r.1, "no open dead letters match; nothing replayed\n");

    // list --all: resolved ones too, with their status.
    let r = db.cli(&["dlq", "list", "--all"]).await;
    ok(&r);
    assert_eq!(r.1.lines().count(), 5, "{}", r.1);
    assert!(r.1.lines().next().unwrap().contains("STATUS"));
    assert!(
        r.1.contains("replayed") && r.1.contains("purged"),
        "{}",
        r.1
    );

    // audit: newest first.
    let r = db.cli(&["dlq", "audit", "--json"]).await;
    ok(&r);
    let log = json(&r.1);
    assert_eq!(log[0]["action"], "purge");
    assert_eq!(log[1]["action"], "replay");
    assert_eq!(log[1]["dead_letter_ids"], serde_json::json!([first.id]));
    let r = db.cli(&["dlq", "audit", "--limit", "1"]).await;
    ok(&r);
    assert_eq!(r.1.lines().count(), 2, "{}", r.1);
    assert!(
        r.1.contains("bob") && r.1.contains("parcels lost"),
        "{}",
        r.1
    );

    // stats.
    let r = db.cli(&["outbox", "stats", "--json"]).await;
    ok(&r);
    let stats = json(&r.1);
    assert_eq!(stats["events"], 3);
    assert_eq!(stats["pending"], 0);
    assert_eq!(stats["dead_letters"], 0);
    assert_eq!(stats["oldest_pending_age_secs"], Value::Null);
    let handler = |name: &str| {
        stats["handlers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["handler"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no stats for {name}: {stats}"))
    };
    assert_eq!(handler("cli_test.ship")["purged"], 3);
    assert_eq!(handler("cli_test.ship")["dead"], 0);
    assert_eq!(handler("cli_test.count")["completed"], 3);
    let r = db.cli(&["outbox", "stats"]).await;
    ok(&r);
    for needle in [
        "pending deliveries",
        "behind a dead letter",
        "oldest pending age (s)",
        "open dead letters",
        "HANDLER",
        "cli_test.count",
    ] {
        assert!(r.1.contains(needle), "stats lack {needle:?}:\n{}", r.1);
    }
}

#[tokio::test]
async fn dead_letter_workflow_sqlite() {
    let db = Db::sqlite("workflow").await;
    dead_letter_workflow(&db).await;
}

#[tokio::test]
async fn dead_letter_workflow_postgres() {
    let Some(url) = postgres_url("dead_letter_workflow_postgres") else {
        return;
    };
    #[cfg(feature = "postgres")]
    {
        let schema = format!("cli_test_{}", Uuid::now_v7().simple());
        let store = event_runtime::store::postgres::connect_in_schema(&url, &schema)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL at {url} is unreachable: {e}"));
        let db = Db {
            url,
            schema: Some(schema.clone()),
            store,
            file: None,
        };
        dead_letter_workflow(&db).await;
        let pool = event_runtime::store::postgres::pool(&db.store).unwrap();
        event_runtime::sqlx::query(event_runtime::sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA \"{schema}\" CASCADE"
        )))
        .execute(pool)
        .await
        .unwrap();
    }
    #[cfg(not(feature = "postgres"))]
    {
        let _ = url;
        eprintln!(
            "dead_letter_workflow_postgres: PostgreSQL case skipped: the `postgres` feature is off"
        );
    }
}

/// The PostgreSQL URL, or `None` after printing why the case is skipped; with
/// `EVENTS_TEST_REQUIRE_SERVICES=1` a missing URL fails.
fn postgres_url(test: &str) -> Option<String> {
    match std::env::var("EVENTS_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            if std::env::var("EVENTS_TEST_REQUIRE_SERVICES").as_deref() == Ok("1") {
                panic!("{test}: EVENTS_TEST_REQUIRE_SERVICES=1 but EVENTS_TEST_POSTGRES_URL is not set");
            }
            eprintln!("{test}: PostgreSQL case skipped: EVENTS_TEST_POSTGRES_URL is not set");
            None
        }
    }
}

/// A replay of more rows than one screenful: one audit row for all of them.
#[tokio::test]
async fn long_replay_is_one_audited_operation() {
    let db = Db::sqlite("long_replay").await;
    db.dead_letters(120).await;
    let r = db
        .cli(&[
            "dlq",
            "replay",
            "--event",
            "parcel.sent",
            "--reason",
            "carrier back",
            "--actor",
            "ops-bot",
            "--yes",
        ])
        .await;
    ok(&r);
    assert!(r.1.contains("replayed 120 dead letters"), "{}", r.1);
    let audit = db.store.audit_log(10).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].count, 120);
    assert!(audit[0]
        .selection
        .as_deref()
        .unwrap()
        .contains("parcel.sent"));
    assert!(audit[0].finished_at.is_some());
    assert_eq!(audit[0].actor, "ops-bot");
    assert_eq!(db.store.stats().await.unwrap().pending, 120);
}

#[tokio::test]
async fn bad_input_is_one_line_error() {
    let db = Db::sqlite("bad_input").await;
    let events = |args: &[&str]| {
        let args: Vec<String> = std::iter::once("events")
            .chain(args.iter().copied())
            .map(str::to_owned)
            .collect();
        run(args, App::standalone())
    };

    let r = events(&["--database", "mysql://app:hunter2@db/orders", "dlq", "list"]).await;
    failed(&r, "unsupported database URL mysql://app:***@db/orders");
    assert!(!r.2.contains("hunter2"), "the password is masked");
    assert_eq!(r.2.lines().count(), 1, "{}", r.2);

    let missing = std::env::temp_dir().join(format!("cli_missing_{}.db", Uuid::now_v7().simple()));
    let url = format!("sqlite://{}", missing.display());
    failed(
        &events(&["--database", &url, "outbox", "stats"]).await,
        "does not exist",
    );
    assert!(!missing.exists(), "the tool does not create databases");

    let started = std::time::Instant::now();
    let r = events(&[
        "--database",
        "postgres://postgres@127.0.0.1:1/none",
        "outbox",
        "stats",
    ])
    .await;
    // Nothing listens on port 1: the address and the cause, at once, not after the connect
    // timeout; the address once.
    #[cfg(feature = "postgres")]
    {
        failed(
            &r,
            "error: cannot reach the database at postgres://postgres@127.0.0.1:1/none: Connection refused",
        );
        assert_eq!(r.2.matches("127.0.0.1:1").count(), 1, "{}", r.2);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a refused connection fails at once, took {:?}",
            started.elapsed()
        );
    }
    #[cfg(not(feature = "postgres"))]
    {
        failed(
            &r,
            "this build has no postgres support: enable the `postgres` feature of event-runtime",
        );
        let _ = started;
    }

    let r = db.cli(&["dlq", "show", "abc"]).await;
    assert_eq!(r.0, ExitCode::from(2));
    assert!(r.2.starts_with("error: invalid value 'abc'"), "{}", r.2);

    let r = db.cli(&["dlq", "list", "--since", "last tuesday"]).await;
    assert_eq!(r.0, ExitCode::from(2));
    assert!(r.2.contains("expected an RFC 3339 time"), "{}", r.2);

    failed(
        &db.cli(&[
            "dlq",
            "list",
            "--since",
            "2026-02-01",
            "--until",
            "2026-01-01",
        ])
        .await,
        "--since (2026-02-01T00:00:00Z) is not before --until",
    );

    let r = db
        .cli(&["dlq", "replay", "1", "--all", "--reason", "x"])
        .await;
    assert_eq!(r.0, ExitCode::from(2), "ids and --all exclude each other");
    let r = db.cli(&["dlq", "replay", "--reason", "x"]).await;
    assert_eq!(r.0, ExitCode::from(2), "a selector is required");

    failed(
        &db.cli(&["--schema", "s", "outbox", "stats"]).await,
        "the schema option does not apply to the sqlite backend",
    );

    if std::env::var_os(event_runtime::cli::DATABASE_ENV).is_none() {
        failed(
            &events(&["dlq", "list"]).await,
            "no database: pass --database URL",
        );
    }

    let r = events(&["--help"]).await;
    ok(&r);
    assert!(r.1.contains("Usage: events [OPTIONS] <COMMAND>"), "{}", r.1);
}

#[tokio::test]
async fn catalog_and_check_need_the_application() {
    let db = Db::sqlite("catalog").await;
    for command in ["catalog", "check"] {
        let r = db.cli(&[command]).await;
        failed(&r, &format!("run `your-app events {command}`"));
        assert!(r.2.contains("knows no application event types"), "{}", r.2);
    }

    let registry = Registry::builder()
        .handler::<ship>()
        .handler::<count>()
        .build()
        .unwrap();
    let app = || App::embedded("orders events", &registry);
    let args = |rest: &[&str]| -> Vec<String> {
        ["events", "--database", db.url.as_str()]
            .iter()
            .chain(rest)
            .map(|s| (*s).to_owned())
            .collect()
    };

    let r = run(args(&["catalog"]), app()).await;
    ok(&r);
    assert!(
        r.1.contains("parcel.sent") && r.1.contains("ParcelSent"),
        "{}",
        r.1
    );
    let r = run(args(&["catalog", "--json"]), app()).await;
    ok(&r);
    let catalog = json(&r.1);
    assert_eq!(catalog[0]["name"], "parcel.sent");
    assert_eq!(catalog[0]["version"], 1);
    assert_eq!(
        catalog[0]["handlers"],
        serde_json::json!(["cli_test.count", "cli_test.ship"])
    );

    // check: pending deliveries of known handlers decode; one of an unknown handler does not.
    db.dead_letters(2).await;
    db.cli(&["dlq", "replay", "--all", "--reason", "check", "--yes"])
        .await;
    let r = run(args(&["check"]), app()).await;
    ok(&r);
    assert!(r.1.contains("ok: 2 pending deliveries"), "{}", r.1);
    let only_count = Registry::builder().handler::<count>().build().unwrap();
    let r = run(
        args(&["check"]),
        App::embedded("orders events", &only_count),
    )
    .await;
    failed(&r, "2 pending deliveries cannot be handled");
    assert!(
        r.1.contains("handler `cli_test.ship` is not registered"),
        "{}",
        r.1
    );

    // Help names the embedding program.
    let r = run(args(&["dlq", "--help"]), app()).await;
    ok(&r);
    assert!(r.1.contains("Usage: orders events dlq"), "{}", r.1);
}

#[test]
fn run_with_output_is_send() {
    fn assert_send<T: Send>(_: &T) {}
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let future = run_with_output(["events"], App::standalone(), &mut out, &mut err);
    assert_send(&future);
}

// ---- rough edges a new user found ------------------------------------------------------------

/// `--limit 0` is refused, and a page that is not the whole queue says how much there is.
#[tokio::test]
async fn a_limited_list_says_how_many_there_are() {
    let db = Db::sqlite("limit").await;
    db.dead_letters(3).await;

    let r = db.cli(&["dlq", "list", "--limit", "0"]).await;
    assert_eq!(r.0, ExitCode::from(2), "{}", r.2);
    assert!(
        r.2.contains("invalid value '0' for '--limit <N>'"),
        "{}",
        r.2
    );

    let r = db.cli(&["dlq", "list", "--limit", "2"]).await;
    ok(&r);
    let lines: Vec<&str> = r.1.lines().collect();
    assert_eq!(lines.len(), 4, "header, two rows, the count:\n{}", r.1);
    assert_eq!(lines[3], "showing 2 of 3 open dead letters (--limit 2)");

    let r = db
        .cli(&["dlq", "list", "--limit", "1", "--handler", "cli_test.ship"])
        .await;
    ok(&r);
    assert!(
        r.1.ends_with("showing 1 of 3 open dead letters of handler `cli_test.ship` (--limit 1)\n"),
        "{}",
        r.1
    );

    // A limit that shows everything says nothing more; --json stays a bare array.
    let r = db.cli(&["dlq", "list", "--limit", "3"]).await;
    ok(&r);
    assert!(!r.1.contains("showing"), "{}", r.1);
    let r = db.cli(&["dlq", "list", "--json", "--limit", "2"]).await;
    ok(&r);
    assert_eq!(json(&r.1).as_array().unwrap().len(), 2);

    let r = db.cli(&["dlq", "audit", "--limit", "0"]).await;
    assert_eq!(r.0, ExitCode::from(2), "{}", r.2);
}

/// A `--handler` or `--event` that nothing has is a typo: list, replay and purge fail and name
/// what exists, instead of reporting an empty queue.
#[tokio::test]
async fn names_that_nothing_has_fail() {
    let db = Db::sqlite("names").await;
    db.dead_letters(2).await;

    failed(
        &db.cli(&["dlq", "list", "--event", "parcel.snet"]).await,
        "no dead letters of event `parcel.snet`: nothing in this outbox has that name; events with open dead letters: parcel.sent",
    );
    let r = db
        .cli(&["dlq", "list", "--json", "--handler", "cli_test.shipp"])
        .await;
    failed(&r, "handlers with open dead letters: cli_test.ship");
    assert_eq!(r.1, "", "no JSON on a failure");
    failed(
        &db.cli(&[
            "dlq",
            "replay",
            "--handler",
            "cli_test.shipp",
            "--reason",
            "x",
            "--actor",
            "a",
            "--yes",
        ])
        .await,
        "no dead letters of handler `cli_test.shipp`",
    );
    failed(
        &db.cli(&[
            "dlq",
            "purge",
            "--handler",
            "cli_test.ship",
            "--event",
            "parcel.snet",
            "--reason",
            "x",
            "--actor",
            "a",
            "--yes",
        ])
        .await,
        "no dead letters of event `parcel.snet`",
    );
    assert_eq!(db.open_dead_letters().await.len(), 2, "nothing changed");
    assert!(db.store.audit_log(10).await.unwrap().is_empty());

    // A handler that exists (it has deliveries) and has no dead letters: nothing to do, no error.
    let r = db
        .cli(&[
            "dlq",
            "replay",
            "--handler",
            "cli_test.count",
            "--reason",
            "x",
            "--actor",
            "a",
            "--yes",
        ])
        .await;
    ok(&r);
    assert_eq!(r.1, "no open dead letters match; nothing replayed\n");

    // Re-publishing is for relays: a handler's deliveries would run it again, and a relay
    // that has nothing here is named as such; neither writes an audit row.
    for (destination, message) in [
        ("cli_test.count", "`cli_test.count` is not a relay"),
        (
            "nats:NOPE",
            "no relay `nats:NOPE` in this database (relays: none has deliveries in this database)",
        ),
    ] {
        failed(
            &db.cli(&[
                "relay",
                "republish",
                "--destination",
                destination,
                "--since",
                "2020-01-01",
                "--reason",
                "x",
                "--actor",
                "a",
            ])
            .await,
            message,
        );
    }
    assert!(db.store.audit_log(10).await.unwrap().is_empty());
    let refused = db
        .store
        .republish(
            &event_runtime::RepublishSelection::new("cli_test.count").since_ms(0),
            "a",
            "x",
        )
        .await;
    assert!(
        matches!(refused, Err(event_runtime::StoreError::InvalidSelection(_))),
        "{refused:?}"
    );

    // Embedded, the application's event types are known names too.
    let registry = Registry::builder().handler::<count>().build().unwrap();
    let args: Vec<String> = [
        "events",
        "--database",
        db.url.as_str(),
        "dlq",
        "list",
        "--event",
        "parcel.sent",
        "--handler",
        "cli_test.count",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let r = run(args, App::embedded("orders events", &registry)).await;
    ok(&r);
    assert_eq!(
        r.1,
        "no open dead letters of handler `cli_test.count`, event `parcel.sent`\n"
    );
}

/// The actor is `--actor`, else the login name; an empty one is refused, never "unknown".
#[tokio::test]
async fn the_actor_is_given_or_the_login_name() {
    let db = Db::sqlite("actor").await;
    db.dead_letters(3).await;
    let open = db.open_dead_letters().await;
    let id = |i: usize| open[i].id.to_string();

    failed(
        &db.cli(&["dlq", "replay", &id(0), "--reason", "x", "--actor", "  "])
            .await,
        "--actor must name who does this: it is written to the audit log; nothing was replayed",
    );
    failed(
        &db.cli(&[
            "dlq", "purge", "--all", "--reason", "x", "--actor", "", "--yes",
        ])
        .await,
        "nothing was purged",
    );
    assert_eq!(db.open_dead_letters().await.len(), 3);

    // The real binary, with a controlled environment.
    let events = |env: &[(&str, &str)], id: String| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_events"));
        cmd.env_clear().envs(env.iter().copied()).args([
            "--database",
            &db.url,
            "dlq",
            "replay",
            &id,
            "--reason",
            "r",
        ]);
        cmd.output().expect("run the events binary")
    };
    let out = events(&[("LOGNAME", "carol")], id(1));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(db.store.audit_log(1).await.unwrap()[0].actor, "carol");

    // No variable at all: the user the process runs as, as `whoami` says.
    let out = events(&[], id(2));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let actor = db.store.audit_log(1).await.unwrap()[0].actor.clone();
    assert!(!actor.is_empty() && actor != "unknown", "{actor:?}");
    #[cfg(unix)]
    if let Ok(whoami) = std::process::Command::new("whoami").output() {
        if whoami.status.success() {
            assert_eq!(actor, String::from_utf8_lossy(&whoami.stdout).trim());
        }
    }
}

#[derive(Debug, Serialize, Deserialize, DomainEvent)]
#[event(name = "parcel.weighed", version = 1)]
struct ParcelWeighedByOldRelease {
    #[event(aggregate_id)]
    parcel: String,
}

/// What this release reads: `grams` is required, and the old release did not send it.
#[derive(Debug, Serialize, Deserialize, DomainEvent)]
#[event(name = "parcel.weighed", version = 1)]
struct ParcelWeighed {
    #[event(aggregate_id)]
    parcel: String,
    grams: u32,
}

#[event_handler(name = "cli_test.weigh")]
fn weigh_old(_: &ParcelWeighedByOldRelease) {}

#[event_handler(name = "cli_test.weigh")]
fn weigh(_: &ParcelWeighed) {}

/// serde's message is wrapped by the decode error that also returns it as its source: the
/// tool prints it once, in `dlq show` and `dlq list`, and keeps the stored chain in `--json`.
#[tokio::test]
async fn an_error_chain_shows_each_cause_once() {
    let db = Db::sqlite("chain").await;
    let old = Outbox::builder(db.store.clone())
        .dispatcher(Dispatcher::builder_empty().handler::<weigh_old>())
        .build()
        .unwrap();
    let mut uow = old.begin().await.unwrap();
    let mut recorder = EventRecorder::new();
    recorder.record(ParcelWeighedByOldRelease {
        parcel: "p-1".into(),
    });
    uow.extend(recorder.take());
    uow.commit().await.unwrap();
    let new = Outbox::builder(db.store.clone())
        .dispatcher(Dispatcher::builder_empty().handler::<weigh>())
        .build()
        .unwrap();
    new.drain(Duration::from_secs(30)).await.unwrap();
    let dead = db.open_dead_letters().await;
    assert_eq!(dead.len(), 1, "the payload does not decode");
    let serde_message = "missing field `grams`";

    let r = db.cli(&["dlq", "show", &dead[0].id.to_string()]).await;
    ok(&r);
    assert_eq!(r.1.matches(serde_message).count(), 1, "{}", r.1);
    let r = db.cli(&["dlq", "list"]).await;
    ok(&r);
    assert!(r.1.matches(serde_message).count() <= 1, "{}", r.1);
    let r = db
        .cli(&["dlq", "show", &dead[0].id.to_string(), "--json"])
        .await;
    ok(&r);
    assert_eq!(
        json(&r.1)["error_chain"],
        serde_json::json!(dead[0].error_chain),
        "--json is the stored chain, unchanged"
    );
}

/// `check` counts pending deliveries and dead letters apart.
#[tokio::test]
async fn check_counts_each_kind() {
    let db = Db::sqlite("check_kinds").await;
    db.dead_letters(2).await;
    let first = db.open_dead_letters().await[0].id.to_string();
    ok(&db
        .cli(&["dlq", "replay", &first, "--reason", "x", "--actor", "a"])
        .await);
    // An application that has neither the handler nor the event type.
    let registry = Registry::builder().build().unwrap();
    let args: Vec<String> = ["events", "--database", db.url.as_str(), "check"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let r = run(args, App::embedded("orders events", &registry)).await;
    failed(
        &r,
        "1 pending delivery and 1 dead letter cannot be handled by this application",
    );
    assert!(
        r.1.contains("pending cli_test.ship / ") && r.1.contains("is not registered"),
        "{}",
        r.1
    );
    assert!(r.1.contains("dead letter "), "{}", r.1);
}

/// `outbox stats`: a delivery in a status this version does not know is counted as unknown
/// and said to be; paused destinations are shown.
#[tokio::test]
async fn stats_show_unknown_statuses_and_pauses() {
    let db = Db::sqlite("stats_unknown").await;
    db.dead_letters(2).await;
    let mut tx = db.store.begin().await.unwrap();
    let n = tx
        .execute(
            "UPDATE event_deliveries SET status = 'archived' WHERE handler = $1 AND event_id = $2",
            &[
                SqlValue::Text("cli_test.count"),
                SqlValue::Text(&db.open_dead_letters().await[0].event_id.to_string()),
            ],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
    tx.commit().await.unwrap();
    ok(&db
        .cli(&[
            "handler",
            "pause",
            "cli_test.ship",
            "--reason",
            "carrier down",
            "--actor",
            "alice",
        ])
        .await);

    let r = db.cli(&["outbox", "stats", "--json"]).await;
    ok(&r);
    let stats = json(&r.1);
    assert_eq!(stats["unknown_status"], 1);
    let handler = |name: &str| {
        stats["handlers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["handler"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(handler("cli_test.count")["unknown"], 1);
    assert_eq!(handler("cli_test.count")["completed"], 1);
    assert_eq!(handler("cli_test.ship")["paused"], true);

    let r = db.cli(&["outbox", "stats"]).await;
    ok(&r);
    let line = |label: &str| {
        r.1.lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label:?} line:\n{}", r.1))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(
        line("deliveries in an unknown status"),
        "deliveries in an unknown status 1"
    );
    assert_eq!(
        line("paused destinations"),
        "paused destinations 1: cli_test.ship"
    );
    assert!(
        r.1.contains("note: 1 delivery is in a status this version does not know"),
        "{}",
        r.1
    );
    let header = r.1.lines().find(|l| l.starts_with("HANDLER")).unwrap();
    assert!(
        header.contains("UNKNOWN") && header.contains("PAUSED"),
        "{header}"
    );
    let count_row =
        r.1.lines()
            .find(|l| l.starts_with("cli_test.count"))
            .unwrap();
    assert_eq!(
        count_row.split_whitespace().collect::<Vec<_>>(),
        ["cli_test.count", "0", "1", "0", "0", "1", "-"],
        "pending, completed, dead, purged, unknown, paused"
    );
    let ship_row =
        r.1.lines()
            .find(|l| l.starts_with("cli_test.ship"))
            .unwrap();
    assert!(ship_row.ends_with("paused"), "{ship_row}");
}

/// `handler pause` stops every worker from claiming the destination's deliveries, `handler
/// list` shows who paused it, why and since when, `handler resume` lifts it; both are audited.
#[tokio::test]
async fn handlers_pause_and_resume() {
    let db = Db::sqlite("pause").await;
    let outbox = db.dead_letters(1).await;
    let dead = db.open_dead_letters().await[0].clone();

    let r = db
        .cli(&[
            "handler",
            "pause",
            "cli_test.ship",
            "--reason",
            "carrier down",
            "--actor",
            "alice",
        ])
        .await;
    ok(&r);
    assert!(
        r.1.starts_with("paused `cli_test.ship`: no worker of any process claims its deliveries"),
        "{}",
        r.1
    );
    let audit = db.store.audit_log(10).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(
        (
            audit[0].action.as_str(),
            audit[0].actor.as_str(),
            audit[0].reason.as_str()
        ),
        ("pause", "alice", "cli_test.ship: carrier down")
    );
    assert!(
        r.1.contains(&format!("audit #{}: pause by alice", audit[0].id)),
        "{}",
        r.1
    );
    let pauses = db.store.paused_destinations().await.unwrap();
    assert_eq!(pauses.len(), 1);
    assert_eq!(pauses[0].paused_by, "operator");
    assert_eq!(pauses[0].reason, "carrier down");

    // Paused: a replayed delivery is due, and no worker claims it.
    ok(&db
        .cli(&[
            "dlq",
            "replay",
            &dead.id.to_string(),
            "--reason",
            "r",
            "--actor",
            "bob",
        ])
        .await);
    assert_eq!(outbox.deliver_batch().await.unwrap().claimed, 0);
    assert_eq!(db.store.stats().await.unwrap().pending, 1);

    let r = db.cli(&["handler", "list"]).await;
    ok(&r);
    let lines: Vec<&str> = r.1.lines().collect();
    assert_eq!(lines.len(), 3, "{}", r.1);
    for column in ["HANDLER", "PENDING", "COMPLETED", "DEAD", "PAUSED"] {
        assert!(lines[0].contains(column), "{}", lines[0]);
    }
    assert!(
        lines[1].starts_with("cli_test.count") && lines[1].ends_with(" -"),
        "{}",
        r.1
    );
    let ship = lines[2];
    assert!(ship.starts_with("cli_test.ship"), "{}", r.1);
    assert!(
        ship.contains(&format!(
            "by operator (alice, audit #{}) since ",
            audit[0].id
        )) && ship.ends_with(": carrier down"),
        "{ship}"
    );
    let r = db.cli(&["handler", "list", "--json"]).await;
    ok(&r);
    let list = json(&r.1);
    assert_eq!(list[0]["handler"], "cli_test.count");
    assert_eq!(list[0]["paused"], false);
    assert_eq!(list[0]["completed"], 1);
    assert_eq!(list[1]["handler"], "cli_test.ship");
    assert_eq!(list[1]["pending"], 1);
    assert_eq!(list[1]["paused"], true);
    assert_eq!(list[1]["registered"], Value::Null, "standalone: unknown");
    let pause = &list[1]["pauses"][0];
    assert_eq!(pause["paused_by"], "operator");
    assert_eq!(pause["reason"], "carrier down");
    assert_eq!(pause["actor"], "alice");
    assert_eq!(pause["expires_at"], Value::Null);
    assert!(pause["paused_at"].is_string());

    // Pausing again records the new reason and keeps the start.
    let r = db
        .cli(&[
            "handler",
            "pause",
            "cli_test.ship",
            "--reason",
            "still down",
            "--actor",
            "carol",
        ])
        .await;
    ok(&r);
    assert!(
        r.1.contains("was already paused by the operator since"),
        "{}",
        r.1
    );
    let again = db.store.paused_destinations().await.unwrap();
    assert_eq!(again[0].reason, "still down");
    assert_eq!(again[0].paused_at, pauses[0].paused_at);
    let r = db.cli(&["handler", "list", "--json"]).await;
    assert_eq!(json(&r.1)[1]["pauses"][0]["actor"], "carol");

    // Resume: delivered again (and dead-lettered again: the carrier still refuses).
    let r = db
        .cli(&["handler", "resume", "cli_test.ship", "--actor", "alice"])
        .await;
    ok(&r);
    assert!(r.1.starts_with("resumed `cli_test.ship`"), "{}", r.1);
    assert!(db.store.paused_destinations().await.unwrap().is_empty());
    outbox.drain(Duration::from_secs(30)).await.unwrap();
    assert_eq!(db.store.stats().await.unwrap().pending, 0);
    assert_eq!(db.open_dead_letters().await.len(), 1);
    let audit = db.store.audit_log(10).await.unwrap();
    assert_eq!(audit[0].action, "resume");
    assert_eq!(audit[0].reason, "cli_test.ship: resumed");
    let r = db.cli(&["dlq", "audit"]).await;
    ok(&r);
    assert!(
        r.1.contains("resume") && r.1.contains("cli_test.ship: carrier down"),
        "{}",
        r.1
    );

    let r = db
        .cli(&["handler", "resume", "cli_test.ship", "--actor", "alice"])
        .await;
    ok(&r);
    assert_eq!(
        r.1,
        "`cli_test.ship` was not paused by an operator or a circuit breaker; nothing was changed\n"
    );

    // Names nothing has are refused, unless forced.
    failed(
        &db.cli(&["handler", "pause", "cli_test.shipp", "--reason", "x", "--actor", "a"])
            .await,
        "no destination `cli_test.shipp`: nothing in this outbox has that name; known destinations (pause a new one with --force): cli_test.count, cli_test.ship",
    );
    failed(
        &db.cli(&["handler", "resume", "cli_test.shipp", "--actor", "a"])
            .await,
        "no destination `cli_test.shipp`",
    );
    failed(
        &db.cli(&[
            "handler",
            "pause",
            "cli_test.ship",
            "--reason",
            " ",
            "--actor",
            "a",
        ])
        .await,
        "--reason must say why",
    );
    ok(&db
        .cli(&[
            "handler",
            "pause",
            "billing.v2",
            "--reason",
            "not live yet",
            "--actor",
            "a",
            "--force",
        ])
        .await);
    let r = db.cli(&["handler", "list"]).await;
    assert!(
        r.1.lines()
            .any(|l| l.starts_with("billing.v2") && l.contains("not live yet")),
        "{}",
        r.1
    );
}

/// Display columns of `s` for the characters these tests use: CJK ideographs take two.
fn display_width(s: &str) -> usize {
    s.chars()
        .map(|c| {
            if ('\u{4e00}'..='\u{9fff}').contains(&c) {
                2
            } else {
                1
            }
        })
        .sum()
}

/// Columns after a wide value start where they start on every other row.
#[tokio::test]
async fn tables_align_wide_values() {
    let db = Db::sqlite("wide").await;
    db.send_to(&[
        "東京都千代田区1-1".to_owned(),
        "1 Rue de Rivoli".to_owned(),
        "Åre 5".to_owned(),
    ])
    .await;
    let r = db.cli(&["dlq", "list"]).await;
    ok(&r);
    let lines: Vec<&str> = r.1.lines().collect();
    assert_eq!(lines.len(), 4, "{}", r.1);
    let column = display_width(&lines[0][..lines[0].find("DEAD AT").unwrap()]);
    for row in &lines[1..] {
        let last = row.rfind(' ').unwrap() + 1;
        assert_eq!(
            display_width(&row[..last]),
            column,
            "DEAD AT misaligned:\n{}",
            r.1
        );
        assert!(!row.ends_with(' '));
    }
    assert!(
        r.1.contains("no carrier serves 東京都千代田区1-1"),
        "{}",
        r.1
    );
}

/// `--connect-timeout`: a server that accepts and never answers fails after it, naming the
/// address; 0 is refused.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn connecting_gives_up_after_the_timeout() {
    // The kernel completes the handshake for the backlog; nothing ever answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/silent",
        silent.local_addr().unwrap().port()
    );
    let args = |timeout: &str| -> Vec<String> {
        [
            "events",
            "--connect-timeout",
            timeout,
            "--database",
            &url,
            "outbox",
            "stats",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    };
    let started = std::time::Instant::now();
    let r = run(args("1"), App::standalone()).await;
    failed(
        &r,
        &format!("no answer from the database at {url} within 1"),
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    let r = run(args("0"), App::standalone()).await;
    assert_eq!(r.0, ExitCode::from(2), "{}", r.2);
}

/// The database's own message, once, without sqlx's `error returned from database: ` and
/// without the `at line N` (of the server's C source) that sqlx appends, with its code.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn database_errors_read_once() {
    let Some(url) = postgres_url("database_errors_read_once") else {
        return;
    };
    let base = &url[..url.rfind('/').expect("a database in the URL")];
    let missing = format!("{base}/events_cli_no_such_database");
    let args: Vec<String> = ["events", "--database", &missing, "outbox", "stats"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let r = run(args, App::standalone()).await;
    let message = "database \"events_cli_no_such_database\" does not exist";
    failed(&r, message);
    assert_eq!(r.2.matches(message).count(), 1, "{}", r.2);
    assert!(!r.2.contains("error returned from database"), "{}", r.2);
    assert!(!r.2.contains(" at line "), "{}", r.2);
    assert!(r.2.contains(&format!("{message} (code 3D000)")), "{}", r.2);
    assert_eq!(r.2.lines().count(), 1, "{}", r.2);
}

/// An inbox dead letter (a received message that conflicted with a stored event): `dlq show`
/// says where it came from, and `dlq list`'s LAST ERROR says what conflicts with what instead
/// of repeating the event id the EVENT ID column has.
#[tokio::test]
async fn an_inbox_conflict_shows_its_broker_metadata_and_what_conflicts() {
    let db = Db::sqlite("inbox_conflict").await;
    let id = Uuid::now_v7().to_string();
    let chain = serde_json::to_string(&[
        format!(
            "event {id} conflicts with a stored event: parcel@shop p-7 already has sequence 3 under another event id (purge this dead letter if the stored event is the one to keep; a replay commits it once that place is free)"
        ),
        "concurrent modification: parcel@shop p-7 already has an event with sequence 3".to_owned(),
    ])
    .unwrap();
    let envelope = format!(
        r#"{{"id":"{id}","source":"shop","type":"parcel.sent","specversion":"1.0","subject":"p-7","data":{{}}}}"#
    );
    let broker = r#"{"stream":"PARCELS","stream_sequence":42,"delivery_count":2,"subject":"events.parcel.sent"}"#;
    let mut tx = db.store.begin().await.unwrap();
    tx.execute(
        "INSERT INTO event_dead_letters (event_id, handler, name, version, envelope, attempts,
            first_failed_at, last_failed_at, reason, error_chain, dead_at, kind, origin)
         VALUES ($1, 'billing-inbox', 'parcel.sent', 1, $2, 2, 1000, 1000, 'conflict', $3, 1000,
            'inbox', $4)",
        &[
            SqlValue::Text(&id),
            SqlValue::Text(&envelope),
            SqlValue::Text(&chain),
            SqlValue::Text(broker),
        ],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let dead = db.open_dead_letters().await;
    assert_eq!(dead.len(), 1);

    let r = db.cli(&["dlq", "show", &dead[0].id.to_string()]).await;
    ok(&r);
    for line in [
        "  received from stream PARCELS",
        "  stream seq    42",
        "  subject       events.parcel.sent",
        "  delivered     2 times by the broker",
    ] {
        assert!(r.1.lines().any(|l| l == line), "no {line:?} in:\n{}", r.1);
    }

    let r = db.cli(&["dlq", "list"]).await;
    ok(&r);
    let row = r.1.lines().nth(1).unwrap();
    assert_eq!(row.matches(&id).count(), 1, "{row}");
    assert!(
        row.contains(
            "conflicts with a stored event: parcel@shop p-7 already has sequence 3 under another event id"
        ),
        "{row}"
    );
}

/// The application's outbox, as an embedding application gives it to its tool: it knows
/// `parcel.sent` now (`cli_test.count` takes it).
fn counting_outbox(store: Store) -> Result<Outbox, event_runtime::OutboxError> {
    Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().handler::<count>())
        .build()
}

/// A transport inbox's dead letter (a `parcel.sent` received while the application did not
/// know that event) is replayed by `dlq replay ID` of the application's own tool when it gives
/// its outbox (`App::outbox`), through the inbox core and with no broker; the standalone tool
/// skips it and says why.
#[tokio::test]
async fn dlq_replay_of_an_inbox_dead_letter_goes_through_the_applications_outbox() {
    use event_runtime::inbox::{Incoming, Origin, Verdict};
    let db = Db::sqlite("inbox_replay").await;
    let unaware = Outbox::builder(db.store.clone())
        .dispatcher(Dispatcher::builder_empty())
        .build()
        .unwrap();
    let envelope = event_core::Envelope::new(ParcelSent {
        parcel: "p-1".into(),
        address: "1 Rue de Rivoli".into(),
    })
    .with_sequence(1)
    .with_source("urn:test:shop");
    let body = serde_json::to_vec(&envelope).unwrap();
    let receipt = unaware
        .receive(
            "queue:billing",
            vec![Incoming::new(body, Origin::new("queue", "parcels", 9))],
        )
        .await;
    assert_eq!(
        receipt.verdicts,
        [Verdict::DeadLettered(
            event_runtime::DeadLetterReason::UnknownEvent
        )]
    );
    let id = db.open_dead_letters().await[0].id.to_string();
    let replay = [
        "dlq",
        "replay",
        id.as_str(),
        "--reason",
        "deployed",
        "--actor",
        "ops",
    ];

    let r = db.cli(&replay).await;
    failed(
        &r,
        &format!("dead letter {id} is a message a transport's inbox could not accept"),
    );
    assert!(r.2.contains("nothing was replayed"), "{}", r.2);
    // Over a selection, the deliveries' dead letters are replayed and the inbox's skipped,
    // said once.
    let r = db
        .cli(&["dlq", "replay", "--all", "--yes", "--reason", "deployed"])
        .await;
    ok(&r);
    assert!(
        r.2.contains(&format!("warning: skipped dead letter {id} is a message")),
        "{}",
        r.2
    );
    assert!(!r.1.contains("another operation"), "{}", r.1);
    assert_eq!(db.open_dead_letters().await.len(), 1);

    let registry = Registry::builder().handler::<count>().build().unwrap();
    let args: Vec<String> = ["events", "--database", db.url.as_str()]
        .iter()
        .chain(&replay)
        .map(|s| (*s).to_owned())
        .collect();
    let app = App::embedded("billing events", &registry).outbox(&counting_outbox);
    let r = run(args, app).await;
    ok(&r);
    assert!(
        r.1.contains(&format!(
            "replayed 1 inbox dead letter through the inbox core: {id} (1 new events"
        )),
        "{}",
        r.1
    );
    assert!(db.open_dead_letters().await.is_empty());
    let origin = db
        .store
        .received_origin(envelope.id())
        .await
        .unwrap()
        .expect("the replayed event keeps its origin");
    assert_eq!(origin.position, 9);
    let audit = db.store.audit_log(5).await.unwrap();
    assert_eq!(
        (audit[0].action.as_str(), audit[0].actor.as_str()),
        ("replay", "ops")
    );
}

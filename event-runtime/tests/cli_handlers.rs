//! `events handler purge|retarget` (what removed handlers left, audited) and the unreadable
//! delivery rows `events check` and `outbox stats` flag, driven through
//! `event_runtime::cli::run_with_output` against a temporary SQLite file.
#![cfg(feature = "cli")]

use std::process::ExitCode;
use std::time::Duration;

use event_core::{event_handler, DomainEvent, EventRecorder, HandlerError};
use event_runtime::cli::{run_with_output, App};
use event_runtime::{
    DeadLetterFilter, Delivery, DeliveryError, Destination, Dispatcher, Outbox, Registry, Routing,
    SqlValue, Store,
};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Debug, Serialize, Deserialize, DomainEvent)]
#[event(name = "crate.packed", version = 1)]
struct CratePacked {
    #[event(aggregate_id)]
    id: String,
    fragile: bool,
}

/// The release before: refuses fragile crates for good.
#[event_handler(name = "cli_retire.old_ship")]
fn old_ship(e: &CratePacked) -> Result<(), HandlerError> {
    if e.fragile {
        return Err(HandlerError::permanent_msg(
            "the old carrier takes no fragile crates",
        ));
    }
    Ok(())
}

#[event_handler(name = "cli_retire.old_count")]
fn old_count(_: &CratePacked) {}

/// The release after.
#[event_handler(name = "cli_retire.ship")]
fn ship(_: &CratePacked) {}

#[derive(Debug, Serialize, Deserialize, DomainEvent)]
#[event(name = "label.printed", version = 1)]
struct LabelPrinted {
    #[event(aggregate_id)]
    id: String,
}

/// Runs in the committing transaction: it has no deliveries.
#[event_handler(name = "cli_retire.stock", in_transaction)]
fn stock(_: &CratePacked) {}

/// A handler of the release after that takes other events.
#[event_handler(name = "cli_retire.label")]
fn label(_: &LabelPrinted) {}

struct Db {
    url: String,
    store: Store,
    file: std::path::PathBuf,
}

impl Drop for Db {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.file.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Db {
    async fn sqlite(test: &str) -> Db {
        let file = std::env::temp_dir().join(format!("cli_{test}_{}.db", Uuid::now_v7().simple()));
        let url = format!("sqlite://{}", file.display());
        let store = Store::connect(&url).await.expect("open SQLite");
        Db { url, store, file }
    }

    fn outbox(&self, dispatcher: event_runtime::DispatcherBuilder) -> Outbox {
        Outbox::builder(self.store.clone())
            .dispatcher(dispatcher)
            .build()
            .expect("outbox")
    }

    /// Runs `events --database URL ARGS…` as `app`: (status, stdout, stderr).
    async fn cli(&self, app: App<'_>, args: &[&str]) -> (ExitCode, String, String) {
        let mut full = vec!["events", "--database", self.url.as_str()];
        full.extend(args);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run_with_output(full, app, &mut out, &mut err).await;
        (
            code,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }
}

async fn commit(outbox: &Outbox, crates: &[(&str, bool)]) {
    let mut uow = outbox.begin().await.unwrap();
    let mut recorder = EventRecorder::new();
    for (id, fragile) in crates {
        recorder.record(CratePacked {
            id: (*id).into(),
            fragile: *fragile,
        });
    }
    uow.extend(recorder.take());
    uow.commit().await.unwrap();
}

fn ok(r: &(ExitCode, String, String)) {
    assert_eq!(r.0, ExitCode::SUCCESS, "stdout:\n{}\nstderr:\n{}", r.1, r.2);
}

fn failed(r: &(ExitCode, String, String), message: &str) {
    assert_ne!(
        r.0,
        ExitCode::SUCCESS,
        "expected a failure; stdout:\n{}",
        r.1
    );
    assert!(
        r.2.starts_with("error: ") && r.2.contains(message),
        "stderr should be `error: …{message}…`, is:\n{}",
        r.2
    );
}

/// The release before left a dead letter and a pending delivery of `old_ship` and two
/// pending deliveries of `old_count`; the release after has `ship` only.
#[tokio::test]
async fn handler_purge_and_retarget_take_what_removed_handlers_left() {
    let db = Db::sqlite("retire").await;
    let before = db.outbox(
        Dispatcher::builder_empty()
            .handler::<old_ship>()
            .handler::<old_count>(),
    );
    commit(&before, &[("c-1", true)]).await;
    before.drain(Duration::from_secs(30)).await.unwrap();
    commit(&before, &[("c-2", false), ("c-3", false)]).await;
    // Left: old_ship's c-1 dead, its c-2 and c-3 pending; old_count's c-2 and c-3 pending.
    let registry = Registry::builder()
        .handler::<ship>()
        .handler::<label>()
        .build()
        .unwrap();
    let app = || App::embedded("shop events", &registry);

    // Refusals: each says why, changes nothing and exits non-zero.
    let refusals: [(bool, &[&str], &str); 6] = [
        (
            false,
            &["handler", "purge", "cli_retire.old_count"],
            "knows no application event types",
        ),
        (
            true,
            &["handler", "purge", "cli_retire.ship", "--actor", "alice"],
            "`cli_retire.ship` is a handler of this application",
        ),
        (
            true,
            &[
                "handler",
                "retarget",
                "cli_retire.old_ship",
                "--to",
                "cli_retire.nosuch",
                "--actor",
                "alice",
            ],
            "`cli_retire.nosuch` is not a handler of this application",
        ),
        (
            true,
            &[
                "handler",
                "retarget",
                "cli_retire.old_ship",
                "--to",
                "cli_retire.label",
                "--actor",
                "alice",
            ],
            "`cli_retire.label` does not take crate.packed, which `cli_retire.old_ship` left undelivered",
        ),
        (
            true,
            &["handler", "purge", "cli_retire.typo", "--actor", "alice"],
            "no deliveries of handler `cli_retire.typo`",
        ),
        (
            true,
            &["handler", "purge", "cli_retire.old_count", "--actor", " "],
            "--actor must name who",
        ),
    ];
    for (embedded, args, message) in refusals {
        let on = if embedded { app() } else { App::standalone() };
        failed(&db.cli(on, args).await, message);
    }
    assert!(db.store.audit_log(10).await.unwrap().is_empty());

    let r = db
        .cli(
            app(),
            &[
                "handler",
                "retarget",
                "cli_retire.old_ship",
                "--to",
                "cli_retire.ship",
                "--actor",
                "alice",
                "--yes",
            ],
        )
        .await;
    ok(&r);
    assert!(
        r.1.contains(
            "moved what `cli_retire.old_ship` left onto `cli_retire.ship`: 2 pending deliveries and 1 open dead letter"
        ),
        "{}",
        r.1
    );
    assert!(
        r.1.contains("handler-retarget by alice") && r.1.contains("replaced by cli_retire.ship"),
        "{}",
        r.1
    );
    let dead = db
        .store
        .dead_letters(&DeadLetterFilter::default())
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].handler, "cli_retire.ship");

    let r = db
        .cli(
            app(),
            &[
                "handler",
                "purge",
                "cli_retire.old_count",
                "--actor",
                "bob",
                "--reason",
                "counted elsewhere",
                "--yes",
            ],
        )
        .await;
    ok(&r);
    assert!(
        r.1.contains(
            "purged what `cli_retire.old_count` left: 2 pending deliveries and 0 open dead letters"
        ),
        "{}",
        r.1
    );
    // Nothing is left: said so, nothing audited. (What moved is no longer the old name's.)
    let r = db
        .cli(
            app(),
            &["handler", "purge", "cli_retire.old_count", "--actor", "bob"],
        )
        .await;
    ok(&r);
    assert!(r.1.contains("left no pending deliveries"), "{}", r.1);
    failed(
        &db.cli(
            app(),
            &[
                "handler",
                "retarget",
                "cli_retire.old_ship",
                "--to",
                "cli_retire.ship",
                "--actor",
                "alice",
            ],
        )
        .await,
        "no deliveries of handler `cli_retire.old_ship`",
    );

    let r = db.cli(app(), &["dlq", "audit", "--json"]).await;
    ok(&r);
    let audit: serde_json::Value = serde_json::from_str(&r.1).unwrap();
    let actions: Vec<(&str, &str, u64)> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap(),
                e["actor"].as_str().unwrap(),
                e["count"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        [
            ("handler-purge", "bob", 2),
            ("handler-retarget", "alice", 3)
        ]
    );

    // The new handler delivers what moved; the dead letter replays to it.
    let after = db.outbox(Dispatcher::builder_empty().handler::<ship>());
    after.drain(Duration::from_secs(30)).await.unwrap();
    ok(&db
        .cli(
            app(),
            &[
                "dlq",
                "replay",
                "--all",
                "--yes",
                "--reason",
                "the new carrier takes it",
                "--actor",
                "alice",
            ],
        )
        .await);
    after.drain(Duration::from_secs(30)).await.unwrap();
    let stats = db.store.stats().await.unwrap();
    let ship = stats
        .handlers
        .iter()
        .find(|h| h.handler == "cli_retire.ship")
        .unwrap();
    assert_eq!((ship.pending, ship.completed, ship.dead), (0, 3, 0));
    ok(&db.cli(app(), &["check"]).await);
}

/// A hand-edited `next_attempt_at` leaves a delivery the engine never claims: `check` fails
/// and `outbox stats` says so, under its own label.
#[tokio::test]
async fn an_unreadable_delivery_fails_check_and_shows_in_stats() {
    let db = Db::sqlite("unreadable").await;
    let outbox = db.outbox(Dispatcher::builder_empty().handler::<ship>());
    commit(&outbox, &[("u-1", false), ("u-2", false)]).await;
    let registry = Registry::builder().handler::<ship>().build().unwrap();
    let app = || App::embedded("shop events", &registry);
    ok(&db.cli(app(), &["check"]).await);

    let mut tx = db.store.begin().await.unwrap();
    let n = tx
        .execute(
            "UPDATE event_deliveries SET next_attempt_at = $1 WHERE aggregate_id = $2",
            &[
                SqlValue::Text("2026-12-01T10:00:00Z"),
                SqlValue::Text("u-1"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
    tx.commit().await.unwrap();

    let r = db.cli(app(), &["check"]).await;
    failed(&r, "the engine cannot read the row of 1 pending delivery");
    assert!(
        r.1.contains("pending cli_retire.ship: 1 delivery whose row the engine cannot read"),
        "{}",
        r.1
    );

    let r = db.cli(app(), &["outbox", "stats"]).await;
    ok(&r);
    let line =
        r.1.lines()
            .find(|l| l.trim_start().starts_with("unreadable by the engine"))
            .unwrap_or_else(|| panic!("no unreadable line:\n{}", r.1));
    assert_eq!(
        line.split_whitespace().collect::<Vec<_>>(),
        ["unreadable", "by", "the", "engine", "1"]
    );
    assert!(
        r.1.contains("note: the engine cannot read the row of 1 pending delivery"),
        "{}",
        r.1
    );
    let header = r.1.lines().find(|l| l.starts_with("HANDLER")).unwrap();
    assert!(header.contains("UNREADABLE"), "{header}");

    let r = db.cli(app(), &["outbox", "stats", "--json"]).await;
    ok(&r);
    let stats: serde_json::Value = serde_json::from_str(&r.1).unwrap();
    assert_eq!(
        (stats["pending"].as_u64(), stats["unreadable"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(stats["handlers"][0]["unreadable"], 1);
    let r = db.cli(app(), &["handler", "list", "--json"]).await;
    ok(&r);
    let list: serde_json::Value = serde_json::from_str(&r.1).unwrap();
    assert_eq!(
        (list[0]["handler"].as_str(), list[0]["unreadable"].as_u64()),
        (Some("cli_retire.ship"), Some(1))
    );
}

/// A text `created_at` (SQLite keeps it) does not break the statistics that flag it.
#[tokio::test]
async fn stats_count_a_delivery_whose_creation_time_is_text() {
    let db = Db::sqlite("unreadable_created").await;
    let outbox = db.outbox(Dispatcher::builder_empty().handler::<ship>());
    commit(&outbox, &[("t-1", false)]).await;
    db.store
        .query("UPDATE event_deliveries SET created_at = $1")
        .bind("yesterday")
        .execute()
        .await
        .unwrap();
    let r = db
        .cli(App::standalone(), &["outbox", "stats", "--json"])
        .await;
    ok(&r);
    let stats: serde_json::Value = serde_json::from_str(&r.1).unwrap();
    assert_eq!(
        (stats["pending"].as_u64(), stats["unreadable"].as_u64()),
        (Some(1), Some(1))
    );
}

/// A transport's relay whose broker is down: every event it routes stays pending.
struct DownRelay;

#[async_trait::async_trait]
impl Destination for DownRelay {
    fn name(&self) -> &str {
        "nats:down3"
    }

    fn route(&self, _: &event_core::EventDescriptor) -> Option<Routing> {
        Some(Routing { ordered: true })
    }

    async fn deliver(&self, _: &Delivery<'_>) -> Result<(), DeliveryError> {
        Err(DeliveryError::Unavailable {
            reason: "the broker is down".into(),
            retry_after: Duration::from_secs(60),
        })
    }
}

/// Pending deliveries per destination, by name.
async fn pending(store: &Store) -> Vec<(String, u64)> {
    let mut p: Vec<(String, u64)> = store
        .stats()
        .await
        .unwrap()
        .handlers
        .into_iter()
        .map(|h| (h.handler, h.pending))
        .collect();
    p.sort();
    p
}

/// A relay's pending deliveries are events not yet published: `handler list` shows it as a
/// relay and never suggests purging it; `handler purge|retarget` refuse it unless
/// `--force-relay`, and give up on or move nothing without `--yes`, saying what would be lost.
#[tokio::test]
async fn handler_purge_and_retarget_need_yes_and_refuse_a_relay() {
    let db = Db::sqlite("relay").await;
    let before = Outbox::builder(db.store.clone())
        .dispatcher(Dispatcher::builder_empty().handler::<old_count>())
        .destination(std::sync::Arc::new(DownRelay))
        .build()
        .expect("outbox");
    commit(&before, &[("r-1", false), ("r-2", false), ("r-3", false)]).await;
    let left = vec![
        ("cli_retire.old_count".to_owned(), 3),
        ("nats:down3".to_owned(), 3),
    ];
    assert_eq!(pending(&db.store).await, left);
    let registry = Registry::builder().handler::<ship>().build().unwrap();
    let app = || App::embedded("shop events", &registry);

    let r = db.cli(app(), &["handler", "list"]).await;
    ok(&r);
    let relay_line = r.1.lines().find(|l| l.starts_with("nats:down3")).unwrap();
    assert!(relay_line.starts_with("nats:down3 (relay)"), "{}", r.1);
    assert!(
        r.1.contains("cli_retire.old_count (not registered)"),
        "{}",
        r.1
    );
    assert!(
        r.1.lines()
            .any(|l| l.starts_with("(relay): ") && l.contains("not yet published")),
        "{}",
        r.1
    );
    let r = db.cli(app(), &["handler", "list", "--json"]).await;
    ok(&r);
    let list: serde_json::Value = serde_json::from_str(&r.1).unwrap();
    let relays: Vec<(&str, bool)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["handler"].as_str().unwrap(),
                d["relay"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        relays,
        [
            ("cli_retire.old_count", false),
            ("cli_retire.ship", false),
            ("nats:down3", true)
        ]
    );

    // Each refusal says why and what would be lost, changes nothing and exits non-zero.
    let refusals: [(&[&str], &[&str]); 5] = [
        (
            &["handler", "purge", "nats:down3", "--yes"],
            &[
                "`nats:down3` is a transport's relay",
                "3 pending deliveries and 0 open dead letters are events committed but not yet published",
                "never reach the consumers",
                "--force-relay",
                "nothing was purged",
            ],
        ),
        (
            &[
                "handler",
                "retarget",
                "nats:down3",
                "--to",
                "cli_retire.ship",
                "--yes",
            ],
            &[
                "`nats:down3` is a transport's relay",
                "never published",
                "nothing was moved",
            ],
        ),
        (
            &["handler", "purge", "nats:down3", "--force-relay"],
            &[
                "`nats:down3` left 3 pending deliveries and 0 open dead letters",
                "Pass --yes to confirm; nothing was purged",
            ],
        ),
        (
            &["handler", "purge", "cli_retire.old_count"],
            &[
                "`cli_retire.old_count` left 3 pending deliveries and 0 open dead letters: purging gives up on them, and those events are never delivered",
                "Pass --yes to confirm; nothing was purged",
            ],
        ),
        (
            &[
                "handler",
                "retarget",
                "cli_retire.old_count",
                "--to",
                "cli_retire.ship",
            ],
            &[
                "`cli_retire.old_count` left 3 pending deliveries and 0 open dead letters: re-targeting moves them onto `cli_retire.ship`",
                "Pass --yes to confirm; nothing was moved",
            ],
        ),
    ];
    for (args, messages) in refusals {
        let mut args = args.to_vec();
        args.extend(["--actor", "alice"]);
        let r = db.cli(app(), &args).await;
        for message in messages {
            failed(&r, message);
        }
    }
    assert_eq!(pending(&db.store).await, left);
    assert!(db.store.audit_log(10).await.unwrap().is_empty());

    let r = db
        .cli(
            app(),
            &[
                "handler",
                "purge",
                "nats:down3",
                "--force-relay",
                "--yes",
                "--actor",
                "alice",
                "--reason",
                "the stream was deleted for good",
            ],
        )
        .await;
    ok(&r);
    assert!(
        r.1.contains("purged what `nats:down3` left: 3 pending deliveries"),
        "{}",
        r.1
    );
    assert_eq!(
        pending(&db.store).await,
        [
            ("cli_retire.old_count".to_owned(), 3),
            ("nats:down3".to_owned(), 0)
        ]
    );
}

/// A pause holds back deliveries, and an in-transaction handler has none: pausing one is
/// refused (it used to be accepted and change nothing), embedded, where the tool knows it.
#[tokio::test]
async fn pausing_an_in_transaction_handler_is_refused() {
    let db = Db::sqlite("pause_in_tx").await;
    let outbox = db.outbox(
        Dispatcher::builder_empty()
            .handler::<stock>()
            .handler::<ship>(),
    );
    commit(&outbox, &[("p-1", false)]).await;
    let registry = Registry::builder()
        .handler::<stock>()
        .handler::<ship>()
        .build()
        .unwrap();
    let app = || App::embedded("shop events", &registry);
    for force in [false, true] {
        let mut args = vec![
            "handler",
            "pause",
            "cli_retire.stock",
            "--reason",
            "stock counts are wrong",
            "--actor",
            "alice",
        ];
        if force {
            args.push("--force");
        }
        failed(
            &db.cli(app(), &args).await,
            "`cli_retire.stock` runs inside the committing transaction (`in_transaction`): it has no deliveries for a pause to hold back",
        );
    }
    assert!(db.store.paused_destinations().await.unwrap().is_empty());
    assert!(db.store.audit_log(10).await.unwrap().is_empty());
    // An after-commit handler of the same event still pauses.
    ok(&db
        .cli(
            app(),
            &[
                "handler",
                "pause",
                "cli_retire.ship",
                "--reason",
                "carrier down",
                "--actor",
                "alice",
            ],
        )
        .await);
}

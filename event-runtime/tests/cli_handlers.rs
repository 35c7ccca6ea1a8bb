//! The unreadable delivery rows `events check` and `outbox stats` flag, driven through
//! `event_runtime::cli::run_with_output` against a temporary SQLite file.
#![cfg(feature = "cli")]

use std::process::ExitCode;
use std::time::Duration;

use event_core::{event_handler, DomainEvent, EventRecorder, HandlerError};
use event_runtime::cli::{run_with_output, App};
use event_runtime::{DeadLetterFilter, Dispatcher, Outbox, Registry, SqlValue, Store};
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
}

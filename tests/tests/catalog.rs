//! The schema catalog: built from the registry, checked against a snapshot under the
//! compatibility modes (a deliberately incompatible change fails), blessed on purpose, and the
//! embedded `events catalog` / `events check` commands.

mod common;

use std::process::ExitCode;
use std::time::Duration;

use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
use event_runtime::cli::{run_with_output, App};
use event_runtime::schema::{Catalog, CatalogCheck, Compatibility};
use event_runtime::{Dispatcher, Outbox, Registry};

/// Version 1 as it shipped (the snapshot is taken from it).
mod shipped {
    use super::*;

    #[derive(
        Debug, Clone, serde::Serialize, serde::Deserialize, DomainEvent, schemars::JsonSchema,
    )]
    #[event(name = "invoice.issued", version = 1)]
    pub struct Issued {
        #[event(aggregate_id)]
        pub invoice: String,
        pub total_cents: u64,
        pub note: Option<String>,
    }
}

/// The same (name, version) after a compatible change: an optional field added.
mod compatible {
    use super::*;

    #[derive(
        Debug, Clone, serde::Serialize, serde::Deserialize, DomainEvent, schemars::JsonSchema,
    )]
    #[event(name = "invoice.issued", version = 1)]
    pub struct Issued {
        #[event(aggregate_id)]
        pub invoice: String,
        pub total_cents: u64,
        pub note: Option<String>,
        #[serde(default)]
        pub currency: Option<String>,
    }
}

/// The same (name, version) after an incompatible change: a required field added and a type
/// changed.
mod incompatible {
    use super::*;

    #[derive(
        Debug, Clone, serde::Serialize, serde::Deserialize, DomainEvent, schemars::JsonSchema,
    )]
    #[event(name = "invoice.issued", version = 1)]
    pub struct Issued {
        #[event(aggregate_id)]
        pub invoice: String,
        pub total_cents: String,
        pub note: Option<String>,
        pub currency: String,
    }
}

/// No JSON Schema.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, DomainEvent)]
#[event(name = "invoice.voided", version = 1)]
struct Voided {
    #[event(aggregate_id)]
    invoice: String,
}

fn registry<E: DomainEvent>() -> Registry {
    Registry::builder().event::<E>().build().unwrap()
}

fn snapshot_path(test: &str) -> std::path::PathBuf {
    common::temp_dir().join(format!("{}.catalog.json", common::unique(test)))
}

#[test]
fn the_catalog_has_every_event_with_its_json_schema() {
    let catalog = Catalog::from_registry(
        &Registry::builder()
            .event::<shipped::Issued>()
            .event::<Voided>()
            .build()
            .unwrap(),
    );
    let names: Vec<_> = catalog
        .events
        .iter()
        .map(|e| (e.name.as_str(), e.version))
        .collect();
    assert_eq!(names, [("invoice.issued", 1), ("invoice.voided", 1)]);
    let schema = &catalog.events[0].schema;
    assert_eq!(schema["properties"]["total_cents"]["type"], "integer");
    assert_eq!(
        schema["required"],
        serde_json::json!(["invoice", "total_cents"])
    );
    assert_eq!(
        catalog.missing_schemas(),
        ["invoice.voided v1 (catalog::Voided)"]
    );
}

#[test]
fn a_deliberately_incompatible_change_fails_the_check_with_event_field_and_rule() {
    let path = snapshot_path("incompatible");
    let check = CatalogCheck::new(&path);
    let shipped = Catalog::from_registry(&registry::<shipped::Issued>());
    assert!(check.run_with(&shipped, true).unwrap().blessed);

    let ok = check
        .run_with(
            &Catalog::from_registry(&registry::<compatible::Issued>()),
            false,
        )
        .unwrap();
    assert!(ok.is_ok(), "{ok}");
    assert_eq!(ok.stale, ["changed: invoice.issued v1"]);

    let report = check
        .run_with(
            &Catalog::from_registry(&registry::<incompatible::Issued>()),
            false,
        )
        .unwrap();
    assert!(!report.is_ok());
    let text = report.to_string();
    assert!(
        text.contains("invoice.issued v1: field `currency`: BACKWARD RequiredFieldAdded"),
        "{text}"
    );
    assert!(
        text.contains("invoice.issued v1: field `total_cents`: BACKWARD TypeChanged"),
        "{text}"
    );
    // FORWARD: old consumers read new data. Adding an optional field is fine that way too.
    let forward = CatalogCheck::new(&path).mode(Compatibility::Forward);
    assert!(forward
        .run_with(
            &Catalog::from_registry(&registry::<compatible::Issued>()),
            false
        )
        .unwrap()
        .is_ok());
    // NONE for this event turns the check off.
    let none = CatalogCheck::new(&path).mode_for("invoice.issued", Compatibility::None);
    assert!(none
        .run_with(
            &Catalog::from_registry(&registry::<incompatible::Issued>()),
            false
        )
        .unwrap()
        .is_ok());
    std::fs::remove_file(path).unwrap();
}

#[test]
#[should_panic(expected = "the event catalog is not compatible")]
fn assert_panics_on_an_incompatible_change() {
    let path = snapshot_path("assert_panics");
    CatalogCheck::new(&path)
        .run_with(
            &Catalog::from_registry(&registry::<shipped::Issued>()),
            true,
        )
        .unwrap();
    CatalogCheck::new(&path).assert(&registry::<incompatible::Issued>());
}

#[test]
fn a_missing_snapshot_says_how_to_create_it() {
    let err = CatalogCheck::new(snapshot_path("missing"))
        .run(&registry::<shipped::Issued>())
        .unwrap_err();
    assert!(err.to_string().contains("EVENTS_CATALOG=bless"), "{err}");
}

async fn cli(args: &[&str], registry: &Registry) -> (ExitCode, String) {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let mut argv = vec!["app", "events"];
    argv.extend_from_slice(args);
    let code = run_with_output(
        argv.iter().skip(1),
        App::embedded("app events", registry),
        &mut out,
        &mut err,
    )
    .await;
    let mut text = String::from_utf8(out).unwrap();
    text.push_str(&String::from_utf8(err).unwrap());
    (code, text)
}

#[tokio::test]
async fn events_catalog_prints_the_schemas() {
    let registry = Registry::builder()
        .event::<shipped::Issued>()
        .event::<Voided>()
        .build()
        .unwrap();
    let (code, text) = cli(&["catalog", "--json"], &registry).await;
    assert_eq!(code, ExitCode::SUCCESS, "{text}");
    let entries: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(entries[0]["name"], "invoice.issued");
    assert_eq!(
        entries[0]["schema"]["properties"]["total_cents"]["format"],
        "uint64"
    );
    assert!(entries[1]["schema"].is_null());
    let (_, table) = cli(&["catalog"], &registry).await;
    assert!(table.contains("invoice, note, total_cents"), "{table}");
    assert!(table.contains("no JSON Schema"), "{table}");
}

#[event_handler(name = "catalog.reject")]
fn reject(_: &shipped::Issued) -> Result<(), HandlerError> {
    Err(HandlerError::permanent_msg("refused"))
}

#[tokio::test]
async fn events_check_lists_what_the_deployed_code_cannot_decode() {
    let (url, store) = common::sqlite("check").await;
    let outbox = Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().handler::<reject>())
        .build()
        .unwrap();
    let mut uow = outbox.begin().await.unwrap();
    uow.add(Envelope::new(shipped::Issued {
        invoice: "I-1".into(),
        total_cents: 5,
        note: None,
    }));
    uow.commit().await.unwrap();
    outbox.drain(Duration::from_secs(10)).await.unwrap();

    // The code that wrote it decodes its dead letter.
    let (code, text) = cli(
        &["--database", &url, "check"],
        outbox.dispatcher().registry(),
    )
    .await;
    assert_eq!(code, ExitCode::SUCCESS, "{text}");
    assert!(
        text.contains("0 pending deliveries and 1 open dead letter,"),
        "{text}"
    );

    // Code where invoice.issued v1 changed incompatibly cannot: check fails and says which.
    let (code, text) = cli(
        &["--database", &url, "check"],
        &registry::<incompatible::Issued>(),
    )
    .await;
    assert_ne!(code, ExitCode::SUCCESS, "{text}");
    assert!(text.contains("dead letter 1 (catalog.reject"), "{text}");
    assert!(text.contains("invalid type"), "{text}");

    // And code that no longer has the type at all.
    let (code, text) = cli(&["--database", &url, "check"], &registry::<Voided>()).await;
    assert_ne!(code, ExitCode::SUCCESS, "{text}");
    assert!(
        text.contains("unknown event type `invoice.issued`"),
        "{text}"
    );
}

//! The example's schema catalog against its committed snapshot, `examples/events.catalog.json`.
//!
//! The snapshot records every (name, version) the example registers with the JSON Schema of
//! its payload. [`CatalogCheck`] compares the current catalog with it in BACKWARD mode (the
//! default): a change that would keep this code from reading what is already written — a
//! required field added, a type changed, a version removed — fails the build, naming the
//! event, the field and the rule. Compatible changes (a new version, an optional field, a new
//! event) pass, and this test also insists that the snapshot records them, so that the file
//! in the repository is always the catalog of the code beside it.
//!
//! To change the catalog on purpose (after a compatible change, or an incompatible one that
//! you have decided to ship, for example with a new version and an upcaster instead):
//!
//! ```text
//! EVENTS_CATALOG=bless cargo test -p examples --test catalog
//! git diff examples/events.catalog.json   # review what changed
//! ```
//!
//! then commit the snapshot with the change.

use event_runtime::schema::{
    Catalog, CatalogCheck, CatalogEntry, Compatibility, Direction, Rule, BLESS_VAR,
};
use event_runtime::Registry;
use examples::orders::{
    self,
    domain::{LineAdded, OrderPlaced, OrderShipped},
};

const SNAPSHOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/events.catalog.json");

fn blessing() -> bool {
    std::env::var(BLESS_VAR).is_ok_and(|v| v == "bless")
}

/// A catalog written to a temporary file, as a snapshot to check against.
fn snapshot_of(test: &str, catalog: &Catalog) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "orders-{test}-{}.catalog.json",
        uuid::Uuid::now_v7().simple()
    ));
    std::fs::write(&path, catalog.to_snapshot()).unwrap();
    path
}

fn current() -> Catalog {
    Catalog::from_registry(&orders::registry().unwrap())
}

fn entry<'c>(catalog: &'c Catalog, name: &str, version: u32) -> &'c CatalogEntry {
    catalog
        .events
        .iter()
        .find(|e| e.name == name && e.version == version)
        .unwrap_or_else(|| panic!("{name} v{version} is not in the catalog"))
}

#[test]
fn the_committed_catalog_snapshot_is_compatible_and_up_to_date() {
    let registry = orders::registry().unwrap();
    let check = CatalogCheck::new(SNAPSHOT);
    check.assert(&registry);
    if blessing() {
        eprintln!("{SNAPSHOT} rewritten ({BLESS_VAR}=bless): review the diff and commit it");
        return;
    }
    let report = check.run(&registry).unwrap();
    assert!(
        report.stale.is_empty(),
        "{SNAPSHOT} is compatible but out of date:\n{report}rewrite it with \
         `{BLESS_VAR}=bless cargo test -p examples --test catalog`, review the diff and commit it"
    );
    // What the file holds: every event type of the example, each with a schema.
    let snapshot = Catalog::read(SNAPSHOT.as_ref()).unwrap();
    assert_eq!(snapshot, Catalog::from_registry(&registry));
    let keys: Vec<(&str, u32)> = snapshot
        .events
        .iter()
        .map(|e| (e.name.as_str(), e.version))
        .collect();
    assert_eq!(
        keys,
        [
            ("order.line_added", 1),
            ("order.placed", 1),
            ("order.placed", 2),
            ("order.shipped", 1),
        ]
    );
    assert!(snapshot.missing_schemas().is_empty());
}

#[test]
fn the_catalog_has_a_schema_for_each_version_of_order_placed() {
    let catalog = current();
    let required = |version| -> Vec<String> {
        let schema = &entry(&catalog, "order.placed", version).schema;
        serde_json::from_value(schema["required"].clone()).unwrap()
    };
    assert!(!required(1).contains(&"currency".to_owned()));
    assert!(required(2).contains(&"currency".to_owned()));
    assert_eq!(
        entry(&catalog, "order.placed", 2).rust_type,
        "examples::orders::domain::OrderPlacedV2"
    );
    // Amounts and dates as the envelope carries them: decimals as strings, ISO dates.
    let line = &entry(&catalog, "order.line_added", 1).schema;
    assert_eq!(line["properties"]["sales"]["type"][0], "string");
    let placed = &entry(&catalog, "order.placed", 2).schema;
    assert_eq!(placed["properties"]["order_date"]["format"], "date");
}

#[test]
fn adding_order_placed_v2_is_a_compatible_change_to_the_previous_release() {
    // The catalog of the release before version 2: the same three events, `order.placed` v1.
    let before = Registry::builder()
        .event::<LineAdded>()
        .event::<OrderPlaced>()
        .event::<OrderShipped>()
        .build()
        .unwrap();
    let path = snapshot_of("before-v2", &Catalog::from_registry(&before));
    for mode in [Compatibility::Backward, Compatibility::Full] {
        let report = CatalogCheck::new(&path)
            .mode(mode)
            .run_with(&current(), false)
            .unwrap();
        assert!(report.is_ok(), "{mode:?}:\n{report}");
        assert_eq!(report.stale, ["new: order.placed v2"], "{mode:?}");
    }
    std::fs::remove_file(path).unwrap();
}

#[test]
fn deliberately_incompatible_changes_fail_the_check_naming_event_field_and_rule() {
    let path = snapshot_of("incompatible", &current());
    let check = CatalogCheck::new(&path);
    let violations = |changed: &Catalog| {
        let report = check.run_with(changed, false).unwrap();
        assert!(!report.is_ok(), "the change passed");
        let lines: Vec<String> = report.violations.iter().map(|v| v.to_string()).collect();
        (report.violations, lines)
    };

    // Dropping version 1 (deleting the old type once the aggregate records version 2): the
    // version-1 rows in outboxes and dead letter queues could no longer be decoded.
    let mut dropped = current();
    dropped
        .events
        .retain(|e| (e.name.as_str(), e.version) != ("order.placed", 1));
    let (v, lines) = violations(&dropped);
    assert_eq!(v.len(), 1, "{lines:?}");
    assert_eq!(
        (
            v[0].event.as_str(),
            v[0].field.as_str(),
            v[0].rule,
            v[0].direction
        ),
        (
            "order.placed v1",
            "",
            Rule::VersionRemoved,
            Direction::Backward
        )
    );
    assert!(
        lines[0].contains("examples::orders::domain::OrderPlaced"),
        "{lines:?}"
    );

    // Adding `currency` to version 1 in place, as a required field, instead of a version 2:
    // the rows already written have no currency.
    let mut in_place = current();
    let v1 = in_place
        .events
        .iter_mut()
        .find(|e| (e.name.as_str(), e.version) == ("order.placed", 1))
        .unwrap();
    v1.schema["properties"]["currency"] = serde_json::json!({"type": "string"});
    v1.schema["required"]
        .as_array_mut()
        .unwrap()
        .push("currency".into());
    let (v, lines) = violations(&in_place);
    assert_eq!(v.len(), 1, "{lines:?}");
    assert_eq!(
        (v[0].event.as_str(), v[0].field.as_str(), v[0].rule),
        ("order.placed v1", "currency", Rule::RequiredFieldAdded)
    );
    assert!(
        lines[0].starts_with("order.placed v1: field `currency`: BACKWARD RequiredFieldAdded: "),
        "{lines:?}"
    );

    // Turning a line's quantity into a string.
    let mut retyped = current();
    let line = retyped
        .events
        .iter_mut()
        .find(|e| e.name == "order.line_added")
        .unwrap();
    line.schema["properties"]["quantity"] = serde_json::json!({"type": "string"});
    let (v, lines) = violations(&retyped);
    assert_eq!(
        (v[0].event.as_str(), v[0].field.as_str(), v[0].rule),
        ("order.line_added v1", "quantity", Rule::TypeChanged),
        "{lines:?}"
    );

    // The same change passes where the mode of that event is NONE.
    let report = CatalogCheck::new(&path)
        .mode_for("order.line_added", Compatibility::None)
        .run_with(&retyped, false)
        .unwrap();
    assert!(report.is_ok(), "{report}");

    std::fs::remove_file(path).unwrap();
}

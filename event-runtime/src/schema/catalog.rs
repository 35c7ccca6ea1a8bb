//! The schema catalog: every registered (name, version) with its JSON Schema, a committed
//! snapshot of it, and the check of the current catalog against that snapshot. The rules
//! themselves live in `compat`.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::dispatch::registry::Registry;
use crate::schema::compat::{check_catalog, CatalogEntry, Compatibility, Violation};

/// The environment variable that rewrites the snapshot on purpose: `EVENTS_CATALOG=bless`.
pub const BLESS_VAR: &str = "EVENTS_CATALOG";

/// Every event type of a registry with the JSON Schema of its payload, ordered by name then
/// version. Serialises as the snapshot file: `{"format": 1, "events": [CatalogEntry…]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Catalog {
    /// The snapshot format; 1.
    pub format: u32,
    /// The entries. An event type that does not derive `schemars::JsonSchema` has a `null`
    /// schema.
    pub events: Vec<CatalogEntry>,
}

impl Catalog {
    /// The catalog of `registry`.
    pub fn from_registry(registry: &Registry) -> Catalog {
        let mut events: Vec<CatalogEntry> = registry
            .events()
            .iter()
            .map(|e| CatalogEntry {
                name: e.name.to_owned(),
                version: e.version,
                rust_type: e.type_name.to_owned(),
                schema: crate::privacy::schema_of(e).unwrap_or(serde_json::Value::Null),
            })
            .collect();
        events.sort_by(|a, b| (&a.name, a.version).cmp(&(&b.name, b.version)));
        Catalog { format: 1, events }
    }

    /// Event types without a JSON Schema, as `name vN (rust type)`.
    pub fn missing_schemas(&self) -> Vec<String> {
        self.events
            .iter()
            .filter(|e| e.schema.is_null())
            .map(|e| format!("{} v{} ({})", e.name, e.version, e.rust_type))
            .collect()
    }

    /// The snapshot text: pretty JSON with a final newline, stable across runs.
    pub fn to_snapshot(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).unwrap_or_default();
        text.push('\n');
        text
    }

    /// Reads a snapshot.
    ///
    /// # Errors
    /// [`CatalogError::Io`] when the file cannot be read ([`CatalogError::MissingSnapshot`]
    /// when it does not exist), [`CatalogError::Parse`] when it is not a catalog.
    pub fn read(path: &Path) -> Result<Catalog, CatalogError> {
        let text = std::fs::read_to_string(path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                CatalogError::MissingSnapshot(path.to_owned())
            } else {
                CatalogError::Io {
                    path: path.to_owned(),
                    source,
                }
            }
        })?;
        serde_json::from_str(&text).map_err(|source| CatalogError::Parse {
            path: path.to_owned(),
            source,
        })
    }
}

/// Reading or writing a snapshot failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CatalogError {
    /// There is no snapshot yet.
    #[error("no catalog snapshot at {0}: run the check once with {BLESS_VAR}=bless to write it, then commit it")]
    MissingSnapshot(PathBuf),
    /// The file could not be read or written.
    #[error("cannot read or write catalog snapshot {path}")]
    Io {
        /// The snapshot path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a catalog snapshot.
    #[error("catalog snapshot {path} is not a catalog")]
    Parse {
        /// The snapshot path.
        path: PathBuf,
        /// serde's error, with line and column.
        #[source]
        source: serde_json::Error,
    },
}

/// What a catalog check found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CatalogReport {
    /// Incompatible changes, one line each.
    pub violations: Vec<Violation>,
    /// Event types without a JSON Schema (derive `schemars::JsonSchema`).
    pub missing_schemas: Vec<String>,
    /// Compatible differences from the snapshot (new event types or versions, changed
    /// schemas): the snapshot is out of date; bless it to record them.
    pub stale: Vec<String>,
    /// The snapshot was (re)written because `EVENTS_CATALOG=bless` was set.
    pub blessed: bool,
}

impl CatalogReport {
    /// `true` when there is no violation and every event has a schema.
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty() && self.missing_schemas.is_empty()
    }
}

impl fmt::Display for CatalogReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for v in &self.violations {
            writeln!(f, "incompatible: {v}")?;
        }
        for m in &self.missing_schemas {
            writeln!(
                f,
                "no JSON Schema: {m}: derive `schemars::JsonSchema` on it so that its changes can be checked"
            )?;
        }
        for s in &self.stale {
            writeln!(f, "snapshot out of date (compatible): {s}")?;
        }
        if self.blessed {
            writeln!(f, "snapshot rewritten ({BLESS_VAR}=bless)")?;
        }
        Ok(())
    }
}

/// Compares the current catalog with a committed snapshot under a compatibility mode, the
/// Confluent Schema Registry definitions (see [`check_schema`](crate::schema::check_schema)):
/// BACKWARD by default, overridable per event name.
///
/// Meant for a test of the application, so that an incompatible change fails the build before
/// it ships:
///
/// ```no_run
/// # fn main() {
/// use event_runtime::schema::{CatalogCheck, Compatibility};
/// use event_runtime::Registry;
///
/// let registry = Registry::from_inventory().build().unwrap();
/// CatalogCheck::new(concat!(env!("CARGO_MANIFEST_DIR"), "/events.catalog.json"))
///     .mode_for("order.placed", Compatibility::Full)
///     .assert(&registry);
/// # }
/// ```
///
/// With `EVENTS_CATALOG=bless` in the environment the check writes the current catalog to the
/// snapshot instead of failing (after printing what it replaces): do that on purpose, review
/// the diff, commit it.
#[derive(Debug, Clone)]
pub struct CatalogCheck {
    path: PathBuf,
    mode: Compatibility,
    overrides: HashMap<String, Compatibility>,
}

impl CatalogCheck {
    /// A check against the snapshot at `path`, in BACKWARD mode.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        CatalogCheck {
            path: path.into(),
            mode: Compatibility::Backward,
            overrides: HashMap::new(),
        }
    }

    /// Sets the default mode.
    pub fn mode(mut self, mode: Compatibility) -> Self {
        self.mode = mode;
        self
    }

    /// Sets the mode of one event name.
    pub fn mode_for(mut self, name: impl Into<String>, mode: Compatibility) -> Self {
        self.overrides.insert(name.into(), mode);
        self
    }

    /// Runs the check of `registry`'s catalog; blesses when `EVENTS_CATALOG=bless`.
    ///
    /// # Errors
    /// [`CatalogError`] when the snapshot is missing (and not being blessed), unreadable or
    /// malformed, or cannot be written.
    pub fn run(&self, registry: &Registry) -> Result<CatalogReport, CatalogError> {
        let bless = std::env::var(BLESS_VAR).is_ok_and(|v| v == "bless");
        self.run_with(&Catalog::from_registry(registry), bless)
    }

    /// As [`run`](Self::run), for a catalog you built, blessing when `bless`.
    ///
    /// # Errors
    /// As [`run`](Self::run).
    pub fn run_with(&self, current: &Catalog, bless: bool) -> Result<CatalogReport, CatalogError> {
        let mut report = CatalogReport {
            missing_schemas: current.missing_schemas(),
            ..CatalogReport::default()
        };
        match Catalog::read(&self.path) {
            Ok(snapshot) => {
                report.violations = check_catalog(
                    &snapshot.events,
                    &current.events,
                    self.mode,
                    &self.overrides,
                );
                for e in &current.events {
                    match snapshot
                        .events
                        .iter()
                        .find(|s| s.name == e.name && s.version == e.version)
                    {
                        None => report.stale.push(format!("new: {} v{}", e.name, e.version)),
                        Some(s) if s.schema != e.schema => report
                            .stale
                            .push(format!("changed: {} v{}", e.name, e.version)),
                        Some(_) => {}
                    }
                }
            }
            Err(CatalogError::MissingSnapshot(_)) if bless => {}
            Err(e) => return Err(e),
        }
        if bless {
            std::fs::write(&self.path, current.to_snapshot()).map_err(|source| {
                CatalogError::Io {
                    path: self.path.clone(),
                    source,
                }
            })?;
            report.blessed = true;
            report.violations.clear();
            report.stale.clear();
        }
        Ok(report)
    }

    /// Runs the check and panics with every violation when it fails: for a `#[test]`.
    ///
    /// # Panics
    /// On a violation, an event without a schema, or a [`CatalogError`].
    pub fn assert(&self, registry: &Registry) {
        match self.run(registry) {
            Ok(report) if report.is_ok() => {
                if !report.stale.is_empty() {
                    eprint!("{report}");
                }
            }
            Ok(report) => panic!(
                "the event catalog is not compatible with {}:\n{report}fix the change, or if it is intended, rewrite the snapshot with {BLESS_VAR}=bless and commit it",
                self.path.display()
            ),
            Err(e) => panic!("{e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(name: &str, version: u32, schema: serde_json::Value) -> CatalogEntry {
        CatalogEntry {
            name: name.into(),
            version,
            rust_type: format!("t::{name}"),
            schema,
        }
    }

    fn object(required: &[&str], props: serde_json::Value) -> serde_json::Value {
        json!({"type": "object", "properties": props, "required": required})
    }

    #[test]
    fn blessing_writes_the_snapshot_and_a_later_incompatible_change_fails() {
        let dir = std::env::temp_dir().join(format!("catalog-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("events.catalog.json");
        let check = CatalogCheck::new(&path);
        let v1 = Catalog {
            format: 1,
            events: vec![entry(
                "order.placed",
                1,
                object(&["id"], json!({"id": {"type": "string"}})),
            )],
        };
        assert!(matches!(
            check.run_with(&v1, false),
            Err(CatalogError::MissingSnapshot(_))
        ));
        assert!(check.run_with(&v1, true).unwrap().blessed);
        assert!(check.run_with(&v1, false).unwrap().is_ok());

        let mut v2 = v1.clone();
        v2.events[0].schema = object(
            &["id", "currency"],
            json!({"id": {"type": "string"}, "currency": {"type": "string"}}),
        );
        let report = check.run_with(&v2, false).unwrap();
        assert!(!report.is_ok());
        let text = report.to_string();
        assert!(
            text.contains("order.placed v1: field `currency`: BACKWARD"),
            "{text}"
        );
        assert_eq!(report.stale, ["changed: order.placed v1"]);
        let lenient = check.clone().mode_for("order.placed", Compatibility::None);
        assert!(lenient.run_with(&v2, false).unwrap().is_ok());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_event_without_a_schema_is_reported() {
        let c = Catalog {
            format: 1,
            events: vec![entry("a.b", 1, serde_json::Value::Null)],
        };
        assert_eq!(c.missing_schemas(), ["a.b v1 (t::a.b)"]);
    }
}

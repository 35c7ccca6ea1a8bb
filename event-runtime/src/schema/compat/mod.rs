//! Schema compatibility of event types: owns the public API (modes, rules, violations,
//! [`check_schema`], [`check_catalog`]); must not hold a rule itself, each family is a submodule.
//!
//! It compares the JSON Schema of an event (name, version) in a committed catalog snapshot with
//! the one the code produces now, under a compatibility mode, and reports every change that
//! would break a reader. The modes, the rules and the open-content-model stance are documented
//! on [`check_schema`] (this module is private; its items are re-exported from
//! [`crate::schema`]).
//!
//! # Why a checker of our own
//! The question is not "what changed between two documents" but "can a reader of schema A read
//! every payload a writer of schema B produces", read the way `serde` reads: unknown fields
//! ignored unless `deny_unknown_fields`, `Option` and `#[serde(default)]` fields optional, enum
//! variants matched by their tag wherever they sit in a `oneOf`, `$ref`s followed through
//! recursive types. No maintained Rust crate answers that question. The schema diff crates list
//! keyword changes between the two documents side by side (json-schema-diff calls itself a
//! best-effort, work-in-progress draft-07 diff; vld's `diff` compares `anyOf` branches by
//! position and `$ref` targets by name), so a reordered variant or a renamed definition reads
//! as a break, and what breaks is judged by JSON Schema validation, not by how `serde` reads;
//! validators such as `jsonschema` check a value against a schema, not a schema against a
//! schema; and Confluent's own checker is Java inside the Schema Registry. Hence
//! `can_read(reader, writer)`, written against what `schemars` emits.
//!
//! # Layout
//! [`check_schema`] asks `checker::can_read` once per direction. The walk normalises each side
//! into a union of branches (`branch`: `$ref`, `allOf`/`anyOf`/`oneOf`, `enum`, `const`, type
//! arrays), then hands each writer branch to its rule family: `literal` (enum values and
//! consts), `union` (which reader alternative reads a branch, tagged variants), `numeric`
//! (integer formats and number ranges), `string` (formats, lengths, patterns), `object`
//! (properties, `required`, content models, maps) and `array` (items, tuples, lengths).

mod array;
mod branch;
mod checker;
mod literal;
mod numeric;
mod object;
mod string;
mod union;

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use checker::can_read;

/// A compatibility mode, as defined by the Confluent Schema Registry.
///
/// Parsed case-insensitively from `BACKWARD`, `FORWARD`, `FULL` or `NONE`
/// ([`FromStr`], and `serde` from a string); displayed and serialized in upper case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Compatibility {
    /// The default: a consumer using the new schema can read data written with the old one.
    #[default]
    Backward,
    /// A consumer using the old schema can read data written with the new one.
    Forward,
    /// Both [`Compatibility::Backward`] and [`Compatibility::Forward`].
    Full,
    /// No check.
    None,
}

impl Compatibility {
    /// The mode's name in upper case, as Confluent spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Compatibility::Backward => "BACKWARD",
            Compatibility::Forward => "FORWARD",
            Compatibility::Full => "FULL",
            Compatibility::None => "NONE",
        }
    }

    /// Whether this mode checks that the new schema reads data written with the old one.
    pub fn checks_backward(self) -> bool {
        matches!(self, Compatibility::Backward | Compatibility::Full)
    }

    /// Whether this mode checks that the old schema reads data written with the new one.
    pub fn checks_forward(self) -> bool {
        matches!(self, Compatibility::Forward | Compatibility::Full)
    }
}

impl fmt::Display for Compatibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error of parsing a [`Compatibility`] from a string that names no mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseCompatibilityError {
    input: String,
}

impl fmt::Display for ParseCompatibilityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown compatibility mode `{}`: expected BACKWARD, FORWARD, FULL or NONE",
            self.input
        )
    }
}

impl std::error::Error for ParseCompatibilityError {}

impl FromStr for Compatibility {
    type Err = ParseCompatibilityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        [
            Compatibility::Backward,
            Compatibility::Forward,
            Compatibility::Full,
            Compatibility::None,
        ]
        .into_iter()
        .find(|mode| mode.as_str().eq_ignore_ascii_case(t))
        .ok_or_else(|| ParseCompatibilityError {
            input: s.to_owned(),
        })
    }
}

impl Serialize for Compatibility {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Compatibility {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Which reading failed: new readers on old data, or old readers on new data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Direction {
    /// A consumer using the new schema reading data written with the old one.
    Backward,
    /// A consumer using the old schema reading data written with the new one.
    Forward,
}

impl Direction {
    fn reader(self) -> &'static str {
        match self {
            Direction::Backward => "the new schema",
            Direction::Forward => "the old schema",
        }
    }

    fn writer(self) -> &'static str {
        match self {
            Direction::Backward => "the old schema",
            Direction::Forward => "the new schema",
        }
    }

    /// "the old one" / "the new one", for a writer already named in the sentence.
    fn writer_one(self) -> &'static str {
        match self {
            Direction::Backward => "the old one",
            Direction::Forward => "the new one",
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::Backward => "BACKWARD",
            Direction::Forward => "FORWARD",
        })
    }
}

/// The rule a [`Violation`] breaks. Each is defined on the (reader, writer) pair; see the
/// rules of [`check_schema`] for how they read under BACKWARD and FORWARD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Rule {
    /// The reader requires a property (without a `default`) that the writer may omit: it is
    /// absent from the writer's schema or not required there.
    RequiredFieldAdded,
    /// The writer may write a property (or map key) that the reader's closed content model
    /// (`#[serde(deny_unknown_fields)]`, `additionalProperties: false`) rejects.
    FieldRemovedFromClosedReader,
    /// The reader does not accept the writer's type or format (a narrowing, or an unrelated
    /// type).
    TypeChanged,
    /// The writer may produce an enum value or variant that the reader's enum lacks.
    EnumValueRemoved,
    /// The items of an array, the positions of a tuple or the length of a fixed-size array
    /// are not compatible.
    ItemsChanged,
    /// Same type and format, but a bound (`minimum`, `maximum`, `minLength`, `maxLength`,
    /// `pattern`) of the reader excludes values the writer may produce.
    ConstraintNarrowed,
    /// A `$ref` does not resolve within its schema document, so the check cannot see through
    /// it.
    UnresolvedReference,
    /// An (event, version) of the snapshot is no longer registered: envelopes of that version
    /// still in outboxes, dead letter queues and brokers could no longer be decoded.
    VersionRemoved,
}

impl Rule {
    /// The rule's name, as it appears in a [`Violation`]'s display.
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::RequiredFieldAdded => "RequiredFieldAdded",
            Rule::FieldRemovedFromClosedReader => "FieldRemovedFromClosedReader",
            Rule::TypeChanged => "TypeChanged",
            Rule::EnumValueRemoved => "EnumValueRemoved",
            Rule::ItemsChanged => "ItemsChanged",
            Rule::ConstraintNarrowed => "ConstraintNarrowed",
            Rule::UnresolvedReference => "UnresolvedReference",
            Rule::VersionRemoved => "VersionRemoved",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One incompatibility between an old and a new schema of an event.
///
/// Its [`Display`](fmt::Display) is one line naming the event, the field, the direction and
/// rule, and what changed:
///
/// ```text
/// order.placed v1: field `currency`: BACKWARD RequiredFieldAdded: required in the new schema but absent from data written with the old one (make it optional or give it a #[serde(default)])
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// The event, as given to [`check_schema`] (`"order.placed v1"` from [`check_catalog`]).
    pub event: String,
    /// The dotted path of the field, such as `customer.address.zip`; `[]` stands for the items
    /// of an array, `[0]` for a tuple position, `*` for the values of a map, and a variant's
    /// name for the payload of an externally tagged enum variant. Empty for the root.
    pub field: String,
    /// The reading that failed.
    pub direction: Direction,
    /// The rule broken.
    pub rule: Rule,
    /// What changed, in one line, with a hint at the fix where there is one.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}: root: ", self.event)?;
        } else {
            write!(f, "{}: field `{}`: ", self.event, self.field)?;
        }
        write!(f, "{} {}: {}", self.direction, self.rule, self.message)
    }
}

/// One event type of a catalog: its (name, version), the Rust type that implements it, and
/// the JSON Schema of its payload.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CatalogEntry {
    /// The event name, such as `order.placed`.
    pub name: String,
    /// The event version.
    pub version: u32,
    /// The Rust type of the payload (informational).
    pub rust_type: String,
    /// The JSON Schema of the payload, as generated by `schemars`.
    pub schema: Value,
}

/// Compares two schemas of one event under `mode` and returns every violation, BACKWARD
/// ones first under [`Compatibility::Full`]. `event` is copied into each violation (for
/// example `"order.placed v1"`).
///
/// ```
/// use event_runtime::schema::{check_schema, Compatibility, Direction, Rule};
/// use schemars::JsonSchema;
/// use serde::Deserialize;
///
/// #[allow(dead_code)]
/// #[derive(Deserialize, JsonSchema)]
/// struct OrderPlacedThen { order_id: String }
///
/// #[allow(dead_code)]
/// #[derive(Deserialize, JsonSchema)]
/// struct OrderPlacedNow { order_id: String, currency: String, note: Option<String> }
///
/// let old = schemars::schema_for!(OrderPlacedThen).to_value();
/// let new = schemars::schema_for!(OrderPlacedNow).to_value();
/// let violations = check_schema("order.placed v1", &old, &new, Compatibility::Full);
/// assert_eq!(violations.len(), 1);
/// assert_eq!(violations[0].field, "currency");
/// assert_eq!(violations[0].direction, Direction::Backward);
/// assert_eq!(violations[0].rule, Rule::RequiredFieldAdded);
/// ```
///
/// # Modes
/// The modes follow the definitions of the Confluent Schema Registry ("Schema Evolution and
/// Compatibility for Schema Registry on Confluent Platform",
/// <https://docs.confluent.io/platform/current/schema-registry/fundamentals/schema-evolution.html>):
///
/// | mode | question asked | check |
/// | --- | --- | --- |
/// | [`Compatibility::Backward`] (default) | can a consumer using the **new** schema read data written with the **old** one? | `can_read(new, old)` |
/// | [`Compatibility::Forward`] | can a consumer using the **old** schema read data written with the **new** one? | `can_read(old, new)` |
/// | [`Compatibility::Full`] | both | both, each violation tagged with the [`Direction`] that failed |
/// | [`Compatibility::None`] | nothing | nothing |
///
/// `can_read(reader, writer)` asks whether every value that the writer's schema allows is
/// accepted by the reader's schema, as `serde_json` deserializing into the reader's type would.
///
/// # What is understood
/// The JSON Schema that `schemars` 1.x generates for `serde` types (its default *deserialize*
/// contract): objects with `properties`, `required`, `additionalProperties` (`false` for
/// `#[serde(deny_unknown_fields)]`, a schema for maps and flattened maps) and
/// `unevaluatedProperties: false` (deny_unknown_fields with a flattened field); `type` as a
/// string or an array (`["integer", "null"]` for an `Option`); `$ref` into `$defs`
/// (or `definitions`, or `#` itself for a recursive root), resolved within each document; a
/// recursive type is followed until the same pair of definitions comes round again; `format`
/// (`uint8` … `uint128`, `int8` … `int128`, `uint`/`int`, `float`/`double`, `date-time`,
/// `uuid`, …) together with `minimum`/`maximum`; `enum`, `const`, `oneOf`, `anyOf` and
/// `allOf` as schemars emits them for Rust enums (externally, internally and adjacently
/// tagged, untagged, unit variants); arrays with `items` and tuples with `prefixItems`, `minItems`/`maxItems`; `default` on a
/// property. Annotations (`title`, `description`, `examples`, …) are ignored.
///
/// # Rules
/// Each violation names one [`Rule`], defined on the (reader, writer) pair:
///
/// * [`Rule::RequiredFieldAdded`]: the reader requires a property (no `default`) that the
///   writer may omit, because the writer does not declare it or does not require it. Under
///   BACKWARD this is a required field added to the new schema; under FORWARD it is a required
///   field removed from (or made optional in) the new schema, which old readers still require.
/// * [`Rule::FieldRemovedFromClosedReader`]: the writer may write a property (or, for a map,
///   any key) that the reader's closed content model rejects.
/// * [`Rule::TypeChanged`]: the reader does not accept the writer's type. Widening is fine:
///   `integer` → `number`, `T` → `T | null`, a narrower integer format to a wider one
///   (`uint32` → `uint64`, `uint32` → `int64`), `float` → `double`, a formatted string to a
///   plain one; the reverse of each is reported.
/// * [`Rule::EnumValueRemoved`]: the writer may produce an enum value or variant that the
///   reader's enum lacks.
/// * [`Rule::ItemsChanged`]: the items of an array (or the positions or length of a tuple or
///   fixed-size array) are not compatible.
/// * [`Rule::ConstraintNarrowed`]: same type and format, but a bound (`minimum`, `maximum`,
///   `minLength`, `maxLength`, `pattern`) excludes values the writer may produce.
/// * [`Rule::UnresolvedReference`]: a `$ref` that does not resolve within its document, so
///   the check cannot see through it (reported rather than silently passed).
/// * [`Rule::VersionRemoved`] ([`check_catalog`] only): an (event, version) of the snapshot is
///   no longer registered.
///
/// # Open and closed content models
/// JSON Schema objects are *open* unless `additionalProperties` is `false` (*closed*)
/// ("JSON Schema Serializer and Deserializer for Schema Registry on Confluent Platform",
/// compatibility rules and content models:
/// <https://docs.confluent.io/platform/current/schema-registry/fundamentals/serdes-develop/serdes-json.html>).
/// Confluent's checker treats an open *writer* as one that may have written any undeclared
/// property with any type, and so rejects adding a property to an open model
/// (`PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL`), while removing a property from a closed model is
/// rejected as `PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL`.
///
/// This check takes the stance that matches what `serde` actually does, and states it here
/// because it differs from Confluent's open-writer rule:
///
/// * **Writer side:** data is written by the `Serialize` impl of the writer's type, which
///   writes only the properties its schema declares (plus the keys of a map or flattened map,
///   which the schema declares as an `additionalProperties` schema). An open writer is
///   therefore *not* assumed to write undeclared properties.
/// * **Reader side:** `serde` ignores unknown fields unless the type has
///   `#[serde(deny_unknown_fields)]`. An open reader (no `additionalProperties`, or `true`)
///   accepts properties it does not declare; a closed reader (`additionalProperties: false`
///   or `unevaluatedProperties: false`) rejects them, like Confluent's closed model.
///
/// Consequences: adding an optional property (`Option<T>` or `#[serde(default)]`) to an
/// open type is compatible in both directions (FULL); removing an optional property from an
/// open type too; but with `deny_unknown_fields`, adding any property breaks FORWARD (old
/// closed readers reject it) and removing one breaks BACKWARD (the new closed reader rejects
/// it in old data).
///
/// Since the schemas describe the deserialize contract, a property the writer's schema does
/// not require (an `Option`, a `#[serde(default)]` field) is taken as one the writer's data may
/// lack, even though `serde` writes it unless `skip_serializing_if` says otherwise: the check
/// errs on the side of reporting.
pub fn check_schema(event: &str, old: &Value, new: &Value, mode: Compatibility) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut run = |reader: &Value, writer: &Value, direction: Direction| {
        out.extend(
            can_read(reader, writer, direction)
                .into_iter()
                .map(|f| Violation {
                    event: event.to_owned(),
                    field: f.path,
                    direction,
                    rule: f.rule,
                    message: f.message,
                }),
        );
    };
    if mode.checks_backward() {
        run(new, old, Direction::Backward);
    }
    if mode.checks_forward() {
        run(old, new, Direction::Forward);
    }
    out
}

/// Compares a committed catalog snapshot (`old`) with the current catalog (`new`).
///
/// Each old entry is compared with the new entry of the same (name, version) under the mode
/// of `overrides[name]`, or `default_mode`. The event of each violation reads
/// `"{name} v{version}"`.
///
/// * An old entry missing from the new catalog is a [`Rule::VersionRemoved`] violation under
///   BACKWARD and FULL, **even when other versions of the same event remain registered**:
///   envelopes of the removed version still sitting in outboxes, dead letter queues and
///   brokers could no longer be decoded. Under FORWARD (old readers, new data) removing a
///   version breaks no reader, and NONE checks nothing.
/// * New entries, including a new higher version of an existing event, have nothing to be
///   compared with (upcasting covers them) and are fine.
pub fn check_catalog(
    old: &[CatalogEntry],
    new: &[CatalogEntry],
    default_mode: Compatibility,
    overrides: &HashMap<String, Compatibility>,
) -> Vec<Violation> {
    let mut out = Vec::new();
    for entry in old {
        let mode = overrides.get(&entry.name).copied().unwrap_or(default_mode);
        if mode == Compatibility::None {
            continue;
        }
        let event = format!("{} v{}", entry.name, entry.version);
        let mut found = false;
        for current in new
            .iter()
            .filter(|n| n.name == entry.name && n.version == entry.version)
        {
            found = true;
            out.extend(check_schema(&event, &entry.schema, &current.schema, mode));
        }
        if !found && mode.checks_backward() {
            out.push(Violation {
                event,
                field: String::new(),
                direction: Direction::Backward,
                rule: Rule::VersionRemoved,
                message: format!(
                    "registered in the snapshot (as `{}`) but no longer in the catalog: envelopes \
                     of this version still in outboxes, dead letter queues and brokers could no \
                     longer be decoded (keep the type registered, with an upcaster if needed; a \
                     removed version is a violation even while other versions remain)",
                    entry.rust_type
                ),
            });
        }
    }
    out
}

// The rules themselves are tested by the old/new fixture files under
// `tests/fixtures/compat/`, run by `tests/compat_fixtures.rs`.
#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn compatibility_parses_displays_and_serializes() {
        for (text, mode) in [
            ("BACKWARD", Compatibility::Backward),
            ("forward", Compatibility::Forward),
            ("Full", Compatibility::Full),
            ("none", Compatibility::None),
        ] {
            assert_eq!(text.parse::<Compatibility>().unwrap(), mode);
            assert_eq!(mode.to_string(), text.to_ascii_uppercase());
            assert_eq!(
                serde_json::to_value(mode).unwrap(),
                json!(text.to_ascii_uppercase())
            );
            assert_eq!(
                serde_json::from_value::<Compatibility>(json!(text)).unwrap(),
                mode
            );
        }
        assert!("sideways".parse::<Compatibility>().is_err());
        assert!(serde_json::from_value::<Compatibility>(json!("sideways")).is_err());
        assert_eq!(Compatibility::default(), Compatibility::Backward);
    }

    #[test]
    fn a_root_violation_displays_without_a_field() {
        let root = Violation {
            event: "e v1".into(),
            field: String::new(),
            direction: Direction::Backward,
            rule: Rule::VersionRemoved,
            message: "gone".into(),
        };
        assert_eq!(
            root.to_string(),
            "e v1: root: BACKWARD VersionRemoved: gone"
        );
    }
}

//! Schema compatibility of event types: compares the JSON Schema of an event (name, version)
//! in a committed catalog snapshot with the one the code produces now, under a compatibility
//! mode, and reports every change that would break a reader.
//!
//! The modes, the rules and the open-content-model stance are documented on [`check_schema`]
//! (this module is private; its items are re-exported at the crate root).

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

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

// ---------------------------------------------------------------------------------------------
// The core: can_read(reader, writer).
// ---------------------------------------------------------------------------------------------

/// How deep the flattening of combinators and references may go before giving up (as "any").
const MAX_FLATTEN_DEPTH: usize = 64;

/// The schema that accepts everything, for items and map values left unconstrained.
static ANY_SCHEMA: Value = Value::Bool(true);

/// A violation before it knows its event and direction.
#[derive(Debug)]
struct Finding {
    path: String,
    rule: Rule,
    message: String,
}

/// Every finding that keeps `reader` from reading what `writer` may write.
fn can_read(reader: &Value, writer: &Value, direction: Direction) -> Vec<Finding> {
    let mut checker = Checker {
        reader_doc: reader,
        writer_doc: writer,
        dir: direction,
        in_progress: Vec::new(),
        findings: Vec::new(),
    };
    checker.compare(reader, writer, "");
    checker.findings
}

/// The JSON types of JSON Schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Null,
    Boolean,
    Integer,
    Number,
    String,
    Array,
    Object,
}

impl Kind {
    fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "null" => Kind::Null,
            "boolean" => Kind::Boolean,
            "integer" => Kind::Integer,
            "number" => Kind::Number,
            "string" => Kind::String,
            "array" => Kind::Array,
            "object" => Kind::Object,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Null => "null",
            Kind::Boolean => "boolean",
            Kind::Integer => "integer",
            Kind::Number => "number",
            Kind::String => "string",
            Kind::Array => "array",
            Kind::Object => "object",
        }
    }

    /// Whether a JSON value is of this type.
    fn admits(self, v: &Value) -> bool {
        match self {
            Kind::Null => v.is_null(),
            Kind::Boolean => v.is_boolean(),
            Kind::Integer => {
                v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0)
            }
            Kind::Number => v.is_number(),
            Kind::String => v.is_string(),
            Kind::Array => v.is_array(),
            Kind::Object => v.is_object(),
        }
    }

    fn of(v: &Value) -> Kind {
        match v {
            Value::Null => Kind::Null,
            Value::Bool(_) => Kind::Boolean,
            Value::Number(_) if Kind::Integer.admits(v) => Kind::Integer,
            Value::Number(_) => Kind::Number,
            Value::String(_) => Kind::String,
            Value::Array(_) => Kind::Array,
            Value::Object(_) => Kind::Object,
        }
    }
}

/// One alternative of a schema once `$ref`, `anyOf`, `oneOf`, `allOf`, `enum`, `const` and
/// `type` arrays are flattened: the schema is the union of its branches.
#[derive(Debug, Clone)]
enum Branch<'a> {
    /// Any JSON value.
    Any,
    /// Exactly this value (an `enum` member or a `const`).
    Literal(&'a Value),
    /// Any value of this type satisfying the keywords of every part (several parts come from
    /// `allOf` or from keywords next to a `oneOf`).
    Typed(Kind, Vec<&'a Map<String, Value>>),
}

/// Resolves a local `$ref` (`#`, `#/$defs/Name`, `#/definitions/Name`) within `doc`.
fn resolve<'a>(doc: &'a Value, reference: &str) -> Option<&'a Value> {
    let fragment = reference.strip_prefix('#')?;
    if fragment.is_empty() {
        return Some(doc);
    }
    doc.pointer(&percent_decode(fragment))
}

/// Decodes the `%XX` escapes of a URI fragment.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            if let Some(byte) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(byte);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Flattens schemas of one document into branches.
struct Flattener<'a> {
    doc: &'a Value,
    /// The `$ref` targets being flattened, to cut reference cycles through combinators.
    visiting: Vec<*const Value>,
    unresolved: Vec<String>,
    /// What an unresolved `$ref` stands for: anything for a reader (so that one unresolved
    /// reference is one finding), nothing for a writer.
    unresolved_is_any: bool,
}

impl<'a> Flattener<'a> {
    fn flatten(&mut self, node: &'a Value, depth: usize) -> Vec<Branch<'a>> {
        if depth > MAX_FLATTEN_DEPTH {
            return vec![Branch::Any];
        }
        let map = match node {
            Value::Bool(false) => return Vec::new(),
            Value::Object(map) => map,
            _ => return vec![Branch::Any],
        };
        if let Some(reference) = map.get("$ref").and_then(Value::as_str) {
            return match resolve(self.doc, reference) {
                Some(target) => {
                    let key = target as *const Value;
                    if self.visiting.contains(&key) {
                        return Vec::new();
                    }
                    self.visiting.push(key);
                    let out = self.flatten(target, depth + 1);
                    self.visiting.pop();
                    out
                }
                None => {
                    self.unresolved.push(reference.to_owned());
                    if self.unresolved_is_any {
                        vec![Branch::Any]
                    } else {
                        Vec::new()
                    }
                }
            };
        }
        if map
            .get("not")
            .is_some_and(|n| n == &ANY_SCHEMA || n == &Value::Object(Map::new()))
        {
            return Vec::new();
        }
        let mut acc = own_branches(map);
        if let Some(Value::Array(parts)) = map.get("allOf") {
            for part in parts {
                let b = self.flatten(part, depth + 1);
                acc = intersect(&acc, &b);
            }
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(alternatives)) = map.get(key) {
                let mut union = Vec::new();
                for alternative in alternatives {
                    union.extend(self.flatten(alternative, depth + 1));
                }
                acc = intersect(&acc, &union);
            }
        }
        acc
    }
}

/// The branches a schema object's own `type`, `enum` and `const` allow.
fn own_branches(map: &Map<String, Value>) -> Vec<Branch<'_>> {
    let types: Option<Vec<Kind>> = match map.get("type") {
        Some(Value::String(s)) => Some(Kind::parse(s).into_iter().collect()),
        Some(Value::Array(a)) => Some(
            a.iter()
                .filter_map(Value::as_str)
                .filter_map(Kind::parse)
                .collect(),
        ),
        _ => None,
    };
    let typed_ok = |v: &Value| {
        types
            .as_ref()
            .is_none_or(|ts| ts.iter().any(|k| k.admits(v)))
    };
    if let Some(Value::Array(values)) = map.get("enum") {
        return values
            .iter()
            .filter(|v| typed_ok(v))
            .map(Branch::Literal)
            .collect();
    }
    if let Some(value) = map.get("const") {
        return if typed_ok(value) {
            vec![Branch::Literal(value)]
        } else {
            Vec::new()
        };
    }
    let mut out: Vec<Branch<'_>> = match types {
        Some(kinds) => kinds
            .into_iter()
            .map(|k| Branch::Typed(k, vec![map]))
            .collect(),
        None => {
            let object_keywords = [
                "properties",
                "required",
                "additionalProperties",
                "unevaluatedProperties",
                "patternProperties",
            ];
            if object_keywords.iter().any(|k| map.contains_key(*k)) {
                vec![Branch::Typed(Kind::Object, vec![map])]
            } else if map.contains_key("items") || map.contains_key("prefixItems") {
                vec![Branch::Typed(Kind::Array, vec![map])]
            } else {
                vec![Branch::Any]
            }
        }
    };
    if map.get("nullable") == Some(&Value::Bool(true))
        && !out
            .iter()
            .any(|b| matches!(b, Branch::Typed(Kind::Null, _) | Branch::Any))
    {
        out.push(Branch::Typed(Kind::Null, vec![map]));
    }
    out
}

/// The branches allowed by both unions.
fn intersect<'a>(a: &[Branch<'a>], b: &[Branch<'a>]) -> Vec<Branch<'a>> {
    let mut out = Vec::new();
    for x in a {
        for y in b {
            if let Some(z) = meet(x, y) {
                out.push(z);
            }
        }
    }
    out
}

fn meet<'a>(x: &Branch<'a>, y: &Branch<'a>) -> Option<Branch<'a>> {
    match (x, y) {
        (Branch::Any, other) | (other, Branch::Any) => Some(other.clone()),
        (Branch::Literal(u), Branch::Literal(v)) => (u == v).then_some(Branch::Literal(u)),
        (Branch::Literal(v), Branch::Typed(k, _)) | (Branch::Typed(k, _), Branch::Literal(v)) => {
            k.admits(v).then_some(Branch::Literal(v))
        }
        (Branch::Typed(k1, p1), Branch::Typed(k2, p2)) => {
            let kind = if k1 == k2 {
                *k1
            } else if matches!(
                (k1, k2),
                (Kind::Integer, Kind::Number) | (Kind::Number, Kind::Integer)
            ) {
                Kind::Integer
            } else {
                return None;
            };
            let mut parts = p1.clone();
            parts.extend(p2.iter().copied());
            Some(Branch::Typed(kind, parts))
        }
    }
}

/// The first value of `key` among the parts.
fn keyword<'a>(parts: &[&'a Map<String, Value>], key: &str) -> Option<&'a Value> {
    parts.iter().find_map(|p| p.get(key))
}

fn format_of<'a>(parts: &[&'a Map<String, Value>]) -> Option<&'a str> {
    keyword(parts, "format").and_then(Value::as_str)
}

/// Inclusive integer bounds (`None` = unbounded).
type IntRange = (Option<i128>, Option<i128>);

fn integer_format_bounds(format: Option<&str>) -> IntRange {
    fn signed(bits: u32) -> IntRange {
        (
            Some(-(1i128 << (bits - 1))),
            Some((1i128 << (bits - 1)) - 1),
        )
    }
    fn unsigned(bits: u32) -> IntRange {
        (Some(0), Some((1i128 << bits) - 1))
    }
    match format {
        Some("int8") => signed(8),
        Some("int16") => signed(16),
        Some("int32") => signed(32),
        Some("int64") | Some("int") => signed(64),
        Some("int128") => (Some(i128::MIN), Some(i128::MAX)),
        Some("uint8") => unsigned(8),
        Some("uint16") => unsigned(16),
        Some("uint32") => unsigned(32),
        Some("uint64") | Some("uint") => unsigned(64),
        Some("uint128") => (Some(0), Some(i128::MAX)),
        _ => (None, None),
    }
}

fn integer_range(parts: &[&Map<String, Value>]) -> IntRange {
    let (mut lo, mut hi) = integer_format_bounds(format_of(parts));
    let raise = |lo: &mut Option<i128>, v: i128| *lo = Some(lo.map_or(v, |l| l.max(v)));
    let lower = |hi: &mut Option<i128>, v: i128| *hi = Some(hi.map_or(v, |h| h.min(v)));
    for part in parts {
        if let Some(v) = part.get("minimum").and_then(Value::as_f64) {
            raise(&mut lo, v.ceil() as i128);
        }
        if let Some(v) = part.get("exclusiveMinimum").and_then(Value::as_f64) {
            raise(&mut lo, v.floor() as i128 + 1);
        }
        if let Some(v) = part.get("maximum").and_then(Value::as_f64) {
            lower(&mut hi, v.floor() as i128);
        }
        if let Some(v) = part.get("exclusiveMaximum").and_then(Value::as_f64) {
            lower(&mut hi, v.ceil() as i128 - 1);
        }
    }
    (lo, hi)
}

/// Number bounds (exclusive bounds are taken as inclusive: close enough to compare).
fn number_range(parts: &[&Map<String, Value>]) -> (Option<f64>, Option<f64>) {
    let mut lo: Option<f64> = None;
    let mut hi: Option<f64> = None;
    for part in parts {
        for key in ["minimum", "exclusiveMinimum"] {
            if let Some(v) = part.get(key).and_then(Value::as_f64) {
                lo = Some(lo.map_or(v, |l| l.max(v)));
            }
        }
        for key in ["maximum", "exclusiveMaximum"] {
            if let Some(v) = part.get(key).and_then(Value::as_f64) {
                hi = Some(hi.map_or(v, |h| h.min(v)));
            }
        }
    }
    (lo, hi)
}

fn u64_range(parts: &[&Map<String, Value>], min_key: &str, max_key: &str) -> (u64, Option<u64>) {
    let lo = parts
        .iter()
        .filter_map(|p| p.get(min_key).and_then(Value::as_u64))
        .max()
        .unwrap_or(0);
    let hi = parts
        .iter()
        .filter_map(|p| p.get(max_key).and_then(Value::as_u64))
        .min();
    (lo, hi)
}

/// Whether the reader's range `r` holds the writer's range `w`.
fn contains<T: PartialOrd + Copy>(r: (Option<T>, Option<T>), w: (Option<T>, Option<T>)) -> bool {
    let lo_ok = match (r.0, w.0) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(rl), Some(wl)) => rl <= wl,
    };
    let hi_ok = match (r.1, w.1) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(rh), Some(wh)) => rh >= wh,
    };
    lo_ok && hi_ok
}

fn show_range<T: fmt::Display>(r: &(Option<T>, Option<T>)) -> String {
    match r {
        (None, None) => "any value".to_owned(),
        (Some(lo), None) => format!("{lo}.."),
        (None, Some(hi)) => format!("..={hi}"),
        (Some(lo), Some(hi)) => format!("{lo}..={hi}"),
    }
}

/// How an object treats properties it does not declare.
#[derive(Debug, Clone, Copy)]
enum Additional<'a> {
    /// No `additionalProperties` (or `true` on a reader): open. As a writer, writes only
    /// the declared properties.
    Open,
    /// `additionalProperties: false` or `unevaluatedProperties: false`.
    Closed,
    /// `additionalProperties` is a schema: a map, or a struct with a flattened map.
    Schema(&'a Value),
}

/// The object keywords of a branch, merged over its parts.
struct ObjectView<'a> {
    properties: Vec<(&'a str, &'a Value)>,
    required: BTreeSet<&'a str>,
    additional: Additional<'a>,
}

impl<'a> ObjectView<'a> {
    fn of(parts: &[&'a Map<String, Value>]) -> Self {
        let mut properties: Vec<(&'a str, &'a Value)> = Vec::new();
        let mut required = BTreeSet::new();
        let mut closed = false;
        let mut schema = None;
        for part in parts {
            if let Some(Value::Object(props)) = part.get("properties") {
                for (name, s) in props {
                    if !properties.iter().any(|(n, _)| n == name) {
                        properties.push((name.as_str(), s));
                    }
                }
            }
            if let Some(Value::Array(names)) = part.get("required") {
                required.extend(names.iter().filter_map(Value::as_str));
            }
            match part.get("additionalProperties") {
                Some(Value::Bool(false)) => closed = true,
                Some(s @ (Value::Bool(true) | Value::Object(_))) => {
                    schema.get_or_insert(s);
                }
                _ => {}
            }
            if part.get("unevaluatedProperties") == Some(&Value::Bool(false)) {
                closed = true;
            }
        }
        let additional = if closed {
            Additional::Closed
        } else if let Some(s) = schema {
            Additional::Schema(s)
        } else {
            Additional::Open
        };
        ObjectView {
            properties,
            required,
            additional,
        }
    }

    fn property(&self, name: &str) -> Option<&'a Value> {
        self.properties
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| *s)
    }

    /// The variant an enum branch stands for: the required properties with a `const` (the tag
    /// of an internally or adjacently tagged enum), or the single required property of a
    /// closed object (an externally tagged variant).
    fn variant_tag(&self) -> Option<String> {
        let consts: Vec<String> = self
            .properties
            .iter()
            .filter(|(name, _)| self.required.contains(name))
            .filter_map(|(name, s)| {
                let s = s.as_object()?;
                let value = s.get("const").or_else(|| match s.get("enum") {
                    Some(Value::Array(values)) if values.len() == 1 => values.first(),
                    _ => None,
                })?;
                Some(format!("`{name}` = {value}"))
            })
            .collect();
        if !consts.is_empty() {
            return Some(consts.join(", "));
        }
        if matches!(self.additional, Additional::Closed) && self.properties.len() == 1 {
            let name = self.properties[0].0;
            if self.required.contains(name) {
                return Some(format!("`{name}`"));
            }
        }
        None
    }
}

/// The array keywords of a branch.
struct ArrayView<'a> {
    prefix: Vec<&'a Value>,
    /// The schema of the items after the prefix, `None` when there can be none.
    rest: Option<&'a Value>,
    len: (u64, Option<u64>),
}

impl<'a> ArrayView<'a> {
    fn of(parts: &[&'a Map<String, Value>]) -> Self {
        let mut prefix: Vec<&'a Value> = Vec::new();
        let mut rest: Option<&'a Value> = Some(&ANY_SCHEMA);
        if let Some(Value::Array(p)) = keyword(parts, "prefixItems") {
            prefix = p.iter().collect();
            if let Some(items) = keyword(parts, "items") {
                rest = Some(items);
            }
        } else {
            match keyword(parts, "items") {
                // Draft 7 tuples.
                Some(Value::Array(p)) => {
                    prefix = p.iter().collect();
                    rest = Some(keyword(parts, "additionalItems").unwrap_or(&ANY_SCHEMA));
                }
                Some(items) => rest = Some(items),
                None => {}
            }
        }
        if rest == Some(&Value::Bool(false)) {
            rest = None;
        }
        let (min, mut max) = u64_range(parts, "minItems", "maxItems");
        if rest.is_none() {
            let n = prefix.len() as u64;
            max = Some(max.map_or(n, |m| m.min(n)));
        }
        ArrayView {
            prefix,
            rest,
            len: (min, max),
        }
    }

    fn item(&self, i: usize) -> Option<&'a Value> {
        self.prefix.get(i).copied().or(self.rest)
    }
}

fn describe(branch: &Branch<'_>) -> String {
    match branch {
        Branch::Any => "any JSON value".to_owned(),
        Branch::Literal(v) => v.to_string(),
        Branch::Typed(kind, parts) => match format_of(parts) {
            Some(format) => format!("{} ({format})", kind.name()),
            None => kind.name().to_owned(),
        },
    }
}

fn describe_union(branches: &[Branch<'_>]) -> String {
    if branches.is_empty() {
        return "no value at all".to_owned();
    }
    let mut seen: Vec<String> = Vec::new();
    for b in branches {
        let d = describe(b);
        if !seen.contains(&d) {
            seen.push(d);
        }
    }
    let literals = branches.iter().all(|b| matches!(b, Branch::Literal(_)));
    const SHOWN: usize = 8;
    let mut text = seen.iter().take(SHOWN).cloned().collect::<Vec<_>>();
    if seen.len() > SHOWN {
        text.push(format!("… ({} in all)", seen.len()));
    }
    if literals {
        format!("one of {}", text.join(", "))
    } else {
        text.join(" | ")
    }
}

fn join_path(path: &str, segment: &str) -> String {
    if path.is_empty() {
        segment.to_owned()
    } else {
        format!("{path}.{segment}")
    }
}

struct Checker<'a> {
    reader_doc: &'a Value,
    writer_doc: &'a Value,
    dir: Direction,
    /// The (reader parts, writer parts) of the objects and arrays being compared: meeting one
    /// again means a recursive type, which is then taken as compatible (the rest of the
    /// comparison decides).
    in_progress: Vec<(Vec<usize>, Vec<usize>)>,
    findings: Vec<Finding>,
}

impl<'a> Checker<'a> {
    fn report(&mut self, path: &str, rule: Rule, message: String) {
        self.findings.push(Finding {
            path: path.to_owned(),
            rule,
            message,
        });
    }

    /// Reports whatever of `writer` the `reader` does not accept.
    fn compare(&mut self, reader: &'a Value, writer: &'a Value, path: &str) {
        let mut rf = Flattener {
            doc: self.reader_doc,
            visiting: Vec::new(),
            unresolved: Vec::new(),
            unresolved_is_any: true,
        };
        let reader_branches = rf.flatten(reader, 0);
        let mut wf = Flattener {
            doc: self.writer_doc,
            visiting: Vec::new(),
            unresolved: Vec::new(),
            unresolved_is_any: false,
        };
        let writer_branches = wf.flatten(writer, 0);
        for (side, unresolved) in [
            (self.dir.reader(), rf.unresolved),
            (self.dir.writer(), wf.unresolved),
        ] {
            for reference in unresolved {
                self.report(
                    path,
                    Rule::UnresolvedReference,
                    format!(
                        "`$ref` \"{reference}\" does not resolve within {side}, so this part \
                         cannot be checked (only local references into the document are followed)"
                    ),
                );
            }
        }
        for branch in &writer_branches {
            self.accept(&reader_branches, branch, path);
        }
    }

    /// Reports whether the reader's union accepts one branch of the writer.
    fn accept(&mut self, reader: &[Branch<'a>], writer: &Branch<'a>, path: &str) {
        if reader.iter().any(|b| matches!(b, Branch::Any)) {
            return;
        }
        match writer {
            Branch::Any => self.report(
                path,
                Rule::TypeChanged,
                format!(
                    "{} allows any JSON value here, {} reads only {}",
                    self.dir.writer(),
                    self.dir.reader(),
                    describe_union(reader)
                ),
            ),
            Branch::Literal(value) => self.accept_literal(reader, value, path),
            Branch::Typed(kind, parts) => self.accept_typed(reader, *kind, parts, path),
        }
    }

    fn accept_literal(&mut self, reader: &[Branch<'a>], value: &'a Value, path: &str) {
        let fits = reader.iter().any(|b| match b {
            Branch::Any => true,
            Branch::Literal(u) => *u == value,
            Branch::Typed(kind, parts) => literal_fits_typed(*kind, parts, value),
        });
        if fits {
            return;
        }
        let kind = Kind::of(value);
        let enum_like = reader.iter().any(|b| match b {
            Branch::Literal(u) => Kind::of(u) == kind,
            Branch::Typed(Kind::Object, parts) => {
                value.is_string() && ObjectView::of(parts).variant_tag().is_some()
            }
            _ => false,
        });
        if enum_like {
            self.report(
                path,
                Rule::EnumValueRemoved,
                format!(
                    "data written with {} may hold {value}, which {} does not accept (it reads {}); \
                     serde fails with `unknown variant`",
                    self.dir.writer(),
                    self.dir.reader(),
                    describe_union(reader)
                ),
            );
        } else {
            self.report(
                path,
                Rule::TypeChanged,
                format!(
                    "data written with {} may hold {value}, {} reads {}",
                    self.dir.writer(),
                    self.dir.reader(),
                    describe_union(reader)
                ),
            );
        }
    }

    fn accept_typed(
        &mut self,
        reader: &[Branch<'a>],
        kind: Kind,
        parts: &[&'a Map<String, Value>],
        path: &str,
    ) {
        // A writer's boolean or null read by an enum of its values.
        let has_literal = |v: &Value| {
            reader
                .iter()
                .any(|b| matches!(b, Branch::Literal(u) if *u == v))
        };
        match kind {
            Kind::Boolean
                if has_literal(&Value::Bool(true)) && has_literal(&Value::Bool(false)) =>
            {
                return
            }
            Kind::Null if has_literal(&Value::Null) => return,
            _ => {}
        }
        let candidates: Vec<(Kind, &Vec<&'a Map<String, Value>>)> = reader
            .iter()
            .filter_map(|b| match b {
                Branch::Typed(rk, rp)
                    if *rk == kind || (*rk == Kind::Number && kind == Kind::Integer) =>
                {
                    Some((*rk, rp))
                }
                _ => None,
            })
            .collect();
        let writer_branch = Branch::Typed(kind, parts.to_vec());
        if candidates.is_empty() {
            let message = if kind == Kind::Null {
                let fix = match self.dir {
                    Direction::Backward => "keep it an Option",
                    Direction::Forward => "old readers fail on it: keep the field non-optional",
                };
                format!(
                    "data written with {} may hold null, which {} does not accept (it reads {}; \
                     {fix})",
                    self.dir.writer(),
                    self.dir.reader(),
                    describe_union(reader)
                )
            } else {
                format!(
                    "data written with {} holds {}, {} reads {}",
                    self.dir.writer(),
                    describe(&writer_branch),
                    self.dir.reader(),
                    describe_union(reader)
                )
            };
            self.report(path, Rule::TypeChanged, message);
            return;
        }
        let mut candidates = candidates;
        if kind == Kind::Object {
            if let Some(tag) = ObjectView::of(parts).variant_tag() {
                let tags: Vec<Option<String>> = candidates
                    .iter()
                    .map(|(_, rp)| ObjectView::of(rp).variant_tag())
                    .collect();
                let same: Vec<_> = candidates
                    .iter()
                    .zip(&tags)
                    .filter(|(_, t)| t.as_deref() == Some(tag.as_str()))
                    .map(|(c, _)| *c)
                    .collect();
                if !same.is_empty() {
                    candidates = same;
                } else if tags.iter().any(Option::is_some) {
                    self.report(
                        path,
                        Rule::EnumValueRemoved,
                        format!(
                            "data written with {} may hold the variant {tag}, which {} lacks; \
                             serde fails with `unknown variant`",
                            self.dir.writer(),
                            self.dir.reader()
                        ),
                    );
                    return;
                }
            }
        }
        if candidates.len() == 1 {
            let (rk, rp) = candidates[0];
            self.compare_typed(rk, rp, kind, parts, path);
            return;
        }
        // Several alternatives of the reader could read it (an untagged enum, say): fine if
        // one reads it entirely, else report the closest one.
        let saved = std::mem::take(&mut self.findings);
        let mut best: Option<Vec<Finding>> = None;
        for (rk, rp) in candidates {
            self.compare_typed(rk, rp, kind, parts, path);
            let found = std::mem::take(&mut self.findings);
            if found.is_empty() {
                best = Some(found);
                break;
            }
            if best.as_ref().is_none_or(|b| found.len() < b.len()) {
                best = Some(found);
            }
        }
        self.findings = saved;
        self.findings.extend(best.unwrap_or_default());
    }

    fn compare_typed(
        &mut self,
        rk: Kind,
        rp: &[&'a Map<String, Value>],
        wk: Kind,
        wp: &[&'a Map<String, Value>],
        path: &str,
    ) {
        match (rk, wk) {
            (Kind::Integer, Kind::Integer) => {
                let (r, w) = (integer_range(rp), integer_range(wp));
                if !contains(r, w) {
                    self.narrowed(path, (rk, rp), (wk, wp), &show_range(&w), &show_range(&r));
                }
            }
            (Kind::Number, Kind::Integer) => {
                let r = number_range(rp);
                let (lo, hi) = integer_range(wp);
                let w = (lo.map(|v| v as f64), hi.map(|v| v as f64));
                if !contains(r, w) {
                    self.narrowed(path, (rk, rp), (wk, wp), &show_range(&w), &show_range(&r));
                }
            }
            (Kind::Number, Kind::Number) => {
                let precision = |f: Option<&str>| if f == Some("float") { 1 } else { 2 };
                let (rf, wf) = (format_of(rp), format_of(wp));
                if precision(rf) < precision(wf) {
                    self.report(
                        path,
                        Rule::TypeChanged,
                        format!(
                            "data written with {} holds number ({}), {} reads number (float): \
                             a narrowing that loses range and precision",
                            self.dir.writer(),
                            wf.unwrap_or("double"),
                            self.dir.reader()
                        ),
                    );
                }
                let (r, w) = (number_range(rp), number_range(wp));
                if !contains(r, w) {
                    self.narrowed(path, (rk, rp), (wk, wp), &show_range(&w), &show_range(&r));
                }
            }
            (Kind::String, Kind::String) => self.compare_strings(rp, wp, path),
            (Kind::Array, Kind::Array) => self.guarded(rp, wp, |c| c.compare_arrays(rp, wp, path)),
            (Kind::Object, Kind::Object) => {
                self.guarded(rp, wp, |c| c.compare_objects(rp, wp, path))
            }
            // Null and boolean carry no further constraint.
            _ => {}
        }
    }

    /// Runs `f` unless the same pair of schemas is already being compared further up
    /// (a recursive type).
    fn guarded(
        &mut self,
        rp: &[&'a Map<String, Value>],
        wp: &[&'a Map<String, Value>],
        f: impl FnOnce(&mut Self),
    ) {
        let key = (
            rp.iter()
                .map(|p| *p as *const _ as usize)
                .collect::<Vec<_>>(),
            wp.iter()
                .map(|p| *p as *const _ as usize)
                .collect::<Vec<_>>(),
        );
        if self.in_progress.contains(&key) {
            return;
        }
        self.in_progress.push(key);
        f(self);
        self.in_progress.pop();
    }

    /// Reports a numeric range the reader narrowed: a type change when the formats differ
    /// (`uint64` → `uint32`), a narrowed constraint when they do not.
    fn narrowed(
        &mut self,
        path: &str,
        (rk, rp): (Kind, &[&'a Map<String, Value>]),
        (wk, wp): (Kind, &[&'a Map<String, Value>]),
        writer_range: &str,
        reader_range: &str,
    ) {
        let (rf, wf) = (format_of(rp), format_of(wp));
        let show = |k: Kind, f: Option<&str>| match f {
            Some(f) => format!("{} ({f})", k.name()),
            None => k.name().to_owned(),
        };
        if rf != wf {
            self.report(
                path,
                Rule::TypeChanged,
                format!(
                    "data written with {} holds {} ({writer_range}), {} reads {} ({reader_range}): \
                     values outside it fail to deserialize",
                    self.dir.writer(),
                    show(wk, wf),
                    self.dir.reader(),
                    show(rk, rf)
                ),
            );
        } else {
            self.report(
                path,
                Rule::ConstraintNarrowed,
                format!(
                    "data written with {} may hold {writer_range}, {} accepts only {reader_range}",
                    self.dir.writer(),
                    self.dir.reader()
                ),
            );
        }
    }

    fn compare_strings(
        &mut self,
        rp: &[&'a Map<String, Value>],
        wp: &[&'a Map<String, Value>],
        path: &str,
    ) {
        let (rf, wf) = (format_of(rp), format_of(wp));
        if let Some(rf) = rf {
            if wf != Some(rf) {
                self.report(
                    path,
                    Rule::TypeChanged,
                    format!(
                        "data written with {} holds {}, {} reads string ({rf}): strings that are \
                         not a valid {rf} fail to deserialize",
                        self.dir.writer(),
                        wf.map_or("string".to_owned(), |f| format!("string ({f})")),
                        self.dir.reader()
                    ),
                );
            }
        }
        let (rmin, rmax) = u64_range(rp, "minLength", "maxLength");
        let (wmin, wmax) = u64_range(wp, "minLength", "maxLength");
        let r = (Some(rmin), rmax);
        let w = (Some(wmin), wmax);
        if !contains(r, w) {
            self.report(
                path,
                Rule::ConstraintNarrowed,
                format!(
                    "data written with {} may hold strings of length {}, {} accepts only {}",
                    self.dir.writer(),
                    show_range(&w),
                    self.dir.reader(),
                    show_range(&r)
                ),
            );
        }
        let rpat = keyword(rp, "pattern").and_then(Value::as_str);
        let wpat = keyword(wp, "pattern").and_then(Value::as_str);
        if let Some(rpat) = rpat {
            if wpat != Some(rpat) {
                self.report(
                    path,
                    Rule::ConstraintNarrowed,
                    format!(
                        "{} requires the pattern `{rpat}`, which data written with {} need not \
                         match",
                        self.dir.reader(),
                        self.dir.writer()
                    ),
                );
            }
        }
    }

    fn compare_arrays(
        &mut self,
        rp: &[&'a Map<String, Value>],
        wp: &[&'a Map<String, Value>],
        path: &str,
    ) {
        let (r, w) = (ArrayView::of(rp), ArrayView::of(wp));
        let rl = (Some(r.len.0), r.len.1);
        let wl = (Some(w.len.0), w.len.1);
        if !contains(rl, wl) {
            self.report(
                path,
                Rule::ItemsChanged,
                format!(
                    "length: data written with {} may hold {} items, {} reads {}",
                    self.dir.writer(),
                    show_range(&wl),
                    self.dir.reader(),
                    show_range(&rl)
                ),
            );
        }
        let start = self.findings.len();
        let positions = w.prefix.len().max(r.prefix.len());
        let writer_may_hold = |n: usize| w.len.1.is_none_or(|max| (n as u64) < max);
        for i in 0..positions {
            if !writer_may_hold(i) {
                break;
            }
            let Some(wi) = w.item(i) else { break };
            if let Some(ri) = r.item(i) {
                let item_path = format!("{path}[{i}]");
                self.compare(ri, wi, &item_path);
            }
        }
        if let (Some(wr), Some(rr), true) = (w.rest, r.rest, writer_may_hold(positions)) {
            let item_path = format!("{path}[]");
            self.compare(rr, wr, &item_path);
        }
        // A type change of the items themselves is an items change of the array.
        for finding in &mut self.findings[start..] {
            let item_level = finding.path.strip_prefix(path).is_some_and(|rest| {
                rest.starts_with('[') && rest.ends_with(']') && !rest[1..].contains('[')
            });
            if item_level && finding.rule == Rule::TypeChanged {
                finding.rule = Rule::ItemsChanged;
                finding.message = format!("array items: {}", finding.message);
            }
        }
    }

    fn compare_objects(
        &mut self,
        rp: &[&'a Map<String, Value>],
        wp: &[&'a Map<String, Value>],
        path: &str,
    ) {
        let (r, w) = (ObjectView::of(rp), ObjectView::of(wp));
        // What the reader requires.
        for name in &r.required {
            let schema = r.property(name);
            let has_default = schema
                .and_then(Value::as_object)
                .is_some_and(|m| m.contains_key("default"));
            if has_default || w.required.contains(name) {
                continue;
            }
            let field = join_path(path, name);
            let (reader, writer, one) =
                (self.dir.reader(), self.dir.writer(), self.dir.writer_one());
            let fix = match self.dir {
                Direction::Backward => "make it optional or give it a #[serde(default)]",
                Direction::Forward => {
                    "old readers fail on it: keep writing the field, or first ship readers where \
                     it is optional or #[serde(default)]"
                }
            };
            let message = if w.property(name).is_some() {
                format!(
                    "required in {reader} but optional in {one}, so data written with {writer} \
                     may lack it ({fix})"
                )
            } else {
                format!("required in {reader} but absent from data written with {one} ({fix})")
            };
            self.report(&field, Rule::RequiredFieldAdded, message);
        }
        // What the writer may write.
        for (name, ws) in &w.properties {
            let field = join_path(path, name);
            if let Some(rs) = r.property(name) {
                self.compare(rs, ws, &field);
                continue;
            }
            match r.additional {
                Additional::Open => {}
                Additional::Schema(rs) => self.compare(rs, ws, &field),
                Additional::Closed => {
                    let hint = match self.dir {
                        Direction::Backward => {
                            "new readers reject it: keep the field (an Option will do) or drop \
                             deny_unknown_fields"
                        }
                        Direction::Forward => {
                            "old readers reject it: drop deny_unknown_fields from the old type \
                             first, or do not add the field"
                        }
                    };
                    self.report(
                        &field,
                        Rule::FieldRemovedFromClosedReader,
                        format!(
                            "present in data written with {} but not declared by {}, whose content \
                             model is closed (additionalProperties: false, \
                             #[serde(deny_unknown_fields)]): {hint}",
                            self.dir.writer(),
                            self.dir.reader()
                        ),
                    );
                }
            }
        }
        // Map keys the writer may write.
        if let Additional::Schema(ws) = w.additional {
            let field = join_path(path, "*");
            match r.additional {
                Additional::Open => {}
                Additional::Schema(rs) => self.compare(rs, ws, &field),
                Additional::Closed => self.report(
                    &field,
                    Rule::FieldRemovedFromClosedReader,
                    format!(
                        "data written with {} may hold arbitrary keys here (a map), but {} is \
                         closed (additionalProperties: false) and rejects undeclared keys",
                        self.dir.writer(),
                        self.dir.reader()
                    ),
                ),
            }
            // A map key may also land on a property the reader declares.
            for (name, rs) in &r.properties {
                if w.property(name).is_none() {
                    self.compare(rs, ws, &join_path(path, name));
                }
            }
        }
    }
}

/// Whether a value fits a typed branch of the reader.
fn literal_fits_typed(kind: Kind, parts: &[&Map<String, Value>], value: &Value) -> bool {
    let matches_kind = kind.admits(value) || (kind == Kind::Number && value.is_number());
    if !matches_kind {
        return false;
    }
    match kind {
        Kind::Integer => {
            let (lo, hi) = integer_range(parts);
            let v = value
                .as_i64()
                .map(i128::from)
                .or_else(|| value.as_u64().map(i128::from))
                .or_else(|| value.as_f64().map(|f| f as i128));
            v.is_some_and(|v| lo.is_none_or(|l| v >= l) && hi.is_none_or(|h| v <= h))
        }
        Kind::String => {
            let s = value.as_str().unwrap_or_default();
            let (min, max) = u64_range(parts, "minLength", "maxLength");
            let len = s.chars().count() as u64;
            format_of(parts).is_none()
                && keyword(parts, "pattern").is_none()
                && len >= min
                && max.is_none_or(|m| len <= m)
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use schemars::JsonSchema;
    use serde_json::json;

    fn schema<T: JsonSchema>() -> Value {
        schemars::schema_for!(T).to_value()
    }

    fn check<Old: JsonSchema, New: JsonSchema>(mode: Compatibility) -> Vec<Violation> {
        check_schema("order.placed v1", &schema::<Old>(), &schema::<New>(), mode)
    }

    fn rules(v: &[Violation]) -> Vec<(Direction, &str, Rule)> {
        v.iter()
            .map(|v| (v.direction, v.field.as_str(), v.rule))
            .collect()
    }

    mod v1 {
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Order {
            pub(super) order_id: String,
            pub(super) total_cents: u32,
        }
    }

    mod v2_optional {
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Order {
            pub(super) order_id: String,
            pub(super) total_cents: u32,
            pub(super) note: Option<String>,
            #[serde(default)]
            pub(super) currency: String,
            #[serde(default)]
            pub(super) lines: Vec<u32>,
        }
    }

    mod v2_required {
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Order {
            pub(super) order_id: String,
            pub(super) total_cents: u32,
            pub(super) currency: String,
        }
    }

    mod v2_removed {
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Order {
            pub(super) order_id: String,
        }
    }

    mod v2_string {
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Order {
            pub(super) order_id: String,
            pub(super) total_cents: String,
        }
    }

    mod v2_u64 {
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Order {
            pub(super) order_id: String,
            pub(super) total_cents: u64,
        }
    }

    mod v2_f64 {
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Order {
            pub(super) order_id: String,
            pub(super) total_cents: f64,
        }
    }

    mod v2_option {
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Order {
            pub(super) order_id: String,
            pub(super) total_cents: Option<u32>,
        }
    }

    #[test]
    fn adding_an_optional_field_is_full_compatible() {
        assert_eq!(
            check::<v1::Order, v2_optional::Order>(Compatibility::Full),
            vec![]
        );
        // And removing it again too.
        assert_eq!(
            check::<v2_optional::Order, v1::Order>(Compatibility::Full),
            vec![]
        );
    }

    #[test]
    fn adding_a_required_field_fails_backward_and_passes_forward() {
        let v = check::<v1::Order, v2_required::Order>(Compatibility::Backward);
        assert_eq!(
            rules(&v),
            vec![(Direction::Backward, "currency", Rule::RequiredFieldAdded)]
        );
        assert_eq!(
            v[0].message,
            "required in the new schema but absent from data written with the old one \
             (make it optional or give it a #[serde(default)])"
        );
        assert_eq!(
            check::<v1::Order, v2_required::Order>(Compatibility::Forward),
            vec![]
        );
        // FULL reports the backward failure only.
        assert_eq!(
            rules(&check::<v1::Order, v2_required::Order>(Compatibility::Full)),
            vec![(Direction::Backward, "currency", Rule::RequiredFieldAdded)]
        );
    }

    #[test]
    fn removing_a_required_field_fails_forward_and_passes_backward() {
        assert_eq!(
            check::<v1::Order, v2_removed::Order>(Compatibility::Backward),
            vec![]
        );
        let v = check::<v1::Order, v2_removed::Order>(Compatibility::Forward);
        assert_eq!(
            rules(&v),
            vec![(Direction::Forward, "total_cents", Rule::RequiredFieldAdded)]
        );
        assert!(
            v[0].message.contains("required in the old schema"),
            "{}",
            v[0]
        );
        assert!(v[0]
            .message
            .contains("absent from data written with the new one"));
    }

    mod closed_v1 {
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        #[derive(Serialize, Deserialize, JsonSchema)]
        #[serde(deny_unknown_fields)]
        pub(super) struct Order {
            pub(super) order_id: String,
            pub(super) note: Option<String>,
        }
    }

    mod closed_v2_removed {
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        #[derive(Serialize, Deserialize, JsonSchema)]
        #[serde(deny_unknown_fields)]
        pub(super) struct Order {
            pub(super) order_id: String,
        }
    }

    #[test]
    fn closed_reader_rejects_a_removed_field_and_an_added_one() {
        // Removing `note` from a deny_unknown_fields type: the new reader rejects it in old data.
        let v = check::<closed_v1::Order, closed_v2_removed::Order>(Compatibility::Full);
        assert_eq!(
            rules(&v),
            vec![(
                Direction::Backward,
                "note",
                Rule::FieldRemovedFromClosedReader
            )]
        );
        assert!(v[0].message.contains("deny_unknown_fields"), "{}", v[0]);
        // Adding an optional field to it: old closed readers reject it in new data.
        let v = check::<closed_v2_removed::Order, closed_v1::Order>(Compatibility::Full);
        assert_eq!(
            rules(&v),
            vec![(
                Direction::Forward,
                "note",
                Rule::FieldRemovedFromClosedReader
            )]
        );
        // An open reader ignores unknown fields: removing from an open type is fine.
        assert_eq!(
            check::<v2_optional::Order, v1::Order>(Compatibility::Backward),
            vec![]
        );
    }

    #[test]
    fn u32_to_string_fails_both_ways() {
        let v = check::<v1::Order, v2_string::Order>(Compatibility::Full);
        assert_eq!(
            rules(&v),
            vec![
                (Direction::Backward, "total_cents", Rule::TypeChanged),
                (Direction::Forward, "total_cents", Rule::TypeChanged),
            ]
        );
        assert_eq!(
            v[0].message,
            "data written with the old schema holds integer (uint32), the new schema reads string"
        );
        assert_eq!(
            v[1].message,
            "data written with the new schema holds string, the old schema reads integer (uint32)"
        );
    }

    #[test]
    fn integer_widening_is_backward_only() {
        assert_eq!(
            check::<v1::Order, v2_u64::Order>(Compatibility::Backward),
            vec![]
        );
        let v = check::<v1::Order, v2_u64::Order>(Compatibility::Full);
        assert_eq!(
            rules(&v),
            vec![(Direction::Forward, "total_cents", Rule::TypeChanged)]
        );
        assert!(v[0].message.contains("integer (uint64)"), "{}", v[0]);
        assert!(
            v[0].message.contains("integer (uint32) (0..=4294967295)"),
            "{}",
            v[0]
        );
        // integer -> number is a widening too.
        assert_eq!(
            rules(&check::<v1::Order, v2_f64::Order>(Compatibility::Full)),
            vec![(Direction::Forward, "total_cents", Rule::TypeChanged)]
        );
    }

    #[test]
    fn float_to_double_is_a_widening() {
        let f32_schema = json!({"type": "object", "properties": {"x": {"type": "number", "format": "float"}}, "required": ["x"]});
        let f64_schema = json!({"type": "object", "properties": {"x": {"type": "number", "format": "double"}}, "required": ["x"]});
        let v = check_schema("e v1", &f32_schema, &f64_schema, Compatibility::Full);
        assert_eq!(
            rules(&v),
            vec![(Direction::Forward, "x", Rule::TypeChanged)]
        );
    }

    #[test]
    fn a_format_narrowing_is_a_type_change() {
        let plain =
            json!({"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]});
        let uuid = json!({"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}}, "required": ["id"]});
        let v = check_schema("e v1", &plain, &uuid, Compatibility::Full);
        assert_eq!(
            rules(&v),
            vec![(Direction::Backward, "id", Rule::TypeChanged)]
        );
        assert!(v[0].message.contains("string (uuid)"), "{}", v[0]);
    }

    #[test]
    fn t_to_option_t_is_backward_only() {
        assert_eq!(
            check::<v1::Order, v2_option::Order>(Compatibility::Backward),
            vec![]
        );
        let v = check::<v1::Order, v2_option::Order>(Compatibility::Forward);
        assert_eq!(
            rules(&v),
            vec![
                (Direction::Forward, "total_cents", Rule::RequiredFieldAdded),
                (Direction::Forward, "total_cents", Rule::TypeChanged),
            ]
        );
        assert!(v[0].message.contains("optional in the new one"), "{}", v[0]);
        assert!(v[1].message.contains("null"), "{}", v[1]);
    }

    mod nested_v1 {
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Address {
            pub(super) zip: String,
        }
        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Customer {
            pub(super) address: Address,
        }
        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Order {
            pub(super) customer: Customer,
            pub(super) lines: Vec<Address>,
        }
    }

    mod nested_v2 {
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Address {
            pub(super) zip: u32,
        }
        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Customer {
            pub(super) address: Address,
        }
        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Order {
            pub(super) customer: Customer,
            pub(super) lines: Vec<Address>,
        }
    }

    #[test]
    fn nested_change_reports_the_dotted_path_through_refs() {
        let old = schema::<nested_v1::Order>();
        assert!(old["properties"]["customer"].get("$ref").is_some());
        let v = check::<nested_v1::Order, nested_v2::Order>(Compatibility::Backward);
        assert_eq!(
            rules(&v),
            vec![
                (
                    Direction::Backward,
                    "customer.address.zip",
                    Rule::TypeChanged
                ),
                (Direction::Backward, "lines[].zip", Rule::TypeChanged),
            ]
        );
    }

    mod enum_v1 {
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) enum Status {
            Placed,
            Paid,
            Shipped,
        }
        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) enum Payment {
            Cash,
            Card { last4: String },
            Voucher(u32),
        }
        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Order {
            pub(super) status: Status,
            pub(super) payment: Payment,
        }
    }

    mod enum_v2 {
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) enum Status {
            Placed,
            Paid,
            Cancelled,
        }
        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) enum Payment {
            Cash,
            Card { last4: u16 },
        }
        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Order {
            pub(super) status: Status,
            pub(super) payment: Payment,
        }
    }

    #[test]
    fn enum_variants_removed_and_added() {
        let v = check::<enum_v1::Order, enum_v2::Order>(Compatibility::Full);
        assert_eq!(
            rules(&v),
            vec![
                // Old data may hold `Shipped` and `Voucher`, which the new enums lack.
                (Direction::Backward, "payment.Card.last4", Rule::TypeChanged),
                (Direction::Backward, "payment", Rule::EnumValueRemoved),
                (Direction::Backward, "status", Rule::EnumValueRemoved),
                // New data may hold `Cancelled`, which old readers lack.
                (Direction::Forward, "payment.Card.last4", Rule::TypeChanged),
                (Direction::Forward, "status", Rule::EnumValueRemoved),
            ]
        );
        assert!(v[1].message.contains("`Voucher`"), "{}", v[1]);
        assert!(v[2].message.contains("\"Shipped\""), "{}", v[2]);
        assert!(v[4].message.contains("\"Cancelled\""), "{}", v[4]);
    }

    mod tagged_v1 {
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        #[derive(Serialize, Deserialize, JsonSchema)]
        #[serde(tag = "type")]
        pub(super) enum Shipment {
            Pickup,
            Courier { carrier: String },
        }
    }

    mod tagged_v2 {
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        #[derive(Serialize, Deserialize, JsonSchema)]
        #[serde(tag = "type")]
        pub(super) enum Shipment {
            Pickup,
            Courier { carrier: String, tracking: String },
        }
    }

    #[test]
    fn internally_tagged_variant_is_matched_by_its_tag() {
        let v = check::<tagged_v1::Shipment, tagged_v2::Shipment>(Compatibility::Full);
        assert_eq!(
            rules(&v),
            vec![(Direction::Backward, "tracking", Rule::RequiredFieldAdded)]
        );
    }

    mod tree_v1 {
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Node {
            pub(super) value: u32,
            pub(super) children: Vec<Node>,
            pub(super) parent: Option<Box<Node>>,
        }
        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Event {
            pub(super) root: Node,
        }
    }

    mod tree_v2 {
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Node {
            pub(super) value: String,
            pub(super) children: Vec<Node>,
            pub(super) parent: Option<Box<Node>>,
            pub(super) label: Option<String>,
        }
        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Event {
            pub(super) root: Node,
        }
    }

    #[test]
    fn recursive_types_terminate() {
        // Recursive through `$defs` and through the root itself (`"$ref": "#"`).
        assert_eq!(
            check::<tree_v1::Event, tree_v1::Event>(Compatibility::Full),
            vec![]
        );
        assert_eq!(
            check::<tree_v1::Node, tree_v1::Node>(Compatibility::Full),
            vec![]
        );
        let v = check::<tree_v1::Event, tree_v2::Event>(Compatibility::Backward);
        assert_eq!(
            rules(&v),
            vec![(Direction::Backward, "root.value", Rule::TypeChanged)]
        );
        let v = check::<tree_v1::Node, tree_v2::Node>(Compatibility::Backward);
        assert_eq!(
            rules(&v),
            vec![(Direction::Backward, "value", Rule::TypeChanged)]
        );
    }

    mod rich {
        use std::collections::{BTreeMap, BTreeSet};

        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Inner {
            pub(super) zip: String,
        }
        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) enum Mixed {
            /// Documented unit variants become `const` branches.
            A,
            B(u32),
            C {
                x: i64,
            },
            D(Inner),
        }
        #[derive(Serialize, Deserialize, JsonSchema)]
        #[serde(tag = "t", content = "c")]
        pub(super) enum Adjacent {
            X(u8),
            Y,
        }
        #[derive(Serialize, Deserialize, JsonSchema)]
        #[serde(untagged)]
        pub(super) enum Untagged {
            N(u8),
            S { s: String },
        }
        #[derive(Serialize, Deserialize, JsonSchema)]
        pub(super) struct Tree {
            pub(super) kids: Vec<Tree>,
        }
        #[derive(Serialize, Deserialize, JsonSchema)]
        #[serde(deny_unknown_fields)]
        pub(super) struct Event {
            pub(super) a: u8,
            #[serde(default)]
            pub(super) b: f64,
            pub(super) c: Option<Inner>,
            pub(super) d: BTreeMap<String, u64>,
            pub(super) e: Option<Mixed>,
            pub(super) f: Adjacent,
            pub(super) g: Untagged,
            pub(super) h: Tree,
            pub(super) i: BTreeSet<String>,
            pub(super) j: (u32, String),
            pub(super) k: [u8; 3],
            pub(super) l: char,
            pub(super) m: serde_json::Value,
            pub(super) n: Vec<Option<i16>>,
            pub(super) o: (),
            #[serde(flatten)]
            pub(super) p: Inner,
        }
    }

    #[test]
    fn every_schema_reads_itself() {
        assert_eq!(
            check::<rich::Event, rich::Event>(Compatibility::Full),
            vec![]
        );
        assert_eq!(
            check::<rich::Mixed, rich::Mixed>(Compatibility::Full),
            vec![]
        );
        assert_eq!(
            check::<rich::Untagged, rich::Untagged>(Compatibility::Full),
            vec![]
        );
    }

    #[test]
    fn none_reports_nothing() {
        assert_eq!(
            check::<v1::Order, v2_string::Order>(Compatibility::None),
            vec![]
        );
        assert_eq!(
            check::<enum_v1::Order, enum_v2::Order>(Compatibility::None),
            vec![]
        );
    }

    #[test]
    fn maps_and_arrays() {
        let old = json!({"type": "object", "properties": {
            "prices": {"type": "object", "additionalProperties": {"type": "integer", "format": "uint32"}},
            "tags": {"type": "array", "items": {"type": "integer", "format": "uint32"}},
            "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "minItems": 2, "maxItems": 2}
        }, "required": ["prices", "tags", "pair"]});
        let new = json!({"type": "object", "properties": {
            "prices": {"type": "object", "additionalProperties": {"type": "string"}},
            "tags": {"type": "array", "items": {"type": "string"}},
            "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}, {"type": "integer"}], "minItems": 3, "maxItems": 3}
        }, "required": ["prices", "tags", "pair"]});
        let v = check_schema("e v1", &old, &new, Compatibility::Backward);
        assert_eq!(
            rules(&v),
            vec![
                (Direction::Backward, "pair", Rule::ItemsChanged),
                (Direction::Backward, "prices.*", Rule::TypeChanged),
                (Direction::Backward, "tags[]", Rule::ItemsChanged),
            ]
        );
        assert!(v[2].message.starts_with("array items:"), "{}", v[2]);
    }

    #[test]
    fn unresolved_references_are_reported() {
        let old = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}, "required": ["a"]});
        let v = check_schema("e v1", &old, &old, Compatibility::Backward);
        assert_eq!(
            rules(&v),
            vec![
                (Direction::Backward, "a", Rule::UnresolvedReference),
                (Direction::Backward, "a", Rule::UnresolvedReference),
            ]
        );
    }

    fn entry(name: &str, version: u32, schema: Value) -> CatalogEntry {
        CatalogEntry {
            name: name.into(),
            version,
            rust_type: format!("app::{}V{version}", name.replace('.', "_")),
            schema,
        }
    }

    #[test]
    fn catalog_version_removed_and_overrides() {
        let old = vec![
            entry("order.placed", 1, schema::<v1::Order>()),
            entry("order.shipped", 1, schema::<v1::Order>()),
        ];
        let new = vec![
            // order.placed v1 gone, though v2 is registered: still a violation.
            entry("order.placed", 2, schema::<v2_required::Order>()),
            entry("order.shipped", 1, schema::<v2_string::Order>()),
            entry("order.cancelled", 1, schema::<v1::Order>()),
        ];
        let none = HashMap::new();
        let v = check_catalog(&old, &new, Compatibility::Backward, &none);
        let got: Vec<_> = v
            .iter()
            .map(|v| (v.event.as_str(), v.field.as_str(), v.rule))
            .collect();
        assert_eq!(
            got,
            vec![
                ("order.placed v1", "", Rule::VersionRemoved),
                ("order.shipped v1", "total_cents", Rule::TypeChanged),
            ]
        );
        assert!(v[0].message.contains("dead letter queues"), "{}", v[0]);
        // FULL reports the removal too; FORWARD does not.
        assert_eq!(
            check_catalog(&old, &new, Compatibility::Full, &none)
                .iter()
                .filter(|v| v.rule == Rule::VersionRemoved)
                .count(),
            1
        );
        assert!(check_catalog(&old, &new, Compatibility::Forward, &none)
            .iter()
            .all(|v| v.rule != Rule::VersionRemoved));
        // Overrides by event name.
        let overrides = HashMap::from([
            ("order.placed".to_owned(), Compatibility::None),
            ("order.shipped".to_owned(), Compatibility::None),
        ]);
        assert_eq!(
            check_catalog(&old, &new, Compatibility::Full, &overrides),
            vec![]
        );
        // Identical catalogs pass.
        assert_eq!(
            check_catalog(&old, &old, Compatibility::Full, &none),
            vec![]
        );
    }

    #[test]
    fn violation_displays_on_one_line() {
        let v = check::<v1::Order, v2_required::Order>(Compatibility::Backward);
        let line = v[0].to_string();
        assert_eq!(
            line,
            "order.placed v1: field `currency`: BACKWARD RequiredFieldAdded: required in the new \
             schema but absent from data written with the old one (make it optional or give it a \
             #[serde(default)])"
        );
        for v in check::<enum_v1::Order, enum_v2::Order>(Compatibility::Full)
            .iter()
            .chain(&check::<nested_v1::Order, nested_v2::Order>(
                Compatibility::Full,
            ))
        {
            let line = v.to_string();
            assert!(!line.contains('\n'), "{line}");
            assert!(line.starts_with("order.placed v1: field `"), "{line}");
            assert!(line.contains(v.rule.as_str()), "{line}");
        }
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
}

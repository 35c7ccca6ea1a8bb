//! Normalisation: owns turning one schema document into a union of branches (`$ref` resolution,
//! `allOf`/`anyOf`/`oneOf`, `enum`, `const`, type arrays) and describing them; judges no rule.

use serde_json::{Map, Value};

/// How deep the flattening of combinators and references may go before giving up (as "any").
const MAX_FLATTEN_DEPTH: usize = 64;

/// The schema that accepts everything, for items and map values left unconstrained.
pub(super) static ANY_SCHEMA: Value = Value::Bool(true);

/// The JSON types of JSON Schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Null,
    Boolean,
    Integer,
    Number,
    String,
    Array,
    Object,
}

impl Kind {
    pub(super) fn parse(s: &str) -> Option<Kind> {
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

    pub(super) fn name(self) -> &'static str {
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
    pub(super) fn admits(self, v: &Value) -> bool {
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

    pub(super) fn of(v: &Value) -> Kind {
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
pub(super) enum Branch<'a> {
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
pub(super) struct Flattener<'a> {
    doc: &'a Value,
    /// The `$ref` targets being flattened, to cut reference cycles through combinators.
    visiting: Vec<*const Value>,
    /// The `$ref`s that did not resolve, in the order met.
    pub(super) unresolved: Vec<String>,
    /// What an unresolved `$ref` stands for: anything for a reader (so that one unresolved
    /// reference is one finding), nothing for a writer.
    unresolved_is_any: bool,
}

impl<'a> Flattener<'a> {
    /// A flattener of `doc`, the document of the reader (`unresolved_is_any`) or the writer.
    pub(super) fn new(doc: &'a Value, unresolved_is_any: bool) -> Self {
        Flattener {
            doc,
            visiting: Vec::new(),
            unresolved: Vec::new(),
            unresolved_is_any,
        }
    }

    /// The branches of `node`, a schema of this flattener's document.
    pub(super) fn flatten(&mut self, node: &'a Value, depth: usize) -> Vec<Branch<'a>> {
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
pub(super) fn keyword<'a>(parts: &[&'a Map<String, Value>], key: &str) -> Option<&'a Value> {
    parts.iter().find_map(|p| p.get(key))
}

/// The `format` keyword of the parts, if any.
pub(super) fn format_of<'a>(parts: &[&'a Map<String, Value>]) -> Option<&'a str> {
    keyword(parts, "format").and_then(Value::as_str)
}

/// A branch as a message names it: `integer (uint32)`, `"Shipped"`, `any JSON value`.
pub(super) fn describe(branch: &Branch<'_>) -> String {
    match branch {
        Branch::Any => "any JSON value".to_owned(),
        Branch::Literal(v) => v.to_string(),
        Branch::Typed(kind, parts) => match format_of(parts) {
            Some(format) => format!("{} ({format})", kind.name()),
            None => kind.name().to_owned(),
        },
    }
}

/// A union as a message names it: `one of "A", "B"` for literals, else `string | null`.
pub(super) fn describe_union(branches: &[Branch<'_>]) -> String {
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

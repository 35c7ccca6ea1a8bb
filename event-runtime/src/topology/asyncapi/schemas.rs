//! The payload schemas of the AsyncAPI document: the CloudEvents envelope around each event's
//! JSON Schema, and that schema moved into `components.schemas` with its `$defs` and every
//! `$ref` rewritten (AsyncAPI resolves references against the whole document).

use std::collections::{BTreeMap, BTreeSet};

use event_core::EventDescriptor;
use serde_json::{json, Map, Value};

use super::super::ident;

/// The CloudEvents envelope of `e` whose `data` is `data` (see `event_core::RawEnvelope`'s
/// wire format).
pub(super) fn envelope_schema(e: &EventDescriptor, data: Value) -> Value {
    json!({
        "type": "object",
        "description": "A CloudEvents 1.0 structured-mode JSON event: the envelope's attributes, \
            and the payload as `data`.",
        "required": [
            "specversion", "id", "source", "type", "subject", "time", "datacontenttype",
            "schemaversion", "aggregatetype", "sequence", "data"
        ],
        "properties": {
            "specversion": { "const": "1.0" },
            "id": {
                "type": "string",
                "format": "uuid",
                "description": "The event id (a UUID v7): with a handler's name, the idempotency key.",
            },
            "source": {
                "type": "string",
                "format": "uri-reference",
                "description": "The producing service; consumers key its aggregates by it.",
            },
            "type": { "const": e.name },
            "subject": { "type": "string", "description": "The aggregate id." },
            "time": { "type": "string", "format": "date-time" },
            "datacontenttype": { "const": "application/json" },
            "schemaversion": { "const": e.version },
            "aggregatetype": { "const": e.aggregate_type },
            "sequence": {
                "type": "string",
                "pattern": "^[0-9]{20}$",
                "description": "The event's position in its aggregate, from 1, zero-padded to 20 \
                    digits (CloudEvents sequence extension).",
            },
            "prevsequence": {
                "type": ["string", "integer"],
                "description": "Set by the relay: the sequence of the previous event of the \
                    aggregate it published (0: none). The inbox holds an event until that one \
                    was applied.",
            },
            "correlationid": { "type": "string" },
            "causationid": { "type": "string" },
            "traceparent": {
                "type": "string",
                "description": "W3C Trace Context of the event's creation (CloudEvents \
                    distributed tracing extension).",
            },
            "tracestate": { "type": "string" },
            "data": data,
        },
    })
}

/// `schema` with its `$defs` (and draft 7 `definitions`) moved into `schemas` and its
/// references rewritten to them, and its `$schema` dropped: it is to be stored as the
/// component `owner`. A definition takes its own name (as an identifier) when that is free or
/// holds the same schema, else `<owner>_<name>`. `reserved` are the names of the events' own
/// schemas. A reference to the schema itself (`#`, a recursive type) or into it points to the
/// component `owner`.
pub(super) fn hoist(
    mut schema: Value,
    owner: &str,
    reserved: &BTreeSet<String>,
    schemas: &mut Map<String, Value>,
) -> Value {
    let Value::Object(map) = &mut schema else {
        return schema;
    };
    map.remove("$schema");
    let mut defs: Vec<(String, Value)> = Vec::new();
    // (`$defs` or `definitions`, the definition's name) → its component.
    let mut renames: BTreeMap<(String, String), String> = BTreeMap::new();
    for key in ["$defs", "definitions"] {
        let Some(Value::Object(found)) = map.remove(key) else {
            continue;
        };
        for (name, def) in found {
            let own = ident(&name);
            let free = |n: &str| {
                !reserved.contains(n)
                    && schemas.get(n).is_none_or(|v| *v == def)
                    && !defs.iter().any(|(d, _)| d == n)
            };
            let mut target = if free(&own) {
                own.clone()
            } else {
                format!("{owner}_{own}")
            };
            let mut n = 1;
            while !free(&target) {
                n += 1;
                target = format!("{owner}_{own}_{n}");
            }
            renames.insert((key.to_owned(), name), target.clone());
            defs.push((target, def));
        }
    }
    let refs = Refs { renames, owner };
    refs.rewrite(&mut schema);
    for (target, mut def) in defs {
        refs.rewrite(&mut def);
        schemas.insert(target, def);
    }
    schema
}

/// How the references of one event's schema move with it into the components.
struct Refs<'a> {
    renames: BTreeMap<(String, String), String>,
    owner: &'a str,
}

impl Refs<'_> {
    /// Rewrites every `$ref` under `value`.
    fn rewrite(&self, value: &mut Value) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(r)) = map.get_mut("$ref") {
                    if let Some(moved) = self.moved(r) {
                        *r = moved;
                    }
                }
                for v in map.values_mut() {
                    self.rewrite(v);
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.rewrite(v)),
            _ => {}
        }
    }

    /// Where the reference `r` points once moved; `None` for one outside the schema (a URI),
    /// left as it is. `r` is a URI fragment holding a JSON Pointer (RFC 6901 §6): its
    /// segments are percent-encoded, and `~` and `/` in a name are `~0` and `~1`.
    fn moved(&self, r: &str) -> Option<String> {
        let fragment = r.strip_prefix('#')?;
        let root = format!("#/components/schemas/{}", self.owner);
        let pointer = percent_decode(fragment);
        let mut segments = pointer.split('/').skip(1);
        if let Some(container @ ("$defs" | "definitions")) = segments.next() {
            let name = segments.next()?.replace("~1", "/").replace("~0", "~");
            let target = self.renames.get(&(container.to_owned(), name))?;
            let rest: String = segments
                .map(|s| format!("/{}", percent_encode(s)))
                .collect();
            return Some(format!("#/components/schemas/{target}{rest}"));
        }
        // The schema itself, or a place in it.
        Some(format!("{root}{fragment}"))
    }
}

/// `s` with each `%XX` decoded (bytes that are no UTF-8 as U+FFFD).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `s` as a URI fragment segment: bytes other than unreserved characters and `~` as `%XX`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~$".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_move_to_the_components_and_references_follow() {
        let mut schemas = Map::new();
        let reserved = BTreeSet::from(["a_v1".to_owned(), "b_v1".to_owned()]);
        let a = hoist(
            json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "properties": { "m": { "$ref": "#/$defs/Money" } },
                "$defs": { "Money": { "type": "string" } }
            }),
            "a_v1",
            &reserved,
            &mut schemas,
        );
        assert_eq!(
            a,
            json!({ "properties": { "m": { "$ref": "#/components/schemas/Money" } } })
        );
        // The same definition is shared; another one of the same name gets its owner's prefix.
        let b = hoist(
            json!({
                "properties": {
                    "m": { "$ref": "#/$defs/Money" },
                    "n": { "$ref": "#/$defs/Note/properties/x" }
                },
                "$defs": { "Money": { "type": "integer" }, "Note": { "type": "object" } }
            }),
            "b_v1",
            &reserved,
            &mut schemas,
        );
        assert_eq!(
            b["properties"]["m"]["$ref"],
            "#/components/schemas/b_v1_Money"
        );
        assert_eq!(
            b["properties"]["n"]["$ref"],
            "#/components/schemas/Note/properties/x"
        );
        // Escaped names, and the schema itself (a recursive type).
        let c = hoist(
            json!({
                "properties": {
                    "a": { "$ref": "#/$defs/money~1amount~0x" },
                    "b": { "$ref": "#/$defs/Foo%20Bar" },
                    "c": { "$ref": "#/$defs/%C3%9Cn%C3%AF" },
                    "replies": { "items": { "$ref": "#" } },
                    "self": { "$ref": "#/properties/a" }
                },
                "$defs": {
                    "money/amount~x": { "type": "string" },
                    "Foo Bar": { "type": "integer" },
                    "Ünï": { "type": "boolean" }
                }
            }),
            "c_v1",
            &reserved,
            &mut schemas,
        );
        assert_eq!(
            c["properties"]["a"]["$ref"],
            "#/components/schemas/money_amount_x"
        );
        assert_eq!(c["properties"]["b"]["$ref"], "#/components/schemas/Foo_Bar");
        assert_eq!(c["properties"]["c"]["$ref"], "#/components/schemas/_n_");
        assert_eq!(
            c["properties"]["replies"]["items"]["$ref"],
            "#/components/schemas/c_v1"
        );
        assert_eq!(
            c["properties"]["self"]["$ref"],
            "#/components/schemas/c_v1/properties/a"
        );
        assert_eq!(schemas["Money"], json!({ "type": "string" }));
        assert_eq!(schemas["b_v1_Money"], json!({ "type": "integer" }));
    }
}

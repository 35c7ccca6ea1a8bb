//! Validation of incoming payloads against their event type's JSON Schema, opt-in per
//! consumer ([`DispatcherBuilder::validate_schemas`](crate::DispatcherBuilder::validate_schemas)).
//! The schemas are the catalog's (`schemars`, draft 2020-12), compiled once when the dispatcher
//! is built by the `jsonschema` crate; checking runs no handler and touches no store.
//!
//! Why validate when decoding already refuses a payload that does not fit the Rust type: the
//! schema says more than serde does (a `#[schemars(range(min = 1))]`, a `pattern`, a
//! `deny_unknown_fields` the type does not enforce), names the place of the first violation as
//! a JSON pointer (`/lines/2/quantity`) rather than a line and column of the body, and is the
//! contract a producer in another language validates against too.

use std::collections::{HashMap, HashSet};

use event_core::RawEnvelope;
use jsonschema::error::ValidationErrorKind;
use jsonschema::paths::LocationSegment;
use serde_json::Value;

use crate::dispatch::registry::{Registry, RegistryError};

/// A payload that does not match the JSON Schema of its (name, version): the first violation.
///
/// The message names the rule and never quotes the payload's values (they may be personal
/// data): `jsonschema`'s masked form, `value is not of type "integer"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the payload of `{event}` v{version} does not match its JSON Schema at {}: {message}", if path.is_empty() { "the top level" } else { path.as_str() })]
#[non_exhaustive]
pub struct SchemaViolation {
    /// The event name.
    pub event: String,
    /// The event version.
    pub version: u32,
    /// Where in the payload: a JSON pointer (RFC 6901), empty for the payload itself. A
    /// segment that is not a property name of the schema — a map's key, which is payload —
    /// is written `*`.
    pub path: String,
    /// The rule it breaks, with the payload's values (and map keys) masked.
    pub message: String,
}

/// The compiled schemas of a registry's event types, by (name, version). Types without a
/// schema (that do not derive `schemars::JsonSchema`) are not validated.
pub(crate) struct SchemaValidator {
    by_event: HashMap<(&'static str, u32), Compiled>,
}

struct Compiled {
    validator: jsonschema::Validator,
    /// Every property name the schema declares, anywhere: the pointer segments it may show.
    names: HashSet<String>,
}

impl std::fmt::Debug for SchemaValidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchemaValidator")
            .field("events", &self.by_event.len())
            .finish()
    }
}

impl SchemaValidator {
    /// Compiles the schema of every event type of `registry` that has one.
    ///
    /// # Errors
    /// [`RegistryError::InvalidSchema`] for a schema the validator does not compile.
    pub(crate) fn new(registry: &Registry) -> Result<Self, RegistryError> {
        let mut by_event = HashMap::new();
        let mut unchecked = Vec::new();
        for e in registry.events() {
            let Some(schema) = (e.schema)() else {
                unchecked.push(format!("{} v{}", e.name, e.version));
                continue;
            };
            let validator =
                jsonschema::validator_for(&schema).map_err(|err| RegistryError::InvalidSchema {
                    name: e.name,
                    version: e.version,
                    type_name: e.type_name,
                    message: err.masked().to_string(),
                })?;
            let mut names = HashSet::new();
            property_names(&schema, &mut names);
            by_event.insert((e.name, e.version), Compiled { validator, names });
        }
        if !unchecked.is_empty() {
            tracing::warn!(
                events = %unchecked.join(", "),
                "schema validation is on, but these event types have no JSON Schema (derive schemars::JsonSchema) and are not validated"
            );
        }
        Ok(SchemaValidator { by_event })
    }

    /// Checks the payload of `raw` against the schema of its (name, version). An event type
    /// this validator has no schema for passes (decoding decides).
    ///
    /// # Errors
    /// The first [`SchemaViolation`]; a payload that is not JSON at all is one at the top
    /// level (the envelope parser has already refused that, so it does not happen).
    pub(crate) fn check(&self, raw: &RawEnvelope) -> Result<(), SchemaViolation> {
        let Some(compiled) = self.by_event.get(&(raw.name.as_str(), raw.version)) else {
            return Ok(());
        };
        let violation = |path: String, message: String| SchemaViolation {
            event: raw.name.clone(),
            version: raw.version,
            path,
            message,
        };
        let data: serde_json::Value = serde_json::from_str(raw.data.get())
            .map_err(|_| violation(String::new(), "the payload is not JSON".into()))?;
        compiled.validator.validate(&data).map_err(|e| {
            let mut path = String::new();
            for segment in e.instance_path() {
                path.push('/');
                match segment {
                    LocationSegment::Index(i) => path.push_str(&i.to_string()),
                    LocationSegment::Property(p) if compiled.names.contains(p.as_ref()) => {
                        path.push_str(&p.replace('~', "~0").replace('/', "~1"))
                    }
                    LocationSegment::Property(_) => path.push('*'),
                }
            }
            let message = match e.kind() {
                // The masked forms of these list the payload's keys.
                ValidationErrorKind::AdditionalProperties { unexpected }
                | ValidationErrorKind::UnevaluatedProperties { unexpected } => format!(
                    "properties the schema does not allow ({} of them; names withheld)",
                    unexpected.len()
                ),
                ValidationErrorKind::PropertyNames { .. } => {
                    "a property name breaks the schema's `propertyNames` (name withheld)".into()
                }
                _ => e.masked().to_string(),
            };
            violation(path, message)
        })
    }
}

/// Collects the names under every `properties` of `schema` (its `$defs` included).
fn property_names(schema: &Value, out: &mut HashSet<String>) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::Object(props)) = map.get("properties") {
                out.extend(props.keys().cloned());
            }
            for v in map.values() {
                property_names(v, out);
            }
        }
        Value::Array(items) => {
            for v in items {
                property_names(v, out);
            }
        }
        _ => {}
    }
}

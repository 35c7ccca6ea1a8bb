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

use std::collections::HashMap;

use event_core::RawEnvelope;

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
    /// Where in the payload: a JSON pointer (RFC 6901), empty for the payload itself.
    pub path: String,
    /// The rule it breaks, with the payload's values masked.
    pub message: String,
}

/// The compiled schemas of a registry's event types, by (name, version). Types without a
/// schema (that do not derive `schemars::JsonSchema`) are not validated.
pub(crate) struct SchemaValidator {
    by_event: HashMap<(&'static str, u32), jsonschema::Validator>,
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
            by_event.insert((e.name, e.version), validator);
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
        let Some(validator) = self.by_event.get(&(raw.name.as_str(), raw.version)) else {
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
        validator
            .validate(&data)
            .map_err(|e| violation(e.instance_path().to_string(), e.masked().to_string()))
    }
}

//! Payloads stay private: the fields an event type marks `#[event(sensitive)]` and how the
//! runtime masks them wherever it prints an envelope (`events dlq show --payload`), records
//! them in the catalog (`"x-sensitive": true`, the `event_catalog` table the standalone tool
//! reads), and the rule that nothing else prints a payload at all.
//!
//! What the runtime never writes to logs, span attributes (OpenTelemetry's included: system,
//! operation, destination, message id, consumer group, batch size) or metric labels
//! (destination names, reasons): payload values.
//! Decode errors withhold the values serde quotes ([`event_core::JsonError`]); schema
//! violations use `jsonschema`'s masked messages; envelopes are logged by id, name, version
//! and aggregate only. A handler's own error messages are the application's: do not put
//! payload values in them.

use event_core::EventDescriptor;
use serde_json::Value;

use crate::store::CatalogRecord;

#[cfg(feature = "cli")]
mod print;
#[cfg(feature = "cli")]
pub(crate) use print::Masking;

/// What a masked value is printed as.
pub const MASK: &str = "***";

/// The JSON Schema of `e` with `"x-sensitive": true` on each sensitive property; `None` for a
/// type without a schema.
pub(crate) fn schema_of(e: &EventDescriptor) -> Option<Value> {
    let mut schema = (e.schema)()?;
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        for field in e.sensitive_fields {
            if let Some(Value::Object(p)) = props.get_mut(*field) {
                p.insert("x-sensitive".into(), Value::Bool(true));
            }
        }
    }
    Some(schema)
}

/// The catalog record of `e`, to write to the database.
pub(crate) fn record_of(e: &EventDescriptor) -> CatalogRecord {
    CatalogRecord::new(
        e.name,
        e.version,
        e.type_name,
        e.sensitive_fields.iter().map(|f| (*f).to_owned()).collect(),
        schema_of(e),
    )
}

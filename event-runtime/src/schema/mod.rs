//! Schema evolution checks: the [`Catalog`] of every registered event's JSON Schema, and the
//! compatibility rules that compare it with a committed snapshot ([`check_catalog`],
//! [`check_schema`]); and the validation of incoming payloads against it
//! ([`SchemaViolation`]). Reads the registry; runs no handler and touches no store.

pub(crate) mod catalog;
pub(crate) mod compat;
pub(crate) mod validate;

pub use catalog::{Catalog, CatalogCheck, CatalogError, CatalogReport, BLESS_VAR};
pub use compat::{
    check_catalog, check_schema, CatalogEntry, Compatibility, Direction, ParseCompatibilityError,
    Rule, Violation,
};
pub use validate::SchemaViolation;

//! Literals and enums: owns whether a writer's `enum` value or `const` is read by the reader
//! (`EnumValueRemoved`, or `TypeChanged`); must not look into typed branches beyond a value's fit.

use serde_json::{Map, Value};

use super::branch::{describe_union, format_of, keyword, Branch, Kind};
use super::checker::Checker;
use super::numeric::{integer_range, u64_range};
use super::object::ObjectView;
use super::Rule;

impl<'a> Checker<'a> {
    /// Reports a writer's `enum` value or `const` that no reader alternative accepts: an enum
    /// value removed when the reader reads values of its kind (or tagged variants), else a type
    /// change.
    pub(super) fn accept_literal(&mut self, reader: &[Branch<'a>], value: &'a Value, path: &str) {
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

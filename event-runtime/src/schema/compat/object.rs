//! Objects: owns properties, `required`, `default`, the open or closed content model and map
//! values (`additionalProperties`); must not decide which enum variant an object stands for.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::checker::{join_path, Checker};
use super::{Direction, Rule};

/// How an object treats properties it does not declare.
#[derive(Debug, Clone, Copy)]
pub(super) enum Additional<'a> {
    /// No `additionalProperties` (or `true` on a reader): open. As a writer, writes only
    /// the declared properties.
    Open,
    /// `additionalProperties: false` or `unevaluatedProperties: false`.
    Closed,
    /// `additionalProperties` is a schema: a map, or a struct with a flattened map.
    Schema(&'a Value),
}

/// The object keywords of a branch, merged over its parts.
pub(super) struct ObjectView<'a> {
    pub(super) properties: Vec<(&'a str, &'a Value)>,
    pub(super) required: BTreeSet<&'a str>,
    pub(super) additional: Additional<'a>,
}

impl<'a> ObjectView<'a> {
    /// The object keywords of the parts of one branch.
    pub(super) fn of(parts: &[&'a Map<String, Value>]) -> Self {
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

    /// The schema of a declared property.
    pub(super) fn property(&self, name: &str) -> Option<&'a Value> {
        self.properties
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| *s)
    }
}

impl<'a> Checker<'a> {
    /// Reports a property the reader requires and the writer may omit, and a property or map
    /// key the writer may write that the reader rejects or reads with another schema.
    pub(super) fn compare_objects(
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

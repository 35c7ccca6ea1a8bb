//! Unions and tagged variants: owns choosing which alternative of a reader's `oneOf`/`anyOf`
//! reads a writer branch, matching enum variants by tag; must not compare the chosen pair itself.

use serde_json::{Map, Value};

use super::branch::{describe, describe_union, Branch, Kind};
use super::checker::{Checker, Finding};
use super::object::{Additional, ObjectView};
use super::{Direction, Rule};

impl<'a> Checker<'a> {
    /// Reports whether some alternative of the reader reads a typed branch of the writer: the one
    /// of the same variant tag for an enum variant, else the one that reads it entirely (an
    /// untagged enum) or the closest one.
    pub(super) fn accept_typed(
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
}

impl ObjectView<'_> {
    /// The variant an enum branch stands for: the required properties with a `const` (the tag
    /// of an internally or adjacently tagged enum), or the single required property of a
    /// closed object (an externally tagged variant).
    pub(super) fn variant_tag(&self) -> Option<String> {
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

//! The walk: owns `can_read`, comparing one reader schema with one writer schema at a path and
//! sending each writer branch to its rule family; must not judge a type, bound or field itself.

use serde_json::{Map, Value};

use super::branch::{describe_union, Branch, Flattener, Kind};
use super::{Direction, Rule};

/// A violation before it knows its event and direction.
#[derive(Debug)]
pub(super) struct Finding {
    pub(super) path: String,
    pub(super) rule: Rule,
    pub(super) message: String,
}

/// Every finding that keeps `reader` from reading what `writer` may write.
pub(super) fn can_read(reader: &Value, writer: &Value, direction: Direction) -> Vec<Finding> {
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

/// `path.segment`, or `segment` at the root.
pub(super) fn join_path(path: &str, segment: &str) -> String {
    if path.is_empty() {
        segment.to_owned()
    } else {
        format!("{path}.{segment}")
    }
}

/// One reading being checked: the two documents, the direction, and what was found so far.
pub(super) struct Checker<'a> {
    reader_doc: &'a Value,
    writer_doc: &'a Value,
    pub(super) dir: Direction,
    /// The (reader parts, writer parts) of the objects and arrays being compared: meeting one
    /// again means a recursive type, which is then taken as compatible (the rest of the
    /// comparison decides).
    in_progress: Vec<(Vec<usize>, Vec<usize>)>,
    pub(super) findings: Vec<Finding>,
}

impl<'a> Checker<'a> {
    pub(super) fn report(&mut self, path: &str, rule: Rule, message: String) {
        self.findings.push(Finding {
            path: path.to_owned(),
            rule,
            message,
        });
    }

    /// Reports whatever of `writer` the `reader` does not accept.
    pub(super) fn compare(&mut self, reader: &'a Value, writer: &'a Value, path: &str) {
        let mut rf = Flattener::new(self.reader_doc, true);
        let reader_branches = rf.flatten(reader, 0);
        let mut wf = Flattener::new(self.writer_doc, false);
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

    /// Compares a writer branch with the reader alternative chosen to read it (same kind, or
    /// a reader `number` for a writer `integer`).
    pub(super) fn compare_typed(
        &mut self,
        rk: Kind,
        rp: &[&'a Map<String, Value>],
        wk: Kind,
        wp: &[&'a Map<String, Value>],
        path: &str,
    ) {
        match (rk, wk) {
            (Kind::Integer, Kind::Integer)
            | (Kind::Number, Kind::Integer)
            | (Kind::Number, Kind::Number) => self.compare_numbers((rk, rp), (wk, wp), path),
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
}

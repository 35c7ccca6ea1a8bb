//! Arrays and tuples: owns `items`, `prefixItems` (and draft 7 tuples), lengths and the fixed
//! size of a tuple or `[T; N]`; must not judge the items other than through `compare`.

use serde_json::{Map, Value};

use super::branch::{keyword, ANY_SCHEMA};
use super::checker::Checker;
use super::numeric::{contains, show_range, u64_range};
use super::Rule;

/// The array keywords of a branch.
pub(super) struct ArrayView<'a> {
    prefix: Vec<&'a Value>,
    /// The schema of the items after the prefix, `None` when there can be none.
    rest: Option<&'a Value>,
    len: (u64, Option<u64>),
}

impl<'a> ArrayView<'a> {
    /// The array keywords of the parts of one branch (draft 2020-12 and draft 7 tuples).
    pub(super) fn of(parts: &[&'a Map<String, Value>]) -> Self {
        let mut prefix: Vec<&'a Value> = Vec::new();
        let mut rest: Option<&'a Value> = Some(&ANY_SCHEMA);
        if let Some(Value::Array(p)) = keyword(parts, "prefixItems") {
            prefix = p.iter().collect();
            if let Some(items) = keyword(parts, "items") {
                rest = Some(items);
            }
        } else {
            match keyword(parts, "items") {
                // Draft 7 tuples.
                Some(Value::Array(p)) => {
                    prefix = p.iter().collect();
                    rest = Some(keyword(parts, "additionalItems").unwrap_or(&ANY_SCHEMA));
                }
                Some(items) => rest = Some(items),
                None => {}
            }
        }
        if rest == Some(&Value::Bool(false)) {
            rest = None;
        }
        let (min, mut max) = u64_range(parts, "minItems", "maxItems");
        if rest.is_none() {
            let n = prefix.len() as u64;
            max = Some(max.map_or(n, |m| m.min(n)));
        }
        ArrayView {
            prefix,
            rest,
            len: (min, max),
        }
    }

    /// The schema of the item at position `i`, `None` when there can be none.
    pub(super) fn item(&self, i: usize) -> Option<&'a Value> {
        self.prefix.get(i).copied().or(self.rest)
    }
}

impl<'a> Checker<'a> {
    /// Reports a length or an item (positional or not) the reader does not accept; a type
    /// change of the items is reported as an items change of the array.
    pub(super) fn compare_arrays(
        &mut self,
        rp: &[&'a Map<String, Value>],
        wp: &[&'a Map<String, Value>],
        path: &str,
    ) {
        let (r, w) = (ArrayView::of(rp), ArrayView::of(wp));
        let rl = (Some(r.len.0), r.len.1);
        let wl = (Some(w.len.0), w.len.1);
        if !contains(rl, wl) {
            self.report(
                path,
                Rule::ItemsChanged,
                format!(
                    "length: data written with {} may hold {} items, {} reads {}",
                    self.dir.writer(),
                    show_range(&wl),
                    self.dir.reader(),
                    show_range(&rl)
                ),
            );
        }
        let start = self.findings.len();
        let positions = w.prefix.len().max(r.prefix.len());
        let writer_may_hold = |n: usize| w.len.1.is_none_or(|max| (n as u64) < max);
        for i in 0..positions {
            if !writer_may_hold(i) {
                break;
            }
            let Some(wi) = w.item(i) else { break };
            if let Some(ri) = r.item(i) {
                let item_path = format!("{path}[{i}]");
                self.compare(ri, wi, &item_path);
            }
        }
        if let (Some(wr), Some(rr), true) = (w.rest, r.rest, writer_may_hold(positions)) {
            let item_path = format!("{path}[]");
            self.compare(rr, wr, &item_path);
        }
        // A type change of the items themselves is an items change of the array.
        for finding in &mut self.findings[start..] {
            let item_level = finding.path.strip_prefix(path).is_some_and(|rest| {
                rest.starts_with('[') && rest.ends_with(']') && !rest[1..].contains('[')
            });
            if item_level && finding.rule == Rule::TypeChanged {
                finding.rule = Rule::ItemsChanged;
                finding.message = format!("array items: {}", finding.message);
            }
        }
    }
}

//! Strings: owns `format`, `minLength`/`maxLength` and `pattern` of a string read as a string;
//! must not judge string literals (see `literal`) nor other types.

use serde_json::{Map, Value};

use super::branch::{format_of, keyword};
use super::checker::Checker;
use super::numeric::{contains, show_range, u64_range};
use super::Rule;

impl<'a> Checker<'a> {
    /// Reports a format the writer need not produce, and a length or pattern that excludes
    /// strings the writer may write.
    pub(super) fn compare_strings(
        &mut self,
        rp: &[&'a Map<String, Value>],
        wp: &[&'a Map<String, Value>],
        path: &str,
    ) {
        let (rf, wf) = (format_of(rp), format_of(wp));
        if let Some(rf) = rf {
            if wf != Some(rf) {
                self.report(
                    path,
                    Rule::TypeChanged,
                    format!(
                        "data written with {} holds {}, {} reads string ({rf}): strings that are \
                         not a valid {rf} fail to deserialize",
                        self.dir.writer(),
                        wf.map_or("string".to_owned(), |f| format!("string ({f})")),
                        self.dir.reader()
                    ),
                );
            }
        }
        let (rmin, rmax) = u64_range(rp, "minLength", "maxLength");
        let (wmin, wmax) = u64_range(wp, "minLength", "maxLength");
        let r = (Some(rmin), rmax);
        let w = (Some(wmin), wmax);
        if !contains(r, w) {
            self.report(
                path,
                Rule::ConstraintNarrowed,
                format!(
                    "data written with {} may hold strings of length {}, {} accepts only {}",
                    self.dir.writer(),
                    show_range(&w),
                    self.dir.reader(),
                    show_range(&r)
                ),
            );
        }
        let rpat = keyword(rp, "pattern").and_then(Value::as_str);
        let wpat = keyword(wp, "pattern").and_then(Value::as_str);
        if let Some(rpat) = rpat {
            if wpat != Some(rpat) {
                self.report(
                    path,
                    Rule::ConstraintNarrowed,
                    format!(
                        "{} requires the pattern `{rpat}`, which data written with {} need not \
                         match",
                        self.dir.reader(),
                        self.dir.writer()
                    ),
                );
            }
        }
    }
}

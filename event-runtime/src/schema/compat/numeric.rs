//! Integers and numbers: owns integer formats and bounds, number precision and ranges, and the
//! range helpers shared with lengths; must not judge a type that is not numeric.

use std::fmt;

use serde_json::{Map, Value};

use super::branch::{format_of, Kind};
use super::checker::Checker;
use super::Rule;

/// Inclusive integer bounds (`None` = unbounded).
type IntRange = (Option<i128>, Option<i128>);

fn integer_format_bounds(format: Option<&str>) -> IntRange {
    fn signed(bits: u32) -> IntRange {
        (
            Some(-(1i128 << (bits - 1))),
            Some((1i128 << (bits - 1)) - 1),
        )
    }
    fn unsigned(bits: u32) -> IntRange {
        (Some(0), Some((1i128 << bits) - 1))
    }
    match format {
        Some("int8") => signed(8),
        Some("int16") => signed(16),
        Some("int32") => signed(32),
        Some("int64") | Some("int") => signed(64),
        Some("int128") => (Some(i128::MIN), Some(i128::MAX)),
        Some("uint8") => unsigned(8),
        Some("uint16") => unsigned(16),
        Some("uint32") => unsigned(32),
        Some("uint64") | Some("uint") => unsigned(64),
        Some("uint128") => (Some(0), Some(i128::MAX)),
        _ => (None, None),
    }
}

pub(super) fn integer_range(parts: &[&Map<String, Value>]) -> IntRange {
    let (mut lo, mut hi) = integer_format_bounds(format_of(parts));
    let raise = |lo: &mut Option<i128>, v: i128| *lo = Some(lo.map_or(v, |l| l.max(v)));
    let lower = |hi: &mut Option<i128>, v: i128| *hi = Some(hi.map_or(v, |h| h.min(v)));
    for part in parts {
        if let Some(v) = part.get("minimum").and_then(Value::as_f64) {
            raise(&mut lo, v.ceil() as i128);
        }
        if let Some(v) = part.get("exclusiveMinimum").and_then(Value::as_f64) {
            raise(&mut lo, (v.floor() as i128).saturating_add(1));
        }
        if let Some(v) = part.get("maximum").and_then(Value::as_f64) {
            lower(&mut hi, v.floor() as i128);
        }
        if let Some(v) = part.get("exclusiveMaximum").and_then(Value::as_f64) {
            lower(&mut hi, (v.ceil() as i128).saturating_sub(1));
        }
    }
    (lo, hi)
}

/// Number bounds (exclusive bounds are taken as inclusive: close enough to compare).
pub(super) fn number_range(parts: &[&Map<String, Value>]) -> (Option<f64>, Option<f64>) {
    let mut lo: Option<f64> = None;
    let mut hi: Option<f64> = None;
    for part in parts {
        for key in ["minimum", "exclusiveMinimum"] {
            if let Some(v) = part.get(key).and_then(Value::as_f64) {
                lo = Some(lo.map_or(v, |l| l.max(v)));
            }
        }
        for key in ["maximum", "exclusiveMaximum"] {
            if let Some(v) = part.get(key).and_then(Value::as_f64) {
                hi = Some(hi.map_or(v, |h| h.min(v)));
            }
        }
    }
    (lo, hi)
}

pub(super) fn u64_range(
    parts: &[&Map<String, Value>],
    min_key: &str,
    max_key: &str,
) -> (u64, Option<u64>) {
    let lo = parts
        .iter()
        .filter_map(|p| p.get(min_key).and_then(Value::as_u64))
        .max()
        .unwrap_or(0);
    let hi = parts
        .iter()
        .filter_map(|p| p.get(max_key).and_then(Value::as_u64))
        .min();
    (lo, hi)
}

/// Whether the reader's range `r` holds the writer's range `w`.
pub(super) fn contains<T: PartialOrd + Copy>(
    r: (Option<T>, Option<T>),
    w: (Option<T>, Option<T>),
) -> bool {
    let lo_ok = match (r.0, w.0) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(rl), Some(wl)) => rl <= wl,
    };
    let hi_ok = match (r.1, w.1) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(rh), Some(wh)) => rh >= wh,
    };
    lo_ok && hi_ok
}

pub(super) fn show_range<T: fmt::Display>(r: &(Option<T>, Option<T>)) -> String {
    match r {
        (None, None) => "any value".to_owned(),
        (Some(lo), None) => format!("{lo}.."),
        (None, Some(hi)) => format!("..={hi}"),
        (Some(lo), Some(hi)) => format!("{lo}..={hi}"),
    }
}

impl<'a> Checker<'a> {
    /// Compares integer and number branches: formats (`uint32`, `float`, …) and bounds.
    pub(super) fn compare_numbers(
        &mut self,
        (rk, rp): (Kind, &[&'a Map<String, Value>]),
        (wk, wp): (Kind, &[&'a Map<String, Value>]),
        path: &str,
    ) {
        match (rk, wk) {
            (Kind::Integer, Kind::Integer) => {
                let (r, w) = (integer_range(rp), integer_range(wp));
                if !contains(r, w) {
                    self.narrowed(path, (rk, rp), (wk, wp), &show_range(&w), &show_range(&r));
                }
            }
            (Kind::Number, Kind::Integer) => {
                let r = number_range(rp);
                let (lo, hi) = integer_range(wp);
                let w = (lo.map(|v| v as f64), hi.map(|v| v as f64));
                if !contains(r, w) {
                    self.narrowed(path, (rk, rp), (wk, wp), &show_range(&w), &show_range(&r));
                }
            }
            (Kind::Number, Kind::Number) => {
                let precision = |f: Option<&str>| if f == Some("float") { 1 } else { 2 };
                let (rf, wf) = (format_of(rp), format_of(wp));
                if precision(rf) < precision(wf) {
                    self.report(
                        path,
                        Rule::TypeChanged,
                        format!(
                            "data written with {} holds number ({}), {} reads number (float): \
                             a narrowing that loses range and precision",
                            self.dir.writer(),
                            wf.unwrap_or("double"),
                            self.dir.reader()
                        ),
                    );
                }
                let (r, w) = (number_range(rp), number_range(wp));
                if !contains(r, w) {
                    self.narrowed(path, (rk, rp), (wk, wp), &show_range(&w), &show_range(&r));
                }
            }
            // `compare_typed` sends no other pair here.
            _ => {}
        }
    }

    /// Reports a numeric range the reader narrowed: a type change when the formats differ
    /// (`uint64` → `uint32`), a narrowed constraint when they do not.
    fn narrowed(
        &mut self,
        path: &str,
        (rk, rp): (Kind, &[&'a Map<String, Value>]),
        (wk, wp): (Kind, &[&'a Map<String, Value>]),
        writer_range: &str,
        reader_range: &str,
    ) {
        let (rf, wf) = (format_of(rp), format_of(wp));
        let show = |k: Kind, f: Option<&str>| match f {
            Some(f) => format!("{} ({f})", k.name()),
            None => k.name().to_owned(),
        };
        if rf != wf {
            self.report(
                path,
                Rule::TypeChanged,
                format!(
                    "data written with {} holds {} ({writer_range}), {} reads {} ({reader_range}): \
                     values outside it fail to deserialize",
                    self.dir.writer(),
                    show(wk, wf),
                    self.dir.reader(),
                    show(rk, rf)
                ),
            );
        } else {
            self.report(
                path,
                Rule::ConstraintNarrowed,
                format!(
                    "data written with {} may hold {writer_range}, {} accepts only {reader_range}",
                    self.dir.writer(),
                    self.dir.reader()
                ),
            );
        }
    }
}

//! How the `events` tool prints: tables (comfy-table), times, id lists, JSON, and error chains
//! with each cause once. Formats what it is given: must not query the store or decide.

use std::fmt::Write as _;
use std::io::{self, Write};

use chrono::{DateTime, SecondsFormat, Utc};
use comfy_table::{presets, CellAlignment, ColumnConstraint, ContentArrangement, Width};

use super::{CliError, Io};

/// A table of the tool's output, laid out by comfy-table, which measures cells by their
/// display width (a CJK character takes two columns, a combining accent none), so that wide
/// and non-ASCII values stay aligned.
///
/// Not on a terminal (a pipe, a file, a log) it is plain text: no borders, no colours, columns
/// two spaces apart, no trailing spaces, one line per row (cells are never wrapped, so that
/// `grep` and `awk` see whole rows). On a terminal it has unicode borders and fits its width.
pub(super) struct Table {
    inner: comfy_table::Table,
    header: Vec<&'static str>,
    /// The columns that may wrap on a terminal.
    wrap: Vec<usize>,
    terminal: bool,
}

/// Narrower terminals than this get tables that are not fitted to their width.
const MIN_FIT_WIDTH: u16 = 60;

/// A free-text column fitted to a terminal keeps at least this width (the table runs past a
/// terminal too narrow for that rather than show one character per line).
const MIN_WRAPPED_WIDTH: u16 = 24;

impl Table {
    /// A table with `header`; the columns named in `right_aligned` (numbers) align right.
    pub(super) fn new(header: &[&'static str], right_aligned: &[&str], terminal: bool) -> Self {
        let mut inner = comfy_table::Table::new();
        if terminal {
            inner.load_preset(presets::UTF8_FULL_CONDENSED);
            // Wrap cells to fit the terminal, unless it reports no usable width (a pseudo
            // terminal of size 0 would get one character per line): then rows run long and
            // the terminal wraps them.
            if inner.width().is_some_and(|w| w >= MIN_FIT_WIDTH) {
                inner.set_content_arrangement(ContentArrangement::Dynamic);
            }
            // Ids, names, numbers and times are never broken (they are copied and pasted);
            // `wrap` names the free-text columns that may be.
        } else {
            inner
                .load_preset(presets::NOTHING)
                .set_content_arrangement(ContentArrangement::Disabled)
                .force_no_tty();
        }
        inner.set_header(header.to_vec());
        if terminal {
            // Ids, names, numbers and times are never broken (they are copied and pasted);
            // `wrap` names the free-text columns that may be.
            inner.set_constraints(vec![ColumnConstraint::ContentWidth; header.len()]);
        }
        let last = header.len().saturating_sub(1);
        for (i, h) in header.iter().enumerate() {
            let column = inner.column_mut(i).expect("a column per header cell");
            if right_aligned.contains(h) {
                column.set_cell_alignment(CellAlignment::Right);
            }
            if !terminal {
                // Two spaces between columns, none before the first.
                column.set_padding((0, if i == last { 0 } else { 2 }));
            }
        }
        Table {
            inner,
            header: header.to_vec(),
            wrap: Vec::new(),
            terminal,
        }
    }

    /// Lets the free-text columns `names` wrap to fit a terminal, down to a readable width.
    pub(super) fn wrap(mut self, names: &[&str]) -> Self {
        self.wrap = self
            .header
            .iter()
            .enumerate()
            .filter(|(_, h)| names.contains(h))
            .map(|(i, _)| i)
            .collect();
        self
    }

    pub(super) fn row(&mut self, row: Vec<String>) {
        self.inner.add_row(row);
    }

    pub(super) fn write(&mut self, out: &mut (dyn Write + Send)) -> io::Result<()> {
        if self.terminal {
            let widths = self.inner.column_max_content_widths();
            for &i in &self.wrap {
                let min = widths.get(i).copied().unwrap_or(0).min(MIN_WRAPPED_WIDTH);
                if let Some(column) = self.inner.column_mut(i) {
                    column.set_constraint(ColumnConstraint::LowerBoundary(Width::Fixed(min)));
                }
            }
        }
        let text = if self.terminal {
            self.inner.to_string()
        } else {
            self.inner.trim_fmt()
        };
        writeln!(out, "{text}")
    }
}

pub(super) fn print_json<T: serde::Serialize + ?Sized>(
    value: &T,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    serde_json::to_writer_pretty(&mut *io.out, value).map_err(io::Error::from)?;
    writeln!(io.out)?;
    Ok(())
}

pub(super) fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

pub(super) fn time_ms(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

pub(super) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `s` cut to `max` characters, `…` marking the cut.
pub(super) fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
    t.push('…');
    t
}

pub(super) fn join_ids(ids: &[i64], max: usize) -> String {
    if ids.is_empty() {
        return "-".to_owned();
    }
    let mut s = ids
        .iter()
        .take(max)
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if ids.len() > max {
        let _ = write!(s, ", … ({} in all)", ids.len());
    }
    s
}

/// `names` as `a, b, c`, or `none`.
pub(super) fn join_names<S: AsRef<str>>(names: &[S]) -> String {
    if names.is_empty() {
        return "none".to_owned();
    }
    names
        .iter()
        .map(AsRef::as_ref)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `1 thing` or `n things`.
pub(super) fn count(n: u64, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(t: &mut Table) -> String {
        let mut out = Vec::new();
        t.write(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn plain_tables_align() {
        let mut t = Table::new(&["ID", "NAME", "AT"], &["ID"], false);
        t.row(vec!["7".into(), "a".into(), "x".into()]);
        t.row(vec!["12".into(), "bbb".into(), "y".into()]);
        assert_eq!(render(&mut t), "ID  NAME  AT\n 7  a     x\n12  bbb   y\n");
    }

    #[test]
    fn wide_and_combining_characters_align_by_display_width() {
        let mut t = Table::new(&["NAME", "AT"], &[], false);
        t.row(vec!["東京".into(), "x".into()]); // two columns each
        t.row(vec!["e\u{301}t\u{e9}".into(), "y".into()]); // "été", one accent combining
        t.row(vec!["abcd".into(), "z".into()]);
        let text = render(&mut t);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "東京  x", "{text}");
        assert_eq!(lines[2], "e\u{301}t\u{e9}   y", "{text}");
        assert_eq!(lines[3], "abcd  z", "{text}");
    }
}

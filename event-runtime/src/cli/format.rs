//! How the `events` tool prints: tables (comfy-table), times, id lists, JSON, and error chains
//! with each cause once. Formats what it is given: must not query the store or decide.

use std::fmt::Write as _;
use std::io::{self, Write};

use chrono::{DateTime, SecondsFormat, Utc};
use comfy_table::{presets, CellAlignment, ColumnConstraint, ContentArrangement, Width};

use super::{CliError, Io};
use crate::store::AuditEntry;

/// A table of the tool's output, laid out by comfy-table, which measures cells by their
/// display width (a CJK character takes two columns, a combining accent none), so that wide
/// and non-ASCII values stay aligned.
///
/// Not on a terminal (a pipe, a file, a log) it is plain text: no borders, no colours, columns
/// two spaces apart, no trailing spaces, one line per row (cells are never wrapped, so that
/// `grep` and `awk` see whole rows). On a terminal it has unicode borders and fits its width
/// ([`terminal_width`]): the free-text columns wrap first ([`wrap`](Self::wrap)), then the
/// name columns ([`wrap_names`](Self::wrap_names)), and when even that is too wide the columns
/// the command lets go ([`drop_to_fit`](Self::drop_to_fit)) are left out, with a line saying
/// which and where to find them.
pub(super) struct Table {
    header: Vec<&'static str>,
    right_aligned: Vec<&'static str>,
    rows: Vec<Vec<String>>,
    /// The free-text columns that may wrap on a terminal, down to [`MIN_WRAPPED_WIDTH`].
    wrap: Vec<&'static str>,
    /// The name columns that may wrap on a terminal, down to [`MIN_NAME_WIDTH`].
    names: Vec<&'static str>,
    /// The columns left out, in this order, while the table is wider than the terminal, and
    /// where the reader finds them then.
    droppable: (Vec<&'static str>, &'static str),
    /// The terminal's width; `None`: plain text.
    terminal: Option<u16>,
}

/// Narrower terminals than this get tables that are not fitted to their width.
const MIN_FIT_WIDTH: u16 = 60;

/// A free-text column fitted to a terminal keeps at least this width (the table runs past a
/// terminal too narrow for that rather than show one character per line).
const MIN_WRAPPED_WIDTH: u16 = 24;

/// A name column (event, handler) fitted to a terminal keeps at least this width.
const MIN_NAME_WIDTH: u16 = 12;

/// The width tables are fitted to when a terminal does not say (and `COLUMNS` is unset).
const DEFAULT_WIDTH: u16 = 120;

/// The width to fit tables to on a terminal: `COLUMNS` when set to a number (as shells export
/// it, and as a user sets it to ask for another width), else the size the terminal reports,
/// else 120.
pub(super) fn terminal_width() -> u16 {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<u16>().ok())
        .filter(|&w| w > 0)
        .or_else(|| comfy_table::Table::new().width())
        .filter(|&w| w > 0)
        .unwrap_or(DEFAULT_WIDTH)
}

impl Table {
    /// A table with `header`; the columns named in `right_aligned` (numbers) align right.
    /// `terminal` is the width of the terminal it is fitted to, `None` for plain text.
    pub(super) fn new(
        header: &[&'static str],
        right_aligned: &[&'static str],
        terminal: Option<u16>,
    ) -> Self {
        Table {
            header: header.to_vec(),
            right_aligned: right_aligned.to_vec(),
            rows: Vec::new(),
            wrap: Vec::new(),
            names: Vec::new(),
            droppable: (Vec::new(), ""),
            terminal,
        }
    }

    /// Lets the free-text columns `names` wrap to fit a terminal, down to a readable width.
    pub(super) fn wrap(mut self, names: &[&'static str]) -> Self {
        self.wrap = names.to_vec();
        self
    }

    /// Lets the name columns `names` wrap to fit a terminal when wrapping the free-text ones
    /// is not enough (a name broken over lines is harder to copy: the last resort but one).
    pub(super) fn wrap_names(mut self, names: &[&'static str]) -> Self {
        self.names = names.to_vec();
        self
    }

    /// Leaves out the columns `names`, in this order, while the table is still wider than the
    /// terminal; `where_shown` tells the reader where to find them (`dlq show ID`).
    pub(super) fn drop_to_fit(mut self, names: &[&'static str], where_shown: &'static str) -> Self {
        self.droppable = (names.to_vec(), where_shown);
        self
    }

    pub(super) fn row(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    pub(super) fn write(&mut self, out: &mut (dyn Write + Send)) -> io::Result<()> {
        let Some(width) = self.terminal else {
            let mut table = self.build(&self.all_columns());
            table
                .load_preset(presets::NOTHING)
                .set_content_arrangement(ContentArrangement::Disabled)
                .force_no_tty();
            let last = self.header.len().saturating_sub(1);
            for i in 0..self.header.len() {
                if let Some(column) = table.column_mut(i) {
                    // Two spaces between columns, none before the first.
                    column.set_padding((0, if i == last { 0 } else { 2 }));
                }
            }
            return writeln!(out, "{}", table.trim_fmt());
        };
        let mut kept = self.all_columns();
        let mut dropped = Vec::new();
        // Ids, numbers and times are never broken (they are copied and pasted); free text
        // wraps first, names next; then the columns the command lets go are left out.
        let fitted = width >= MIN_FIT_WIDTH;
        if fitted {
            for name in self.droppable.0.clone() {
                if self.min_width(&kept) <= width {
                    break;
                }
                if let Some(pos) = kept.iter().position(|&i| self.header[i] == name) {
                    kept.remove(pos);
                    dropped.push(name);
                }
            }
        }
        let mut table = self.build(&kept);
        table.load_preset(presets::UTF8_FULL_CONDENSED);
        if fitted {
            table
                .set_width(width)
                .set_content_arrangement(ContentArrangement::Dynamic);
        }
        let widths = table.column_max_content_widths();
        for (k, &i) in kept.iter().enumerate() {
            let constraint = match self.floor(i) {
                Some(min) => ColumnConstraint::LowerBoundary(Width::Fixed(
                    widths.get(k).copied().unwrap_or(0).min(min),
                )),
                None => ColumnConstraint::ContentWidth,
            };
            if let Some(column) = table.column_mut(k) {
                column.set_constraint(constraint);
            }
        }
        writeln!(out, "{table}")?;
        if !dropped.is_empty() {
            writeln!(
                out,
                "({} not shown to fit {width} columns: {})",
                dropped.join(", "),
                self.droppable.1
            )?;
        }
        Ok(())
    }

    fn all_columns(&self) -> Vec<usize> {
        (0..self.header.len()).collect()
    }

    /// The narrowest a column may become on a terminal: `None` for one that never wraps.
    fn floor(&self, column: usize) -> Option<u16> {
        let name = self.header[column];
        if self.wrap.contains(&name) {
            Some(MIN_WRAPPED_WIDTH)
        } else if self.names.contains(&name) {
            Some(MIN_NAME_WIDTH)
        } else {
            None
        }
    }

    /// The narrowest the table of `columns` can be drawn with borders: each column at its
    /// floor (or its content), one space of padding each side, a border between and around.
    fn min_width(&self, columns: &[usize]) -> u16 {
        let widths = self.build(columns).column_max_content_widths();
        let content: u32 = columns
            .iter()
            .zip(&widths)
            .map(|(&i, &w)| u32::from(self.floor(i).map_or(w, |min| w.min(min))))
            .sum();
        let n = columns.len() as u32;
        u16::try_from(content + 3 * n + 1).unwrap_or(u16::MAX)
    }

    /// The comfy table of `columns`, with the header, rows and alignment.
    fn build(&self, columns: &[usize]) -> comfy_table::Table {
        let mut table = comfy_table::Table::new();
        table.set_header(columns.iter().map(|&i| self.header[i]).collect::<Vec<_>>());
        for row in &self.rows {
            table.add_row(
                columns
                    .iter()
                    .map(|&i| row.get(i).map_or("", String::as_str))
                    .collect::<Vec<_>>(),
            );
        }
        for (k, &i) in columns.iter().enumerate() {
            if self.right_aligned.contains(&self.header[i]) {
                if let Some(column) = table.column_mut(k) {
                    column.set_cell_alignment(CellAlignment::Right);
                }
            }
        }
        table
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

/// The empty table of deliveries per destination (`events stats`, `events handler list`):
/// HANDLER, PENDING, COMPLETED, DEAD, then the counts in `more`, UNKNOWN and UNREADABLE only
/// when some row has them, and PAUSED; every count right-aligned.
pub(super) fn destination_table(
    more: &[&'static str],
    unknown: bool,
    unreadable: bool,
    terminal: Option<u16>,
) -> Table {
    let mut counts = vec!["PENDING", "COMPLETED", "DEAD"];
    counts.extend_from_slice(more);
    if unknown {
        counts.push("UNKNOWN");
    }
    if unreadable {
        counts.push("UNREADABLE");
    }
    let mut header = vec!["HANDLER"];
    header.extend_from_slice(&counts);
    header.push("PAUSED");
    Table::new(&header, &counts, terminal)
}

/// The line that ends every audited command: `audit #ID: ACTION by ACTOR at TIME: REASON`.
pub(super) fn audit_line(entry: &AuditEntry, io: &mut Io<'_>) -> Result<(), CliError> {
    writeln!(
        io.out,
        "audit #{}: {} by {} at {}: {}",
        entry.id,
        entry.action,
        entry.actor,
        time(entry.at),
        entry.reason
    )?;
    Ok(())
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
        let mut t = Table::new(&["ID", "NAME", "AT"], &["ID"], None);
        t.row(vec!["7".into(), "a".into(), "x".into()]);
        t.row(vec!["12".into(), "bbb".into(), "y".into()]);
        assert_eq!(render(&mut t), "ID  NAME  AT\n 7  a     x\n12  bbb   y\n");
    }

    #[test]
    fn wide_and_combining_characters_align_by_display_width() {
        let mut t = Table::new(&["NAME", "AT"], &[], None);
        t.row(vec!["東京".into(), "x".into()]); // two columns each
        t.row(vec!["e\u{301}t\u{e9}".into(), "y".into()]); // "été", one accent combining
        t.row(vec!["abcd".into(), "z".into()]);
        let text = render(&mut t);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "東京  x", "{text}");
        assert_eq!(lines[2], "e\u{301}t\u{e9}   y", "{text}");
        assert_eq!(lines[3], "abcd  z", "{text}");
    }

    /// `dlq list --all` as it was drawn 182 columns wide in a 120-column terminal.
    fn dead_letters(width: u16) -> String {
        let mut t = super::super::dlq::dead_letter_table(true, Some(width));
        for (id, status, handler) in [
            ("1", "replayed", "billing::handlers::on_order_placed"),
            ("12", "open", "nats-inbox:orders"),
        ] {
            t.row(vec![
                id.into(),
                status.into(),
                "order.placed v3".into(),
                "01938f4c-7b1e-7c3a-9d2e-4f5a6b7c8d9e".into(),
                handler.into(),
                "5".into(),
                "0".into(),
                "conflict".into(),
                "conflicts with a stored event: order@shop CA-2019-115238 already has sequence 3 under another event id".into(),
                "2026-12-02T01:53:47Z".into(),
            ]);
        }
        render(&mut t)
    }

    #[test]
    fn terminal_tables_fit_the_width() {
        for width in [120, 140, 160] {
            let text = dead_letters(width);
            for line in text.lines() {
                assert!(
                    line.chars().count() <= usize::from(width),
                    "{} columns in a {width}-column terminal:\n{text}",
                    line.chars().count()
                );
            }
            // Ids and times are never broken.
            assert!(text.contains("2026-12-02T01:53:47Z"), "{text}");
        }
        let narrow = dead_letters(120);
        assert!(
            narrow.contains("(EVENT ID")
                && narrow.contains(
                    "not shown to fit 120 columns: `dlq show ID` or `--json` shows every field"
                ),
            "{narrow}"
        );
        let wide = dead_letters(250);
        assert!(
            wide.contains("01938f4c-7b1e-7c3a-9d2e-4f5a6b7c8d9e"),
            "{wide}"
        );
        assert!(!wide.contains("not shown"), "{wide}");
    }
}

//! Renders a [`Report`] as text tables for a person to read. Formatting only: the numbers
//! come from the projections the handlers wrote, and the exact totals from the summary line.

use std::fmt::Write as _;

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{Cell, CellAlignment, ContentArrangement, Table};
use event_core::DeliveryMode;
use rust_decimal::{Decimal, RoundingStrategy};

use super::read_model::LeadTimes;
use super::Report;

/// The report tables, each under a title, separated by blank lines. Does not include the
/// summary line.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let s = &report.summary;
    let r = &report.run;
    if s.rows_already_imported > 0 {
        let fresh = match report.database.strip_prefix("sqlite://") {
            Some(path) if !path.contains(":memory:") => format!(
                "pass --database sqlite://other.db, or delete {path} (with its -wal and -shm files)"
            ),
            _ => "pass another --database (or --schema)".to_owned(),
        };
        let _ = writeln!(
            out,
            "Note: the database {} already held {} of the {} rows (imported by an earlier \
             run), so they were skipped{}; the totals below are the database's. To start \
             fresh, {fresh}.\n",
            report.database,
            count(s.rows_already_imported),
            count(s.rows),
            if s.rows_already_imported == s.rows {
                " and nothing was imported again"
            } else {
                " and the rest imported now"
            },
        );
    }
    section(&mut out, "Input", {
        let mut t = table(&["", ""], &[1]);
        t.add_row(vec!["file".to_owned(), report.input.display().to_string()]);
        t.add_row(vec!["database".to_owned(), report.database.clone()]);
        t.add_row(vec!["rows".to_owned(), count(s.rows)]);
        t.add_row(vec![
            "rows imported by this run".to_owned(),
            count(r.rows_imported),
        ]);
        t.add_row(vec![
            "rows already in the database".to_owned(),
            count(s.rows_already_imported),
        ]);
        t.add_row(vec!["orders placed".to_owned(), count(s.orders_placed)]);
        t.add_row(vec!["lines added".to_owned(), count(s.lines_added)]);
        t.add_row(vec!["rows rejected".to_owned(), count(s.rejected)]);
        t.add_row(vec!["orders shipped".to_owned(), count(s.orders_shipped)]);
        t.add_row(vec!["customers".to_owned(), count(s.customers)]);
        t
    });

    section(&mut out, "Revenue by region (in transaction, exact)", {
        let mut t = table(
            &[
                "Region", "Lines", "Units", "Sales", "Profit", "Margin", "Share",
            ],
            &[1, 2, 3, 4, 5, 6],
        );
        for (name, r) in &report.regions {
            t.add_row(vec![
                name.clone(),
                count(r.lines),
                count(r.quantity),
                money(r.sales),
                money(r.profit),
                percent(r.profit, r.sales),
                percent(r.sales, s.sales_total),
            ]);
        }
        t.add_row(vec![
            "Total".to_owned(),
            count(s.lines_added),
            count(report.regions.values().map(|r| r.quantity).sum()),
            money(s.sales_total),
            money(s.profit_total),
            percent(s.profit_total, s.sales_total),
            percent(s.sales_total, s.sales_total),
        ]);
        t
    });

    section(
        &mut out,
        "Revenue by currency (order.placed v2; v1 envelopes upcast)",
        {
            let mut t = table(
                &["Currency", "Orders", "Lines", "Sales", "Share"],
                &[1, 2, 3, 4],
            );
            let total: Decimal = report.currencies.values().map(|c| c.sales).sum();
            for (currency, c) in &report.currencies {
                t.add_row(vec![
                    currency.clone(),
                    count(c.orders),
                    count(c.lines),
                    money(c.sales),
                    percent(c.sales, total),
                ]);
            }
            t.add_row(vec![
                "Total".to_owned(),
                count(report.currencies.values().map(|c| c.orders).sum()),
                count(report.currencies.values().map(|c| c.lines).sum()),
                money(total),
                percent(total, total),
            ]);
            t
        },
    );
    let currency_total: Decimal = report.currencies.values().map(|c| c.sales).sum();
    if currency_total != s.sales_total {
        let _ = writeln!(
            out,
            "Note: revenue by currency adds up to {}, not the {} of all lines: it counts the \
             deliveries to orders.order_summary made since this \
             version of the example (a database imported by an earlier one has none), and \
             none still pending or dead-lettered.\n",
            money(currency_total),
            money(s.sales_total),
        );
    }

    section(&mut out, "Customers by segment", {
        let mut t = table(
            &["Segment", "Customers", "Orders", "Sales", "Sales per order"],
            &[1, 2, 3, 4],
        );
        for (name, seg) in &report.segments {
            let per_order = if seg.orders == 0 {
                Decimal::ZERO
            } else {
                seg.sales / Decimal::from(seg.orders)
            };
            t.add_row(vec![
                name.clone(),
                count(seg.customers),
                count(seg.orders),
                money(seg.sales),
                money(per_order),
            ]);
        }
        t
    });

    section(
        &mut out,
        &format!("Top {} customers by sales", report.top_customers.len()),
        {
            let mut t = table(
                &["#", "Customer", "Segment", "Orders", "Lines", "Sales"],
                &[0, 3, 4, 5],
            );
            for (i, (id, c)) in report.top_customers.iter().enumerate() {
                t.add_row(vec![
                    (i + 1).to_string(),
                    id.clone(),
                    c.segment.clone(),
                    count(c.orders),
                    count(c.lines),
                    money(c.sales),
                ]);
            }
            t
        },
    );

    section(
        &mut out,
        "Shipping lead time in days (ship date - order date)",
        {
            let max_day = report
                .lead_times
                .values()
                .map(|l| l.max_days)
                .max()
                .unwrap_or(0)
                .max(0);
            let mut headers = vec![
                "Ship mode".to_owned(),
                "Orders".to_owned(),
                "Min".to_owned(),
                "Mean".to_owned(),
                "Max".to_owned(),
            ];
            headers.extend((0..=max_day).map(|d| format!("{d}d")));
            let header_refs: Vec<&str> = headers.iter().map(String::as_str).collect();
            let right: Vec<usize> = (1..headers.len()).collect();
            let mut t = table(&header_refs, &right);
            let mut all = LeadTimes::default();
            let mut rows: Vec<_> = report.lead_times.iter().collect();
            rows.sort_by_key(|(_, l)| (l.mean_days(), l.orders));
            for (mode, l) in rows {
                all.merge(l);
                t.add_row(lead_time_row(mode, l, max_day));
            }
            t.add_row(lead_time_row("All", &all, max_day));
            t
        },
    );

    section(
        &mut out,
        "Handlers and relays (priority order; runs whose effects committed, events published)",
        {
            let mut t = table(
                &[
                    "Handler",
                    "Event",
                    "Mode",
                    "Priority",
                    "Ran",
                    "Retries",
                    "Dead letters",
                    "Pending",
                ],
                &[3, 4, 5, 6, 7],
            );
            for h in &report.handlers {
                let in_tx = h.mode == DeliveryMode::InTransaction;
                t.add_row(vec![
                    h.name.to_owned(),
                    // An event union's handler takes each of its events: one per line.
                    h.events.join("\n"),
                    match (in_tx, h.ordered) {
                        (true, _) => "in transaction",
                        (false, true) => "after commit",
                        (false, false) => "after commit, unordered",
                    }
                    .to_owned(),
                    h.priority.to_string(),
                    count(h.ran),
                    dash(in_tx, h.retries),
                    dash(in_tx, h.dead),
                    dash(in_tx, h.pending),
                ]);
            }
            // A transport's relay is a destination too: its deliveries are the events it
            // publishes ("Ran": published).
            for r in &report.relays {
                t.add_row(vec![
                    r.name.clone(),
                    "every event it routes".to_owned(),
                    "relay, after commit".to_owned(),
                    "-".to_owned(),
                    count(r.published),
                    count(r.retries),
                    count(r.dead),
                    count(r.pending),
                ]);
            }
            t
        },
    );

    section(
        &mut out,
        "Delivery (transactional outbox, at least once)",
        {
            let mut t = table(&["", ""], &[1]);
            for (name, n) in &report.events_by_name {
                t.add_row(vec![format!("{name} events"), count(*n)]);
            }
            t.add_row(vec![
                "events dispatched (in the outbox, each once)".to_owned(),
                count(s.events_dispatched),
            ]);
            t.add_row(vec![
                "handler runs (in-transaction runs + deliveries completed)".to_owned(),
                count(s.handler_runs),
            ]);
            t.add_row(vec![
                "retries (attempts beyond the first)".to_owned(),
                count(s.retries),
            ]);
            t.add_row(vec![
                "dead letters (open)".to_owned(),
                count(s.dead_lettered),
            ]);
            t.add_row(vec![
                "confirmations sent".to_owned(),
                count(s.notifications_sent),
            ]);
            t.add_row(vec![
                "lines exported to the ERP".to_owned(),
                count(s.erp_exported),
            ]);
            t.add_row(vec![
                "this run: events committed".to_owned(),
                count(r.events_committed),
            ]);
            t.add_row(vec![
                "this run: envelopes appended again (same event id)".to_owned(),
                count(s.redelivered),
            ]);
            t.add_row(vec![
                "this run: duplicates skipped by the outbox".to_owned(),
                count(s.duplicates_skipped),
            ]);
            t.add_row(vec![
                "this run: deliveries completed".to_owned(),
                count(r.delivery.completed as u64),
            ]);
            t.add_row(vec![
                "this run: deliveries failed and scheduled again".to_owned(),
                count(r.delivery.retried as u64),
            ]);
            t.add_row(vec![
                "this run: deliveries dead-lettered".to_owned(),
                count(r.delivery.dead_lettered as u64),
            ]);
            t.add_row(vec![
                "this run: transient failures injected (--flaky-rate)".to_owned(),
                count(r.flaky_failures),
            ]);
            t.add_row(vec!["elapsed".to_owned(), format!("{} ms", s.elapsed_ms)]);
            t
        },
    );

    if let Some(c) = &report.sample_confirmation {
        let _ = writeln!(out, "First confirmation sent:\n  {c}\n");
    }

    if !report.dead_letters.is_empty() {
        section(
            &mut out,
            "Dead letters (see `orders events dlq list`; replay with `orders events dlq replay`)",
            {
                let mut t = table(&["Handler", "Reason", "Deliveries"], &[2]);
                for ((handler, reason), n) in &report.dead_letters {
                    t.add_row(vec![handler.clone(), reason.clone(), count(*n)]);
                }
                t
            },
        );
    }

    if !report.rejections.is_empty() {
        section(&mut out, "Rejected rows (domain errors)", {
            let mut t = table(&["Row", "Line", "Reason"], &[0, 1]);
            for r in &report.rejections {
                t.add_row(vec![
                    r.row_id.to_string(),
                    r.line.to_string(),
                    r.reason.clone(),
                ]);
            }
            t
        });
    }
    out
}

/// `-` where a column does not apply (in-transaction handlers have no deliveries).
fn dash(not_applicable: bool, n: u64) -> String {
    if not_applicable {
        "-".to_owned()
    } else {
        count(n)
    }
}

fn lead_time_row(mode: &str, l: &LeadTimes, max_day: i64) -> Vec<String> {
    let mut row = vec![
        mode.to_owned(),
        count(l.orders),
        l.min_days.to_string(),
        l.mean_days().to_string(),
        l.max_days.to_string(),
    ];
    row.extend((0..=max_day).map(|d| match l.by_days.get(&d) {
        Some(n) => count(*n),
        None => String::new(),
    }));
    row
}

fn section(out: &mut String, title: &str, table: Table) {
    let _ = writeln!(out, "{title}\n{table}\n");
}

fn table(headers: &[&str], right_aligned: &[usize]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled);
    if headers.iter().any(|h| !h.is_empty()) {
        t.set_header(headers.iter().map(Cell::new).collect::<Vec<_>>());
    }
    for &i in right_aligned {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    t
}

/// `1234567` as `1,234,567`.
fn count(n: u64) -> String {
    group(&n.to_string())
}

/// A money amount rounded to cents, with thousands separators: `-1,234.50`.
fn money(d: Decimal) -> String {
    let s = format!(
        "{:.2}",
        d.round_dp_with_strategy(2, RoundingStrategy::MidpointAwayFromZero)
    );
    let (sign, digits) = match s.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", s.as_str()),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, "00"));
    format!("{sign}{}.{frac}", group(int))
}

fn percent(part: Decimal, whole: Decimal) -> String {
    if whole.is_zero() {
        return "-".to_owned();
    }
    format!("{:.1}%", (part * Decimal::ONE_HUNDRED / whole).round_dp(1))
}

fn group(digits: &str) -> String {
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    #[test]
    fn formats_numbers() {
        assert_eq!(count(0), "0");
        assert_eq!(count(1234567), "1,234,567");
        assert_eq!(
            money(Decimal::from_str("2325733.8263").unwrap()),
            "2,325,733.83"
        );
        assert_eq!(money(Decimal::from_str("-5.487").unwrap()), "-5.49");
        assert_eq!(money(Decimal::from_str("12").unwrap()), "12.00");
        assert_eq!(
            percent(
                Decimal::from_str("1").unwrap(),
                Decimal::from_str("3").unwrap()
            ),
            "33.3%"
        );
    }
}

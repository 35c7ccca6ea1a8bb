//! `outbox stats` and `dlq audit`: the backlog, per-handler counts, pauses and the audit log as
//! the store reports them. Prints what it is given: must not query or change the store.

use crate::store::{AuditEntry, OutboxStats};

use super::format::{count, destination_table, join_ids, one_line, print_json, time, Table};
use super::{CliError, Io};

pub(super) fn print_audit(
    entries: &[AuditEntry],
    json: bool,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    if json {
        return print_json(&entries, io);
    }
    if entries.is_empty() {
        writeln!(io.out, "the audit log is empty")?;
        return Ok(());
    }
    let mut table = Table::new(
        &[
            "ID",
            "AT",
            "ACTION",
            "ACTOR",
            "COUNT",
            "DEAD LETTERS",
            "REASON",
        ],
        &["ID", "COUNT"],
        io.terminal,
    )
    .wrap(&["DEAD LETTERS", "REASON"]);
    for e in entries {
        table.row(vec![
            e.id.to_string(),
            time(e.at),
            e.action.clone(),
            e.actor.clone(),
            match (&e.selection, e.finished_at) {
                (None, _) | (_, Some(_)) => e.count.to_string(),
                // `dlq resume` finishes a replay or purge; every other operation over a
                // selection continues when its command runs again.
                (Some(_), None) if e.action == "replay" || e.action == "purge" => {
                    format!("{} (unfinished: dlq resume {})", e.count, e.id)
                }
                (Some(_), None) => format!("{} (unfinished: run the same command again)", e.count),
            },
            match &e.selection {
                Some(s) => format!("selection {s}"),
                None => join_ids(&e.dead_letter_ids, 10),
            },
            one_line(&e.reason),
        ]);
    }
    table.write(io.out)?;
    Ok(())
}

pub(super) fn print_stats(
    stats: &OutboxStats,
    json: bool,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    if json {
        return print_json(stats, io);
    }
    let oldest = stats
        .oldest_pending_age_secs
        .map_or_else(|| "-".to_owned(), |s| format!("{s:.1}"));
    let paused: Vec<&str> = stats
        .handlers
        .iter()
        .filter(|h| h.paused)
        .map(|h| h.handler.as_str())
        .collect();
    // Labels are ASCII constants: padding by characters aligns them.
    let mut lines = vec![
        ("events in outbox", stats.events.to_string()),
        ("pending deliveries", stats.pending.to_string()),
        ("  behind a dead letter", stats.blocked.to_string()),
        ("  unreadable by the engine", stats.unreadable.to_string()),
        ("oldest pending age (s)", oldest),
        ("open dead letters", stats.dead_letters.to_string()),
        (
            "deliveries in an unknown status",
            stats.unknown_status.to_string(),
        ),
    ];
    lines.push((
        "paused destinations",
        if paused.is_empty() {
            "0".to_owned()
        } else {
            format!("{}: {}", paused.len(), paused.join(", "))
        },
    ));
    for (label, value) in lines {
        writeln!(io.out, "{label:<33}{value}")?;
    }
    if !stats.handlers.is_empty() {
        writeln!(io.out)?;
        let unknown = stats.handlers.iter().any(|h| h.unknown > 0);
        let unreadable = stats.handlers.iter().any(|h| h.unreadable > 0);
        let mut table = destination_table(&["PURGED"], unknown, unreadable, io.terminal);
        for h in &stats.handlers {
            let mut row = vec![
                h.handler.clone(),
                h.pending.to_string(),
                h.completed.to_string(),
                h.dead.to_string(),
                h.purged.to_string(),
            ];
            if unknown {
                row.push(h.unknown.to_string());
            }
            if unreadable {
                row.push(h.unreadable.to_string());
            }
            row.push(if h.paused { "paused" } else { "-" }.to_owned());
            table.row(row);
        }
        table.write(io.out)?;
    }
    if stats.unknown_status > 0 {
        writeln!(
            io.out,
            "\nnote: {} in a status this version does not know (written by a newer release, or edited by hand): counted as unknown, not as pending, completed or dead",
            count(stats.unknown_status, "delivery is", "deliveries are")
        )?;
    }
    if stats.unreadable > 0 {
        writeln!(
            io.out,
            "{}note: the engine cannot read the row of {} (a column edited by hand or by another tool): not delivered until the row is repaired; `check` fails while there are any",
            if stats.unknown_status > 0 { "" } else { "\n" },
            count(stats.unreadable, "pending delivery", "pending deliveries")
        )?;
    }
    if !paused.is_empty() {
        writeln!(
            io.out,
            "{}note: no worker claims the deliveries of a paused destination; `handler list` shows who paused it and why",
            if stats.unknown_status + stats.unreadable > 0 { "" } else { "\n" }
        )?;
    }
    Ok(())
}

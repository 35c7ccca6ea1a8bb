//! `dlq list` and `dlq show`, and the check that a `--handler` / `--event` names something the
//! outbox knows. Reads only: must not replay, purge or change anything.

use std::fmt::Write as _;

use crate::store::{DeadLetter, DeadLetterFilter, Store};

use super::args::ListArgs;
use crate::privacy::Masking;

use super::format::{count, one_line, print_json, time, time_ms, truncate, Table};
use super::{App, CliError, Io};

/// The empty table of `dlq list` (with a STATUS column for `--all`), laid out for
/// `terminal` (its width; `None` off a terminal).
pub(super) fn dead_letter_table(all: bool, terminal: Option<u16>) -> Table {
    let mut header = vec!["ID"];
    if all {
        header.push("STATUS");
    }
    header.extend([
        "EVENT",
        "EVENT ID",
        "HANDLER",
        "ATTEMPTS",
        "HOLDS BACK",
        "REASON",
        "LAST ERROR",
        "DEAD AT",
    ]);
    Table::new(&header, &["ID", "ATTEMPTS", "HOLDS BACK"], terminal)
        .wrap(&["LAST ERROR"])
        .wrap_names(&["EVENT", "HANDLER"])
        .drop_to_fit(
            &["EVENT ID", "ATTEMPTS", "HOLDS BACK"],
            "`dlq show ID` or `--json` shows every field",
        )
}

pub(super) async fn list(
    store: &Store,
    app: &App<'_>,
    args: ListArgs,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    if let (Some(since), Some(until)) = (args.since, args.until) {
        if since >= until {
            return Err(CliError::Refused(format!(
                "--since ({}) is not before --until ({})",
                time(since),
                time(until)
            )));
        }
    }
    let filter = DeadLetterFilter {
        handler: args.handler.clone(),
        event_name: args.event.clone(),
        since: args.since,
        until: args.until,
        include_resolved: args.all,
        limit: args.limit,
        ..DeadLetterFilter::default()
    };
    let mut letters = store.dead_letters(&filter).await?;
    if letters.is_empty() {
        check_names(store, app, args.handler.as_deref(), args.event.as_deref()).await?;
    }
    if args.json {
        let masking = masking(store, app, args.payload).await?;
        let mut unknown = std::collections::BTreeSet::new();
        for d in &mut letters {
            let printed = masking.print(&d.envelope, args.payload);
            if args.payload && !printed.known {
                unknown.insert((d.event_name.clone(), d.event_version));
            }
            d.envelope = printed.text;
        }
        for (name, version) in unknown {
            not_in_catalog(io, &name, version)?;
        }
        return print_json(&letters, io);
    }
    let what = if args.all {
        "dead letters"
    } else {
        "open dead letters"
    };
    if letters.is_empty() {
        writeln!(io.out, "no {what}{}", selection(&args))?;
        return show_gaps(store, &args, io).await;
    }
    let mut table = dead_letter_table(args.all, io.terminal);
    for d in &letters {
        let mut row = vec![d.id.to_string()];
        if args.all {
            row.push(status(d).to_owned());
        }
        row.extend([
            format!("{} v{}", d.event_name, d.event_version),
            d.event_id.to_string(),
            d.handler.clone(),
            d.attempts.to_string(),
            d.held_back.to_string(),
            d.reason.to_string(),
            last_error(d),
            time(d.dead_at),
        ]);
        table.row(row);
    }
    table.write(io.out)?;
    // A full page may not be all of them: say how many there are rather than let the page
    // pass for the whole queue.
    if let Some(limit) = args.limit {
        if letters.len() as u64 == u64::from(limit) {
            let total = store.count_dead_letters(&filter).await?;
            if total > letters.len() as u64 {
                writeln!(
                    io.out,
                    "showing {} of {}{} (--limit {limit})",
                    letters.len(),
                    count(total, what.trim_end_matches('s'), what),
                    selection(&args)
                )?;
            }
        }
    }
    show_gaps(store, &args, io).await
}

/// The open gaps (kind `gap`) after the dead letters, unless the listing is narrowed to a
/// handler or an event: a held event waits on each, as on a dead letter.
async fn show_gaps(store: &Store, args: &ListArgs, io: &mut Io<'_>) -> Result<(), CliError> {
    if args.handler.is_some() || args.event.is_some() {
        return Ok(());
    }
    let gaps = store.gaps(false).await?;
    if gaps.is_empty() {
        return Ok(());
    }
    writeln!(
        io.out,
        "\n{}: received events wait behind them (`events inbox gaps accept`, or replay the dead letter named)",
        count(gaps.len() as u64, "open gap", "open gaps")
    )?;
    super::gaps::write_table(&gaps, false, io)
}

/// Characters of the error chain `dlq list` shows (`dlq show` shows it whole).
const LAST_ERROR_CHARS: usize = 100;

/// The error chain on one line for the LAST ERROR column, each cause once, without the dead
/// letter's own event id (the EVENT ID column has it; an inbox's conflict message opens with
/// it, which left no room for what conflicts with what), cut to [`LAST_ERROR_CHARS`].
fn last_error(d: &DeadLetter) -> String {
    let chain = d.error_chain.join(": ");
    let id = d.event_id.to_string();
    let chain = chain
        .replace(&format!("event {id} "), "")
        .replace(&format!("event {id}"), "the event")
        .replace(&id, "the event");
    truncate(&one_line(&chain), LAST_ERROR_CHARS)
}

/// ` of handler `h`, event `e`, in that time range`, or nothing.
fn selection(args: &ListArgs) -> String {
    let mut parts = Vec::new();
    if let Some(h) = &args.handler {
        parts.push(format!("handler `{h}`"));
    }
    if let Some(e) = &args.event {
        parts.push(format!("event `{e}`"));
    }
    let mut s = String::new();
    if !parts.is_empty() {
        let _ = write!(s, " of {}", parts.join(", "));
    }
    if args.since.is_some() || args.until.is_some() {
        s.push_str(" in that time range");
    }
    s
}

/// Fails when a selection that matched nothing names a handler or event that nothing knows:
/// no delivery (handlers), no dead letter open or resolved, no handler or event type of the
/// embedding application. A name that is known but has no dead letters passes.
pub(super) async fn check_names(
    store: &Store,
    app: &App<'_>,
    handler: Option<&str>,
    event: Option<&str>,
) -> Result<(), CliError> {
    if handler.is_none() && event.is_none() {
        return Ok(());
    }
    let counts = store.dead_letter_counts().await?;
    let registry = app.registry();
    let open_names = |name: fn(&crate::store::DeadLetterCount) -> &str| {
        let mut names: Vec<String> = counts
            .iter()
            .filter(|c| c.open > 0)
            .map(|c| name(c).to_owned())
            .collect();
        names.sort();
        names.dedup();
        names
    };
    if let Some(h) = handler {
        let known = counts.iter().any(|c| c.handler == h)
            || registry.is_some_and(|r| r.handlers().iter().any(|d| d.name == h))
            || store.stats().await?.handlers.iter().any(|s| s.handler == h);
        if !known {
            return Err(CliError::UnknownName {
                what: "no dead letters of handler",
                name: h.to_owned(),
                embedded: registry.is_some(),
                known_what: "handlers with open dead letters",
                known: open_names(|c| &c.handler),
            });
        }
    }
    if let Some(e) = event {
        let known = counts.iter().any(|c| c.event_name == e)
            || registry.is_some_and(|r| r.events().iter().any(|d| d.name == e));
        if !known {
            return Err(CliError::UnknownName {
                what: "no dead letters of event",
                name: e.to_owned(),
                embedded: registry.is_some(),
                known_what: "events with open dead letters",
                known: open_names(|c| &c.event_name),
            });
        }
    }
    Ok(())
}

/// What masks the payloads this command prints: the application's registry (embedded) over
/// the database's catalog (what each service recorded). Reads the catalog only when payloads
/// are printed.
async fn masking(store: &Store, app: &App<'_>, payload: bool) -> Result<Masking, CliError> {
    let mut masking = Masking::default();
    if payload {
        masking.add_records(&store.catalog().await?);
        if let Some(registry) = app.registry {
            masking.add_descriptors(registry.events());
        }
    }
    Ok(masking)
}

/// The warning for a payload printed without its type's catalog entry.
fn not_in_catalog(io: &mut Io<'_>, name: &str, version: u32) -> Result<(), CliError> {
    writeln!(
        io.err,
        "warning: {name} v{version} is in no catalog (this tool's types, or the `event_catalog` rows services record): only the fields other versions of it mark sensitive are masked"
    )?;
    Ok(())
}

pub(super) async fn show(
    store: &Store,
    app: &App<'_>,
    id: i64,
    json: bool,
    payload: bool,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let mut d = store
        .dead_letter_by_id(id)
        .await?
        .ok_or_else(|| CliError::NotFound(vec![id]))?;
    let printed = masking(store, app, payload)
        .await?
        .print(&d.envelope, payload);
    if payload && !printed.known {
        not_in_catalog(io, &d.event_name, d.event_version)?;
    }
    if json {
        d.envelope = printed.text;
        return print_json(&d, io);
    }
    let mut s = String::new();
    let _ = writeln!(s, "dead letter {} ({})", d.id, status(&d));
    let mut field = |k: &str, v: &str| {
        let _ = writeln!(s, "  {k:<14}{v}");
    };
    field("event", &format!("{} v{}", d.event_name, d.event_version));
    field("event id", &d.event_id.to_string());
    field("handler", &d.handler);
    if let Some(o) = &d.origin {
        // An inbox dead letter: a received message, with where it came from.
        // NATS in its own words (a stream and its sequences); any other transport in the
        // origin's.
        let (source, position) = match o.transport.as_str() {
            "nats" => (format!("stream {}", o.source), "stream seq"),
            t => (format!("{t} {}", o.source), "position"),
        };
        field("received from", &source);
        field(position, &o.position.to_string());
        for (k, v) in &o.attributes {
            field(k, v);
        }
        field(
            "delivered",
            &count(
                o.delivery_count,
                "time by the broker",
                "times by the broker",
            ),
        );
    }
    field("attempts", &d.attempts.to_string());
    field("reason", d.reason.as_str());
    field("first failed", &time_ms(d.first_failed_at));
    field("last failed", &time_ms(d.last_failed_at));
    field("dead at", &time_ms(d.dead_at));
    if let Some(at) = d.resolved_at {
        let how = d.resolution.as_deref().unwrap_or("resolved");
        field("resolved", &format!("{how} at {}", time_ms(at)));
    }
    if d.held_back > 0 {
        field(
            "holds back",
            &format!(
                "{} later deliveries of its aggregate to {} (they wait for a replay or purge of this one)",
                d.held_back, d.handler
            ),
        );
    }
    let _ = writeln!(s, "error chain:");
    let chain = &d.error_chain;
    if chain.is_empty() {
        let _ = writeln!(s, "  (empty)");
    }
    for (i, e) in chain.iter().enumerate() {
        let label = if i == 0 { "error" } else { "caused by" };
        let _ = writeln!(s, "  {label}: {e}");
    }
    let note = if printed.withheld {
        format!(
            " (payload withheld: `dlq show {} --payload` prints it, sensitive fields masked)",
            d.id
        )
    } else if printed.masked > 0 {
        format!(" ({} sensitive fields masked)", printed.masked)
    } else {
        String::new()
    };
    let _ = writeln!(s, "envelope:{note}");
    let pretty = serde_json::from_str::<serde_json::Value>(&printed.text)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok());
    match pretty {
        Some(p) => {
            for line in p.lines() {
                let _ = writeln!(s, "  {line}");
            }
        }
        // Not JSON (a foreign or corrupted row): as stored, with --payload only.
        None => {
            let _ = writeln!(s, "  {}", printed.text);
        }
    }
    io.out.write_all(s.as_bytes())?;
    Ok(())
}

pub(super) fn status(d: &DeadLetter) -> &str {
    match (&d.resolved_at, &d.resolution) {
        (None, _) => "open",
        (Some(_), Some(r)) => r,
        (Some(_), None) => "resolved",
    }
}

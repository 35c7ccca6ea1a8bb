//! `asyncapi` and `flow` (embedded only): the application's events and routes as an AsyncAPI
//! document and a Mermaid picture ([`crate::topology`]), printed or compared with a committed
//! copy. `flow` reads the store only with a database named: must not change rows.

use std::path::Path;

use crate::store::Store;
use crate::topology::{self, DestinationCounts, FlowCounts, Topology};

use super::connect::Target;
use super::{no_registry, App, CliError, Io, DATABASE_ENV};

pub(super) fn asyncapi(
    app: &App<'_>,
    check: Option<&Path>,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let registry = app.registry.ok_or_else(|| no_registry(app, "asyncapi"))?;
    let (topology, declared) = topology_of(app);
    let doc = topology::asyncapi(registry, &topology);
    let mut text = serde_json::to_string_pretty(&doc).unwrap_or_default();
    text.push('\n');
    let described = Described {
        command: "asyncapi",
        what: "AsyncAPI document",
        declared,
        warnings: topology.warnings(registry),
        text: &text,
    };
    finish(app, described, check, io)
}

pub(super) async fn flow(
    target: &Target<'_>,
    app: &App<'_>,
    check: Option<&Path>,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let registry = app.registry.ok_or_else(|| no_registry(app, "flow"))?;
    let (topology, declared) = topology_of(app);
    // Live counts only when a database is named, not from the application's default: the
    // picture stays the same text on every run otherwise.
    let named =
        target.database.is_some() || std::env::var(DATABASE_ENV).is_ok_and(|url| !url.is_empty());
    let counts = match (named, check) {
        (true, None) => Some(counts(&target.connect().await?).await?),
        _ => None,
    };
    if let Some(counts) = &counts {
        let shown = shown_destinations(registry, &topology);
        let unknown: Vec<String> = counts
            .destinations
            .iter()
            .filter(|(name, c)| {
                !shown.contains(name.as_str()) && (c.pending > 0 || c.dead_letters > 0 || c.paused)
            })
            .map(|(name, c)| {
                format!(
                    "{name} ({} pending, {} dead letters)",
                    c.pending, c.dead_letters
                )
            })
            .collect();
        if !unknown.is_empty() {
            writeln!(
                io.err,
                "warning: the database holds deliveries or dead letters of destinations this flow \
                 does not show: {}; is the topology the one the database was written with?",
                unknown.join(", ")
            )?;
        }
    }
    let text = topology::flow(registry, &topology, counts.as_ref());
    let described = Described {
        command: "flow",
        what: "flow",
        declared,
        warnings: topology.warnings(registry),
        text: &text,
    };
    finish(app, described, check, io)
}

/// The destinations the flow shows: after-commit handlers, relays, inboxes.
fn shown_destinations<'t>(
    registry: &'t crate::dispatch::registry::Registry,
    topology: &'t Topology,
) -> std::collections::BTreeSet<&'t str> {
    registry
        .handlers()
        .iter()
        .map(|h| h.name)
        .chain(topology.relay_names())
        .chain(topology.inbox_names())
        .collect()
}

/// The application's topology, or one without routes (and whether it declared one).
fn topology_of(app: &App<'_>) -> (Topology, bool) {
    match app.topology {
        Some(t) => (t.clone(), true),
        None => {
            let title = app.name.strip_suffix(" events").unwrap_or(app.name);
            (Topology::new(title, "0.0.0"), false)
        }
    }
}

/// Prints `text`, or compares it with `check`.
/// What a command generated, to print or compare.
struct Described<'a> {
    /// `asyncapi` or `flow`.
    command: &'static str,
    /// `AsyncAPI document` or `flow`.
    what: &'static str,
    /// Whether the application declared its topology.
    declared: bool,
    /// [`Topology::warnings`].
    warnings: Vec<String>,
    text: &'a str,
}

fn finish(
    app: &App<'_>,
    described: Described<'_>,
    check: Option<&Path>,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let Described {
        command,
        what,
        declared,
        warnings,
        text,
    } = described;
    if !declared {
        writeln!(
            io.err,
            "warning: the application declares no topology (event_runtime::cli::App::topology): \
             this {what} shows its own events and handlers only, no relay, inbox or subject"
        )?;
    }
    for warning in &warnings {
        writeln!(io.err, "warning: {warning}")?;
    }
    let Some(file) = check else {
        io.out.write_all(text.as_bytes())?;
        return Ok(());
    };
    let out_of_date = |detail: String| CliError::OutOfDate {
        file: file.display().to_string(),
        what,
        command: format!("{} {command}", app.name),
        detail: Some(detail),
    };
    let committed =
        std::fs::read_to_string(file).map_err(|e| out_of_date(format!("cannot read it: {e}")))?;
    // Line endings and a final newline are a checkout's business (Git's autocrlf), not a
    // difference.
    let ours: Vec<&str> = text.lines().collect();
    let theirs: Vec<&str> = committed
        .lines()
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect();
    if ours == theirs {
        writeln!(
            io.out,
            "ok: {} is the {what} of this application",
            file.display()
        )?;
        return Ok(());
    }
    let detail = match ours.iter().zip(&theirs).position(|(a, b)| a != b) {
        Some(line) => format!("first difference at line {}", line + 1),
        None => format!("it has {} lines, the {what} {}", theirs.len(), ours.len()),
    };
    Err(out_of_date(detail))
}

/// The live counts of the flow's destinations: pending deliveries and pauses from the
/// backlog (which costs in proportion to it, not to the history), open dead letters per
/// handler (inboxes' too), held events and open gaps.
async fn counts(store: &Store) -> Result<FlowCounts, CliError> {
    let backlog = store.backlog().await?;
    let mut counts = FlowCounts::new();
    for d in &backlog.destinations {
        counts.destinations.insert(
            d.destination.clone(),
            DestinationCounts::new(d.pending, Some(d.oldest_pending_age_secs), 0, false),
        );
    }
    for c in store.dead_letter_counts().await? {
        counts
            .destinations
            .entry(c.handler)
            .or_default()
            .dead_letters += c.open;
    }
    for name in &backlog.paused {
        counts.destinations.entry(name.clone()).or_default().paused = true;
    }
    counts.held = backlog.held;
    for gap in store.gaps(false).await? {
        *counts.open_gaps.entry(gap.aggregate_type).or_default() += 1;
    }
    Ok(counts)
}

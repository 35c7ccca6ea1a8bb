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
    finish(
        app,
        "asyncapi",
        "AsyncAPI document",
        declared,
        &text,
        check,
        io,
    )
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
    let text = topology::flow(registry, &topology, counts.as_ref());
    finish(app, "flow", "flow", declared, &text, check, io)
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
fn finish(
    app: &App<'_>,
    command: &str,
    what: &'static str,
    declared: bool,
    text: &str,
    check: Option<&Path>,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    if !declared {
        writeln!(
            io.err,
            "warning: the application declares no topology (event_runtime::cli::App::topology): \
             this {what} shows its own events and handlers only, no relay, inbox or subject"
        )?;
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
    if committed == text {
        writeln!(
            io.out,
            "ok: {} is the {what} of this application",
            file.display()
        )?;
        return Ok(());
    }
    let line = committed
        .lines()
        .zip(text.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| committed.lines().count().min(text.lines().count()));
    Err(out_of_date(format!(
        "first difference at line {}",
        line + 1
    )))
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

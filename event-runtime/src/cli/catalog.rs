//! `catalog` and `check` (embedded only): the application's event types, and whether every
//! pending delivery and open dead letter decodes with them. Reads only: must not change rows.

use event_core::{ErrorChain, RawEnvelope};

use crate::dispatch::registry::Registry;
use crate::store::{DeadLetterFilter, Store};

use super::format::{count, print_json, Table};
use super::{CliError, Io};

#[derive(serde::Serialize)]
struct CatalogEntry<'a> {
    name: &'a str,
    version: u32,
    aggregate_type: &'a str,
    rust_type: &'a str,
    handlers: Vec<&'a str>,
    /// The payload's JSON Schema; `null` when the type does not derive `JsonSchema`.
    schema: serde_json::Value,
}

pub(super) fn print_catalog(
    registry: &Registry,
    json: bool,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let mut entries: Vec<CatalogEntry<'_>> = registry
        .events()
        .iter()
        .map(|e| CatalogEntry {
            name: e.name,
            version: e.version,
            aggregate_type: e.aggregate_type,
            rust_type: e.type_name,
            handlers: registry
                .handlers()
                .iter()
                .filter(|h| h.events.iter().any(|d| (d().type_id)() == (e.type_id)()))
                .map(|h| h.name)
                .collect(),
            schema: crate::privacy::schema_of(e).unwrap_or(serde_json::Value::Null),
        })
        .collect();
    entries.sort_by(|a, b| (a.name, a.version).cmp(&(b.name, b.version)));
    if json {
        return print_json(&entries, io);
    }
    if entries.is_empty() {
        writeln!(io.out, "no event types registered")?;
        return Ok(());
    }
    let mut table = Table::new(
        &["NAME", "VERSION", "RUST TYPE", "HANDLERS", "SCHEMA FIELDS"],
        &["VERSION", "HANDLERS"],
        io.terminal,
    )
    .wrap(&["RUST TYPE", "SCHEMA FIELDS"]);
    for e in &entries {
        let fields = match e.schema.get("properties").and_then(|p| p.as_object()) {
            Some(p) => p.keys().cloned().collect::<Vec<_>>().join(", "),
            None if e.schema.is_null() => "(no JSON Schema: derive schemars::JsonSchema)".into(),
            None => "-".into(),
        };
        table.row(vec![
            e.name.to_owned(),
            e.version.to_string(),
            e.rust_type.to_owned(),
            e.handlers.len().to_string(),
            fields,
        ]);
    }
    table.write(io.out)?;
    Ok(())
}

/// Why `envelope` (CloudEvents JSON) does not decode with `registry`, if it does not: the
/// error and its causes, each once.
fn decode_problem(registry: &Registry, envelope: &str) -> Option<String> {
    match RawEnvelope::from_json(envelope) {
        Err(e) => Some(format!("undecodable envelope: {}", ErrorChain(&e))),
        Ok(raw) => registry
            .decode(&raw)
            .err()
            .map(|e| ErrorChain(&e).to_string()),
    }
}

/// Pre-deploy check: every pending delivery names a handler of this application and its
/// envelope decodes into a registered type, every open dead letter's envelope decodes too
/// (so that a replay after the deploy can succeed), and the engine can read every delivery
/// row (no unreadable pending row, no unknown status). Each kind is counted on its own.
pub(super) async fn check(
    store: &Store,
    registry: &Registry,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let pending = store.pending_envelopes().await?;
    let mut bad_pending = 0;
    for p in &pending {
        let (handler, event_id, envelope) = (&p.destination, &p.event_id, &p.envelope);
        let registered = registry.handlers().iter().any(|h| h.name == handler);
        // A transport's relay (`nats:<stream>`) publishes the envelope as stored: nothing to
        // decode, and no handler to register.
        if !registered && crate::outbox::destination::relay_name(handler) {
            continue;
        }
        let problem = if !registered {
            Some(format!(
                "handler `{handler}` is not registered in this application"
            ))
        } else {
            decode_problem(registry, envelope)
        };
        if let Some(problem) = problem {
            bad_pending += 1;
            writeln!(io.out, "pending {handler} / {event_id}: {problem}")?;
        }
    }
    // Rows the engine cannot read at all, whatever the application's types.
    let stats = store.stats().await?;
    for h in stats
        .handlers
        .iter()
        .filter(|h| h.unreadable + h.unknown > 0)
    {
        if h.unreadable > 0 {
            writeln!(
                io.out,
                "pending {}: {} the engine cannot read (a column edited by hand or by another tool)",
                h.handler,
                count(h.unreadable, "delivery whose row", "deliveries whose rows")
            )?;
        }
        if h.unknown > 0 {
            writeln!(
                io.out,
                "{}: {} in a status this version does not know",
                h.handler,
                count(h.unknown, "delivery", "deliveries")
            )?;
        }
    }
    let dead = store.dead_letters(&DeadLetterFilter::default()).await?;
    let mut bad_dead = 0;
    for d in &dead {
        if let Some(problem) = decode_problem(registry, &d.envelope) {
            bad_dead += 1;
            writeln!(
                io.out,
                "dead letter {} ({} / {}): {problem}",
                d.id, d.handler, d.event_id
            )?;
        }
    }
    if bad_pending + bad_dead > 0 || stats.unreadable + stats.unknown_status > 0 {
        return Err(CliError::CheckFailed {
            pending: bad_pending,
            dead: bad_dead,
            unreadable: stats.unreadable,
            unknown_status: stats.unknown_status,
        });
    }
    writeln!(
        io.out,
        "ok: {} and {}, every one decodes with this application's event types",
        count(
            pending.len() as u64,
            "pending delivery",
            "pending deliveries"
        ),
        count(dead.len() as u64, "open dead letter", "open dead letters"),
    )?;
    Ok(())
}

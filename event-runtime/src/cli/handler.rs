//! `handler list`, `handler pause` and `handler resume`: destinations with their counts and
//! pauses, and the operator's audited pause. Must not touch deliveries or a runtime's pause.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use event_core::DeliveryMode;

use crate::outbox::destination::relay_name;
use crate::store::{AuditEntry, PausedDestination, Store, BREAKER, OPERATOR};

use super::connect::Target;
use super::format::{audit_line, destination_table, one_line, print_json, time, truncate};
use super::resolve::actor;
use super::{App, CliError, Io};

/// How far back in the audit log `handler list` looks for who paused a destination.
const AUDIT_LOOKBACK: u32 = 1000;

/// A row of `handler list --json`.
#[derive(serde::Serialize)]
struct Destination {
    handler: String,
    pending: u64,
    completed: u64,
    dead: u64,
    purged: u64,
    /// Deliveries in a status this version does not know.
    unknown: u64,
    /// Pending deliveries whose row the engine cannot read.
    unreadable: u64,
    /// Whether the embedding application registers this handler; `null` standalone.
    registered: Option<bool>,
    /// A transport's relay (a name `TRANSPORT:…`, see [`is_relay`]), not a handler.
    relay: bool,
    paused: bool,
    pauses: Vec<Pause>,
}

/// A pause in force, with the actor of the operator's pause from the audit log.
#[derive(serde::Serialize)]
struct Pause {
    paused_by: String,
    reason: String,
    paused_at: DateTime<Utc>,
    expires_at: Option<DateTime<Utc>>,
    /// A circuit breaker's pause: when one delivery probes the handler next.
    probe_at: Option<DateTime<Utc>>,
    /// Who paused it, from the newest `pause` audit row of this destination written since
    /// the pause began; `None` for a runtime pause or when the audit log has none.
    actor: Option<String>,
    audit_id: Option<i64>,
}

pub(super) async fn list(
    store: &Store,
    app: &App<'_>,
    json: bool,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let stats = store.stats().await?;
    let pauses = store.paused_destinations().await?;
    let audit = if pauses.iter().any(|p| p.paused_by == OPERATOR) {
        store.audit_log(AUDIT_LOOKBACK).await?
    } else {
        Vec::new()
    };
    let registered: Option<BTreeSet<&str>> = app
        .registry()
        .map(|r| r.handlers().iter().map(|h| h.name).collect());
    let mut names: BTreeSet<String> = stats.handlers.iter().map(|h| h.handler.clone()).collect();
    names.extend(pauses.iter().map(|p| p.destination.clone()));
    if let Some(r) = &registered {
        names.extend(r.iter().map(|n| (*n).to_owned()));
    }
    let rows: Vec<Destination> = names
        .into_iter()
        .map(|name| {
            let s = stats.handlers.iter().find(|h| h.handler == name);
            let pauses: Vec<Pause> = pauses
                .iter()
                .filter(|p| p.destination == name)
                .map(|p| with_actor(p, &audit))
                .collect();
            Destination {
                pending: s.map_or(0, |s| s.pending),
                completed: s.map_or(0, |s| s.completed),
                dead: s.map_or(0, |s| s.dead),
                purged: s.map_or(0, |s| s.purged),
                unknown: s.map_or(0, |s| s.unknown),
                unreadable: s.map_or(0, |s| s.unreadable),
                registered: registered.as_ref().map(|r| r.contains(name.as_str())),
                relay: is_relay(&name, app),
                paused: !pauses.is_empty(),
                pauses,
                handler: name,
            }
        })
        .collect();
    if json {
        return print_json(&rows, io);
    }
    if rows.is_empty() {
        writeln!(io.out, "no destinations: the outbox has no deliveries yet")?;
        return Ok(());
    }
    let unknown = rows.iter().any(|r| r.unknown > 0);
    let unreadable = rows.iter().any(|r| r.unreadable > 0);
    let unregistered = rows.iter().any(|r| r.registered == Some(false) && !r.relay);
    let relays = rows.iter().any(|r| r.relay);
    let mut table = destination_table(&[], unknown, unreadable, io.terminal).wrap(&["PAUSED"]);
    for r in &rows {
        let mut name = r.handler.clone();
        if r.relay {
            name.push_str(" (relay)");
        } else if r.registered == Some(false) {
            name.push_str(" (not registered)");
        }
        let mut row = vec![
            name,
            r.pending.to_string(),
            r.completed.to_string(),
            r.dead.to_string(),
        ];
        if unknown {
            row.push(r.unknown.to_string());
        }
        if unreadable {
            row.push(r.unreadable.to_string());
        }
        row.push(if r.pauses.is_empty() {
            "-".to_owned()
        } else {
            r.pauses.iter().map(describe).collect::<Vec<_>>().join("; ")
        });
        table.row(row);
    }
    table.write(io.out)?;
    if unregistered {
        writeln!(
            io.out,
            "(not registered): this application has no handler of that name; its deliveries wait for one that has (`handler retarget NAME --to HANDLER` moves them, `handler purge NAME` gives up on them)"
        )?;
    }
    if relays {
        writeln!(
            io.out,
            "(relay): a transport's relay to a broker; its pending deliveries are committed events not yet published, which the application publishes when it runs with that transport configured"
        )?;
    }
    Ok(())
}

/// Whether `name` is a transport's relay rather than a handler: a name of the form
/// `TRANSPORT:REST` (`nats:orders`, the rule of `outbox::destination::relay_name`) that is not
/// a handler of the application.
pub(super) fn is_relay(name: &str, app: &App<'_>) -> bool {
    relay_name(name)
        && app
            .registry()
            .is_none_or(|r| !r.handlers().iter().any(|h| h.name == name))
}

fn with_actor(p: &PausedDestination, audit: &[AuditEntry]) -> Pause {
    let prefix = format!("{}: ", p.destination);
    let entry = (p.paused_by == OPERATOR)
        .then(|| {
            audit.iter().find(|e| {
                e.action == "pause" && e.reason.starts_with(&prefix) && e.at >= p.paused_at
            })
        })
        .flatten();
    Pause {
        paused_by: p.paused_by.clone(),
        reason: p.reason.clone(),
        paused_at: p.paused_at,
        expires_at: p.expires_at,
        probe_at: p.probe_at,
        actor: entry.map(|e| e.actor.clone()),
        audit_id: entry.map(|e| e.id),
    }
}

/// `by operator (alice, audit #3) since T: why`, `by event-runtime since T until T: why`.
fn describe(p: &Pause) -> String {
    let mut s = format!("by {}", p.paused_by);
    if let (Some(actor), Some(id)) = (&p.actor, p.audit_id) {
        s.push_str(&format!(" ({actor}, audit #{id})"));
    }
    s.push_str(&format!(" since {}", time(p.paused_at)));
    if let Some(until) = p.expires_at {
        s.push_str(&format!(" until {}", time(until)));
    }
    if let Some(probe) = p.probe_at {
        s.push_str(&format!(" probe at {}", time(probe)));
    }
    s.push_str(&format!(": {}", truncate(&one_line(&p.reason), 60)));
    s
}

/// What `handler pause` was asked.
pub(super) struct PauseArgs {
    pub(super) name: String,
    pub(super) reason: String,
    pub(super) actor: Option<String>,
    pub(super) force: bool,
}

pub(super) async fn pause(
    target: &Target<'_>,
    app: &App<'_>,
    args: PauseArgs,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let reason = args.reason.trim();
    if reason.is_empty() {
        return Err(CliError::Refused(
            "--reason must say why: it is shown by `handler list` and written to the audit log; nothing was paused".into(),
        ));
    }
    let actor = actor(args.actor.as_deref(), "paused")?;
    let name = args.name.as_str();
    if let Some(registry) = app.registry() {
        let in_transaction = registry
            .handlers()
            .iter()
            .any(|h| h.name == name && h.mode == DeliveryMode::InTransaction);
        if in_transaction {
            return Err(CliError::Refused(format!(
                "`{name}` runs inside the committing transaction (`in_transaction`): it has no deliveries for a pause to hold back, and pausing it cannot stop it without failing every commit of its events; stop it by deploying without it; nothing was paused"
            )));
        }
    }
    let store = target.connect().await?;
    let known = known_destinations(&store, app).await?;
    if !args.force && !known.contains(name) {
        return Err(unknown_destination(
            name,
            app,
            known,
            "known destinations (pause a new one with --force)",
        ));
    }
    let before = operator_pause(&store, name).await?;
    let entry = store
        .pause_destination_audited(name, &actor, reason)
        .await?;
    match before {
        Some(p) => writeln!(
            io.out,
            "`{name}` was already paused by the operator since {}; its reason is now: {reason}",
            time(p.paused_at)
        )?,
        None => writeln!(
            io.out,
            "paused `{name}`: no worker of any process claims its deliveries until `handler resume {name}` (deliveries already claimed finish)"
        )?,
    }
    audit_line(&entry, io)
}

pub(super) async fn resume(
    target: &Target<'_>,
    app: &App<'_>,
    name: &str,
    reason: &str,
    given_actor: Option<&str>,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(CliError::Refused(
            "--reason must say why: it is written to the audit log; nothing was resumed".into(),
        ));
    }
    let actor = actor(given_actor, "resumed")?;
    let store = target.connect().await?;
    let by: Vec<String> = store
        .paused_destinations()
        .await?
        .into_iter()
        .filter(|p| p.destination == name && (p.paused_by == OPERATOR || p.paused_by == BREAKER))
        .map(|p| p.paused_by)
        .collect();
    let entry = store
        .resume_destination_audited(name, &actor, reason)
        .await?;
    match &entry {
        Some(_) => {
            let lifted = match (
                by.iter().any(|b| b == OPERATOR),
                by.iter().any(|b| b == BREAKER),
            ) {
                (true, true) => "the operator's and the circuit breaker's pauses are lifted",
                (false, true) => "the circuit breaker's pause is lifted",
                _ => "the operator's pause is lifted",
            };
            writeln!(io.out, "resumed `{name}`: {lifted}")?
        }
        None => {
            let known = known_destinations(&store, app).await?;
            if !known.contains(name) {
                return Err(unknown_destination(name, app, known, "known destinations"));
            }
            writeln!(
                io.out,
                "`{name}` was not paused by an operator or a circuit breaker; nothing was changed"
            )?;
        }
    }
    for p in store.paused_destinations().await? {
        if p.destination == name {
            writeln!(io.out, "still paused {}", describe(&with_actor(&p, &[])))?;
        }
    }
    match entry {
        Some(entry) => audit_line(&entry, io),
        None => Ok(()),
    }
}

async fn operator_pause(store: &Store, name: &str) -> Result<Option<PausedDestination>, CliError> {
    Ok(store
        .paused_destinations()
        .await?
        .into_iter()
        .find(|p| p.destination == name && p.paused_by == OPERATOR))
}

/// Every destination name the outbox or the application knows: deliveries, dead letters,
/// pauses, registered handlers.
async fn known_destinations(store: &Store, app: &App<'_>) -> Result<BTreeSet<String>, CliError> {
    let mut names: BTreeSet<String> = store
        .stats()
        .await?
        .handlers
        .into_iter()
        .map(|h| h.handler)
        .collect();
    names.extend(
        store
            .dead_letter_counts()
            .await?
            .into_iter()
            .map(|c| c.handler),
    );
    if let Some(r) = app.registry() {
        names.extend(r.handlers().iter().map(|h| h.name.to_owned()));
    }
    Ok(names)
}

fn unknown_destination(
    name: &str,
    app: &App<'_>,
    known: BTreeSet<String>,
    known_what: &'static str,
) -> CliError {
    CliError::UnknownName {
        what: "no destination",
        name: name.to_owned(),
        embedded: app.registry().is_some(),
        known_what,
        known: known.into_iter().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relays_are_named_transport_colon_rest() {
        let app = App::standalone();
        for relay in ["nats:orders", "nats:DOWN3", "kafka-2:a:b", "x_y:z"] {
            assert!(is_relay(relay, &app), "{relay}");
        }
        for handler in [
            "shop::mail::send",
            "billing.on_order_placed",
            "Nats:orders",
            "nats:",
            ":orders",
            "nats::orders",
            "2nats:orders",
            "nats.x:orders",
        ] {
            assert!(!is_relay(handler, &app), "{handler}");
        }
    }
}

//! `handler purge` and `handler retarget` (embedded only): what a handler that no longer
//! exists left — pending deliveries, open dead letters — given up on or moved onto a handler
//! of the application, audited. Checks the names against the application's registry; changes
//! rows only through one store operation: must not write SQL.

use crate::dispatch::registry::Registry;
use crate::store::{DestinationReport, Store, StoreError};
use event_core::DeliveryMode;

use super::connect::Target;
use super::format::{audit_line, count};
use super::handler::is_relay;
use super::resolve::{actor, confirm};
use super::{no_registry, App, CliError, Io};

/// What `handler purge` or `handler retarget` was asked.
pub(super) struct RetireArgs {
    pub(super) name: String,
    /// `None`: purge.
    pub(super) to: Option<String>,
    pub(super) reason: Option<String>,
    pub(super) actor: Option<String>,
    /// Confirmed on the command line.
    pub(super) yes: bool,
    /// A transport's relay may be purged or re-targeted.
    pub(super) force_relay: bool,
}

pub(super) async fn retire(
    target: &Target<'_>,
    app: &App<'_>,
    args: RetireArgs,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let command = if args.to.is_some() {
        "handler retarget"
    } else {
        "handler purge"
    };
    let done = if args.to.is_some() { "moved" } else { "purged" };
    let registry = app.registry().ok_or_else(|| no_registry(app, command))?;
    let name = args.name.as_str();
    let reason = match (&args.reason, &args.to) {
        (Some(r), _) => r.trim().to_owned(),
        (None, Some(to)) => format!("replaced by {to}"),
        (None, None) => "no longer registered".to_owned(),
    };
    if reason.is_empty() {
        return Err(CliError::Refused(format!(
            "--reason must say why: it is written to the audit log; nothing was {done}"
        )));
    }
    let actor = actor(args.actor.as_deref(), done)?;
    if registry.handlers().iter().any(|h| h.name == name) {
        return Err(CliError::Refused(format!(
            "`{name}` is a handler of this application: its workers deliver it and would race the {}; {command} is for a handler that no longer exists; nothing was {done}",
            if args.to.is_some() { "move" } else { "purge" }
        )));
    }
    let ordered = match &args.to {
        None => false,
        Some(to) => receiving(registry, to)?,
    };
    let store = target.connect().await?;
    let Some(left) = store
        .stats()
        .await?
        .handlers
        .into_iter()
        .find(|h| h.handler == name)
    else {
        return Err(unknown(&store, app, name).await);
    };
    if left.pending + left.dead == 0 {
        writeln!(
            io.out,
            "`{name}` left no pending deliveries and no open dead letters; nothing was {done}"
        )?;
        return Ok(());
    }
    if let Some(to) = &args.to {
        takes_what_was_left(registry, &store, name, to).await?;
    }
    let what = format!(
        "{} and {}",
        count(left.pending, "pending delivery", "pending deliveries"),
        count(left.dead, "open dead letter", "open dead letters")
    );
    if is_relay(name, app) && !args.force_relay {
        let fate = match &args.to {
            None => "purging them means they never reach the consumers",
            Some(_) => "moving them means the handler gets them and they are never published",
        };
        return Err(CliError::Refused(format!(
            "`{name}` is a transport's relay, not a removed handler: its {what} are events committed but not yet published, and {fate}; run the application with that transport configured to publish them, or pass --force-relay if the relay is gone for good; nothing was {done}"
        )));
    }
    if !args.yes {
        let summary = match &args.to {
            None => format!(
                "`{name}` left {what}: purging gives up on them, and those events are never delivered"
            ),
            Some(to) => format!(
                "`{name}` left {what}: re-targeting moves them onto `{to}`"
            ),
        };
        if !confirm(&format!("{summary}. Go ahead?"), io)? {
            return Err(CliError::Refused(if io.prompt {
                format!("not confirmed; nothing was {done}")
            } else {
                format!("{summary}. Pass --yes to confirm; nothing was {done}")
            }));
        }
    }
    let report = match &args.to {
        None => store.purge_destination(name, &actor, &reason).await,
        Some(to) => {
            store
                .retarget_destination(name, to, ordered, &actor, &reason)
                .await
        }
    }
    .map_err(|source| match source {
        StoreError::Database(_) => CliError::Unfinished {
            doing: format!("{command} {name}"),
            source,
        },
        refused => CliError::Store(refused),
    })?;
    print(name, args.to.as_deref(), &report, io)
}

/// Whether `to` is an after-commit handler of `registry` (the only kind with deliveries) and
/// keeps per-aggregate order; refused otherwise.
fn receiving(registry: &Registry, to: &str) -> Result<bool, CliError> {
    let handlers = registry.handlers();
    match handlers.iter().find(|h| h.name == to) {
        Some(h) if h.mode == DeliveryMode::AfterCommit => Ok(h.ordered),
        Some(_) => Err(CliError::Refused(format!(
            "`{to}` runs in the committing transaction and has no deliveries: re-target onto an after-commit handler; nothing was moved"
        ))),
        None => {
            let mut names: Vec<&str> = handlers
                .iter()
                .filter(|h| h.mode == DeliveryMode::AfterCommit)
                .map(|h| h.name)
                .collect();
            names.sort_unstable();
            Err(CliError::Refused(format!(
                "`{to}` is not a handler of this application, so nothing would deliver what moved there; its after-commit handlers: {}; nothing was moved",
                if names.is_empty() { "none".to_owned() } else { names.join(", ") }
            )))
        }
    }
}

/// Refuses a re-target onto a handler that does not take every event `name` left: the moved
/// deliveries would only be dead-lettered there, with no way back.
async fn takes_what_was_left(
    registry: &Registry,
    store: &Store,
    name: &str,
    to: &str,
) -> Result<(), CliError> {
    let takes: Vec<&str> = registry
        .handlers()
        .iter()
        .filter(|h| h.name == to)
        .flat_map(|h| h.events.iter().map(|e| e().name))
        .collect();
    let left = store.undelivered_event_names(name).await?;
    let others: Vec<&str> = left
        .iter()
        .map(String::as_str)
        .filter(|n| !takes.contains(n))
        .collect();
    if others.is_empty() {
        return Ok(());
    }
    Err(CliError::Refused(format!(
        "`{to}` does not take {}, which `{name}` left undelivered: re-target onto a handler of those events, or purge; nothing was moved",
        others.join(", ")
    )))
}

/// A name that nothing in the outbox has: probably a typo.
async fn unknown(store: &Store, app: &App<'_>, name: &str) -> CliError {
    let known = match store.stats().await {
        Ok(stats) => stats
            .handlers
            .into_iter()
            .filter(|h| h.pending + h.dead > 0)
            .map(|h| h.handler)
            .filter(|h| {
                app.registry()
                    .is_none_or(|r| !r.handlers().iter().any(|x| x.name == h))
            })
            .collect(),
        Err(e) => return e.into(),
    };
    CliError::UnknownName {
        what: "no deliveries of handler",
        name: name.to_owned(),
        embedded: false,
        known_what: "handlers this application does not have that left deliveries or dead letters",
        known,
    }
}

fn print(
    name: &str,
    to: Option<&str>,
    report: &DestinationReport,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let what = format!(
        "{} and {}",
        count(report.deliveries, "pending delivery", "pending deliveries"),
        count(report.dead_letters, "open dead letter", "open dead letters")
    );
    match to {
        None => writeln!(io.out, "purged what `{name}` left: {what}")?,
        Some(to) => {
            writeln!(io.out, "moved what `{name}` left onto `{to}`: {what}")?;
            if report.duplicates > 0 {
                writeln!(
                    io.out,
                    "dropped {} of events `{to}` already had (never delivered twice)",
                    count(report.duplicates, "duplicate", "duplicates")
                )?;
            }
        }
    }
    audit_line(&report.audit, io)
}

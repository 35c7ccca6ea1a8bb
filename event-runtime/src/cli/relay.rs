//! `events relay republish`: the producer publishes again, with the same event ids, events
//! its relay published already — the recovery after a broker lost its data. Works through
//! [`Store::republish`]; the relay's workers publish what it makes pending.

use chrono::{DateTime, Utc};
use clap::Subcommand;

use super::args::parse_time;
use super::handler::is_relay;
use super::resolve::actor;
use super::{App, CliError, Io};
use crate::store::{RepublishSelection, Store};

/// `events relay …`
#[derive(Debug, Subcommand)]
pub(super) enum RelayCommand {
    /// Publish again, with the same event ids, events a relay published already and this
    /// store still holds: after a broker lost its data (consumers report gaps that a
    /// re-fetch cannot close). What a consumer has already is dropped there (duplicate
    /// window, event-id de-duplication). Audited; resumable (run it again)
    Republish {
        /// The relay destination (`nats:EVENTS`; `events handler list` names them)
        #[arg(long, value_name = "D")]
        destination: String,
        /// Only this aggregate (type and id, as the producer names them); repeat for several
        #[arg(long, num_args = 2, value_names = ["TYPE", "ID"], required_unless_present = "since")]
        aggregate: Vec<String>,
        /// Only events recorded at or after this time (RFC 3339, or a date: midnight UTC)
        #[arg(long, value_name = "T", value_parser = parse_time)]
        since: Option<DateTime<Utc>>,
        /// Why: written to the audit log
        #[arg(long, value_name = "TEXT")]
        reason: String,
        /// Who: written to the audit log [default: your login name]
        #[arg(long, value_name = "WHO")]
        actor: Option<String>,
    },
}

pub(super) async fn run(
    store: &Store,
    app: &App<'_>,
    command: RelayCommand,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let RelayCommand::Republish {
        destination,
        aggregate,
        since,
        reason,
        actor: who,
    } = command;
    if reason.trim().is_empty() {
        return Err(CliError::Refused(
            "--reason must say why: it is written to the audit log; nothing was re-published"
                .into(),
        ));
    }
    let relays: Vec<String> = store
        .stats()
        .await?
        .handlers
        .into_iter()
        .map(|h| h.handler)
        .filter(|h| is_relay(h, app))
        .collect();
    let here = if relays.is_empty() {
        "none has deliveries in this database".to_owned()
    } else {
        relays.join(", ")
    };
    if !is_relay(&destination, app) {
        return Err(CliError::Refused(format!(
            "`{destination}` is not a relay (a relay is named TRANSPORT:…, such as `nats:<stream>`, and is no handler of the application): only a relay's deliveries are published again; a handler's are run again with `events dlq replay` (relays: {here}); nothing was re-published"
        )));
    }
    if !relays.contains(&destination) {
        return Err(CliError::Refused(format!(
            "no relay `{destination}` in this database (relays: {here}); nothing was re-published"
        )));
    }
    let who = actor(who.as_deref(), "re-published")?;
    let mut selection = RepublishSelection::new(&destination);
    for pair in aggregate.chunks(2) {
        if let [t, i] = pair {
            selection = selection.aggregate(t, i);
        }
    }
    if let Some(since) = since {
        selection = selection.since_ms(since.timestamp_millis());
    }
    let done = store.republish(&selection, &who, reason.trim()).await?;
    if done.audit.count == 0 && done.pending == 0 && done.dead == 0 {
        return Err(CliError::Refused(format!(
            "nothing of `{destination}` matches: no event of the selection was published by it and is still held here (check --destination with `events handler list`, and the selection); audit #{} records the attempt",
            done.audit.id
        )));
    }
    writeln!(
        io.out,
        "re-publishing {} event(s) to `{destination}` (audit #{}): they are pending again, and the application's relay workers (the next run with that transport configured) publish them in order, with the same event ids",
        done.audit.count, done.audit.id
    )?;
    if done.pending > 0 {
        writeln!(
            io.out,
            "{} selected event(s) were not published yet: they are published anyway",
            done.pending
        )?;
    }
    if done.dead > 0 {
        writeln!(
            io.err,
            "warning: {} selected event(s) are in the dead letter queue of `{destination}`: not re-published; replay them with `events dlq replay --handler {destination}`",
            done.dead
        )?;
    }
    Ok(())
}

//! `inbox gaps`, `inbox gaps refetch` and `inbox gaps accept`: the gaps in received
//! aggregates' chains (a received event that waits for a predecessor that did not arrive),
//! the re-fetch of the missing events from the stream (feature `nats`), and the operator's
//! audited accept that releases what waits behind them.

use clap::Subcommand;

use crate::inbox::Gap;
use crate::store::{from_ms, Store};

use super::format::{print_json, time, Table};
use super::resolve::actor;
use super::{App, CliError, Io};

/// `events inbox …`
#[derive(Debug, Subcommand)]
pub(super) enum InboxCommand {
    /// Gaps: received events held because a predecessor in their aggregate's chain did not
    /// arrive (`list`, the default) or `accept` them
    Gaps {
        #[command(subcommand)]
        command: Option<GapsCommand>,
        /// Closed gaps too, with how they closed (`arrived`, `accepted`)
        #[arg(long)]
        all: bool,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum GapsCommand {
    /// Re-fetch the missing events from the stream the inbox consumes, from its consumer's
    /// first unacknowledged message up to each waiting event, and commit them through the
    /// application's inbox core; reports per gap whether it was found (if not, the command
    /// that re-publishes it from the producer). Audited; resumable (run it again). Needs the
    /// application's own tool (embedded with its outbox) and feature `nats`
    #[cfg(feature = "nats")]
    Refetch {
        /// Gap ids (see `events inbox gaps`)
        #[arg(value_name = "ID", required_unless_present = "all_open")]
        ids: Vec<i64>,
        /// Every open gap
        #[arg(long, conflicts_with = "ids")]
        all_open: bool,
        /// The inbox's durable consumer (its dead letters' handler is `nats-inbox:NAME`)
        #[arg(long, value_name = "DURABLE")]
        consumer: String,
        /// The stream it consumes
        #[arg(long, value_name = "S", default_value = "EVENTS")]
        stream: String,
        /// NATS server URL, or a cluster's servers comma-separated [env: EVENTS_NATS_URL] [default: nats://127.0.0.1:4222]
        #[arg(long, value_name = "URL")]
        nats: Option<String>,
        /// Start at this stream sequence instead of the consumer's first unacknowledged
        /// message
        #[arg(long, value_name = "SEQ")]
        from: Option<u64>,
        /// Read at most this many messages
        #[arg(long, value_name = "N", default_value_t = 100_000,
              value_parser = clap::value_parser!(u64).range(1..))]
        max_messages: u64,
        /// Why: written to the audit log
        #[arg(long, value_name = "TEXT")]
        reason: String,
        /// Who: written to the audit log [default: your login name]
        #[arg(long, value_name = "WHO")]
        actor: Option<String>,
    },
    /// Accept gaps: the missing events are given up and the events held behind them are
    /// handled, in chain order; a missing event that arrives later is dead-lettered as
    /// `late`. Audited; resumable (run it again to accept what an interruption left)
    Accept {
        /// Gap ids (see `events inbox gaps`)
        #[arg(value_name = "ID", required_unless_present = "all_open")]
        ids: Vec<i64>,
        /// Every open gap
        #[arg(long, conflicts_with = "ids")]
        all_open: bool,
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
    command: InboxCommand,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    // Only `refetch` (feature `nats`) needs the application.
    #[cfg(not(feature = "nats"))]
    let _ = app;
    let InboxCommand::Gaps { command, all, json } = command;
    match command {
        None => list(store, all, json, io).await,
        #[cfg(feature = "nats")]
        Some(GapsCommand::Refetch {
            ids,
            all_open,
            consumer,
            stream,
            nats,
            from,
            max_messages,
            reason,
            actor: who,
        }) => {
            let mut refetch =
                crate::transport::nats::Refetch::new(stream, consumer).max_messages(max_messages);
            if !all_open {
                refetch = refetch.gaps(ids);
            }
            if let Some(from) = from {
                refetch = refetch.from(from);
            }
            let args = super::refetch::Args {
                refetch,
                nats,
                reason,
                actor: who,
            };
            super::refetch::run(store, app, args, io).await
        }
        Some(GapsCommand::Accept {
            ids,
            all_open,
            reason,
            actor: who,
        }) => {
            if reason.trim().is_empty() {
                return Err(CliError::Refused(
                    "--reason must say why: it is written to the audit log; nothing was accepted"
                        .into(),
                ));
            }
            let who = actor(who.as_deref(), "accepted")?;
            let selection = (!all_open).then_some(ids.as_slice());
            let done = store.accept_gaps(selection, &who, &reason).await?;
            let Some(audit) = &done.audit else {
                return Err(CliError::Refused(match selection {
                    Some(ids) => format!(
                        "no open gap among {}: nothing was accepted (`events inbox gaps` lists the open ones)",
                        ids.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")
                    ),
                    None => "no open gap: nothing was accepted".into(),
                }));
            };
            writeln!(
                io.out,
                "accepted {} gap(s) (audit #{}); the events held behind them are released in chain order",
                done.accepted.len(),
                audit.id
            )?;
            if let Some(ids) = selection {
                let accepted: Vec<i64> = done.accepted.iter().map(|g| g.id).collect();
                let skipped: Vec<String> = ids
                    .iter()
                    .filter(|i| !accepted.contains(i))
                    .map(i64::to_string)
                    .collect();
                if !skipped.is_empty() {
                    writeln!(
                        io.err,
                        "not open gaps (closed already, or no such id): {}",
                        skipped.join(", ")
                    )?;
                }
            }
            Ok(())
        }
    }
}

async fn list(store: &Store, all: bool, json: bool, io: &mut Io<'_>) -> Result<(), CliError> {
    let gaps = store.gaps(all).await?;
    if json {
        return print_json(&gaps, io);
    }
    if gaps.is_empty() {
        writeln!(io.out, "no {}gaps", if all { "" } else { "open " })?;
        return Ok(());
    }
    write_table(&gaps, all, io)?;
    if gaps
        .iter()
        .any(|g| g.closed_at.is_none() && g.dead_letter_id.is_none())
    {
        writeln!(io.err, "{CLOSE_HINT}")?;
    }
    Ok(())
}

/// How to close an open gap whose event never arrived, in the order to try.
#[cfg(feature = "nats")]
const CLOSE_HINT: &str = "to close a gap: `events inbox gaps refetch ID --consumer DURABLE --reason …` reads the event again from the stream; if the broker lost it, run `events relay republish` on the producer's database; `events inbox gaps accept ID --reason …` gives it up";
#[cfg(not(feature = "nats"))]
const CLOSE_HINT: &str = "to close a gap: have the producer publish the event again (`events relay republish` on its database); `events inbox gaps accept ID --reason …` gives it up";

/// The gaps as a table (kind `gap`), as `inbox gaps` and `dlq list` show them.
pub(super) fn write_table(gaps: &[Gap], all: bool, io: &mut Io<'_>) -> Result<(), CliError> {
    let mut header = vec!["ID", "KIND"];
    if all {
        header.push("STATUS");
    }
    header.extend(["AGGREGATE", "MISSING", "WAITING", "SINCE", "DEAD LETTER"]);
    let mut table = Table::new(
        &header,
        &["ID", "MISSING", "WAITING", "DEAD LETTER"],
        io.terminal,
    )
    .wrap_names(&["AGGREGATE"]);
    for g in gaps {
        let mut row = vec![g.id.to_string(), "gap".to_owned()];
        if all {
            row.push(g.resolution.clone().unwrap_or_else(|| "open".into()));
        }
        row.extend([
            format!("{} {}", g.aggregate_type, g.aggregate_id),
            g.missing_sequence.to_string(),
            format!("{} ({})", g.waiting_sequence, g.waiting_event_id),
            time(from_ms(g.waiting_since)),
            g.dead_letter_id.map(|i| i.to_string()).unwrap_or_default(),
        ]);
        table.row(row);
    }
    table.write(io.out)?;
    Ok(())
}

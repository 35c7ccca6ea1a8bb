//! `events inbox gaps refetch`: the missing events of open gaps read again from the stream
//! an inbox consumes and committed through the application's inbox core
//! ([`Refetch`](crate::transport::nats::Refetch)), with a line per gap saying what was found
//! and, when nothing was, the command that re-publishes it from the producer.

use super::resolve::actor;
use super::{App, CliError, Io};
use crate::store::Store;
use crate::transport::nats::{Refetch, RefetchOutcome};

pub(super) struct Args {
    pub(super) refetch: Refetch,
    pub(super) nats: Option<String>,
    pub(super) reason: String,
    pub(super) actor: Option<String>,
}

pub(super) async fn run(
    store: &Store,
    app: &App<'_>,
    args: Args,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let reason = args.reason.trim();
    if reason.is_empty() {
        return Err(CliError::Refused(
            "--reason must say why: it is written to the audit log; nothing was re-fetched".into(),
        ));
    }
    let who = actor(args.actor.as_deref(), "re-fetched")?;
    let Some(build) = app.outbox_factory() else {
        return Err(CliError::Refused(format!(
            "a re-fetch commits the events it finds through the application's inbox core, and `{}` has none: run it with the application's own tool (cli::App::outbox), or call NatsInbox::refetch_gaps; nothing was re-fetched",
            app.name()
        )));
    };
    let outbox = build(store.clone())?;
    let client = crate::transport::nats::connect(&super::nats::nats_url(args.nats), "events")
        .await
        .map_err(CliError::Nats)?;
    let js = async_nats::jetstream::new(client);
    let r = args
        .refetch
        .run(&js, &outbox, &who, reason)
        .await
        .map_err(CliError::Nats)?;
    let Some(audit) = &r.audit else {
        return Err(CliError::Refused(match &args.refetch.gaps {
            Some(ids) => format!(
                "no open gap among {}: nothing was re-fetched (`events inbox gaps` lists the open ones)",
                ids.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")
            ),
            None => "no open gap: nothing was re-fetched".into(),
        }));
    };
    match r.range {
        Some((from, to)) => writeln!(
            io.out,
            "read {} message(s) of stream {}, #{from} to #{to}{}; committed {} event(s) ({} already here, {} dead-lettered) (audit #{})",
            r.read,
            r.stream,
            match (r.complete, args.refetch.from) {
                (true, _) => "",
                (false, Some(_)) => " (from --from on: what lies before it was not read)",
                (false, None) => " (stopped before the end: --max-messages reached, or the server stopped answering; run it again, or with --from past what was read)",
            },
            r.committed.appended,
            r.committed.duplicates,
            r.committed.dead_lettered,
            audit.id
        )?,
        None if args.refetch.from.is_some() => writeln!(
            io.out,
            "nothing read in stream {}: --from starts after the waiting events (audit #{})",
            r.stream, audit.id
        )?,
        None => writeln!(
            io.out,
            "nothing to read in stream {}: the consumer has acknowledged every message before the waiting events (audit #{})",
            r.stream, audit.id
        )?,
    }
    let mut missing = 0;
    for g in &r.gaps {
        let what = match &g.outcome {
            RefetchOutcome::Arrived => "found: the gap closed, the events held behind it are released".to_owned(),
            RefetchOutcome::DeadLettered(id) => format!(
                "found, and dead-lettered here (#{id}): replay it after a deploy that takes it, or purge it to accept the gap"
            ),
            RefetchOutcome::NotFound { republish } if r.complete => {
                missing += 1;
                format!("not in the stream: the broker no longer has it; on the producer run: {republish}")
            }
            RefetchOutcome::NotFound { republish } => {
                missing += 1;
                format!("not in the part read; read the rest, or on the producer run: {republish}")
            }
            RefetchOutcome::OtherSource(source) => {
                missing += 1;
                format!("its waiting event came from {source}, not from this stream: nothing read for it")
            }
            RefetchOutcome::Closed(how) => format!("closed meanwhile ({how})"),
        };
        writeln!(
            io.out,
            "gap {}: {} {} missing {}: {what}",
            g.gap.id, g.gap.aggregate_type, g.gap.aggregate_id, g.gap.missing_sequence
        )?;
    }
    if missing > 0 {
        return Err(CliError::Refused(format!(
            "{missing} gap(s) not closed by the stream: re-publish from the producer as said above (for many aggregates at once: `events relay republish --destination nats:{} --since T`, T before the loss), or accept them (`events inbox gaps accept`)",
            r.stream
        )));
    }
    Ok(())
}

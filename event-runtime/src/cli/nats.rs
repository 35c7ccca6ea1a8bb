//! `events nats stream create|check`: the stream the relay publishes to, created or verified
//! with [`StreamSpec`] (NATS only, never the database), `repartition` changing its
//! partitions; `events nats inbox show|adopt`: the
//! stream and consumer an inbox recorded in its store, against what the server has.

use std::time::Duration;

use clap::{Args, Subcommand};

use super::resolve::actor;
use super::{CliError, Io, Target};
use crate::transport::nats::{observe_identity, StreamShape, StreamSpec};
use crate::InboxIdentity;

#[derive(Debug, Subcommand)]
pub(super) enum NatsCommand {
    /// JetStream streams: create, check, repartition
    #[command(subcommand)]
    Stream(StreamCommand),
    /// An inbox's recorded stream and consumer: show, adopt (needs --database)
    #[command(subcommand)]
    Inbox(InboxCommand),
    /// A group of inbox instances sharing a partitioned stream: status (needs --database)
    #[command(subcommand)]
    Group(super::nats_group::GroupCommand),
}

#[derive(Debug, Subcommand)]
pub(super) enum InboxCommand {
    /// Show the stream and consumer the inbox recorded, and what the server has now
    Show(InboxArgs),
    /// Record what the server has now as the stream and consumer the inbox consumes, after a
    /// broker lost or re-created them (audited). Check first what was lost: the inbox stops
    /// on a changed identity because events published before may never arrive.
    Adopt {
        #[command(flatten)]
        inbox: InboxArgs,
        /// Why (written to the audit log)
        #[arg(long)]
        reason: String,
        /// Who (written to the audit log; default: the login name)
        #[arg(long)]
        actor: Option<String>,
    },
}

#[derive(Debug, Args)]
pub(super) struct InboxArgs {
    /// The inbox's durable consumer name (its dead letters' handler is `nats-inbox:NAME`)
    durable: String,
    /// The stream it consumes
    #[arg(long, default_value = "EVENTS")]
    stream: String,
    /// NATS server URL, or a cluster's servers comma-separated [env: EVENTS_NATS_URL] [default: nats://127.0.0.1:4222]
    #[arg(long, value_name = "URL")]
    nats: Option<String>,
}

pub(super) fn nats_url(given: Option<String>) -> String {
    given
        .or_else(|| std::env::var("EVENTS_NATS_URL").ok())
        .unwrap_or_else(|| "nats://127.0.0.1:4222".into())
}

pub(super) async fn inbox(
    target: &Target<'_>,
    command: InboxCommand,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let (args, adopt) = match command {
        InboxCommand::Show(a) => (a, None),
        InboxCommand::Adopt {
            inbox,
            reason,
            actor,
        } => (inbox, Some((reason, actor))),
    };
    let adopt = match adopt {
        Some((reason, given)) => {
            let reason = reason.trim().to_owned();
            if reason.is_empty() {
                return Err(CliError::Refused(
                    "--reason must say why: it is written to the audit log; nothing was adopted"
                        .into(),
                ));
            }
            Some((reason, actor(given.as_deref(), "adopted")?))
        }
        None => None,
    };
    let name = format!("nats-inbox:{}", args.durable);
    let store = target.connect().await?;
    let recorded = store.inbox_identity(&name).await?;
    let client = crate::transport::nats::connect(&nats_url(args.nats), "events")
        .await
        .map_err(CliError::Nats)?;
    let js = async_nats::jetstream::new(client);
    let found = observe_identity(&js, &args.stream, &args.durable)
        .await
        .map_err(CliError::Nats)?;
    let found = InboxIdentity::new(&name, &args.stream, found.0, found.1);
    let shown = |i: &Option<InboxIdentity>| i.as_ref().map_or("nothing".into(), |i| i.describe());
    writeln!(io.out, "inbox {name}")?;
    writeln!(io.out, "  recorded  {}", shown(&recorded))?;
    writeln!(io.out, "  server    {}", found.describe())?;
    if recorded.is_none() && found.consumer_created.is_none() {
        let what = match adopt {
            Some(_) => "nothing was adopted",
            None => "nothing to compare",
        };
        return Err(CliError::Refused(format!(
            "no inbox `{}` here: this database records none, and stream `{}` has no consumer of that name (check the durable name, --stream and --database); {what}",
            args.durable, args.stream
        )));
    }
    let same = recorded.as_ref().is_some_and(|r| {
        r.stream == found.stream
            && r.stream_created == found.stream_created
            && r.consumer_created == found.consumer_created
    });
    match adopt {
        None if same => writeln!(io.out, "the same: the inbox consumes it")?,
        None if recorded.is_none() => writeln!(
            io.out,
            "nothing recorded yet: the inbox records the server's on its first start"
        )?,
        None => writeln!(
            io.out,
            "they differ: the inbox refuses to consume until `events nats inbox adopt {}` records the server's",
            args.durable
        )?,
        Some(_) if same => writeln!(io.out, "already recorded; nothing was changed")?,
        Some((reason, actor)) => {
            let entry = store.adopt_inbox_identity(&found, &actor, &reason).await?;
            writeln!(
                io.out,
                "adopted: the inbox consumes {} (audit row {})",
                found.describe(),
                entry.id
            )?;
        }
    }
    Ok(())
}

#[derive(Debug, Subcommand)]
pub(super) enum StreamCommand {
    /// Create the stream (file storage), or check it when it exists
    Create(StreamArgs),
    /// Check that the stream exists with these subjects and at least these limits
    Check(StreamArgs),
    /// Change the stream's partitions in place (the procedure: the transport's docs,
    /// "Changing the partitions"): records the new count and adds its subjects; with
    /// --prune, keeps only the new count's subjects
    Repartition(RepartitionArgs),
}

#[derive(Debug, Args)]
pub(super) struct RepartitionArgs {
    /// The stream name
    #[arg(default_value = "EVENTS")]
    name: String,
    /// NATS server URL, or a cluster's servers comma-separated [env: EVENTS_NATS_URL] [default: nats://127.0.0.1:4222]
    #[arg(long, value_name = "URL")]
    nats: Option<String>,
    /// A subject the stream carries, partition token aside (repeat for several; default: the
    /// stream's own)
    #[arg(long = "subject", value_name = "SUBJECT")]
    subjects: Vec<String>,
    /// The new count of partitions
    #[arg(long, value_name = "P")]
    partitions: u32,
    /// Capture only the new count's subjects (once every producer publishes with it)
    #[arg(long)]
    prune: bool,
}

#[derive(Debug, Args)]
pub(super) struct StreamArgs {
    /// The stream name
    #[arg(default_value = "EVENTS")]
    name: String,
    /// NATS server URL, or a cluster's servers comma-separated [env: EVENTS_NATS_URL] [default: nats://127.0.0.1:4222]
    #[arg(long, value_name = "URL")]
    nats: Option<String>,
    /// A subject the stream captures (repeat for several)
    #[arg(long = "subject", value_name = "SUBJECT", default_values_t = ["events.>".to_owned()])]
    subjects: Vec<String>,
    /// Duplicate window in seconds: at least the relay's retry horizon
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    duplicate_window: u64,
    /// Largest message in bytes, headers included (default: the server's max_payload)
    #[arg(long, value_name = "BYTES")]
    max_msg_size: Option<u32>,
    /// Copies of the stream in a cluster (3 survives one server's loss; check: at least)
    #[arg(long, value_name = "N", default_value_t = 1)]
    replicas: usize,
    /// Partitions: a partition token after each subject's first token (check: exactly)
    #[arg(long, value_name = "P", default_value_t = 1)]
    partitions: u32,
}

pub(super) async fn stream(command: StreamCommand, io: &mut Io<'_>) -> Result<(), CliError> {
    let (create, args) = match command {
        StreamCommand::Create(a) => (true, a),
        StreamCommand::Check(a) => (false, a),
        StreamCommand::Repartition(a) => return repartition(a, io).await,
    };
    let client = crate::transport::nats::connect(&nats_url(args.nats), "events")
        .await
        .map_err(CliError::Nats)?;
    let js = async_nats::jetstream::new(client);
    let mut spec = StreamSpec::new(&args.name)
        .subjects(args.subjects)
        .duplicate_window(Duration::from_secs(args.duplicate_window))
        .replicas(args.replicas)
        .partitions(args.partitions);
    spec.max_msg_size = args.max_msg_size;
    let shape = if create {
        spec.create(&js).await
    } else {
        spec.check(&js).await
    }
    .map_err(CliError::Nats)?;
    // A clustered stream that exists may still take nothing (no quorum) or run short of a
    // replica: said, and the first fails the check.
    match crate::transport::nats::replica_trouble(&js, &shape.name).await {
        Ok(None) => print(&shape, io),
        Ok(Some(warning)) => {
            print(&shape, io)?;
            writeln!(io.err, "warning: {warning}")?;
            Ok(())
        }
        Err(why) => {
            print(&shape, io)?;
            Err(CliError::Refused(format!(
                "{why}: it takes no events until that changes"
            )))
        }
    }
}

async fn repartition(args: RepartitionArgs, io: &mut Io<'_>) -> Result<(), CliError> {
    let client = crate::transport::nats::connect(&nats_url(args.nats), "events")
        .await
        .map_err(CliError::Nats)?;
    let js = async_nats::jetstream::new(client);
    let subjects = if args.subjects.is_empty() {
        let shape = StreamShape::fetch(&js, &args.name)
            .await
            .map_err(CliError::Nats)?;
        shape.base_subjects()
    } else {
        args.subjects
    };
    let shape = StreamSpec::new(&args.name)
        .subjects(subjects)
        .partitions(args.partitions)
        .repartition(&js, args.prune)
        .await
        .map_err(CliError::Nats)?;
    print(&shape, io)
}

fn print(s: &StreamShape, io: &mut Io<'_>) -> Result<(), CliError> {
    writeln!(io.out, "stream {}: ok", s.name)?;
    writeln!(io.out, "  subjects          {}", s.subjects.join(", "))?;
    let storage = if s.file_storage { "file" } else { "memory" };
    writeln!(io.out, "  storage           {storage}")?;
    writeln!(
        io.out,
        "  duplicate window  {} s",
        s.duplicate_window.as_secs()
    )?;
    match s.max_msg_size {
        Some(n) => writeln!(io.out, "  max_msg_size      {n} bytes")?,
        None => writeln!(io.out, "  max_msg_size      the server's max_payload")?,
    }
    writeln!(io.out, "  replicas          {}", s.replicas)?;
    writeln!(io.out, "  partitions        {}", s.partitions)?;
    if let Some(leader) = &s.leader {
        writeln!(io.out, "  leader            {leader}")?;
    }
    Ok(())
}

//! `events nats group status`: a group of inbox instances as its database records it — each
//! instance's lease, who holds which partition until when — with each partition's lag from
//! the server (messages not yet delivered, and delivered but not acknowledged).

use clap::{Args, Subcommand};

use super::format::{time, Table};
use super::nats::nats_url;
use super::{CliError, Io, Target};
use crate::transport::nats::{partition_durable, StreamShape};

#[derive(Debug, Subcommand)]
pub(super) enum GroupCommand {
    /// Show the instances (lease), the partitions (holder, lease) and each partition's lag
    Status(GroupArgs),
}

#[derive(Debug, Args)]
pub(super) struct GroupArgs {
    /// The inbox's durable consumer name (partition k's consumer is `NAME-k`)
    durable: String,
    /// The group's name (default: the durable name)
    #[arg(long)]
    group: Option<String>,
    /// The stream it consumes
    #[arg(long, default_value = "EVENTS")]
    stream: String,
    /// NATS server URL, or a cluster's servers comma-separated [env: EVENTS_NATS_URL] [default: nats://127.0.0.1:4222]
    #[arg(long, value_name = "URL")]
    nats: Option<String>,
}

/// A consumer's lag: (not yet delivered, delivered and not acknowledged); `None` when there
/// is no such consumer.
async fn lag(
    stream: &mut async_nats::jetstream::stream::Stream,
    durable: &str,
) -> Option<(u64, usize)> {
    let info = stream.consumer_info(durable).await.ok()?;
    Some((info.num_pending, info.num_ack_pending))
}

pub(super) async fn run(
    target: &Target<'_>,
    command: GroupCommand,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let GroupCommand::Status(args) = command;
    let group = args.group.clone().unwrap_or_else(|| args.durable.clone());
    let store = target.connect().await?;
    let view = store.group_view(&group).await?;
    let client = crate::transport::nats::connect(&nats_url(args.nats), "events")
        .await
        .map_err(CliError::Nats)?;
    let js = async_nats::jetstream::new(client);
    let shape = StreamShape::fetch(&js, &args.stream)
        .await
        .map_err(CliError::Nats)?;
    let mut stream = js.get_stream(&args.stream).await.map_err(|e| {
        CliError::Nats(crate::transport::nats::NatsError::Broker(
            "get stream",
            e.into(),
        ))
    })?;
    let now = view.at;
    let left = |t: chrono::DateTime<chrono::Utc>| {
        let ms = (t - now).num_milliseconds();
        if ms >= 0 {
            format!("in {:.1} s", ms as f64 / 1000.0)
        } else {
            format!("{:.1} s ago", -ms as f64 / 1000.0)
        }
    };
    writeln!(
        io.out,
        "group {group}: stream {} of {} partition(s), read at {}",
        shape.name,
        shape.partitions,
        time(now)
    )?;
    let live = view.members.iter().filter(|m| m.live).count();
    writeln!(io.out, "instances: {live} live of {}", view.members.len())?;
    let mut members = Table::new(
        &[
            "INSTANCE",
            "STATE",
            "JOINED",
            "RENEWED",
            "LEASE ENDS",
            "HOLDS",
        ],
        &["HOLDS"],
        io.terminal,
    )
    .wrap_names(&["INSTANCE"]);
    for m in &view.members {
        members.row(vec![
            m.member.clone(),
            if m.live { "live" } else { "expired" }.into(),
            time(m.started_at),
            time(m.renewed_at),
            left(m.expires_at),
            view.held_by(&m.member).len().to_string(),
        ]);
    }
    members.write(io.out)?;
    let mut partitions = Table::new(
        &[
            "PARTITION",
            "CONSUMER",
            "HOLDER",
            "STATE",
            "LEASE ENDS",
            "PENDING",
            "ACK PENDING",
        ],
        &["PARTITION", "PENDING", "ACK PENDING"],
        io.terminal,
    )
    .wrap_names(&["HOLDER"]);
    let mut unheld = 0;
    for p in 0..shape.partitions {
        let durable = if shape.partitions > 1 {
            partition_durable(&args.durable, p)
        } else {
            args.durable.clone()
        };
        let lease = view.partitions.iter().find(|l| l.partition == p);
        let (holder, state, ends) = match lease {
            Some(l) if l.held => (
                l.owner.clone().unwrap_or_default(),
                "held",
                left(l.expires_at),
            ),
            Some(l) if l.owner.is_some() => (
                l.owner.clone().unwrap_or_default(),
                "lapsed",
                left(l.expires_at),
            ),
            Some(_) => (String::new(), "released", String::new()),
            None => (String::new(), "never taken", String::new()),
        };
        if state != "held" {
            unheld += 1;
        }
        let (pending, ack_pending) = match lag(&mut stream, &durable).await {
            Some((n, a)) => (n.to_string(), a.to_string()),
            None => ("no consumer".into(), String::new()),
        };
        partitions.row(vec![
            p.to_string(),
            durable,
            holder,
            state.into(),
            ends,
            pending,
            ack_pending,
        ]);
    }
    partitions.write(io.out)?;
    if shape.partitions > 1 {
        if let Some((n, a)) = lag(&mut stream, &args.durable).await {
            writeln!(
                io.out,
                "the consumer from before the partitions, {}: {n} pending, {a} ack pending (the holder of partition 0 drains it; delete it once both are 0 and the stream no longer captures unpartitioned subjects)",
                args.durable
            )?;
        }
    }
    if unheld > 0 && live > 0 {
        writeln!(
            io.err,
            "warning: {unheld} partition(s) not held: nobody consumes them until an instance takes them (within a quarter of the lease while instances run)"
        )?;
    }
    Ok(())
}

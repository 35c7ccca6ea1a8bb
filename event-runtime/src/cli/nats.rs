//! `events nats stream create|check`: the stream the relay publishes to, created or verified
//! with [`StreamSpec`]. Talks to NATS only, never to the database.

use std::time::Duration;

use clap::{Args, Subcommand};

use super::{CliError, Io};
use crate::transport::nats::{StreamShape, StreamSpec};

#[derive(Debug, Subcommand)]
pub(super) enum NatsCommand {
    /// JetStream streams: create, check
    #[command(subcommand)]
    Stream(StreamCommand),
}

#[derive(Debug, Subcommand)]
pub(super) enum StreamCommand {
    /// Create the stream (file storage), or check it when it exists
    Create(StreamArgs),
    /// Check that the stream exists with these subjects and at least these limits
    Check(StreamArgs),
}

#[derive(Debug, Args)]
pub(super) struct StreamArgs {
    /// The stream name
    #[arg(default_value = "EVENTS")]
    name: String,
    /// NATS server URL [env: EVENTS_NATS_URL]
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
}

pub(super) async fn stream(command: StreamCommand, io: &mut Io<'_>) -> Result<(), CliError> {
    let (create, args) = match command {
        StreamCommand::Create(a) => (true, a),
        StreamCommand::Check(a) => (false, a),
    };
    let url = args
        .nats
        .or_else(|| std::env::var("EVENTS_NATS_URL").ok())
        .unwrap_or_else(|| "nats://127.0.0.1:4222".into());
    let client = async_nats::connect(&url).await.map_err(|e| {
        CliError::Nats(crate::transport::nats::NatsError::Broker(
            "connect",
            e.into(),
        ))
    })?;
    let js = async_nats::jetstream::new(client);
    let mut spec = StreamSpec::new(&args.name)
        .subjects(args.subjects)
        .duplicate_window(Duration::from_secs(args.duplicate_window));
    spec.max_msg_size = args.max_msg_size;
    let shape = if create {
        spec.create(&js).await
    } else {
        spec.check(&js).await
    }
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
    Ok(())
}

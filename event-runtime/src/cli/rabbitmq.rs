//! `events rabbitmq topology create|check`: the exchange a relay publishes to and a consuming
//! service's partition queues, declared or verified with [`BrokerTopology`] (RabbitMQ only,
//! never the database).

use clap::{Args, Subcommand};

use super::{CliError, Io};
use crate::transport::rabbitmq::{redact_url, BrokerTopology};

/// The environment variable read when `--amqp` is not given.
const AMQP_ENV: &str = "EVENTS_AMQP_URL";

/// The URL used when neither `--amqp` nor `EVENTS_AMQP_URL` is given.
const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

#[derive(Debug, Subcommand)]
pub(super) enum RabbitmqCommand {
    /// The exchange and a consuming service's partition queues: create, check
    #[command(subcommand)]
    Topology(TopologyCommand),
}

#[derive(Debug, Subcommand)]
pub(super) enum TopologyCommand {
    /// Declare the exchange, the consumer's partition queues (quorum queues with a delivery
    /// limit and a parking queue) and their bindings; running it again changes nothing
    Create(TopologyArgs),
    /// Check the exchanges and queues against these settings, changing nothing; fails naming
    /// what is missing or the setting that differs
    Check(TopologyArgs),
}

#[derive(Debug, Args)]
pub(super) struct TopologyArgs {
    /// The consuming service: its queues are CONSUMER (one partition) or CONSUMER.0 …
    consumer: String,
    /// RabbitMQ URL [env: EVENTS_AMQP_URL] [default: amqp://guest:guest@127.0.0.1:5672/%2f]
    #[arg(long, value_name = "URL")]
    amqp: Option<String>,
    /// The exchange the relay publishes to (the examples' `--stream`)
    #[arg(long, default_value = "EVENTS")]
    exchange: String,
    /// The partitions (the relay's)
    #[arg(long, value_name = "P", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(crate::transport::MAX_PARTITIONS)))]
    partitions: u32,
    /// The routing keys' first token (the relay's prefix)
    #[arg(long, value_name = "PREFIX", default_value = "events")]
    routing_key_prefix: String,
    /// What the queues take, as a topic pattern after the prefix (repeatable; default `#`)
    #[arg(long = "binding", value_name = "PATTERN")]
    bindings: Vec<String>,
    /// Deliveries of one message at most before the broker parks it
    #[arg(long, value_name = "N", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..))]
    delivery_limit: u32,
}

impl TopologyArgs {
    fn url(&self) -> String {
        self.amqp
            .clone()
            .or_else(|| std::env::var(AMQP_ENV).ok().filter(|u| !u.is_empty()))
            .unwrap_or_else(|| DEFAULT_AMQP_URL.to_owned())
    }

    fn topology(&self) -> BrokerTopology {
        let mut topology = BrokerTopology::new(&self.exchange, &self.consumer)
            .partitions(self.partitions)
            .routing_key_prefix(&self.routing_key_prefix)
            .delivery_limit(self.delivery_limit);
        if !self.bindings.is_empty() {
            topology = topology.bindings(self.bindings.clone());
        }
        topology
    }
}

pub(super) async fn run(command: RabbitmqCommand, io: &mut Io<'_>) -> Result<(), CliError> {
    let RabbitmqCommand::Topology(command) = command;
    let (args, create) = match command {
        TopologyCommand::Create(args) => (args, true),
        TopologyCommand::Check(args) => (args, false),
    };
    let url = args.url();
    let topology = args.topology();
    if create {
        topology
            .create(&url)
            .await
            .map_err(|e| CliError::Rabbitmq(Box::new(e)))?;
    } else {
        topology
            .check(&url)
            .await
            .map_err(|e| CliError::Rabbitmq(Box::new(e)))?;
    }
    let queues = topology.queues();
    let shown_queues = match queues.as_slice() {
        [one] => one.clone(),
        [first, .., last] => format!("{first} … {last}"),
        [] => String::new(),
    };
    writeln!(
        io.out,
        "{}: exchange `{}` at {}; {} quorum {} {shown_queues} (delivery limit {}, parking queue {} through {}), bound to {}",
        if create { "created" } else { "ok" },
        topology.exchange,
        redact_url(&url),
        queues.len(),
        if queues.len() == 1 { "queue" } else { "queues" },
        topology.delivery_limit,
        topology.parking_queue(),
        topology.dead_letter_exchange(),
        topology.binding_keys_shown().join(", "),
    )?;
    if !create {
        let parked = topology
            .parked(&url)
            .await
            .map_err(|e| CliError::Rabbitmq(Box::new(e)))?;
        if parked > 0 {
            writeln!(
                io.out,
                "parking queue {}: {parked} {} the broker gave up on after the delivery limit: no inbox receives {} until moved back (the management UI's shovel, or rabbitmqadmin)",
                topology.parking_queue(),
                if parked == 1 { "message" } else { "messages" },
                if parked == 1 { "it" } else { "them" },
            )?;
        } else {
            writeln!(io.out, "parking queue {}: empty", topology.parking_queue())?;
        }
        writeln!(
            io.out,
            "bindings are not checked (AMQP 0-9-1 cannot list them): run `topology create` to assert them"
        )?;
    }
    Ok(())
}

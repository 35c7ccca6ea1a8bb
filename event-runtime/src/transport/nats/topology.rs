//! The NATS relay and inbox in a [`Topology`]: their channels (subjects), and the headers the
//! relay sets, for the AsyncAPI document and the flow.

use serde_json::{json, Value};

use super::{InboxConfig, RelayConfig};
use crate::topology::{ReceiveRoute, SendRoute, Subjects, Topology, Transport};

/// NATS JetStream as the documents describe it.
const NATS: Transport = Transport {
    protocol: "nats",
    title: "NATS JetStream",
    container: "stream",
    headers,
};

/// The headers the relay sets on each message.
fn headers() -> Value {
    json!({
        "type": "object",
        "properties": {
            "Nats-Msg-Id": {
                "type": "string",
                "format": "uuid",
                "description": "The event id: JetStream drops a publish of the same id within \
                    the stream's duplicate window.",
            },
            "Content-Type": { "const": super::CONTENT_TYPE },
        },
        "required": ["Nats-Msg-Id", "Content-Type"],
    })
}

impl Topology {
    /// A NATS relay ([`NatsRelay`](crate::transport::nats::NatsRelay)) with this
    /// configuration: each event it publishes is a channel on its subject, with one send
    /// operation.
    pub fn nats_relay(mut self, config: &RelayConfig) -> Self {
        self.sends.push(SendRoute {
            transport: NATS,
            destination: config.name.clone(),
            stream: config.stream.clone(),
            subjects: nats_subjects(config),
            retry: config.retry,
            in_flight: config.in_flight,
        });
        self
    }

    /// A NATS inbox ([`NatsInbox`](crate::transport::nats::NatsInbox) or a
    /// [`NatsGroup`](crate::transport::nats::NatsGroup)) with this configuration, reading what
    /// a producer's relay configured as `producer` publishes (its subject prefix, subjects,
    /// partitions and events: the inbox's own configuration does not say which subject carries
    /// which event). It receives each registered event whose subject falls within its filter.
    pub fn nats_inbox(mut self, config: &InboxConfig, producer: &RelayConfig) -> Self {
        self.receives.push(ReceiveRoute {
            transport: NATS,
            inbox: format!("nats-inbox:{}", config.durable),
            stream: config.stream.clone(),
            durable: config.durable.clone(),
            filter: config.filter_subject.clone(),
            subjects: nats_subjects(producer),
            max_deliver: config.max_deliver,
            ack_wait: config.ack_wait,
        });
        self
    }
}

fn nats_subjects(config: &RelayConfig) -> Subjects {
    Subjects {
        prefix: config.subject_prefix.clone(),
        overrides: config
            .subjects
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        partitions: config.partitions,
        aggregate_token: config.aggregate_token,
        events: config.events.as_ref().map(|e| e.iter().cloned().collect()),
    }
}

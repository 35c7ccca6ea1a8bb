//! The RabbitMQ relay in a [`Topology`]: its channels (routing keys on the exchange) and the
//! AMQP properties it sets, for the AsyncAPI document and the flow.

use serde_json::{json, Value};

use super::RelayConfig;
use crate::topology::{SendRoute, Subjects, Topology, Transport};

/// RabbitMQ as the documents describe it.
const AMQP: Transport = Transport {
    protocol: "amqp",
    title: "RabbitMQ",
    container: "exchange",
    headers,
};

/// The AMQP properties the relay sets on each message (AMQP carries them beside the
/// application headers; AsyncAPI has one place for both).
fn headers() -> Value {
    json!({
        "type": "object",
        "properties": {
            "message-id": {
                "type": "string",
                "format": "uuid",
                "description": "The event id (the AMQP message-id property): the consumer's \
                    inbox drops a second copy by it.",
            },
            "content-type": { "const": super::CONTENT_TYPE },
            "delivery-mode": { "const": 2, "description": "Persistent." },
        },
        "required": ["message-id", "content-type", "delivery-mode"],
    })
}

impl Topology {
    /// A RabbitMQ relay ([`AmqpRelay`](super::AmqpRelay)) with this configuration: each event
    /// it publishes is a channel whose address is its routing key on the exchange, with one
    /// send operation. Name the broker with [`server`](Topology::server)`("rabbitmq",
    /// "amqp://host:5672")`.
    pub fn amqp_relay(mut self, config: &RelayConfig) -> Self {
        self.sends.push(SendRoute {
            transport: AMQP,
            destination: config.name.clone(),
            stream: config.exchange.clone(),
            subjects: Subjects {
                prefix: config.routing_key_prefix.clone(),
                overrides: config
                    .routing_keys
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                partitions: config.partitions,
                aggregate_token: false,
                events: config.events.as_ref().map(|e| e.iter().cloned().collect()),
            },
            retry: config.retry,
            in_flight: config.in_flight,
        });
        self
    }
}

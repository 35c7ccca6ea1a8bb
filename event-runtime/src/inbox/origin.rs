//! Where a received message came from, in terms every transport has: the transport, the
//! stream or queue, the message's position in it, how often it was delivered, and whatever
//! else the transport reports (a subject, a routing key, a partition).

use std::collections::BTreeMap;

/// Where a received message came from: stored as JSON with every event an inbox commits
/// ([`Store::received_origin`](crate::Store::received_origin)) and with every dead letter an
/// inbox writes ([`DeadLetter::origin`](crate::DeadLetter::origin)).
///
/// ```
/// use event_runtime::inbox::Origin;
///
/// let origin = Origin::new("nats", "ORDERS", 42)
///     .delivery_count(2)
///     .attribute("subject", "orders.order.placed");
/// assert_eq!(origin.position, 42);
/// assert_eq!(origin.attributes["subject"], "orders.order.placed");
/// ```
///
/// # Reading older rows
/// Dead letters written before this type existed carry NATS broker metadata
/// (`{"stream", "stream_sequence", "delivery_count", "subject"}`); they read as an origin of
/// transport `nats`, the stream as [`source`](Self::source), the stream sequence as
/// [`position`](Self::position) and the subject as attribute `subject`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(from = "StoredOrigin")]
#[non_exhaustive]
pub struct Origin {
    /// The transport that received it: `nats`, `rabbitmq`, `kafka`…
    pub transport: String,
    /// The stream, queue or topic it was read from (a NATS JetStream stream name).
    pub source: String,
    /// Its position in [`source`](Self::source), as the broker numbers it (a JetStream
    /// stream sequence, a Kafka offset); 0 when the transport has none.
    pub position: u64,
    /// How many times the broker had delivered it, this delivery included (1 the first time).
    pub delivery_count: u64,
    /// What else the transport reports about it, by name (NATS: `subject`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
}

impl Origin {
    /// A message at `position` of `source`, received through `transport`, delivered once.
    pub fn new(transport: impl Into<String>, source: impl Into<String>, position: u64) -> Self {
        Origin {
            transport: transport.into(),
            source: source.into(),
            position,
            delivery_count: 1,
            attributes: BTreeMap::new(),
        }
    }

    /// How many times the broker had delivered it (at least 1).
    #[must_use]
    pub fn delivery_count(mut self, count: u64) -> Self {
        self.delivery_count = count.max(1);
        self
    }

    /// Adds an attribute the transport reports (`subject`, `routing_key`, `partition`…).
    #[must_use]
    pub fn attribute(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.attributes.insert(name.into(), value.into());
        self
    }

    /// `nats ORDERS #42 (delivered 2 times; subject orders.order.placed)`, for messages; the
    /// position is left out when it is 0 (a transport that numbers nothing: a RabbitMQ
    /// queue).
    pub fn describe(&self) -> String {
        let mut out = format!("{} {}", self.transport, self.source);
        if self.position > 0 {
            out.push_str(&format!(" #{}", self.position));
        }
        let times = if self.delivery_count == 1 {
            "time"
        } else {
            "times"
        };
        out.push_str(&format!(" (delivered {} {times}", self.delivery_count));
        for (k, v) in &self.attributes {
            out.push_str(&format!("; {k} {v}"));
        }
        out.push(')');
        out
    }
}

/// The shapes an origin has been stored in: today's, and the NATS broker metadata that inbox
/// dead letters carried before.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum StoredOrigin {
    Current {
        transport: String,
        source: String,
        #[serde(default)]
        position: u64,
        #[serde(default = "one")]
        delivery_count: u64,
        #[serde(default)]
        attributes: BTreeMap<String, String>,
    },
    NatsBroker {
        stream: String,
        stream_sequence: u64,
        delivery_count: u64,
        subject: String,
    },
}

fn one() -> u64 {
    1
}

impl From<StoredOrigin> for Origin {
    fn from(s: StoredOrigin) -> Self {
        match s {
            StoredOrigin::Current {
                transport,
                source,
                position,
                delivery_count,
                attributes,
            } => Origin {
                transport,
                source,
                position,
                delivery_count,
                attributes,
            },
            StoredOrigin::NatsBroker {
                stream,
                stream_sequence,
                delivery_count,
                subject,
            } => Origin::new("nats", stream, stream_sequence)
                .delivery_count(delivery_count)
                .attribute("subject", subject),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_shapes() {
        let now = Origin::new("nats", "S", 7)
            .delivery_count(3)
            .attribute("subject", "a.b");
        let json = serde_json::to_string(&now).unwrap();
        assert_eq!(serde_json::from_str::<Origin>(&json).unwrap(), now);
        let old = r#"{"stream":"S","stream_sequence":7,"delivery_count":3,"subject":"a.b"}"#;
        assert_eq!(serde_json::from_str::<Origin>(old).unwrap(), now);
        assert!(serde_json::from_str::<Origin>(r#"{"nope":1}"#).is_err());
    }
}

//! The relay's configuration: which events leave the service, on which subjects, with which
//! retry policy and concurrency.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::super::subject_token;
use crate::RetryPolicy;

/// Which events the relay publishes, and on which subjects: [`RelayConfig::new`], changed
/// with one setter per field (`RelayConfig::new("EVENTS").subject_prefix("orders")`).
///
/// `#[non_exhaustive]`: fields are added in minor releases, so build it from
/// [`new`](Self::new) and the setters, never with a struct literal.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RelayConfig {
    /// The destination's name, stored with each delivery (default `nats:<stream>`): never
    /// change it while deliveries to it may be pending.
    pub name: String,
    /// The stream the subjects must land in, checked at start-up.
    pub stream: String,
    /// The first subject token(s) (default `events`): an event `order.placed` goes to
    /// `events.order.placed`.
    pub subject_prefix: String,
    /// Appends the aggregate id as a last subject token (`events.order.placed.A-17`), for
    /// consumers that filter per key. Characters a subject token cannot hold (`.`, `*`, `>`,
    /// white space) are written as `_`.
    pub aggregate_token: bool,
    /// The events that leave the service, by name; `None`: every registered event.
    pub events: Option<HashSet<String>>,
    /// A subject per event name instead of `<prefix>.<name>`.
    pub subjects: HashMap<String, String>,
    /// The relay's retry policy (default: 6 attempts, 1 s doubling to 30 s: with the time
    /// limits and a lease, a horizon of 107 s, inside NATS's default duplicate window of 2 min).
    /// Losing the connection uses no attempt.
    pub retry: RetryPolicy,
    /// How long to wait for the server to take and acknowledge one publish (default 5 s). A
    /// timeout is ambiguous (the server may have stored it): the retry reuses the message id.
    pub publish_timeout: Duration,
    /// Publishes in flight at once per worker process, each of another aggregate (default 64).
    pub in_flight: usize,
    /// The stream's partitions (default 1: no partition token). With P > 1 each event goes
    /// to the partition of its aggregate ([`partition_of`](super::super::partition_of) of the
    /// aggregate type and id), as a token after the subject's first one:
    /// `events.3.order.placed`. [`NatsRelay::check`](super::NatsRelay::check) refuses a stream with another count
    /// ([`StreamSpec::partitions`](super::super::StreamSpec::partitions)).
    pub partitions: u32,
}

impl RelayConfig {
    /// Every event to `events.<name>`, in `stream`.
    pub fn new(stream: impl Into<String>) -> Self {
        let stream = stream.into();
        RelayConfig {
            name: format!("nats:{stream}"),
            stream,
            subject_prefix: "events".into(),
            aggregate_token: false,
            events: None,
            subjects: HashMap::new(),
            retry: RetryPolicy {
                max_attempts: 6,
                initial_backoff: Duration::from_secs(1),
                max_backoff: Duration::from_secs(30),
            },
            publish_timeout: Duration::from_secs(5),
            in_flight: 64,
            partitions: 1,
        }
    }

    /// With [`name`](Self::name) set: the destination's name (never change it while
    /// deliveries to it may be pending).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// With [`subject_prefix`](Self::subject_prefix) set: the first subject token(s).
    pub fn subject_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.subject_prefix = prefix.into();
        self
    }

    /// With [`retry`](Self::retry) set: the relay's retry policy.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// With [`publish_timeout`](Self::publish_timeout) set.
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// With [`in_flight`](Self::in_flight) set: publishes in flight per worker process.
    pub fn in_flight(mut self, publishes: usize) -> Self {
        self.in_flight = publishes;
        self
    }

    /// With [`partitions`](Self::partitions) set: the stream's partitions.
    pub fn partitions(mut self, partitions: u32) -> Self {
        self.partitions = partitions;
        self
    }

    /// Only these events leave the service.
    pub fn only(mut self, names: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.events = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// Publishes the event `name` on `subject`.
    pub fn subject(mut self, name: impl Into<String>, subject: impl Into<String>) -> Self {
        self.subjects.insert(name.into(), subject.into());
        self
    }

    /// With the aggregate id as the last subject token.
    pub fn aggregate_token(mut self, on: bool) -> Self {
        self.aggregate_token = on;
        self
    }

    /// `<prefix>.<name>`, or the subject set for `name`.
    pub(super) fn base_subject(&self, name: &str) -> String {
        match self.subjects.get(name) {
            Some(s) => s.clone(),
            None => format!("{}.{name}", self.subject_prefix),
        }
    }

    /// The subject of an event `name` of the aggregate (`aggregate_type`, `aggregate_id`):
    /// `<prefix>.<name>`, or the subject set for `name`, with the partition token after its
    /// first token when partitioned, and the aggregate token last when asked for.
    pub fn subject_of(&self, name: &str, aggregate_type: &str, aggregate_id: &str) -> String {
        let mut s = self.base_subject(name);
        if self.partitions > 1 {
            let p = super::super::partition_of(aggregate_type, aggregate_id, self.partitions);
            s = super::super::partition::partitioned_subject(&s, p);
        }
        if self.aggregate_token {
            s.push('.');
            s.push_str(&subject_token(aggregate_id));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_and_filters() {
        let c = RelayConfig::new("EVENTS").subject("order.shipped", "ship.it");
        assert_eq!(
            c.subject_of("order.placed", "order", "A 1"),
            "events.order.placed"
        );
        assert_eq!(c.subject_of("order.shipped", "order", "A"), "ship.it");
        let c = c.aggregate_token(true);
        assert_eq!(
            c.subject_of("order.placed", "order", "A.1 *>"),
            "events.order.placed.A_1___"
        );
        let c = c.aggregate_token(false).partitions(8);
        let p = crate::transport::nats::partition_of("order", "A-17", 8);
        assert_eq!(
            c.subject_of("order.placed", "order", "A-17"),
            format!("events.{p}.order.placed")
        );
        assert_eq!(
            c.subject_of("order.shipped", "order", "A-17"),
            format!("ship.{p}.it")
        );
    }
}

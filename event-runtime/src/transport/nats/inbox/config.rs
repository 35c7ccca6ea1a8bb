//! The inbox's configuration, its report, and a fetched batch awaiting its acknowledgements.

use std::time::Duration;

use async_nats::jetstream::{self, AckKind};

use super::super::NatsError;
use crate::inbox::InboxReport;
use crate::telemetry::{self, Messaging, Operation};
use tracing::Instrument;

/// How the inbox consumes: its durable consumer and its batches. [`InboxConfig::new`], changed
/// with one setter per field (`InboxConfig::new("EVENTS", "billing").batch(256)`).
///
/// `#[non_exhaustive]`: fields are added in minor releases, so build it from
/// [`new`](Self::new) and the setters, never with a struct literal.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct InboxConfig {
    /// The stream to read.
    pub stream: String,
    /// The durable consumer's name: the inbox's identity on the server, and (as
    /// `nats-inbox:<durable>`) the handler name of its dead letters.
    pub durable: String,
    /// One subject filter (nats-server 2.9 takes one); `None`: the whole stream. It must
    /// take every subject the producer's relay publishes for the aggregate types this service
    /// consumes: each event names its predecessor, whatever its type, and an event filtered
    /// out is a gap that holds the aggregate's later events (see
    /// [the inbox core](crate::inbox#order-across-services)).
    pub filter_subject: Option<String>,
    /// Messages fetched and committed at once (default 64).
    pub batch: usize,
    /// How long one fetch waits for messages (default 1 s).
    pub fetch_wait: Duration,
    /// How long the server waits for the ack of a delivered message before redelivering it
    /// (default 30 s): comfortably above the time to commit one batch.
    pub ack_wait: Duration,
    /// Deliveries of one message at most (default 50). The server stops redelivering a message
    /// after that, so it is high: a message is acked as soon as its batch commits, and is
    /// redelivered only while the consuming database is unreachable.
    pub max_deliver: i64,
    /// Waits before each redelivery after an ack timeout (default none: `ack_wait` each). At
    /// most `max_deliver` entries. (A plain Nak redelivers at once: the backoff applies to ack
    /// timeouts only.)
    pub backoff: Vec<Duration>,
    /// Messages delivered and not acked at most (default: `batch`): the consumer never hands
    /// out more than one batch that this inbox has not settled.
    pub max_ack_pending: Option<i64>,
    /// Whether the consuming outbox may register `in_transaction` handlers (default `false`:
    /// [`NatsInbox::new`](super::NatsInbox::new) refuses them). Such a handler runs when a
    /// received event is committed — before a predecessor it waits for has arrived — so it
    /// sees the broker's delivery order, not the producer's. Allow it when they handle only
    /// this service's own events, or when order does not matter to them.
    pub allow_in_transaction_handlers: bool,
    /// The stream's partitions (default 1). [`NatsInbox::new`](super::NatsInbox::new)
    /// refuses a stream with another count
    /// ([`StreamSpec::partitions`](crate::transport::nats::StreamSpec::partitions)), so that
    /// an inbox never waits on subjects nobody publishes to. With P > 1 an inbox reads one
    /// [`partition`](Self::partition), its [`filter_subject`](Self::filter_subject) applied
    /// within it (`events.order.>` reads `events.3.order.>`): a JetStream consumer's filter
    /// must fall within one of the stream's subjects, and each partition is one. To read
    /// every partition, run a [`NatsGroup`](crate::transport::nats::NatsGroup) (of one
    /// instance, it consumes them all).
    pub partitions: u32,
    /// The one partition this inbox reads: required when [`partitions`](Self::partitions) is
    /// more than 1. A group of instances
    /// ([`NatsGroup`](crate::transport::nats::NatsGroup)) sets it for each partition it owns.
    pub partition: Option<u32>,
    /// Set by a group for the consumer of the stream from before its partitions (no
    /// partition token: the subjects as they were): its filter is used as it is, and the
    /// stream's count of partitions is not compared.
    pub(in crate::transport::nats) unpartitioned: bool,
}

impl InboxConfig {
    /// A durable consumer `durable` of `stream`, with the defaults above.
    pub fn new(stream: impl Into<String>, durable: impl Into<String>) -> Self {
        InboxConfig {
            stream: stream.into(),
            durable: durable.into(),
            filter_subject: None,
            batch: 64,
            fetch_wait: Duration::from_secs(1),
            ack_wait: Duration::from_secs(30),
            max_deliver: 50,
            backoff: Vec::new(),
            max_ack_pending: None,
            allow_in_transaction_handlers: false,
            partitions: 1,
            partition: None,
            unpartitioned: false,
        }
    }

    /// With [`partitions`](Self::partitions) set: the stream's partitions.
    pub fn partitions(mut self, partitions: u32) -> Self {
        self.partitions = partitions;
        self
    }

    /// With [`partition`](Self::partition) set: reads only this partition.
    pub fn partition(mut self, partition: u32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// The subject filter of the durable consumer: [`filter_subject`](Self::filter_subject)
    /// within the partition(s) read (`None`: the whole stream).
    pub fn effective_filter(&self) -> Option<String> {
        if self.unpartitioned {
            return self.filter_subject.clone();
        }
        super::super::partition::partition_filter(
            self.filter_subject.as_deref(),
            self.partitions,
            self.partition,
        )
    }

    /// With [`allow_in_transaction_handlers`](Self::allow_in_transaction_handlers) set.
    pub fn allow_in_transaction_handlers(mut self, allow: bool) -> Self {
        self.allow_in_transaction_handlers = allow;
        self
    }

    /// With [`filter_subject`](Self::filter_subject) set: the one subject filter.
    pub fn filter_subject(mut self, filter: impl Into<String>) -> Self {
        self.filter_subject = Some(filter.into());
        self
    }

    /// With [`batch`](Self::batch) set: messages fetched and committed at once.
    pub fn batch(mut self, messages: usize) -> Self {
        self.batch = messages;
        self
    }

    /// With [`fetch_wait`](Self::fetch_wait) set.
    pub fn fetch_wait(mut self, wait: Duration) -> Self {
        self.fetch_wait = wait;
        self
    }

    /// With [`ack_wait`](Self::ack_wait) set.
    pub fn ack_wait(mut self, wait: Duration) -> Self {
        self.ack_wait = wait;
        self
    }

    /// With [`max_deliver`](Self::max_deliver) set.
    pub fn max_deliver(mut self, deliveries: i64) -> Self {
        self.max_deliver = deliveries;
        self
    }

    /// With [`backoff`](Self::backoff) set: waits before each redelivery after an ack
    /// time-out.
    pub fn backoff(mut self, waits: Vec<Duration>) -> Self {
        self.backoff = waits;
        self
    }

    /// With [`max_ack_pending`](Self::max_ack_pending) set.
    pub fn max_ack_pending(mut self, messages: i64) -> Self {
        self.max_ack_pending = Some(messages);
        self
    }

    /// The longest a message can be redelivered after its first delivery: the consuming
    /// outbox must remember its event id that long.
    pub fn redelivery_horizon(&self) -> Duration {
        let n = self.max_deliver.max(1) as usize;
        if self.backoff.is_empty() {
            return self.ack_wait * n as u32;
        }
        (0..n)
            .map(|i| self.backoff[i.min(self.backoff.len() - 1)])
            .sum::<Duration>()
            + self.ack_wait
    }

    pub(super) fn validate(&self) -> Result<(), NatsError> {
        let bad = |m: String| Err(NatsError::Config(m));
        if self.batch == 0 || self.fetch_wait.is_zero() || self.ack_wait.is_zero() {
            return bad("batch, fetch_wait and ack_wait must be positive".into());
        }
        if self.max_deliver <= 0 {
            return bad("max_deliver must be positive (an unlimited one has no redelivery horizon for the outbox to cover)".into());
        }
        if self.backoff.len() as i64 > self.max_deliver {
            return bad(format!(
                "backoff has {} entries, more than max_deliver ({})",
                self.backoff.len(),
                self.max_deliver
            ));
        }
        if self.max_ack_pending.is_some_and(|m| m < self.batch as i64) {
            return bad("max_ack_pending must be at least batch".into());
        }
        let most = super::super::MAX_PARTITIONS;
        if !(1..=most).contains(&self.partitions) {
            return bad(format!(
                "partitions must be 1 to {most}, not {}",
                self.partitions
            ));
        }
        if let Some(p) = self.partition.filter(|&p| p >= self.partitions) {
            return bad(format!(
                "partition {p} does not exist: the stream has {} (0 to {})",
                self.partitions,
                self.partitions - 1
            ));
        }
        Ok(())
    }
}

/// A fetched batch committed into the outbox, not yet acknowledged. [`ack`](Self::ack) it;
/// dropped instead, its messages are redelivered after `ack_wait` and skipped as duplicates.
#[derive(Debug)]
#[must_use = "a received batch is redelivered unless acked"]
pub struct ReceivedBatch {
    pub(super) accepted: Vec<jetstream::Message>,
    pub(super) poison: Vec<jetstream::Message>,
    pub(super) report: InboxReport,
    /// The stream and durable consumer, for the settle span.
    pub(super) stream: String,
    pub(super) durable: String,
}

impl ReceivedBatch {
    /// What was committed.
    pub fn report(&self) -> InboxReport {
        self.report
    }

    /// Acknowledges every committed message and terminates every dead-lettered one, each
    /// confirmed by the server (double ack).
    ///
    /// # Cancel safety
    /// Cancel safe: a message whose ack was not confirmed is redelivered and skipped.
    pub async fn ack(self) -> InboxReport {
        // `settle {stream}` of the messaging conventions (CLIENT), linked to each message's
        // creation context.
        let span = tracing::info_span!(
            "settle",
            stream = %self.stream,
            consumer = %self.durable,
            messages = self.accepted.len() + self.poison.len(),
            otel.name = tracing::field::Empty,
            otel.kind = tracing::field::Empty,
        );
        telemetry::describe(
            &span,
            Messaging::new(Operation::Settle, telemetry::SYSTEM_NATS, &self.stream)
                .group(&self.durable)
                .batch(self.accepted.len() + self.poison.len()),
            None,
            false,
        );
        let all = self.accepted.iter().chain(&self.poison);
        telemetry::link_each(&span, all.map(|m| &m.payload[..]));
        let report = self.settle().instrument(span.clone()).await;
        if report.ack_failed > 0 {
            telemetry::failed(&span, "ack_unconfirmed");
        }
        report
    }

    async fn settle(self) -> InboxReport {
        let mut report = self.report;
        let acks = self.accepted.iter().map(|m| m.double_ack());
        let terms = self.poison.iter().map(|m| m.double_ack_with(AckKind::Term));
        let mut first_failure = None;
        for r in futures_util::future::join_all(acks).await {
            match r {
                Ok(()) => report.acked += 1,
                Err(e) => {
                    report.ack_failed += 1;
                    first_failure.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_failure {
            // One line a batch: a lost connection fails every ack of it.
            tracing::warn!(error = %e, unconfirmed = report.ack_failed, "inbox acks not confirmed: those messages will be redelivered and skipped as duplicates");
        }
        metrics::counter!("events_nats_acked_total").increment(report.acked as u64);
        let terminated = futures_util::future::join_all(terms).await;
        let ok = terminated.iter().filter(|r| r.is_ok()).count();
        metrics::counter!("events_nats_terminated_total").increment(ok as u64);
        report.ack_failed += terminated.len() - ok;
        report
    }
}

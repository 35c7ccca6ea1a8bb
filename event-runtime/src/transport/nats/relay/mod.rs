//! The relay: a [`Destination`] of the delivery engine that publishes each routed event to
//! JetStream and completes its delivery on the publish acknowledgement. It must not order,
//! retry or batch on its own: the engine does (one delivery at a time per aggregate,
//! concurrently across aggregates, backoff, pauses, dead letters).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::connection::State;
use async_nats::jetstream::{self, context::PublishErrorKind, message::PublishMessage};
use async_trait::async_trait;
use event_core::{EventDescriptor, HandlerError};
use tracing::Instrument;

mod config;

pub use config::RelayConfig;

use super::cluster::{Health, LeaderSeen};
use super::stream::{subject_matches, StreamShape};
use super::{header_bytes, NatsError, CONTENT_TYPE};
use crate::outbox::destination::Target;
use crate::telemetry::{self, Messaging, Operation};
use crate::{Delivery, DeliveryError, Destination, Outbox, RetryPolicy, Routing};

/// The NATS JetStream relay: add it to the outbox with
/// [`OutboxBuilder::destination`](crate::OutboxBuilder::destination), then call
/// [`check`](Self::check) once the outbox is built; until then it delivers nothing (its
/// deliveries wait, paused).
///
/// Each delivery is published as a CloudEvents structured-mode message (CloudEvents NATS
/// protocol binding 1.0, §3.1: the body is the envelope JSON as committed, header
/// `Content-Type: application/cloudevents+json`) with `Nats-Msg-Id` = the event id, so that
/// the stream drops a re-publish inside its duplicate window (NATS docs, *JetStream model
/// deep dive*, message deduplication). The delivery completes on the publish ack; a
/// duplicate ack is a success. Losing the connection pauses the destination
/// ([`DeliveryError::Unavailable`]) until the client is connected again: no attempt is
/// burnt. The same holds while the stream is missing (deleted, or not created yet: no stream
/// captures the subject) or has no leader (a clustered stream electing one), or while its
/// leader hears from fewer than a majority of its replicas (a clustered stream that lost its
/// quorum: for about ten seconds NATS still names a leader, which takes nothing): the relay is
/// paused, in the store for every worker process, and uses no attempt however long that
/// lasts; it resumes on its own once [`Destination::available`] finds the stream answering
/// with a quorum again, asked every second. On a cluster, a publish time-out is the broker's
/// too, and pauses the relay instead of using an attempt, when the publish went out on a
/// connection that was lost since (the client is on another server now), when the stream
/// changed its leader while it was in flight, or when one of the stream's replicas is
/// unreachable or catching up; the message is sent again with the same id, so the stream
/// keeps it once. The outage is logged when it starts, at most
/// once a minute while it lasts, and with its length when it ends. A message the server
/// refuses as too large is a permanent failure (dead letter); every other failure is retried
/// with [`RelayConfig::retry`]. Publish time-outs while connected (retried: ambiguous) are
/// counted in `events_nats_publish_failures_total{reason="timeout"}` and summarised in the log
/// at most once a minute.
///
/// Durability is the server's: by default it fsyncs every 2 minutes, so an acknowledged
/// message can be lost if every replica crashes at once; run the stream with replicas or the
/// server with `sync_interval: always` where that matters.
pub struct NatsRelay {
    client: async_nats::Client,
    js: jetstream::Context,
    config: RelayConfig,
    header_bytes: usize,
    checked: AtomicBool,
    timeouts: Mutex<TimeoutLog>,
    /// A subject of each routed event, as `check` found the stream capturing them.
    subjects: Mutex<Vec<String>>,
    /// The stream's leader as last seen, and since when it was seen so.
    leader: Mutex<LeaderSeen>,
}

/// One publish as it was sent: on which connection, and when.
#[derive(Debug, Clone, Copy)]
struct Sent {
    /// The client's connections so far (`Statistics::connects`): a reconnect since means the
    /// publish went out on a connection that was lost.
    connects: u64,
    at: Instant,
}

/// Publish time-outs since the last log line about them.
#[derive(Debug)]
struct TimeoutLog {
    count: u64,
    since: Instant,
    logged: Option<Instant>,
}

/// How often publish time-outs are summarised in the log, at most.
const TIMEOUT_LOG_EVERY: Duration = Duration::from_secs(60);

/// How long the availability probe waits for the stream's info.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

impl std::fmt::Debug for NatsRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsRelay")
            .field("config", &self.config)
            .field("checked", &self.checked.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl NatsRelay {
    /// A relay over `client` (which reconnects on its own).
    ///
    /// # Panics
    /// Outside a Tokio runtime: its JetStream context spawns a task that collects publish
    /// acknowledgements.
    pub fn new(client: async_nats::Client, config: RelayConfig) -> Arc<NatsRelay> {
        let js = jetstream::context::ContextBuilder::new()
            .timeout(config.publish_timeout)
            .max_ack_inflight(config.in_flight.max(1) * 4)
            .build(client.clone());
        Arc::new(NatsRelay {
            client,
            js,
            header_bytes: header_bytes(),
            config,
            checked: AtomicBool::new(false),
            timeouts: Mutex::new(TimeoutLog {
                count: 0,
                since: Instant::now(),
                logged: None,
            }),
            subjects: Mutex::new(Vec::new()),
            leader: Mutex::new(LeaderSeen::default()),
        })
    }

    /// Its configuration.
    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    /// The bytes the relay's headers add to an envelope on the wire.
    pub fn header_bytes(&self) -> usize {
        self.header_bytes
    }

    /// The retry horizon the stream's duplicate window must cover: from the first publish of
    /// an event to its last re-publish — every backoff, every attempt's time limit, and one
    /// lease (a worker that died after the ack, before completing).
    pub fn horizon(&self, outbox: &Outbox) -> Duration {
        let inner = &outbox.inner;
        let (retry, timeout) = inner
            .destinations
            .get(&self.config.name)
            .map_or((self.config.retry, self.publish_time_limit()), |d| {
                (d.retry, d.timeout)
            });
        retry.horizon() + timeout * retry.max_attempts + inner.config.lease
    }

    fn publish_time_limit(&self) -> Duration {
        self.config.publish_timeout * 2 + Duration::from_secs(1)
    }

    /// Start-up check, required before the relay delivers: the stream exists and captures
    /// every subject the relay publishes to, its duplicate window covers the relay's retry
    /// horizon ([`horizon`](Self::horizon)), and the outbox's largest envelope plus the
    /// relay's headers fits both the server's `max_payload` (the client counts headers) and
    /// the stream's `max_msg_size` — so that an envelope too large for the broker is refused
    /// at commit ([`OutboxError::TooLarge`](crate::OutboxError::TooLarge)), before it is
    /// stored.
    ///
    /// # Errors
    /// [`NatsError::NotADestination`] when the outbox was built without this relay;
    /// [`NatsError::NoStream`]; [`NatsError::PartitionsMismatch`] when the stream has
    /// another count of partitions than [`RelayConfig::partitions`];
    /// [`NatsError::SubjectNotCaptured`];
    /// [`NatsError::DuplicateWindowTooShort`]; [`NatsError::EnvelopeTooLarge`];
    /// [`NatsError::Broker`] when the server cannot be asked.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; the relay stays unchecked until a call returns `Ok`.
    pub async fn check(&self, outbox: &Outbox) -> Result<StreamShape, NatsError> {
        let external = outbox.inner.destinations.get(&self.config.name);
        if !matches!(external.map(|d| &d.target), Some(Target::External(_))) {
            return Err(NatsError::NotADestination(self.config.name.clone()));
        }
        if outbox.config().source.is_none() {
            // Consumers key a received aggregate by (aggregate type, CloudEvents source): two
            // producers that both write the default source share one key, and their chains
            // (`prevsequence`) of one aggregate id interleave.
            tracing::warn!(
                relay = %self.config.name,
                source = event_core::DEFAULT_SOURCE,
                "the outbox's CloudEvents source is unset (OutboxConfig::source): consumers cannot tell this producer's aggregates from another's that leaves it unset too; set it to a URI naming this service"
            );
        }
        let shape = StreamShape::fetch(&self.js, &self.config.stream).await?;
        self.saw_leader(shape.leader.clone());
        if shape.partitions != self.config.partitions {
            return Err(NatsError::PartitionsMismatch {
                stream: shape.name.clone(),
                what: format!("the relay {}", self.config.name),
                configured: self.config.partitions,
                found: shape.partitions,
            });
        }
        let mut subjects = Vec::new();
        for event in outbox.dispatcher().registry().events() {
            if self.route(event).is_none() {
                continue;
            }
            // Every partition's subject (one when unpartitioned).
            for p in 0..self.config.partitions.max(1) {
                let mut subject = self.config.base_subject(event.name);
                if self.config.partitions > 1 {
                    subject = super::partition::partitioned_subject(&subject, p);
                }
                if self.config.aggregate_token {
                    subject.push_str(".x");
                }
                if !shape.subjects.iter().any(|f| subject_matches(f, &subject)) {
                    return Err(NatsError::SubjectNotCaptured {
                        subject,
                        stream: shape.name.clone(),
                    });
                }
                subjects.push(subject);
            }
        }
        *self.subjects.lock().unwrap_or_else(|e| e.into_inner()) = subjects;
        let horizon = self.horizon(outbox);
        if shape.duplicate_window < horizon {
            return Err(NatsError::DuplicateWindowTooShort {
                stream: shape.name.clone(),
                window: shape.duplicate_window,
                horizon,
            });
        }
        let envelope = outbox.config().max_envelope_bytes;
        let wire = envelope + self.header_bytes;
        let max_payload = self.client.server_info().max_payload;
        for (limit, what) in [
            (Some(max_payload), "the server's max_payload"),
            (
                shape.max_msg_size.map(|n| n as usize),
                "the stream's max_msg_size",
            ),
        ] {
            if let Some(limit) = limit.filter(|&l| wire > l) {
                return Err(NatsError::EnvelopeTooLarge {
                    envelope,
                    headers: self.header_bytes,
                    limit,
                    what,
                });
            }
        }
        match self.unpublished_before(outbox).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                relay = %self.config.name,
                events = n,
                "the outbox already holds {n}{} events this relay routes, committed before it was \
                 added: it never publishes them (only events committed from now on); to publish \
                 a job's events, run it on a fresh database with the relay configured",
                if n >= crate::store::UNROUTED_CAP { " or more" } else { "" }
            ),
            Err(e) => {
                tracing::debug!(relay = %self.config.name, error = %event_core::ErrorChain(&e), "could not look for events committed before the relay")
            }
        }
        self.checked.store(true, Ordering::Release);
        // The relay's counters exist from here on, at 0.
        crate::telemetry::catalog::register_zero(&[
            "events_nats_published_total",
            "events_nats_published_duplicates_total",
        ]);
        for reason in ["unavailable", "no_stream", "timeout", "too_large", "other"] {
            metrics::counter!("events_nats_publish_failures_total", "reason" => reason).absolute(0);
        }
        Ok(shape)
    }

    /// How many events the outbox holds that this relay routes but was never given: committed
    /// before the relay was added to the outbox (nothing writes their deliveries later), so
    /// never published. 0 as soon as the relay has a delivery row of any state. Counts events
    /// recorded within the outbox's retention (older completed deliveries may be purged), up
    /// to 10,000. [`check`](Self::check) logs a warning when there are any.
    ///
    /// # Errors
    /// [`NatsError::Store`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn unpublished_before(&self, outbox: &Outbox) -> Result<u64, NatsError> {
        let names: Vec<&str> = outbox
            .dispatcher()
            .registry()
            .events()
            .iter()
            .filter(|e| self.route(e).is_some())
            .map(|e| e.name)
            .collect();
        let retention = i64::try_from(outbox.config().retention.as_millis()).unwrap_or(i64::MAX);
        let since = outbox.clock().now_ms().saturating_sub(retention);
        Ok(outbox
            .store()
            .unrouted_events(&self.config.name, &names, since)
            .await?
            .unwrap_or(0))
    }

    fn connected(&self) -> bool {
        self.client.connection_state() == State::Connected
    }

    fn connects(&self) -> u64 {
        self.client.statistics().connects.load(Ordering::Relaxed)
    }

    /// Records the stream's leader as a probe found it.
    fn saw_leader(&self, leader: Option<String>) {
        self.leader.lock().unwrap_or_else(|e| e.into_inner()).saw(
            leader,
            &self.config.name,
            &self.config.stream,
        );
    }

    /// Why a publish `sent` then may have been lost to a change of the stream's leader.
    fn within_election(&self, sent: Sent) -> Option<String> {
        self.leader
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .within_election(sent.at, self.config.publish_timeout, &self.config.stream)
    }

    /// Paused because the client is not connected (or the publish's connection was lost):
    /// counted as `unavailable`.
    fn unavailable(&self, why: impl std::fmt::Display) -> DeliveryError {
        self.paused("unavailable", why)
    }

    /// Paused because the stream cannot take anything now (missing, no leader, no quorum, an
    /// election or an absent replica behind a time-out): counted as `no_stream`.
    fn stream_unavailable(&self, why: impl std::fmt::Display) -> DeliveryError {
        self.paused("no_stream", why)
    }

    /// The relay paused (no attempt used), asked again in a second; counted under `reason`.
    fn paused(&self, reason: &'static str, why: impl std::fmt::Display) -> DeliveryError {
        metrics::counter!("events_nats_publish_failures_total", "reason" => reason).increment(1);
        DeliveryError::Unavailable {
            reason: format!("NATS relay {}: {why}", self.config.name),
            retry_after: Duration::from_secs(1),
        }
    }

    fn failed(
        &self,
        reason: &'static str,
        error: async_nats::Error,
        permanent: bool,
    ) -> DeliveryError {
        metrics::counter!("events_nats_publish_failures_total", "reason" => reason).increment(1);
        DeliveryError::Failed(if permanent {
            HandlerError::permanent(error)
        } else {
            HandlerError::transient(error)
        })
    }

    async fn publish(&self, d: &Delivery<'_>, subject: String) -> Result<(), DeliveryError> {
        if !self.checked.load(Ordering::Acquire) {
            return Err(self.unavailable("not checked yet (call NatsRelay::check)"));
        }
        if !self.connected() {
            return Err(self.unavailable("not connected"));
        }
        // The envelope with the aggregate's chain (`prevsequence`): what the consumer's
        // inbox orders by.
        let body = d.wire_envelope();
        let wire = body.len() + self.header_bytes;
        let max_payload = self.client.server_info().max_payload;
        if wire > max_payload {
            // Never sent: the server would close the connection on it.
            return Err(self.failed(
                "too_large",
                format!(
                    "{wire} bytes with headers, over the server's max_payload of {max_payload}"
                )
                .into(),
                true,
            ));
        }
        let message = PublishMessage::build()
            .payload(bytes::Bytes::copy_from_slice(body.as_bytes()))
            .message_id(d.event_id.to_string())
            .header("Content-Type", CONTENT_TYPE);
        let sent = Sent {
            connects: self.connects(),
            at: Instant::now(),
        };
        let ack = match self.js.send_publish(subject.clone(), message).await {
            Ok(future) => future.await,
            Err(e) => Err(e),
        };
        match ack {
            Ok(ack) => {
                self.summarise_timeouts(false);
                if ack.duplicate {
                    metrics::counter!("events_nats_published_duplicates_total").increment(1);
                }
                metrics::counter!("events_nats_published_total").increment(1);
                Ok(())
            }
            Err(e) => Err(self.classify(e, &subject, sent).await),
        }
    }

    /// Whether the stream answers with a leader that hears from a majority of its replicas
    /// (a clustered stream's quorum: see [`cluster`](super::cluster)), and still captures the
    /// subjects [`check`](Self::check) found it capturing: `Err` says why not.
    async fn stream_ready(&self) -> Result<Health, String> {
        let name = &self.config.stream;
        // Within the delivery's time limit: a publish time-out and this probe together stay
        // below `publish_timeout * 2 + 1 s`.
        let limit = PROBE_TIMEOUT.min(self.config.publish_timeout);
        let stream = tokio::time::timeout(limit, self.js.get_stream(name))
            .await
            .map_err(|_| {
                format!("stream `{name}` did not answer within {limit:?} (no leader: a cluster electing one, or without its quorum?)")
            })?
            .map_err(|e| match e.kind() {
                jetstream::context::GetStreamErrorKind::JetStream(j)
                    if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND =>
                {
                    format!("stream `{name}` does not exist")
                }
                _ => format!("stream `{name}` does not answer: {e}"),
            })?;
        let info = stream.cached_info();
        let health = Health::of(info);
        self.saw_leader(health.leader.clone());
        if let Some(why) = health.unavailable(name) {
            return Err(why);
        }
        let subjects = self.subjects.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(lost) = subjects
            .iter()
            .find(|s| !info.config.subjects.iter().any(|f| subject_matches(f, s)))
        {
            return Err(format!("stream `{name}` no longer captures `{lost}`"));
        }
        Ok(health)
    }

    /// Counts a publish time-out; logs them at most once a minute.
    fn summarise_timeouts(&self, one_more: bool) {
        let mut t = self.timeouts.lock().unwrap_or_else(|e| e.into_inner());
        if one_more {
            if t.count == 0 {
                t.since = Instant::now();
            }
            t.count += 1;
        }
        if t.count == 0 || t.logged.is_some_and(|at| at.elapsed() < TIMEOUT_LOG_EVERY) {
            return;
        }
        tracing::warn!(
            relay = %self.config.name,
            timeouts = t.count,
            over_s = t.since.elapsed().as_secs(),
            "NATS relay {}: {} publish time-out(s) in the last {} s while connected (retried with the same message id)",
            self.config.name,
            t.count,
            t.since.elapsed().as_secs()
        );
        t.logged = Some(Instant::now());
        t.count = 0;
    }

    async fn classify(
        &self,
        e: jetstream::context::PublishError,
        subject: &str,
        sent: Sent,
    ) -> DeliveryError {
        match e.kind() {
            // No responders on the subject: no stream captures it (deleted, or not created
            // yet), or a clustered stream has no leader to take it (electing one). The probe
            // says which. Waited for, never dead-lettered.
            PublishErrorKind::StreamNotFound => match self.stream_ready().await {
                Err(why) => self.stream_unavailable(why),
                Ok(_) => self.stream_unavailable(format!(
                    "no stream captures `{subject}` (stream `{}` missing?)",
                    self.config.stream
                )),
            },
            PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe if !self.connected() => {
                self.unavailable(e)
            }
            // Sent on a connection that was lost since (the server it went to died; the
            // client is on another now): the broker's fault, not the message's.
            PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe
                if self.connects() != sent.connects =>
            {
                self.unavailable(format!(
                    "the connection the publish went out on was lost ({e})"
                ))
            }
            // Connected, and the stream does not answer (no leader, or gone) or changed its
            // leader while the publish was in flight (a clustered stream's election): paused,
            // not retried. Otherwise an ambiguous time-out: retried with the same message id.
            PublishErrorKind::TimedOut => {
                let why = match self.stream_ready().await {
                    Err(why) => Some(why),
                    Ok(health) => self
                        .within_election(sent)
                        .or_else(|| health.degraded(&self.config.stream)),
                };
                match why {
                    Some(why) => self.stream_unavailable(why),
                    None => {
                        self.summarise_timeouts(true);
                        self.failed("timeout", e.into(), false)
                    }
                }
            }
            PublishErrorKind::Other => {
                let code = std::error::Error::source(&e)
                    .and_then(|s| s.downcast_ref::<jetstream::Error>())
                    .map(|j| j.error_code());
                let too_large = code.is_some_and(|c| {
                    c == jetstream::ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM
                        || c == jetstream::ErrorCode::STREAM_HEADER_EXCEEDS_MAXIMUM
                });
                // The cluster answering that it cannot take the message now (no quorum, no
                // leader, a peer catching up): the broker's state, waited for.
                let cluster = code.is_some_and(|c| {
                    [
                        jetstream::ErrorCode::CLUSTER_NOT_AVAILABLE,
                        jetstream::ErrorCode::CLUSTER_NOT_ACTIVE,
                        jetstream::ErrorCode::CLUSTER_NOT_LEADER,
                        jetstream::ErrorCode::CLUSTER_NO_PEERS,
                        jetstream::ErrorCode::CLUSTER_INCOMPLETE,
                    ]
                    .contains(&c)
                });
                if too_large {
                    self.failed("too_large", e.into(), true)
                } else if cluster {
                    self.stream_unavailable(format!("the cluster cannot take it now: {e}"))
                } else if !self.connected() {
                    self.unavailable(e)
                } else {
                    self.failed("other", e.into(), false)
                }
            }
            _ => self.failed("other", e.into(), false),
        }
    }
}

#[async_trait]
impl Destination for NatsRelay {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn route(&self, event: &EventDescriptor) -> Option<Routing> {
        let leaves = self
            .config
            .events
            .as_ref()
            .is_none_or(|names| names.contains(event.name));
        leaves.then_some(Routing { ordered: true })
    }

    async fn deliver(&self, d: &Delivery<'_>) -> Result<(), DeliveryError> {
        let subject = self
            .config
            .subject_of(d.name, d.aggregate_type, d.aggregate_id);
        // `send {subject}` of the messaging conventions (CLIENT: the creation context the
        // message carries is its create span's), linked to that context.
        let span = tracing::info_span!(
            "publish",
            event_id = %d.event_id,
            event = d.name,
            subject = %subject,
            attempt = d.attempt,
            otel.name = tracing::field::Empty,
            otel.kind = tracing::field::Empty,
        );
        telemetry::describe(
            &span,
            Messaging::new(Operation::Send, telemetry::SYSTEM_NATS, &subject).message(d.event_id),
            Some(d.envelope),
            false,
        );
        let gauge = metrics::gauge!("events_nats_in_flight");
        gauge.increment(1.0);
        let result = self.publish(d, subject).instrument(span.clone()).await;
        gauge.decrement(1.0);
        if let Err(e) = &result {
            telemetry::failed(&span, e.error_type());
        }
        result
    }

    /// Connected, and the stream answers with a leader.
    async fn available(&self) -> bool {
        self.connected() && self.stream_ready().await.is_ok()
    }

    fn retry_policy(&self) -> Option<RetryPolicy> {
        Some(self.config.retry)
    }

    fn timeout(&self) -> Option<Duration> {
        Some(self.publish_time_limit())
    }

    fn concurrency(&self) -> Option<usize> {
        Some(self.config.in_flight)
    }
}

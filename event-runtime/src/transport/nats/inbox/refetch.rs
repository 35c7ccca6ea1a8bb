//! Closing gaps from the stream: the part of the stream where a gap's missing event can be
//! is read again with a short-lived consumer of its own, and what belongs to the gaps'
//! aggregates is committed through the inbox core, as if just received.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use event_core::RawEnvelope;
use futures_util::StreamExt;

use super::super::NatsError;
use super::identity::{describe_observed, observe, same_time};
use super::incoming;
use crate::inbox::{Gap, InboxReport};
use crate::store::AuditEntry;
use crate::Outbox;

/// Messages read and committed at once.
const PAGE: usize = 256;

/// A re-fetch of open gaps from the stream an inbox consumes: see
/// [how the search is bounded](#how-the-search-is-bounded) for what it reads. Built with [`new`](Self::new) and the setters, run with
/// [`run`](Self::run) (or [`NatsInbox::refetch_gaps`](super::NatsInbox::refetch_gaps)).
#[derive(Debug, Clone)]
#[non_exhaustive]
///
/// # How the search is bounded
/// nats-server 2.9 cannot look a message up by its `Nats-Msg-Id`, and the relay's subjects
/// (`<prefix>.<event name>`) do not carry the aggregate, so the search reads a range of
/// stream sequences, filtered by the inbox consumer's subject filter:
/// - from the consumer's first unacknowledged message (its ack floor + 1; never before the
///   stream's first message): every message before it was acknowledged, which the inbox does
///   only after committing it or storing it as a dead letter here, so it is not missing
///   (start lower with [`Refetch::from`] for a message the server stopped redelivering after
///   `max_deliver`);
/// - up to the waiting event's own stream sequence (recorded with every received event by
///   the inbox core, [`Origin::position`](crate::inbox::Origin::position)): the producer's
///   relay publishes an event only after the broker acknowledged its predecessor, so the
///   predecessor sits before it;
/// - and at most [`Refetch::max_messages`] messages (default 100,000): a longer range is
///   read in part, said in [`RefetchReport::complete`].
///
/// A missing event not found there is not in the stream: the broker lost it (a wiped store),
/// its limits removed it, or the consumer's filter excludes it. Only the producer can send it
/// again: [`Store::republish`](crate::Store::republish), `events relay republish`.
pub struct Refetch {
    /// The stream the inbox consumes.
    pub stream: String,
    /// The inbox's durable consumer (its dead letters' handler is `nats-inbox:<durable>`).
    pub durable: String,
    /// The gaps to close, by id; `None`: every open gap.
    pub gaps: Option<Vec<i64>>,
    /// Read at most this many messages (default 100,000).
    pub max_messages: u64,
    /// Start reading at this stream sequence instead of the consumer's first unacknowledged
    /// message.
    pub from: Option<u64>,
}

/// What a re-fetch found for one gap.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefetchOutcome {
    /// The missing event was in the stream and is committed now: the gap closed (`arrived`),
    /// and the events held behind it are released (unless an earlier one is missing too: its
    /// own gap is reported after `gap_after`).
    Arrived,
    /// The missing event was in the stream, and this service dead-letters it (this dead
    /// letter id): replay it after a deploy that takes it, or purge it to accept the gap.
    DeadLettered(i64),
    /// Not in the part of the stream read: the broker no longer has it or never had it. Only
    /// the producer can send it again: the command to run there.
    NotFound {
        /// `events relay republish --destination nats:<stream> --aggregate <type> <id>`, to
        /// run against the producer's database.
        republish: String,
    },
    /// The waiting event was received from another stream or transport (named): this inbox's
    /// stream cannot have its predecessor.
    OtherSource(String),
    /// Closed meanwhile by something else (an operator's accept).
    Closed(String),
}

/// A gap and what its re-fetch found.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RefetchedGap {
    /// The gap, as it was when selected.
    pub gap: Gap,
    /// What was found.
    pub outcome: RefetchOutcome,
}

/// What [`Refetch::run`] did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RefetchReport {
    /// Its audit row (action `gap-refetch`, the selection with the range read, its count the
    /// events committed), finished; `None` when no selected gap was open (nothing was read).
    pub audit: Option<AuditEntry>,
    /// The stream read.
    pub stream: String,
    /// The stream sequences read (first, last); `None` when there was nothing to read.
    pub range: Option<(u64, u64)>,
    /// Messages read.
    pub read: u64,
    /// Whether the whole range was read (`false`: [`Refetch::from`] started it above the
    /// consumer's first unacknowledged message, [`Refetch::max_messages`] stopped it, or the
    /// server sent nothing three times in a row while it still counted messages for the
    /// reader; a [`RefetchOutcome::NotFound`] then means "not in the part read").
    pub complete: bool,
    /// What the inbox core did with the messages of the gaps' aggregates.
    pub committed: InboxReport,
    /// Each selected open gap, in id order, with what was found.
    pub gaps: Vec<RefetchedGap>,
}

impl Refetch {
    /// Every open gap, from the stream `stream` that the durable consumer `durable` consumes.
    pub fn new(stream: impl Into<String>, durable: impl Into<String>) -> Self {
        Refetch {
            stream: stream.into(),
            durable: durable.into(),
            gaps: None,
            max_messages: 100_000,
            from: None,
        }
    }

    /// Only the gaps `ids`.
    #[must_use]
    pub fn gaps(mut self, ids: impl Into<Vec<i64>>) -> Self {
        self.gaps = Some(ids.into());
        self
    }

    /// Read at most `n` messages (at least 1).
    #[must_use]
    pub fn max_messages(mut self, n: u64) -> Self {
        self.max_messages = n.max(1);
        self
    }

    /// Start at stream sequence `sequence`.
    #[must_use]
    pub fn from(mut self, sequence: u64) -> Self {
        self.from = Some(sequence.max(1));
        self
    }

    /// Reads the stream where the selected open gaps' missing events can be (see
    /// [`Refetch`]) and commits every message of the gaps' aggregates through the
    /// inbox core ([`Outbox::receive`], as the inbox `nats-inbox:<durable>`; an event the
    /// outbox holds is skipped), in pages of 256 messages, each its own commit; then reports
    /// per gap what was found. Audited: one row (action `gap-refetch`, `actor`, `reason`, the
    /// gaps and the range as its selection, its count the events committed). The durable
    /// consumer is not touched: a message committed here and delivered to it later is a
    /// duplicate there.
    ///
    /// Resumable: interrupted, what was committed stays, gaps it closed are no longer open,
    /// and running it again reads the range again for the rest.
    ///
    /// # Errors
    /// [`NatsError::IdentityChanged`] when the stream or the consumer is not the one the
    /// inbox recorded (a wiped broker: adopt it first, and re-publish from the producer);
    /// [`NatsError::NoStream`]; [`NatsError::Config`] when the stream has no such durable
    /// consumer; [`NatsError::Broker`] when the server fails; [`NatsError::Store`] and
    /// [`NatsError::Outbox`] when the consuming store fails (pages committed before stay).
    ///
    /// # Cancel safety
    /// Cancel safe as far as the store goes: each page commits or not; dropped, the audit row
    /// stays unfinished and the reading consumer expires on the server after 30 s.
    pub async fn run(
        &self,
        js: &jetstream::Context,
        outbox: &Outbox,
        actor: &str,
        reason: &str,
    ) -> Result<RefetchReport, NatsError> {
        let name = format!("nats-inbox:{}", self.durable);
        let mut report = RefetchReport {
            audit: None,
            stream: self.stream.clone(),
            range: None,
            read: 0,
            complete: true,
            committed: InboxReport::default(),
            gaps: Vec::new(),
        };
        let open: Vec<Gap> = outbox
            .gaps(false)
            .await?
            .into_iter()
            .filter(|g| self.gaps.as_ref().is_none_or(|ids| ids.contains(&g.id)))
            .collect();
        if open.is_empty() {
            return Ok(report);
        }
        let (floor, first, filter, last) = self.consumer_state(js, outbox, &name).await?;
        // Where each gap's waiting event was read: the missing one is before it.
        let store = outbox.store().backend();
        let mut wanted: HashMap<(String, String), u64> = HashMap::new();
        let mut other: HashMap<i64, String> = HashMap::new();
        let mut to = 0;
        for g in &open {
            let origin = store.received_origin(g.waiting_event_id).await?;
            match origin {
                Some(o) if o.transport == "nats" && o.source == self.stream => {
                    let end = if o.position == 0 {
                        last
                    } else {
                        o.position - 1
                    };
                    to = to.max(end.min(last));
                    let w = wanted
                        .entry((g.aggregate_type.clone(), g.aggregate_id.clone()))
                        .or_default();
                    *w = (*w).max(g.waiting_sequence);
                }
                Some(o) if o.transport == "rabbitmq" => {
                    other.insert(
                        g.id,
                        format!(
                            "rabbitmq queue {} (a queue keeps nothing it delivered: nothing can be read again; re-publish from the producer with `events relay republish`, or accept the gap)",
                            o.source
                        ),
                    );
                }
                Some(o) => {
                    other.insert(g.id, format!("{} {}", o.transport, o.source));
                }
                None => {
                    other.insert(g.id, "no recorded origin".into());
                }
            }
        }
        let unacknowledged = (floor + 1).max(first);
        let from = self.from.map_or(unacknowledged, |f| f.max(first));
        // Started above the first unacknowledged message: what lies below was not read.
        report.complete = from <= unacknowledged;
        let selection = serde_json::json!({
            "gaps": self.gaps, "stream": self.stream, "durable": self.durable,
            "from": from, "to": to, "max_messages": self.max_messages,
        })
        .to_string();
        let log = outbox.store().logging()?;
        let stamp = crate::store::AuditStamp::now(actor, reason);
        let audit = log
            .start_audit("gap-refetch", Some(&selection), &stamp)
            .await?;
        if !wanted.is_empty() && from <= to {
            report.range = Some((from, to));
            self.read(
                js,
                outbox,
                &name,
                audit.id,
                (from, to),
                &filter,
                &wanted,
                &mut report,
            )
            .await?;
        }
        report.audit = Some(
            log.finish_operation(audit.id, crate::store::now_ms())
                .await?,
        );
        let now: HashMap<i64, Gap> = outbox
            .gaps(true)
            .await?
            .into_iter()
            .filter(|g| open.iter().any(|o| o.id == g.id))
            .map(|g| (g.id, g))
            .collect();
        for g in open {
            let outcome = if let Some(source) = other.remove(&g.id) {
                RefetchOutcome::OtherSource(source)
            } else {
                match now.get(&g.id) {
                    Some(n) if n.closed_at.is_some() => match n.resolution.as_deref() {
                        Some("arrived") => RefetchOutcome::Arrived,
                        r => RefetchOutcome::Closed(r.unwrap_or("closed").to_owned()),
                    },
                    Some(Gap {
                        dead_letter_id: Some(id),
                        ..
                    }) => RefetchOutcome::DeadLettered(*id),
                    _ => RefetchOutcome::NotFound {
                        republish: republish_command(&self.stream, &g),
                    },
                }
            };
            report.gaps.push(RefetchedGap { gap: g, outcome });
        }
        Ok(report)
    }

    /// The durable consumer's ack floor and subject filter, and the stream's first and last
    /// sequences, after checking that they are what the inbox recorded.
    async fn consumer_state(
        &self,
        js: &jetstream::Context,
        outbox: &Outbox,
        name: &str,
    ) -> Result<(u64, u64, String, u64), NatsError> {
        let observed = observe(js, &self.stream, &self.durable).await?;
        let recorded = outbox.store().inbox_identity(name).await?;
        if let Some(r) = &recorded {
            let same = r.stream == self.stream
                && same_time(&r.stream_created, &observed.stream_created)
                && match (&r.consumer_created, &observed.consumer) {
                    (Some(want), Some((have, _))) => same_time(want, have),
                    (None, _) => true,
                    (Some(_), None) => false,
                };
            if !same {
                return Err(NatsError::IdentityChanged {
                    inbox: name.to_owned(),
                    recorded: r.describe(),
                    found: describe_observed(&self.stream, &self.durable, &observed),
                });
            }
        }
        let Some((_, floor)) = observed.consumer else {
            return Err(NatsError::Config(format!(
                "stream `{}` has no consumer `{}`: nothing tells where its unacknowledged messages start",
                self.stream, self.durable
            )));
        };
        let mut stream = js
            .get_stream(&self.stream)
            .await
            .map_err(NatsError::broker("get stream"))?;
        let filter = stream
            .consumer_info(&self.durable)
            .await
            .map_err(NatsError::broker("consumer info"))?
            .config
            .filter_subject
            .clone();
        let last = stream
            .info()
            .await
            .map_err(NatsError::broker("stream info"))?
            .state
            .last_sequence;
        Ok((floor, observed.first_sequence, filter, last))
    }

    /// Reads `range` with a consumer of its own (no acks, expiring when left) and commits the
    /// messages of the `wanted` aggregates (received key, id: below that sequence) page by
    /// page.
    #[allow(clippy::too_many_arguments)]
    async fn read(
        &self,
        js: &jetstream::Context,
        outbox: &Outbox,
        name: &str,
        audit_id: i64,
        (from, to): (u64, u64),
        filter: &str,
        wanted: &HashMap<(String, String), u64>,
        report: &mut RefetchReport,
    ) -> Result<(), NatsError> {
        let stream = js
            .get_stream(&self.stream)
            .await
            .map_err(NatsError::broker("get stream"))?;
        let mut reader = stream
            .create_consumer(pull::Config {
                deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: from,
                },
                ack_policy: jetstream::consumer::AckPolicy::None,
                filter_subject: filter.to_owned(),
                inactive_threshold: Duration::from_secs(30),
                description: Some(format!("events: re-fetch of gaps for {name}")),
                ..Default::default()
            })
            .await
            .map_err(NatsError::broker("create consumer"))?;
        let reader_name = reader.cached_info().name.clone();
        let mut seen: HashSet<String> = HashSet::new();
        let mut empty = 0;
        let result = async {
            'pages: loop {
                let want = (self.max_messages - report.read).min(PAGE as u64) as usize;
                if want == 0 {
                    report.complete = false;
                    break;
                }
                let mut batch = reader
                    .batch()
                    .max_messages(want)
                    .expires(Duration::from_secs(1))
                    .messages()
                    .await
                    .map_err(NatsError::broker("fetch"))?;
                let mut page = Vec::new();
                let mut got = 0;
                let mut done = false;
                while let Some(m) = batch.next().await {
                    let m = m.map_err(|e| NatsError::Broker("fetch", e))?;
                    let Ok(info) = m.info() else { continue };
                    let sequence = info.stream_sequence;
                    if sequence > to {
                        done = true;
                        break;
                    }
                    got += 1;
                    done |= sequence == to;
                    let Some(raw) = std::str::from_utf8(&m.payload)
                        .ok()
                        .and_then(|s| RawEnvelope::from_json(s).ok())
                    else {
                        continue;
                    };
                    let key = (
                        format!("{}@{}", raw.meta.aggregate_type, raw.meta.source),
                        raw.meta.aggregate_id.clone(),
                    );
                    let below = wanted.get(&key).copied().unwrap_or(0);
                    if raw.meta.sequence < below && seen.insert(raw.meta.id.to_string()) {
                        let mut i = incoming(&m);
                        i.origin = i.origin.attribute("refetch", audit_id.to_string());
                        page.push(i);
                    }
                }
                report.read += got;
                if !page.is_empty() {
                    let receipt = outbox.receive(name, page).await;
                    if let Some(e) = receipt.error {
                        return Err(NatsError::Outbox(e));
                    }
                    outbox
                        .store()
                        .logging()?
                        .add_to_audit_count(audit_id, receipt.report.appended as u64)
                        .await?;
                    report.committed += receipt.report;
                }
                if done {
                    break 'pages;
                }
                if got == 0 {
                    // An empty batch ends the range only when the server has nothing more
                    // for the filter; a slow server gets a few more tries, then the read is
                    // reported incomplete rather than the events as lost.
                    let pending = reader
                        .info()
                        .await
                        .map_err(NatsError::broker("consumer info"))?
                        .num_pending;
                    if pending == 0 {
                        break 'pages;
                    }
                    empty += 1;
                    if empty >= 3 {
                        report.complete = false;
                        break 'pages;
                    }
                } else {
                    empty = 0;
                }
            }
            Ok(())
        }
        .await;
        // Best effort: an ephemeral consumer left behind expires after 30 s.
        let _ = stream.delete_consumer(&reader_name).await;
        result
    }
}

/// The producer-side command that sends a gap's missing event again.
fn republish_command(stream: &str, g: &Gap) -> String {
    let aggregate_type = g
        .aggregate_type
        .split_once('@')
        .map_or(g.aggregate_type.as_str(), |(t, _)| t);
    format!(
        "events relay republish --destination nats:{stream} --aggregate {} {} --reason …",
        shell_word(aggregate_type),
        shell_word(&g.aggregate_id)
    )
}

/// `s`, quoted for a POSIX shell when it needs it.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/@+=,".contains(c))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

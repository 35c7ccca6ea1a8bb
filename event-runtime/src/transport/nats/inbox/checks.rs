//! What an inbox checks that needs no broker: its configuration against the consuming outbox
//! before it starts, and each fetched message's partition against its aggregate's.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_nats::jetstream;

use super::super::NatsError;
use super::{InboxConfig, FAILOVER_ALLOWANCE};
use crate::Outbox;

/// The checks of an inbox's configuration against its consuming outbox that need no broker:
/// see [`NatsInbox::new`]'s errors ([`NatsError::Config`], [`NatsError::RetentionTooShort`]).
pub(in crate::transport::nats) fn preflight(
    outbox: &Outbox,
    config: &InboxConfig,
) -> Result<(), NatsError> {
    config.validate()?;
    let horizon = config.redelivery_horizon();
    let retention = outbox.config().retention;
    if retention <= horizon {
        return Err(NatsError::RetentionTooShort { retention, horizon });
    }
    // A message the consumer fetched and lost (a crash before its ack) comes back after
    // the ack wait (or its backoff step) and a fetch: the events after it wait that long
    // for it, and must not be reported as a gap meanwhile.
    let redelivery = config
        .backoff
        .iter()
        .copied()
        .max()
        .unwrap_or_default()
        .max(config.ack_wait)
        + config.fetch_wait;
    if !config.allow_in_transaction_handlers {
        if let Some(refusal) = crate::inbox::in_transaction_refusal(outbox) {
            return Err(NatsError::Config(refusal));
        }
    }
    let gap_after = outbox.config().gap_after;
    if gap_after <= redelivery + FAILOVER_ALLOWANCE {
        return Err(NatsError::Config(format!(
            "OutboxConfig::gap_after ({gap_after:?}) must exceed the consumer's redelivery delay ({redelivery:?}: ack wait or its longest backoff step, plus the fetch wait) plus a cluster's failover ({FAILOVER_ALLOWANCE:?}, FAILOVER_ALLOWANCE): a message merely awaiting redelivery, or a new leader, would be reported as a gap"
        )));
    }
    Ok(())
}

/// Counts the messages whose subject's partition is not their aggregate's under this
/// stream's count (a producer publishing with another count: during a change of the
/// partitions, or misconfigured), and logs them at most once a minute with both values; returns how many.
/// They are accepted all the same: the inbox core's chains keep each aggregate's order
/// whichever partition its events came through.
pub(super) fn count_misplaced(
    inbox: &str,
    partitions: u32,
    messages: &[jetstream::Message],
    misplaced: &Mutex<(u64, Option<Instant>)>,
) -> u64 {
    #[derive(serde::Deserialize)]
    struct Key<'a> {
        #[serde(borrow)]
        aggregatetype: std::borrow::Cow<'a, str>,
        #[serde(borrow)]
        subject: std::borrow::Cow<'a, str>,
    }
    let mut example = None;
    let mut n = 0u64;
    for m in messages {
        let Some(on) = super::super::partition::partition_token(&m.subject) else {
            continue;
        };
        let Ok(key) = serde_json::from_slice::<Key>(&m.payload) else {
            continue; // undecodable: the core dead-letters it
        };
        let belongs = super::super::partition_of(&key.aggregatetype, &key.subject, partitions);
        if belongs != on {
            n += 1;
            example.get_or_insert_with(|| (m.subject.to_string(), on, belongs));
        }
    }
    if n == 0 {
        return 0;
    }
    metrics::counter!("events_nats_partition_mismatches_total").increment(n);
    let mut misplaced = misplaced.lock().unwrap_or_else(|e| e.into_inner());
    misplaced.0 += n;
    if misplaced
        .1
        .is_some_and(|at| at.elapsed() < Duration::from_secs(60))
    {
        return n;
    }
    let (subject, on, belongs) = example.expect("one counted");
    tracing::warn!(
        inbox = %inbox,
        messages = misplaced.0,
        stream_partitions = partitions,
        "inbox {}: {} message(s) on a partition their aggregate does not belong to with {partitions} partitions (e.g. `{subject}`: partition {on}, its aggregate's is {belongs}): a producer publishes with another count of partitions; accepted (each aggregate's order is kept)",
        inbox,
        misplaced.0,
    );
    *misplaced = (0, Some(Instant::now()));
    n
}

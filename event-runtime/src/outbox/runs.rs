//! Runs: claimed deliveries grouped per (destination, aggregate) in sequence order, and, for a
//! relay's runs, the chain each ordered event is published with (`prevsequence`).

use std::sync::Arc;

use event_core::ErrorChain;

use super::destination::{Resolved, Target};
use super::Outbox;
use crate::store::backend::ClaimedDelivery;

/// The deliveries of one (destination, aggregate) claimed together, in sequence order.
pub(crate) struct Run {
    pub(crate) dest: Arc<Resolved>,
    pub(crate) deliveries: Vec<ClaimedDelivery>,
}

impl Outbox {
    /// Groups claimed deliveries (in run order) into runs. A delivery of a destination this
    /// process does not know (it cannot happen: claims name only ours) is given back.
    pub(crate) fn runs(&self, claimed: Vec<ClaimedDelivery>) -> (Vec<Run>, Vec<ClaimedDelivery>) {
        let mut runs: Vec<Run> = Vec::new();
        let mut unknown = Vec::new();
        for d in claimed {
            let Some(dest) = self.inner.destinations.get(&d.destination) else {
                unknown.push(d);
                continue;
            };
            let same = runs.last().is_some_and(|r| {
                let h = &r.deliveries[0];
                d.sequence > 0
                    && h.sequence > 0
                    && h.destination == d.destination
                    && h.aggregate_type == d.aggregate_type
                    && h.aggregate_id == d.aggregate_id
            });
            if same {
                runs.last_mut().expect("checked").deliveries.push(d);
            } else {
                runs.push(Run {
                    dest: Arc::clone(dest),
                    deliveries: vec![d],
                });
            }
        }
        (runs, unknown)
    }

    /// Sets the predecessor each ordered delivery of a relay's run publishes with: the
    /// first names what the store's `event_relay_chain` says the relay published last for
    /// the aggregate (or, when that is this very event, what it named then: a re-published
    /// attempt carries the same value), each next one the delivery before it. A chain row
    /// older than the retention window counts as none (`0`). When the store cannot be read,
    /// the deliveries are published unchained (`prevsequence` absent: never held).
    pub(crate) async fn chain_relay_runs(&self, runs: &mut [Run]) {
        let keys: Vec<_> = runs
            .iter()
            .filter(|r| matches!(r.dest.target, Target::External(_)))
            .filter(|r| r.deliveries[0].sequence > 0)
            .map(|r| {
                let d = &r.deliveries[0];
                (
                    r.dest.name.clone(),
                    d.aggregate_type.clone(),
                    d.aggregate_id.clone(),
                )
            })
            .collect();
        if keys.is_empty() {
            return;
        }
        let fresh_after = self.inner.clock.now_ms()
            - i64::try_from(self.inner.config.retention.as_millis()).unwrap_or(i64::MAX);
        let last = match self
            .inner
            .store
            .backend()
            .relay_chain(&keys, fresh_after)
            .await
        {
            Ok(last) => last,
            Err(e) => {
                tracing::warn!(error = %ErrorChain(&e), "reading the relay chain failed; publishing these deliveries without prevsequence");
                return;
            }
        };
        for run in runs
            .iter_mut()
            .filter(|r| matches!(r.dest.target, Target::External(_)))
        {
            let first = &run.deliveries[0];
            if first.sequence == 0 {
                continue;
            }
            let key = (
                run.dest.name.clone(),
                first.aggregate_type.clone(),
                first.aggregate_id.clone(),
            );
            let mut previous = match last.get(&key) {
                None => 0,
                Some(chain) if chain.last < first.sequence => chain.last,
                Some(chain) if chain.last == first.sequence => chain.previous,
                // The relay published a later event already (a re-publish, a replayed dead
                // letter after a purge let its successors pass): each names the event of
                // its aggregate published before it.
                Some(_) => {
                    self.chain_published_again(run).await;
                    continue;
                }
            };
            for d in &mut run.deliveries {
                d.relay_previous = Some(previous);
                previous = d.sequence;
            }
        }
    }

    /// Chains a run of deliveries published again after later events of their aggregate
    /// (`Store::republish`, a dead letter replayed after a purge): each names the highest of
    /// the delivery before it in the run and the events the relay published (its completed
    /// deliveries) below it, so a consumer holds it only for what was published before it.
    async fn chain_published_again(&self, run: &mut Run) {
        let (Some(first), Some(top)) = (run.deliveries.first(), run.deliveries.last()) else {
            return;
        };
        let span = top
            .sequence
            .saturating_sub(first.sequence)
            .saturating_add(1);
        let limit = usize::try_from(span.min(10_000)).unwrap_or(10_000);
        let aggregate = (first.aggregate_type.clone(), first.aggregate_id.clone());
        let published = match self
            .inner
            .store
            .backend()
            .published_sequences(
                &run.dest.name,
                (&aggregate.0, &aggregate.1),
                top.sequence,
                limit,
            )
            .await
        {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %ErrorChain(&e), "reading what the relay published failed; publishing these deliveries without prevsequence");
                return;
            }
        };
        // Highest first: walk it down as the run goes up.
        let mut below = published.into_iter().rev().peekable();
        let mut previous = 0;
        let mut last_published = 0;
        for d in &mut run.deliveries {
            while let Some(&p) = below.peek() {
                if p >= d.sequence {
                    break;
                }
                last_published = p;
                below.next();
            }
            d.relay_previous = Some(previous.max(last_published));
            previous = d.sequence;
        }
    }
}

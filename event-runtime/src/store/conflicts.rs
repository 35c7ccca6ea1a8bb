//! Which events of a list would fail their commit with [`StoreError::Conflict`], found before
//! appending them, in the transaction that will: so that a caller holding many (an inbox's
//! batch) sets those aside at once instead of learning of them one failed commit at a time.
//! Writes nothing.

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use super::backend::PlaceQuery;
use super::{StoreError, Tx};

/// An event's place in its aggregate's stream, as [`Tx::conflicting`] checks it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place<'a> {
    pub(crate) aggregate_type: &'a str,
    pub(crate) aggregate_id: &'a str,
    pub(crate) sequence: u64,
    pub(crate) event_id: Uuid,
}

impl Place<'_> {
    /// Whether the outbox keeps this place unique (sequence 0 is unsequenced), and can be
    /// asked about it: a sequence above `i64::MAX` or U+0000 in a text (which PostgreSQL
    /// refuses as a parameter, aborting the transaction) is refused by the commit for its
    /// own reason, not looked up.
    fn checked(&self) -> Option<i64> {
        let s = i64::try_from(self.sequence).ok().filter(|&s| s > 0)?;
        (!self.aggregate_type.contains('\0') && !self.aggregate_id.contains('\0')).then_some(s)
    }
}

impl Tx {
    /// The indexes of the `places` that, appended in this order in this transaction, would
    /// fail with [`StoreError::Conflict`]: a place the outbox holds under another event id,
    /// and one an earlier place of the list (not itself conflicting) claims under another
    /// event id. A place repeated under the same event id is not one (the commit skips it as
    /// a duplicate). One statement per 200 places.
    ///
    /// Exact where writers are serialised (SQLite: the transaction holds the write lock);
    /// elsewhere a concurrent commit may still take a place after this looked, and the
    /// append then fails with the conflict all the same.
    ///
    /// # Errors
    /// [`StoreError::Database`]; on PostgreSQL the transaction is then aborted.
    pub(crate) async fn conflicting(
        &mut self,
        places: &[Place<'_>],
    ) -> Result<Vec<usize>, StoreError> {
        let asked: Vec<(usize, i64)> = places
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.checked().map(|s| (i, s)))
            .collect();
        let query: Vec<PlaceQuery<'_>> = asked
            .iter()
            .map(|&(i, sequence)| PlaceQuery {
                aggregate_type: places[i].aggregate_type,
                aggregate_id: places[i].aggregate_id,
                sequence,
                event_id: places[i].event_id,
            })
            .collect();
        let taken: HashSet<usize> = self
            .backend()
            .held_places(&query)
            .await?
            .into_iter()
            .filter_map(|k| asked.get(k).map(|&(i, _)| i))
            .collect();
        let mut claimed: HashMap<(&str, &str, i64), Uuid> = HashMap::new();
        let mut conflicting = Vec::new();
        for (i, s) in asked {
            let p = &places[i];
            if taken.contains(&i) {
                conflicting.push(i);
                continue;
            }
            let first = *claimed
                .entry((p.aggregate_type, p.aggregate_id, s))
                .or_insert(p.event_id);
            if first != p.event_id {
                conflicting.push(i);
            }
        }
        Ok(conflicting)
    }
}

//! Which events of a list would fail their commit with [`StoreError::Conflict`], found before
//! appending them, in the transaction that will: so that a caller holding many (an inbox's
//! batch) sets those aside at once instead of learning of them one failed commit at a time.
//! Writes nothing.

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use super::sql::exec::placeholders;
use super::value::Datum;
use super::{StoreError, Tx};

/// Places looked up per statement (5 parameters each).
const CHUNK: usize = 200;

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
        let mut taken = HashSet::new();
        for chunk in asked.chunks(CHUNK) {
            let mut args = Vec::with_capacity(chunk.len() * 5);
            for &(i, s) in chunk {
                let p = &places[i];
                args.extend([
                    Datum::Int(i as i64),
                    Datum::Text(p.aggregate_type.to_owned()),
                    Datum::Text(p.aggregate_id.to_owned()),
                    Datum::Int(s),
                    Datum::Text(p.event_id.to_string()),
                ]);
            }
            // `o.sequence > 0` repeats the condition of the unique index on (aggregate type,
            // aggregate id, sequence), so that SQLite's planner uses that partial index.
            let sql = format!(
                "SELECT k.column1 AS i FROM (VALUES {}) AS k \
                 WHERE EXISTS (SELECT 1 FROM event_outbox o \
                     WHERE o.aggregate_type = k.column2 AND o.aggregate_id = k.column3 \
                       AND o.sequence = k.column4 AND o.sequence > 0 \
                       AND o.event_id <> k.column5)",
                placeholders(chunk.len(), 5, 1)
            );
            for row in self.backend().fetch(&sql, &args, false).await? {
                taken.insert(row.get::<i64>("i")? as usize);
            }
        }
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

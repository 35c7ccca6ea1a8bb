//! Settling: recording what happened to claimed deliveries (completed, given back, retried,
//! dead-lettered) inside the caller's transaction, fenced by the lease token, one result per
//! row, and making the next delivery of each advanced run its head.

use std::collections::HashSet;

use crate::store::backend::{SettleOutcome, SettleResult, Settlement};
use crate::store::sql::append::{promote, StreamKey};
use crate::store::sql::exec::{Arg, SqlExec};
use crate::store::sql::{by_destination, chain, db, execute, rows, Conn, Dialect};
use crate::store::StoreError;

const SAVEPOINT: &str = "event_settle";

/// Runs `step` on `conn`; when `contained`, inside its own savepoint, undone alone if it
/// fails.
async fn contained<D: Dialect, T>(
    conn: &mut Conn<D>,
    contained: bool,
    step: impl AsyncFnOnce(&mut Conn<D>) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    if !contained {
        return step(conn).await;
    }
    execute::<D>(conn, &format!("SAVEPOINT {SAVEPOINT}"), &[]).await?;
    match step(conn).await {
        Ok(v) => {
            execute::<D>(conn, &format!("RELEASE SAVEPOINT {SAVEPOINT}"), &[]).await?;
            Ok(v)
        }
        Err(e) => {
            execute::<D>(conn, &format!("ROLLBACK TO SAVEPOINT {SAVEPOINT}"), &[]).await?;
            execute::<D>(conn, &format!("RELEASE SAVEPOINT {SAVEPOINT}"), &[]).await?;
            Err(e)
        }
    }
}

/// Records `batch` on `conn` (inside the caller's transaction), fenced by `token`.
///
/// A row is found by its primary key and fenced by `lease_token = $token` alone: only a
/// pending delivery ever holds a token (every other status clears it), and a condition on
/// `status` would let a planner with stale statistics pick a partial index of pending rows
/// and read the whole backlog (seen on PostgreSQL after a burst).
///
/// Completions and releases are one statement each; retries and dead letters one row at a
/// time. With `contain`, every statement runs in its own savepoint and a row the database
/// refuses is reported as [`SettleResult::Failed`] after one more try as an `unrecordable`
/// dead letter; without it, the first refusal fails the call (the caller retries contained).
/// Returns one result per settlement, and the runs to promote again after COMMIT.
pub(crate) async fn settle<D: Dialect>(
    conn: &mut Conn<D>,
    token: &str,
    now: i64,
    batch: &[Settlement<'_>],
    contain: bool,
) -> Result<(Vec<SettleResult>, Vec<StreamKey>), StoreError> {
    let mut settling = Settling::new(token, now, batch, contain);
    settling.complete_all::<D>(conn).await?;
    settling.record_relay_chain::<D>(conn).await?;
    settling.release_all::<D>(conn).await?;
    settling.retry_and_dead_letter::<D>(conn).await?;
    let again = settling.promote_next_heads::<D>(conn).await?;
    Ok((settling.into_results(), again))
}

/// One call of [`settle`]: its arguments, the settlements grouped by kind, and the result of
/// each settlement so far (`None` until the step for its kind has run).
struct Settling<'a, 's> {
    token: &'a str,
    now: i64,
    batch: &'a [Settlement<'s>],
    contain: bool,
    /// The event ids as text, aligned with `batch`.
    ids: Vec<String>,
    /// The indices of the completions.
    completed: Vec<usize>,
    /// The indices of the releases.
    released: Vec<usize>,
    results: Vec<Option<SettleResult>>,
}

impl<'a, 's> Settling<'a, 's> {
    /// The settlements of `batch` grouped by kind, none recorded yet.
    fn new(token: &'a str, now: i64, batch: &'a [Settlement<'s>], contain: bool) -> Self {
        let completed = (0..batch.len())
            .filter(|&i| matches!(batch[i].outcome, SettleOutcome::Completed { .. }))
            .collect();
        let released = (0..batch.len())
            .filter(|&i| matches!(batch[i].outcome, SettleOutcome::Release))
            .collect();
        Settling {
            token,
            now,
            batch,
            contain,
            ids: batch.iter().map(|s| s.event_id.to_string()).collect(),
            completed,
            released,
            results: (0..batch.len()).map(|_| None).collect(),
        }
    }

    /// Records the completions, one statement per destination; a completion whose row no
    /// longer holds the token lost its lease. When the database refuses the bulk statement
    /// (contained), each completion is tried alone.
    async fn complete_all<D: Dialect>(&mut self, conn: &mut Conn<D>) -> Result<(), StoreError> {
        let done = contained::<D, _>(conn, self.contain, async |c| {
            complete::<D>(
                c,
                self.token,
                self.now,
                self.batch,
                &self.ids,
                &self.completed,
            )
            .await
        })
        .await;
        match done {
            Ok(done) => {
                for &i in &self.completed {
                    let key = (self.batch[i].destination, self.ids[i].as_str());
                    self.results[i] =
                        Some(if done.contains(&(key.0.to_owned(), key.1.to_owned())) {
                            SettleResult::Settled
                        } else {
                            SettleResult::LeaseLost
                        });
                }
            }
            Err(e) if !self.contain => return Err(e),
            // The bulk statement was refused: each completion alone.
            Err(_) => self.complete_each::<D>(conn).await,
        }
        Ok(())
    }

    /// Completes each completion alone, in its own savepoint, so that a row the database
    /// refuses fails only itself.
    async fn complete_each<D: Dialect>(&mut self, conn: &mut Conn<D>) {
        for &i in &self.completed {
            let one = [i];
            let r = contained::<D, _>(conn, true, async |c| {
                complete::<D>(c, self.token, self.now, self.batch, &self.ids, &one).await
            })
            .await;
            self.results[i] = Some(match r {
                Ok(done) if !done.is_empty() => SettleResult::Settled,
                Ok(_) => SettleResult::LeaseLost,
                Err(e) => SettleResult::Failed(e),
            });
        }
    }

    /// Records a relay's completed publishes: what it published last per aggregate, with the
    /// predecessor it named (read when its next event is published).
    async fn record_relay_chain<D: Dialect>(&self, conn: &mut Conn<D>) -> Result<(), StoreError> {
        let relayed = self.relayed();
        if relayed.is_empty() {
            return Ok(());
        }
        let recorded = contained::<D, _>(conn, self.contain, async |c| {
            chain::record_relayed::<D>(c, &relayed, self.now).await
        })
        .await;
        match recorded {
            Ok(()) => Ok(()),
            Err(e) if !self.contain => Err(e),
            // The publishes stay completed; the next event of such an aggregate names an
            // earlier predecessor than the one it follows (the consumer's order check is
            // looser for that one event), never a later one.
            Err(e) => {
                tracing::warn!(
                    error = %event_core::ErrorChain(&e),
                    "recording the relay chain failed"
                );
                Ok(())
            }
        }
    }

    /// The completed publishes of an ordered event by a relay, as (destination, aggregate
    /// type, aggregate id, sequence, the predecessor it named).
    fn relayed(&self) -> Vec<(&'a str, &'a str, &'a str, u64, u64)> {
        self.completed
            .iter()
            .filter(|&&i| matches!(self.results[i], Some(SettleResult::Settled)))
            .filter_map(|&i| {
                let s = &self.batch[i];
                let previous = s.relay_previous.filter(|_| s.sequence > 0)?;
                Some((
                    s.destination,
                    s.aggregate_type,
                    s.aggregate_id,
                    s.sequence,
                    previous,
                ))
            })
            .collect()
    }

    /// Gives back the releases, one statement per destination.
    async fn release_all<D: Dialect>(&mut self, conn: &mut Conn<D>) -> Result<(), StoreError> {
        if self.released.is_empty() {
            return Ok(());
        }
        contained::<D, _>(conn, self.contain, async |c| {
            release::<D>(c, self.token, self.batch, &self.ids, &self.released).await
        })
        .await?;
        for &i in &self.released {
            self.results[i] = Some(SettleResult::Settled);
        }
        Ok(())
    }

    /// Records the retries and the dead letters, one row at a time; contained, a row the
    /// database refuses is dead-lettered as `unrecordable` instead.
    async fn retry_and_dead_letter<D: Dialect>(
        &mut self,
        conn: &mut Conn<D>,
    ) -> Result<(), StoreError> {
        let (token, now) = (self.token, self.now);
        for (i, s) in self.batch.iter().enumerate() {
            let id = self.ids[i].as_str();
            let r = match s.outcome {
                SettleOutcome::Retry {
                    attempts,
                    next_attempt_at,
                    failed_at,
                    error,
                } => {
                    contained::<D, _>(conn, self.contain, async |c| {
                        retry::<D>(c, token, failed_at, s, id, attempts, next_attempt_at, error)
                            .await
                    })
                    .await
                }
                SettleOutcome::Dead {
                    attempts,
                    reason,
                    failed_at,
                    chain,
                } => {
                    contained::<D, _>(conn, self.contain, async |c| {
                        dead::<D>(c, token, now, failed_at, s, id, attempts, reason, chain).await
                    })
                    .await
                }
                SettleOutcome::Completed { .. } | SettleOutcome::Release => continue,
            };
            self.results[i] = Some(match r {
                Ok(true) => SettleResult::Settled,
                Ok(false) => SettleResult::LeaseLost,
                Err(e) if !self.contain => return Err(e),
                Err(e) => unrecordable::<D>(conn, token, now, s, id, e).await,
            });
        }
        Ok(())
    }

    /// Makes the next delivery of each run a completion advanced its head; returns the runs
    /// to promote again after COMMIT (those this could not).
    async fn promote_next_heads<D: Dialect>(
        &self,
        conn: &mut Conn<D>,
    ) -> Result<Vec<StreamKey>, StoreError> {
        let streams = self.advanced_runs();
        let heads = contained::<D, _>(conn, self.contain, async |c| {
            promote::<D>(c, &streams).await
        })
        .await;
        match heads {
            Ok(heads) => Ok(streams
                .into_iter()
                .filter(|s| !heads.contains_key(s))
                .collect()),
            Err(e) if !self.contain => Err(e),
            // Promotion is repaired later (`repair_runs`): never a reason to lose the outcomes.
            Err(_) => Ok(streams),
        }
    }

    /// The runs (destination, aggregate) whose ordered delivery was completed, each once, in
    /// the order of the batch: a completion makes the next delivery of its run the head.
    fn advanced_runs(&self) -> Vec<StreamKey> {
        let mut streams: Vec<StreamKey> = Vec::new();
        let mut seen = HashSet::new();
        for (i, s) in self.batch.iter().enumerate() {
            if s.sequence > 0
                && matches!(s.outcome, SettleOutcome::Completed { .. })
                && matches!(self.results[i], Some(SettleResult::Settled))
            {
                let key = (
                    s.destination.to_owned(),
                    s.aggregate_type.to_owned(),
                    s.aggregate_id.to_owned(),
                );
                if seen.insert(key.clone()) {
                    streams.push(key);
                }
            }
        }
        streams
    }

    /// The results, one per settlement of the batch, in its order.
    fn into_results(self) -> Vec<SettleResult> {
        self.results
            .into_iter()
            .map(|r| r.unwrap_or(SettleResult::Settled))
            .collect()
    }
}

/// Completes one delivery; false when its lease was lost.
pub(crate) async fn complete_one<D: Dialect>(
    conn: &mut Conn<D>,
    token: &str,
    now: i64,
    s: &Settlement<'_>,
) -> Result<bool, StoreError> {
    let id = s.event_id.to_string();
    let n = execute::<D>(
        conn,
        "UPDATE event_deliveries SET status = 'completed', completed_at = $1, lease_token = NULL, attempts = attempts + 1 \
         WHERE handler = $3 AND event_id = $4 AND lease_token = $2",
        &[Arg::I64(now), Arg::Str(token), Arg::Str(s.destination), Arg::Str(&id)],
    )
    .await?;
    Ok(n == 1)
}

/// Completes `which` of `batch`; returns the keys completed (the others' leases were lost).
async fn complete<D: Dialect>(
    conn: &mut Conn<D>,
    token: &str,
    now: i64,
    batch: &[Settlement<'_>],
    ids: &[String],
    which: &[usize],
) -> Result<HashSet<(String, String)>, StoreError> {
    let mut done = HashSet::new();
    let sql = format!(
        "UPDATE event_deliveries SET status = 'completed', completed_at = $1, lease_token = NULL, attempts = attempts + 1 \
         WHERE lease_token = $2 AND handler = $3 AND {} \
         RETURNING handler, event_id",
        D::text_in("event_id", "$4")
    );
    let keys = which
        .iter()
        .map(|&i| (batch[i].destination, ids[i].as_str()));
    for (destination, list) in by_destination(keys) {
        let args = [
            Arg::I64(now),
            Arg::Str(token),
            Arg::Str(destination),
            Arg::Str(&list),
        ];
        for r in rows::<D>(conn, &sql, &args).await? {
            done.insert((
                D::DB::get_string(&r, "handler").map_err(db)?,
                D::DB::get_string(&r, "event_id").map_err(db)?,
            ));
        }
    }
    Ok(done)
}

async fn release<D: Dialect>(
    conn: &mut Conn<D>,
    token: &str,
    batch: &[Settlement<'_>],
    ids: &[String],
    which: &[usize],
) -> Result<(), StoreError> {
    let sql = format!(
        "UPDATE event_deliveries SET lease_token = NULL \
         WHERE lease_token = $1 AND handler = $2 AND {}",
        D::text_in("event_id", "$3")
    );
    let keys = which
        .iter()
        .map(|&i| (batch[i].destination, ids[i].as_str()));
    for (destination, list) in by_destination(keys) {
        execute::<D>(
            conn,
            &sql,
            &[Arg::Str(token), Arg::Str(destination), Arg::Str(&list)],
        )
        .await?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn retry<D: Dialect>(
    conn: &mut Conn<D>,
    token: &str,
    failed_at: i64,
    s: &Settlement<'_>,
    id: &str,
    attempts: u32,
    next_attempt_at: i64,
    error: &str,
) -> Result<bool, StoreError> {
    let n = execute::<D>(
        conn,
        "UPDATE event_deliveries SET lease_token = NULL, next_attempt_at = $1, last_error = $2, attempts = $3, \
             first_failed_at = COALESCE(first_failed_at, $4), last_failed_at = $4 \
         WHERE handler = $5 AND event_id = $6 AND lease_token = $7",
        &[
            Arg::I64(next_attempt_at),
            Arg::Str(error),
            Arg::I64(i64::from(attempts)),
            Arg::I64(failed_at),
            Arg::Str(s.destination),
            Arg::Str(id),
            Arg::Str(token),
        ],
    )
    .await?;
    Ok(n == 1)
}

/// Moves a leased delivery to the dead letter queue, with the envelope copied from the
/// outbox byte for byte: dead at `now`, its last failure at `failed_at`. False when the lease
/// was lost.
#[allow(clippy::too_many_arguments)]
async fn dead<D: Dialect>(
    conn: &mut Conn<D>,
    token: &str,
    now: i64,
    failed_at: i64,
    s: &Settlement<'_>,
    id: &str,
    attempts: u32,
    reason: &str,
    chain: &[String],
) -> Result<bool, StoreError> {
    let chain_json = serde_json::to_string(chain).unwrap_or_else(|_| "[]".into());
    let last = chain.join(": ");
    let updated = rows::<D>(
        conn,
        "UPDATE event_deliveries SET status = 'dead', lease_token = NULL, attempts = $1, last_error = $2, \
             first_failed_at = COALESCE(first_failed_at, $3), last_failed_at = $3 \
         WHERE handler = $4 AND event_id = $5 AND lease_token = $6 \
         RETURNING first_failed_at",
        &[
            Arg::I64(i64::from(attempts)),
            Arg::Str(&last),
            Arg::I64(failed_at),
            Arg::Str(s.destination),
            Arg::Str(id),
            Arg::Str(token),
        ],
    )
    .await?;
    let Some(row) = updated.first() else {
        return Ok(false);
    };
    let first_failed = D::DB::get_opt_i64(row, "first_failed_at")
        .map_err(db)?
        .unwrap_or(failed_at);
    execute::<D>(
        conn,
        "INSERT INTO event_dead_letters \
             (event_id, handler, name, version, envelope, attempts, first_failed_at, last_failed_at, reason, error_chain, dead_at) \
         SELECT o.event_id, $2, o.name, o.version, o.envelope, $3, $4, $5, $6, $7, $8 \
         FROM event_outbox o WHERE o.event_id = $1",
        &[
            Arg::Str(id),
            Arg::Str(s.destination),
            Arg::I64(i64::from(attempts)),
            Arg::I64(first_failed),
            Arg::I64(failed_at),
            Arg::Str(reason),
            Arg::Str(&chain_json),
            Arg::I64(now.max(failed_at)),
        ],
    )
    .await?;
    Ok(true)
}

/// The database refused to record a settlement: dead-letter the delivery with the fixed
/// reason `unrecordable` and the refusal (never the refused text), so that it neither blocks
/// its batch nor comes back for ever. When even that is refused, the row is left leased
/// (its lease expires and it is claimed again).
async fn unrecordable<D: Dialect>(
    conn: &mut Conn<D>,
    token: &str,
    now: i64,
    s: &Settlement<'_>,
    id: &str,
    refused: StoreError,
) -> SettleResult {
    let (attempts, failed_at) = match s.outcome {
        SettleOutcome::Retry {
            attempts,
            failed_at,
            ..
        }
        | SettleOutcome::Dead {
            attempts,
            failed_at,
            ..
        } => (attempts, failed_at),
        _ => (0, now),
    };
    let chain = vec![crate::outbox::text::storable(&format!(
        "the outcome of this delivery could not be recorded: {}",
        event_core::ErrorChain(&refused)
    ))];
    let r = contained::<D, _>(conn, true, async |c| {
        dead::<D>(
            c,
            token,
            now,
            failed_at,
            s,
            id,
            attempts,
            "unrecordable",
            &chain,
        )
        .await
    })
    .await;
    match r {
        Ok(true) => SettleResult::Settled,
        Ok(false) => SettleResult::LeaseLost,
        Err(_) => SettleResult::Failed(refused),
    }
}

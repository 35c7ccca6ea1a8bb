//! One open transaction of a [`SqlStore`]: [`SqlTx`] implements [`BackendTransaction`] once
//! for every dialect.

use std::any::{Any, TypeId};
use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Pool;
use uuid::Uuid;

use super::exec::Arg;
use super::portable::{portable_execute, portable_fetch};
use super::{append, chain, commit_and_promote, db, delivery, execute, inbox, Conn, Dialect};
use crate::store::backend::{
    AuditStamp, BackendTransaction, ChainLink, InboxDeadLetter, Linked, NewEvent, PlaceQuery,
    SettleResult, Settlement, TakenDeadLetters,
};
use crate::store::query::Row;
use crate::store::value::Datum;
use crate::store::StoreError;

/// One open transaction of a [`SqlStore`].
pub(crate) struct SqlTx<D: Dialect> {
    /// `None` once committed or rolled back.
    tx: Option<sqlx::Transaction<'static, D::DB>>,
    /// For what must run outside the transaction: the conflict lookup after a refused insert,
    /// promotions after COMMIT.
    pool: Pool<D::DB>,
    /// Runs to promote again after COMMIT ([`Dialect::PROMOTE_AFTER_COMMIT`]).
    promote_after_commit: Vec<append::StreamKey>,
    /// The statement time limit's state.
    time_limit: D::TimeLimit,
    /// Runs whose head completed in this transaction, or whose held deliveries a link
    /// released: promoted once, before COMMIT.
    completed_runs: Vec<append::StreamKey>,
    /// Events a link in this transaction left held: their deliveries are inserted held.
    held: HashSet<Uuid>,
}

impl<D: Dialect> fmt::Debug for SqlTx<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tx")
            .field("backend", &D::NAME)
            .field("open", &self.tx.is_some())
            .finish()
    }
}

impl<D: Dialect> SqlTx<D> {
    /// The open transaction `tx` of `pool`.
    pub(crate) fn new(tx: sqlx::Transaction<'static, D::DB>, pool: Pool<D::DB>) -> Self {
        SqlTx {
            tx: Some(tx),
            pool,
            promote_after_commit: Vec::new(),
            time_limit: D::TimeLimit::default(),
            completed_runs: Vec::new(),
            held: HashSet::new(),
        }
    }

    fn conn(&mut self) -> &mut Conn<D> {
        // A `SqlTx` is only reachable through `Tx`, which consumes it on commit or rollback.
        self.tx
            .as_mut()
            .expect("transaction used after commit or rollback")
    }
}

fn check_savepoint(name: &str) -> Result<(), StoreError> {
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b == b'_' || b.is_ascii_digit())
    {
        return Err(StoreError::InvalidSavepointName {
            name: name.to_owned(),
        });
    }
    Ok(())
}

#[async_trait]
impl<D: Dialect> BackendTransaction for SqlTx<D> {
    async fn commit(mut self: Box<Self>) -> Result<(), StoreError> {
        if !self.completed_runs.is_empty() {
            let mut runs = std::mem::take(&mut self.completed_runs);
            runs.sort();
            runs.dedup();
            let heads = append::promote::<D>(self.conn(), &runs).await?;
            self.promote_after_commit
                .extend(runs.into_iter().filter(|r| !heads.contains_key(r)));
        }
        let tx = self.tx.take().expect("committed once");
        commit_and_promote::<D>(tx, &self.pool, &self.promote_after_commit).await
    }

    async fn rollback(mut self: Box<Self>) -> Result<(), StoreError> {
        let tx = self.tx.take().expect("rolled back once");
        tx.rollback().await.map_err(db)
    }

    async fn execute(&mut self, sql: &str, args: &[Datum]) -> Result<u64, StoreError> {
        portable_execute::<D>(self.conn(), sql, args).await
    }

    async fn fetch(
        &mut self,
        sql: &str,
        args: &[Datum],
        first_only: bool,
    ) -> Result<Vec<Row>, StoreError> {
        portable_fetch::<D>(self.conn(), sql, args, first_only).await
    }

    async fn append_events(
        &mut self,
        events: &[NewEvent],
        now: i64,
    ) -> Result<HashSet<Uuid>, StoreError> {
        let pool = self.pool.clone();
        append::append_events::<D>(self.conn(), &pool, events, now).await
    }

    async fn insert_deliveries(
        &mut self,
        events: &[&NewEvent],
        now: i64,
    ) -> Result<(), StoreError> {
        let held = std::mem::take(&mut self.held);
        let waiting = append::insert_deliveries::<D>(self.conn(), events, &held, now).await?;
        self.held = held;
        self.promote_after_commit.extend(waiting);
        Ok(())
    }

    async fn insert_inbox_dead_letter(
        &mut self,
        letter: &InboxDeadLetter,
        now: i64,
    ) -> Result<bool, StoreError> {
        inbox::insert_dead_letter::<D>(self.conn(), letter, now).await
    }

    async fn take_inbox_dead_letters(
        &mut self,
        ids: &[i64],
        inbox: Option<&str>,
        stamp: &AuditStamp<'_>,
    ) -> Result<TakenDeadLetters, StoreError> {
        inbox::take_dead_letters::<D>(self.conn(), ids, inbox, stamp).await
    }

    async fn held_places(&mut self, places: &[PlaceQuery<'_>]) -> Result<Vec<usize>, StoreError> {
        append::held_places::<D>(self.conn(), places).await
    }

    async fn link(&mut self, links: &[ChainLink], now: i64) -> Result<Linked, StoreError> {
        let (linked, streams) = chain::link::<D>(self.conn(), links, now).await?;
        for id in &linked.released {
            self.held.remove(id);
        }
        self.held.extend(linked.held.iter().copied());
        self.completed_runs.extend(streams);
        Ok(linked)
    }

    async fn skipped_places(
        &mut self,
        places: &[(&str, &str, u64)],
    ) -> Result<Vec<usize>, StoreError> {
        chain::skipped_places::<D>(self.conn(), places).await
    }

    async fn savepoint(&mut self, name: &str) -> Result<(), StoreError> {
        check_savepoint(name)?;
        execute::<D>(self.conn(), &format!("SAVEPOINT {name}"), &[]).await?;
        Ok(())
    }

    async fn release_savepoint(&mut self, name: &str) -> Result<(), StoreError> {
        check_savepoint(name)?;
        execute::<D>(self.conn(), &format!("RELEASE SAVEPOINT {name}"), &[]).await?;
        Ok(())
    }

    async fn rollback_to_savepoint(&mut self, name: &str) -> Result<(), StoreError> {
        check_savepoint(name)?;
        execute::<D>(self.conn(), &format!("ROLLBACK TO SAVEPOINT {name}"), &[]).await?;
        Ok(())
    }

    async fn settle(
        &mut self,
        token: &str,
        now: i64,
        batch: &[Settlement<'_>],
    ) -> Result<Vec<SettleResult>, StoreError> {
        let (results, streams) =
            delivery::settle::<D>(self.conn(), token, now, batch, true).await?;
        self.promote_after_commit.extend(streams);
        Ok(results)
    }

    async fn renew_leases(&mut self, tokens: &[String], expires_at: i64) -> Result<(), StoreError> {
        if !D::SINGLE_WRITER || tokens.is_empty() {
            return Ok(());
        }
        let list = serde_json::to_string(tokens).unwrap_or_else(|_| "[]".into());
        let sql = format!(
            "UPDATE event_leases SET expires_at = $1 WHERE expires_at < $1 AND token IN {}",
            D::json_text_array("$2")
        );
        execute::<D>(self.conn(), &sql, &[Arg::I64(expires_at), Arg::Str(&list)]).await?;
        Ok(())
    }

    async fn set_time_limit(&mut self, limit: Option<Duration>) -> Result<bool, StoreError> {
        let conn: &mut Conn<D> = self.tx.as_mut().expect("open transaction");
        D::set_time_limit(conn, &mut self.time_limit, limit)
            .await
            .map_err(db)
    }

    async fn complete(
        &mut self,
        token: &str,
        now: i64,
        settlement: &Settlement<'_>,
    ) -> Result<SettleResult, StoreError> {
        let done = delivery::complete_one::<D>(self.conn(), token, now, settlement).await?;
        if done && settlement.sequence > 0 {
            self.completed_runs.push((
                settlement.destination.to_owned(),
                settlement.aggregate_type.to_owned(),
                settlement.aggregate_id.to_owned(),
            ));
        }
        Ok(if done {
            SettleResult::Settled
        } else {
            SettleResult::LeaseLost
        })
    }

    fn native(&mut self, type_id: TypeId) -> Option<&mut (dyn Any + Send)> {
        if type_id != TypeId::of::<Conn<D>>() {
            return None;
        }
        let conn: &mut Conn<D> = &mut **self.tx.as_mut()?;
        Some(conn as &mut (dyn Any + Send))
    }

    #[cfg(feature = "fault-injection")]
    async fn abandon(mut self: Box<Self>, kill_connection: bool) {
        if let Some(mut tx) = self.tx.take() {
            if kill_connection {
                D::kill(&mut tx).await;
            }
            drop(tx);
        }
    }
}

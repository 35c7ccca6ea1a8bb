//! [`TestOutbox`]: an outbox over a temporary SQLite file, driven by a [`ManualClock`], with
//! the calls a handler test makes. Owns the file (removed on drop, and when making the outbox
//! fails); adds no behaviour to the outbox it wraps.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use event_core::{DomainEvent, Envelope};

use super::clock::ManualClock;
use crate::dispatch::DispatcherBuilder;
use crate::outbox::{BatchReport, CommitReport, Outbox, OutboxBuilder, OutboxError};
use crate::store::{DeadLetter, DeadLetterFilter, OutboxStats, Store};

/// How far [`TestOutbox::drain`] moves the clock when only scheduled retries are left: past
/// any backoff a test sets up, and past the lease.
const STEP: Duration = Duration::from_secs(3600);
/// Rounds of delivery [`TestOutbox::drain`] makes before giving up.
const ROUNDS: usize = 10_000;

/// An [`Outbox`] over a fresh SQLite file in the temporary directory, whose clock stands still
/// until the test (or [`drain`](Self::drain)) moves it. Handlers that take `&mut Tx` (or
/// `&mut sqlx::SqliteConnection`) run as in production: in the delivery's transaction.
///
/// A file rather than `sqlite::memory:`: an in-memory database is one connection, which the
/// engine's own concurrent statements (a lease renewal beside a batch) would deadlock on.
/// The file and its journal are removed when the `TestOutbox` is dropped.
///
/// See the [module docs](super) for an example.
pub struct TestOutbox {
    outbox: Outbox,
    clock: Arc<ManualClock>,
    file: TempFile,
}

/// The SQLite file and its journals, removed when dropped: with the [`TestOutbox`], or at once
/// when making it fails (the file is created before the outbox is built).
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut path = self.0.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

impl std::fmt::Debug for TestOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestOutbox")
            .field("path", &self.file.0)
            .field("now_ms", &crate::Clock::now_ms(&*self.clock))
            .finish()
    }
}

impl TestOutbox {
    /// An outbox running the handlers of `dispatcher`
    /// (`Dispatcher::builder_empty().handler::<summary>()`, or `Dispatcher::builder()` for
    /// every registered one) with the default configuration.
    ///
    /// # Errors
    /// [`OutboxError::Store`] when the file cannot be created; what
    /// [`OutboxBuilder::build`] refuses.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves at most an unused temporary file.
    pub async fn new(dispatcher: DispatcherBuilder) -> Result<Self, OutboxError> {
        Self::with(dispatcher, |builder| builder).await
    }

    /// As [`new`](Self::new), with `configure` applied to the builder (resources, retry
    /// policies, configuration). The harness's clock is set after it.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    ///
    /// # Cancel safety
    /// As [`new`](Self::new).
    pub async fn with(
        dispatcher: DispatcherBuilder,
        configure: impl FnOnce(OutboxBuilder) -> OutboxBuilder,
    ) -> Result<Self, OutboxError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let file = TempFile(std::env::temp_dir().join(format!(
            "event-runtime-test-{}-{}-{}.db",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            crate::Clock::now_ms(&crate::SystemClock),
        )));
        let store = Store::connect(&format!("sqlite://{}", file.0.display())).await?;
        let clock = Arc::new(ManualClock::new());
        let outbox = configure(Outbox::builder(store).dispatcher(dispatcher))
            .clock(Arc::clone(&clock) as Arc<dyn crate::Clock>)
            .build()?;
        Ok(TestOutbox {
            outbox,
            clock,
            file,
        })
    }

    /// The outbox, for everything the harness does not wrap (`begin`, `deliver_batch`).
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// The store under it.
    pub fn store(&self) -> &Store {
        self.outbox.store()
    }

    /// The clock every stamp of the outbox reads.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// Commits `envelopes` in one unit of work. Give each the sequence its aggregate would
    /// (`.with_sequence(n)`, or record them with an `EventRecorder`): deliveries are ordered
    /// per aggregate by it, and sequence 0 is not ordered.
    ///
    /// # Errors
    /// As [`OutboxUnitOfWork::commit`](crate::OutboxUnitOfWork::commit).
    ///
    /// # Cancel safety
    /// Dropped before COMMIT, nothing is written.
    pub async fn commit<E: DomainEvent>(
        &self,
        envelopes: impl IntoIterator<Item = Envelope<E>>,
    ) -> Result<CommitReport, OutboxError> {
        let mut uow = self.outbox.begin().await?;
        for envelope in envelopes {
            uow.add(envelope);
        }
        uow.commit().await
    }

    /// Delivers until nothing can make progress: every delivery completed, dead-lettered,
    /// waiting behind a dead letter of its aggregate, or paused. Whenever only scheduled
    /// retries are left, the clock moves an hour forward, so that a handler retried five times
    /// is dead-lettered in milliseconds. Returns the totals.
    ///
    /// # Errors
    /// [`OutboxError::Store`]; [`OutboxError::Timeout`] after 10,000 rounds.
    ///
    /// # Cancel safety
    /// As [`Outbox::deliver_batch`].
    pub async fn drain(&self) -> Result<BatchReport, OutboxError> {
        let mut total = BatchReport::default();
        let store = self.outbox.inner.store.backend();
        for _ in 0..ROUNDS {
            let report = self.outbox.deliver_batch().await?;
            let claimed = report.claimed;
            total += report;
            if claimed > 0 {
                continue;
            }
            if store.progressing(&self.outbox.inner.claimable).await? == 0 {
                return Ok(total);
            }
            self.clock.advance(STEP);
        }
        let pending = store.progressing(&self.outbox.inner.claimable).await?;
        Err(OutboxError::Timeout { pending })
    }

    /// The open dead letters, oldest first.
    ///
    /// # Errors
    /// [`OutboxError::Store`].
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetter>, OutboxError> {
        Ok(self
            .store()
            .dead_letters(&DeadLetterFilter::default())
            .await?)
    }

    /// Counts of events, deliveries and dead letters, per handler too.
    ///
    /// # Errors
    /// [`OutboxError::Store`].
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn stats(&self) -> Result<OutboxStats, OutboxError> {
        Ok(self.store().stats().await?)
    }

    /// Asserts that no delivery is pending and no dead letter is open.
    ///
    /// # Panics
    /// Otherwise, with the counts and the dead letters' errors; on a store error.
    pub async fn assert_idle(&self) {
        let stats = self.stats().await.expect("outbox stats");
        let dead = self.dead_letters().await.expect("dead letters");
        let errors: Vec<String> = dead
            .iter()
            .map(|d| {
                format!(
                    "{} on {}: {}",
                    d.handler,
                    d.event_name,
                    d.error_chain.join(": ")
                )
            })
            .collect();
        assert!(
            stats.pending == 0 && dead.is_empty(),
            "outbox not idle: {} pending, {} dead letters {:?}",
            stats.pending,
            dead.len(),
            errors
        );
    }

    /// Asserts that `handler` has exactly `count` open dead letters, and returns them.
    ///
    /// # Panics
    /// Otherwise, with the dead letters there are; when `handler` is not one of the outbox's
    /// destinations (a misspelt name); on a store error.
    pub async fn assert_dead_letters(&self, handler: &str, count: usize) -> Vec<DeadLetter> {
        // A misspelt name would match nothing, and "0 dead letters" could never fail.
        assert!(
            self.outbox.destinations().iter().any(|d| d == handler),
            "`{handler}` is not a destination of this outbox; its destinations: {:?}",
            self.outbox.destinations()
        );
        let (dead, others): (Vec<DeadLetter>, Vec<DeadLetter>) = self
            .dead_letters()
            .await
            .expect("dead letters")
            .into_iter()
            .partition(|d| d.handler == handler);
        if dead.len() != count {
            // A handler's name is `name = "…"`, or its module path and function name: say
            // what the other handlers have, in case the name is the mistake.
            let mut elsewhere: Vec<(&str, usize)> = Vec::new();
            for d in &others {
                match elsewhere.iter_mut().find(|(h, _)| *h == d.handler) {
                    Some((_, n)) => *n += 1,
                    None => elsewhere.push((&d.handler, 1)),
                }
            }
            panic!(
                "expected {count} dead letters of `{handler}`, found {}: {:?}; other handlers' dead letters (handler, count): {elsewhere:?}",
                dead.len(),
                dead.iter()
                    .map(|d| (&d.event_name, d.attempts, &d.error_chain))
                    .collect::<Vec<_>>()
            );
        }
        dead
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::OutboxConfig;

    /// This process's harness files in the temporary directory (no other test of this binary
    /// makes a `TestOutbox`).
    fn files() -> Vec<String> {
        let prefix = format!("event-runtime-test-{}-", std::process::id());
        let mut names: Vec<String> = std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(&prefix))
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn the_file_is_removed_when_the_outbox_is_dropped_or_cannot_be_built() {
        let before = files();
        let outbox = TestOutbox::new(crate::Dispatcher::builder_empty())
            .await
            .unwrap();
        assert!(outbox.file.0.exists());
        drop(outbox);
        assert_eq!(files(), before);

        let refused = TestOutbox::with(crate::Dispatcher::builder_empty(), |b| {
            b.config(OutboxConfig::default().handler_timeout(Duration::ZERO))
        })
        .await;
        assert!(refused.is_err());
        assert_eq!(files(), before, "a failed TestOutbox::with left its files");
    }
}

//! A worker's lease: the row that makes its claimed deliveries its own — written by its first
//! claim, in the claim's transaction — renewed by a task of its own every `lease / 3` for as
//! long as the lease is held. Claims nothing itself.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use uuid::Uuid;

use super::clock::Clock;
use crate::store::{Store, StoreError};

/// A held lease. Dropping it stops the renewal (the lease then lapses by itself);
/// [`release`](Self::release) gives its deliveries back at once.
pub(crate) struct Lease {
    token: String,
    owner: String,
    store: Store,
    renewal: JoinHandle<()>,
    /// Whether a claim wrote the lease row (else releasing it has nothing to do).
    written: std::sync::atomic::AtomicBool,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.renewal.abort();
    }
}

fn owner() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}

impl Lease {
    /// A new lease token, renewed every `length / 3` once a claim has written its row.
    ///
    /// # Panics
    /// Outside a tokio runtime (the renewal is a task).
    pub(crate) fn new(store: &Store, clock: Arc<dyn Clock>, length: Duration) -> Lease {
        let token = Uuid::now_v7().to_string();
        let renewal = tokio::spawn(renew(store.clone(), token.clone(), clock, length));
        Lease {
            token,
            owner: owner(),
            store: store.clone(),
            renewal,
            written: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Records that a claim under this lease leased something (and wrote its row).
    pub(crate) fn mark_written(&self) {
        self.written
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    pub(crate) fn token(&self) -> &str {
        &self.token
    }

    /// Stops renewing, gives every pending delivery still leased to it back (due as before,
    /// no attempt counted) and deletes the lease row. Returns the deliveries given back.
    pub(crate) async fn release(self) -> Result<u64, StoreError> {
        self.renewal.abort();
        if !self.written.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(0);
        }
        self.store.backend().drop_lease(&self.token).await
    }
}

async fn renew(store: Store, token: String, clock: Arc<dyn Clock>, length: Duration) {
    let every = length / 3;
    let ms = length.as_millis() as i64;
    loop {
        tokio::time::sleep(every).await;
        // A renewal touches the lease row only: it never waits on the worker's own batch
        // transaction (row locks on PostgreSQL). On SQLite it waits for the write lock like
        // any writer, and no other worker can claim while that lock is held either.
        // Renewing a lease no claim has written yet (or one deleted after it lapsed) changes
        // nothing: the next claim writes it again.
        if let Err(e) = store
            .backend()
            .renew_lease(&token, clock.now_ms() + ms)
            .await
        {
            tracing::warn!(
                lease = %token,
                error = %event_core::ErrorChain(&e),
                "renewing the worker's lease failed; trying again"
            );
        }
    }
}

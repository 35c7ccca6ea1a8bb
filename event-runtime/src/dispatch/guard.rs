//! The in-memory idempotency guard: remembers which (handler, event id) pairs already ran, in
//! a bounded LRU. Knows nothing of handlers beyond their index in the registry.

use std::num::NonZeroUsize;
use std::sync::Mutex;

use lru::LruCache;
use uuid::Uuid;

/// Default number of (handler, event id) pairs remembered.
pub const DEFAULT_GUARD_CAPACITY: usize = 10_000;

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    InFlight,
    Done,
}

/// Keyed by (handler index, event id); the handler index stands for the handler name, which is
/// unique in a registry.
pub(crate) struct IdempotencyGuard {
    seen: Mutex<LruCache<(u32, Uuid), State>>,
}

pub(crate) enum Admission {
    /// Not seen: now reserved as in flight; call [`IdempotencyGuard::finish`].
    Run,
    /// Already ran, or running now in another task.
    Duplicate,
}

impl IdempotencyGuard {
    pub(crate) fn new(capacity: NonZeroUsize) -> Self {
        IdempotencyGuard {
            seen: Mutex::new(LruCache::new(capacity)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<(u32, Uuid), State>> {
        // A panic while holding the lock cannot leave the cache inconsistent (every operation
        // on it is a single call), so a poisoned lock is still usable.
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn admit(&self, handler: u32, event: Uuid) -> Admission {
        let mut inserted = false;
        // One lookup: inserts as in flight, or finds the pair (and makes it most recent).
        self.lock().get_or_insert((handler, event), || {
            inserted = true;
            State::InFlight
        });
        if inserted {
            Admission::Run
        } else {
            Admission::Duplicate
        }
    }

    /// Marks the pair done after success; forgets it after a failure so that a retry runs it.
    pub(crate) fn finish(&self, handler: u32, event: Uuid, succeeded: bool) {
        let mut seen = self.lock();
        if succeeded {
            match seen.peek_mut(&(handler, event)) {
                Some(state) => *state = State::Done,
                // Evicted while the handler ran: remember it again.
                None => {
                    seen.put((handler, event), State::Done);
                }
            }
        } else if seen.peek(&(handler, event)) == Some(&State::InFlight) {
            seen.pop(&(handler, event));
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.lock().cap().get()
    }
}

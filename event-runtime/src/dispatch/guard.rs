//! The in-memory idempotency guard: remembers which (handler, event id) pairs already ran, in
//! a bounded LRU. Knows nothing of handlers beyond their index in the registry.
//!
//! The LRU is written here rather than taken from a crate so that it allocates everything when
//! the dispatcher is built: a slab of entries linked in recency order, and an open-addressing
//! index into it that is never more than half full. Admitting an event and finishing it then
//! allocate nothing, also while the guard fills up and forever after. Admitting takes the
//! lock; finishing after a success (the common case) does not: it turns its own reservation's
//! tag from in flight to done with one compare-and-swap.

use std::num::{NonZeroU64, NonZeroUsize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use uuid::Uuid;

/// Default number of (handler, event id) pairs remembered.
pub const DEFAULT_GUARD_CAPACITY: usize = 10_000;

/// The most pairs a guard remembers: entries are addressed by `u32`, and the index has twice
/// as many buckets as entries.
const MAX_CAPACITY: usize = 1 << 31;

/// "No entry" in the recency links.
const NIL: u32 = u32::MAX;

/// The state in the low two bits of an entry's tag; the rest is the entry's generation,
/// which changes whenever the entry is given to another key.
const FREE: u64 = 0;
const IN_FLIGHT: u64 = 1;
const DONE: u64 = 2;
const STATE: u64 = 0b11;

/// The handler index stands for the handler name, which is unique in a registry.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Key {
    handler: u32,
    event: Uuid,
}

/// 32 bytes: two to a cache line.
#[derive(Clone, Copy, Debug)]
struct Entry {
    key: Key,
    /// The low half of the key's hash, to find its bucket without hashing again.
    hash: u32,
    /// Towards the most recently used.
    prev: u32,
    /// Towards the least recently used (or the next free entry).
    next: u32,
}

/// What [`IdempotencyGuard::admit`] decided.
pub(crate) enum Admission {
    /// Not seen: now reserved as in flight; call [`IdempotencyGuard::finish`] with the ticket.
    Run(Ticket),
    /// Already ran, or running now in another task.
    Duplicate,
}

/// The reservation [`IdempotencyGuard::admit`] made: its entry and the entry's tag then. While
/// the tag is unchanged the entry is still this reservation, so `finish` can mark it done
/// without the lock.
#[derive(Clone, Copy)]
pub(crate) struct Ticket {
    entry: u32,
    tag: NonZeroU64,
}

impl Ticket {
    /// For a dispatcher without a guard.
    pub(crate) const NONE: Ticket = Ticket {
        entry: NIL,
        tag: NonZeroU64::MIN,
    };
}

pub(crate) struct IdempotencyGuard {
    lru: Mutex<Lru>,
    /// Per entry, `generation << 2 | state`. Written under the lock, except by `finish` after
    /// a success, which turns its own reservation from in flight to done with one
    /// compare-and-swap: the common case takes the lock once per dispatch, not twice.
    tags: Box<[AtomicU64]>,
}

struct Lru {
    /// Never grows past `capacity` (allocated up front).
    entries: Vec<Entry>,
    capacity: usize,
    len: usize,
    /// Most and least recently used.
    head: u32,
    tail: u32,
    /// Entries given back by a failed handler, linked through `next`.
    free: u32,
    /// Linear probing; 0 is empty, otherwise `(hash as u32) << 32 | (entry + 1)`. The low bits
    /// of the stored hash are the home bucket, the rest spare most key comparisons.
    index: Box<[u64]>,
    mask: usize,
    /// Per guard, so that event ids chosen by a sender cannot aim at one bucket.
    seed: [u64; 3],
}

impl IdempotencyGuard {
    /// A guard for `capacity` pairs (at most 2³¹), all allocated now.
    pub(crate) fn new(capacity: NonZeroUsize) -> Self {
        let capacity = capacity.get().min(MAX_CAPACITY);
        let buckets = (capacity * 2).next_power_of_two();
        IdempotencyGuard {
            lru: Mutex::new(Lru {
                entries: Vec::with_capacity(capacity),
                capacity,
                len: 0,
                head: NIL,
                tail: NIL,
                free: NIL,
                index: vec![0; buckets].into_boxed_slice(),
                mask: buckets - 1,
                seed: [fastrand::u64(..), fastrand::u64(..), fastrand::u64(..)],
            }),
            tags: (0..capacity).map(|_| AtomicU64::new(FREE)).collect(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        // Nothing under the lock can panic short of a bug in this file (no allocation, no user
        // code), so a poisoned lock still guards a consistent cache.
        self.lru.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves (handler, event) as in flight unless it is known; a known pair becomes the
    /// most recently used. When full, the least recently used pair is forgotten, whatever its
    /// state.
    pub(crate) fn admit(&self, handler: u32, event: Uuid) -> Admission {
        let key = Key { handler, event };
        let mut lru = self.lock();
        let hash = lru.hash(&key);
        if let Some((_, entry)) = lru.find(&key, hash) {
            lru.touch(entry);
            return Admission::Duplicate;
        }
        let (entry, tag) = lru.insert(&self.tags, key, hash, IN_FLIGHT);
        Admission::Run(Ticket {
            entry,
            tag: NonZeroU64::new(tag).expect("an in-flight tag is not 0"),
        })
    }

    /// Marks the pair done after success (where it is, without making it more recent; again
    /// as the most recent if it was evicted while the handler ran); forgets it after a failure
    /// so that a retry runs it.
    #[inline]
    pub(crate) fn finish(&self, ticket: Ticket, handler: u32, event: Uuid, succeeded: bool) {
        if succeeded {
            let reserved = ticket.tag.get();
            if let Some(tag) = self.tags.get(ticket.entry as usize) {
                let done = (reserved & !STATE) | DONE;
                // Unchanged since `admit`: the entry is still this reservation (another
                // admit of the pair is a duplicate and leaves the tag alone).
                if tag
                    .compare_exchange(reserved, done, Ordering::Release, Ordering::Relaxed)
                    .is_ok()
                {
                    return;
                }
            }
        }
        self.finish_locked(Key { handler, event }, succeeded);
    }

    /// `finish` for a failure, or for a reservation that was evicted while its handler ran.
    #[cold]
    fn finish_locked(&self, key: Key, succeeded: bool) {
        let mut lru = self.lock();
        let hash = lru.hash(&key);
        let found = lru.find(&key, hash).map(|(_, entry)| entry);
        match (found, succeeded) {
            // Reserved again by another admit after the eviction: done now.
            (Some(entry), true) => {
                let tag = &self.tags[entry as usize];
                tag.store(
                    (tag.load(Ordering::Relaxed) & !STATE) | DONE,
                    Ordering::Relaxed,
                );
            }
            (None, true) => {
                lru.insert(&self.tags, key, hash, DONE);
            }
            (Some(entry), false) => {
                if self.tags[entry as usize].load(Ordering::Relaxed) & STATE == IN_FLIGHT {
                    lru.remove(&self.tags, entry);
                }
            }
            (None, false) => {}
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len
    }

    pub(crate) fn capacity(&self) -> usize {
        self.lock().capacity
    }
}

/// The high half of the full product folded onto the low half: a cheap mix with good
/// avalanche (as foldhash and wyhash use).
#[inline(always)]
fn folded_multiply(a: u64, b: u64) -> u64 {
    let full = u128::from(a) * u128::from(b);
    (full as u64) ^ ((full >> 64) as u64)
}

impl Lru {
    #[inline(always)]
    fn hash(&self, key: &Key) -> u64 {
        let id = key.event.as_bytes();
        let lo = u64::from_ne_bytes(id[..8].try_into().expect("8 bytes"));
        let hi = u64::from_ne_bytes(id[8..].try_into().expect("8 bytes"));
        let h = folded_multiply(lo ^ self.seed[0], hi ^ self.seed[1]);
        folded_multiply(h ^ u64::from(key.handler), self.seed[2])
    }

    #[inline(always)]
    fn home(&self, hash: u64) -> usize {
        hash as u32 as usize & self.mask
    }

    /// The bucket and entry of `key`.
    #[inline]
    fn find(&self, key: &Key, hash: u64) -> Option<(usize, u32)> {
        let tag = hash as u32;
        let mut bucket = self.home(hash);
        loop {
            let slot = self.index[bucket];
            if slot == 0 {
                return None;
            }
            let entry = (slot as u32).wrapping_sub(1);
            if (slot >> 32) as u32 == tag && self.entries[entry as usize].key == *key {
                return Some((bucket, entry));
            }
            bucket = (bucket + 1) & self.mask;
        }
    }

    /// The bucket that points at `entry`.
    fn bucket_of(&self, entry: u32) -> usize {
        let mut bucket = self.home(u64::from(self.entries[entry as usize].hash));
        while self.index[bucket] as u32 != entry + 1 {
            debug_assert_ne!(self.index[bucket], 0, "an entry in use is indexed");
            bucket = (bucket + 1) & self.mask;
        }
        bucket
    }

    /// Stores a key that is not present, as the most recently used, evicting the least
    /// recently used when full. Returns the entry and its new tag.
    fn insert(&mut self, tags: &[AtomicU64], key: Key, hash: u64, state: u64) -> (u32, u64) {
        let entry = if self.len == self.capacity {
            let oldest = self.tail;
            self.unindex(oldest);
            self.unlink(oldest);
            oldest
        } else {
            self.len += 1;
            if self.free != NIL {
                let free = self.free;
                self.free = self.entries[free as usize].next;
                free
            } else {
                // Within the capacity reserved in `new`: no allocation.
                self.entries.push(Entry {
                    key,
                    hash: hash as u32,
                    prev: NIL,
                    next: NIL,
                });
                (self.entries.len() - 1) as u32
            }
        };
        self.entries[entry as usize] = Entry {
            key,
            hash: hash as u32,
            prev: NIL,
            next: NIL,
        };
        // A new generation: a ticket for the entry's previous key no longer matches.
        let tag = &tags[entry as usize];
        let new = ((tag.load(Ordering::Relaxed) | STATE) + 1) | state;
        tag.store(new, Ordering::Relaxed);
        self.link_front(entry);
        let mut bucket = self.home(hash);
        while self.index[bucket] != 0 {
            bucket = (bucket + 1) & self.mask;
        }
        self.index[bucket] = (hash << 32) | u64::from(entry + 1);
        (entry, new)
    }

    fn remove(&mut self, tags: &[AtomicU64], entry: u32) {
        self.unindex(entry);
        self.unlink(entry);
        let tag = &tags[entry as usize];
        tag.store(tag.load(Ordering::Relaxed) & !STATE, Ordering::Relaxed);
        self.entries[entry as usize].next = self.free;
        self.free = entry;
        self.len -= 1;
    }

    /// Backward-shift deletion: later entries of the probe run move up, so that lookups need
    /// no tombstones.
    fn unindex(&mut self, entry: u32) {
        let mut hole = self.bucket_of(entry);
        let mut bucket = hole;
        loop {
            bucket = (bucket + 1) & self.mask;
            let slot = self.index[bucket];
            if slot == 0 {
                break;
            }
            let home = (slot >> 32) as usize & self.mask;
            // The entry may fill the hole unless its home lies after the hole (cyclically).
            if bucket.wrapping_sub(home) & self.mask >= bucket.wrapping_sub(hole) & self.mask {
                self.index[hole] = slot;
                hole = bucket;
            }
        }
        self.index[hole] = 0;
    }

    fn unlink(&mut self, entry: u32) {
        let Entry { prev, next, .. } = self.entries[entry as usize];
        match prev {
            NIL => self.head = next,
            p => self.entries[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.entries[n as usize].prev = prev,
        }
    }

    fn link_front(&mut self, entry: u32) {
        let head = self.head;
        {
            let e = &mut self.entries[entry as usize];
            e.prev = NIL;
            e.next = head;
        }
        match head {
            NIL => self.tail = entry,
            h => self.entries[h as usize].prev = entry,
        }
        self.head = entry;
    }

    /// Makes `entry` the most recently used.
    fn touch(&mut self, entry: u32) {
        if self.head != entry {
            self.unlink(entry);
            self.link_front(entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference: the same operations on a list ordered from most to least recent.
    #[derive(Default)]
    struct Model {
        capacity: usize,
        list: Vec<(Key, u64)>,
    }

    impl Model {
        fn position(&self, key: &Key) -> Option<usize> {
            self.list.iter().position(|(k, _)| k == key)
        }
        fn put_front(&mut self, key: Key, state: u64) {
            if self.list.len() == self.capacity {
                self.list.pop();
            }
            self.list.insert(0, (key, state));
        }
        fn admit(&mut self, key: Key) -> bool {
            if let Some(i) = self.position(&key) {
                let e = self.list.remove(i);
                self.list.insert(0, e);
                return false;
            }
            self.put_front(key, IN_FLIGHT);
            true
        }
        fn finish(&mut self, key: Key, succeeded: bool) {
            match (self.position(&key), succeeded) {
                (Some(i), true) => self.list[i].1 = DONE,
                (None, true) => self.put_front(key, DONE),
                (Some(i), false) if self.list[i].1 == IN_FLIGHT => {
                    self.list.remove(i);
                }
                _ => {}
            }
        }
    }

    fn contents(guard: &IdempotencyGuard) -> Vec<(Key, u64)> {
        let lru = guard.lock();
        let mut out = Vec::new();
        let mut e = lru.head;
        while e != NIL {
            let entry = lru.entries[e as usize];
            out.push((
                entry.key,
                guard.tags[e as usize].load(Ordering::Relaxed) & STATE,
            ));
            e = entry.next;
        }
        assert_eq!(out.len(), lru.len);
        for (key, _) in &out {
            assert!(lru.find(key, lru.hash(key)).is_some(), "{key:?} is indexed");
        }
        let indexed = lru.index.iter().filter(|&&s| s != 0).count();
        assert_eq!(indexed, lru.len, "nothing else is indexed");
        out
    }

    /// Random admits and finishes (in flight several at a time, some failing, some finishing
    /// after eviction) leave the guard exactly as the reference model.
    #[test]
    fn behaves_as_the_reference_lru() {
        let mut rng = fastrand::Rng::with_seed(7);
        for capacity in [1usize, 2, 3, 8, 50] {
            let guard = IdempotencyGuard::new(NonZeroUsize::new(capacity).unwrap());
            let mut model = Model {
                capacity,
                ..Model::default()
            };
            let mut running: Vec<(Ticket, Key)> = Vec::new();
            for _ in 0..20_000 {
                if running.len() < 4 && rng.bool() {
                    let key = Key {
                        handler: rng.u32(0..3),
                        event: Uuid::from_u128(rng.u128(0..(capacity as u128 * 2 + 2))),
                    };
                    let admitted = guard.admit(key.handler, key.event);
                    let expected = model.admit(key);
                    match admitted {
                        Admission::Run(ticket) => {
                            assert!(expected);
                            running.push((ticket, key));
                        }
                        Admission::Duplicate => assert!(!expected),
                    }
                } else if !running.is_empty() {
                    let (ticket, key) = running.swap_remove(rng.usize(..running.len()));
                    let succeeded = rng.u8(..4) != 0;
                    guard.finish(ticket, key.handler, key.event, succeeded);
                    model.finish(key, succeeded);
                }
                assert_eq!(contents(&guard), model.list, "capacity {capacity}");
            }
        }
    }

    /// Threads admitting and finishing the same few pairs: while nothing is evicted, a pair
    /// never runs twice at once and a success is never run again; with evictions the guard
    /// stays consistent.
    #[test]
    fn concurrent_admits_and_finishes_keep_it_consistent() {
        use std::sync::atomic::AtomicBool;
        for capacity in [64usize, 5] {
            let guard = IdempotencyGuard::new(NonZeroUsize::new(capacity).unwrap());
            let running: Vec<AtomicBool> = (0..32).map(|_| AtomicBool::new(false)).collect();
            let done: Vec<AtomicBool> = (0..32).map(|_| AtomicBool::new(false)).collect();
            std::thread::scope(|s| {
                for seed in 0..4 {
                    let (guard, running, done) = (&guard, &running, &done);
                    s.spawn(move || {
                        let mut rng = fastrand::Rng::with_seed(seed);
                        for _ in 0..20_000 {
                            let k = rng.usize(..32);
                            let event = Uuid::from_u128(k as u128);
                            let Admission::Run(ticket) = guard.admit(0, event) else {
                                continue;
                            };
                            let evicts = capacity < 32;
                            let was = running[k].swap(true, Ordering::SeqCst);
                            assert!(evicts || !was, "pair {k} runs twice at once");
                            assert!(evicts || !done[k].load(Ordering::SeqCst), "{k} ran again");
                            let succeeded = rng.u8(..4) != 0;
                            if succeeded {
                                done[k].store(true, Ordering::SeqCst);
                            }
                            running[k].store(false, Ordering::SeqCst);
                            guard.finish(ticket, 0, event, succeeded);
                        }
                    });
                }
            });
            let contents = contents(&guard);
            assert!(contents.len() <= capacity);
            assert!(
                contents.iter().all(|(_, state)| *state == DONE),
                "none in flight"
            );
        }
    }

    #[test]
    fn capacity_is_bounded_and_allocated_up_front() {
        assert_eq!(std::mem::size_of::<Entry>(), 32);
        let guard = IdempotencyGuard::new(NonZeroUsize::new(100).unwrap());
        assert_eq!((guard.capacity(), guard.len()), (100, 0));
        let lru = guard.lock();
        assert!(lru.entries.capacity() >= 100);
        assert_eq!(lru.index.len(), 256);
    }
}

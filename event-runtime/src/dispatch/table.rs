//! The dispatcher's tables: handlers bound to their resources, each event's route through
//! them, and the type table that finds an event's route. Built once; runs no handler.

use std::any::TypeId;
use std::hash::{Hash, Hasher};

use event_core::{BoundResource, DeliveryMode, HandlerCall, HandlerDescriptor};

use super::dispatcher::Phase;
use super::registry::TypeIdHasher;
use super::report::HandlerNames;

/// A handler with its resources, ready to call.
#[derive(Clone)]
pub(super) struct BoundHandler {
    /// Its index in the registry (and the guard's key).
    pub(super) index: u32,
    pub(super) call: HandlerCall,
    pub(super) descriptor: &'static HandlerDescriptor,
    pub(super) resources: Box<[BoundResource]>,
}

/// One event's handlers, in the two orders they run in (each route holds its own copies, so
/// that a dispatch walks one array).
pub(super) struct Route {
    /// By (priority, name): a whole dispatch.
    pub(super) all: Box<[BoundHandler]>,
    pub(super) names: &'static HandlerNames,
    /// The `in_transaction` handlers, then the after-commit ones, each by (priority, name): a
    /// unit of work runs the first, then the second phase, and reports them in that order.
    pub(super) phased: Box<[BoundHandler]>,
    pub(super) phased_names: &'static HandlerNames,
    pub(super) in_transaction: usize,
    /// Every handler is a plain `fn` and no upcast is needed: dispatch needs no future.
    pub(super) all_sync: bool,
}

impl Route {
    /// The handlers of `phase`, the report position of the first, and the report's names.
    #[inline(always)]
    pub(super) fn phase(&self, phase: Phase) -> (&[BoundHandler], u32, &'static HandlerNames) {
        match phase {
            Phase::All => (&self.all, 0, self.names),
            Phase::Only(DeliveryMode::InTransaction) => {
                (&self.phased[..self.in_transaction], 0, self.phased_names)
            }
            Phase::Only(DeliveryMode::AfterCommit) => (
                &self.phased[self.in_transaction..],
                self.in_transaction as u32,
                self.phased_names,
            ),
        }
    }
}

/// Event type → event index, probed linearly from the bits of the type id (which is a hash
/// already): usually one comparison, where a general hash map spends tens of instructions.
pub(super) struct TypeTable {
    /// `(type, event index)`; a vacant bucket holds `(TypeId::of::<Vacant>(), u32::MAX)`.
    pub(super) buckets: Box<[(TypeId, u32)]>,
    pub(super) mask: usize,
}

/// A type that is never an event: marks vacant buckets.
struct Vacant;

impl TypeTable {
    pub(super) fn new(types: impl ExactSizeIterator<Item = TypeId>) -> Self {
        let len = (types.len() * 2).next_power_of_two();
        let mut table = TypeTable {
            buckets: vec![(TypeId::of::<Vacant>(), u32::MAX); len].into_boxed_slice(),
            mask: len - 1,
        };
        for (index, type_id) in types.enumerate() {
            let mut bucket = Self::home(type_id) & table.mask;
            while table.buckets[bucket].1 != u32::MAX {
                bucket = (bucket + 1) & table.mask;
            }
            table.buckets[bucket] = (type_id, index as u32);
        }
        table
    }

    #[inline(always)]
    fn home(type_id: TypeId) -> usize {
        let mut hasher = TypeIdHasher::default();
        type_id.hash(&mut hasher);
        hasher.finish() as usize
    }

    #[inline(always)]
    pub(super) fn get(&self, type_id: TypeId) -> Option<usize> {
        let mut bucket = Self::home(type_id) & self.mask;
        loop {
            let (t, index) = self.buckets[bucket];
            if t == type_id {
                return Some(index as usize);
            }
            if index == u32::MAX {
                return None;
            }
            bucket = (bucket + 1) & self.mask;
        }
    }
}

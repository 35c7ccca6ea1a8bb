//! Not public API: what [`conformance_suite!`](crate::conformance_suite) expands to calls
//! these. One async function per case, taking the [`Case`]; a family per file (see the
//! [suite's documentation](super) for what each proves).

pub mod catalog;
pub mod crash;
pub mod engine;
pub mod failure_times;
pub mod outbox;
pub mod retarget;
pub mod retention;
pub mod unreadable;

use std::io::Write;
use std::ops::Deref;

/// Re-exported for the expansion's `#[tokio::test(crate = "…")]`.
pub use tokio;

use super::TestDatabase;
use crate::Store;

/// An optional capability of a store's backend (see
/// [`store::backend`](crate::store::backend)) that a case uses, declared at its start with
/// [`Case::needs`]: a backend without it skips the case, saying so, instead of failing it with
/// [`StoreError::Unsupported`](crate::StoreError::Unsupported). Named as the capability's
/// trait is (and as `Unsupported` names it). No case needs `PartitionLeases`: the suite has no
/// instance group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Capability {
    /// [`Inspection`](crate::store::backend::Inspection): dead letters, the audit log,
    /// undelivered event names (`Store::dead_letters`, `audit_log`, `dead_letter_by_id`,
    /// `undelivered_event_names`, so `Outbox::retarget_unregistered`).
    Inspection,
    /// [`DeadLetterOperations`](crate::store::backend::DeadLetterOperations): replay and
    /// purge of dead letters (`Store::resolve_dead_letters`).
    DeadLetterOperations,
    /// [`DestinationOperations`](crate::store::backend::DestinationOperations): purge and
    /// re-target of a destination (`Store::purge_destination`, `retarget_destination`, so
    /// `Outbox::purge_unregistered` and `retarget_unregistered`).
    DestinationOperations,
    /// [`OperationLog`](crate::store::backend::OperationLog): finishing a paged operation's
    /// audit row (the end of every purge and re-target of a destination).
    OperationLog,
}

impl Capability {
    /// Its trait's name.
    fn name(self) -> &'static str {
        match self {
            Capability::Inspection => "Inspection",
            Capability::DeadLetterOperations => "DeadLetterOperations",
            Capability::DestinationOperations => "DestinationOperations",
            Capability::OperationLog => "OperationLog",
        }
    }

    /// Whether `store`'s backend offers it.
    fn offered_by(self, store: &Store) -> bool {
        match self {
            Capability::Inspection => store.inspection().is_some(),
            Capability::DeadLetterOperations => store.dead_letter_operations().is_some(),
            Capability::DestinationOperations => store.destination_operations().is_some(),
            Capability::OperationLog => store.operation_log().is_some(),
        }
    }
}

/// One case on the database its set-up gave: the [`TestDatabase`] (which it derefs to) and
/// the case's name, for the notes of the fixtures and capabilities it needs.
#[derive(Debug)]
pub struct Case {
    name: &'static str,
    db: TestDatabase,
}

impl Case {
    /// Case `name` on `db`.
    pub fn new(name: &'static str, db: TestDatabase) -> Case {
        Case { name, db }
    }

    /// The effects table's DDL, or `None` after saying the case is skipped without it.
    pub(crate) fn effects_table(&self) -> Option<&'static str> {
        self.supplied("effects_table", self.fixtures().effects_table)
    }

    /// The statements that refuse a poisoned dead letter, or `None` after saying so.
    pub(crate) fn refuse_dead_letter(&self) -> Option<&'static [&'static str]> {
        self.supplied("refuse_dead_letter", self.fixtures().refuse_dead_letter)
    }

    /// The statements that lock the deliveries, or `None` after saying so.
    pub(crate) fn lock_deliveries(&self) -> Option<&'static [&'static str]> {
        self.supplied("lock_deliveries", self.fixtures().lock_deliveries)
    }

    /// The edit that leaves an unreadable delivery, or `None` after saying so.
    pub(crate) fn unreadable_delivery(&self) -> Option<&'static str> {
        self.supplied("unreadable_delivery", self.fixtures().unreadable_delivery)
    }

    /// The statement that runs for minutes, or `None` after saying so.
    pub(crate) fn long_statement(&self) -> Option<&'static str> {
        self.supplied("long_statement", self.fixtures().long_statement)
    }

    /// Whether the backend of `store` (one the case opened) offers every capability of
    /// `capabilities`; if not, says that the case is skipped, naming the ones missing. A case
    /// that uses a capability declares it as soon as it has a store:
    ///
    /// ```ignore
    /// if !db.needs(outbox.store(), &[Capability::Inspection]) {
    ///     return;
    /// }
    /// ```
    pub(crate) fn needs(&self, store: &Store, capabilities: &[Capability]) -> bool {
        let missing: Vec<&str> = capabilities
            .iter()
            .filter(|c| !c.offered_by(store))
            .map(|c| c.name())
            .collect();
        if !missing.is_empty() {
            self.skipped(&format!(
                "its backend `{}` does not offer {}",
                store.backend_name(),
                missing.join(", ")
            ));
        }
        missing.is_empty()
    }

    /// The effects table's DDL, in a helper of a case that checked it
    /// ([`effects_table`](Self::effects_table)) first.
    pub(crate) fn checked_effects_table(&self) -> &'static str {
        self.fixtures()
            .effects_table
            .expect("the case checks that the backend supplies the effects table")
    }

    fn supplied<T>(&self, fixture: &str, value: Option<T>) -> Option<T> {
        if value.is_none() {
            self.skipped(&format!("its SqlFixtures have no `{fixture}`"));
        }
        value
    }

    /// Says, on standard error (shown by `cargo test` even for a passing test, unlike the
    /// captured `eprintln!`), that the case is not run, and why.
    pub(crate) fn skipped(&self, why: &str) {
        let _ = writeln!(
            std::io::stderr(),
            "note: conformance case {} skipped on {}: {why} (reported as passed, not run)",
            self.name,
            self.db.label()
        );
    }
}

impl Deref for Case {
    type Target = TestDatabase;

    fn deref(&self) -> &TestDatabase {
        &self.db
    }
}

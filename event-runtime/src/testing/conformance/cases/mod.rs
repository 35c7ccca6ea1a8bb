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

/// One case on the database its set-up gave: the [`TestDatabase`] (which it derefs to) and
/// the case's name, for the notes of the fixtures it needs.
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

//! [`SqlFixtures`]: what the cases need to know about the backend's database beyond the
//! store's API.

/// The statements the conformance cases run beside the store's API, whose SQL differs
/// between databases, and how the database locks writers: part of what the set-up returns
/// ([`TestDatabase`](super::TestDatabase)). A case whose statement is `None` is skipped with
/// a note, not failed.
///
/// Every statement runs through [`Tx::execute`](crate::Tx::execute) (or
/// [`fetch_i64`](crate::Tx::fetch_i64)) in a transaction of the store under test, with `$N`
/// placeholders. A backend over another database starts from [`NONE`](Self::NONE) (or
/// the ready-made value of the closest dialect) and sets what it can:
///
/// ```
/// use event_runtime::testing::conformance::SqlFixtures;
///
/// let mut fixtures = SqlFixtures::NONE;
/// fixtures.effects_table = Some(
///     "CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY AUTO_INCREMENT, \
///      event_id TEXT NOT NULL, handler TEXT NOT NULL, aggregate TEXT NOT NULL, \
///      seq BIGINT NOT NULL)",
/// );
/// fixtures.concurrent_writes = true;
/// assert!(fixtures.refuse_dead_letter.is_none()); // that case is skipped
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqlFixtures {
    /// Creates, unless it exists, the table `effects` where the outbox, unreadable and
    /// retarget cases' handlers record what they did: `id`, an integer key the database
    /// assigns in increasing order of insertion (the cases read effects `ORDER BY id`),
    /// `event_id`, `handler` and `aggregate` (text), `seq` (`BIGINT`). Run once per outbox
    /// a case builds, so it must be idempotent.
    pub effects_table: Option<&'static str>,
    /// Makes the database refuse the insertion of a row into `event_dead_letters` whose
    /// `error_chain` contains `poison`, with an error whose message contains `refused by the
    /// test trigger` (a trigger, typically): what any refusal of the engine's bookkeeping
    /// looks like. Run in one transaction, in order.
    pub refuse_dead_letter: Option<&'static [&'static str]>,
    /// Run first in a transaction of their own, these take the write lock of
    /// `event_deliveries` until the transaction ends: no other transaction can write a
    /// delivery meanwhile. Empty where beginning a transaction already takes it (SQLite
    /// begins `IMMEDIATE`).
    pub lock_deliveries: Option<&'static [&'static str]>,
    /// An operator's hand edit of the pending delivery of the event `$1` (its id as text)
    /// that leaves a row the engine cannot read, still `pending`: a value of a type the
    /// engine never writes where the database keeps any (SQLite), or a value the engine never
    /// writes where it enforces the column's type (PostgreSQL: a negative sequence).
    pub unreadable_delivery: Option<&'static str>,
    /// A query that runs for minutes and returns an integer in its first column: the
    /// handler's time limit must stop it in the database.
    pub long_statement: Option<&'static str>,
    /// Whether a transaction can write while another write transaction is open (row locks:
    /// PostgreSQL). `false` where an open write transaction holds the whole database's write
    /// lock (SQLite): the lost-lease case then makes its point with handlers outside a
    /// transaction only, since one inside would keep the other worker from taking over.
    pub concurrent_writes: bool,
}

impl SqlFixtures {
    /// Nothing supplied: every case that needs a statement is skipped; writers are assumed
    /// to exclude each other.
    pub const NONE: SqlFixtures = SqlFixtures {
        effects_table: None,
        refuse_dead_letter: None,
        lock_deliveries: None,
        unreadable_delivery: None,
        long_statement: None,
        concurrent_writes: false,
    };

    /// This crate's SQLite store.
    pub const SQLITE: SqlFixtures = SqlFixtures {
        effects_table: Some(
            "CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL, handler TEXT NOT NULL, aggregate TEXT NOT NULL, seq BIGINT NOT NULL)",
        ),
        refuse_dead_letter: Some(&[
            "CREATE TRIGGER refuse_poison BEFORE INSERT ON event_dead_letters WHEN NEW.error_chain LIKE '%poison%' BEGIN SELECT RAISE(ABORT, 'dead letter refused by the test trigger'); END",
        ]),
        lock_deliveries: Some(&[]),
        // SQLite keeps any value in any column: a text time where the engine writes
        // milliseconds.
        unreadable_delivery: Some(
            "UPDATE event_deliveries SET next_attempt_at = '2026-12-01 10:00' WHERE event_id = $1",
        ),
        long_statement: Some(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100000000000) SELECT COUNT(*) FROM c",
        ),
        concurrent_writes: false,
    };

    /// This crate's PostgreSQL store.
    pub const POSTGRES: SqlFixtures = SqlFixtures {
        effects_table: Some(
            "CREATE TABLE IF NOT EXISTS effects (id BIGSERIAL PRIMARY KEY, event_id TEXT NOT NULL, handler TEXT NOT NULL, aggregate TEXT NOT NULL, seq BIGINT NOT NULL)",
        ),
        refuse_dead_letter: Some(&[
            "CREATE FUNCTION refuse_poison() RETURNS trigger AS $$ BEGIN IF NEW.error_chain LIKE '%poison%' THEN RAISE EXCEPTION 'dead letter refused by the test trigger'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql",
            "CREATE TRIGGER refuse_poison BEFORE INSERT ON event_dead_letters FOR EACH ROW EXECUTE FUNCTION refuse_poison()",
        ]),
        lock_deliveries: Some(&["LOCK TABLE event_deliveries IN EXCLUSIVE MODE"]),
        // PostgreSQL enforces the column types: a value the engine never writes.
        unreadable_delivery: Some("UPDATE event_deliveries SET sequence = -1 WHERE event_id = $1"),
        long_statement: Some("SELECT CAST(COUNT(*) AS BIGINT) FROM (SELECT pg_sleep(120)) s"),
        concurrent_writes: true,
    };
}

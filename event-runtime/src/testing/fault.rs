//! Fault injection (feature `fault-injection`): where the crash-safety suite can stop the
//! runtime and what the stop does. Never enable it in production builds.

/// Where the crash-safety suite can stop the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FaultPoint {
    /// Unit of work: rows written, before COMMIT.
    BeforeCommit,
    /// Unit of work: after COMMIT, before any delivery.
    AfterCommit,
    /// Delivery: a handler that takes the transaction ran and its writes are in the open
    /// batch transaction.
    DuringHandler,
    /// Delivery: every handler of the batch transaction ran, before it commits.
    AfterHandler,
}

/// What an injected fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FaultAction {
    /// Nothing.
    Continue,
    /// Stop here as a killed process would: the open transaction is abandoned (rolled back
    /// by the database), the lease is no longer renewed (it lapses), and the call returns
    /// [`OutboxError::Injected`](crate::OutboxError::Injected).
    Crash,
    /// Kill the database connection under the open transaction (PostgreSQL:
    /// `pg_terminate_backend`; SQLite: the transaction is dropped), then as `Crash`.
    DropConnection,
    /// Wait this long (asynchronously: the runtime goes on), then go on: a slow step, to let
    /// another process's transaction run in between. At a point without a transaction, as
    /// `Continue` after the wait.
    Pause(std::time::Duration),
}

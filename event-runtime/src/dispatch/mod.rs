//! In-process dispatch: the validated [`Registry`] of events and handlers, the [`Dispatcher`]
//! that routes an envelope to its handlers through a table built once, the idempotency guard,
//! the in-memory [`UnitOfWork`] and the [`DispatchReport`]. No I/O and no database here: the
//! outbox layer calls into this one to run a handler.

mod builder;
pub(crate) mod dispatcher;
pub(crate) mod guard;
pub(crate) mod registry;
pub(crate) mod report;
mod table;
pub(crate) mod uow;

pub use dispatcher::{Dispatch, DispatchError, Dispatcher, DispatcherBuilder};
pub use guard::DEFAULT_GUARD_CAPACITY;
pub use registry::{Registry, RegistryBuilder, RegistryError};
pub use report::{DispatchReport, HandlerOutcome, Outcome, Outcomes, OutcomesIter, PanicMessage};
pub use uow::{CommitError, HandlerErrorSource, UnitOfWork};

//! The path the suite's `#[derive(DomainEvent)]` and `#[event_handler]` name with their
//! `crate = …` option, in place of `::event_core`: every path the generated code uses is
//! `event_core`'s, except `inventory::submit!`, which submits nothing. The suite's events and
//! handlers are therefore not registered: they never join the registry of an application
//! whose tests enable the feature `testing` and build from `inventory`
//! ([`Dispatcher::builder`](crate::Dispatcher::builder)), nor its schema catalog. The cases
//! register them by hand ([`Dispatcher::builder_empty`](crate::Dispatcher::builder_empty)
//! and [`DispatcherBuilder::handler`](crate::DispatcherBuilder::handler)), as before.

pub(crate) mod __private {
    pub(crate) use event_core::__private::*;

    /// Shadows `event_core`'s re-export of `inventory` (a glob import yields to an item).
    pub(crate) mod inventory {
        /// Type-checks the registration and drops it: nothing is submitted.
        macro_rules! submit {
            ($($registration:tt)*) => {
                const _: fn() = || {
                    let _ = $($registration)*;
                };
            };
        }
        pub(crate) use submit;
    }
}

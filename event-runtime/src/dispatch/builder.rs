//! Building a [`Dispatcher`]: resources, hand registration, the guard's capacity, and the
//! start-up validation that binds every handler to what it takes. Dispatches nothing.

use std::any::{Any, TypeId};
use std::num::NonZeroUsize;
use std::sync::Arc;

use event_core::{BoundResource, DeliveryMode, DomainEvent, HandlerCall, HandlerDescriptor};

use super::dispatcher::{Dispatcher, Inner};
use super::guard::IdempotencyGuard;
use super::registry::{Registry, RegistryBuilder, RegistryError, TypeIdMap};
use super::report::HandlerNames;
use super::table::{BoundHandler, Route, TypeTable};
use crate::schema::validate::SchemaValidator;

/// Configures a [`Dispatcher`].
pub struct DispatcherBuilder {
    pub(super) registry: RegistryBuilder,
    pub(super) resources: TypeIdMap<(&'static str, Arc<dyn Any + Send + Sync>)>,
    pub(super) guard_capacity: usize,
    pub(super) transaction_types: Vec<TypeId>,
    pub(super) validate_schemas: bool,
}

impl std::fmt::Debug for DispatcherBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatcherBuilder")
            .field("registry", &self.registry)
            .field(
                "resources",
                &self.resources.values().map(|r| r.0).collect::<Vec<_>>(),
            )
            .field("guard_capacity", &self.guard_capacity)
            .field("validate_schemas", &self.validate_schemas)
            .finish()
    }
}

impl DispatcherBuilder {
    /// Provides a resource: handlers that take `&T` get this value. Replaces an earlier `T`.
    pub fn resource<T: Send + Sync + 'static>(self, value: T) -> Self {
        self.resource_arc(Arc::new(value))
    }

    /// Provides a resource the application keeps a handle to.
    pub fn resource_arc<T: Send + Sync + 'static>(mut self, value: Arc<T>) -> Self {
        self.resources.insert(
            TypeId::of::<T>(),
            (
                std::any::type_name::<T>(),
                value as Arc<dyn Any + Send + Sync>,
            ),
        );
        self
    }

    /// Sets how many (handler, event id) pairs the idempotency guard remembers (default
    /// 10,000, at most 2³¹). `0` turns the guard off. The guard allocates all of it when the
    /// dispatcher is built (about 66 bytes a pair), so that dispatching never allocates.
    pub fn idempotency_capacity(mut self, capacity: usize) -> Self {
        self.guard_capacity = capacity;
        self
    }

    /// Validates every envelope that enters from outside the process — [`Dispatcher::dispatch_raw`],
    /// [`Dispatcher::dispatch_json`] and the inbox ([`Outbox::receive`](crate::Outbox::receive),
    /// the NATS inbox) — against the JSON Schema of its (name, version) before decoding it. Off
    /// by default: a service turns it on for what it consumes from producers it does not
    /// build itself.
    ///
    /// The schemas are the catalog's ([`schema::Catalog`](crate::schema::Catalog): the type
    /// derives `schemars::JsonSchema`), compiled once by [`build`](Self::build); a type without
    /// one is not validated (a warning at build names them). A payload that breaks its schema is
    /// [`DispatchError::Invalid`](crate::DispatchError::Invalid) from dispatch, and an inbox
    /// dead letter of reason [`invalid`](crate::store::DeadLetterReason::Invalid) naming the
    /// JSON pointer of the first violation; under the sequence-aware inbox it holds back its
    /// aggregate's later events as any dead letter does. Events this process records itself
    /// are typed and not validated. The cost is in BENCHMARKS.md (*Inbox*).
    pub fn validate_schemas(mut self, on: bool) -> Self {
        self.validate_schemas = on;
        self
    }

    /// Fails [`build`](Self::build) when fewer than `count` handlers are registered (handler
    /// crates dropped by the linker; see the crate docs, "Linking").
    pub fn expect_handlers(mut self, count: usize) -> Self {
        self.registry = self.registry.expect_handlers(count);
        self
    }

    /// Registers event type `E` by hand (in addition to `inventory`, or instead of it with
    /// [`Dispatcher::builder_empty`]).
    pub fn event<E: DomainEvent>(mut self) -> Self {
        self.registry = self.registry.event::<E>();
        self
    }

    /// Registers handler `H` by hand: `.handler::<my_handler>()`.
    pub fn handler<H: event_core::Handler>(mut self) -> Self {
        self.registry = self.registry.handler::<H>();
        self
    }

    /// Declares the transaction parameter types the runtime that runs this dispatcher can
    /// provide (the store-backed runtime calls this).
    pub(crate) fn provide_transactions(mut self, types: &[TypeId]) -> Self {
        self.transaction_types.extend_from_slice(types);
        self
    }

    /// Validates the registry and the resources and builds the dispatcher. Nothing is
    /// dispatched before this succeeds.
    ///
    /// # Errors
    /// Every [`RegistryError`]: duplicate (name, version), an upcast chain with a gap or a
    /// fork, a handler of an older version than the newest, duplicate handler names, fewer
    /// handlers than expected, a resource a handler takes that was not provided, a handler
    /// that needs a transaction; with [`validate_schemas`](Self::validate_schemas), a JSON
    /// Schema that does not compile.
    pub fn build(self) -> Result<Dispatcher, RegistryError> {
        let registry = self.registry.build()?;
        let validator = if self.validate_schemas {
            Some(SchemaValidator::new(&registry)?)
        } else {
            None
        };
        let mut handlers = Vec::with_capacity(registry.handlers().len());
        for &descriptor in registry.handlers() {
            let index = handlers.len() as u32;
            handlers.push(bind(
                descriptor,
                index,
                &self.resources,
                &self.transaction_types,
            )?);
        }
        let routes = (0..registry.events().len())
            .map(|e| route(&registry, &handlers, e))
            .collect();
        let types = TypeTable::new(registry.events().iter().map(|e| (e.type_id)()));
        let guard = NonZeroUsize::new(self.guard_capacity).map(IdempotencyGuard::new);
        let resources = self
            .resources
            .into_iter()
            .map(|(k, (_, v))| (k, v))
            .collect();
        Ok(Dispatcher {
            inner: Arc::new(Inner {
                registry,
                handlers,
                types,
                routes,
                resources,
                guard,
                validator,
            }),
        })
    }
}

/// Binds the handler `descriptor`, the `index`-th of the registry, to what it takes from
/// `resources`; refuses a resource not provided and a transaction type not among
/// `transaction_types` (those this runtime can provide).
fn bind(
    descriptor: &'static HandlerDescriptor,
    index: u32,
    resources: &TypeIdMap<(&'static str, Arc<dyn Any + Send + Sync>)>,
    transaction_types: &[TypeId],
) -> Result<BoundHandler, RegistryError> {
    if let Some(tx) = descriptor
        .transaction
        .filter(|t| !transaction_types.contains(&(t.type_id)()))
    {
        return Err(RegistryError::TransactionUnavailable {
            handler: descriptor.name,
            type_name: (tx.type_name)(),
        });
    }
    let resources = descriptor
        .resources
        .iter()
        .map(|r| {
            resources
                .get(&(r.type_id)())
                .map(|(_, v)| BoundResource::new(Arc::clone(v)))
                .ok_or(RegistryError::MissingResource {
                    handler: descriptor.name,
                    type_name: (r.type_name)(),
                })
        })
        .collect::<Result<_, _>>()?;
    Ok(BoundHandler {
        index,
        call: descriptor.call,
        descriptor,
        resources,
    })
}

/// The route of event `e`: its handlers in order, the same with the `in_transaction` ones
/// first, and whether a dispatch of it can skip the future.
fn route(registry: &Registry, handlers: &[BoundHandler], e: usize) -> Route {
    let all: Vec<BoundHandler> = registry
        .handlers_of(e)
        .iter()
        .map(|&h| handlers[h as usize].clone())
        .collect();
    let (mut phased, after): (Vec<_>, Vec<_>) = all
        .iter()
        .cloned()
        .partition(|h| h.descriptor.mode == DeliveryMode::InTransaction);
    let in_transaction = phased.len();
    phased.extend(after);
    let names = |list: &[BoundHandler]| {
        let names: Vec<_> = list.iter().map(|h| h.descriptor.name).collect();
        HandlerNames::intern(&names)
    };
    Route {
        names: names(&all),
        phased_names: names(&phased),
        // An older version that must be upcast first takes the slow path too: the
        // check costs the events that need no upcast nothing.
        all_sync: registry.upcast_target(e).is_none()
            && all.iter().all(|h| matches!(h.call, HandlerCall::Sync(_))),
        all: all.into_boxed_slice(),
        phased: phased.into_boxed_slice(),
        in_transaction,
    }
}

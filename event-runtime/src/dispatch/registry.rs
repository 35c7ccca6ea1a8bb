//! The registry: every event type and handler of the program, validated once before any event
//! flows. Owns the lookup tables; does not run handlers.

mod validate;

use std::any::TypeId;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

use event_core::{
    AnyEnvelope, DecodeError, DomainEvent, EventDescriptor, Handler, HandlerDescriptor, RawEnvelope,
};

use self::validate::Chains;

/// A hasher for `TypeId` keys: a `TypeId` is already a hash, so this passes its bits through.
#[derive(Default)]
pub(crate) struct TypeIdHasher(u64);

impl Hasher for TypeIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // TypeId hashes through write_u64 today; fold anything else in so that a change in
        // std stays correct (just slower).
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 ^= n;
    }
}

pub(crate) type TypeIdMap<V> = HashMap<TypeId, V, BuildHasherDefault<TypeIdHasher>>;

/// The registry failed validation. Each variant names the Rust types or handlers involved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Two Rust types claim the same (name, version).
    #[error("event `{name}` version {version} is declared twice: by `{first}` and by `{second}`; give one of them another name or version")]
    DuplicateEvent {
        /// The event name.
        name: &'static str,
        /// The event version.
        version: u32,
        /// One Rust type.
        first: &'static str,
        /// The other Rust type.
        second: &'static str,
    },
    /// Two handlers share a name, so they would share idempotency keys.
    #[error("two handlers are named `{name}` ({first} and {second}); handler names are idempotency keys and must be unique: pin one with #[event_handler(name = \"…\")]")]
    DuplicateHandlerName {
        /// The shared name.
        name: &'static str,
        /// `file:line` of one.
        first: String,
        /// `file:line` of the other.
        second: String,
    },
    /// Fewer handlers were linked than the application said to expect.
    #[error("expected at least {expected} event handlers, found {found} ({names}); a crate of handlers that nothing references is not linked: add `use that_crate as _;` to the binary (see the crate docs, \"Linking\")")]
    TooFewHandlers {
        /// What `expect_handlers` said.
        expected: usize,
        /// How many were registered.
        found: usize,
        /// The names of those found, comma-separated.
        names: String,
    },
    /// A handler takes `&T`, and no `T` was provided to the dispatcher.
    #[error("handler `{handler}` takes a resource of type `{type_name}`, which was not provided: call `.resource(…)` with a `{type_name}` on the dispatcher builder")]
    MissingResource {
        /// The handler name.
        handler: &'static str,
        /// The resource type.
        type_name: &'static str,
    },
    /// A version of an event has no upcast from the version registered just below it.
    #[error("event `{name}` v{version} (`{type_name}`) has no upcast from v{previous_version} (`{previous_type}`), which is registered: declare #[event(upcast_from = …)] on `{type_name}` naming `{previous_type}`, with `impl From<…> for …`, so that v{previous_version} envelopes reach the handlers of v{version}")]
    MissingUpcast {
        /// The event name.
        name: &'static str,
        /// The version without an upcast.
        version: u32,
        /// Its Rust type.
        type_name: &'static str,
        /// The version registered just below it.
        previous_version: u32,
        /// Its Rust type.
        previous_type: &'static str,
    },
    /// A version upcasts from an older one while a version in between is registered: the
    /// chain has a gap.
    #[error("event `{name}` v{version} (`{type_name}`) upcasts from v{from_version} (`{from_type}`), skipping v{skipped_version} (`{skipped_type}`), which is registered: upcast `{type_name}` from `{skipped_type}`, so that every version converts into the next (v1 → v2 → v3)")]
    UpcastGap {
        /// The event name.
        name: &'static str,
        /// The version whose upcast skips.
        version: u32,
        /// Its Rust type.
        type_name: &'static str,
        /// The version it upcasts from.
        from_version: u32,
        /// Its Rust type.
        from_type: &'static str,
        /// The version registered in between.
        skipped_version: u32,
        /// Its Rust type.
        skipped_type: &'static str,
    },
    /// Two versions upcast from the same one: the chain forks.
    #[error("event `{name}` v{from_version} (`{from_type}`) is upcast from twice, by `{first}` (v{first_version}) and by `{second}` (v{second_version}): each version converts into one version, the next; upcast `{second}` from `{first}`")]
    DuplicateUpcast {
        /// The event name.
        name: &'static str,
        /// The version upcast from twice.
        from_version: u32,
        /// Its Rust type.
        from_type: &'static str,
        /// The lower of the two versions upcasting from it.
        first_version: u32,
        /// Its Rust type.
        first: &'static str,
        /// The higher one.
        second_version: u32,
        /// Its Rust type.
        second: &'static str,
    },
    /// An upcast whose source is not an older version of the same event (a descriptor built by
    /// hand: the derive refuses this at compile time).
    #[error("`{type_name}` (`{name}` v{version}) upcasts from `{from_type}` (`{from_name}` v{from_version}): an upcast source must be an older version of the same event")]
    InvalidUpcast {
        /// The event name.
        name: &'static str,
        /// The version.
        version: u32,
        /// Its Rust type.
        type_name: &'static str,
        /// The source's name.
        from_name: &'static str,
        /// The source's version.
        from_version: u32,
        /// The source's Rust type.
        from_type: &'static str,
    },
    /// A handler takes an older version of an event than the newest registered one. Envelopes
    /// are upcast to the newest version and never downcast, so it would never see an event
    /// recorded as the newer version.
    #[error("handler `{handler}` takes `{name}` v{version} (`{type_name}`), but v{latest_version} (`{latest_type}`) is registered: envelopes are upcast to the newest version and never downcast, so this handler would miss every event recorded as v{latest_version}; take `{latest_type}` instead (older envelopes are upcast to it)")]
    HandlerTakesOldVersion {
        /// The handler name.
        handler: &'static str,
        /// The event name.
        name: &'static str,
        /// The version it takes.
        version: u32,
        /// Its Rust type.
        type_name: &'static str,
        /// The newest registered version.
        latest_version: u32,
        /// Its Rust type.
        latest_type: &'static str,
    },
    /// A handler takes `&mut T` (a transaction) and this runtime provides none.
    #[error("handler `{handler}` takes `&mut {type_name}`, which this runtime cannot provide: the in-memory Dispatcher provides no transaction (build it with Dispatcher::builder_empty() and register only the handlers it runs), and an Outbox provides `&mut event_runtime::Tx` on any store, plus `&mut sqlx::SqliteConnection` on SQLite or `&mut sqlx::PgConnection` on PostgreSQL")]
    TransactionUnavailable {
        /// The handler name.
        handler: &'static str,
        /// The transaction type.
        type_name: &'static str,
    },
    /// Schema validation is on ([`DispatcherBuilder::validate_schemas`](crate::DispatcherBuilder::validate_schemas))
    /// and an event type's JSON Schema is not one the validator compiles.
    #[error("the JSON Schema of `{name}` v{version} (`{type_name}`) does not compile: {message}")]
    InvalidSchema {
        /// The event name.
        name: &'static str,
        /// The event version.
        version: u32,
        /// Its Rust type.
        type_name: &'static str,
        /// The validator's message.
        message: String,
    },
}

/// Builds a [`Registry`] from `inventory` ([`Registry::from_inventory`]) or by hand
/// ([`Registry::builder`]).
#[derive(Debug, Default)]
pub struct RegistryBuilder {
    events: Vec<EventDescriptor>,
    handlers: Vec<&'static HandlerDescriptor>,
    expected_handlers: Option<usize>,
}

impl RegistryBuilder {
    /// Registers event type `E`.
    pub fn event<E: DomainEvent>(mut self) -> Self {
        self.events.push(EventDescriptor::of::<E>());
        self
    }

    /// Registers an event by descriptor.
    pub fn event_descriptor(mut self, descriptor: EventDescriptor) -> Self {
        self.events.push(descriptor);
        self
    }

    /// Registers the handler `H` — the type `#[event_handler]` emits under the function's
    /// name: `.handler::<on_order_placed>()`. Its event type is registered with it (and the
    /// versions that type upcasts from).
    pub fn handler<H: Handler>(self) -> Self {
        self.handler_descriptor(H::DESCRIPTOR)
    }

    /// Registers a handler by descriptor. Its event type is registered with it.
    pub fn handler_descriptor(mut self, descriptor: &'static HandlerDescriptor) -> Self {
        self.handlers.push(descriptor);
        self
    }

    /// Fails [`build`](Self::build) when fewer than `count` handlers are registered: the guard
    /// against handler crates the linker dropped.
    pub fn expect_handlers(mut self, count: usize) -> Self {
        self.expected_handlers = Some(count);
        self
    }

    /// Validates and builds.
    ///
    /// The event types are those registered, those of the handlers, and, transitively, those
    /// they upcast from.
    ///
    /// # Errors
    /// [`RegistryError::DuplicateEvent`], [`RegistryError::InvalidUpcast`],
    /// [`RegistryError::DuplicateUpcast`], [`RegistryError::UpcastGap`],
    /// [`RegistryError::MissingUpcast`], [`RegistryError::DuplicateHandlerName`],
    /// [`RegistryError::TooFewHandlers`], [`RegistryError::HandlerTakesOldVersion`].
    pub fn build(self) -> Result<Registry, RegistryError> {
        let (events, by_type) = validate::collect_events(self.events, &self.handlers)?;
        let chains = Chains::validate(&events, &by_type)?;
        let handlers = validate::order_handlers(self.handlers, self.expected_handlers)?;
        let handlers_of = validate::route_handlers(&events, &by_type, &chains.latest, &handlers)?;
        let upcast_to = validate::upcast_targets(&chains.latest, &handlers_of);
        Ok(Registry {
            events,
            by_type,
            versions: chains.versions,
            handlers,
            handlers_of,
            newer: chains.newer,
            latest: chains.latest,
            upcast_to,
        })
    }
}

/// Every event type and handler of the program, validated: no two types share a (name,
/// version), handler names are unique, and handlers are ordered by priority then name (never by
/// link order).
#[derive(Debug)]
pub struct Registry {
    events: Vec<EventDescriptor>,
    by_type: TypeIdMap<usize>,
    versions: HashMap<&'static str, Vec<(u32, usize)>>,
    handlers: Vec<&'static HandlerDescriptor>,
    handlers_of: Vec<Vec<u32>>,
    /// Per event: the event that upcasts from it (the next version).
    newer: Vec<Option<u32>>,
    /// Per event: the newest version of its name.
    latest: Vec<u32>,
    /// Per event: the newest version of its name, when that is another event with handlers.
    upcast_to: Vec<Option<u32>>,
}

impl Registry {
    /// An empty builder, for registering events and handlers by hand (tests, or platforms where
    /// `inventory` cannot run).
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder::default()
    }

    /// A builder holding every event and handler declared with the macros in the linked
    /// program. More can be added by hand.
    pub fn from_inventory() -> RegistryBuilder {
        RegistryBuilder {
            events: event_core::registered_events().collect(),
            handlers: event_core::registered_handlers().collect(),
            expected_handlers: None,
        }
    }

    /// Every event type, in registration order.
    pub fn events(&self) -> &[EventDescriptor] {
        &self.events
    }

    /// Every handler, by priority then name.
    pub fn handlers(&self) -> &[&'static HandlerDescriptor] {
        &self.handlers
    }

    /// The descriptor of the event type `type_id`.
    pub fn event_by_type(&self, type_id: TypeId) -> Option<&EventDescriptor> {
        self.by_type.get(&type_id).map(|&i| &self.events[i])
    }

    /// The descriptor of (name, version).
    ///
    /// # Errors
    /// [`DecodeError::UnknownName`] when no version of `name` is registered;
    /// [`DecodeError::UnknownVersion`] when others are.
    pub fn event_by_name(&self, name: &str, version: u32) -> Result<&EventDescriptor, DecodeError> {
        let versions = self
            .versions
            .get(name)
            .ok_or_else(|| DecodeError::UnknownName {
                name: name.to_owned(),
                version,
            })?;
        match versions.iter().find(|(v, _)| *v == version) {
            Some(&(_, i)) => Ok(&self.events[i]),
            None => Err(DecodeError::UnknownVersion {
                name: name.to_owned(),
                version,
                known: versions.iter().map(|(v, _)| *v).collect(),
            }),
        }
    }

    /// Decodes a raw envelope into the registered type of its (name, version).
    ///
    /// # Errors
    /// As [`event_by_name`](Self::event_by_name), and [`DecodeError::Payload`] when the payload
    /// does not fit the type.
    pub fn decode(&self, raw: &RawEnvelope) -> Result<Box<dyn AnyEnvelope>, DecodeError> {
        let descriptor = self.event_by_name(&raw.name, raw.version)?;
        (descriptor.decode)(raw)
    }

    /// Decodes a raw envelope, as [`decode`](Self::decode), and upcasts it to the newest
    /// registered version of its event: what a handler of that event is given.
    ///
    /// # Errors
    /// As [`decode`](Self::decode).
    pub fn decode_latest(&self, raw: &RawEnvelope) -> Result<Box<dyn AnyEnvelope>, DecodeError> {
        let envelope = self.decode(raw)?;
        let index = self
            .event_index(envelope.event_type_id())
            .expect("decoded into a registered type");
        let latest = self.latest[index] as usize;
        self.upcast_index(envelope, index, latest)
    }

    /// The newest registered version of the event `name`.
    pub fn latest_version(&self, name: &str) -> Option<&EventDescriptor> {
        let &(_, i) = self.versions.get(name)?.last()?;
        Some(&self.events[self.latest[i] as usize])
    }

    /// Upcasts `envelope` step by step (v1 → v2 → v3) to the registered event type `to`, through
    /// the upcasters its versions declare. An envelope already of type `to` is returned as it
    /// is.
    ///
    /// # Errors
    /// [`DecodeError::NoUpcastPath`] when `to` is not registered, is another event, or is an
    /// older version than the envelope's (envelopes are never downcast); or when the
    /// envelope's type is not registered.
    pub fn upcast(
        &self,
        envelope: Box<dyn AnyEnvelope>,
        to: TypeId,
    ) -> Result<Box<dyn AnyEnvelope>, DecodeError> {
        let no_path =
            |reason: &'static str, target: Option<&EventDescriptor>| DecodeError::NoUpcastPath {
                name: envelope.name().to_owned(),
                version: envelope.version(),
                target_name: target.map_or("?", |t| t.name),
                target_version: target.map_or(0, |t| t.version),
                target_type: target.map_or("?", |t| t.type_name),
                reason,
            };
        let Some(target) = self.event_index(to) else {
            return Err(no_path("the target type is not registered", None));
        };
        let t = &self.events[target];
        let Some(from) = self.event_index(envelope.event_type_id()) else {
            return Err(no_path("the envelope's type is not registered", Some(t)));
        };
        if envelope.name() != t.name {
            return Err(no_path("the target is another event", Some(t)));
        }
        if envelope.version() > t.version {
            return Err(no_path(
                "the target is an older version, and envelopes are never downcast",
                Some(t),
            ));
        }
        self.upcast_index(envelope, from, target)
    }

    /// Follows the chain from event `from` to event `to` (the same name, not older).
    fn upcast_index(
        &self,
        envelope: Box<dyn AnyEnvelope>,
        from: usize,
        to: usize,
    ) -> Result<Box<dyn AnyEnvelope>, DecodeError> {
        if from == to {
            return Ok(envelope);
        }
        self.upcast_ref(&*envelope, from, to)
    }

    /// Upcasts a borrowed envelope of event `from` to event `to`, a newer version of the same
    /// name, one step at a time. `from` and `to` differ.
    pub(crate) fn upcast_ref(
        &self,
        envelope: &dyn AnyEnvelope,
        mut from: usize,
        to: usize,
    ) -> Result<Box<dyn AnyEnvelope>, DecodeError> {
        let target = &self.events[to];
        let mut current: Option<Box<dyn AnyEnvelope>> = None;
        while from != to {
            let step = self.newer[from].map(|n| n as usize).and_then(|next| {
                let upcaster = self.events[next].upcast_from?;
                let source = current.as_deref().unwrap_or(envelope);
                Some((next, (upcaster.convert)(source)?))
            });
            let Some((next, upcast)) = step else {
                return Err(DecodeError::NoUpcastPath {
                    name: envelope.name().to_owned(),
                    version: envelope.version(),
                    target_name: target.name,
                    target_version: target.version,
                    target_type: target.type_name,
                    reason: "no chain of registered upcasters leads there",
                });
            };
            current = Some(upcast);
            from = next;
        }
        current.ok_or(DecodeError::NoUpcastPath {
            name: envelope.name().to_owned(),
            version: envelope.version(),
            target_name: target.name,
            target_version: target.version,
            target_type: target.type_name,
            reason: "the envelope is already of the target type",
        })
    }

    /// The handlers that run for an envelope of the event type `type_id`: those of the newest
    /// version of its event (older envelopes are upcast to it), by priority then name.
    pub fn handlers_for(
        &self,
        type_id: TypeId,
    ) -> impl Iterator<Item = &'static HandlerDescriptor> + '_ {
        let latest = self.event_index(type_id).map(|i| self.latest[i] as usize);
        latest
            .into_iter()
            .flat_map(|i| self.handlers_of[i].iter())
            .map(|&h| self.handlers[h as usize])
    }

    /// The event an envelope of event `index` is dispatched as, when it must be upcast first:
    /// the newest version of its name, when that is another event and has handlers.
    #[inline]
    pub(crate) fn upcast_target(&self, index: usize) -> Option<usize> {
        self.upcast_to[index].map(|i| i as usize)
    }

    pub(crate) fn event_index(&self, type_id: TypeId) -> Option<usize> {
        self.by_type.get(&type_id).copied()
    }

    /// Indices into [`handlers`](Self::handlers) of the handlers of event `index`, in order.
    pub(crate) fn handlers_of(&self, index: usize) -> &[u32] {
        &self.handlers_of[index]
    }
}

impl fmt::Display for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.events.iter().enumerate() {
            writeln!(f, "{} v{} ({})", e.name, e.version, e.type_name)?;
            for &h in &self.handlers_of[i] {
                let h = self.handlers[h as usize];
                writeln!(f, "  {} [priority {}, {:?}]", h.name, h.priority, h.mode)?;
            }
        }
        Ok(())
    }
}

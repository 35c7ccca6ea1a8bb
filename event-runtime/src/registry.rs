//! The registry: every event type and handler of the program, validated once before any event
//! flows. Owns the lookup tables; does not run handlers.

use std::any::TypeId;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

use event_core::{
    DecodeError, DomainEvent, EventDescriptor, Handler, HandlerDescriptor, RawEnvelope,
};

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
    /// A handler takes `&mut T` (a transaction) and this runtime provides none.
    #[error("handler `{handler}` takes a transaction `&mut {type_name}`, which the in-memory dispatcher cannot provide; run it through a store-backed unit of work")]
    TransactionUnavailable {
        /// The handler name.
        handler: &'static str,
        /// The transaction type.
        type_name: &'static str,
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
    /// name: `.handler::<on_order_placed>()`. Its event type is registered with it.
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
    /// # Errors
    /// [`RegistryError::DuplicateEvent`], [`RegistryError::DuplicateHandlerName`],
    /// [`RegistryError::TooFewHandlers`].
    pub fn build(self) -> Result<Registry, RegistryError> {
        let mut events: Vec<EventDescriptor> = Vec::new();
        let mut by_type: TypeIdMap<usize> = TypeIdMap::default();
        let all_events = self
            .events
            .into_iter()
            .chain(self.handlers.iter().map(|h| (h.event)()));
        for e in all_events {
            if by_type.contains_key(&(e.type_id)()) {
                continue; // the same type registered twice (inventory and by hand)
            }
            if let Some(other) = events
                .iter()
                .find(|o| o.name == e.name && o.version == e.version)
            {
                let (first, second) = ordered(other.type_name, e.type_name);
                return Err(RegistryError::DuplicateEvent {
                    name: e.name,
                    version: e.version,
                    first,
                    second,
                });
            }
            by_type.insert((e.type_id)(), events.len());
            events.push(e);
        }

        let mut handlers = self.handlers;
        handlers.sort_by(|a, b| (a.priority, a.name).cmp(&(b.priority, b.name)));
        handlers.dedup_by(|a, b| std::ptr::eq(*a, *b));
        let mut by_name: HashMap<&'static str, &'static HandlerDescriptor> = HashMap::new();
        for h in &handlers {
            if let Some(other) = by_name.insert(h.name, h) {
                let a = format!("{}:{}", other.file, other.line);
                let b = format!("{}:{}", h.file, h.line);
                let (first, second) = if a <= b { (a, b) } else { (b, a) };
                return Err(RegistryError::DuplicateHandlerName {
                    name: h.name,
                    first,
                    second,
                });
            }
        }
        if let Some(expected) = self.expected_handlers {
            if handlers.len() < expected {
                return Err(RegistryError::TooFewHandlers {
                    expected,
                    found: handlers.len(),
                    names: handlers
                        .iter()
                        .map(|h| h.name)
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
        }

        let mut handlers_of: Vec<Vec<u32>> = vec![Vec::new(); events.len()];
        for (i, h) in handlers.iter().enumerate() {
            let event = by_type[&((h.event)().type_id)()];
            handlers_of[event].push(i as u32);
        }
        let mut versions: HashMap<&'static str, Vec<(u32, usize)>> = HashMap::new();
        for (i, e) in events.iter().enumerate() {
            versions.entry(e.name).or_default().push((e.version, i));
        }
        for v in versions.values_mut() {
            v.sort_unstable();
        }
        Ok(Registry {
            events,
            by_type,
            versions,
            handlers,
            handlers_of,
        })
    }
}

fn ordered(a: &'static str, b: &'static str) -> (&'static str, &'static str) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
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
    pub fn decode(
        &self,
        raw: &RawEnvelope,
    ) -> Result<Box<dyn event_core::AnyEnvelope>, DecodeError> {
        let descriptor = self.event_by_name(&raw.name, raw.version)?;
        (descriptor.decode)(raw)
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

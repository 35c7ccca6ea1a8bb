//! The AsyncAPI 3.0.0 document of a [`Topology`] and a [`Registry`].
//!
//! Written by hand over `serde_json` rather than through a typed AsyncAPI crate: the Rust
//! crates for AsyncAPI model 2.x (or read documents, not write them), and the document is a
//! fixed shape of a dozen objects. What keeps it right is the test that validates it with the
//! official parser (`@asyncapi/parser`, `tests/tests/topology.rs`).
//!
//! Payload schemas come from the catalog (schemars, JSON Schema 2020-12, with `x-sensitive`
//! on the fields marked `#[event(sensitive)]`); AsyncAPI resolves `$ref` against the whole
//! document, so each schema's `$defs` are moved to `components.schemas` and its references
//! rewritten, and its `$schema` key is dropped (the AsyncAPI Schema Object is a superset of
//! JSON Schema draft 7, whose keywords these schemas use).

use std::collections::{BTreeMap, BTreeSet};

use event_core::{DeliveryMode, EventDescriptor, HandlerDescriptor};
use serde_json::{json, Map, Value};

use super::{ident, mode_name, Events, Ids, ReceiveRoute, SendRoute, Topology, Transport};
use crate::dispatch::registry::Registry;
use crate::RetryPolicy;
use schemas::{envelope_schema, hoist};

mod schemas;

/// The content type of every message: a CloudEvents structured-mode JSON event (CloudEvents
/// NATS protocol binding 1.0).
const CONTENT_TYPE: &str = "application/cloudevents+json";

/// Partitions up to this many are listed as the `{partition}` parameter's `enum`; above, the
/// parameter says the range.
const ENUM_PARTITIONS: u32 = 64;

/// The AsyncAPI 3.0.0 document of `topology` over the event types and handlers of
/// `registry`, as JSON (pretty-print it with `serde_json::to_string_pretty`; object keys are
/// sorted, so the text is the same on every run).
///
/// - `channels`: one per subject an event travels on (see the [module](super)), with every
///   registered version of the event as a message;
/// - `operations`: `send` per relay and channel (its message the event's newest version,
///   the one the application's code commits), `receive` per handler and channel of each
///   inbox (its messages the versions the handler takes, older ones through upcasters);
/// - `components.messages`: each (name, version), `name` the event name, the payload the
///   CloudEvents envelope whose `data` is the event's JSON Schema (in `components.schemas`),
///   the headers its transport sets (NATS: `Nats-Msg-Id`, `Content-Type`);
/// - extensions: `x-events-retry` (attempts, backoff in milliseconds) and
///   `x-events-dead-letter` on operations, `x-events-handler` and `x-events-inbox` on receive
///   operations, `x-events-relay` on send operations, `x-events-local-handlers` and
///   `x-events-dead-letter-queue` at the root.
pub fn asyncapi(registry: &Registry, topology: &Topology) -> Value {
    let events = Events::of(registry);
    let mut doc = Doc::new(topology, &events);
    for route in &topology.sends {
        doc.send(route);
    }
    for route in &topology.receives {
        doc.receive(route);
    }
    let mut doc = doc.finish();
    sort_keys(&mut doc);
    doc
}

/// Sorts the keys of every object under `value`, whether or not `serde_json`'s
/// `preserve_order` feature is on somewhere in the program (then objects keep their
/// insertion order).
fn sort_keys(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.sort_keys();
            map.values_mut().for_each(sort_keys);
        }
        Value::Array(items) => items.iter_mut().for_each(sort_keys),
        _ => {}
    }
}

struct Doc<'a, 'r> {
    topology: &'a Topology,
    events: &'a Events<'r>,
    channels: Map<String, Value>,
    /// Channel id by (transport, stream, address).
    channel_ids: BTreeMap<(String, String, String), String>,
    operations: Map<String, Value>,
    messages: Map<String, Value>,
    schemas: Map<String, Value>,
    /// The message id of each (name, version): unique, however the names look.
    message_ids: BTreeMap<(&'r str, u32), String>,
}

impl<'a, 'r> Doc<'a, 'r> {
    fn new(topology: &'a Topology, events: &'a Events<'r>) -> Self {
        // The headers of the transport the events travel on (the first route's: one
        // transport per application so far).
        let headers = topology
            .sends
            .iter()
            .map(|r| r.transport)
            .chain(topology.receives.iter().map(|r| r.transport))
            .next()
            .map(|t| (t.headers)());
        let mut doc = Doc {
            topology,
            events,
            channels: Map::new(),
            channel_ids: BTreeMap::new(),
            operations: Map::new(),
            messages: Map::new(),
            schemas: Map::new(),
            message_ids: BTreeMap::new(),
        };
        let mut ids = Ids::default();
        for e in events.by_name.values().flatten() {
            let id = ids.id(&format!("{} v{}", e.name, e.version));
            doc.message_ids.insert((e.name, e.version), id);
        }
        let ids: BTreeSet<String> = doc.message_ids.values().cloned().collect();
        for versions in events.by_name.values() {
            for e in versions {
                doc.message(e, &ids, headers.as_ref());
            }
        }
        doc
    }

    /// The message of `e` and its schema, in the components.
    fn message(&mut self, e: &EventDescriptor, ids: &BTreeSet<String>, headers: Option<&Value>) {
        let id = self.message_id(e);
        let data = match crate::privacy::schema_of(e) {
            Some(schema) => {
                let schema = hoist(schema, &id, ids, &mut self.schemas);
                self.schemas.insert(id.clone(), schema);
                json!({ "$ref": format!("#/components/schemas/{id}") })
            }
            None => json!({
                "description": "No JSON Schema: the Rust type does not derive schemars::JsonSchema."
            }),
        };
        let mut message = json!({
            "name": e.name,
            "title": format!("{} v{}", e.name, e.version),
            "contentType": CONTENT_TYPE,
            "payload": envelope_schema(e, data),
            "x-events-version": e.version,
            "x-events-aggregate-type": e.aggregate_type,
            "x-events-rust-type": e.type_name,
        });
        if let Some(headers) = headers {
            message["headers"] = headers.clone();
        }
        if let Some(up) = &e.upcast_from {
            message["x-events-upcast-from"] = json!((up.from)().version);
        }
        if !e.sensitive_fields.is_empty() {
            message["x-events-sensitive-fields"] = json!(e.sensitive_fields);
        }
        self.messages.insert(id, message);
    }

    /// The channel of `name` on (`transport`, `stream`) through `subjects`, created on first
    /// use; its id.
    fn channel(
        &mut self,
        transport: Transport,
        stream: &str,
        subjects: &super::Subjects,
        name: &str,
    ) -> String {
        let address = subjects.address(name);
        let key = (
            transport.protocol.to_owned(),
            stream.to_owned(),
            address.clone(),
        );
        if let Some(id) = self.channel_ids.get(&key) {
            return id.clone();
        }
        let base = ident(&subjects.base(name));
        let mut id = base.clone();
        let mut n = 1;
        while self.channels.contains_key(&id) {
            n += 1;
            id = format!("{base}_{n}");
        }
        let mut messages = Map::new();
        for e in self.events.by_name.get(name).into_iter().flatten() {
            let m = self.message_id(e);
            messages.insert(
                m.clone(),
                json!({ "$ref": format!("#/components/messages/{m}") }),
            );
        }
        let mut parameters = Map::new();
        if subjects.partitions > 1 {
            parameters.insert("partition".into(), partition_parameter(subjects.partitions));
        }
        if subjects.aggregate_token {
            parameters.insert(
                "aggregate".into(),
                json!({ "description": "The aggregate id, each character a subject token cannot \
                    hold (`.`, `*`, `>`, white space) written as `_`." }),
            );
        }
        let mut channel = json!({
            "address": address,
            "title": name,
            "description": format!(
                "The events `{name}` on the {} {} `{stream}`.",
                transport.title, transport.container
            ),
            "messages": messages,
            "x-events-stream": stream,
            "x-events-partitions": subjects.partitions,
        });
        if !parameters.is_empty() {
            channel["parameters"] = Value::Object(parameters);
        }
        let servers: Vec<Value> = self
            .topology
            .servers
            .iter()
            .filter(|(_, s)| s.protocol == transport.protocol)
            .map(|(n, _)| json!({ "$ref": format!("#/servers/{}", pointer_escape(n)) }))
            .collect();
        if !servers.is_empty() {
            channel["servers"] = Value::Array(servers);
        }
        self.channels.insert(id.clone(), channel);
        self.channel_ids.insert(key, id.clone());
        id
    }

    fn send(&mut self, route: &SendRoute) {
        let names: Vec<&str> = self
            .events
            .by_name
            .keys()
            .copied()
            .filter(|n| route.subjects.publishes(n))
            .collect();
        for name in names {
            let channel = self.channel(route.transport, &route.stream, &route.subjects, name);
            // The newest version: the one the application's code commits (older ones are
            // registered to read what was written before).
            let newest: Vec<&EventDescriptor> = self.events.by_name[name]
                .last()
                .copied()
                .into_iter()
                .collect();
            let id = unique(&self.operations, format!("send_{channel}"));
            let operation = json!({
                "action": "send",
                "channel": { "$ref": format!("#/channels/{channel}") },
                "title": format!("Publish {name}"),
                "summary": format!(
                    "The relay `{}` publishes each committed `{name}` after its transaction commits, \
                     at most one unacknowledged publish per aggregate.",
                    route.destination
                ),
                "messages": self.channel_messages(&channel, &newest),
                "x-events-relay": {
                    "destination": route.destination,
                    "stream": route.stream,
                    "inFlight": route.in_flight,
                },
                "x-events-retry": retry(
                    &self
                        .topology
                        .handler_retry
                        .get(&route.destination)
                        .copied()
                        .unwrap_or(route.retry)
                ),
                "x-events-dead-letter": { "handler": route.destination },
            });
            self.operations.insert(id, operation);
        }
    }

    fn receive(&mut self, route: &ReceiveRoute) {
        let names: Vec<&str> = self
            .events
            .by_name
            .keys()
            .copied()
            .filter(|n| route.receives(n))
            .collect();
        for name in names {
            let channel = self.channel(route.transport, &route.stream, &route.subjects, name);
            for handler in self.events.handlers_of(name) {
                let versions = self.events.taken_by(name, handler);
                let id = unique(
                    &self.operations,
                    format!("receive_{}_{channel}", ident(handler.name)),
                );
                let mut operation = json!({
                    "action": "receive",
                    "channel": { "$ref": format!("#/channels/{channel}") },
                    "title": format!("{} handles {name}", handler.name),
                    "summary": format!(
                        "The inbox `{}` commits each received `{name}` into this service's outbox; \
                         the handler `{}` runs {}.",
                        route.inbox,
                        handler.name,
                        match handler.mode {
                            DeliveryMode::InTransaction => "in that transaction",
                            DeliveryMode::AfterCommit => "after it commits, in each aggregate's order",
                        }
                    ),
                    "messages": self.channel_messages(&channel, &versions),
                    "x-events-handler": handler_extension(handler),
                    "x-events-inbox": {
                        "name": route.inbox,
                        "durable": route.durable,
                        "stream": route.stream,
                        "filterSubject": route.filter,
                        "maxDeliver": route.max_deliver,
                        "ackWaitMs": route.ack_wait.as_millis() as u64,
                        "deadLetter": { "handler": route.inbox },
                    },
                });
                self.delivery_extensions(&mut operation, handler, &route.inbox);
                self.operations.insert(id, operation);
            }
        }
    }

    /// `x-events-retry` and `x-events-dead-letter` of `handler`: an in-transaction handler is
    /// not retried, and what it refuses is a dead letter of `commit_dead_letters` (the inbox).
    fn delivery_extensions(
        &self,
        target: &mut Value,
        handler: &HandlerDescriptor,
        commit_dead_letters: &str,
    ) {
        match handler.mode {
            DeliveryMode::AfterCommit => {
                target["x-events-retry"] = retry(&self.topology.retry_of(handler.name));
                target["x-events-dead-letter"] = json!({ "handler": handler.name });
            }
            DeliveryMode::InTransaction => {
                target["x-events-retry"] = Value::Null;
                target["x-events-dead-letter"] = json!({ "handler": commit_dead_letters });
            }
        }
    }

    /// Handlers of the events no inbox receives: the application's own events.
    fn local_handlers(&self) -> Vec<Value> {
        let mut by_handler: BTreeMap<&str, (&HandlerDescriptor, Vec<String>)> = BTreeMap::new();
        for name in self.events.by_name.keys() {
            if self.topology.receivers_of(name).next().is_some() {
                continue;
            }
            for handler in self.events.handlers_of(name) {
                let entry = by_handler
                    .entry(handler.name)
                    .or_insert_with(|| (handler, Vec::new()));
                for e in self.events.taken_by(name, handler) {
                    entry.1.push(format!("{} v{}", e.name, e.version));
                }
            }
        }
        by_handler
            .values()
            .map(|(handler, events)| {
                let mut entry = json!({
                    "handler": handler_extension(handler),
                    "events": events,
                });
                self.delivery_extensions(&mut entry, handler, "the committing transaction");
                if handler.mode == DeliveryMode::InTransaction {
                    // Its error aborts the commit: nothing is dead-lettered.
                    entry["x-events-dead-letter"] = Value::Null;
                }
                entry
            })
            .collect()
    }

    /// `order_placed_v2`: the id of `e`'s message.
    fn message_id(&self, e: &EventDescriptor) -> String {
        self.message_ids
            .get(&(e.name, e.version))
            .cloned()
            .unwrap_or_default()
    }

    /// References to the messages of `versions` in `channel`.
    fn channel_messages(&self, channel: &str, versions: &[&EventDescriptor]) -> Vec<Value> {
        versions
            .iter()
            .map(|e| {
                json!({ "$ref": format!("#/channels/{channel}/messages/{}", self.message_id(e)) })
            })
            .collect()
    }

    fn finish(self) -> Value {
        let t = self.topology;
        let description = t.description.clone().unwrap_or_else(|| {
            format!(
                "The events of `{}`, generated by `events asyncapi` from its event registry and \
                 routes. Every message is a CloudEvents 1.0 structured-mode JSON event; each \
                 aggregate's events carry their `sequence`, and a consumer's inbox applies them \
                 in that order.",
                t.title
            )
        });
        let mut doc = json!({
            "asyncapi": "3.0.0",
            "info": { "title": t.title, "version": t.version, "description": description },
            "defaultContentType": CONTENT_TYPE,
            "channels": self.channels,
            "operations": self.operations,
            "components": { "messages": self.messages, "schemas": self.schemas },
            "x-events-local-handlers": self.local_handlers(),
            "x-events-dead-letter-queue": {
                "table": "event_dead_letters",
                "list": "events dlq list --handler HANDLER",
                "replay": "events dlq replay --handler HANDLER --reason TEXT",
            },
        });
        if !t.servers.is_empty() {
            let servers: Map<String, Value> = t
                .servers
                .iter()
                .map(|(name, s)| {
                    (
                        name.clone(),
                        json!({ "host": s.host, "protocol": s.protocol }),
                    )
                })
                .collect();
            doc["servers"] = Value::Object(servers);
        }
        doc
    }
}

/// `id`, or `id_2`, `id_3` … when `map` has it.
fn unique(map: &Map<String, Value>, id: String) -> String {
    let mut candidate = id.clone();
    let mut n = 1;
    while map.contains_key(&candidate) {
        n += 1;
        candidate = format!("{id}_{n}");
    }
    candidate
}

fn partition_parameter(partitions: u32) -> Value {
    let description = format!(
        "The aggregate's partition, 0 to {}: XXH3-64(aggregate type, byte 0x00, aggregate id) \
         mod {partitions}, so that every event of an aggregate takes one partition.",
        partitions - 1
    );
    if partitions <= ENUM_PARTITIONS {
        let values: Vec<String> = (0..partitions).map(|p| p.to_string()).collect();
        json!({ "description": description, "enum": values })
    } else {
        json!({ "description": description, "examples": ["0", (partitions - 1).to_string()] })
    }
}

fn retry(policy: &RetryPolicy) -> Value {
    json!({
        "maxAttempts": policy.max_attempts,
        "initialBackoffMs": policy.initial_backoff.as_millis() as u64,
        "maxBackoffMs": policy.max_backoff.as_millis() as u64,
        "jitter": "full",
    })
}

fn handler_extension(handler: &HandlerDescriptor) -> Value {
    json!({
        "name": handler.name,
        "delivery": mode_name(handler.mode),
        "ordered": handler.ordered,
        "priority": handler.priority,
    })
}

/// `s` escaped as a JSON Pointer token (RFC 6901: `~` as `~0`, `/` as `~1`).
fn pointer_escape(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

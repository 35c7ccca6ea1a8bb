//! An application's event topology — where its events travel beyond its process — and the two
//! documents generated from it with the [`Registry`]: an AsyncAPI 3.0.0 document
//! ([`asyncapi`], `events asyncapi`) and a Mermaid picture of the flow ([`flow`], `events
//! flow`). Describes only: builds no connection and checks nothing against a broker.
//!
//! A [`Topology`] is declared from the same configuration values the application runs with —
//! its [`OutboxConfig`], per-handler [`HandlerOptions`], each relay's and
//! each inbox's configuration — so that the documents say what the code does. Build both from
//! one function of the application, as `examples/orders` and `examples/billing` do, and hand it
//! to the embedded tool with [`App::topology`](crate::cli::App::topology).
//!
//! ```
//! # #[cfg(feature = "nats")] {
//! use event_core::DomainEvent;
//! use event_runtime::topology::{self, Topology};
//! use event_runtime::transport::nats::RelayConfig;
//! use event_runtime::{OutboxConfig, Registry};
//!
//! #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
//! #[event(name = "order.placed", version = 1)]
//! struct OrderPlaced {
//!     #[event(aggregate_id)]
//!     order_id: String,
//! }
//!
//! let registry = Registry::builder().event::<OrderPlaced>().build()?;
//! let topology = Topology::new("orders", "1.0.0")
//!     .outbox_config(&OutboxConfig::default())
//!     .server("nats", "nats://127.0.0.1:4222")
//!     .nats_relay(&RelayConfig::new("EVENTS").partitions(4));
//! let doc = topology::asyncapi(&registry, &topology);
//! assert_eq!(doc["asyncapi"], "3.0.0");
//! assert_eq!(
//!     doc["channels"]["events_order_placed"]["address"],
//!     "events.{partition}.order.placed"
//! );
//! println!("{}", topology::flow(&registry, &topology, None));
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What is a channel, an operation, a local handler
//! - A **channel** is one subject (NATS) an event name travels on, with every registered
//!   version of the event as its messages. A partitioned stream gives the address a
//!   `{partition}` parameter (its values `0` … `P-1`), the relay's aggregate token an
//!   `{aggregate}` one.
//! - A relay ([`nats_relay`](Topology::nats_relay)) is one **send** operation per channel it
//!   publishes to.
//! - An inbox ([`nats_inbox`](Topology::nats_inbox)) receives the registered events whose
//!   subject (as the producer's relay names them) falls within its filter. Each handler of
//!   such an event is one **receive** operation per channel.
//! - Handlers of events the application commits itself run in its process, not on a channel:
//!   they are listed under `x-events-local-handlers` at the document's root.
//!
//! Retry limits, delivery modes and dead letter queues are `x-events-…` extensions (AsyncAPI
//! 3.0 §"Specification Extensions"). Both documents are deterministic: everything is sorted,
//! so a committed copy can be compared in CI (`events asyncapi --check FILE`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use event_core::{DeliveryMode, EventDescriptor, HandlerDescriptor};

use crate::dispatch::registry::Registry;
use crate::{HandlerOptions, OutboxConfig, RetryPolicy};

mod asyncapi;
mod flow;

pub use asyncapi::asyncapi;
pub use flow::{flow, DestinationCounts, FlowCounts};

/// Where an application's events travel beyond its process, for [`asyncapi`] and [`flow`]:
/// its relays (send), its inboxes (receive), the servers they use, and the retry limits of its
/// handlers. Build it with [`new`](Self::new) and the setters.
#[derive(Debug, Clone)]
pub struct Topology {
    pub(crate) title: String,
    pub(crate) version: String,
    pub(crate) description: Option<String>,
    pub(crate) retry: RetryPolicy,
    pub(crate) handler_retry: BTreeMap<String, RetryPolicy>,
    pub(crate) servers: BTreeMap<String, Server>,
    pub(crate) sends: Vec<SendRoute>,
    pub(crate) receives: Vec<ReceiveRoute>,
}

/// A broker the routes use: an AsyncAPI server object.
#[derive(Debug, Clone)]
pub(crate) struct Server {
    pub(crate) protocol: String,
    /// `host:port`, without user or password.
    pub(crate) host: String,
}

/// How a producer names the subject of each event: its relay's configuration.
#[derive(Debug, Clone)]
pub(crate) struct Subjects {
    pub(crate) prefix: String,
    pub(crate) overrides: BTreeMap<String, String>,
    pub(crate) partitions: u32,
    pub(crate) aggregate_token: bool,
    /// The events the producer publishes, by name; `None`: every one.
    pub(crate) events: Option<BTreeSet<String>>,
}

impl Subjects {
    /// The subject of `name` without partition or aggregate token.
    pub(crate) fn base(&self, name: &str) -> String {
        match self.overrides.get(name) {
            Some(s) => s.clone(),
            None => format!("{}.{name}", self.prefix),
        }
    }

    /// The channel address of `name`: the base subject with `{partition}` after its first
    /// token when partitioned and `{aggregate}` last with the aggregate token.
    pub(crate) fn address(&self, name: &str) -> String {
        let base = self.base(name);
        let mut address = if self.partitions > 1 {
            match base.split_once('.') {
                Some((first, rest)) => format!("{first}.{{partition}}.{rest}"),
                None => format!("{base}.{{partition}}"),
            }
        } else {
            base
        };
        if self.aggregate_token {
            address.push_str(".{aggregate}");
        }
        address
    }

    fn publishes(&self, name: &str) -> bool {
        self.events.as_ref().is_none_or(|e| e.contains(name))
    }
}

/// What the documents say about a transport: its AsyncAPI protocol, its name for people, and
/// the headers its messages carry (a JSON Schema).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Transport {
    /// The AsyncAPI protocol (`nats`), also the scheme of its servers' URLs.
    pub(crate) protocol: &'static str,
    /// `NATS JetStream`.
    pub(crate) title: &'static str,
    /// What its routes publish to and read from: `stream` (NATS), `exchange` (RabbitMQ).
    pub(crate) container: &'static str,
    /// The schema of the headers of its messages.
    pub(crate) headers: fn() -> serde_json::Value,
}

/// A relay: the events it publishes and where.
#[derive(Debug, Clone)]
pub(crate) struct SendRoute {
    pub(crate) transport: Transport,
    /// The destination's name (`nats:EVENTS`).
    pub(crate) destination: String,
    pub(crate) stream: String,
    pub(crate) subjects: Subjects,
    pub(crate) retry: RetryPolicy,
    pub(crate) in_flight: usize,
}

/// An inbox: the events it receives and from where.
#[derive(Debug, Clone)]
pub(crate) struct ReceiveRoute {
    pub(crate) transport: Transport,
    /// The handler name of its dead letters (`nats-inbox:billing`).
    pub(crate) inbox: String,
    pub(crate) stream: String,
    pub(crate) durable: String,
    /// Its subject filter, unpartitioned; `None`: the whole stream.
    pub(crate) filter: Option<String>,
    /// How the producer names the subjects.
    pub(crate) subjects: Subjects,
    pub(crate) max_deliver: i64,
    pub(crate) ack_wait: Duration,
}

impl ReceiveRoute {
    /// Whether the inbox receives the event `name`.
    pub(crate) fn receives(&self, name: &str) -> bool {
        if !self.subjects.publishes(name) {
            return false;
        }
        let Some(filter) = &self.filter else {
            return true;
        };
        let mut subject = self.subjects.base(name);
        if self.subjects.aggregate_token {
            subject.push_str(".x");
        }
        subject_matches(filter, &subject)
    }
}

/// Whether the NATS subject `subject` falls within `filter` (`*` one token, `>` the rest).
pub(crate) fn subject_matches(filter: &str, subject: &str) -> bool {
    let mut subject = subject.split('.');
    for token in filter.split('.') {
        match (token, subject.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (t, Some(s)) if t == s => {}
            _ => return false,
        }
    }
    subject.next().is_none()
}

impl Topology {
    /// A topology with no route, for the application `title` (the AsyncAPI `info.title`, such
    /// as `orders`) at `version` (its `info.version`: the application's version, such as
    /// `env!("CARGO_PKG_VERSION")`). Handlers retry with [`RetryPolicy::default`] until
    /// [`outbox_config`](Self::outbox_config) says otherwise.
    pub fn new(title: impl Into<String>, version: impl Into<String>) -> Self {
        Topology {
            title: title.into(),
            version: version.into(),
            description: None,
            retry: RetryPolicy::default(),
            handler_retry: BTreeMap::new(),
            servers: BTreeMap::new(),
            sends: Vec::new(),
            receives: Vec::new(),
        }
    }

    /// With a description (the AsyncAPI `info.description`, CommonMark).
    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.description = Some(text.into());
        self
    }

    /// The retry policy of every handler, as the application's outbox has it
    /// ([`OutboxConfig::retry`]).
    pub fn outbox_config(mut self, config: &OutboxConfig) -> Self {
        self.retry = config.retry;
        self
    }

    /// The options of one handler or relay, as given to
    /// [`OutboxBuilder::handler_options`](crate::OutboxBuilder::handler_options): its retry
    /// policy, when set, replaces the outbox's (a relay's: its configuration's). Repeat here
    /// each call the application makes there: the topology cannot read the outbox's.
    /// [`warnings`](Self::warnings) names an option for a name that is neither a handler nor
    /// a relay.
    pub fn handler_options(mut self, handler: impl Into<String>, options: &HandlerOptions) -> Self {
        if let Some(retry) = options.retry {
            self.handler_retry.insert(handler.into(), retry);
        }
        self
    }

    /// A broker server named `name` (`nats`) at `url` (`nats://host:port`; its scheme is the
    /// protocol, so a NATS `tls://` URL is written `nats://` here). Of a comma-separated list
    /// (a cluster's servers) the first is written. User, password, path and query are never
    /// written: only `host:port`. The channels of routes whose transport has that protocol
    /// name it.
    pub fn server(mut self, name: impl Into<String>, url: &str) -> Self {
        // The first of a comma-separated list of servers.
        let first = url.split(',').next().unwrap_or(url).trim();
        let (protocol, rest) = first.split_once("://").unwrap_or(("nats", first));
        let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
        let host = authority
            .rsplit_once('@')
            .map_or(authority, |(_, host)| host);
        self.servers.insert(
            name.into(),
            Server {
                protocol: protocol.to_ascii_lowercase(),
                host: host.to_owned(),
            },
        );
        self
    }

    /// The retry policy of `handler`.
    pub(crate) fn retry_of(&self, handler: &str) -> RetryPolicy {
        self.handler_retry
            .get(handler)
            .copied()
            .unwrap_or(self.retry)
    }

    /// What in this topology does not fit `registry`, one sentence each: options for a name
    /// that is neither a registered handler nor a relay, an inbox that receives none of the
    /// registered events (its filter takes none of their subjects), and a received event that
    /// no handler takes. `events asyncapi` and `events flow` print them as warnings.
    pub fn warnings(&self, registry: &Registry) -> Vec<String> {
        let events = Events::of(registry);
        let mut out = Vec::new();
        for name in self.handler_retry.keys() {
            let handler = registry.handlers().iter().any(|h| h.name == name);
            let relay = self.sends.iter().any(|s| s.destination == *name);
            if !handler && !relay {
                out.push(format!(
                    "handler_options(\"{name}\"): no registered handler and no relay of this \
                     topology has that name"
                ));
            }
        }
        for route in &self.receives {
            let received: Vec<&str> = events
                .by_name
                .keys()
                .copied()
                .filter(|n| route.receives(n))
                .collect();
            if received.is_empty() {
                out.push(format!(
                    "inbox {} (filter {}) receives none of the registered events: no subject of \
                     theirs falls within its filter",
                    route.inbox,
                    route.filter.as_deref().unwrap_or(">")
                ));
            }
            for name in received {
                if events.handlers_of(name).is_empty() {
                    out.push(format!(
                        "inbox {} receives {name}, which no registered handler takes",
                        route.inbox
                    ));
                }
            }
        }
        out
    }

    /// The destination names of its relays (`nats:EVENTS`).
    #[cfg(feature = "cli")]
    pub(crate) fn relay_names(&self) -> impl Iterator<Item = &str> {
        self.sends.iter().map(|s| s.destination.as_str())
    }

    /// The dead letter names of its inboxes (`nats-inbox:billing`).
    #[cfg(feature = "cli")]
    pub(crate) fn inbox_names(&self) -> impl Iterator<Item = &str> {
        self.receives.iter().map(|r| r.inbox.as_str())
    }

    /// The inboxes that receive the event `name`.
    pub(crate) fn receivers_of<'t>(
        &'t self,
        name: &'t str,
    ) -> impl Iterator<Item = &'t ReceiveRoute> + 't {
        self.receives.iter().filter(move |r| r.receives(name))
    }

    /// The relays that publish the event `name`.
    pub(crate) fn senders_of<'t>(&'t self, name: &'t str) -> impl Iterator<Item = &'t SendRoute> {
        self.sends
            .iter()
            .filter(move |s| s.subjects.publishes(name))
    }
}

/// The registry seen by event name: each name's versions, oldest first, and the handlers of
/// each name.
pub(crate) struct Events<'r> {
    pub(crate) by_name: BTreeMap<&'r str, Vec<&'r EventDescriptor>>,
    registry: &'r Registry,
}

impl<'r> Events<'r> {
    pub(crate) fn of(registry: &'r Registry) -> Self {
        let mut by_name: BTreeMap<&str, Vec<&EventDescriptor>> = BTreeMap::new();
        for e in registry.events() {
            by_name.entry(e.name).or_default().push(e);
        }
        for versions in by_name.values_mut() {
            versions.sort_by_key(|e| e.version);
        }
        Events { by_name, registry }
    }

    /// The versions of `name` that `handler` takes (directly, or as an older version upcast
    /// into one it takes), oldest first.
    pub(crate) fn taken_by(
        &self,
        name: &str,
        handler: &HandlerDescriptor,
    ) -> Vec<&'r EventDescriptor> {
        let versions = self.by_name.get(name).map(Vec::as_slice).unwrap_or(&[]);
        let direct: Vec<u32> = versions
            .iter()
            .filter(|e| {
                handler
                    .events
                    .iter()
                    .any(|d| (d().type_id)() == (e.type_id)())
            })
            .map(|e| e.version)
            .collect();
        match direct.iter().max() {
            // Older versions reach it through the upcasters, newer ones do not.
            Some(&newest) => versions
                .iter()
                .filter(|e| e.version <= newest)
                .copied()
                .collect(),
            None => Vec::new(),
        }
    }

    /// The handlers of any version of `name`, by name.
    pub(crate) fn handlers_of(&self, name: &str) -> Vec<&'static HandlerDescriptor> {
        let mut handlers: Vec<&'static HandlerDescriptor> = self
            .registry
            .handlers()
            .iter()
            .copied()
            .filter(|h| !self.taken_by(name, h).is_empty())
            .collect();
        handlers.sort_by_key(|h| h.name);
        handlers
    }
}

/// `in-transaction` or `after-commit`.
pub(crate) fn mode_name(mode: DeliveryMode) -> &'static str {
    match mode {
        DeliveryMode::InTransaction => "in-transaction",
        DeliveryMode::AfterCommit => "after-commit",
    }
}

/// `s` as an identifier of AsyncAPI component keys and Mermaid node ids: each character
/// other than `A-Z a-z 0-9 _` becomes `_`. Not injective (`a.b` and `a_b` meet): give each
/// name its id through [`Ids`].
pub(crate) fn ident(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A unique identifier per name: its [`ident`], or with `_2`, `_3` … when an earlier name
/// took that one. The same names asked for in the same order get the same identifiers.
#[derive(Debug, Default)]
pub(crate) struct Ids {
    by_name: BTreeMap<String, String>,
    taken: BTreeSet<String>,
}

impl Ids {
    pub(crate) fn id(&mut self, name: &str) -> String {
        if let Some(id) = self.by_name.get(name) {
            return id.clone();
        }
        let mut base = ident(name);
        if base.is_empty() {
            base.push('_');
        }
        let mut id = base.clone();
        let mut n = 1;
        while self.taken.contains(&id) {
            n += 1;
            id = format!("{base}_{n}");
        }
        self.taken.insert(id.clone());
        self.by_name.insert(name.to_owned(), id.clone());
        id
    }
}

/// 32-bit FNV-1a of `s`: a stable short fingerprint, the same in every process and release.
pub(crate) fn fingerprint(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nats_subject_matching() {
        assert!(subject_matches("events.order.>", "events.order.placed"));
        assert!(subject_matches("events.*.placed", "events.order.placed"));
        assert!(subject_matches(">", "events"));
        assert!(!subject_matches("events.order.>", "events.order"));
        assert!(!subject_matches("events.order.*", "events.order.placed.x"));
        assert!(!subject_matches("events.invoice.>", "events.order.placed"));
        assert!(subject_matches(
            "events.order.placed",
            "events.order.placed"
        ));
    }

    #[test]
    fn addresses_carry_partition_and_aggregate_parameters() {
        let mut s = Subjects {
            prefix: "events".into(),
            overrides: BTreeMap::from([("order.shipped".into(), "ship".into())]),
            partitions: 1,
            aggregate_token: false,
            events: None,
        };
        assert_eq!(s.address("order.placed"), "events.order.placed");
        s.partitions = 4;
        assert_eq!(s.address("order.placed"), "events.{partition}.order.placed");
        assert_eq!(s.address("order.shipped"), "ship.{partition}");
        s.aggregate_token = true;
        assert_eq!(
            s.address("order.placed"),
            "events.{partition}.order.placed.{aggregate}"
        );
    }

    #[test]
    fn servers_never_keep_credentials() {
        let t = Topology::new("a", "1").server("nats", "nats://user:secret@broker:4222/x");
        assert_eq!(t.servers["nats"].host, "broker:4222");
        assert_eq!(t.servers["nats"].protocol, "nats");
        let t = Topology::new("a", "1").server(
            "nats",
            "nats://alice:p@ss@n1:4222?tls=1,nats://bob:x@n2:4223",
        );
        assert_eq!(t.servers["nats"].host, "n1:4222");
    }

    #[test]
    fn ids_are_unique_per_name_and_stable() {
        let mut ids = Ids::default();
        assert_eq!(ids.id("shop.order_placed"), "shop_order_placed");
        assert_eq!(ids.id("shop_order.placed"), "shop_order_placed_2");
        assert_eq!(ids.id("shop_order_placed_2"), "shop_order_placed_2_2");
        assert_eq!(ids.id("shop.order_placed"), "shop_order_placed");
        assert_eq!(ids.id(""), "_");
        assert_eq!(
            fingerprint("events.order.placed"),
            fingerprint("events.order.placed")
        );
        assert_ne!(fingerprint("a.b"), fingerprint("a_b"));
    }
}

//! The event flow of a [`Topology`] and a [`Registry`] as a Mermaid flowchart.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use event_core::{DeliveryMode, EventDescriptor};

use super::{fingerprint, ident, Events, Ids, Topology};
use crate::dispatch::registry::Registry;

/// Live counts for [`flow`], as `events flow --database` reads them from the store.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct FlowCounts {
    /// Per destination name (a handler, a relay, an inbox's dead letters `nats-inbox:…`).
    pub destinations: BTreeMap<String, DestinationCounts>,
    /// Received events held now, waiting for a predecessor in their aggregate's chain (the
    /// whole store: shown on each inbox).
    pub held: u64,
    /// Open gaps (a predecessor that did not arrive after `gap_after`) per aggregate type.
    pub open_gaps: BTreeMap<String, u64>,
}

/// What one destination has in the store now.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct DestinationCounts {
    /// Deliveries not completed yet.
    pub pending: u64,
    /// Age of its oldest pending delivery, in seconds.
    pub oldest_pending_age_secs: Option<f64>,
    /// Open dead letters.
    pub dead_letters: u64,
    /// Whether it is paused now.
    pub paused: bool,
}

impl DestinationCounts {
    /// Counts of `pending` deliveries, the oldest `oldest_pending_age_secs` old, and
    /// `dead_letters` open dead letters, paused or not.
    pub fn new(
        pending: u64,
        oldest_pending_age_secs: Option<f64>,
        dead_letters: u64,
        paused: bool,
    ) -> Self {
        DestinationCounts {
            pending,
            oldest_pending_age_secs,
            dead_letters,
            paused,
        }
    }
}

impl FlowCounts {
    /// No counts.
    pub fn new() -> Self {
        FlowCounts::default()
    }
}

/// The flow of `topology` over `registry` as a Mermaid `flowchart LR`: per event name and
/// version, where it comes from — an aggregate of the application (committed here) or an
/// inbox (received) — the upcasts between its versions (a dotted arrow), each handler that
/// takes it (a thick arrow for an `in-transaction` handler, a thin one `after-commit`; the
/// handler's node says which), and each relay that publishes it (from the newest version: the
/// one the application's code commits; a longer arrow, so that Mermaid places relays after the
/// handlers and their edges do not cross them) to its subject. The application's nodes are in
/// a subgraph named after it, node ids prefixed with it; subjects are outside, with ids made
/// from transport, stream and address, so that the flows of a producer and a consumer put one
/// after the other (without the second's first line) join on their subjects.
///
/// With `counts`, handler, relay and inbox nodes also show their pending deliveries (and the
/// oldest one's age), dead letters and pause, and inboxes the held events and open gaps of the
/// aggregate types they receive. Without, the text is the same on every run.
pub fn flow(registry: &Registry, topology: &Topology, counts: Option<&FlowCounts>) -> String {
    let events = Events::of(registry);
    let mut n = Nodes::new(&topology.title);
    let app = n.app.clone();
    let mut nodes = String::new();
    let mut shared = String::new();
    let mut edges = String::new();
    let mut aggregates: BTreeSet<&str> = BTreeSet::new();
    let mut handlers: BTreeMap<&str, DeliveryMode> = BTreeMap::new();

    for (name, versions) in &events.by_name {
        let receivers: Vec<_> = topology.receivers_of(name).collect();
        for e in versions {
            let node = n.event(e);
            let _ = writeln!(
                nodes,
                "    {node}[\"{}\"]",
                label(&format!("{} v{}", e.name, e.version))
            );
            if receivers.is_empty() {
                aggregates.insert(e.aggregate_type);
                let _ = writeln!(edges, "  {} --> {node}", n.id("agg", e.aggregate_type));
            }
            for r in &receivers {
                let _ = writeln!(edges, "  {} --> {node}", n.id("inbox", &r.durable));
            }
            if let Some(up) = &e.upcast_from {
                let from = (up.from)();
                let _ = writeln!(edges, "  {} -. upcast .-> {node}", n.event(&from));
            }
        }
        for handler in events.handlers_of(name) {
            handlers.insert(handler.name, handler.mode);
            for e in versions.iter().filter(|e| {
                handler
                    .events
                    .iter()
                    .any(|d| (d().type_id)() == (e.type_id)())
            }) {
                let arrow = match handler.mode {
                    DeliveryMode::InTransaction => "==>",
                    DeliveryMode::AfterCommit => "-->",
                };
                let (from, to) = (n.event(e), n.id("h", handler.name));
                let _ = writeln!(edges, "  {from} {arrow} {to}");
            }
        }
        for route in topology.senders_of(name) {
            let subject = subject_node(
                route.transport.protocol,
                &route.stream,
                &route.subjects.address(name),
            );
            let relay = n.id("relay", &route.destination);
            if let Some(newest) = versions.last() {
                let _ = writeln!(edges, "  {} ---> {relay}", n.event(newest));
            }
            let _ = writeln!(edges, "  {relay} --> {subject}");
        }
        for route in &receivers {
            let subject = subject_node(
                route.transport.protocol,
                &route.stream,
                &route.subjects.address(name),
            );
            let _ = writeln!(edges, "  {subject} --> {}", n.id("inbox", &route.durable));
        }
    }
    for aggregate in &aggregates {
        let _ = writeln!(
            nodes,
            "    {}([\"aggregate {}\"])",
            n.id("agg", aggregate),
            label(aggregate)
        );
    }
    for (name, mode) in &handlers {
        let mut text = format!("{name}<br/>{}", super::mode_name(*mode));
        if *mode == DeliveryMode::AfterCommit {
            live(&mut text, counts, name);
        }
        let _ = writeln!(
            nodes,
            "    {}[\"{}\"]",
            n.id("h", name),
            label_keep_breaks(&text)
        );
    }
    let mut subjects: BTreeMap<String, String> = BTreeMap::new();
    for route in &topology.sends {
        let mut text = format!(
            "relay {}<br/>{} {}",
            route.destination, route.transport.container, route.stream
        );
        live(&mut text, counts, &route.destination);
        let _ = writeln!(
            nodes,
            "    {}[[\"{}\"]]",
            n.id("relay", &route.destination),
            label_keep_breaks(&text)
        );
        for name in events
            .by_name
            .keys()
            .filter(|n| route.subjects.publishes(n))
        {
            let address = route.subjects.address(name);
            subjects.insert(
                subject_node(route.transport.protocol, &route.stream, &address),
                address,
            );
        }
    }
    for route in &topology.receives {
        let mut text = format!(
            "inbox {}<br/>{} {}, filter {}",
            route.inbox,
            route.transport.container,
            route.stream,
            route.filter.as_deref().unwrap_or(">")
        );
        live(&mut text, counts, &route.inbox);
        if let Some(c) = counts {
            let mut gaps = 0;
            for (name, versions) in &events.by_name {
                if route.receives(name) {
                    if let Some(e) = versions.first() {
                        gaps += c.open_gaps.get(e.aggregate_type).copied().unwrap_or(0);
                    }
                }
            }
            let _ = write!(text, "<br/>held {} · open gaps {gaps}", c.held);
        }
        let _ = writeln!(
            nodes,
            "    {}[[\"{}\"]]",
            n.id("inbox", &route.durable),
            label_keep_breaks(&text)
        );
        for name in events.by_name.keys().filter(|n| route.receives(n)) {
            let address = route.subjects.address(name);
            subjects.insert(
                subject_node(route.transport.protocol, &route.stream, &address),
                address,
            );
        }
    }
    for (id, address) in &subjects {
        let _ = writeln!(shared, "  {id}[/\"{}\"/]", label(address));
    }

    let mut out = String::from("flowchart LR\n");
    let _ = writeln!(
        out,
        "  subgraph {app}_service[\"{}\"]",
        label(&topology.title)
    );
    out.push_str("    direction LR\n");
    out.push_str(&nodes);
    out.push_str("  end\n");
    out.push_str(&shared);
    out.push_str(&edges);
    out
}

/// Appends the live counts of `destination` to `text`.
fn live(text: &mut String, counts: Option<&FlowCounts>, destination: &str) {
    let Some(counts) = counts else {
        return;
    };
    let c = counts
        .destinations
        .get(destination)
        .cloned()
        .unwrap_or_default();
    let _ = write!(text, "<br/>pending {}", c.pending);
    if let Some(age) = c.oldest_pending_age_secs.filter(|_| c.pending > 0) {
        let _ = write!(text, " (oldest {age:.0} s)");
    }
    let _ = write!(text, " · dead letters {}", c.dead_letters);
    if c.paused {
        text.push_str(" · PAUSED");
    }
}

/// The node ids of one application's flow: `<app>_<kind>_<name>`, unique per name of each
/// kind however the names look (see [`Ids`]).
struct Nodes {
    app: String,
    ids: BTreeMap<&'static str, Ids>,
}

impl Nodes {
    fn new(title: &str) -> Self {
        let app = ident(title);
        Nodes {
            // Never empty, and never a Mermaid keyword on its own (`default`, `end`).
            app: if app.is_empty() { "app".into() } else { app },
            ids: BTreeMap::new(),
        }
    }

    fn id(&mut self, kind: &'static str, name: &str) -> String {
        let id = self.ids.entry(kind).or_default().id(name);
        format!("{}_{kind}_{id}", self.app)
    }

    fn event(&mut self, e: &EventDescriptor) -> String {
        self.id("ev", &format!("{} v{}", e.name, e.version))
    }
}

/// The id of a subject node: the same in every application's flow, so that the flows of a
/// producer and a consumer join on it, and distinct for distinct subjects (a fingerprint of
/// transport, stream and address follows the readable part).
fn subject_node(transport: &str, stream: &str, address: &str) -> String {
    let fingerprint = fingerprint(&format!("{transport}\0{stream}\0{address}"));
    format!("subject_{}_{fingerprint:08x}", ident(address))
}

/// `text` for a quoted Mermaid label: the characters Mermaid or HTML would read as syntax
/// written as Mermaid's entity codes.
fn label(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("#quot;"),
            '<' => out.push_str("#lt;"),
            '>' => out.push_str("#gt;"),
            '&' => out.push_str("#amp;"),
            '#' => out.push_str("#35;"),
            c => out.push(c),
        }
    }
    out
}

/// As [`label`], keeping the `<br/>` line breaks this module writes.
fn label_keep_breaks(text: &str) -> String {
    text.split("<br/>")
        .map(label)
        .collect::<Vec<_>>()
        .join("<br/>")
}

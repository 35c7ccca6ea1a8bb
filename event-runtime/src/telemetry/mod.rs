//! One trace from a command to a remote handler: the W3C Trace Context of each event's creation
//! travels in its envelope, and every step that carries the event opens a span that follows
//! the OpenTelemetry messaging semantic conventions (v1.44).
//!
//! Built on `tracing`: the spans are ordinary `tracing` spans (so they show in any subscriber),
//! and with the feature `otel` they are also given their OpenTelemetry name, kind, parent,
//! links and attributes through `tracing-opentelemetry`, which the application installs as a
//! layer with the exporter of its choice. Without the feature, or without that layer, nothing
//! here costs more than the `tracing` spans themselves.
//!
//! The `traceparent` text is written and read here (W3C Trace Context Level 1, § 3.2) with
//! the `opentelemetry` API's own types, rather than through the SDK's `TraceContextPropagator`,
//! so that the library depends on the OpenTelemetry API only: which SDK, exporter and
//! propagators run is the application's choice. A unit test checks the text against the
//! SDK's propagator both ways.

pub(crate) mod catalog;

use event_core::AnyEnvelope;
use tracing::Span;
use uuid::Uuid;

/// `messaging.system` of the outbox's own spans (creation, and each delivery to a
/// destination): the transactional outbox is not a broker of the semantic conventions'
/// registry, so it has a value of its own.
pub(crate) const SYSTEM_OUTBOX: &str = "outbox";

/// `messaging.system` of the NATS transport's spans. `nats` is not one of the registry's
/// well-known values (v1.44 lists none for NATS); the conventions allow a custom value, and
/// this is the one NATS client instrumentations use.
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
pub(crate) const SYSTEM_NATS: &str = "nats";

/// The operation types of the conventions (`messaging.operation.type`); each span's
/// `messaging.operation.name` is the same word, and its name `{operation} {destination}`.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(feature = "otel"), allow(dead_code))]
pub(crate) enum Operation {
    /// An event created by a committing unit of work: PRODUCER.
    Create,
    /// Published to a broker: CLIENT (the creation context is the create span's).
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    Send,
    /// A batch fetched from a broker: CONSUMER.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    Receive,
    /// An event given to a destination (a handler, a relay): CONSUMER.
    Process,
    /// A batch acknowledged to a broker: CLIENT.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    Settle,
}

#[cfg_attr(not(feature = "otel"), allow(dead_code))]
impl Operation {
    fn name(self) -> &'static str {
        match self {
            Operation::Create => "create",
            Operation::Send => "send",
            Operation::Receive => "receive",
            Operation::Process => "process",
            Operation::Settle => "settle",
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Operation::Create => "producer",
            Operation::Receive | Operation::Process => "consumer",
            Operation::Send | Operation::Settle => "client",
        }
    }
}

/// What a span describes: the operation, the messaging system, the destination, and (for one
/// event) its id.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(feature = "otel"), allow(dead_code))]
pub(crate) struct Messaging<'a> {
    pub(crate) operation: Operation,
    pub(crate) system: &'static str,
    pub(crate) destination: &'a str,
    pub(crate) message_id: Option<Uuid>,
    pub(crate) consumer_group: Option<&'a str>,
    pub(crate) batch: Option<usize>,
}

impl<'a> Messaging<'a> {
    /// `operation` of `system` on `destination`.
    pub(crate) fn new(operation: Operation, system: &'static str, destination: &'a str) -> Self {
        Messaging {
            operation,
            system,
            destination,
            message_id: None,
            consumer_group: None,
            batch: None,
        }
    }

    /// On the one event `id` (`messaging.message.id`).
    pub(crate) fn message(mut self, id: Uuid) -> Self {
        self.message_id = Some(id);
        self
    }

    /// By consumer group `group` (`messaging.consumer.group.name`).
    pub(crate) fn group(mut self, group: &'a str) -> Self {
        self.consumer_group = Some(group);
        self
    }

    /// On a batch of `n` messages (`messaging.batch.message_count`).
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    pub(crate) fn batch(mut self, n: usize) -> Self {
        self.batch = Some(n);
        self
    }
}

/// Gives `span` (just created, not yet entered) its OpenTelemetry name, kind and messaging
/// attributes; for an operation on one event whose envelope JSON is `envelope`, makes the
/// event's creation context its parent (`parent_is_creation`: a delivery's process span, so
/// that a retry is a sibling of the first attempt, not its child) and links to it.
/// The span must declare the fields `otel.name` and `otel.kind` (as `tracing::field::Empty`).
#[cfg_attr(not(feature = "otel"), allow(unused_variables))]
pub(crate) fn describe(
    span: &Span,
    m: Messaging<'_>,
    envelope: Option<&str>,
    parent_is_creation: bool,
) {
    #[cfg(feature = "otel")]
    otel::describe(span, m, envelope, parent_is_creation);
}

/// Links `span` (a batch's receive or settle span, not yet entered) to the creation context of
/// each envelope in `envelopes` (CloudEvents JSON bytes) that has one.
#[cfg_attr(not(feature = "otel"), allow(unused_variables))]
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
pub(crate) fn link_each<'e>(span: &Span, envelopes: impl Iterator<Item = &'e [u8]>) {
    #[cfg(feature = "otel")]
    otel::link_each(span, envelopes);
}

/// Marks `span` failed: `error.type` = `error_type` (a low-cardinality word: `timeout`,
/// `transient`, `permanent`, `panic`, a dead letter reason…) and status ERROR.
#[cfg_attr(not(feature = "otel"), allow(unused_variables))]
pub(crate) fn failed(span: &Span, error_type: &str) {
    #[cfg(feature = "otel")]
    otel::failed(span, error_type);
}

/// At commit: gives `envelope`, when it has no valid trace context and the current span has a
/// valid OpenTelemetry context, the context of a new `create {event name}` span (PRODUCER, a
/// child of the current span) as its `traceparent`/`tracestate`. An invalid context the
/// application set is replaced (or, untraced, left), with a warning. Returns the create span,
/// to end with the commit ([`created`]).
#[cfg_attr(not(feature = "otel"), allow(unused_variables))]
pub(crate) fn stamp(envelope: &mut dyn AnyEnvelope) -> Option<Span> {
    #[cfg(feature = "otel")]
    return otel::stamp(envelope);
    #[cfg(not(feature = "otel"))]
    None
}

/// Ends the create spans of a commit (`creates`: event id and span) with its outcome: on
/// failure each gets `error.type` (`error_type`), and the events the outbox already held
/// (not in `appended`) the attribute `messaging.outbox.duplicate`.
#[cfg_attr(not(feature = "otel"), allow(unused_variables))]
pub(crate) fn created(
    creates: Vec<(Uuid, Span)>,
    outcome: Result<&std::collections::HashSet<Uuid>, &str>,
) {
    #[cfg(feature = "otel")]
    {
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        for (id, span) in creates {
            match outcome {
                Err(error_type) => failed(&span, error_type),
                Ok(appended) if !appended.contains(&id) => {
                    span.set_attribute("messaging.outbox.duplicate", true)
                }
                Ok(_) => {}
            }
        }
    }
}

#[cfg(feature = "otel")]
mod otel {
    use std::borrow::Cow;
    use std::str::FromStr;

    use event_core::AnyEnvelope;
    use opentelemetry::trace::{
        SpanContext, SpanId, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use tracing::Span;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::{Messaging, Operation, SYSTEM_OUTBOX};

    pub(super) fn describe(
        span: &Span,
        m: Messaging<'_>,
        envelope: Option<&str>,
        parent_is_creation: bool,
    ) {
        if span.is_disabled() {
            return;
        }
        let op = m.operation.name();
        span.record("otel.name", format!("{op} {}", m.destination));
        span.record("otel.kind", m.operation.kind());
        if let Some(creation) = envelope.and_then(|e| creation_context(e.as_bytes())) {
            if parent_is_creation {
                let cx = opentelemetry::Context::new().with_remote_span_context(creation.clone());
                let _ = span.set_parent(cx);
            }
            span.add_link(creation);
        }
        span.set_attribute("messaging.system", m.system);
        span.set_attribute("messaging.operation.type", op);
        span.set_attribute("messaging.operation.name", op);
        span.set_attribute("messaging.destination.name", m.destination.to_owned());
        if let Some(id) = m.message_id {
            span.set_attribute("messaging.message.id", id.to_string());
        }
        if let Some(group) = m.consumer_group {
            span.set_attribute("messaging.consumer.group.name", group.to_owned());
        }
        if let Some(n) = m.batch {
            span.set_attribute("messaging.batch.message_count", n as i64);
        }
    }

    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    pub(super) fn link_each<'e>(span: &Span, envelopes: impl Iterator<Item = &'e [u8]>) {
        if span.is_disabled() {
            return;
        }
        for creation in envelopes.filter_map(creation_context) {
            span.add_link(creation);
        }
    }

    pub(super) fn failed(span: &Span, error_type: &str) {
        if span.is_disabled() {
            return;
        }
        span.set_attribute("error.type", error_type.to_owned());
        span.set_status(Status::error(error_type.to_owned()));
    }

    pub(super) fn stamp(envelope: &mut dyn AnyEnvelope) -> Option<Span> {
        let meta = envelope.metadata();
        if let Some(given) = &meta.trace_parent {
            if parse(given, meta.trace_state.as_deref()).is_some() {
                return None;
            }
            tracing::warn!(
                event = envelope.name(),
                event_id = %meta.id,
                traceparent = %given,
                "the event's trace context is not a valid W3C traceparent (00-<32 lower-case hex>-<16 lower-case hex>-<2 hex>): it is replaced when this commit is traced, and ignored by every reader"
            );
        }
        let current = Span::current();
        if current.is_disabled() || !current.context().span().span_context().is_valid() {
            return None;
        }
        let create = tracing::info_span!(
            parent: &current,
            "create",
            otel.name = tracing::field::Empty,
            otel.kind = tracing::field::Empty,
        );
        let name = envelope.name();
        let id = envelope.metadata().id;
        describe(
            &create,
            Messaging::new(Operation::Create, SYSTEM_OUTBOX, name).message(id),
            None,
            false,
        );
        // A filter that drops the create span leaves the current span's context: the
        // conventions' fallback when there is no create span.
        let context = if create.is_disabled() {
            current.context()
        } else {
            create.context()
        };
        let span = context.span();
        let sc = span.span_context();
        if sc.is_valid() {
            let meta = envelope.metadata_mut();
            meta.trace_parent = Some(traceparent(sc));
            let state = sc.trace_state().header();
            meta.trace_state = (!state.is_empty()).then_some(state);
        }
        Some(create)
    }

    /// `00-<trace id>-<parent id>-<flags>` (W3C Trace Context § 3.2.2).
    pub(super) fn traceparent(sc: &SpanContext) -> String {
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        )
    }

    /// Parses a `traceparent` (and optional `tracestate`) as W3C Trace Context § 3.2 says:
    /// version `ff` is invalid; version `00` has exactly four fields; a later version at
    /// least four, read as version `00`; ids are lower-case hex and not all zero. `None` for
    /// anything else: a malformed context is ignored, never an error.
    pub(super) fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<SpanContext> {
        let mut parts = traceparent.trim().split('-');
        let version = parts.next()?;
        let (trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?);
        let lower_hex = |s: &str, n: usize| {
            s.len() == n
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if !lower_hex(version, 2) || version == "ff" || (version == "00" && parts.next().is_some())
        {
            return None;
        }
        if !lower_hex(trace, 32) || !lower_hex(span, 16) || !lower_hex(flags, 2) {
            return None;
        }
        let trace_id = TraceId::from_hex(trace).ok()?;
        let span_id = SpanId::from_hex(span).ok()?;
        let flags = u8::from_str_radix(flags, 16).ok()?;
        let state = tracestate
            .and_then(|s| TraceState::from_str(s).ok())
            .unwrap_or_default();
        let sc = SpanContext::new(
            trace_id,
            span_id,
            TraceFlags::new(flags & TraceFlags::SAMPLED.to_u8()),
            true,
            state,
        );
        sc.is_valid().then_some(sc)
    }

    /// The creation context an envelope carries, read from its JSON without decoding the rest
    /// (an envelope without the text `"traceparent"` is not parsed at all).
    pub(super) fn creation_context(envelope: &[u8]) -> Option<SpanContext> {
        #[derive(serde::Deserialize)]
        struct Trace<'a> {
            #[serde(borrow, default)]
            traceparent: Option<Cow<'a, str>>,
            #[serde(borrow, default)]
            tracestate: Option<Cow<'a, str>>,
        }
        const KEY: &[u8] = b"\"traceparent\"";
        if !envelope.windows(KEY.len()).any(|w| w == KEY) {
            return None;
        }
        let t: Trace<'_> = serde_json::from_slice(envelope).ok()?;
        parse(t.traceparent.as_deref()?, t.tracestate.as_deref())
    }

    #[cfg(test)]
    mod tests {
        use std::collections::HashMap;

        use opentelemetry::propagation::TextMapPropagator;
        use opentelemetry::trace::{SpanContext, TraceContextExt, TraceFlags, TraceState};
        use opentelemetry::Context;
        use opentelemetry_sdk::propagation::TraceContextPropagator;

        use super::{creation_context, parse, traceparent};

        fn sdk_extract(parent: &str, state: Option<&str>) -> SpanContext {
            let mut carrier = HashMap::new();
            carrier.insert("traceparent".to_owned(), parent.to_owned());
            if let Some(s) = state {
                carrier.insert("tracestate".to_owned(), s.to_owned());
            }
            let cx = TraceContextPropagator::new().extract(&carrier);
            cx.span().span_context().clone()
        }

        /// The SDK's propagator and ours agree on every case: valid, invalid, versions.
        #[test]
        fn parses_as_the_sdk_propagator_does() {
            let cases = [
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
                "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
                "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "00-00000000000000000000000000000000-b7ad6b7169203331-01",
                "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
                "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
                "garbage",
                "",
            ];
            for case in cases {
                let sdk = sdk_extract(case, Some("congo=t61rcWkgMzE"));
                let ours = parse(case, Some("congo=t61rcWkgMzE"));
                match ours {
                    Some(sc) => {
                        assert!(sdk.is_valid(), "{case}: the SDK refuses it");
                        assert_eq!(sc.trace_id(), sdk.trace_id(), "{case}");
                        assert_eq!(sc.span_id(), sdk.span_id(), "{case}");
                        assert_eq!(sc.trace_flags(), sdk.trace_flags(), "{case}");
                        assert_eq!(sc.trace_state().header(), sdk.trace_state().header());
                    }
                    None => assert!(!sdk.is_valid(), "{case}: the SDK accepts it"),
                }
            }
        }

        /// What we write, the SDK's propagator reads back, and the text is the SDK's.
        #[test]
        fn writes_as_the_sdk_propagator_does() {
            let sc = parse(
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                None,
            )
            .unwrap();
            let ours = traceparent(&sc);
            let mut carrier: HashMap<String, String> = HashMap::new();
            let local = SpanContext::new(
                sc.trace_id(),
                sc.span_id(),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            );
            TraceContextPropagator::new().inject_context(
                &Context::new().with_remote_span_context(local),
                &mut carrier,
            );
            assert_eq!(carrier["traceparent"], ours);
        }

        #[test]
        fn reads_the_context_of_an_envelope_and_ignores_its_absence() {
            let with = br#"{"id":"x","traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","data":{"traceparent":1}}"#;
            let sc = creation_context(with).unwrap();
            assert_eq!(
                sc.trace_id().to_string(),
                "0af7651916cd43dd8448eb211c80319c"
            );
            assert!(sc.is_remote());
            assert!(creation_context(br#"{"id":"x","data":{}}"#).is_none());
            assert!(creation_context(br#"{"traceparent":"bad","data":{}}"#).is_none());
            assert!(creation_context(b"not json \"traceparent\"").is_none());
        }
    }
}

//! One trace from the orders command to billing's handler, in one process, through the real
//! NATS JetStream (`EVENTS_TEST_NATS_URL`; skipped visibly without it, failing with
//! `EVENTS_TEST_REQUIRE_SERVICES=1`): the orders domain's command commits inside a traced span
//! into an outbox with the NATS relay; an outbox with billing's handlers consumes the stream
//! through a NATS inbox; the OpenTelemetry SDK's in-memory exporter, behind the
//! `tracing-opentelemetry` layer, shows one trace id from the command span to
//! `process billing.invoice`, with the spans of the messaging conventions in between. And,
//! without a broker: a retried delivery's attempts are siblings under the event's creation
//! context, the failed one marked with `error.type`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use chrono::NaiveDate;
use event_core::{event_handler, HandlerError};
use event_runtime::transport::nats::{InboxConfig, NatsInbox, NatsRelay, RelayConfig};
use event_runtime::{Dispatcher, Outbox, OutboxConfig, Store};
use examples::orders::domain::{
    AddLine, LineAdded, Order, OrderPlacedV2, OrderShipped, PlaceOrder,
};
use opentelemetry::trace::{SpanId, SpanKind, Status, TraceId, TracerProvider as _};
use opentelemetry::Value;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use rust_decimal::Decimal;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

#[path = "../billing/handlers.rs"]
#[allow(dead_code)]
mod billing;

/// The SDK's in-memory exporter behind the global `tracing` subscriber (every test of this
/// file shares it: each finds its spans by its own trace id).
fn exporter() -> &'static (InMemorySpanExporter, SdkTracerProvider) {
    static EXPORTER: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("examples-test"));
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .expect("the only subscriber of this test binary");
        (exporter, provider)
    })
}

/// Every finished span.
fn all_spans() -> Vec<SpanData> {
    let (exporter, provider) = exporter();
    provider.force_flush().unwrap();
    exporter.get_finished_spans().unwrap()
}

/// The finished spans of trace `trace`.
fn spans_of(trace: TraceId) -> Vec<SpanData> {
    all_spans()
        .into_iter()
        .filter(|s| s.span_context.trace_id() == trace)
        .collect()
}

fn attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

fn attr_str(span: &SpanData, key: &str) -> String {
    attr(span, key)
        .map(|v| v.as_str().into_owned())
        .unwrap_or_else(|| panic!("span `{}` has no attribute {key}", span.name))
}

fn one<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
    let found: Vec<&SpanData> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(
        found.len(),
        1,
        "one span `{name}` expected among {:?}",
        spans.iter().map(|s| s.name.as_ref()).collect::<Vec<_>>()
    );
    found[0]
}

fn links_to(span: &SpanData, id: SpanId) -> bool {
    span.links
        .links
        .iter()
        .any(|l| l.span_context.span_id() == id)
}

/// The trace id of `span` (a new root span: its own trace).
fn trace_of(span: &tracing::Span) -> TraceId {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    span.context().span().span_context().trace_id()
}

/// A dispatcher that knows the orders domain's three events.
fn order_events() -> event_runtime::DispatcherBuilder {
    Dispatcher::builder_empty()
        .event::<OrderPlacedV2>()
        .event::<LineAdded>()
        .event::<OrderShipped>()
}

fn require() -> bool {
    std::env::var("EVENTS_TEST_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

fn nats_url(test: &str) -> Option<String> {
    match std::env::var("EVENTS_TEST_NATS_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(!require(), "{test}: EVENTS_TEST_NATS_URL is not set");
            // On the process's standard error, which `cargo test` shows (`eprintln!` is
            // captured by the test harness).
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "note: {test}: skipped: EVENTS_TEST_NATS_URL is not set (a NATS server with JetStream, e.g. nats://127.0.0.1:4222)"
            );
            None
        }
    }
}

async fn sqlite(dir: &std::path::Path, name: &str) -> Store {
    Store::connect(&format!("sqlite://{}", dir.join(name).display()))
        .await
        .unwrap()
}

fn date(d: u32) -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 12, d).unwrap()
}

/// The orders domain's commands for one order: placed, one line, shipped (three events).
fn one_order(id: &str) -> Order {
    let mut order = Order::place(PlaceOrder {
        order_id: id.to_owned(),
        customer_id: "CG-12520".into(),
        segment: "Consumer".into(),
        region: "South".into(),
        country: "United States".into(),
        order_date: date(1),
    });
    order
        .add_line(AddLine {
            customer_id: "CG-12520".into(),
            row_id: 1,
            product_id: "FUR-BO-10001798".into(),
            product_name: "Bush Somerset Collection Bookcase".into(),
            category: "Furniture".into(),
            quantity: 2,
            sales: Decimal::new(26196, 2),
            discount: Decimal::ZERO,
            profit: Decimal::new(419136, 4),
        })
        .unwrap();
    order.ship(date(4), "Second Class").unwrap();
    order
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn one_trace_runs_from_the_orders_command_to_billings_handler_through_nats() {
    let test = "one_trace";
    let Some(url) = nats_url(test) else {
        return;
    };
    exporter();
    let id = uuid::Uuid::now_v7().simple().to_string();
    let (stream, prefix) = (format!("TRACE{id}"), format!("trace{id}"));
    let dir = std::env::temp_dir().join(format!("trace-{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    runtime().block_on(async {
        // The producer: the orders domain's events, the relay to NATS.
        let client = examples::orders::connect_nats(&url, &stream, &prefix, 1, 1)
            .await
            .unwrap();
        let relay = NatsRelay::new(
            client.clone(),
            RelayConfig::new(&stream).subject_prefix(prefix.clone()),
        );
        let orders = Outbox::builder(sqlite(&dir, "orders.db").await)
            .dispatcher(order_events())
            .destination(relay.clone())
            .config(OutboxConfig::default().source("urn:example:orders"))
            .build()
            .unwrap();
        relay.check(&orders).await.unwrap();

        let command = tracing::info_span!("ship order");
        let trace = trace_of(&command);
        async {
            let mut order = one_order("CA-2026-1");
            let mut uow = orders.begin().await.unwrap();
            uow.extend(order.take_events());
            assert_eq!(uow.commit().await.unwrap().appended, 3);
        }
        .instrument(command.clone())
        .await;
        drop(command);
        orders.drain(Duration::from_secs(30)).await.unwrap();

        // The consumer: billing's handlers behind a NATS inbox.
        let store = sqlite(&dir, "billing.db").await;
        billing::create_tables(&store).await.unwrap();
        let billing = billing::outbox(store).unwrap();
        let js = async_nats::jetstream::new(client);
        let inbox = NatsInbox::new(
            &js,
            billing.clone(),
            InboxConfig::new(&stream, "billing").filter_subject(format!("{prefix}.order.>")),
        )
        .await
        .unwrap();
        let started = Instant::now();
        let mut received = 0;
        while received < 3 {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "3 messages in 30 s"
            );
            received += inbox.fetch_and_commit().await.unwrap().ack().await.received;
        }
        billing.drain(Duration::from_secs(30)).await.unwrap();

        let spans = spans_of(trace);
        let command = one(&spans, "ship order");
        let create = one(&spans, "create order.shipped");
        assert_eq!(create.span_kind, SpanKind::Producer);
        assert_eq!(create.parent_span_id, command.span_context.span_id());
        let event_id = attr_str(create, "messaging.message.id");
        assert_eq!(attr_str(create, "messaging.system"), "outbox");
        assert_eq!(attr_str(create, "messaging.operation.type"), "create");

        let subject = format!("{prefix}.order.shipped");
        let send = one(&spans, &format!("send {subject}"));
        assert_eq!(send.span_kind, SpanKind::Client);
        assert_eq!(attr_str(send, "messaging.system"), "nats");
        assert_eq!(attr_str(send, "messaging.destination.name"), subject);
        assert_eq!(attr_str(send, "messaging.message.id"), event_id);
        assert!(links_to(send, create.span_context.span_id()));

        // A batch's receive and settle spans start traces of their own, linked to each
        // message's creation context.
        let all = all_spans();
        let linked = |name: String| {
            all.iter()
                .find(|s| s.name == name.as_str() && links_to(s, create.span_context.span_id()))
                .unwrap_or_else(|| panic!("a span `{name}` linked to the create span"))
        };
        let receive = linked(format!("receive {stream}"));
        assert_eq!(receive.span_kind, SpanKind::Consumer);
        assert_eq!(
            attr_str(receive, "messaging.consumer.group.name"),
            "billing"
        );
        assert_eq!(attr_str(receive, "messaging.system"), "nats");
        let settle = linked(format!("settle {stream}"));
        assert_eq!(settle.span_kind, SpanKind::Client);

        let process = one(&spans, "process billing.invoice");
        assert_eq!(process.span_kind, SpanKind::Consumer);
        assert_eq!(
            process.span_context.trace_id(),
            trace,
            "one trace id from the command span to billing's handler"
        );
        assert_eq!(process.parent_span_id, create.span_context.span_id());
        assert!(links_to(process, create.span_context.span_id()));
        assert_eq!(attr_str(process, "messaging.system"), "outbox");
        assert_eq!(attr_str(process, "messaging.operation.type"), "process");
        assert_eq!(
            attr_str(process, "messaging.destination.name"),
            "billing.invoice"
        );
        assert_eq!(attr_str(process, "messaging.message.id"), event_id);
        assert!(attr(process, "error.type").is_none());
        // The other two events' handlers joined the same trace.
        one(&spans, "process billing.order");
        one(&spans, "process billing.line");

        js.delete_stream(&stream).await.unwrap();
    });
    let _ = std::fs::remove_dir_all(&dir);
}

static FAILED_ONCE: AtomicBool = AtomicBool::new(false);

#[event_handler(name = "trace.flaky")]
fn flaky(_: &OrderShipped) -> Result<(), HandlerError> {
    if !FAILED_ONCE.swap(true, Ordering::SeqCst) {
        return Err(HandlerError::transient_msg("the mail server is busy"));
    }
    Ok(())
}

#[test]
fn a_retried_delivery_is_a_sibling_of_its_failed_attempt_under_the_creation_context() {
    exporter();
    let dir = std::env::temp_dir().join(format!("trace-retry-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    runtime().block_on(async {
        let outbox = Outbox::builder(sqlite(&dir, "retry.db").await)
            .dispatcher(order_events().handler::<flaky>())
            .config(OutboxConfig::default().retry(examples::orders::retry_policy()))
            .build()
            .unwrap();
        let command = tracing::info_span!("ship order");
        let trace = trace_of(&command);
        async {
            let mut uow = outbox.begin().await.unwrap();
            uow.extend(one_order("CA-2026-2").take_events());
            uow.commit().await.unwrap();
        }
        .instrument(command)
        .await;
        outbox.drain(Duration::from_secs(30)).await.unwrap();

        let spans = spans_of(trace);
        let create = one(&spans, "create order.shipped");
        let attempts: Vec<&SpanData> = spans
            .iter()
            .filter(|s| s.name == "process trace.flaky")
            .collect();
        assert_eq!(attempts.len(), 2, "two attempts");
        let (first, second) = if attempts[0].start_time <= attempts[1].start_time {
            (attempts[0], attempts[1])
        } else {
            (attempts[1], attempts[0])
        };
        for a in [first, second] {
            assert_eq!(a.parent_span_id, create.span_context.span_id());
            assert!(links_to(a, create.span_context.span_id()));
        }
        assert_ne!(second.parent_span_id, first.span_context.span_id());
        assert_eq!(attr_str(first, "error.type"), "transient");
        assert!(matches!(first.status, Status::Error { .. }));
        assert!(attr(second, "error.type").is_none());
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// An application's own valid context is kept (no create span); an invalid one is replaced by
/// the commit's; the create span of an event the outbox already held says so, and those of a
/// refused commit carry `error.type`.
#[test]
fn commit_keeps_a_valid_context_replaces_an_invalid_one_and_marks_duplicates_and_refusals() {
    use event_core::{Envelope, RawEnvelope};
    exporter();
    let dir = std::env::temp_dir().join(format!("trace-given-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    runtime().block_on(async {
        let outbox = Outbox::builder(sqlite(&dir, "given.db").await)
            .dispatcher(order_events())
            .build()
            .unwrap();
        let given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let mut events = one_order("CA-2026-3").take_events();
        events[0].metadata_mut().trace_parent = Some(given.to_owned());
        // Upper-case hex: not a valid traceparent.
        events[1].metadata_mut().trace_parent = Some(given.to_uppercase());
        let shipped: RawEnvelope = events[2].to_raw().unwrap();
        let command = tracing::info_span!("ship order");
        let trace = trace_of(&command);
        async {
            let mut uow = outbox.begin().await.unwrap();
            uow.extend(events);
            assert_eq!(uow.commit().await.unwrap().appended, 3);
            // The shipped event again (a retried command): a duplicate.
            let mut uow = outbox.begin().await.unwrap();
            uow.add(Envelope::<OrderShipped>::decode(&shipped).unwrap());
            assert_eq!(uow.commit().await.unwrap().duplicates, 1);
            // The same order placed again under new ids: a conflict, nothing committed.
            let mut uow = outbox.begin().await.unwrap();
            uow.extend(one_order("CA-2026-3").take_events());
            assert!(uow.commit().await.is_err());
        }
        .instrument(command)
        .await;

        let spans = spans_of(trace);
        let creates =
            |name: &str| -> Vec<&SpanData> { spans.iter().filter(|s| s.name == name).collect() };
        // order.placed: once refused (the conflict); its own valid context made no span.
        let placed = creates("create order.placed");
        assert_eq!(placed.len(), 1, "only the conflicting commit's");
        assert_eq!(attr_str(placed[0], "error.type"), "conflict");
        assert!(matches!(placed[0].status, Status::Error { .. }));
        // order.line_added: its invalid context replaced; then the refused one.
        let lines: Vec<&SpanData> = spans
            .iter()
            .filter(|s| s.name.starts_with("create order.line"))
            .collect();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(
            lines
                .iter()
                .filter(|s| attr(s, "error.type").is_none())
                .count(),
            1
        );
        // order.shipped: created, then a duplicate, then refused.
        let shipped_spans = creates("create order.shipped");
        assert_eq!(shipped_spans.len(), 3);
        let duplicate = shipped_spans
            .iter()
            .filter(|s| attr(s, "messaging.outbox.duplicate").is_some())
            .count();
        assert_eq!(duplicate, 1);
    });
    let _ = std::fs::remove_dir_all(&dir);
}

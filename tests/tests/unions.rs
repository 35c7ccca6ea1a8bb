//! Event unions: one handler for an aggregate's whole stream. In process (routing, upcasting
//! per variant, the envelope) and through the outbox on SQLite via `event_runtime::testing`
//! (order across the union's event types, a dead letter holding back the rest); the
//! harness's clock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use event_core::{event_handler, DomainEvent, Envelope, EventUnion, HandlerError, RawEnvelope};
use event_runtime::testing::TestOutbox;
use event_runtime::{Dispatcher, RetryPolicy, SqlValue, Tx};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 1)]
struct OrderPlacedV1 {
    #[event(aggregate_id)]
    order_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 2, upcast_from = OrderPlacedV1)]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: String,
    amount: u64,
}

impl From<OrderPlacedV1> for OrderPlaced {
    fn from(v1: OrderPlacedV1) -> Self {
        OrderPlaced {
            order_id: v1.order_id,
            amount: 0,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.cancelled")]
struct OrderCancelled {
    #[event(aggregate_id)]
    order_id: String,
}

/// Every event of an order.
#[derive(Debug, EventUnion)]
enum OrderEvent {
    Placed(OrderPlaced),
    Cancelled(OrderCancelled),
}

/// What the handlers saw, per order, in order.
#[derive(Default)]
struct Seen(Mutex<HashMap<String, Vec<String>>>);

impl Seen {
    fn push(&self, order: &str, what: String) {
        self.0
            .lock()
            .unwrap()
            .entry(order.to_owned())
            .or_default()
            .push(what);
    }
    fn of(&self, order: &str) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .get(order)
            .cloned()
            .unwrap_or_default()
    }
}

#[event_handler(name = "summary")]
fn summary(event: &Envelope<OrderEvent>, seen: &Seen) {
    let (order, what) = match event.event() {
        OrderEvent::Placed(e) => (&e.order_id, format!("placed {}", e.amount)),
        OrderEvent::Cancelled(e) => (&e.order_id, "cancelled".to_owned()),
    };
    seen.push(order, format!("{what} #{}", event.sequence()));
}

/// The first attempt of each `order.placed` fails: a second handler of the same stream
/// that would run `order.cancelled` before it, were order kept per event type.
static PLACED_FAILURES: AtomicU32 = AtomicU32::new(0);

#[event_handler(name = "projection")]
fn projection(event: &OrderEvent, _tx: &mut Tx, seen: &Seen) -> Result<(), HandlerError> {
    match event {
        OrderEvent::Placed(e) => {
            if e.order_id.starts_with("flaky")
                && PLACED_FAILURES.fetch_add(1, Ordering::SeqCst) == 0
            {
                seen.push(&e.order_id, "placed failed".into());
                return Err(HandlerError::transient_msg("projection store busy"));
            }
            seen.push(&e.order_id, "placed".into());
        }
        OrderEvent::Cancelled(e) => {
            assert_eq!(event.event_name(), "order.cancelled");
            seen.push(&e.order_id, "cancelled".into());
        }
    }
    Ok(())
}

#[event_handler(name = "always_down")]
fn always_down(_: &OrderEvent, _tx: &mut Tx) -> Result<(), HandlerError> {
    Err(HandlerError::transient_msg("the API is down"))
}

fn placed(id: &str, seq: u64) -> Envelope<OrderPlaced> {
    Envelope::new(OrderPlaced {
        order_id: id.into(),
        amount: 7,
    })
    .with_sequence(seq)
}

fn cancelled(id: &str, seq: u64) -> Envelope<OrderCancelled> {
    Envelope::new(OrderCancelled {
        order_id: id.into(),
    })
    .with_sequence(seq)
}

#[tokio::test]
async fn a_union_handler_sees_every_variant_and_older_versions_upcast() {
    let dispatcher = Dispatcher::builder_empty()
        .handler::<summary>()
        .resource(Seen::default())
        .build()
        .unwrap();
    assert_eq!(
        dispatcher
            .registry()
            .handlers_for(std::any::TypeId::of::<OrderCancelled>())
            .map(|h| h.name)
            .collect::<Vec<_>>(),
        ["summary"]
    );
    assert!(dispatcher.dispatch(&placed("o-1", 1)).await.is_success());
    assert!(dispatcher.dispatch(&cancelled("o-1", 2)).await.is_success());
    // An order.placed v1 is upcast to the variant's v2 before the union is built.
    let v1 = Envelope::new(OrderPlacedV1 {
        order_id: "o-2".into(),
    })
    .with_sequence(1);
    let raw: RawEnvelope = v1.to_raw().unwrap();
    dispatcher.dispatch_raw(&raw).await.unwrap();
    let seen = dispatcher.resource::<Seen>().unwrap();
    assert_eq!(seen.of("o-1"), ["placed 7 #1", "cancelled #2"]);
    assert_eq!(seen.of("o-2"), ["placed 0 #1"]);
}

#[tokio::test]
async fn cancelled_never_overtakes_placed_for_a_union_handler() {
    let outbox = TestOutbox::with(Dispatcher::builder_empty().handler::<projection>(), |b| {
        b.resource(Seen::default())
    })
    .await
    .unwrap();
    let mut uow = outbox.outbox().begin().await.unwrap();
    uow.add(placed("flaky-1", 1));
    uow.add(cancelled("flaky-1", 2));
    uow.add(placed("steady-1", 1));
    uow.add(cancelled("steady-1", 2));
    uow.commit().await.unwrap();
    let report = outbox.drain().await.unwrap();
    assert_eq!(report.completed, 4, "{report:?}");
    assert_eq!(report.retried, 1, "{report:?}");
    outbox.assert_idle().await;
    let seen = outbox.outbox().dispatcher().resource::<Seen>().unwrap();
    assert_eq!(seen.of("flaky-1"), ["placed failed", "placed", "cancelled"]);
    assert_eq!(seen.of("steady-1"), ["placed", "cancelled"]);
}

#[tokio::test]
async fn an_undecodable_event_holds_back_the_later_ones_of_its_aggregate() {
    let outbox = TestOutbox::with(Dispatcher::builder_empty().handler::<projection>(), |b| {
        b.resource(Seen::default())
    })
    .await
    .unwrap();
    let bad = placed("o-9", 1);
    let mut uow = outbox.outbox().begin().await.unwrap();
    uow.add(bad.clone());
    uow.add(cancelled("o-9", 2));
    uow.add(placed("o-10", 1));
    uow.commit().await.unwrap();
    // A producer that wrote a payload this version cannot read.
    let mut broken = bad.to_raw().unwrap();
    broken.data = serde_json::value::RawValue::from_string(r#"{"order_id":"o-9"}"#.into()).unwrap();
    let mut tx = outbox.store().begin().await.unwrap();
    tx.execute(
        "UPDATE event_outbox SET envelope = $1 WHERE event_id = $2",
        &[
            SqlValue::Text(&broken.to_json()),
            SqlValue::Text(&bad.id().to_string()),
        ],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    outbox.drain().await.unwrap();
    let dead = outbox.assert_dead_letters("projection", 1).await;
    assert_eq!(dead[0].event_id, bad.id());
    assert_eq!(dead[0].reason.to_string(), "undecodable");
    assert!(
        dead[0]
            .error_chain
            .iter()
            .any(|e| e.contains("missing field `amount`")),
        "{:?}",
        dead[0].error_chain
    );
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.blocked), (1, 1), "{stats:?}");
    let seen = outbox.outbox().dispatcher().resource::<Seen>().unwrap();
    assert!(seen.of("o-9").is_empty(), "{:?}", seen.of("o-9"));
    assert_eq!(seen.of("o-10"), ["placed"]);
}

#[tokio::test]
async fn retried_three_times_then_dead_lettered_in_milliseconds() {
    let policy = RetryPolicy {
        max_attempts: 3,
        initial_backoff: Duration::from_secs(600),
        max_backoff: Duration::from_secs(1800),
    };
    let outbox = TestOutbox::with(Dispatcher::builder_empty().handler::<always_down>(), |b| {
        b.retry_policy("always_down", policy)
    })
    .await
    .unwrap();
    let started = Instant::now();
    outbox
        .commit([placed("o-1", 1), placed("o-2", 1)])
        .await
        .unwrap();
    let report = outbox.drain().await.unwrap();
    assert_eq!((report.retried, report.dead_lettered), (4, 2), "{report:?}");
    let dead = outbox.assert_dead_letters("always_down", 2).await;
    assert!(dead.iter().all(|d| d.attempts == 3), "{dead:?}");
    // A wrong handler name: the message says which handler has them.
    let wrong = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(
        outbox.assert_dead_letters("down", 2),
    ))
    .await
    .unwrap_err();
    let message = wrong.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains("`down` is not a destination") && message.contains("always_down"),
        "{message}"
    );
    assert_eq!(dead[0].error_chain, ["the API is down"]);
    // The failures are stamped by the harness's clock, which moved past the backoffs.
    let waited = dead[0].last_failed_at - dead[0].first_failed_at;
    assert!(waited >= chrono::Duration::minutes(60), "{waited}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn deliveries_of_handlers_replaced_by_a_union_are_reported() {
    // The release before: `projection` had deliveries pending when it was replaced.
    let before = TestOutbox::with(Dispatcher::builder_empty().handler::<projection>(), |b| {
        b.resource(Seen::default())
    })
    .await
    .unwrap();
    before
        .commit([placed("o-1", 1), placed("o-2", 1)])
        .await
        .unwrap();
    let after = event_runtime::Outbox::builder(before.store().clone())
        .dispatcher(Dispatcher::builder_empty().handler::<summary>())
        .resource(Seen::default())
        .build()
        .unwrap();
    let left = after.unregistered_destinations().await.unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(
        (left[0].handler.as_str(), left[0].pending),
        ("projection", 2)
    );
    // Its own handlers are not listed, and the outbox that has the handler lists nothing.
    assert!(before
        .outbox()
        .unregistered_destinations()
        .await
        .unwrap()
        .is_empty());
}

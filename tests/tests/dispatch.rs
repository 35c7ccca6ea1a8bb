//! The in-process dispatcher: ordering, the idempotency guard, failure isolation, raw decoding,
//! start-up validation and the in-memory unit of work.
//!
//! Every dispatcher here is built by hand (`builder_empty`), so that each test sees only the
//! handlers it names; `inventory.rs` covers collection through `inventory`.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;

use event_core::{
    event_handler, DecodeError, DomainEvent, Envelope, EventRecorder, Handler, HandlerError,
    RawEnvelope,
};
use event_runtime::{DispatchError, Dispatcher, Outcome, RegistryError};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 1)]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: String,
    amount: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.cancelled", version = 1)]
struct OrderCancelled {
    #[event(aggregate_id)]
    order_id: String,
}

/// Which handlers ran, in order.
#[derive(Default)]
struct Calls(Mutex<Vec<&'static str>>);

impl Calls {
    fn push(&self, name: &'static str) {
        self.0.lock().unwrap().push(name);
    }
    fn take(&self) -> Vec<&'static str> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

#[event_handler(priority = 5, name = "z_late")]
fn z_late(_: &OrderPlaced, calls: &Calls) {
    calls.push("z_late");
}

#[event_handler(priority = -1, name = "first")]
fn first(_: &OrderPlaced, calls: &Calls) {
    calls.push("first");
}

#[event_handler(priority = 5, name = "a_late")]
async fn a_late(_: &Envelope<OrderPlaced>, calls: &Calls) {
    calls.push("a_late");
}

#[event_handler(name = "middle")]
fn middle(_: &OrderPlaced, calls: &Calls) {
    calls.push("middle");
}

fn order(id: &str) -> Envelope<OrderPlaced> {
    Envelope::new(OrderPlaced {
        order_id: id.into(),
        amount: 10,
    })
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn handlers_run_by_priority_then_name_whatever_the_registration_order() {
    let d = Dispatcher::builder_empty()
        .handler::<z_late>()
        .handler::<a_late>()
        .handler::<middle>()
        .handler::<first>()
        .resource(Calls::default())
        .build()
        .unwrap();
    let report = block_on(d.dispatch(&order("A-1")));
    let expected = ["first", "middle", "a_late", "z_late"];
    assert_eq!(d.resource::<Calls>().unwrap().take(), expected);
    let names: Vec<_> = report.outcomes().iter().map(|o| o.handler).collect();
    assert_eq!(names, expected);
    assert_eq!(report.ran(), 4);
}

/// Fails while `FAIL` is set; counts successful runs.
static FAIL: AtomicBool = AtomicBool::new(true);

#[derive(Default)]
struct Runs(AtomicU32);

#[event_handler(name = "flaky")]
fn flaky(_: &OrderCancelled, runs: &Runs) -> Result<(), HandlerError> {
    if FAIL.load(Ordering::SeqCst) {
        return Err(HandlerError::transient_msg("database is restarting"));
    }
    runs.0.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[event_handler(name = "steady")]
fn steady(_: &OrderCancelled, calls: &Calls) {
    calls.push("steady");
}

#[test]
fn the_guard_skips_handlers_that_ran_and_retries_handlers_that_failed() {
    let d = Dispatcher::builder_empty()
        .handler::<flaky>()
        .handler::<steady>()
        .resource(Calls::default())
        .resource(Runs::default())
        .build()
        .unwrap();
    let envelope = Envelope::new(OrderCancelled {
        order_id: "B-1".into(),
    });

    let first = block_on(d.dispatch(&envelope));
    assert_eq!(first.ran(), 1);
    match first.outcome("flaky") {
        Some(Outcome::Failed(e)) => {
            assert!(e.is_transient());
            assert_eq!(e.chain(), ["database is restarting"]);
        }
        other => panic!("flaky: {other:?}"),
    }

    // Redelivery: steady already ran and is skipped; flaky failed, so it runs again.
    FAIL.store(false, Ordering::SeqCst);
    let second = block_on(d.dispatch(&envelope));
    assert!(matches!(second.outcome("steady"), Some(Outcome::Duplicate)));
    assert!(matches!(second.outcome("flaky"), Some(Outcome::Ran)));

    let third = block_on(d.dispatch(&envelope));
    assert_eq!((third.ran(), third.duplicates()), (0, 2));
    assert_eq!(d.resource::<Calls>().unwrap().take(), ["steady"]);
    assert_eq!(d.resource::<Runs>().unwrap().0.load(Ordering::SeqCst), 1);

    // A different event id is a different key.
    let other = block_on(d.dispatch(&Envelope::new(OrderCancelled {
        order_id: "B-1".into(),
    })));
    assert_eq!(other.ran(), 2);
}

#[test]
fn the_guard_is_bounded_and_forgets_the_least_recently_used() {
    let d = Dispatcher::builder_empty()
        .handler::<middle>()
        .resource(Calls::default())
        .idempotency_capacity(2)
        .build()
        .unwrap();
    let (a, b, c) = (order("1"), order("2"), order("3"));
    for e in [&a, &b, &c] {
        assert_eq!(block_on(d.dispatch(e)).ran(), 1);
    }
    assert_eq!(d.guard_len(), 2);
    assert_eq!(block_on(d.dispatch(&c)).duplicates(), 1, "c is remembered");
    assert_eq!(block_on(d.dispatch(&a)).ran(), 1, "a was evicted");
    assert_eq!(d.resource::<Calls>().unwrap().take().len(), 4);
}

#[test]
fn the_guard_can_be_turned_off() {
    let d = Dispatcher::builder_empty()
        .handler::<middle>()
        .resource(Calls::default())
        .idempotency_capacity(0)
        .build()
        .unwrap();
    let a = order("1");
    assert_eq!(block_on(d.dispatch(&a)).ran(), 1);
    assert_eq!(block_on(d.dispatch(&a)).ran(), 1);
    assert_eq!(d.guard_capacity(), 0);
}

#[event_handler(priority = 2, name = "boom")]
fn boom(event: &OrderPlaced) {
    panic!("cannot handle {}", event.order_id);
}

#[event_handler(priority = 1, name = "boom_async")]
async fn boom_async(_: &OrderPlaced) -> Result<(), HandlerError> {
    Err(HandlerError::permanent(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        "amount out of range",
    )))
}

#[test]
fn a_panicking_or_failing_handler_does_not_stop_the_others() {
    let d = Dispatcher::builder_empty()
        .handler::<first>()
        .handler::<boom>()
        .handler::<boom_async>()
        .handler::<z_late>()
        .resource(Calls::default())
        .build()
        .unwrap();
    let envelope = order("P-1");
    let report = block_on(d.dispatch(&envelope));
    assert_eq!(d.resource::<Calls>().unwrap().take(), ["first", "z_late"]);
    assert_eq!(report.ran(), 2);
    assert_eq!(report.failures(), 2);
    match report.outcome("boom") {
        Some(Outcome::Panicked(m)) => assert_eq!(m.as_str(), "cannot handle P-1"),
        other => panic!("boom: {other:?}"),
    }
    match report.outcome("boom_async") {
        Some(Outcome::Failed(e)) => {
            assert!(e.is_permanent());
            assert_eq!(e.chain(), ["amount out of range"]);
        }
        other => panic!("boom_async: {other:?}"),
    }
    // Failures are not marked: a redelivery retries exactly those.
    let again = block_on(d.dispatch(&envelope));
    assert_eq!((again.failures(), again.duplicates()), (2, 2));
}

#[derive(Default)]
struct Seen(Mutex<Vec<Envelope<OrderPlaced>>>);

#[event_handler(name = "keep")]
fn keep(envelope: &Envelope<OrderPlaced>, seen: &Seen) {
    seen.0.lock().unwrap().push(envelope.clone());
}

#[test]
fn raw_json_is_decoded_through_the_registry_by_name_and_version() {
    let d = Dispatcher::builder_empty()
        .handler::<keep>()
        .event::<OrderCancelled>()
        .resource(Seen::default())
        .build()
        .unwrap();
    let sent = order("R-1")
        .with_sequence(3)
        .with_header("tenant", "acme")
        .unwrap();
    let json = serde_json::to_string(&sent).unwrap();
    let report = block_on(d.dispatch_json(&json)).unwrap();
    assert_eq!(report.ran(), 1);
    assert_eq!(report.event_id(), sent.id());
    assert_eq!(*d.resource::<Seen>().unwrap().0.lock().unwrap(), [sent]);

    // A registered type without handlers decodes and reports nothing.
    let cancelled = Envelope::new(OrderCancelled {
        order_id: "R-1".into(),
    });
    let raw = cancelled.to_raw().unwrap();
    assert_eq!(block_on(d.dispatch_raw(&raw)).unwrap().outcomes().len(), 0);
}

fn raw(name: &str, version: u32, data: &str) -> RawEnvelope {
    let mut raw = order("X").to_raw().unwrap();
    raw.name = name.into();
    raw.version = version;
    raw.data = serde_json::value::RawValue::from_string(data.into()).unwrap();
    raw
}

#[test]
fn unknown_names_versions_and_bad_payloads_are_typed_errors() {
    let d = Dispatcher::builder_empty()
        .handler::<keep>()
        .resource(Seen::default())
        .build()
        .unwrap();
    match block_on(d.dispatch_raw(&raw("order.exploded", 1, "{}"))) {
        Err(DispatchError::Decode(DecodeError::UnknownName { name, version })) => {
            assert_eq!((name.as_str(), version), ("order.exploded", 1));
        }
        other => panic!("{other:?}"),
    }
    match block_on(d.dispatch_raw(&raw("order.placed", 7, "{}"))) {
        Err(DispatchError::Decode(DecodeError::UnknownVersion { version, known, .. })) => {
            assert_eq!((version, known), (7, vec![1]));
        }
        other => panic!("{other:?}"),
    }
    let bad = block_on(d.dispatch_raw(&raw("order.placed", 1, r#"{"order_id":"X"}"#)));
    match bad {
        Err(DispatchError::Decode(e @ DecodeError::Payload { .. })) => {
            let chain = event_core::ErrorChain(&e).to_string();
            assert!(chain.contains("missing field `amount`"), "{chain}");
        }
        other => panic!("{other:?}"),
    }
    match block_on(d.dispatch_json(r#"{"specversion":"1.0","id":"nope"}"#)) {
        Err(DispatchError::Decode(e @ DecodeError::Envelope(_))) => {
            assert!(e.to_string().contains("malformed event envelope"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert!(d.resource::<Seen>().unwrap().0.lock().unwrap().is_empty());
}

mod v1 {
    use super::*;
    #[derive(Debug, Serialize, Deserialize, DomainEvent)]
    #[event(name = "order.placed", version = 1)]
    pub(crate) struct Impostor {
        #[event(aggregate_id)]
        pub(crate) id: u32,
    }
}

#[test]
fn two_types_with_one_name_and_version_are_refused_naming_both() {
    let err = Dispatcher::builder_empty()
        .event::<OrderPlaced>()
        .event::<v1::Impostor>()
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        RegistryError::DuplicateEvent {
            name: "order.placed",
            version: 1,
            first: "dispatch::OrderPlaced",
            second: "dispatch::v1::Impostor",
        }
    );
    assert!(err.to_string().contains("dispatch::v1::Impostor"));
    // The same type registered twice is fine.
    Dispatcher::builder_empty()
        .event::<OrderPlaced>()
        .event::<OrderPlaced>()
        .build()
        .unwrap();
}

#[test]
fn a_missing_resource_is_refused_naming_the_handler_and_the_type() {
    let err = Dispatcher::builder_empty()
        .handler::<middle>()
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        RegistryError::MissingResource {
            handler: "middle",
            type_name: "dispatch::Calls",
        }
    );
}

#[event_handler(name = "middle")]
fn impostor_middle(_: &OrderCancelled) {}

#[test]
fn two_handlers_with_one_name_are_refused() {
    let err = Dispatcher::builder_empty()
        .handler::<middle>()
        .handler::<impostor_middle>()
        .resource(Calls::default())
        .build()
        .unwrap_err();
    assert!(
        matches!(
            err,
            RegistryError::DuplicateHandlerName { name: "middle", .. }
        ),
        "{err}"
    );
}

#[test]
fn too_few_handlers_is_a_start_up_error() {
    let err = Dispatcher::builder_empty()
        .handler::<middle>()
        .resource(Calls::default())
        .expect_handlers(2)
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        RegistryError::TooFewHandlers {
            expected: 2,
            found: 1,
            names: "middle".into()
        }
    );
}

#[test]
fn handler_names_default_to_module_path_and_function() {
    assert_eq!(keep::DESCRIPTOR.name, "keep");
    #[event_handler]
    fn unnamed(_: &OrderCancelled) {}
    assert_eq!(unnamed::DESCRIPTOR.name, "dispatch::unnamed");
    assert_eq!(unnamed::DESCRIPTOR.priority, 0);
}

#[derive(Default)]
struct Ledger(Mutex<Vec<String>>);

#[event_handler(in_transaction, name = "ledger")]
fn ledger(event: &OrderPlaced, ledger: &Ledger) -> Result<(), HandlerError> {
    if event.amount == 0 {
        return Err(HandlerError::permanent_msg("amount must be positive"));
    }
    ledger.0.lock().unwrap().push(event.order_id.clone());
    Ok(())
}

#[event_handler(name = "after")]
fn after(event: &OrderPlaced, calls: &Calls) {
    calls.push(if event.amount == 0 {
        "after-zero"
    } else {
        "after"
    });
}

struct Order {
    events: EventRecorder,
}

impl Order {
    fn place(id: &str, amount: u64) -> Order {
        let mut o = Order {
            events: EventRecorder::new(),
        };
        o.events.record(OrderPlaced {
            order_id: id.into(),
            amount,
        });
        o
    }
}

#[test]
fn unit_of_work_runs_in_transaction_handlers_first_and_aborts_on_their_failure() {
    let d = Dispatcher::builder_empty()
        .handler::<after>()
        .handler::<ledger>()
        .resource(Calls::default())
        .resource(Ledger::default())
        .build()
        .unwrap();

    let mut ok = Order::place("U-1", 5);
    let mut uow = d.unit_of_work();
    uow.extend(ok.events.take());
    let reports = block_on(uow.commit()).unwrap();
    let order: Vec<_> = reports[0].outcomes().iter().map(|o| o.handler).collect();
    assert_eq!(order, ["ledger", "after"]);
    assert_eq!(d.resource::<Calls>().unwrap().take(), ["after"]);

    // The second event's in-transaction handler fails: nothing after-commit runs, not even
    // for the first event of the same unit of work.
    let mut uow = d.unit_of_work();
    uow.extend(Order::place("U-2", 5).events.take());
    uow.extend(Order::place("U-3", 0).events.take());
    let err = block_on(uow.commit()).unwrap_err();
    assert_eq!(err.handler, "ledger");
    let chain = event_core::ErrorChain(&err).to_string();
    assert_eq!(
        chain.matches("amount must be positive").count(),
        1,
        "{chain}"
    );
    assert!(d.resource::<Calls>().unwrap().take().is_empty());
}

#[test]
fn public_runtime_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    fn send<T: Send>(_: &T) {}
    let d = Dispatcher::builder_empty()
        .handler::<keep>()
        .resource(Seen::default())
        .build()
        .unwrap();
    send_sync(&d);
    send_sync(d.registry());
    let e = order("S");
    send(&d.dispatch(&e));
    send(&d.dispatch_json("{}"));
    let uow = d.unit_of_work();
    send(&uow.commit());
    send_sync(&block_on(d.dispatch(&e)));
    send_sync(&Dispatcher::builder_empty());
    let _: &dyn Fn() = &|| {
        fn is_error<E: std::error::Error + Send + Sync + 'static>() {}
        is_error::<RegistryError>();
        is_error::<DispatchError>();
        is_error::<event_runtime::CommitError>();
        is_error::<DecodeError>();
    };
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.shipped", version = 1)]
struct OrderShipped {
    #[event(aggregate_id)]
    order_id: String,
}

/// Waits forever on its first call; returns at once afterwards.
#[event_handler(name = "stalls_once")]
async fn stalls_once(_: &OrderShipped, calls: &Calls) {
    let first = calls.0.lock().unwrap().is_empty();
    calls.push("stalls_once");
    if first {
        std::future::pending::<()>().await;
    }
}

#[tokio::test]
async fn a_dispatch_dropped_while_its_handler_awaits_does_not_count_as_a_run() {
    let d = Dispatcher::builder_empty()
        .handler::<stalls_once>()
        .resource(Calls::default())
        .build()
        .unwrap();
    let e = Envelope::new(OrderShipped {
        order_id: "o-1".into(),
    });
    let dropped = tokio::time::timeout(std::time::Duration::from_millis(50), d.dispatch(&e)).await;
    assert!(dropped.is_err(), "the first call stalls");
    // The redelivery runs the handler: the dropped call's reservation was released.
    let again = d.dispatch(&e).await;
    assert_eq!((again.ran(), again.duplicates()), (1, 0));
    // And once it ran, the guard remembers it.
    let third = d.dispatch(&e).await;
    assert_eq!((third.ran(), third.duplicates()), (0, 1));
    assert_eq!(
        d.resource::<Calls>().unwrap().take(),
        ["stalls_once", "stalls_once"]
    );
}

//! Events declared in one crate (`shop-events`), handlers in a second (`shop-handlers`),
//! dispatch from a third (this test): registration through `inventory` crosses crates, and the
//! linking rule documented in `event_runtime` ("Linking") holds.

// The rule: a crate of handlers that the binary never names is not linked. Naming it links it.
use shop_handlers as _;
// `unlinked-handlers` is a dependency of this package too, but nothing here names it.

use std::sync::atomic::Ordering;

use event_core::Envelope;
use event_runtime::{Dispatcher, RegistryError};
use shop_events::CheckedOut;
use shop_handlers::Items;

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn handlers_of_a_linked_crate_register_and_run_in_priority_order() {
    let d = Dispatcher::builder()
        .resource(Items::default())
        .expect_handlers(2)
        .build()
        .unwrap();
    let names: Vec<_> = d.registry().handlers().iter().map(|h| h.name).collect();
    assert_eq!(names, ["shop.audit", "shop.count_items"]);
    let report = block_on(d.dispatch(&Envelope::new(CheckedOut {
        basket: 1,
        items: 3,
    })));
    let ran: Vec<_> = report.outcomes().iter().map(|o| o.handler).collect();
    assert_eq!(ran, ["shop.audit", "shop.count_items"]);
    assert_eq!(d.resource::<Items>().unwrap().0.load(Ordering::SeqCst), 303);
}

#[test]
fn handlers_of_a_crate_nothing_names_are_dropped_and_expect_handlers_says_so() {
    let found = event_core::registered_handlers().any(|h| h.name == "unlinked.ignored");
    assert!(
        !found,
        "unlinked-handlers was linked although nothing names it"
    );
    let err = Dispatcher::builder()
        .resource(Items::default())
        .expect_handlers(3)
        .build()
        .unwrap_err();
    match &err {
        RegistryError::TooFewHandlers {
            expected: 3,
            found: 2,
            ..
        } => {}
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("use that_crate as _;"), "{err}");
}

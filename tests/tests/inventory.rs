//! Collection through `inventory` within one crate: every derive and handler of this binary is
//! found without registering anything by hand, and the order is priority then name.

use std::sync::Mutex;

use event_core::{event_handler, DomainEvent, Envelope};
use event_runtime::Dispatcher;
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, DomainEvent)]
#[event(name = "invoice.sent", version = 1)]
struct InvoiceSent {
    #[event(aggregate_id)]
    invoice: String,
}

#[derive(Debug, Serialize, Deserialize, DomainEvent)]
#[event(name = "invoice.paid", version = 2)]
struct InvoicePaid {
    #[event(aggregate_id)]
    invoice: String,
}

#[derive(Default)]
struct Log(Mutex<Vec<&'static str>>);

#[event_handler(priority = 3)]
fn c(_: &InvoiceSent, log: &Log) {
    log.0.lock().unwrap().push("c");
}

#[event_handler(priority = 3)]
fn b(_: &InvoiceSent, log: &Log) {
    log.0.lock().unwrap().push("b");
}

#[event_handler(priority = 1)]
fn z(_: &InvoiceSent, log: &Log) {
    log.0.lock().unwrap().push("z");
}

#[test]
fn every_declared_event_and_handler_is_collected() {
    let d = Dispatcher::builder()
        .resource(Log::default())
        .expect_handlers(3)
        .build()
        .unwrap();
    let mut events: Vec<_> = d
        .registry()
        .events()
        .iter()
        .map(|e| (e.name, e.version, e.type_name))
        .collect();
    events.sort();
    assert_eq!(
        events,
        [
            ("invoice.paid", 2, "inventory::InvoicePaid"),
            ("invoice.sent", 1, "inventory::InvoiceSent")
        ]
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let report = rt.block_on(d.dispatch(&Envelope::new(InvoiceSent {
        invoice: "I-1".into(),
    })));
    assert_eq!(report.ran(), 3);
    assert_eq!(
        *d.resource::<Log>().unwrap().0.lock().unwrap(),
        ["z", "b", "c"]
    );
    assert_eq!(
        d.registry().handlers()[0].name,
        "inventory::z",
        "default names are module path and function"
    );
}

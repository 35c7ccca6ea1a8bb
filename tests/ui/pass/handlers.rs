// Sync and async handlers with resources and a transaction, called through their
// descriptors the way the runtime calls them.
use std::any::Any;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use event_core::{
    event_handler, BoundResource, DeliveryMode, DomainEvent, Envelope, Handler, HandlerCall,
    HandlerContext,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 1)]
pub struct OrderPlaced {
    #[event(aggregate_id)]
    pub order_id: String,
    pub total_cents: u32,
}

pub struct Counter(AtomicU32);
pub struct Config {
    pub bonus: u32,
}
pub struct Tx {
    pub writes: Vec<String>,
}

#[event_handler]
fn count(event: &OrderPlaced, counter: &Counter) {
    counter.0.fetch_add(event.total_cents, Ordering::SeqCst);
}

#[event_handler(priority = 10, name = "orders.record", in_transaction)]
fn record(event: &OrderPlaced, tx: &mut Tx, counter: &Counter, config: &Config) {
    tx.writes.push(event.order_id.clone());
    counter.0.fetch_add(config.bonus, Ordering::SeqCst);
}

#[event_handler]
async fn notify(event: &OrderPlaced, counter: &Counter) {
    std::future::ready(()).await;
    counter.0.fetch_add(event.total_cents * 2, Ordering::SeqCst);
}

fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
    }
}

fn main() {
    let envelope = Envelope::new(OrderPlaced { order_id: "A-1".into(), total_cents: 5 });
    let counter: Arc<dyn Any + Send + Sync> = Arc::new(Counter(AtomicU32::new(0)));
    let config: Arc<dyn Any + Send + Sync> = Arc::new(Config { bonus: 100 });
    let mut tx = Tx { writes: Vec::new() };

    // sync, one resource
    let d = <count as Handler>::DESCRIPTOR;
    assert!(d.name.ends_with("::count"), "{}", d.name);
    assert_eq!(d.priority, 0);
    assert_eq!(d.mode, DeliveryMode::AfterCommit);
    assert!(!d.takes_envelope);
    assert!(d.transaction.is_none());
    assert_eq!((d.events[0])().name, "order.placed");
    assert_eq!(d.resources.len(), 1);
    let resources = [BoundResource::new(counter.clone())];
    let mut ctx = HandlerContext::new(&envelope, &resources, None);
    let HandlerCall::Sync(call) = d.call else { panic!("sync handler") };
    call(&mut ctx).unwrap();

    // sync, transaction before the resources
    let d = <record as Handler>::DESCRIPTOR;
    assert_eq!(d.name, "orders.record");
    assert_eq!(d.priority, 10);
    assert_eq!(d.mode, DeliveryMode::InTransaction);
    assert_eq!(d.resources.len(), 2);
    assert!((d.transaction.unwrap().type_name)().ends_with("Tx"));
    let resources = [
        BoundResource::new(counter.clone()),
        BoundResource::new(config.clone()),
    ];
    let mut ctx = HandlerContext::new(&envelope, &resources, Some(&mut tx));
    let HandlerCall::Sync(call) = d.call else { panic!("sync handler") };
    call(&mut ctx).unwrap();

    // async
    let d = <notify as Handler>::DESCRIPTOR;
    let resources = [BoundResource::new(counter.clone())];
    let mut ctx = HandlerContext::new(&envelope, &resources, None);
    let HandlerCall::Async(call) = d.call else { panic!("async handler") };
    block_on(call(&mut ctx)).unwrap();

    let counter = counter.downcast_ref::<Counter>().unwrap();
    assert_eq!(counter.0.load(Ordering::SeqCst), 5 + 100 + 10);
    assert_eq!(tx.writes, ["A-1"]);

    // the registry sees all of them
    let names: Vec<_> = event_core::registered_handlers().map(|d| d.name).collect();
    assert!(names.contains(&"orders.record"), "{names:?}");
    assert_eq!(names.len(), 3, "{names:?}");
}

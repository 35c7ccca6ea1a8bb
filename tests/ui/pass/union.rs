use event_core::{
    event_handler, DomainEvent, Envelope, EventUnion, Handler, HandlerCall, HandlerContext,
};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed")]
pub struct OrderPlaced {
    #[event(aggregate_id)]
    pub order_id: String,
    pub amount: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.shipped")]
pub struct OrderShipped {
    #[event(aggregate_id)]
    pub order_id: String,
}

/// Every event of an order.
#[derive(Debug, EventUnion)]
pub enum OrderEvent {
    Placed(OrderPlaced),
    Shipped(OrderShipped),
}

#[event_handler]
fn summary(event: &OrderEvent) -> Result<(), std::io::Error> {
    match event {
        OrderEvent::Placed(e) => assert_eq!(e.amount, 5),
        OrderEvent::Shipped(e) => assert_eq!(e.order_id, "A-1"),
    }
    Ok(())
}

#[event_handler]
async fn with_metadata(event: &Envelope<OrderEvent>) {
    assert_eq!(event.sequence(), 3);
    assert_eq!(event.aggregate_id(), "A-1");
}

fn main() {
    let d = <summary as Handler>::DESCRIPTOR;
    let names: Vec<&str> = d.events.iter().map(|e| e().name).collect();
    assert_eq!(names, ["order.placed", "order.shipped"]);
    assert!(!d.takes_envelope);
    assert!(<with_metadata as Handler>::DESCRIPTOR.takes_envelope);
    let placed = Envelope::new(OrderPlaced { order_id: "A-1".into(), amount: 5 });
    let shipped = Envelope::new(OrderShipped { order_id: "A-1".into() });
    let HandlerCall::Sync(call) = d.call else { panic!("a plain fn") };
    call(&mut HandlerContext::new(&placed, &[], None)).unwrap();
    call(&mut HandlerContext::new(&shipped, &[], None)).unwrap();
    // An envelope of another type is refused, not matched by name.
    let other = Envelope::new(OrderPlaced { order_id: "A-1".into(), amount: 5 }).with_sequence(3);
    assert!(call(&mut HandlerContext::new(&"not an envelope", &[], None)).is_err());
    assert_eq!(OrderEvent::Shipped(shipped.event().clone()).event_name(), "order.shipped");
    let HandlerCall::Async(call) = <with_metadata as Handler>::DESCRIPTOR.call else { panic!() };
    let mut ctx = HandlerContext::new(&other, &[], None);
    let fut = call(&mut ctx);
    drop(fut);
}

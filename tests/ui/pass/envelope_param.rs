use event_core::{event_handler, DomainEvent, Envelope, Handler, HandlerCall, HandlerContext};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.shipped", version = 2)]
struct OrderShipped {
    #[event(aggregate_id)]
    order_id: String,
}

#[event_handler]
fn with_metadata(event: &Envelope<OrderShipped>) {
    assert_eq!(event.sequence(), 7);
    assert_eq!(event.event().order_id, "A-9");
}

// Detection is trait-based: an alias of `Envelope<E>` is an envelope parameter too.
type Shipped = Envelope<OrderShipped>;

#[event_handler]
fn through_alias(event: &Shipped) {
    assert_eq!(event.aggregate_id(), "A-9");
}

fn main() {
    let envelope = Envelope::new(OrderShipped { order_id: "A-9".into() }).with_sequence(7);
    for d in [<with_metadata as Handler>::DESCRIPTOR, <through_alias as Handler>::DESCRIPTOR] {
        assert!(d.takes_envelope);
        assert_eq!((d.events[0])().version, 2);
        let mut ctx = HandlerContext::new(&envelope, &[], None);
        let HandlerCall::Sync(call) = d.call else { panic!("sync handler") };
        call(&mut ctx).unwrap();
    }
}

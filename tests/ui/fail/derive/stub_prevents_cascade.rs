// A mistake in the attribute is reported once: the type still implements `DomainEvent`
// (unregistered), so using it as one adds no error.
use event_core::{event_handler, DomainEvent, Envelope};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "OrderPlaced", version = 1)]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: String,
}

#[event_handler]
fn on_placed(_event: &OrderPlaced) {}

fn main() {
    let _ = Envelope::new(OrderPlaced { order_id: "A-1".into() });
    let _ = OrderPlaced::NAME;
}

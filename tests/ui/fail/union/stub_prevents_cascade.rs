use event_core::{event_handler, DomainEvent, EventUnion};
use serde::{Deserialize, Serialize};

#[derive(Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed")]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: String,
}

// The one error is at the unit variant; the handler below reports nothing more.
#[derive(EventUnion)]
enum OrderEvent {
    Placed(OrderPlaced),
    Cancelled,
}

#[event_handler]
fn summary(_event: &OrderEvent) {}

fn main() {}

use event_core::{DomainEvent, EventUnion};
use serde::{Deserialize, Serialize};

#[derive(Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed")]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: String,
}

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.shipped")]
struct OrderShipped {
    #[event(aggregate_id)]
    order_id: String,
}

#[derive(EventUnion)]
enum OrderEvent {
    Placed(OrderPlaced),
    Shipped(OrderShipped),
}

fn main() {}

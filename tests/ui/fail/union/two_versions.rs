use event_core::{DomainEvent, EventUnion};
use serde::{Deserialize, Serialize};

#[derive(Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed")]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: String,
}

#[derive(Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.shipped")]
struct OrderShipped {
    #[event(aggregate_id)]
    order_id: String,
}

#[derive(Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 2, upcast_from = OrderPlaced)]
struct OrderPlacedV2 {
    #[event(aggregate_id)]
    order_id: String,
}

impl From<OrderPlaced> for OrderPlacedV2 {
    fn from(v1: OrderPlaced) -> Self {
        OrderPlacedV2 { order_id: v1.order_id }
    }
}

#[derive(EventUnion)]
enum OrderEvent {
    Placed(OrderPlaced),
    PlacedV2(OrderPlacedV2),
}

fn main() {}

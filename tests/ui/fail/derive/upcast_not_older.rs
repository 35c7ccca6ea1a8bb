use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 3)]
struct OrderPlacedV3 {
    #[event(aggregate_id)]
    order_id: String,
}

// Backwards: version 2 cannot be upcast from version 3.
#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 2, upcast_from = OrderPlacedV3)]
struct OrderPlacedV2 {
    #[event(aggregate_id)]
    order_id: String,
}

impl From<OrderPlacedV3> for OrderPlacedV2 {
    fn from(e: OrderPlacedV3) -> Self {
        OrderPlacedV2 { order_id: e.order_id }
    }
}

fn main() {}

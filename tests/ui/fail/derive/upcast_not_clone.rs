use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

// Not `Clone`.
#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 1)]
struct OrderPlacedV1 {
    #[event(aggregate_id)]
    order_id: String,
}

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 2, upcast_from = OrderPlacedV1)]
struct OrderPlacedV2 {
    #[event(aggregate_id)]
    order_id: String,
}

impl From<OrderPlacedV1> for OrderPlacedV2 {
    fn from(v1: OrderPlacedV1) -> Self {
        OrderPlacedV2 { order_id: v1.order_id }
    }
}

fn main() {}

use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 1)]
struct OrderPlacedV1 {
    #[event(aggregate_id)]
    order_id: String,
}

// `version` left at its default, 1.
#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", upcast_from = OrderPlacedV1)]
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

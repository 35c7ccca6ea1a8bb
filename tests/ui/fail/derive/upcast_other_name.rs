use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.shipped", version = 1)]
struct OrderShipped {
    #[event(aggregate_id)]
    order_id: String,
}

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 2, upcast_from = OrderShipped)]
struct OrderPlacedV2 {
    #[event(aggregate_id)]
    order_id: String,
}

impl From<OrderShipped> for OrderPlacedV2 {
    fn from(e: OrderShipped) -> Self {
        OrderPlacedV2 { order_id: e.order_id }
    }
}

fn main() {}

use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 1)]
struct OrderPlacedV1 {
    #[event(aggregate_id)]
    order_id: String,
}

// No `impl From<OrderPlacedV1> for OrderPlacedV2`.
#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 2, upcast_from = OrderPlacedV1)]
struct OrderPlacedV2 {
    #[event(aggregate_id)]
    order_id: String,
    currency: String,
}

fn main() {}

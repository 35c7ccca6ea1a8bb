use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 2, upcast_from = "OrderPlacedV1")]
struct OrderPlacedV2 {
    #[event(aggregate_id)]
    order_id: String,
}

fn main() {}

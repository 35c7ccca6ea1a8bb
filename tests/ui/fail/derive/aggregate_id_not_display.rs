use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 1)]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: OrderId,
}

#[derive(Serialize, Deserialize)]
struct OrderId(u64);

fn main() {}

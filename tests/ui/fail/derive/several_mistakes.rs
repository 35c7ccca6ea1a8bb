use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "Order", version = 0, colour = "red")]
struct OrderPlaced {
    order_id: String,
}

fn main() {}

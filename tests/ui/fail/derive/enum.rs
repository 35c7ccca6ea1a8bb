use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 1)]
enum OrderEvent {
    Placed { order_id: String },
    Cancelled { order_id: String },
}

fn main() {}

use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", deny_unknown_fields = true)]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: String,
}

fn main() {}

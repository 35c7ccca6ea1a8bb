// A second event taken as an envelope is not a resource either.
use event_core::{event_handler, DomainEvent, Envelope};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 1)]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: String,
}

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.paid", version = 1)]
struct OrderPaid {
    #[event(aggregate_id)]
    order_id: String,
}

#[event_handler]
fn on_order(placed: &Envelope<OrderPlaced>, paid: &Envelope<OrderPaid>) {
    let _ = (placed, paid);
}

fn main() {}

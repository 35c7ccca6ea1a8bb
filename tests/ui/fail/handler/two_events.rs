// A second event type after the event is not a resource.
use event_core::{event_handler, DomainEvent};
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

struct Db;

#[event_handler]
fn on_order(placed: &OrderPlaced, db: &Db, paid: &OrderPaid) {
    let _ = (placed, db, paid);
}

fn main() {}

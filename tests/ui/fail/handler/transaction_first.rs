use event_core::{event_handler, DomainEvent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 1)]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: String,
}

struct Db;
struct Tx;

#[event_handler]
fn on_placed(tx: &mut Tx, event: &OrderPlaced, db: &Db) {
    let _ = (tx, event, db);
}

fn main() {}

// An associated function that neither takes `self` nor names `Self`: nothing in its own tokens
// says it is in an `impl` block.
use event_core::{event_handler, DomainEvent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 1)]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: String,
}

struct Db;

struct Projection;

impl Projection {
    #[event_handler]
    fn on_placed(event: &OrderPlaced, db: &Db) {
        let _ = (event, db);
    }
}

fn main() {}

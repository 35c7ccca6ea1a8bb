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

#[event_handler(in_transaction)]
fn on_placed(event: &OrderPlaced, tx: &mut std::rc::Rc<Tx>) {
    let _ = (event, tx);
}

fn main() {}

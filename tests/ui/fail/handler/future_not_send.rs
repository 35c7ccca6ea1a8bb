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
async fn on_placed(event: &OrderPlaced) {
    let local = std::rc::Rc::new(event.order_id.clone());
    std::future::ready(()).await;
    let _ = local;
}

fn main() {}

// An associated function that names `Self`.
use event_core::{event_handler, DomainEvent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 1)]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: String,
}

struct Projection;

impl Projection {
    fn summary(event: &OrderPlaced) -> String {
        event.order_id.clone()
    }

    #[event_handler]
    fn on_placed(event: &OrderPlaced) {
        let _ = Self::summary(event);
    }
}

fn main() {}

// A variant type written as a path: the error underlines the whole path, once.
use event_core::{DomainEvent, EventUnion};
use serde::{Deserialize, Serialize};

mod events {
    use super::*;

    #[derive(Serialize, Deserialize, DomainEvent)]
    #[event(name = "order.placed")]
    pub struct OrderPlaced {
        #[event(aggregate_id)]
        pub order_id: String,
    }
}

#[derive(EventUnion)]
enum OrderEvent {
    Placed(events::OrderPlaced),
}

fn main() {}

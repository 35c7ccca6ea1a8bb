// `upcast_from` as a path: the error underlines the whole path, once.
use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

mod v1 {
    use super::*;

    #[derive(Clone, Serialize, Deserialize, DomainEvent)]
    #[event(name = "order.placed", version = 1)]
    pub struct OrderPlaced {
        #[event(aggregate_id)]
        pub order_id: String,
    }
}

// No `impl From<v1::OrderPlaced> for OrderPlaced`.
#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 2, upcast_from = v1::OrderPlaced)]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: String,
}

fn main() {}

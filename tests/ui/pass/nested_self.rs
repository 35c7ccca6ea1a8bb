// A free handler whose body holds items naming `Self`: those are not the handler's `Self`.
#![deny(warnings)]

use event_core::{event_handler, DomainEvent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 1)]
pub struct OrderPlaced {
    #[event(aggregate_id)]
    pub order_id: String,
}

pub struct Totals;

#[event_handler]
pub fn on_placed(event: &OrderPlaced, totals: &Totals) {
    struct Line(usize);
    impl Line {
        fn new(len: usize) -> Self {
            Self(len)
        }
    }
    let line = Line::new(event.order_id.len());
    let _ = (line.0, totals);
}

fn main() {
    let _ = event_core::registered_handlers().count();
}

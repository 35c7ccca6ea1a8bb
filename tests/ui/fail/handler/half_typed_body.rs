use event_core::{event_handler, DomainEvent, Handler};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 1)]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: String,
}

// Half-typed, as in an editor: one syntax error, and the function stays for its callers.
#[event_handler]
fn on_placed(event: &OrderPlaced) {
    let _length = event.order_id.len() + ;
}

fn main() {
    on_placed(&OrderPlaced {
        order_id: "A-1".into(),
    });
    let _ = <on_placed as Handler>::DESCRIPTOR;
}

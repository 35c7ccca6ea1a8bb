use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 1)]
pub struct OrderPlaced {
    #[event(aggregate_id)]
    pub order_id: String,
    pub customer: String,
}

// `version` defaults to 1.
#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.line_added")]
struct LineAdded {
    #[event(aggregate_id)]
    order: u64,
}

fn main() {
    assert_eq!(OrderPlaced::NAME, "order.placed");
    assert_eq!(OrderPlaced::VERSION, 1);
    assert_eq!(OrderPlaced::AGGREGATE_TYPE, "order");
    let event = OrderPlaced { order_id: "A-1".into(), customer: "C-1".into() };
    assert_eq!(event.aggregate_id(), "A-1");
    assert_eq!(event.customer, "C-1");

    assert_eq!(LineAdded::VERSION, 1);
    assert_eq!(LineAdded { order: 7 }.aggregate_id(), &7);

    let names: Vec<_> = event_core::registered_events().map(|e| e.name).collect();
    assert!(names.contains(&"order.placed"), "{names:?}");
    assert!(names.contains(&"order.line_added"), "{names:?}");
}

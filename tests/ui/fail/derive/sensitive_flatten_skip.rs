use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Address {
    street: String,
}

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "customer.moved", version = 1)]
struct Moved {
    #[event(aggregate_id)]
    customer_id: String,
    #[event(sensitive)]
    #[serde(flatten)]
    address: Address,
    #[event(sensitive)]
    #[serde(skip)]
    note: String,
}

fn main() {}

use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "customer.registered", version = 1)]
struct Registered {
    #[event(aggregate_id)]
    customer_id: String,
    #[event(sensitive = true)]
    email: String,
    #[event(sensitive, sensitive)]
    phone: String,
    #[event(sensitive)]
    #[serde(rename(serialize = "nm", deserialize = "name"))]
    name: String,
}

fn main() {}

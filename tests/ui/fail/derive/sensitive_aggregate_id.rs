use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "customer.registered", version = 1)]
struct Registered {
    #[event(aggregate_id, sensitive)]
    email: String,
}

fn main() {}

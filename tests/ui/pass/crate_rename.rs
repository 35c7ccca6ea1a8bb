// A facade crate re-exports event-core under its own name; its users write
// `crate = path` so that the generated code reaches event-core through it.
mod platform {
    pub use event_core as events;
}

use platform::events::{event_handler, DomainEvent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "user.registered", crate = platform::events)]
struct UserRegistered {
    #[event(aggregate_id)]
    user_id: String,
}

// serde's spelling, a path in a string, works too.
#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "user.renamed", crate = "crate::platform::events")]
struct UserRenamed {
    #[event(aggregate_id)]
    user_id: String,
}

#[event_handler(crate = platform::events)]
fn welcome(_event: &UserRegistered) {}

#[event_handler(crate = crate::platform::events, priority = 1)]
fn audit(_event: &UserRenamed) {}

fn main() {
    use platform::events::Handler;
    assert_eq!(UserRegistered::NAME, "user.registered");
    assert_eq!(UserRenamed::NAME, "user.renamed");
    assert_eq!((<welcome as Handler>::DESCRIPTOR.events[0])().name, "user.registered");
    assert_eq!(<audit as Handler>::DESCRIPTOR.priority, 1);
}

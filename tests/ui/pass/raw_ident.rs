use event_core::{event_handler, DomainEvent, Handler};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.typed")]
struct Typed {
    #[event(aggregate_id)]
    r#type: String,
}

#[event_handler]
fn r#match(_event: &Typed) {}

fn main() {
    assert_eq!(Typed { r#type: "t".into() }.aggregate_id(), "t");
    let name = <r#match as Handler>::DESCRIPTOR.name;
    assert!(name.ends_with("::match"), "{name}");
}

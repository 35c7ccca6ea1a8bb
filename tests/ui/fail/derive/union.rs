use event_core::DomainEvent;

#[derive(DomainEvent)]
#[event(name = "order.placed", version = 1)]
union OrderPlaced {
    id: u64,
    code: u32,
}

fn main() {}

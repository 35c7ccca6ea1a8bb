use event_core::{event_handler, DomainEvent, Handler};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "stock.reserved")]
struct StockReserved {
    #[event(aggregate_id)]
    sku: String,
}

#[event_handler(priority = -10)]
fn first(_event: &StockReserved) {}

#[event_handler(priority = -2147483648)]
fn very_first(_event: &StockReserved) {}

#[event_handler(priority = 2147483647)]
fn last(_event: &StockReserved) {}

fn main() {
    assert_eq!(<first as Handler>::DESCRIPTOR.priority, -10);
    assert_eq!(<very_first as Handler>::DESCRIPTOR.priority, i32::MIN);
    assert_eq!(<last as Handler>::DESCRIPTOR.priority, i32::MAX);
}

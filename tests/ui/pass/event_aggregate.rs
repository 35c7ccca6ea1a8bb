use event_core::{DomainEvent, Envelope};
use serde::{Deserialize, Serialize};

// The aggregate type is not the first segment of the name.
#[derive(Debug, PartialEq, Serialize, Deserialize, DomainEvent)]
#[event(name = "billing.invoice_sent", version = 3, aggregate = "customer_account")]
struct InvoiceSent {
    amount_cents: u64,
    #[event(aggregate_id)]
    account: u32,
}

// Several `#[event]` attributes are merged.
#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "cart.item_removed")]
#[event(version = 2)]
struct ItemRemoved {
    #[event(aggregate_id)]
    cart: String,
}

fn main() {
    assert_eq!(InvoiceSent::AGGREGATE_TYPE, "customer_account");
    assert_eq!(InvoiceSent::VERSION, 3);
    assert_eq!(ItemRemoved::VERSION, 2);
    assert_eq!(ItemRemoved::AGGREGATE_TYPE, "cart");
    let envelope = Envelope::new(InvoiceSent { amount_cents: 1250, account: 42 });
    assert_eq!(envelope.aggregate_id(), "42");
    assert_eq!(envelope.metadata().aggregate_type, "customer_account");
    let raw = envelope.to_raw().unwrap();
    assert_eq!(Envelope::<InvoiceSent>::decode(&raw).unwrap(), envelope);
}

use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "customer.registered")]
struct Registered {
    #[event(aggregate_id)]
    customer_id: String,
    #[event(sensitive)]
    email: String,
    #[event(sensitive)]
    #[serde(rename = "fullName")]
    full_name: String,
    #[event(sensitive)]
    r#type: String,
    country: String,
}

#[derive(Serialize, Deserialize, DomainEvent)]
#[serde(rename_all = "camelCase")]
#[event(name = "customer.moved")]
struct Moved {
    #[event(aggregate_id)]
    customer_id: String,
    #[event(sensitive)]
    street_address: String,
    #[serde(rename = "zip")]
    #[event(sensitive)]
    postal_code: String,
}

#[derive(Serialize, Deserialize, DomainEvent)]
#[serde(rename_all = "lowercase")]
#[event(name = "customer.renamed")]
#[allow(non_snake_case)]
struct Renamed {
    #[event(aggregate_id)]
    id: String,
    // serde's `lowercase` leaves a field name as it is.
    #[event(sensitive)]
    eMail: String,
    #[event(sensitive)]
    #[serde(rename = "cardNo", alias = "card_number", alias = "card")]
    card: String,
}

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "customer.seen")]
struct Seen {
    #[event(aggregate_id)]
    customer_id: String,
}

// Names passed through `macro_rules!` (invisible groups around the literals).
macro_rules! event_with {
    ($rule:literal, $rename:literal) => {
        #[derive(Serialize, Deserialize, DomainEvent)]
        #[serde(rename_all = $rule)]
        #[event(name = "customer.macro")]
        struct FromMacro {
            #[event(aggregate_id)]
            customer_id: String,
            #[event(sensitive)]
            email_address: String,
            #[event(sensitive)]
            #[serde(rename = $rename)]
            phone: String,
        }
    };
}
event_with!("SCREAMING_SNAKE_CASE", "tel");

fn main() {
    assert_eq!(Registered::SENSITIVE_FIELDS, ["email", "fullName", "type"]);
    assert_eq!(Moved::SENSITIVE_FIELDS, ["streetAddress", "zip"]);
    assert!(Seen::SENSITIVE_FIELDS.is_empty());
    assert_eq!(FromMacro::SENSITIVE_FIELDS, ["EMAIL_ADDRESS", "tel"]);
    assert_eq!(Renamed::SENSITIVE_FIELDS, ["eMail", "cardNo", "card_number", "card"]);
}

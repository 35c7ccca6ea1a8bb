//! The order domain: its events and the `Order` aggregate that records them.
//! Pure domain code: no I/O, no runtime, no knowledge of CSV or of who handles the events.
//!
//! # Event versions
//!
//! | event | version | type | recorded by |
//! |---|---|---|---|
//! | `order.placed` | 1 | [`OrderPlaced`] | earlier releases of this example: its rows stay in databases, dead letter queues and brokers |
//! | `order.placed` | 2 | [`OrderPlacedV2`] (adds `currency`) | [`Order::place`] |
//! | `order.line_added` | 1 | [`LineAdded`] | [`Order::add_line`] |
//! | `order.shipped` | 1 | [`OrderShipped`] | [`Order::ship`] |
//!
//! Version 2 declares `upcast_from = OrderPlaced` with a `From<OrderPlaced>` impl that derives
//! the currency from the country ([`currency_of`]); the runtime upcasts every version-1
//! envelope it decodes, so the handlers take [`OrderPlacedV2`] only and never see a version 1.
//! Version 1 stays registered (the derive registers it with version 2): without it, the
//! version-1 rows already written could not be decoded, and the catalog check
//! (`examples/tests/catalog.rs`) reports removing it as an incompatible change.
//!
//! Every event type derives `schemars::JsonSchema`, so the schema catalog
//! (`orders events catalog`) holds the JSON Schema of each (name, version).

use chrono::NaiveDate;
use event_core::{AnyEnvelope, DomainEvent, EventRecorder, EventUnion};
use rust_decimal::Decimal;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An order was placed by a customer (version 1, as earlier releases recorded it; the
/// aggregate now records [`OrderPlacedV2`]). Kept so that version-1 envelopes still decode:
/// the runtime upcasts them to version 2 before any handler runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, DomainEvent, JsonSchema)]
#[event(name = "order.placed", version = 1)]
pub struct OrderPlaced {
    /// The order id (`US-2019-103800`), also the aggregate id.
    #[event(aggregate_id)]
    pub order_id: String,
    /// The customer the order belongs to (`DP-13000`): personal data, masked wherever the
    /// runtime prints an envelope.
    #[event(sensitive)]
    pub customer_id: String,
    /// Market segment of the customer (`Consumer`, `Corporate`, `Home Office`).
    pub segment: String,
    /// Sales region (`Central`, `East`, `South`, `West`).
    pub region: String,
    /// Country or region of the shipping address.
    pub country: String,
    /// When the order was placed.
    pub order_date: NaiveDate,
}

/// An order was placed by a customer, with the currency it is billed in. Recorded once, by
/// the first line of the order.
///
/// Version 2 of `order.placed`: version 1 ([`OrderPlaced`]) had no `currency`. An envelope of
/// version 1 is upcast to this type with `From<OrderPlaced>`, which derives the currency from
/// the country as [`Order::place`] does ([`currency_of`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, DomainEvent, JsonSchema)]
#[event(name = "order.placed", version = 2, upcast_from = OrderPlaced)]
pub struct OrderPlacedV2 {
    /// The order id (`US-2019-103800`), also the aggregate id.
    #[event(aggregate_id)]
    pub order_id: String,
    /// The customer the order belongs to (`DP-13000`): personal data, masked wherever the
    /// runtime prints an envelope.
    #[event(sensitive)]
    pub customer_id: String,
    /// Market segment of the customer (`Consumer`, `Corporate`, `Home Office`).
    pub segment: String,
    /// Sales region (`Central`, `East`, `South`, `West`).
    pub region: String,
    /// Country or region of the shipping address (`United States`, `Canada`).
    pub country: String,
    /// ISO 4217 code of the currency the order is billed in: `USD`, `CAD` ([`currency_of`]).
    pub currency: String,
    /// When the order was placed.
    pub order_date: NaiveDate,
}

impl From<OrderPlaced> for OrderPlacedV2 {
    fn from(v1: OrderPlaced) -> Self {
        OrderPlacedV2 {
            currency: currency_of(&v1.country).to_owned(),
            order_id: v1.order_id,
            customer_id: v1.customer_id,
            segment: v1.segment,
            region: v1.region,
            country: v1.country,
            order_date: v1.order_date,
        }
    }
}

/// The ISO 4217 currency of orders shipped to `country` (the data set's `Country/Region`):
/// `USD` for `United States`, `CAD` for `Canada`, and `XXX` ("no currency") for any other,
/// which the data set does not have.
pub fn currency_of(country: &str) -> &'static str {
    match country {
        "United States" => "USD",
        "Canada" => "CAD",
        _ => "XXX",
    }
}

/// A line was added to an order. Amounts are exact decimals, serialised as strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, DomainEvent, JsonSchema)]
#[event(name = "order.line_added", version = 1)]
pub struct LineAdded {
    /// The order id, also the aggregate id.
    #[event(aggregate_id)]
    pub order_id: String,
    /// The source row id, unique across the data set.
    pub row_id: u64,
    /// The product id (`OFF-PA-10000174`).
    pub product_id: String,
    /// The product name, verbatim (it may hold non-breaking spaces and curly quotes).
    pub product_name: String,
    /// Product category (`Furniture`, `Office Supplies`, `Technology`).
    pub category: String,
    /// Units ordered.
    pub quantity: u32,
    /// Sales amount of the line, after discount.
    pub sales: Decimal,
    /// Discount rate, 0 to 1.
    pub discount: Decimal,
    /// Profit of the line (negative for a loss).
    pub profit: Decimal,
}

/// An order was shipped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, DomainEvent, JsonSchema)]
#[event(name = "order.shipped", version = 1)]
pub struct OrderShipped {
    /// The order id, also the aggregate id.
    #[event(aggregate_id)]
    pub order_id: String,
    /// When the order was shipped.
    pub ship_date: NaiveDate,
    /// How it was shipped (`Standard Class`, `Second Class`, `First Class`, `Same Day`).
    pub ship_mode: String,
}

/// Every event of an order, for a handler that sees an order's whole stream in sequence
/// order (`orders.order_summary`): an event union, not an event of its own.
#[derive(Debug, EventUnion)]
pub enum OrderEvent {
    /// `order.placed` (version 2; version-1 envelopes are upcast to it).
    Placed(OrderPlacedV2),
    /// `order.line_added`.
    LineAdded(LineAdded),
    /// `order.shipped`.
    Shipped(OrderShipped),
}

/// A command the `Order` aggregate refused. The events of a refused command are never
/// recorded, so nothing is committed for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OrderError {
    /// A line names another customer than the one who placed the order.
    #[error("row {row_id}: order {order_id} belongs to customer {expected}, not {found}")]
    CustomerMismatch {
        /// The order.
        order_id: String,
        /// The refused row.
        row_id: u64,
        /// The customer who placed the order.
        expected: String,
        /// The customer the row names.
        found: String,
    },
    /// The order has already shipped: no more lines, no second shipment.
    #[error("order {order_id} has already shipped")]
    AlreadyShipped {
        /// The order.
        order_id: String,
    },
    /// The ship date is before the order date.
    #[error("order {order_id} cannot ship on {ship_date}: it was placed on {order_date}")]
    ShipsBeforePlaced {
        /// The order.
        order_id: String,
        /// When it was placed.
        order_date: NaiveDate,
        /// The refused ship date.
        ship_date: NaiveDate,
    },
}

/// Place a new order: the customer and where the order goes.
#[derive(Debug, Clone)]
pub struct PlaceOrder {
    /// The new order's id.
    pub order_id: String,
    /// Who places it.
    pub customer_id: String,
    /// The customer's segment.
    pub segment: String,
    /// Sales region.
    pub region: String,
    /// Country or region.
    pub country: String,
    /// Order date.
    pub order_date: NaiveDate,
}

/// Add a line to an order, on behalf of a customer.
#[derive(Debug, Clone)]
pub struct AddLine {
    /// The customer the line is for; must be the order's.
    pub customer_id: String,
    /// Source row id.
    pub row_id: u64,
    /// Product id.
    pub product_id: String,
    /// Product name.
    pub product_name: String,
    /// Product category.
    pub category: String,
    /// Units.
    pub quantity: u32,
    /// Sales amount.
    pub sales: Decimal,
    /// Discount rate.
    pub discount: Decimal,
    /// Profit.
    pub profit: Decimal,
}

/// What the application stores of an [`Order`] between commands, to load it again: the
/// aggregate's state and its version (the sequence of its last event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderState {
    /// The order id.
    pub id: String,
    /// The customer who placed it.
    pub customer_id: String,
    /// When it was placed.
    pub order_date: NaiveDate,
    /// Lines added so far.
    pub lines: u32,
    /// Whether it has shipped.
    pub shipped: bool,
    /// The sequence of its last event.
    pub version: u64,
}

/// The order aggregate: guards the one-customer-per-order and ship-once rules and records
/// what happened in its [`EventRecorder`]. The application takes the recorded events and
/// commits them through a unit of work, with the aggregate's [`state`](Order::state), and
/// [`load`](Order::load)s it again for the next command.
#[derive(Debug)]
pub struct Order {
    id: String,
    customer_id: String,
    order_date: NaiveDate,
    lines: u32,
    shipped: bool,
    events: EventRecorder,
}

impl Order {
    /// Places an order; records [`OrderPlacedV2`], in the currency of its country
    /// ([`currency_of`]).
    pub fn place(cmd: PlaceOrder) -> Order {
        let mut order = Order {
            id: cmd.order_id.clone(),
            customer_id: cmd.customer_id.clone(),
            order_date: cmd.order_date,
            lines: 0,
            shipped: false,
            events: EventRecorder::new(),
        };
        order.events.record(OrderPlacedV2 {
            currency: currency_of(&cmd.country).to_owned(),
            order_id: cmd.order_id,
            customer_id: cmd.customer_id,
            segment: cmd.segment,
            region: cmd.region,
            country: cmd.country,
            order_date: cmd.order_date,
        });
        order
    }

    /// An order as stored after its last command: the next event gets sequence
    /// `state.version + 1`.
    pub fn load(state: OrderState) -> Order {
        Order {
            id: state.id,
            customer_id: state.customer_id,
            order_date: state.order_date,
            lines: state.lines,
            shipped: state.shipped,
            events: EventRecorder::at_version(state.version),
        }
    }

    /// The state to store, the events recorded so far included (its version is the
    /// sequence of the last one).
    pub fn state(&self) -> OrderState {
        OrderState {
            id: self.id.clone(),
            customer_id: self.customer_id.clone(),
            order_date: self.order_date,
            lines: self.lines,
            shipped: self.shipped,
            version: self.events.version(),
        }
    }

    /// Adds a line; records [`LineAdded`].
    ///
    /// # Errors
    /// [`OrderError::CustomerMismatch`] when the line names another customer,
    /// [`OrderError::AlreadyShipped`] after [`Order::ship`].
    pub fn add_line(&mut self, cmd: AddLine) -> Result<(), OrderError> {
        if cmd.customer_id != self.customer_id {
            return Err(OrderError::CustomerMismatch {
                order_id: self.id.clone(),
                row_id: cmd.row_id,
                expected: self.customer_id.clone(),
                found: cmd.customer_id,
            });
        }
        if self.shipped {
            return Err(OrderError::AlreadyShipped {
                order_id: self.id.clone(),
            });
        }
        self.lines += 1;
        self.events.record(LineAdded {
            order_id: self.id.clone(),
            row_id: cmd.row_id,
            product_id: cmd.product_id,
            product_name: cmd.product_name,
            category: cmd.category,
            quantity: cmd.quantity,
            sales: cmd.sales,
            discount: cmd.discount,
            profit: cmd.profit,
        });
        Ok(())
    }

    /// Ships the order; records [`OrderShipped`].
    ///
    /// # Errors
    /// [`OrderError::AlreadyShipped`] the second time, [`OrderError::ShipsBeforePlaced`] when
    /// `ship_date` is before the order date.
    pub fn ship(&mut self, ship_date: NaiveDate, ship_mode: &str) -> Result<(), OrderError> {
        if self.shipped {
            return Err(OrderError::AlreadyShipped {
                order_id: self.id.clone(),
            });
        }
        if ship_date < self.order_date {
            return Err(OrderError::ShipsBeforePlaced {
                order_id: self.id.clone(),
                order_date: self.order_date,
                ship_date,
            });
        }
        self.shipped = true;
        self.events.record(OrderShipped {
            order_id: self.id.clone(),
            ship_date,
            ship_mode: ship_mode.to_owned(),
        });
        Ok(())
    }

    /// The order id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The customer who placed the order.
    pub fn customer_id(&self) -> &str {
        &self.customer_id
    }

    /// Lines added so far.
    pub fn lines(&self) -> u32 {
        self.lines
    }

    /// Whether the order has shipped.
    pub fn is_shipped(&self) -> bool {
        self.shipped
    }

    /// The aggregate's version: the sequence of its last recorded event.
    pub fn version(&self) -> u64 {
        self.events.version()
    }

    /// Takes the events recorded since the last call, to commit them.
    pub fn take_events(&mut self) -> Vec<Box<dyn AnyEnvelope>> {
        self.events.take()
    }

    /// Drops the events recorded since the last take (their commit failed).
    pub fn discard_events(&mut self) {
        self.events.discard();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn date(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
    }

    fn place() -> Order {
        Order::place(PlaceOrder {
            order_id: "US-1".into(),
            customer_id: "C-1".into(),
            segment: "Consumer".into(),
            region: "West".into(),
            country: "United States".into(),
            order_date: date("2019-01-03"),
        })
    }

    fn line(customer: &str, row_id: u64) -> AddLine {
        AddLine {
            customer_id: customer.into(),
            row_id,
            product_id: "P-1".into(),
            product_name: "Paper".into(),
            category: "Office Supplies".into(),
            quantity: 2,
            sales: Decimal::from_str("16.448").unwrap(),
            discount: Decimal::from_str("0.2").unwrap(),
            profit: Decimal::from_str("5.5512").unwrap(),
        }
    }

    #[test]
    fn records_placed_lines_and_shipped_with_sequences() {
        let mut order = place();
        order.add_line(line("C-1", 1)).unwrap();
        order.add_line(line("C-1", 2)).unwrap();
        order.ship(date("2019-01-07"), "Standard Class").unwrap();
        let events = order.take_events();
        let names: Vec<_> = events.iter().map(|e| e.name()).collect();
        assert_eq!(
            names,
            [
                "order.placed",
                "order.line_added",
                "order.line_added",
                "order.shipped"
            ]
        );
        let seqs: Vec<_> = events.iter().map(|e| e.metadata().sequence).collect();
        assert_eq!(seqs, [1, 2, 3, 4]);
        assert!(events.iter().all(|e| e.metadata().aggregate_id == "US-1"));
    }

    #[test]
    fn places_in_the_currency_of_the_country_and_upcasts_version_1_the_same_way() {
        let mut canada = Order::place(PlaceOrder {
            order_id: "CA-2019-115238".into(),
            customer_id: "C-2".into(),
            segment: "Corporate".into(),
            region: "East".into(),
            country: "Canada".into(),
            order_date: date("2019-01-23"),
        });
        let mut us = place();
        for (order, currency) in [(&mut canada, "CAD"), (&mut us, "USD")] {
            let events = order.take_events();
            let placed = events[0]
                .as_any()
                .downcast_ref::<event_core::Envelope<OrderPlacedV2>>()
                .expect("the aggregate records version 2");
            assert_eq!(placed.version(), 2);
            assert_eq!(placed.event().currency, currency);
            let v1 = OrderPlaced {
                order_id: placed.event().order_id.clone(),
                customer_id: placed.event().customer_id.clone(),
                segment: placed.event().segment.clone(),
                region: placed.event().region.clone(),
                country: placed.event().country.clone(),
                order_date: placed.event().order_date,
            };
            assert_eq!(OrderPlacedV2::from(v1), *placed.event());
        }
        assert_eq!(currency_of("Mexico"), "XXX");
    }

    #[test]
    fn refuses_a_line_of_another_customer_and_records_nothing() {
        let mut order = place();
        order.take_events();
        let err = order.add_line(line("C-2", 7)).unwrap_err();
        assert_eq!(
            err,
            OrderError::CustomerMismatch {
                order_id: "US-1".into(),
                row_id: 7,
                expected: "C-1".into(),
                found: "C-2".into()
            }
        );
        assert!(order.take_events().is_empty());
        assert_eq!(order.lines(), 0);
    }

    #[test]
    fn a_loaded_order_goes_on_from_its_version() {
        let mut order = place();
        order.add_line(line("C-1", 1)).unwrap();
        order.take_events();
        let state = order.state();
        assert_eq!((state.version, state.lines, state.shipped), (2, 1, false));

        let mut loaded = Order::load(state.clone());
        assert_eq!(loaded.state(), state);
        loaded.add_line(line("C-1", 2)).unwrap();
        assert!(loaded.add_line(line("C-2", 3)).is_err());
        loaded.ship(date("2019-01-05"), "First Class").unwrap();
        let seqs: Vec<_> = loaded
            .take_events()
            .iter()
            .map(|e| e.metadata().sequence)
            .collect();
        assert_eq!(seqs, [3, 4]);
        assert!(Order::load(loaded.state())
            .ship(date("2019-01-06"), "Same Day")
            .is_err());
    }

    #[test]
    fn ships_once_and_not_before_it_was_placed() {
        let mut order = place();
        assert!(matches!(
            order.ship(date("2019-01-01"), "Same Day"),
            Err(OrderError::ShipsBeforePlaced { .. })
        ));
        order.ship(date("2019-01-03"), "Same Day").unwrap();
        assert!(matches!(
            order.ship(date("2019-01-04"), "Same Day"),
            Err(OrderError::AlreadyShipped { .. })
        ));
        assert!(matches!(
            order.add_line(line("C-1", 3)),
            Err(OrderError::AlreadyShipped { .. })
        ));
    }
}

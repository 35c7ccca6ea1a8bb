//! The order handlers and the resources they write: read models (projections) and a
//! confirmation sender. Handlers know events and resources only, never the aggregate or CSV.
//!
//! | handler | event | mode | resources |
//! |---|---|---|---|
//! | `orders.directory` | `order.placed` | in transaction | [`OrderDirectory`] |
//! | `orders.revenue_by_region` | `order.line_added` | in transaction | [`OrderDirectory`], [`RegionRevenue`] |
//! | `orders.customer_orders` | `order.placed` | after commit | [`CustomerStats`] |
//! | `orders.customer_sales` | `order.line_added` | after commit | [`OrderDirectory`], [`CustomerStats`] |
//! | `orders.shipping_lead_time` | `order.shipped` | after commit | [`OrderDirectory`], [`ShippingStats`] |
//! | `orders.send_confirmation` | `order.shipped` | after commit, `async` | [`ConfirmationSender`] |
//!
//! Handler names are pinned with `name = "…"`: they are the first half of the idempotency
//! key, and moving a function to another module must not reset deduplication.
//!
//! Resources are shared between handler runs, so they use interior mutability (a `Mutex`
//! each; no lock is held across an `.await`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

use chrono::NaiveDate;
use event_core::{event_handler, Envelope, HandlerError};
use rust_decimal::Decimal;
use uuid::Uuid;

use super::domain::{LineAdded, OrderPlaced, OrderShipped};

/// How many handlers this module registers (checked at start-up with `expect_handlers`).
pub const HANDLER_COUNT: usize = 6;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A handler that panicked while holding the lock is reported by the dispatcher; the data
    // it guarded is still the best there is, so keep going with it.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the other read models need to know about a placed order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderInfo {
    /// The customer.
    pub customer_id: String,
    /// The customer's segment.
    pub segment: String,
    /// The sales region.
    pub region: String,
    /// When it was placed.
    pub order_date: NaiveDate,
}

/// Every placed order, by id: written in the transaction of `order.placed`, so it is there
/// for the handlers of the order's later events.
#[derive(Debug, Default)]
pub struct OrderDirectory {
    orders: Mutex<HashMap<String, OrderInfo>>,
}

impl OrderDirectory {
    /// The order `id`, if placed.
    pub fn get(&self, id: &str) -> Option<OrderInfo> {
        lock(&self.orders).get(id).cloned()
    }

    /// How many orders are known.
    pub fn len(&self) -> usize {
        lock(&self.orders).len()
    }

    /// `true` when no order is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lookup(&self, id: &str) -> Result<OrderInfo, HandlerError> {
        // Permanent: redelivering the same event cannot make an unknown order known.
        self.get(id).ok_or_else(|| {
            HandlerError::permanent_msg(format_args!("order {id} is not in the directory"))
        })
    }
}

/// Revenue of one region.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Revenue {
    /// Lines counted.
    pub lines: u64,
    /// Units sold.
    pub quantity: u64,
    /// Sales, exact.
    pub sales: Decimal,
    /// Profit, exact.
    pub profit: Decimal,
}

/// Revenue by region, exact decimals.
#[derive(Debug, Default)]
pub struct RegionRevenue {
    regions: Mutex<BTreeMap<String, Revenue>>,
}

impl RegionRevenue {
    /// Revenue per region, by region name.
    pub fn snapshot(&self) -> BTreeMap<String, Revenue> {
        lock(&self.regions).clone()
    }
}

/// One customer's orders and sales.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Customer {
    /// The customer's segment (from the first order seen).
    pub segment: String,
    /// Orders placed.
    pub orders: u64,
    /// Lines bought.
    pub lines: u64,
    /// Sales, exact.
    pub sales: Decimal,
}

/// Orders and customers of one segment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Segment {
    /// Orders placed.
    pub orders: u64,
    /// Distinct customers.
    pub customers: u64,
    /// Sales, exact.
    pub sales: Decimal,
}

#[derive(Debug, Default)]
struct CustomerState {
    customers: HashMap<String, Customer>,
    segments: BTreeMap<String, Segment>,
}

/// Orders and sales per customer, and counts per segment.
#[derive(Debug, Default)]
pub struct CustomerStats {
    state: Mutex<CustomerState>,
}

impl CustomerStats {
    /// Every customer, by id.
    pub fn customers(&self) -> HashMap<String, Customer> {
        lock(&self.state).customers.clone()
    }

    /// Every segment, by name.
    pub fn segments(&self) -> BTreeMap<String, Segment> {
        lock(&self.state).segments.clone()
    }
}

/// Lead times of one ship mode, in whole days.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeadTimes {
    /// Orders shipped.
    pub orders: u64,
    /// Sum of lead times, for the mean.
    pub total_days: i64,
    /// Shortest.
    pub min_days: i64,
    /// Longest.
    pub max_days: i64,
    /// Orders by lead time in days.
    pub by_days: BTreeMap<i64, u64>,
}

impl LeadTimes {
    fn add(&mut self, days: i64) {
        if self.orders == 0 {
            self.min_days = days;
            self.max_days = days;
        } else {
            self.min_days = self.min_days.min(days);
            self.max_days = self.max_days.max(days);
        }
        self.orders += 1;
        self.total_days += days;
        *self.by_days.entry(days).or_default() += 1;
    }

    /// Merges `other` into `self`.
    pub fn merge(&mut self, other: &LeadTimes) {
        if other.orders == 0 {
            return;
        }
        if self.orders == 0 {
            self.min_days = other.min_days;
            self.max_days = other.max_days;
        } else {
            self.min_days = self.min_days.min(other.min_days);
            self.max_days = self.max_days.max(other.max_days);
        }
        self.orders += other.orders;
        self.total_days += other.total_days;
        for (d, n) in &other.by_days {
            *self.by_days.entry(*d).or_default() += n;
        }
    }

    /// Mean lead time in days, rounded to two decimals (0 when there are no orders).
    pub fn mean_days(&self) -> Decimal {
        if self.orders == 0 {
            return Decimal::ZERO;
        }
        (Decimal::from(self.total_days) / Decimal::from(self.orders)).round_dp(2)
    }
}

/// Shipping lead time (ship date − order date) by ship mode.
#[derive(Debug, Default)]
pub struct ShippingStats {
    modes: Mutex<BTreeMap<String, LeadTimes>>,
}

impl ShippingStats {
    /// Lead times per ship mode.
    pub fn by_mode(&self) -> BTreeMap<String, LeadTimes> {
        lock(&self.modes).clone()
    }
}

/// A shipping confirmation, as handed to the mail service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirmation {
    /// Idempotency key for the mail service: the `order.shipped` event id, so that a
    /// redelivered event that got past every other guard is still sent once.
    pub idempotency_key: Uuid,
    /// The order.
    pub order_id: String,
    /// The message.
    pub body: String,
}

#[derive(Debug, Default)]
struct Mailbox {
    sent: u64,
    keys: HashSet<Uuid>,
    repeated_keys: u64,
    first: Option<Confirmation>,
}

/// Stand-in for an e-mail sender: counts what it was asked to send and notices a key it has
/// seen before (which a real provider would drop, and which the dispatcher's guard should
/// never let through).
#[derive(Debug, Default)]
pub struct ConfirmationSender {
    mailbox: Mutex<Mailbox>,
}

impl ConfirmationSender {
    /// Sends `confirmation` (in this stand-in: records it).
    pub async fn send(&self, confirmation: Confirmation) -> Result<(), HandlerError> {
        let mut mailbox = lock(&self.mailbox);
        mailbox.sent += 1;
        if !mailbox.keys.insert(confirmation.idempotency_key) {
            mailbox.repeated_keys += 1;
        }
        mailbox.first.get_or_insert(confirmation);
        Ok(())
    }

    /// Confirmations sent.
    pub fn sent(&self) -> u64 {
        lock(&self.mailbox).sent
    }

    /// Confirmations whose idempotency key had been sent before.
    pub fn repeated_keys(&self) -> u64 {
        lock(&self.mailbox).repeated_keys
    }

    /// The first confirmation sent, as a sample.
    pub fn first(&self) -> Option<Confirmation> {
        lock(&self.mailbox).first.clone()
    }
}

/// Remembers each placed order for the handlers of its later events.
#[event_handler(name = "orders.directory", priority = 0, in_transaction)]
fn order_directory(event: &OrderPlaced, directory: &OrderDirectory) {
    lock(&directory.orders).insert(
        event.order_id.clone(),
        OrderInfo {
            customer_id: event.customer_id.clone(),
            segment: event.segment.clone(),
            region: event.region.clone(),
            order_date: event.order_date,
        },
    );
}

/// Adds each line's sales and profit to its order's region. In the transaction: revenue is
/// what the books say, so a line that cannot be booked aborts its commit.
#[event_handler(name = "orders.revenue_by_region", priority = 1, in_transaction)]
fn revenue_by_region(
    event: &LineAdded,
    directory: &OrderDirectory,
    revenue: &RegionRevenue,
) -> Result<(), HandlerError> {
    let order = directory.lookup(&event.order_id)?;
    let mut regions = lock(&revenue.regions);
    let region = regions.entry(order.region).or_default();
    region.lines += 1;
    region.quantity += u64::from(event.quantity);
    region.sales += event.sales;
    region.profit += event.profit;
    Ok(())
}

/// Counts orders per customer and per segment.
#[event_handler(name = "orders.customer_orders", priority = 10)]
fn customer_orders(event: &OrderPlaced, stats: &CustomerStats) {
    let mut state = lock(&stats.state);
    let state = &mut *state;
    let new_customer = !state.customers.contains_key(&event.customer_id);
    let customer = state
        .customers
        .entry(event.customer_id.clone())
        .or_insert_with(|| Customer {
            segment: event.segment.clone(),
            ..Customer::default()
        });
    customer.orders += 1;
    let segment = state.segments.entry(event.segment.clone()).or_default();
    segment.orders += 1;
    if new_customer {
        segment.customers += 1;
    }
}

/// Adds each line's sales to its customer and segment.
#[event_handler(name = "orders.customer_sales", priority = 10)]
fn customer_sales(
    event: &LineAdded,
    directory: &OrderDirectory,
    stats: &CustomerStats,
) -> Result<(), HandlerError> {
    let order = directory.lookup(&event.order_id)?;
    let mut state = lock(&stats.state);
    let customer = state.customers.entry(order.customer_id).or_default();
    customer.lines += 1;
    customer.sales += event.sales;
    state.segments.entry(order.segment).or_default().sales += event.sales;
    Ok(())
}

/// Lead time of each shipped order, by ship mode.
#[event_handler(name = "orders.shipping_lead_time", priority = 20)]
fn shipping_lead_time(
    event: &OrderShipped,
    directory: &OrderDirectory,
    stats: &ShippingStats,
) -> Result<(), HandlerError> {
    let order = directory.lookup(&event.order_id)?;
    let days = (event.ship_date - order.order_date).num_days();
    lock(&stats.modes)
        .entry(event.ship_mode.clone())
        .or_default()
        .add(days);
    Ok(())
}

/// Sends one shipping confirmation per shipped order; the event id is the idempotency key
/// handed to the mail service (an external effect cannot share the guard's transaction).
#[event_handler(name = "orders.send_confirmation", priority = 30)]
async fn send_confirmation(
    envelope: &Envelope<OrderShipped>,
    sender: &ConfirmationSender,
) -> Result<(), HandlerError> {
    let shipped = envelope.event();
    let confirmation = Confirmation {
        idempotency_key: envelope.id(),
        order_id: shipped.order_id.clone(),
        body: format!(
            "Your order {} was shipped on {} by {}. [Idempotency-Key: {}]",
            shipped.order_id,
            shipped.ship_date,
            shipped.ship_mode,
            envelope.id()
        ),
    };
    sender.send(confirmation).await
}

//! Reads back what the handlers wrote (the projection tables) and what the runtime recorded
//! (outbox, deliveries, dead letters), for the report. Everything here comes from the
//! database, so a run that follows a crash reports the same totals as one that did not.

use std::collections::{BTreeMap, HashMap};

use event_runtime::{DeadLetter, DeadLetterFilter, Store, StoreError};
use rust_decimal::Decimal;

use super::sql::from_units;

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

/// Orders, lines and sales in one currency.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CurrencySales {
    /// Orders placed in it.
    pub orders: u64,
    /// Lines of those orders.
    pub lines: u64,
    /// Sales, exact.
    pub sales: Decimal,
}

/// One customer's orders and sales.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Customer {
    /// The customer's segment (the data set gives each customer one).
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
    /// Distinct customers with an order.
    pub customers: u64,
    /// Sales, exact.
    pub sales: Decimal,
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
    fn add(&mut self, days: i64, orders: u64) {
        if orders == 0 {
            return;
        }
        if self.orders == 0 {
            self.min_days = days;
            self.max_days = days;
        } else {
            self.min_days = self.min_days.min(days);
            self.max_days = self.max_days.max(days);
        }
        self.orders += orders;
        self.total_days += days * orders as i64;
        *self.by_days.entry(days).or_default() += orders;
    }

    /// Merges `other` into `self`.
    pub fn merge(&mut self, other: &LeadTimes) {
        for (&days, &orders) in &other.by_days {
            self.add(days, orders);
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

/// A row the `Order` aggregate refused, as recorded in `orders_imported_rows`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The row id.
    pub row_id: u64,
    /// Its line in the input file.
    pub line: u64,
    /// The domain error.
    pub reason: String,
}

/// The deliveries of one after-commit handler, by status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deliveries {
    /// Completed (the handler's effect committed with this record).
    pub completed: u64,
    /// In the dead letter queue.
    pub dead: u64,
    /// Not finished (due, leased, waiting for a retry or behind a dead letter).
    pub pending: u64,
    /// Given up on by `dlq purge`.
    pub purged: u64,
    /// Attempts beyond the first, over all of them.
    pub retries: u64,
}

/// Everything the report reads from the database.
#[derive(Debug, Clone, Default)]
pub struct ReadModel {
    /// Revenue per region.
    pub regions: BTreeMap<String, Revenue>,
    /// Orders, lines and sales by currency (`unknown` for orders whose `order.placed` has
    /// not been delivered to `orders.order_summary`).
    pub currencies: BTreeMap<String, CurrencySales>,
    /// Every customer, by id.
    pub customers: HashMap<String, Customer>,
    /// Per segment, from the customers.
    pub segments: BTreeMap<String, Segment>,
    /// Lead times per ship mode.
    pub lead_times: BTreeMap<String, LeadTimes>,
    /// Confirmations in the mail queue.
    pub notifications: u64,
    /// Distinct orders they confirm.
    pub notified_orders: u64,
    /// The confirmation of the order shipped first.
    pub first_confirmation: Option<String>,
    /// Lines the ERP took.
    pub erp_exported: u64,
    /// Rows recorded as imported, accepted or rejected.
    pub imported_rows: u64,
    /// Rejected rows, in file order.
    pub rejections: Vec<Rejection>,
    /// Events in the outbox, by name.
    pub events_by_name: BTreeMap<String, u64>,
    /// Deliveries per after-commit handler.
    pub deliveries: BTreeMap<String, Deliveries>,
    /// Open dead letters, oldest first.
    pub dead_letters: Vec<DeadLetter>,
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// Reads the projections and the runtime's tables.
///
/// # Errors
/// The database failed.
pub async fn read(store: &Store) -> Result<ReadModel, StoreError> {
    let mut m = ReadModel::default();
    let regions = store
        .query("SELECT region, lines, quantity, sales, profit FROM orders_revenue_by_region")
        .fetch_all()
        .await?;
    for r in regions {
        m.regions.insert(
            r.get("region")?,
            Revenue {
                lines: count(r.get("lines")?),
                quantity: count(r.get("quantity")?),
                sales: from_units(r.get("sales")?),
                profit: from_units(r.get("profit")?),
            },
        );
    }

    let currencies = store
        .query(
            "SELECT COALESCE(currency, 'unknown') AS currency, COUNT(*) AS orders,
                CAST(SUM(lines) AS BIGINT) AS lines, CAST(SUM(sales) AS BIGINT) AS sales
            FROM orders_order_sales GROUP BY COALESCE(currency, 'unknown')",
        )
        .fetch_all()
        .await?;
    for r in currencies {
        m.currencies.insert(
            r.get("currency")?,
            CurrencySales {
                orders: count(r.get("orders")?),
                lines: count(r.get("lines")?),
                sales: from_units(r.get("sales")?),
            },
        );
    }

    let customers = store
        .query("SELECT customer_id, segment, orders, lines, sales FROM orders_customers")
        .fetch_all()
        .await?;
    for r in customers {
        let customer = Customer {
            segment: r.get("segment")?,
            orders: count(r.get("orders")?),
            lines: count(r.get("lines")?),
            sales: from_units(r.get("sales")?),
        };
        let s = m.segments.entry(customer.segment.clone()).or_default();
        s.orders += customer.orders;
        s.sales += customer.sales;
        if customer.orders > 0 {
            s.customers += 1;
        }
        m.customers.insert(r.get("customer_id")?, customer);
    }

    let lead_times = store
        .query("SELECT ship_mode, days, orders FROM orders_lead_times")
        .fetch_all()
        .await?;
    for r in lead_times {
        m.lead_times
            .entry(r.get("ship_mode")?)
            .or_default()
            .add(r.get("days")?, count(r.get("orders")?));
    }

    let sent = store
        .query(
            "SELECT COUNT(*) AS sent, COUNT(DISTINCT order_id) AS orders
            FROM orders_notifications",
        )
        .fetch_one()
        .await?;
    m.notifications = count(sent.get("sent")?);
    m.notified_orders = count(sent.get("orders")?);
    // Event ids are UUIDv7, created in shipping order by one process.
    m.first_confirmation = store
        .query("SELECT body FROM orders_notifications ORDER BY event_id LIMIT 1")
        .fetch_optional()
        .await?
        .map(|r| r.get("body"))
        .transpose()?;
    let exported = store
        .query("SELECT COUNT(*) AS n FROM orders_erp_export")
        .fetch_one()
        .await?;
    m.erp_exported = count(exported.get("n")?);

    let imported = store
        .query("SELECT COUNT(*) AS n FROM orders_imported_rows")
        .fetch_one()
        .await?;
    m.imported_rows = count(imported.get("n")?);
    let rejected = store
        .query(
            "SELECT row_id, line, reason FROM orders_imported_rows WHERE status = 'rejected'
            ORDER BY line, row_id",
        )
        .fetch_all()
        .await?;
    m.rejections = rejected
        .iter()
        .map(|r| {
            Ok(Rejection {
                row_id: count(r.get("row_id")?),
                line: count(r.get("line")?),
                reason: r.get::<Option<String>>("reason")?.unwrap_or_default(),
            })
        })
        .collect::<Result<_, StoreError>>()?;

    let events = store
        .query("SELECT name, COUNT(*) AS n FROM event_outbox GROUP BY name")
        .fetch_all()
        .await?;
    for r in events {
        m.events_by_name.insert(r.get("name")?, count(r.get("n")?));
    }

    let deliveries = store
        .query(
            "SELECT handler, status, COUNT(*) AS n,
                CAST(COALESCE(SUM(CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END), 0)
                    AS BIGINT) AS retries
            FROM event_deliveries GROUP BY handler, status",
        )
        .fetch_all()
        .await?;
    for r in deliveries {
        let d = m.deliveries.entry(r.get("handler")?).or_default();
        let n = count(r.get("n")?);
        match r.get::<String>("status")?.as_str() {
            "completed" => d.completed += n,
            "dead" => d.dead += n,
            "purged" => d.purged += n,
            _ => d.pending += n,
        }
        d.retries += count(r.get("retries")?);
    }
    m.dead_letters = store.dead_letters(&DeadLetterFilter::default()).await?;
    Ok(m)
}

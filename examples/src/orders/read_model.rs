//! Reads back what the handlers wrote (the projection tables) and what the runtime recorded
//! (outbox, deliveries, dead letters), for the report. Everything here comes from the
//! database, so a run that follows a crash reports the same totals as one that did not.

use std::collections::{BTreeMap, HashMap};

use event_runtime::sqlx;
use event_runtime::{DeadLetter, DeadLetterFilter, Store, StoreError};
use rust_decimal::Decimal;

use super::sql::{from_units, on_pool};

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
    on_pool!(store, |p| {
        let regions: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(
            "SELECT region, lines, quantity, sales, profit FROM orders_revenue_by_region",
        )
        .fetch_all(p)
        .await?;
        for (region, lines, quantity, sales, profit) in regions {
            m.regions.insert(
                region,
                Revenue {
                    lines: count(lines),
                    quantity: count(quantity),
                    sales: from_units(sales),
                    profit: from_units(profit),
                },
            );
        }

        let currencies: Vec<(String, i64, i64, i64)> = sqlx::query_as(
            "SELECT COALESCE(currency, 'unknown'), COUNT(*), CAST(SUM(lines) AS BIGINT),
                CAST(SUM(sales) AS BIGINT)
            FROM orders_order_sales GROUP BY COALESCE(currency, 'unknown')",
        )
        .fetch_all(p)
        .await?;
        for (currency, orders, lines, sales) in currencies {
            m.currencies.insert(
                currency,
                CurrencySales {
                    orders: count(orders),
                    lines: count(lines),
                    sales: from_units(sales),
                },
            );
        }

        let customers: Vec<(String, String, i64, i64, i64)> = sqlx::query_as(
            "SELECT customer_id, segment, orders, lines, sales FROM orders_customers",
        )
        .fetch_all(p)
        .await?;
        for (id, segment, orders, lines, sales) in customers {
            let customer = Customer {
                segment,
                orders: count(orders),
                lines: count(lines),
                sales: from_units(sales),
            };
            let s = m.segments.entry(customer.segment.clone()).or_default();
            s.orders += customer.orders;
            s.sales += customer.sales;
            if customer.orders > 0 {
                s.customers += 1;
            }
            m.customers.insert(id, customer);
        }

        let lead_times: Vec<(String, i64, i64)> =
            sqlx::query_as("SELECT ship_mode, days, orders FROM orders_lead_times")
                .fetch_all(p)
                .await?;
        for (mode, days, orders) in lead_times {
            m.lead_times
                .entry(mode)
                .or_default()
                .add(days, count(orders));
        }

        let (sent, orders): (i64, i64) =
            sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT order_id) FROM orders_notifications")
                .fetch_one(p)
                .await?;
        m.notifications = count(sent);
        m.notified_orders = count(orders);
        // Event ids are UUIDv7, created in shipping order by one process.
        m.first_confirmation =
            sqlx::query_scalar("SELECT body FROM orders_notifications ORDER BY event_id LIMIT 1")
                .fetch_optional(p)
                .await?;
        let exported: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders_erp_export")
            .fetch_one(p)
            .await?;
        m.erp_exported = count(exported);

        let imported: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders_imported_rows")
            .fetch_one(p)
            .await?;
        m.imported_rows = count(imported);
        let rejected: Vec<(i64, i64, Option<String>)> = sqlx::query_as(
            "SELECT row_id, line, reason FROM orders_imported_rows WHERE status = 'rejected'
            ORDER BY line, row_id",
        )
        .fetch_all(p)
        .await?;
        m.rejections = rejected
            .into_iter()
            .map(|(row_id, line, reason)| Rejection {
                row_id: count(row_id),
                line: count(line),
                reason: reason.unwrap_or_default(),
            })
            .collect();

        let events: Vec<(String, i64)> =
            sqlx::query_as("SELECT name, COUNT(*) FROM event_outbox GROUP BY name")
                .fetch_all(p)
                .await?;
        m.events_by_name = events.into_iter().map(|(n, c)| (n, count(c))).collect();

        let deliveries: Vec<(String, String, i64, i64)> = sqlx::query_as(
            "SELECT handler, status, COUNT(*),
                CAST(COALESCE(SUM(CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END), 0) AS BIGINT)
            FROM event_deliveries GROUP BY handler, status",
        )
        .fetch_all(p)
        .await?;
        for (handler, status, n, retries) in deliveries {
            let d = m.deliveries.entry(handler).or_default();
            let n = count(n);
            match status.as_str() {
                "completed" => d.completed += n,
                "dead" => d.dead += n,
                "purged" => d.purged += n,
                _ => d.pending += n,
            }
            d.retries += count(retries);
        }
    });
    m.dead_letters = store.dead_letters(&DeadLetterFilter::default()).await?;
    Ok(m)
}

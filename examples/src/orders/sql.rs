//! The example's own tables, created at start next to the outbox tables of `event-runtime`,
//! in SQL that SQLite and PostgreSQL both accept (`$N` placeholders, `BIGINT`, `TEXT`,
//! `INSERT … ON CONFLICT`).
//!
//! | table | written by | one row per |
//! |---|---|---|
//! | `orders_aggregate` | the import (unit of work) | order: customer, order date, `version` (sequence of its last event), lines, first row's line, ship date and mode, `shipped` (0/1) |
//! | `orders_imported_rows` | the import (unit of work) | CSV row: `row_id`, order, line, `status` (`accepted` / `rejected`), `reason` |
//! | `orders_directory` | `orders.directory` (in transaction) | placed order: customer, segment, region, order day |
//! | `orders_revenue_by_region` | `orders.revenue_by_region` (in transaction) | region: lines, units, sales, profit |
//! | `orders_customers` | `orders.order_summary` | customer: segment, orders, lines, sales |
//! | `orders_order_sales` | `orders.order_summary` | placed order: currency (`NULL` while the summary has not seen the order placed), lines, sales |
//! | `orders_lead_times` | `orders.shipping_lead_time` | (ship mode, lead time in days): orders |
//! | `orders_notifications` | `orders.send_confirmation` | confirmation, keyed by the `order.shipped` event id |
//! | `orders_erp_export` | `orders.erp_export` | exported line, keyed by the `order.line_added` event id |
//!
//! Money is stored exactly as `BIGINT` ten-thousandths ([`to_units`], [`from_units`]): SQLite
//! has no decimal type, and the data set has at most four decimals. Dates the handlers
//! subtract are stored as days since 1970-01-01 ([`day_number`]).

use chrono::NaiveDate;
use event_runtime::{Store, StoreError};
use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;

/// The example's tables, in creation order.
const TABLES: [&str; 9] = [
    "CREATE TABLE IF NOT EXISTS orders_aggregate (
        order_id     TEXT   NOT NULL PRIMARY KEY,
        customer_id  TEXT   NOT NULL,
        order_date   TEXT   NOT NULL,
        version      BIGINT NOT NULL,
        lines        BIGINT NOT NULL,
        first_line   BIGINT NOT NULL,
        ship_date    TEXT   NOT NULL,
        ship_mode    TEXT   NOT NULL,
        shipped      BIGINT NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS orders_imported_rows (
        row_id    BIGINT NOT NULL PRIMARY KEY,
        order_id  TEXT   NOT NULL,
        line      BIGINT NOT NULL,
        status    TEXT   NOT NULL,
        reason    TEXT
    )",
    "CREATE TABLE IF NOT EXISTS orders_directory (
        order_id     TEXT   NOT NULL PRIMARY KEY,
        customer_id  TEXT   NOT NULL,
        segment      TEXT   NOT NULL,
        region       TEXT   NOT NULL,
        order_day    BIGINT NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS orders_revenue_by_region (
        region    TEXT   NOT NULL PRIMARY KEY,
        lines     BIGINT NOT NULL,
        quantity  BIGINT NOT NULL,
        sales     BIGINT NOT NULL,
        profit    BIGINT NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS orders_customers (
        customer_id  TEXT   NOT NULL PRIMARY KEY,
        segment      TEXT   NOT NULL,
        orders       BIGINT NOT NULL,
        lines        BIGINT NOT NULL,
        sales        BIGINT NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS orders_order_sales (
        order_id  TEXT   NOT NULL PRIMARY KEY,
        currency  TEXT,
        lines     BIGINT NOT NULL,
        sales     BIGINT NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS orders_lead_times (
        ship_mode  TEXT   NOT NULL,
        days       BIGINT NOT NULL,
        orders     BIGINT NOT NULL,
        PRIMARY KEY (ship_mode, days)
    )",
    "CREATE TABLE IF NOT EXISTS orders_notifications (
        event_id  TEXT NOT NULL PRIMARY KEY,
        order_id  TEXT NOT NULL,
        body      TEXT NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS orders_erp_export (
        event_id  TEXT   NOT NULL PRIMARY KEY,
        row_id    BIGINT NOT NULL,
        order_id  TEXT   NOT NULL,
        record    TEXT   NOT NULL
    )",
];

/// Creates the example's tables where missing, in one transaction.
///
/// # Errors
/// The database refused a statement.
pub async fn create_tables(store: &Store) -> Result<(), StoreError> {
    let mut tx = store.begin().await?;
    for ddl in TABLES {
        tx.query(ddl).execute().await?;
    }
    tx.commit().await
}

/// Ten-thousandths per unit: the scale of stored money.
const UNITS: i64 = 10_000;

/// `amount` as a whole number of ten-thousandths, or `None` when it has more than four
/// decimals or does not fit.
pub fn to_units(amount: Decimal) -> Option<i64> {
    let scaled = amount.checked_mul(Decimal::from(UNITS))?;
    if !scaled.fract().is_zero() {
        return None;
    }
    scaled.to_i64()
}

/// Ten-thousandths back to an exact decimal (four decimal places).
pub fn from_units(units: i64) -> Decimal {
    Decimal::new(units, 4)
}

/// Days since 1970-01-01.
pub fn day_number(date: NaiveDate) -> i64 {
    (date - NaiveDate::default()).num_days()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    #[test]
    fn money_round_trips_through_ten_thousandths() {
        for s in ["16.448", "-383.031", "0", "2325733.8263", "0.0001"] {
            let d = Decimal::from_str(s).unwrap();
            assert_eq!(from_units(to_units(d).unwrap()), d, "{s}");
        }
        assert_eq!(to_units(Decimal::from_str("1.00001").unwrap()), None);
        assert_eq!(from_units(164_480).to_string(), "16.4480");
    }

    #[test]
    fn day_numbers_subtract_to_lead_times() {
        let d = |s| NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap();
        assert_eq!(day_number(d("1970-01-02")), 1);
        assert_eq!(day_number(d("2019-01-07")) - day_number(d("2019-01-03")), 4);
    }
}

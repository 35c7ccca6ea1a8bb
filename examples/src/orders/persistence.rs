//! Where the import keeps the `Order` aggregate and the rows it has seen, in the unit of
//! work's transaction: `orders_aggregate` and `orders_imported_rows` (see [`super::sql`]).

use std::collections::HashSet;

use chrono::NaiveDate;
use event_runtime::{Row, Store, StoreError, Tx};

use super::domain::OrderState;

/// The stored form of a date.
const DATE: &str = "%Y-%m-%d";

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

fn date(s: &str, column: &str) -> Result<NaiveDate, StoreError> {
    NaiveDate::parse_from_str(s, DATE)
        .map_err(|e| corrupt(format_args!("{column} {s:?} is not a date: {e}")))
}

/// Row ids already imported, to skip them without opening a transaction.
///
/// # Errors
/// The database failed.
pub async fn imported_row_ids(store: &Store) -> Result<HashSet<u64>, StoreError> {
    let rows = store
        .query("SELECT row_id FROM orders_imported_rows")
        .fetch_all()
        .await?;
    rows.iter()
        .map(|r| Ok(r.get::<i64>("row_id")? as u64))
        .collect()
}

/// Records row `row_id` as imported (accepted), unless it already is: then returns `false`
/// and the caller rolls back. This is the row's idempotency check, inside its unit of work:
/// a concurrent import of the same row waits for this one and then sees it.
///
/// # Errors
/// The database failed.
pub async fn claim_row(
    tx: &mut Tx,
    row_id: u64,
    order_id: &str,
    line: u64,
) -> Result<bool, StoreError> {
    let n = tx
        .query(
            "INSERT INTO orders_imported_rows (row_id, order_id, line, status, reason)
            VALUES ($1, $2, $3, 'accepted', NULL) ON CONFLICT (row_id) DO NOTHING",
        )
        .bind(i64_of(row_id))
        .bind(order_id)
        .bind(i64_of(line))
        .execute()
        .await?;
    Ok(n == 1)
}

/// Marks a claimed row rejected by the aggregate, with the reason.
///
/// # Errors
/// The database failed.
pub async fn reject_row(tx: &mut Tx, row_id: u64, reason: &str) -> Result<(), StoreError> {
    tx.query("UPDATE orders_imported_rows SET status = 'rejected', reason = $1 WHERE row_id = $2")
        .bind(reason)
        .bind(i64_of(row_id))
        .execute()
        .await?;
    Ok(())
}

/// An order as stored, with where its shipment comes from.
#[derive(Debug, Clone)]
pub struct StoredOrder {
    /// The aggregate's state and version.
    pub state: OrderState,
    /// The line of its first row.
    pub first_line: u64,
    /// Ship date of its first row.
    pub ship_date: NaiveDate,
    /// Ship mode of its first row.
    pub ship_mode: String,
}

/// `SELECT` of a stored order, then `$tail`.
macro_rules! select_order {
    ($tail:literal) => {
        concat!(
            "SELECT order_id, customer_id, order_date, version, lines, first_line, ship_date, ",
            "ship_mode, shipped FROM orders_aggregate ",
            $tail
        )
    };
}

fn stored(row: &Row) -> Result<StoredOrder, StoreError> {
    Ok(StoredOrder {
        state: OrderState {
            order_date: date(&row.get::<String>("order_date")?, "order_date")?,
            id: row.get("order_id")?,
            customer_id: row.get("customer_id")?,
            lines: row.get("lines")?,
            shipped: row.get::<i64>("shipped")? != 0,
            version: u64::try_from(row.get::<i64>("version")?).map_err(corrupt)?,
        },
        first_line: u64::try_from(row.get::<i64>("first_line")?).map_err(corrupt)?,
        ship_date: date(&row.get::<String>("ship_date")?, "ship_date")?,
        ship_mode: row.get("ship_mode")?,
    })
}

/// Loads the order `id`, if it was placed.
///
/// # Errors
/// The database failed, or the row is corrupt.
pub async fn load_order(tx: &mut Tx, id: &str) -> Result<Option<StoredOrder>, StoreError> {
    const SQL: &str = select_order!("WHERE order_id = $1");
    let row = tx.query(SQL).bind(id).fetch_optional().await?;
    row.as_ref().map(stored).transpose()
}

/// Orders placed and not shipped yet, in the order of their first row.
///
/// # Errors
/// The database failed, or a row is corrupt.
pub async fn unshipped_orders(store: &Store) -> Result<Vec<StoredOrder>, StoreError> {
    const SQL: &str = select_order!("WHERE shipped = 0 ORDER BY first_line, order_id");
    let rows = store.query(SQL).fetch_all().await?;
    rows.iter().map(stored).collect()
}

/// Inserts a newly placed order.
///
/// # Errors
/// The database failed (the order exists: a concurrent import placed it).
pub async fn insert_order(tx: &mut Tx, order: &StoredOrder) -> Result<(), StoreError> {
    let s = &order.state;
    tx.query(
        "INSERT INTO orders_aggregate (order_id, customer_id, order_date, version, lines,
            first_line, ship_date, ship_mode, shipped)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(&s.id)
    .bind(&s.customer_id)
    .bind(s.order_date.format(DATE).to_string())
    .bind(i64_of(s.version))
    .bind(s.lines)
    .bind(i64_of(order.first_line))
    .bind(order.ship_date.format(DATE).to_string())
    .bind(&order.ship_mode)
    .bind(i64::from(s.shipped))
    .execute()
    .await?;
    Ok(())
}

/// Saves a loaded order's new state, if it is still at `loaded_version` (optimistic
/// concurrency). Returns `false` when another command changed it meanwhile.
///
/// # Errors
/// The database failed.
pub async fn update_order(
    tx: &mut Tx,
    state: &OrderState,
    loaded_version: u64,
) -> Result<bool, StoreError> {
    let n = tx
        .query(
            "UPDATE orders_aggregate SET version = $1, lines = $2, shipped = $3
            WHERE order_id = $4 AND version = $5",
        )
        .bind(i64_of(state.version))
        .bind(state.lines)
        .bind(i64::from(state.shipped))
        .bind(&state.id)
        .bind(i64_of(loaded_version))
        .execute()
        .await?;
    Ok(n == 1)
}

//! The order handlers. Each writes its projection through the store transaction it is given
//! (`tx: &mut Tx`), so that its effect commits — or rolls back — with the record of its run:
//! in-transaction handlers with the command's unit of work, after-commit handlers with their
//! delivery's completion. A delivery that is retried after a failure, or redelivered after a
//! crash, therefore never counts twice. Handlers know events, their tables and resources,
//! never the aggregate or the CSV.
//!
//! | handler | event | mode | writes |
//! |---|---|---|---|
//! | `orders.directory` | `order.placed` | in transaction | `orders_directory` |
//! | `orders.revenue_by_region` | `order.line_added` | in transaction | `orders_revenue_by_region` |
//! | `orders.order_summary` | [`OrderEvent`]: `order.placed`, `order.line_added`, `order.shipped` | after commit | `orders_customers`, `orders_order_sales` (currency, lines, sales) |
//! | `orders.erp_export` | `order.line_added` | after commit, unordered | `orders_erp_export` |
//! | `orders.shipping_lead_time` | `order.shipped` | after commit | `orders_lead_times` |
//! | `orders.send_confirmation` | `order.shipped` | after commit, `async` | `orders_notifications` |
//!
//! The `order.placed` handlers take version 2 ([`OrderPlacedV2`]): the registry refuses a
//! handler of an older version at start-up, and the runtime upcasts the version-1 envelopes
//! that earlier releases wrote before it calls them (their deliveries included), so that
//! `orders.order_summary` records a currency for every order, whichever version placed it.
//!
//! Handler names are pinned with `name = "…"`: they are the first half of the idempotency
//! key (handler, event id) of every delivery row, and moving a function to another module
//! must not make the store deliver old events again.
//!
//! After-commit handlers also take the [`Flaky`] resource, which fails a seeded fraction of
//! their attempts transiently (`--flaky-rate`), after their write: the runtime must roll the
//! write back and retry, and the totals show whether it did. In-transaction handlers are
//! left alone: they have no retry (their failure aborts the command).
//!
//! The handlers of one aggregate's events run in sequence order per handler, and different
//! handlers run independently. `orders.order_summary` takes the event union [`OrderEvent`],
//! so it sees each order's placement, lines and shipment in that order (before the union,
//! two handlers kept the summary and a line could reach it before its order).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use event_core::{event_handler, Envelope, HandlerError};
use event_runtime::{SqlValue, Tx};
use rust_decimal::Decimal;

use super::domain::{LineAdded, OrderEvent, OrderPlacedV2, OrderShipped};
use super::sql::{day_number, to_units};

/// How many handlers this module registers (checked at start-up with `expect_handlers`).
pub const HANDLER_COUNT: usize = 6;

/// The handler whose dead letters are expected: the legacy ERP refuses non-ASCII product
/// names. A dead letter of any other handler means a projection misses an event.
pub const ERP_EXPORT: &str = "orders.erp_export";

/// Makes after-commit handlers fail transiently on a fraction of their attempts, drawn from
/// a seeded generator (`--flaky-rate`, `--seed`): a stand-in for a lost connection or a
/// deadlock. The order in which deliveries draw depends on scheduling, so which attempts
/// fail varies from run to run; how many, roughly, does not.
#[derive(Debug)]
pub struct Flaky {
    rate: f64,
    rng: Mutex<fastrand::Rng>,
    injected: AtomicU64,
}

impl Flaky {
    /// Fails `rate` (0 to 1) of the attempts.
    pub fn new(rate: f64, seed: u64) -> Self {
        Flaky {
            rate,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            injected: AtomicU64::new(0),
        }
    }

    /// Failures injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// One attempt of `handler`: `Err` (transient) for the unlucky fraction.
    fn attempt(&self, handler: &str) -> Result<(), HandlerError> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let draw = self
            .rng
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .f64();
        if draw >= self.rate {
            return Ok(());
        }
        self.injected.fetch_add(1, Ordering::Relaxed);
        Err(HandlerError::transient_msg(format_args!(
            "{handler}: simulated transient failure (--flaky-rate {})",
            self.rate
        )))
    }
}

/// An amount in stored units, or a permanent error: redelivering the event cannot give it
/// fewer decimals.
fn units(amount: Decimal, what: &str) -> Result<i64, HandlerError> {
    to_units(amount).ok_or_else(|| {
        HandlerError::permanent_msg(format_args!(
            "{what} {amount} cannot be stored exactly: more than four decimals"
        ))
    })
}

/// `Ok` when the statement found the order in the directory; a permanent error otherwise
/// (redelivering the same event cannot make an unknown order known).
fn found(rows: u64, order_id: &str) -> Result<(), HandlerError> {
    if rows == 0 {
        return Err(HandlerError::permanent_msg(format_args!(
            "order {order_id} is not in the directory"
        )));
    }
    Ok(())
}

/// Remembers each placed order for the handlers of its later events. In the transaction,
/// so it is there before any of them runs.
#[event_handler(name = "orders.directory", priority = 0, in_transaction)]
async fn order_directory(event: &OrderPlacedV2, tx: &mut Tx) -> Result<(), HandlerError> {
    tx.execute(
        "INSERT INTO orders_directory (order_id, customer_id, segment, region, order_day)
        VALUES ($1, $2, $3, $4, $5)",
        &[
            SqlValue::Text(&event.order_id),
            SqlValue::Text(&event.customer_id),
            SqlValue::Text(&event.segment),
            SqlValue::Text(&event.region),
            SqlValue::Int(day_number(event.order_date)),
        ],
    )
    .await?;
    Ok(())
}

/// Adds each line's sales and profit to its order's region, exactly. In the transaction:
/// revenue is what the books say, so a line that cannot be booked aborts its command.
#[event_handler(name = "orders.revenue_by_region", priority = 1, in_transaction)]
async fn revenue_by_region(event: &LineAdded, tx: &mut Tx) -> Result<(), HandlerError> {
    let sales = units(event.sales, "sales")?;
    let profit = units(event.profit, "profit")?;
    let rows = tx
        .execute(
            "INSERT INTO orders_revenue_by_region (region, lines, quantity, sales, profit)
            SELECT region, 1, $2, $3, $4 FROM orders_directory WHERE order_id = $1
            ON CONFLICT (region) DO UPDATE SET
                lines = orders_revenue_by_region.lines + 1,
                quantity = orders_revenue_by_region.quantity + excluded.quantity,
                sales = orders_revenue_by_region.sales + excluded.sales,
                profit = orders_revenue_by_region.profit + excluded.profit",
            &[
                SqlValue::Text(&event.order_id),
                SqlValue::Int(i64::from(event.quantity)),
                SqlValue::Int(sales),
                SqlValue::Int(profit),
            ],
        )
        .await?;
    found(rows, &event.order_id)
}

/// The order summary, one projection over each order's whole stream: on `order.placed` it
/// counts the order for its customer and records the order's currency (for revenue by
/// currency); on `order.line_added` it adds the line's sales to the customer and the order;
/// `order.shipped` changes nothing it keeps.
///
/// One handler of the [`OrderEvent`] union rather than one per event: its deliveries are
/// ordered per order across the three events, so a line never reaches the summary before
/// its order was placed there.
#[event_handler(name = "orders.order_summary", priority = 10)]
async fn order_summary(event: &OrderEvent, tx: &mut Tx, flaky: &Flaky) -> Result<(), HandlerError> {
    match event {
        OrderEvent::Placed(event) => {
            tx.execute(
                "INSERT INTO orders_customers (customer_id, segment, orders, lines, sales)
                VALUES ($1, $2, 1, 0, 0)
                ON CONFLICT (customer_id) DO UPDATE SET orders = orders_customers.orders + 1",
                &[
                    SqlValue::Text(&event.customer_id),
                    SqlValue::Text(&event.segment),
                ],
            )
            .await?;
            // Upserts: an order first seen by an earlier release of this example may have
            // lines in the summary already.
            tx.execute(
                "INSERT INTO orders_order_sales (order_id, currency, lines, sales)
                VALUES ($1, $2, 0, 0)
                ON CONFLICT (order_id) DO UPDATE SET currency = excluded.currency",
                &[
                    SqlValue::Text(&event.order_id),
                    SqlValue::Text(&event.currency),
                ],
            )
            .await?;
        }
        OrderEvent::LineAdded(event) => {
            let sales = units(event.sales, "sales")?;
            let rows = tx
                .execute(
                    "INSERT INTO orders_customers (customer_id, segment, orders, lines, sales)
                    SELECT customer_id, segment, 0, 1, $2 FROM orders_directory WHERE order_id = $1
                    ON CONFLICT (customer_id) DO UPDATE SET
                        lines = orders_customers.lines + 1,
                        sales = orders_customers.sales + excluded.sales",
                    &[SqlValue::Text(&event.order_id), SqlValue::Int(sales)],
                )
                .await?;
            found(rows, &event.order_id)?;
            tx.execute(
                "INSERT INTO orders_order_sales (order_id, currency, lines, sales)
                VALUES ($1, NULL, 1, $2)
                ON CONFLICT (order_id) DO UPDATE SET
                    lines = orders_order_sales.lines + 1,
                    sales = orders_order_sales.sales + excluded.sales",
                &[SqlValue::Text(&event.order_id), SqlValue::Int(sales)],
            )
            .await?;
        }
        OrderEvent::Shipped(_) => {}
    }
    flaky.attempt("orders.order_summary")
}

/// Exports each line to a legacy ERP that only takes ASCII: a product name with any other
/// character is refused for good (a permanent error), and the delivery goes to the dead
/// letter queue, where `orders events dlq list` shows it.
///
/// `unordered`: the export of one line does not depend on the export of the order's earlier
/// lines, so per-aggregate order buys nothing here — and with it, a dead letter would hold
/// back every later line of its order until someone replays or purges it. Ten orders of the
/// bundled data have two non-ASCII lines; ordered, their second line would never be tried.
#[event_handler(name = "orders.erp_export", priority = 15, unordered)]
async fn erp_export(
    envelope: &Envelope<LineAdded>,
    tx: &mut Tx,
    flaky: &Flaky,
) -> Result<(), HandlerError> {
    let line = envelope.event();
    if let Some((at, c)) = line
        .product_name
        .char_indices()
        .find(|(_, c)| !c.is_ascii())
    {
        return Err(HandlerError::permanent_msg(format_args!(
            "the ERP takes ASCII only: product name of row {} has {c:?} (U+{:04X}) at byte {at}: {:?}",
            line.row_id, c as u32, line.product_name
        )));
    }
    // The ERP's fixed layout: row;order;product;quantity;sales.
    let record = format!(
        "{};{};{};{};{}",
        line.row_id, line.order_id, line.product_id, line.quantity, line.sales
    );
    tx.execute(
        "INSERT INTO orders_erp_export (event_id, row_id, order_id, record) VALUES ($1, $2, $3, $4)",
        &[
            SqlValue::Text(&envelope.id().to_string()),
            SqlValue::Int(i64::try_from(line.row_id).unwrap_or(i64::MAX)),
            SqlValue::Text(&line.order_id),
            SqlValue::Text(&record),
        ],
    )
    .await?;
    flaky.attempt(ERP_EXPORT)
}

/// Lead time (ship date − order date, in days) of each shipped order, by ship mode.
#[event_handler(name = "orders.shipping_lead_time", priority = 20)]
async fn shipping_lead_time(
    event: &OrderShipped,
    tx: &mut Tx,
    flaky: &Flaky,
) -> Result<(), HandlerError> {
    let rows = tx
        .execute(
            "INSERT INTO orders_lead_times (ship_mode, days, orders)
            SELECT $1, $2 - order_day, 1 FROM orders_directory WHERE order_id = $3
            ON CONFLICT (ship_mode, days) DO UPDATE SET orders = orders_lead_times.orders + 1",
            &[
                SqlValue::Text(&event.ship_mode),
                SqlValue::Int(day_number(event.ship_date)),
                SqlValue::Text(&event.order_id),
            ],
        )
        .await?;
    found(rows, &event.order_id)?;
    flaky.attempt("orders.shipping_lead_time")
}

/// Sends one shipping confirmation per shipped order: writes it to `orders_notifications`,
/// the mail queue a mailer would read, keyed by the `order.shipped` event id (also handed
/// on as the mail service's idempotency key).
#[event_handler(name = "orders.send_confirmation", priority = 30)]
async fn send_confirmation(
    envelope: &Envelope<OrderShipped>,
    tx: &mut Tx,
    flaky: &Flaky,
) -> Result<(), HandlerError> {
    let shipped = envelope.event();
    let key = envelope.id().to_string();
    let body = format!(
        "Your order {} was shipped on {} by {}. [Idempotency-Key: {key}]",
        shipped.order_id, shipped.ship_date, shipped.ship_mode,
    );
    tx.execute(
        "INSERT INTO orders_notifications (event_id, order_id, body) VALUES ($1, $2, $3)",
        &[
            SqlValue::Text(&key),
            SqlValue::Text(&shipped.order_id),
            SqlValue::Text(&body),
        ],
    )
    .await?;
    flaky.attempt("orders.send_confirmation")
}

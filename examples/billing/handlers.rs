//! Billing's handlers and tables, and its outbox: the `billing` example's, and what the
//! tracing test in `examples/tests` runs in-process (`#[path]`-included there: an example is
//! not a library, and registering these handlers in the `examples` library would give them
//! to `orders`, which builds its registry from every handler linked in).

use std::time::Duration;

use event_core::{event_handler, Envelope, HandlerError};
use event_runtime::{
    Dispatcher, Outbox, OutboxConfig, OutboxError, RetryPolicy, SqlValue, Store, Tx,
};
use examples::orders::domain::{LineAdded, OrderPlacedV2, OrderShipped};

/// Records that `handler` ran on event `sequence` of `order`, with the next value of this
/// database's counter, in the handler's transaction: for every (handler, order) the counter
/// must grow with the sequence (`summary.out_of_order` counts the pairs where it does not).
pub(crate) async fn seen(
    tx: &mut Tx,
    handler: &str,
    order: &str,
    sequence: u64,
) -> Result<(), HandlerError> {
    // The counter row is locked until this transaction commits: values follow commit order.
    tx.execute("UPDATE billing_counter SET n = n + 1", &[])
        .await?;
    tx.execute(
        "INSERT INTO billing_seen (handler, order_id, sequence, n) \
         VALUES ($1, $2, $3, (SELECT n FROM billing_counter))",
        &[
            SqlValue::Text(handler),
            SqlValue::Text(order),
            SqlValue::Int(sequence as i64),
        ],
    )
    .await?;
    Ok(())
}

#[event_handler(name = "billing.order")]
pub(crate) async fn record_order(
    envelope: &Envelope<OrderPlacedV2>,
    tx: &mut Tx,
) -> Result<(), HandlerError> {
    let event = envelope.event();
    seen(tx, "billing.order", &event.order_id, envelope.sequence()).await?;
    tx.execute(
        "INSERT INTO billing_orders (order_id, region) VALUES ($1, $2)",
        &[
            SqlValue::Text(&event.order_id),
            SqlValue::Text(&event.region),
        ],
    )
    .await?;
    Ok(())
}

#[event_handler(name = "billing.line")]
pub(crate) async fn record_line(
    envelope: &Envelope<LineAdded>,
    tx: &mut Tx,
) -> Result<(), HandlerError> {
    let event = envelope.event();
    seen(tx, "billing.line", &event.order_id, envelope.sequence()).await?;
    tx.execute(
        "INSERT INTO billing_lines (row_id, order_id, sales) VALUES ($1, $2, $3)",
        &[
            SqlValue::Int(event.row_id as i64),
            SqlValue::Text(&event.order_id),
            SqlValue::Text(&event.sales.to_string()),
        ],
    )
    .await?;
    Ok(())
}

#[event_handler(name = "billing.invoice")]
pub(crate) async fn invoice(
    envelope: &Envelope<OrderShipped>,
    tx: &mut Tx,
) -> Result<(), HandlerError> {
    let event = envelope.event();
    seen(tx, "billing.invoice", &event.order_id, envelope.sequence()).await?;
    tx.execute(
        "INSERT INTO billing_invoices (order_id, ship_date) VALUES ($1, $2)",
        &[
            SqlValue::Text(&event.order_id),
            SqlValue::Text(&event.ship_date.to_string()),
        ],
    )
    .await?;
    Ok(())
}

/// Taken (PostgreSQL) before creating the tables: `CREATE TABLE IF NOT EXISTS` run by two
/// sessions at once can fail on PostgreSQL's catalog (`pg_type_typname_nsp_index`). SQLite
/// serialises the writers itself.
pub(crate) const TABLES_LOCK: &str = "SELECT pg_advisory_xact_lock(7306020231)";

pub(crate) const TABLES: [&str; 6] = [
    "CREATE TABLE IF NOT EXISTS billing_orders (order_id TEXT PRIMARY KEY, region TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS billing_seen (handler TEXT NOT NULL, order_id TEXT NOT NULL, sequence BIGINT NOT NULL, n BIGINT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS billing_seen_order ON billing_seen (order_id, handler)",
    "CREATE TABLE IF NOT EXISTS billing_counter (n BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS billing_lines (row_id BIGINT PRIMARY KEY, order_id TEXT NOT NULL, sales TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS billing_invoices (order_id TEXT PRIMARY KEY, ship_date TEXT NOT NULL)",
];

/// Creates billing's tables (under a lock on PostgreSQL) and its counter row.
///
/// # Errors
/// The database refused a statement.
pub(crate) async fn create_tables(store: &Store) -> Result<(), event_runtime::StoreError> {
    let mut tx = store.begin().await?;
    if store.backend_name() == "postgres" {
        tx.query(TABLES_LOCK).fetch_all().await?;
    }
    for sql in TABLES {
        tx.execute(sql, &[]).await?;
    }
    if tx
        .fetch_i64("SELECT COUNT(*) FROM billing_counter", &[])
        .await?
        .unwrap_or(0)
        == 0
    {
        tx.execute("INSERT INTO billing_counter (n) VALUES (0)", &[])
            .await?;
    }
    tx.commit().await
}

/// Billing's outbox over `store`: its three handlers (the events of `orders` it takes, and no
/// other handler of the program), and its configuration. Also what `billing events` replays
/// inbox dead letters with.
pub(crate) fn outbox(store: Store) -> Result<Outbox, OutboxError> {
    Outbox::builder(store)
        .dispatcher(
            Dispatcher::builder_empty()
                .event::<OrderPlacedV2>()
                .event::<LineAdded>()
                .event::<OrderShipped>()
                .handler::<record_order>()
                .handler::<record_line>()
                .handler::<invoice>(),
        )
        .config(outbox_config())
        .build()
}

/// Billing's outbox configuration.
pub(crate) fn outbox_config() -> OutboxConfig {
    OutboxConfig::default()
        .retry(RetryPolicy {
            max_attempts: 12,
            initial_backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(100),
        })
        .poll_interval(Duration::from_millis(20))
        .source("urn:example:billing")
        // `--metrics-addr`: the gauges a second old at most.
        .metrics_interval(Duration::from_secs(1))
}

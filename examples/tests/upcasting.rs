//! `order.placed` version 2 against what the release before it wrote: version-1 envelopes
//! decode and are upcast to version 2 (`Registry::decode_latest`), and a database in which
//! that release committed rows, with their deliveries still pending, is finished by the
//! current example: every `order.placed` handler runs on version 2 and sees the currency,
//! and the totals are exact (SQLite and PostgreSQL).
//!
//! The release before version 2 is reproduced as far as the database can tell: the same
//! tables, one unit of work per CSV row, `Order::place` recording `OrderPlaced` version 1 at
//! sequence 1, and an outbox whose registry knows `order.placed` version 1 only, with handlers
//! of the same names as the example's (`orders.directory` in the transaction, writing the
//! directory row as that release did; `orders.order_summary` after commit, taking version 1
//! in its union; the other `order.line_added` and `order.shipped` handlers, whose events did
//! not change). Its
//! handlers are registered by hand, not with `#[event_handler]`, so that this test binary's
//! inventory holds only the current example's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use event_core::{
    AnyEnvelope, DeliveryMode, Envelope, EventDescriptor, EventRecorder, HandlerCall,
    HandlerContext, HandlerDescriptor, HandlerError, HandlerFuture, RawEnvelope,
    ResourceDescriptor,
};
use event_runtime::{sqlx, Dispatcher, Outbox, Registry, SqlValue, Store, Tx};
use examples::orders::csv_input::{self, OrderRow};
use examples::orders::domain::{
    AddLine, LineAdded, Order, OrderPlaced, OrderPlacedV2, OrderShipped, OrderState,
};
use examples::orders::handlers::Flaky;
use examples::orders::persistence::{self, StoredOrder};
use examples::orders::sql::{self, day_number};
use examples::orders::{self, Args, Report};
use rust_decimal::Decimal;

// ---- decoding -----------------------------------------------------------------------------

fn v1(order_id: &str, country: &str) -> OrderPlaced {
    OrderPlaced {
        order_id: order_id.into(),
        customer_id: "SC-20095".into(),
        segment: "Consumer".into(),
        region: "East".into(),
        country: country.into(),
        order_date: chrono::NaiveDate::from_ymd_opt(2019, 1, 23).unwrap(),
    }
}

fn as_v2(envelope: &dyn AnyEnvelope) -> &Envelope<OrderPlacedV2> {
    envelope
        .as_any()
        .downcast_ref::<Envelope<OrderPlacedV2>>()
        .unwrap_or_else(|| panic!("not version 2: {} v{}", envelope.name(), envelope.version()))
}

#[test]
fn decode_latest_turns_a_version_1_envelope_into_version_2_with_the_currency_of_its_country() {
    let registry = orders::registry().unwrap();
    assert_eq!(
        registry.latest_version("order.placed").unwrap().type_name,
        std::any::type_name::<OrderPlacedV2>()
    );
    for (country, currency) in [("United States", "USD"), ("Canada", "CAD")] {
        let old = Envelope::new(v1("CA-2019-115238", country)).with_sequence(1);
        let raw = old.to_raw().unwrap();
        assert_eq!((raw.name.as_str(), raw.version), ("order.placed", 1));

        // `decode` gives the version the envelope was written in; `decode_latest` upcasts.
        assert_eq!(registry.decode(&raw).unwrap().version(), 1);
        let latest = registry.decode_latest(&raw).unwrap();
        let new = as_v2(&*latest);
        assert_eq!(new.event().currency, currency);
        assert_eq!(new.event().country, country);
        assert_eq!(new.event().order_id, "CA-2019-115238");
        assert_eq!(new.event().customer_id, "SC-20095");
        // The metadata is the original's: the idempotency key does not change.
        assert_eq!(new.metadata(), old.metadata());
    }
}

/// An `order.placed` envelope exactly as the release before version 2 stored it in
/// `event_outbox.envelope` (copied from a database it wrote).
const STORED_BY_THE_PREVIOUS_RELEASE: &str = r#"{"specversion":"1.0","id":"01a2266b-0eed-73c2-9acb-ed05598e1874","source":"urn:event-core","type":"order.placed","subject":"US-2019-103800","time":"2026-11-29T08:28:00.109555503Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"order","sequence":"00000000000000000001","data":{"order_id":"US-2019-103800","customer_id":"DP-13000","segment":"Consumer","region":"Central","country":"United States","order_date":"2019-01-03"}}"#;

#[test]
fn an_envelope_stored_by_the_previous_release_decodes_as_version_2() {
    let registry = orders::registry().unwrap();
    let raw = RawEnvelope::from_json(STORED_BY_THE_PREVIOUS_RELEASE).unwrap();
    let latest = registry.decode_latest(&raw).unwrap();
    let new = as_v2(&*latest);
    assert_eq!(new.id().to_string(), "01a2266b-0eed-73c2-9acb-ed05598e1874");
    assert_eq!(new.sequence(), 1);
    assert_eq!(new.aggregate_id(), "US-2019-103800");
    assert_eq!(
        *new.event(),
        OrderPlacedV2 {
            order_id: "US-2019-103800".into(),
            customer_id: "DP-13000".into(),
            segment: "Consumer".into(),
            region: "Central".into(),
            country: "United States".into(),
            currency: "USD".into(),
            order_date: chrono::NaiveDate::from_ymd_opt(2019, 1, 3).unwrap(),
        }
    );
}

// ---- the release before version 2 --------------------------------------------------------

/// That release's `orders.directory`: the same row as today's, from version 1.
fn old_directory<'a>(ctx: &'a mut HandlerContext<'_>) -> HandlerFuture<'a> {
    Box::pin(async move {
        let event = ctx.envelope::<OrderPlaced>()?.event();
        let tx = ctx.take_transaction::<Tx>()?;
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
    })
}

/// That release's `orders.order_summary`, whose union held version 1. It never runs here: the
/// release is replaced before it delivers anything.
fn old_order_summary<'a>(_: &'a mut HandlerContext<'_>) -> HandlerFuture<'a> {
    Box::pin(async {
        Err(HandlerError::permanent_msg(
            "the release before order.placed v2 delivers nothing in this test",
        ))
    })
}

static OLD_DIRECTORY: HandlerDescriptor = HandlerDescriptor {
    name: "orders.directory",
    events: &[EventDescriptor::of::<OrderPlaced>],
    priority: 0,
    mode: DeliveryMode::InTransaction,
    ordered: true,
    resources: &[],
    transaction: Some(ResourceDescriptor::of::<Tx>()),
    takes_envelope: false,
    call: HandlerCall::Async(old_directory),
    file: file!(),
    line: line!(),
};

static OLD_ORDER_SUMMARY: HandlerDescriptor = HandlerDescriptor {
    name: "orders.order_summary",
    events: &[
        EventDescriptor::of::<OrderPlaced>,
        EventDescriptor::of::<LineAdded>,
        EventDescriptor::of::<OrderShipped>,
    ],
    priority: 10,
    mode: DeliveryMode::AfterCommit,
    ordered: true,
    resources: &[ResourceDescriptor::of::<Flaky>()],
    transaction: Some(ResourceDescriptor::of::<Tx>()),
    takes_envelope: false,
    call: HandlerCall::Async(old_order_summary),
    file: file!(),
    line: line!(),
};

/// The outbox of the release before version 2: `order.placed` version 1 only, and handlers of
/// the example's names.
fn old_outbox(store: Store) -> Outbox {
    let current = orders::registry().unwrap();
    let mut registry = Registry::builder()
        .event::<OrderPlaced>()
        .event::<LineAdded>()
        .event::<OrderShipped>()
        .handler_descriptor(&OLD_DIRECTORY)
        .handler_descriptor(&OLD_ORDER_SUMMARY);
    // The handlers of the events that did not change are the same code.
    for h in current.handlers() {
        if h.events.iter().all(|e| e().name != "order.placed") {
            registry = registry.handler_descriptor(h);
        }
    }
    let outbox = Outbox::builder(store)
        .dispatcher(Dispatcher::builder_from(registry.expect_handlers(6)))
        .resource(Flaky::new(0.0, 1))
        .build()
        .unwrap();
    let known = outbox.dispatcher().registry();
    assert!(known.event_by_name("order.placed", 2).is_err());
    assert_eq!(known.latest_version("order.placed").unwrap().version, 1);
    outbox
}

/// That release's import of `rows`, one unit of work each, as the example does by default:
/// it places an order with `OrderPlaced` version 1, then adds the line.
async fn old_release_imports(outbox: &Outbox, rows: &[OrderRow]) {
    for row in rows {
        let mut uow = outbox.begin().await.unwrap();
        assert!(
            persistence::claim_row(uow.tx(), row.row_id, &row.order_id, row.line)
                .await
                .unwrap()
        );
        let stored = persistence::load_order(uow.tx(), &row.order_id)
            .await
            .unwrap();
        let loaded_version = stored.as_ref().map(|s| s.state.version);
        let (mut order, mut events, first) = match stored {
            Some(s) => (
                Order::load(s.state),
                Vec::new(),
                (s.first_line, s.ship_date, s.ship_mode),
            ),
            None => {
                // Its `Order::place`: `OrderPlaced` version 1, sequence 1.
                let mut recorder = EventRecorder::new();
                recorder.record(OrderPlaced {
                    order_id: row.order_id.clone(),
                    customer_id: row.customer_id.clone(),
                    segment: row.segment.clone(),
                    region: row.region.clone(),
                    country: row.country.clone(),
                    order_date: row.order_date,
                });
                let order = Order::load(OrderState {
                    id: row.order_id.clone(),
                    customer_id: row.customer_id.clone(),
                    order_date: row.order_date,
                    lines: 0,
                    shipped: false,
                    version: recorder.version(),
                });
                (
                    order,
                    recorder.take(),
                    (row.line, row.ship_date, row.ship_mode.clone()),
                )
            }
        };
        let added = order.add_line(AddLine {
            customer_id: row.customer_id.clone(),
            row_id: row.row_id,
            product_id: row.product_id.clone(),
            product_name: row.product_name.clone(),
            category: row.category.clone(),
            quantity: row.quantity,
            sales: row.sales,
            discount: row.discount,
            profit: row.profit,
        });
        events.extend(order.take_events());
        if let Err(refused) = added {
            persistence::reject_row(uow.tx(), row.row_id, &refused.to_string())
                .await
                .unwrap();
        }
        match loaded_version {
            None => persistence::insert_order(
                uow.tx(),
                &StoredOrder {
                    state: order.state(),
                    first_line: first.0,
                    ship_date: first.1,
                    ship_mode: first.2,
                },
            )
            .await
            .unwrap(),
            Some(v) => assert!(persistence::update_order(uow.tx(), &order.state(), v)
                .await
                .unwrap()),
        }
        uow.extend(events);
        uow.commit().await.unwrap();
    }
}

// ---- databases ----------------------------------------------------------------------------

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("orders-upcasting-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn unique(test: &str) -> String {
    format!("{test}_{}", uuid::Uuid::now_v7().simple()).to_lowercase()
}

/// A database for one case: a fresh SQLite file, or a fresh schema of the PostgreSQL server of
/// `EVENTS_TEST_POSTGRES_URL`.
struct Db {
    url: String,
    schema: Option<String>,
}

impl Db {
    fn label(&self) -> &'static str {
        if self.schema.is_some() {
            "PostgreSQL"
        } else {
            "SQLite"
        }
    }

    async fn open(&self) -> Store {
        let store = match &self.schema {
            Some(schema) => {
                event_runtime::store::postgres::connect_in_schema(&self.url, schema).await
            }
            None => Store::connect(&self.url).await,
        }
        .unwrap();
        sql::create_tables(&store).await.unwrap();
        store
    }

    fn args(&self, input: &Path) -> Args {
        Args {
            input: input.to_owned(),
            database: self.url.clone(),
            schema: self.schema.clone(),
            ..Args::default()
        }
    }

    async fn drop_schema(&self) {
        if let Some(schema) = &self.schema {
            let pool = sqlx::PgPool::connect(&self.url).await.unwrap();
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA \"{schema}\" CASCADE"
            )))
            .execute(&pool)
            .await
            .unwrap();
        }
    }
}

fn databases(test: &str) -> Vec<Db> {
    let mut dbs = vec![Db {
        url: format!(
            "sqlite://{}",
            temp_dir().join(format!("{}.db", unique(test))).display()
        ),
        schema: None,
    }];
    match std::env::var("EVENTS_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => dbs.push(Db {
            url,
            schema: Some(unique(test)),
        }),
        _ => {
            assert_ne!(
                std::env::var("EVENTS_TEST_REQUIRE_SERVICES").as_deref(),
                Ok("1"),
                "{test}: EVENTS_TEST_REQUIRE_SERVICES=1 but EVENTS_TEST_POSTGRES_URL is not set"
            );
            eprintln!("{test}: PostgreSQL case skipped: EVENTS_TEST_POSTGRES_URL is not set");
        }
    }
    dbs
}

/// Rows of `sql` (two columns, text and integer) on the store's pool.
async fn pairs(store: &Store, sql: &'static str) -> BTreeMap<String, i64> {
    let rows: Vec<(String, i64)> = if let Some(p) = event_runtime::store::sqlite::pool(store) {
        sqlx::query_as(sql).fetch_all(p).await.unwrap()
    } else {
        sqlx::query_as(sql)
            .fetch_all(event_runtime::store::postgres::pool(store).unwrap())
            .await
            .unwrap()
    };
    rows.into_iter().collect()
}

// ---- the deploy ---------------------------------------------------------------------------

/// The header and the first `rows` data rows of the bundled file.
fn first_rows(rows: usize) -> PathBuf {
    let bytes = std::fs::read(orders::default_input()).unwrap();
    let out: Vec<u8> = bytes
        .split_inclusive(|&b| b == b'\n')
        .take(rows + 1)
        .flatten()
        .copied()
        .collect();
    let path = temp_dir().join(format!("first-{rows}.csv"));
    std::fs::write(&path, out).unwrap();
    path
}

/// Sales by currency, straight from the CSV: the country of each order's first row.
fn expected_revenue_by_currency(rows: &[OrderRow]) -> BTreeMap<String, Decimal> {
    let mut country: BTreeMap<&str, &str> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for r in rows {
        let c = *country.entry(&r.order_id).or_insert(&r.country);
        let currency = match c {
            "United States" => "USD",
            "Canada" => "CAD",
            other => panic!("no currency for {other:?}"),
        };
        *out.entry(currency.to_owned()).or_insert(Decimal::ZERO) += r.sales;
    }
    out
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The slice: 120 rows, 63 imported by the release before version 2. Row 62 places the
/// Canadian order `CA-2019-115238` (rows 62 to 66): the old release places it in version 1
/// and adds two lines, the current example adds the other three.
const ROWS: usize = 120;
const OLD_ROWS: usize = 63;
const CANADIAN: &str = "CA-2019-115238";

#[test]
fn rows_committed_by_the_release_before_v2_are_delivered_as_v2_and_the_totals_are_exact() {
    let input = first_rows(ROWS);
    let rows = csv_input::read_rows(&input).unwrap();
    assert_eq!(rows.len(), ROWS);
    assert!(rows[61..66]
        .iter()
        .all(|r| r.order_id == CANADIAN && r.country == "Canada"));
    let orders_total = rows
        .iter()
        .map(|r| &r.order_id)
        .collect::<std::collections::BTreeSet<_>>()
        .len() as i64;
    let old_orders = rows[..OLD_ROWS]
        .iter()
        .map(|r| &r.order_id)
        .collect::<std::collections::BTreeSet<_>>()
        .len() as i64;
    let expected = expected_revenue_by_currency(&rows);
    assert_eq!(expected.keys().collect::<Vec<_>>(), ["CAD", "USD"]);
    let sales_total: Decimal = rows.iter().map(|r| r.sales).sum();

    let rt = runtime();
    for db in databases("upcast_deploy") {
        let label = db.label();
        // Before the deploy: the old release commits 63 rows, then is replaced before it
        // delivers any of them.
        rt.block_on(async {
            let old = old_outbox(db.open().await);
            old_release_imports(&old, &rows[..OLD_ROWS]).await;
            let store = old.store();
            assert_eq!(
                pairs(
                    store,
                    "SELECT name || ' v' || CAST(version AS TEXT), COUNT(*) FROM event_outbox
                    GROUP BY name, version"
                )
                .await,
                BTreeMap::from([
                    ("order.line_added v1".to_owned(), OLD_ROWS as i64),
                    ("order.placed v1".to_owned(), old_orders),
                ]),
                "{label}"
            );
            assert_eq!(
                pairs(
                    store,
                    "SELECT d.handler, COUNT(*) FROM event_deliveries d
                    JOIN event_outbox o ON o.event_id = d.event_id
                    WHERE d.status <> 'completed' AND o.name = 'order.placed'
                    GROUP BY d.handler"
                )
                .await["orders.order_summary"],
                old_orders,
                "{label}: one pending delivery of each version-1 order.placed"
            );
        });

        // The deploy: the current example on the same database.
        let report: Report = rt.block_on(orders::run(&db.args(&input))).unwrap();
        let s = &report.summary;
        assert_eq!(s.rows_already_imported, OLD_ROWS as u64, "{label}");
        assert_eq!(s.orders_placed, orders_total as u64, "{label}");
        assert_eq!(s.lines_added, ROWS as u64, "{label}");
        assert_eq!(s.orders_shipped, orders_total as u64, "{label}");
        assert_eq!(s.sales_total, sales_total, "{label}");
        assert_eq!(
            s.revenue_by_currency, expected,
            "{label}: the handlers saw the currency of every order"
        );
        assert_eq!(report.projection_dead_letters, 0, "{label}");
        for h in &report.handlers {
            assert_eq!(h.pending, 0, "{label}: {}", h.name);
            if h.events == ["order.placed"] {
                assert_eq!(h.ran, orders_total as u64, "{label}: {}", h.name);
            }
        }
        assert_eq!(
            report.currencies["CAD"].orders, 1,
            "{label}: the Canadian order, placed in version 1"
        );
        assert_eq!(report.currencies["CAD"].lines, 5, "{label}");

        rt.block_on(async {
            let store = db.open().await;
            // The outbox keeps each event as it was written: version 1 before the deploy,
            // version 2 after.
            assert_eq!(
                pairs(
                    &store,
                    "SELECT 'v' || CAST(version AS TEXT), COUNT(*) FROM event_outbox
                    WHERE name = 'order.placed' GROUP BY version"
                )
                .await,
                BTreeMap::from([
                    ("v1".to_owned(), old_orders),
                    ("v2".to_owned(), orders_total - old_orders),
                ]),
                "{label}"
            );
            // The Canadian order's currency was recorded by `orders.order_summary` from its
            // version-1 envelope, upcast.
            assert_eq!(
                pairs(
                    &store,
                    "SELECT s.currency, CAST(o.version AS BIGINT) FROM event_outbox o
                    JOIN orders_order_sales s ON s.order_id = o.aggregate_id
                    WHERE o.name = 'order.placed' AND o.aggregate_id = 'CA-2019-115238'",
                )
                .await,
                BTreeMap::from([("CAD".to_owned(), 1)]),
                "{label}"
            );
        });

        // Once more: nothing left to do, the same totals.
        let again = rt.block_on(orders::run(&db.args(&input))).unwrap();
        assert_eq!(again.run.events_committed, 0, "{label}");
        assert_eq!(again.summary.revenue_by_currency, expected, "{label}");
        rt.block_on(db.drop_schema());
    }
}

//! The `orders` example: replays the Superstore orders data set through the `Order`
//! aggregate, one unit of work per command, and reports what the handlers computed.
//!
//! ```text
//! CSV row ─► Order::place / Order::add_line ─► recorder ─► unit_of_work.commit()
//!                                                            ├─ in transaction: directory, revenue by region
//!                                                            └─ after commit: customer stats, lead time, confirmation
//! after the last row: Order::ship for every placed order ─► unit_of_work.commit()
//! every Nth envelope: its CloudEvents JSON is dispatched again (at-least-once redelivery);
//! the idempotency guard skips every handler that already ran.
//! ```
//!
//! [`run`] does the work and returns a [`Report`]; the `orders` example binary prints it with
//! [`report::render`] and ends with the [`Summary`] line.

pub mod csv_input;
pub mod domain;
pub mod handlers;
pub mod report;

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use chrono::NaiveDate;
use event_core::{AnyEnvelope, DeliveryMode};
use event_runtime::{
    CommitError, DispatchError, DispatchReport, Dispatcher, Outcome, RegistryError,
    DEFAULT_GUARD_CAPACITY,
};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use self::csv_input::{InputError, OrderRow};
use self::domain::{AddLine, Order, OrderError, PlaceOrder};
use self::handlers::{
    Confirmation, ConfirmationSender, Customer, CustomerStats, LeadTimes, OrderDirectory,
    RegionRevenue, Revenue, Segment, ShippingStats, HANDLER_COUNT,
};

/// The bundled data set, resolved at compile time so the example runs from any directory.
pub fn default_input() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/superstore-orders.csv"
    ))
}

/// Command-line arguments of the `orders` example.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "orders",
    about = "Replays retail orders through an Order aggregate, a unit of work and six event handlers, with simulated at-least-once redelivery."
)]
pub struct Args {
    /// The orders CSV (Superstore layout: UTF-8, a header line, dates as dd/mm/yy).
    #[arg(long, value_name = "PATH", default_value_os_t = default_input())]
    pub input: PathBuf,
    /// Dispatch every Nth envelope a second time, as a broker that lost an ack would; 0 turns
    /// redelivery off.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub redeliver_every: u64,
    /// Entries of the in-memory idempotency guard; 0 turns the guard off (redelivered events
    /// then run their handlers again, and the totals show it).
    #[arg(long, value_name = "ENTRIES", default_value_t = DEFAULT_GUARD_CAPACITY)]
    pub idempotency_capacity: usize,
    /// Customers listed in the top-customers table.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            input: default_input(),
            redeliver_every: 10,
            idempotency_capacity: DEFAULT_GUARD_CAPACITY,
            top: 10,
        }
    }
}

/// Why a run stopped. Each message is complete on its own (it names the file and line where
/// there is one).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The input could not be read.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The dispatcher refused its registry at start-up.
    #[error("cannot start the dispatcher: {0}")]
    Registry(#[from] RegistryError),
    /// An in-transaction handler failed, so a command's commit was aborted.
    #[error("{path}:{line}: {source}")]
    Commit {
        /// The input file.
        path: PathBuf,
        /// The line of the row whose command failed to commit.
        line: u64,
        /// The aborted commit.
        #[source]
        source: Box<CommitError>,
    },
    /// An order could not ship with the ship date and mode of its first row.
    #[error("{path}:{line}: {source}")]
    Ship {
        /// The input file.
        path: PathBuf,
        /// The line of the order's first row.
        line: u64,
        /// The aggregate's refusal.
        #[source]
        source: Box<OrderError>,
    },
    /// An envelope could not be encoded for redelivery.
    #[error("cannot encode event `{event}` for redelivery: {source}")]
    Encode {
        /// The event name.
        event: &'static str,
        /// serde's error.
        #[source]
        source: serde_json::Error,
    },
    /// A redelivered envelope could not be decoded.
    #[error("redelivery failed: {0}")]
    Redeliver(#[from] DispatchError),
}

/// A row the `Order` aggregate refused; the run goes on without it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The row id.
    pub row_id: u64,
    /// Its line in the file.
    pub line: u64,
    /// The domain error.
    pub error: OrderError,
}

/// The last line of the output, `summary: {…}`: the totals a test or a script checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Data rows read.
    pub rows: u64,
    /// Orders placed, as counted by the customer-stats handler.
    pub orders_placed: u64,
    /// Lines added, as counted by the revenue handler.
    pub lines_added: u64,
    /// Rows the aggregate refused.
    pub rejected: u64,
    /// Their row ids, in file order.
    pub rejected_row_ids: Vec<u64>,
    /// Orders shipped, as counted by the lead-time handler.
    pub orders_shipped: u64,
    /// Sales of all lines added, exact (a decimal string).
    pub sales_total: Decimal,
    /// Profit of all lines added, exact (a decimal string).
    pub profit_total: Decimal,
    /// Sales by region, exact (decimal strings).
    pub revenue_by_region: BTreeMap<String, Decimal>,
    /// Distinct customers with at least one order.
    pub customers: u64,
    /// Shortest, mean and longest lead time in days over all shipped orders.
    pub lead_time_days: LeadTimeSummary,
    /// Confirmations the notification handler sent.
    pub notifications_sent: u64,
    /// Distinct events committed and dispatched (redeliveries not counted).
    pub events_dispatched: u64,
    /// Envelopes dispatched a second time.
    pub redelivered: u64,
    /// Handler runs that succeeded.
    pub handler_runs: u64,
    /// Handler runs the idempotency guard skipped.
    pub duplicates_skipped: u64,
    /// Handler runs on a redelivered envelope that were not skipped (0 with the guard on).
    pub redelivered_runs: u64,
    /// Handler runs that failed or panicked.
    pub handler_failures: u64,
    /// Wall time of the run, reading the file included.
    pub elapsed_ms: u64,
}

/// Lead time over all shipped orders, in days.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeadTimeSummary {
    /// Shortest.
    pub min: i64,
    /// Mean, two decimals.
    pub mean: Decimal,
    /// Longest.
    pub max: i64,
}

impl Summary {
    /// The summary line: `summary: ` and one JSON object.
    pub fn line(&self) -> String {
        // Serialising plain data with string keys cannot fail.
        format!(
            "summary: {}",
            serde_json::to_string(self).unwrap_or_default()
        )
    }
}

/// One handler's runs over the whole job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerTally {
    /// The handler name (its idempotency key).
    pub name: &'static str,
    /// The event it handles.
    pub event: &'static str,
    /// In transaction or after commit.
    pub mode: DeliveryMode,
    /// Its priority.
    pub priority: i32,
    /// Runs that succeeded.
    pub ran: u64,
    /// Runs skipped as duplicates.
    pub duplicates: u64,
    /// Runs that failed or panicked.
    pub failures: u64,
}

/// Everything the job computed: the [`Summary`] and the detail behind the report tables.
#[derive(Debug, Clone)]
pub struct Report {
    /// The totals.
    pub summary: Summary,
    /// The input file.
    pub input: PathBuf,
    /// Capacity of the idempotency guard (0: off).
    pub guard_capacity: usize,
    /// Revenue per region.
    pub regions: BTreeMap<String, Revenue>,
    /// Orders, customers and sales per segment.
    pub segments: BTreeMap<String, Segment>,
    /// The customers with the highest sales, highest first.
    pub top_customers: Vec<(String, Customer)>,
    /// Lead times per ship mode.
    pub lead_times: BTreeMap<String, LeadTimes>,
    /// Per handler, in registry order.
    pub handlers: Vec<HandlerTally>,
    /// Events committed, by name.
    pub events_by_name: BTreeMap<&'static str, u64>,
    /// Refused rows.
    pub rejections: Vec<Rejection>,
    /// One line per failed handler run.
    pub failures: Vec<String>,
    /// The first confirmation sent, as a sample.
    pub sample_confirmation: Option<Confirmation>,
}

/// Runs the job on `args.input`.
///
/// # Errors
/// [`RunError`]: unreadable or malformed input (naming file, line and column), a dispatcher
/// that fails validation, or an aborted commit. A row the aggregate refuses is not an error:
/// it is listed in [`Report::rejections`].
pub async fn run(args: &Args) -> Result<Report, RunError> {
    let started = Instant::now();
    let rows = csv_input::read_rows(&args.input)?;

    let resources = Resources::default();
    let dispatcher = Dispatcher::builder()
        .resource_arc(Arc::clone(&resources.directory))
        .resource_arc(Arc::clone(&resources.revenue))
        .resource_arc(Arc::clone(&resources.customers))
        .resource_arc(Arc::clone(&resources.shipping))
        .resource_arc(Arc::clone(&resources.sender))
        .idempotency_capacity(args.idempotency_capacity)
        .expect_handlers(HANDLER_COUNT)
        .build()?;

    let mut app = OrderService::new(&dispatcher, args);
    for row in &rows {
        app.handle_row(row).await?;
    }
    app.ship_all().await?;

    let elapsed = started.elapsed();
    Ok(app.into_report(&resources, rows.len() as u64, elapsed.as_millis() as u64))
}

/// The handlers' resources, shared with the dispatcher so the report can read them.
#[derive(Default)]
struct Resources {
    directory: Arc<OrderDirectory>,
    revenue: Arc<RegionRevenue>,
    customers: Arc<CustomerStats>,
    shipping: Arc<ShippingStats>,
    sender: Arc<ConfirmationSender>,
}

/// The first row of a placed order: where its shipment comes from.
struct Placed {
    order_id: String,
    line: u64,
    ship_date: NaiveDate,
    ship_mode: String,
}

/// Counts of dispatch outcomes.
#[derive(Default)]
struct Delivery {
    events: u64,
    redelivered: u64,
    ran: u64,
    duplicates: u64,
    redelivered_runs: u64,
    failures: Vec<String>,
    by_handler: HashMap<&'static str, (u64, u64, u64)>,
    by_event: BTreeMap<&'static str, u64>,
}

impl Delivery {
    fn record(&mut self, report: &DispatchReport, redelivery: bool) {
        for o in report.outcomes() {
            let tally = self.by_handler.entry(o.handler).or_default();
            match &o.outcome {
                Outcome::Ran => {
                    self.ran += 1;
                    tally.0 += 1;
                    if redelivery {
                        self.redelivered_runs += 1;
                    }
                }
                Outcome::Duplicate => {
                    self.duplicates += 1;
                    tally.1 += 1;
                }
                other => {
                    tally.2 += 1;
                    self.failures.push(format!(
                        "{} on {} {}: {other}",
                        o.handler,
                        report.event_name(),
                        report.event_id()
                    ));
                }
            }
        }
    }
}

/// The application service: turns rows into commands, commits what the aggregate records,
/// and plays the broker that redelivers.
struct OrderService<'d> {
    dispatcher: &'d Dispatcher,
    input: PathBuf,
    redeliver_every: u64,
    top: usize,
    orders: HashMap<String, Order>,
    placed: Vec<Placed>,
    rejections: Vec<Rejection>,
    delivery: Delivery,
}

impl<'d> OrderService<'d> {
    fn new(dispatcher: &'d Dispatcher, args: &Args) -> Self {
        OrderService {
            dispatcher,
            input: args.input.clone(),
            redeliver_every: args.redeliver_every,
            top: args.top,
            orders: HashMap::new(),
            placed: Vec::new(),
            rejections: Vec::new(),
            delivery: Delivery::default(),
        }
    }

    /// One row is one command: place the order if it is new, then add the line.
    async fn handle_row(&mut self, row: &OrderRow) -> Result<(), RunError> {
        let order = match self.orders.entry(row.order_id.clone()) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => {
                self.placed.push(Placed {
                    order_id: row.order_id.clone(),
                    line: row.line,
                    ship_date: row.ship_date,
                    ship_mode: row.ship_mode.clone(),
                });
                v.insert(Order::place(PlaceOrder {
                    order_id: row.order_id.clone(),
                    customer_id: row.customer_id.clone(),
                    segment: row.segment.clone(),
                    region: row.region.clone(),
                    country: row.country.clone(),
                    order_date: row.order_date,
                }))
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
        if let Err(error) = added {
            self.rejections.push(Rejection {
                row_id: row.row_id,
                line: row.line,
                error,
            });
        }
        // A refused line records nothing; a new order's placement still commits.
        let events = order.take_events();
        self.commit(events)
            .await
            .map_err(|e| e.at(&self.input, row.line))
    }

    /// After the last row: every placed order ships once, as its first row says.
    async fn ship_all(&mut self) -> Result<(), RunError> {
        let placed = std::mem::take(&mut self.placed);
        for p in &placed {
            let Some(order) = self.orders.get_mut(&p.order_id) else {
                continue;
            };
            order
                .ship(p.ship_date, &p.ship_mode)
                .map_err(|source| RunError::Ship {
                    path: self.input.clone(),
                    line: p.line,
                    source: Box::new(source),
                })?;
            let events = order.take_events();
            self.commit(events)
                .await
                .map_err(|e| e.at(&self.input, p.line))?;
        }
        self.placed = placed;
        Ok(())
    }

    async fn commit(&mut self, events: Vec<Box<dyn AnyEnvelope>>) -> Result<(), Uncommitted> {
        if events.is_empty() {
            return Ok(());
        }
        let mut redeliver = Vec::new();
        for envelope in &events {
            self.delivery.events += 1;
            *self.delivery.by_event.entry(envelope.name()).or_default() += 1;
            if self.redeliver_every > 0 && self.delivery.events % self.redeliver_every == 0 {
                // What a broker hands back after a lost acknowledgement: the same CloudEvents
                // JSON, with the same event id.
                let raw = envelope.to_raw().map_err(|source| Uncommitted::Encode {
                    event: envelope.name(),
                    source,
                })?;
                redeliver.push(raw.to_json());
            }
        }
        let mut uow = self.dispatcher.unit_of_work();
        uow.extend(events);
        for report in uow.commit().await.map_err(Uncommitted::Commit)? {
            self.delivery.record(&report, false);
        }
        for json in redeliver {
            let report = self
                .dispatcher
                .dispatch_json(&json)
                .await
                .map_err(Uncommitted::Redeliver)?;
            self.delivery.redelivered += 1;
            self.delivery.record(&report, true);
        }
        Ok(())
    }

    fn into_report(self, res: &Resources, rows: u64, elapsed_ms: u64) -> Report {
        let d = self.dispatcher;
        let regions = res.revenue.snapshot();
        let customers = res.customers.customers();
        let segments = res.customers.segments();
        let lead_times = res.shipping.by_mode();
        let sender = &res.sender;

        let mut all_lead_times = LeadTimes::default();
        for lt in lead_times.values() {
            all_lead_times.merge(lt);
        }
        let mut top_customers: Vec<(String, Customer)> = customers
            .iter()
            .map(|(id, c)| (id.clone(), c.clone()))
            .collect();
        top_customers.sort_by(|a, b| b.1.sales.cmp(&a.1.sales).then_with(|| a.0.cmp(&b.0)));
        top_customers.truncate(self.top);

        let handlers = d
            .registry()
            .handlers()
            .iter()
            .map(|h| {
                let (ran, duplicates, failures) = self
                    .delivery
                    .by_handler
                    .get(h.name)
                    .copied()
                    .unwrap_or_default();
                HandlerTally {
                    name: h.name,
                    event: (h.event)().name,
                    mode: h.mode,
                    priority: h.priority,
                    ran,
                    duplicates,
                    failures,
                }
            })
            .collect();

        let summary = Summary {
            rows,
            orders_placed: customers.values().map(|c| c.orders).sum(),
            lines_added: regions.values().map(|r| r.lines).sum(),
            rejected: self.rejections.len() as u64,
            rejected_row_ids: self.rejections.iter().map(|r| r.row_id).collect(),
            orders_shipped: all_lead_times.orders,
            sales_total: regions.values().map(|r| r.sales).sum(),
            profit_total: regions.values().map(|r| r.profit).sum(),
            revenue_by_region: regions.iter().map(|(k, r)| (k.clone(), r.sales)).collect(),
            customers: customers.values().filter(|c| c.orders > 0).count() as u64,
            lead_time_days: LeadTimeSummary {
                min: all_lead_times.min_days,
                mean: all_lead_times.mean_days(),
                max: all_lead_times.max_days,
            },
            notifications_sent: sender.sent(),
            events_dispatched: self.delivery.events,
            redelivered: self.delivery.redelivered,
            handler_runs: self.delivery.ran,
            duplicates_skipped: self.delivery.duplicates,
            redelivered_runs: self.delivery.redelivered_runs,
            handler_failures: self.delivery.failures.len() as u64,
            elapsed_ms,
        };
        Report {
            summary,
            input: self.input,
            guard_capacity: d.guard_capacity(),
            regions,
            segments,
            top_customers,
            lead_times,
            handlers,
            events_by_name: self.delivery.by_event,
            rejections: self.rejections,
            failures: self.delivery.failures,
            sample_confirmation: sender.first(),
        }
    }
}

/// A commit that did not go through, before the row's location is known.
enum Uncommitted {
    Commit(CommitError),
    Encode {
        event: &'static str,
        source: serde_json::Error,
    },
    Redeliver(DispatchError),
}

impl Uncommitted {
    fn at(self, path: &Path, line: u64) -> RunError {
        match self {
            Uncommitted::Commit(source) => RunError::Commit {
                path: path.to_path_buf(),
                line,
                source: Box::new(source),
            },
            Uncommitted::Encode { event, source } => RunError::Encode { event, source },
            Uncommitted::Redeliver(e) => RunError::Redeliver(e),
        }
    }
}

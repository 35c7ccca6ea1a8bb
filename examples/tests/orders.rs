//! The durable `orders` example against a direct computation from the CSV: exact totals on
//! SQLite and PostgreSQL, a rerun that changes nothing, the dead letter queue (through the
//! embedded `orders events` tool), transient failures absorbed by retries, at-least-once
//! re-appends skipped, a crash and a restart of the real binary, and bad input.
//!
//! The expected numbers are computed here with the csv crate alone, independently of the
//! example's parser, aggregate, handlers and SQL. Each test has its own database: a fresh
//! SQLite file, or a fresh PostgreSQL schema. Most use a slice of the bundled file; the full
//! file runs once per backend.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::str::FromStr;

use chrono::NaiveDate;
use examples::orders::{self, Args, Report, RunError, Summary};
use rust_decimal::Decimal;

/// What the CSV says, computed without the example's code.
#[derive(Debug)]
struct Expected {
    rows: u64,
    orders: u64,
    lines: u64,
    rejected_row_ids: Vec<u64>,
    sales_total: Decimal,
    profit_total: Decimal,
    revenue_by_region: BTreeMap<String, Decimal>,
    /// Sales by the currency of the order's country (first row): USD, CAD.
    revenue_by_currency: BTreeMap<String, Decimal>,
    customers: u64,
    lead_time_min: i64,
    lead_time_max: i64,
    /// Row ids of accepted lines whose product name is not all ASCII: the ERP refuses them.
    non_ascii_row_ids: BTreeSet<u64>,
}

impl Expected {
    fn events(&self) -> u64 {
        self.orders + self.lines + self.orders
    }

    /// In-transaction runs (directory per order, revenue per line) plus completed deliveries
    /// (the order summary per event of the union: placed, line, shipped; ERP export per line,
    /// less the refused exports; lead time and confirmation per shipped order).
    fn handler_runs(&self) -> u64 {
        let dead = self.non_ascii_row_ids.len() as u64;
        (self.orders + self.lines) + self.events() + (self.lines - dead) + 2 * self.orders
    }
}

fn expected(path: &Path) -> Expected {
    let mut reader = csv::Reader::from_path(path).unwrap();
    let headers: Vec<String> = reader
        .headers()
        .unwrap()
        .iter()
        .map(|h| h.trim_start_matches('\u{feff}').to_owned())
        .collect();
    let col = |name: &str| headers.iter().position(|h| h == name).unwrap();
    let (row_id, order_id, customer, region, sales, profit, order_date, ship_date, product) = (
        col("Row ID"),
        col("Order ID"),
        col("Customer ID"),
        col("Region"),
        col("Sales"),
        col("Profit"),
        col("Order Date"),
        col("Ship Date"),
        col("Product Name"),
    );
    let country = col("Country/Region");
    let date = |s: &str| NaiveDate::parse_from_str(s, "%d/%m/%y").unwrap();

    let mut first: HashMap<String, csv::StringRecord> = HashMap::new();
    let mut e = Expected {
        rows: 0,
        orders: 0,
        lines: 0,
        rejected_row_ids: Vec::new(),
        sales_total: Decimal::ZERO,
        profit_total: Decimal::ZERO,
        revenue_by_region: BTreeMap::new(),
        revenue_by_currency: BTreeMap::new(),
        customers: 0,
        lead_time_min: i64::MAX,
        lead_time_max: i64::MIN,
        non_ascii_row_ids: BTreeSet::new(),
    };
    for record in reader.records() {
        let record = record.unwrap();
        e.rows += 1;
        let order = first
            .entry(record[order_id].to_owned())
            .or_insert_with(|| record.clone());
        if order[customer] != record[customer] {
            e.rejected_row_ids.push(record[row_id].parse().unwrap());
            continue;
        }
        e.lines += 1;
        let s = Decimal::from_str(&record[sales]).unwrap();
        e.sales_total += s;
        e.profit_total += Decimal::from_str(&record[profit]).unwrap();
        *e.revenue_by_region
            .entry(order[region].to_owned())
            .or_default() += s;
        let currency = match &order[country] {
            "United States" => "USD",
            "Canada" => "CAD",
            other => panic!("no currency for {other:?}"),
        };
        *e.revenue_by_currency
            .entry(currency.to_owned())
            .or_default() += s;
        if !record[product].is_ascii() {
            e.non_ascii_row_ids.insert(record[row_id].parse().unwrap());
        }
    }
    e.orders = first.len() as u64;
    e.customers = first
        .values()
        .map(|r| r[customer].to_owned())
        .collect::<BTreeSet<_>>()
        .len() as u64;
    for r in first.values() {
        let days = (date(&r[ship_date]) - date(&r[order_date])).num_days();
        e.lead_time_min = e.lead_time_min.min(days);
        e.lead_time_max = e.lead_time_max.max(days);
    }
    e
}

// ---- databases ----------------------------------------------------------------------------

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("orders-example-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A unique lower-case name for a file or schema.
fn unique(test: &str) -> String {
    format!("{test}_{}", uuid::Uuid::now_v7().simple()).to_lowercase()
}

/// A fresh SQLite database file.
fn sqlite_db(test: &str) -> String {
    format!(
        "sqlite://{}",
        temp_dir().join(format!("{}.db", unique(test))).display()
    )
}

/// The PostgreSQL URL from `EVENTS_TEST_POSTGRES_URL`, or `None` after printing that the case
/// is skipped. With `EVENTS_TEST_REQUIRE_SERVICES=1` a missing URL fails the test.
fn postgres_url(test: &str) -> Option<String> {
    match std::env::var("EVENTS_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert_ne!(
                std::env::var("EVENTS_TEST_REQUIRE_SERVICES").as_deref(),
                Ok("1"),
                "{test}: EVENTS_TEST_REQUIRE_SERVICES=1 but EVENTS_TEST_POSTGRES_URL is not set"
            );
            eprintln!("{test}: PostgreSQL case skipped: EVENTS_TEST_POSTGRES_URL is not set");
            None
        }
    }
}

fn args(database: &str, input: &Path) -> Args {
    Args {
        input: input.to_owned(),
        database: database.to_owned(),
        ..Args::default()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn run(args: &Args) -> Result<Report, RunError> {
    runtime().block_on(orders::run(args))
}

/// `orders events ARGS…` through the embedded entry point, output captured.
fn events_cli(args: &[&str]) -> (ExitCode, String, String) {
    let registry = orders::registry().unwrap();
    let topology = orders::topology(&orders::Args::default());
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let argv = std::iter::once("events").chain(args.iter().copied());
    let code = runtime().block_on(event_runtime::cli::run_with_output(
        argv,
        orders::cli_app(&registry, &topology),
        &mut out,
        &mut err,
    ));
    (
        code,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

// ---- what every run must show -------------------------------------------------------------

/// The totals: exact, read from the projections, with no effect counted twice.
fn assert_matches_csv(s: &Summary, e: &Expected) {
    assert_eq!(s.rows, e.rows, "rows");
    assert_eq!(s.orders_placed, e.orders, "orders placed");
    assert_eq!(s.lines_added, e.lines, "lines added");
    assert_eq!(s.rejected, e.rejected_row_ids.len() as u64, "rejected");
    assert_eq!(s.rejected_row_ids, e.rejected_row_ids, "rejected row ids");
    assert_eq!(s.orders_shipped, e.orders, "every placed order ships once");
    assert_eq!(s.sales_total, e.sales_total, "sales total");
    assert_eq!(s.profit_total, e.profit_total, "profit total");
    assert_eq!(
        s.revenue_by_region, e.revenue_by_region,
        "revenue by region"
    );
    assert_eq!(
        s.revenue_by_currency, e.revenue_by_currency,
        "revenue by currency (order.placed v2)"
    );
    assert_eq!(s.customers, e.customers, "customers");
    assert_eq!(s.lead_time_days.min, e.lead_time_min, "lead time min");
    assert_eq!(s.lead_time_days.max, e.lead_time_max, "lead time max");
    assert_eq!(
        s.notifications_sent, e.orders,
        "one confirmation per shipped order"
    );
    let refused = e.non_ascii_row_ids.len() as u64;
    assert_eq!(
        s.dead_lettered, refused,
        "dead letters: the accepted lines with a non-ASCII product name"
    );
    assert_eq!(s.erp_exported, e.lines - refused, "lines exported");
    assert_eq!(s.events_dispatched, e.events(), "events dispatched");
    assert_eq!(s.handler_runs, e.handler_runs(), "handler runs");
    assert_eq!(
        s.duplicates_skipped, s.redelivered,
        "every re-appended envelope is skipped"
    );
}

/// What the report adds to the summary: per handler, and no effect twice.
fn assert_report_consistent(report: &Report, e: &Expected) {
    assert_eq!(report.handlers.len(), 6);
    assert!(report.relays.is_empty(), "no relay without --nats");
    for h in &report.handlers {
        // The order summary takes the union of the three events.
        if h.name == "orders.order_summary" {
            assert_eq!(
                h.events,
                ["order.placed", "order.line_added", "order.shipped"]
            );
        }
        let per_event: u64 = h
            .events
            .iter()
            .map(|e| report.events_by_name.get(*e).copied().unwrap_or(0))
            .sum();
        let dead = if h.name == "orders.erp_export" {
            e.non_ascii_row_ids.len() as u64
        } else {
            0
        };
        assert_eq!(h.ran + dead, per_event, "{}", h.name);
        assert_eq!(h.dead, dead, "{}", h.name);
        assert_eq!(h.pending, 0, "{}", h.name);
        assert_eq!(h.ordered, h.name != "orders.erp_export", "{}", h.name);
    }
    assert_eq!(report.projection_dead_letters, 0);
    assert_eq!(report.repeated_notifications, 0);
    assert_eq!(report.rejections.len(), e.rejected_row_ids.len());
}

/// The summary without what describes one run only.
fn totals(s: &Summary) -> Summary {
    Summary {
        rows_already_imported: 0,
        redelivered: 0,
        duplicates_skipped: 0,
        elapsed_ms: 0,
        ..s.clone()
    }
}

/// `orders events dlq list --json --payload` shows exactly the refused lines, each with its original
/// envelope.
fn assert_dead_letters_listed(database_args: &[&str], e: &Expected) {
    let mut argv = database_args.to_vec();
    argv.extend(["dlq", "list", "--json", "--payload"]);
    let (code, out, err) = events_cli(&argv);
    assert_eq!(code, ExitCode::SUCCESS, "{err}");
    let listed: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    let mut row_ids = BTreeSet::new();
    for d in &listed {
        assert_eq!(d["handler"], "orders.erp_export", "{d}");
        assert_eq!(d["event_name"], "order.line_added", "{d}");
        assert_eq!(d["reason"], "permanent", "{d}");
        assert_eq!(d["attempts"], 1, "a permanent error is not retried: {d}");
        let envelope: serde_json::Value =
            serde_json::from_str(d["envelope"].as_str().unwrap()).unwrap();
        assert!(
            !envelope["data"]["product_name"]
                .as_str()
                .unwrap()
                .is_ascii(),
            "{envelope}"
        );
        assert!(
            d["error_chain"][0]
                .as_str()
                .unwrap()
                .starts_with("the ERP takes ASCII only"),
            "{d}"
        );
        row_ids.insert(envelope["data"]["row_id"].as_u64().unwrap());
    }
    assert_eq!(listed.len(), row_ids.len(), "one dead letter per line");
    assert_eq!(row_ids, e.non_ascii_row_ids);
}

// ---- full data ----------------------------------------------------------------------------

#[test]
fn full_data_on_sqlite_exact_totals_dead_letters_and_a_rerun_that_changes_nothing() {
    let input = orders::default_input();
    let e = expected(&input);
    // The data set's known shape, so that a broken expectation cannot pass silently.
    assert_eq!(e.rows, 10_194);
    assert_eq!(e.rejected_row_ids, [5011, 5012, 5013, 7193, 7194, 7195]);
    assert_eq!(e.non_ascii_row_ids.len(), 282);
    assert_eq!(
        e.revenue_by_currency.keys().collect::<Vec<_>>(),
        ["CAD", "USD"],
        "orders to Canada and to the United States"
    );
    assert_eq!(
        e.revenue_by_currency.values().sum::<Decimal>(),
        e.sales_total
    );

    let db = sqlite_db("full");
    let first = run(&args(&db, &input)).unwrap();
    let s = &first.summary;
    assert_matches_csv(s, &e);
    assert_report_consistent(&first, &e);
    assert_eq!(s.rows_already_imported, 0);
    assert_eq!(first.run.rows_imported, e.rows);
    assert_eq!(s.redelivered, e.events() / 10, "every 10th envelope again");
    assert!(s.duplicates_skipped > 0);
    // Every transient failure injected (5 % by default) was retried; none ran out.
    assert!(first.run.flaky_failures > 0);
    assert_eq!(s.retries, first.run.flaky_failures);
    assert!(
        first
            .sample_confirmation
            .as_deref()
            .unwrap()
            .starts_with("Your order US-2019-103800 was shipped"),
        "the first order of the file ships first"
    );

    // The summary line is one JSON object that reads back as the same summary.
    let line = s.line();
    let json = line.strip_prefix("summary: ").unwrap();
    assert!(!json.contains('\n'));
    let value: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(value["sales_total"], e.sales_total.to_string());
    assert!(value["revenue_by_region"]["West"].is_string());
    for key in [
        "rows",
        "orders_placed",
        "lines_added",
        "rejected",
        "rejected_row_ids",
        "orders_shipped",
        "sales_total",
        "revenue_by_region",
        "notifications_sent",
        "events_dispatched",
        "handler_runs",
        "duplicates_skipped",
        "dead_lettered",
        "retries",
        "elapsed_ms",
    ] {
        assert!(value.get(key).is_some(), "summary lacks {key}");
    }
    let back: Summary = serde_json::from_str(json).unwrap();
    assert_eq!(&back, s);

    assert_dead_letters_listed(&["--database", &db], &e);

    // Again on the same database: every row is recognised, nothing is committed or
    // delivered, and the totals are the same.
    let again = run(&args(&db, &input)).unwrap();
    assert_eq!(totals(&again.summary), totals(s));
    assert_eq!(again.summary.rows_already_imported, e.rows);
    assert_eq!(again.summary.duplicates_skipped, 0);
    assert_eq!(again.run.rows_imported, 0);
    assert_eq!(again.run.events_committed, 0);
    assert_eq!(again.run.delivery.claimed, 0);
    assert_eq!(again.regions, first.regions);
    assert_eq!(again.segments, first.segments);
    assert_eq!(again.top_customers, first.top_customers);
    assert_eq!(again.lead_times, first.lead_times);
    assert_eq!(again.handlers, first.handlers);
    assert_eq!(again.rejections, first.rejections);
    let note = orders::report::render(&again);
    assert!(
        note.starts_with("Note: the database ") && note.contains("--database sqlite://other.db"),
        "{note}"
    );
    assert!(!orders::report::render(&first).starts_with("Note:"));
}

#[test]
fn full_data_on_postgres_exact_totals_and_dead_letters() {
    let Some(url) = postgres_url("full_data_on_postgres") else {
        return;
    };
    let input = orders::default_input();
    let e = expected(&input);
    let schema = unique("orders_full");
    let args = Args {
        schema: Some(schema.clone()),
        // One flush per commit on PostgreSQL: 50 commands per unit of work keep this test
        // short (each row is still imported once; `a_slice_in_batches…` compares).
        batch: 50,
        ..args(&url, &input)
    };
    let first = run(&args).unwrap();
    assert_matches_csv(&first.summary, &e);
    assert_report_consistent(&first, &e);
    assert_eq!(first.summary.retries, first.run.flaky_failures);
    assert_dead_letters_listed(&["--database", &url, "--schema", &schema], &e);

    let again = run(&args).unwrap();
    assert_eq!(totals(&again.summary), totals(&first.summary));
    assert_eq!(again.run.events_committed, 0);

    // Passed: the schema is not needed for a post-mortem.
    runtime().block_on(async {
        use event_runtime::sqlx;
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA \"{schema}\" CASCADE"
        )))
        .execute(&pool)
        .await
        .unwrap();
    });
}

// ---- slices -------------------------------------------------------------------------------

/// The bundled file's first `rows` data rows (with its BOM and CRLFs), with `edit` applied to
/// the bytes of line `line` (1-based; the header is line 1).
fn sample(name: &str, rows: usize, line: usize, edit: impl Fn(&[u8]) -> Vec<u8>) -> PathBuf {
    let bytes = std::fs::read(orders::default_input()).unwrap();
    let mut out = Vec::new();
    for (i, l) in bytes
        .split_inclusive(|&b| b == b'\n')
        .take(rows + 1)
        .enumerate()
    {
        if i + 1 == line {
            out.extend(edit(l));
        } else {
            out.extend_from_slice(l);
        }
    }
    let path = temp_dir().join(name);
    std::fs::write(&path, out).unwrap();
    path
}

/// The header and data rows `from..=to` (1-based) of the bundled file.
fn rows_between(name: &str, from: usize, to: usize) -> PathBuf {
    let bytes = std::fs::read(orders::default_input()).unwrap();
    let lines: Vec<&[u8]> = bytes.split_inclusive(|&b| b == b'\n').collect();
    let mut out = lines[0].to_vec();
    for l in &lines[from..=to] {
        out.extend_from_slice(l);
    }
    let path = temp_dir().join(name);
    std::fs::write(&path, out).unwrap();
    path
}

#[test]
fn a_flaky_rate_of_20_percent_is_absorbed_by_retries() {
    let input = sample("flaky.csv", 800, 0, |l| l.to_vec());
    let e = expected(&input);
    assert!(!e.non_ascii_row_ids.is_empty());
    let report = run(&Args {
        flaky_rate: 0.2,
        seed: 7,
        ..args(&sqlite_db("flaky"), &input)
    })
    .unwrap();
    assert_matches_csv(&report.summary, &e);
    assert_report_consistent(&report, &e);
    let s = &report.summary;
    assert!(s.retries > 0);
    assert_eq!(s.retries, report.run.flaky_failures, "each failure retried");
    // Roughly a fifth of the attempts failed: attempts = completed + dead + retries.
    let attempts = (s.handler_runs - e.orders - e.lines) + s.dead_lettered + s.retries;
    let rate = s.retries as f64 / attempts as f64;
    assert!((0.15..0.25).contains(&rate), "failure rate {rate}");

    let calm = run(&Args {
        flaky_rate: 0.0,
        ..args(&sqlite_db("calm"), &input)
    })
    .unwrap();
    assert_eq!(calm.summary.retries, 0);
    assert_eq!(
        Summary {
            retries: 0,
            ..totals(s)
        },
        totals(&calm.summary)
    );
}

#[test]
fn re_appended_envelopes_are_skipped_and_change_no_total() {
    let input = sample("redeliver.csv", 500, 0, |l| l.to_vec());
    let e = expected(&input);
    let with = |every: u64| {
        run(&Args {
            redeliver_every: every,
            flaky_rate: 0.0,
            ..args(&sqlite_db(&format!("redeliver_{every}")), &input)
        })
        .unwrap()
    };
    let never = with(0);
    let every_10th = with(10);
    let every = with(1);
    assert_eq!(never.summary.redelivered, 0);
    assert_eq!(every_10th.summary.redelivered, e.events() / 10);
    assert_eq!(
        every.summary.redelivered,
        e.events(),
        "every envelope appended twice"
    );
    for r in [&never, &every_10th, &every] {
        assert_matches_csv(&r.summary, &e);
        assert_report_consistent(r, &e);
        assert_eq!(r.summary.duplicates_skipped, r.summary.redelivered);
        assert_eq!(r.run.events_committed, e.events());
        assert_eq!(
            Summary {
                redelivered: 0,
                duplicates_skipped: 0,
                ..totals(&r.summary)
            },
            totals(&never.summary)
        );
    }
}

#[test]
fn a_slice_in_batches_of_commands_gives_the_same_totals() {
    // Rows 4,901 to 5,200: the rejected rows 5011 to 5013 are among them.
    let input = rows_between("batches.csv", 4_901, 5_200);
    let e = expected(&input);
    assert_eq!(e.rejected_row_ids, [5011, 5012, 5013]);
    let one = run(&Args {
        flaky_rate: 0.0,
        ..args(&sqlite_db("batch_1"), &input)
    })
    .unwrap();
    let many = run(&Args {
        flaky_rate: 0.0,
        batch: 37,
        ..args(&sqlite_db("batch_37"), &input)
    })
    .unwrap();
    for r in [&one, &many] {
        assert_matches_csv(&r.summary, &e);
        assert_report_consistent(r, &e);
    }
    assert_eq!(totals(&one.summary), totals(&many.summary));
    assert_eq!(one.rejections, many.rejections);
    assert_eq!(
        one.rejections[0].reason,
        "row 5011: order CA-2021-121465 belongs to customer HO-15234, not HO-15233"
    );
    assert_eq!(one.rejections[0].line, 5011 - 4900 + 1);
}

// ---- bad input ----------------------------------------------------------------------------

fn replace(line: &[u8], from: &str, to: &[u8]) -> Vec<u8> {
    let pos = line
        .windows(from.len())
        .position(|w| w == from.as_bytes())
        .unwrap_or_else(|| panic!("{from:?} not in {:?}", String::from_utf8_lossy(line)));
    [&line[..pos], to, &line[pos + from.len()..]].concat()
}

/// The error of a run on `path`; the input is read before the database is opened, so the
/// database file must not exist afterwards.
fn run_err(path: &Path) -> String {
    let db = temp_dir().join(format!("{}.db", unique("bad_input")));
    let err = run(&args(&format!("sqlite://{}", db.display()), path)).unwrap_err();
    assert!(!db.exists(), "bad input created the database");
    err.to_string()
}

#[test]
fn malformed_number_names_file_line_and_column() {
    // Line 12 is row 11: `...,Paper,Southworth 25% Cotton Granite Paper & Envelopes,6.54,1,0,3.0084`.
    let path = sample("bad-number.csv", 20, 12, |l| {
        replace(l, ",6.54,", b",1.2.3,")
    });
    assert_eq!(
        run_err(&path),
        format!(
            "{}:12: column \"Sales\": invalid decimal \"1.2.3\"",
            path.display()
        )
    );
    let path = sample("bad-quantity.csv", 20, 5, |l| {
        replace(l, ",3,0.2,", b",three,0.2,")
    });
    assert_eq!(
        run_err(&path),
        format!(
            "{}:5: column \"Quantity\": invalid integer \"three\"",
            path.display()
        )
    );
}

#[test]
fn malformed_date_names_file_line_and_column() {
    let path = sample("bad-date.csv", 20, 7, |l| {
        replace(l, "06/01/19", b"2019-01-06")
    });
    assert_eq!(
        run_err(&path),
        format!(
            "{}:7: column \"Order Date\": invalid date \"2019-01-06\" (expected dd/mm/yy)",
            path.display()
        )
    );
}

#[test]
fn invalid_utf8_names_file_line_and_column() {
    // A Latin-1 "é" (0xE9) in line 3's product name, as a file saved in Windows-1252 has.
    let path = sample("latin1.csv", 20, 3, |l| replace(l, "Combs", b"Comb\xe9s"));
    let err = run_err(&path);
    assert!(
        err.starts_with(&format!("{}:3: column ", path.display())),
        "{err}"
    );
    assert!(err.contains("not valid UTF-8"), "{err}");
}

#[test]
fn missing_file_and_missing_column() {
    let missing = temp_dir().join("no-such-file.csv");
    let err = run_err(&missing);
    assert!(
        err.starts_with(&format!("{}: cannot read the file: ", missing.display())),
        "{err}"
    );

    let path = sample("no-sales.csv", 5, 1, |l| {
        replace(l, ",Sales,", b",Revenue,")
    });
    assert_eq!(
        run_err(&path),
        format!("{}:1: missing column \"Sales\"", path.display())
    );
}

#[test]
fn bad_options_and_databases_are_refused_with_a_message() {
    let input = sample("options.csv", 5, 0, |l| l.to_vec());
    let err = |args: Args| event_core::ErrorChain(&run(&args).unwrap_err()).to_string();
    assert_eq!(
        err(Args {
            flaky_rate: 1.5,
            ..args(&sqlite_db("rate"), &input)
        }),
        "--flaky-rate must be between 0 and 1, not 1.5"
    );
    let db = sqlite_db("schema");
    assert_eq!(
        err(Args {
            schema: Some("s".into()),
            ..args(&db, &input)
        }),
        format!("--schema s needs a postgres:// database, not {db}")
    );
    assert!(err(args("mysql://localhost/db", &input))
        .starts_with("cannot open database mysql://localhost/db: unsupported database URL"));
    assert_eq!(
        orders::mask_password("postgres://u:secret@h/db"),
        "postgres://u:***@h/db"
    );
}

// ---- the example binary -------------------------------------------------------------------

/// The `orders` example built by this `cargo test` run (`target/<profile>/examples/orders`).
/// Cargo gives no `CARGO_BIN_EXE_` for examples, and running `cargo run` from a test would
/// wait on the lock the running `cargo test` holds.
fn example_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let profile_dir = exe.parent()?.parent()?;
    let bin = profile_dir
        .join("examples")
        .join(format!("orders{}", std::env::consts::EXE_SUFFIX));
    bin.exists().then_some(bin)
}

fn summary_of(stdout: &[u8]) -> Summary {
    let stdout = std::str::from_utf8(stdout).unwrap();
    let last = stdout.lines().last().unwrap();
    serde_json::from_str(last.strip_prefix("summary: ").unwrap()).unwrap()
}

#[test]
fn the_binary_survives_a_crash_after_3000_deliveries() {
    let Some(bin) = example_binary() else {
        eprintln!("skipped: the orders example is not built (run `cargo test -p examples`)");
        return;
    };
    let input = sample("crash.csv", 3_000, 0, |l| l.to_vec());
    let e = expected(&input);
    let db = sqlite_db("crash");
    let orders = |extra: &[&str]| {
        Command::new(&bin)
            .args(["--database", &db, "--input"])
            .arg(&input)
            .args(extra)
            .output()
            .unwrap()
    };

    let crashed = orders(&["--crash-after", "3000"]);
    let stderr = String::from_utf8_lossy(&crashed.stderr);
    assert!(!crashed.status.success(), "{stderr}");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            crashed.status.signal(),
            Some(6),
            "killed by SIGABRT, not an exit: {stderr}"
        );
    }
    assert!(
        stderr.contains("--crash-after: "),
        "the crash is the injected one: {stderr}"
    );
    assert!(crashed.stdout.is_empty(), "no report from a crashed run");

    // The restart finishes the import and the deliveries: exact totals, no effect twice.
    let restarted = orders(&[]);
    assert!(
        restarted.status.success(),
        "{}",
        String::from_utf8_lossy(&restarted.stderr)
    );
    let s = summary_of(&restarted.stdout);
    assert_matches_csv(&s, &e);
    assert!(s.rows_already_imported > 0, "the crashed run imported rows");
    assert_eq!(s.notifications_sent, s.orders_shipped);
    assert_eq!(s.revenue_by_region, e.revenue_by_region);

    // A third run has nothing left to do.
    let third = orders(&[]);
    assert!(third.status.success());
    assert_eq!(totals(&summary_of(&third.stdout)), totals(&s));
}

#[test]
fn the_binary_prints_a_summary_embeds_the_events_tool_and_fails_cleanly_on_bad_input() {
    let Some(bin) = example_binary() else {
        eprintln!("skipped: the orders example is not built (run `cargo test -p examples`)");
        return;
    };

    let good = sample("bin-good.csv", 300, 0, |l| l.to_vec());
    let db = sqlite_db("bin");
    let out = Command::new(&bin)
        .args(["--redeliver-every", "4", "--database", &db, "--input"])
        .arg(&good)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let summary = summary_of(&out.stdout);
    assert_matches_csv(&summary, &expected(&good));
    assert!(summary.duplicates_skipped > 0);
    assert!(stdout.contains("Revenue by region"));
    assert!(stdout.contains("Revenue by currency"));
    assert!(stdout.contains("Dead letters"));

    // `orders events …` is the runtime's tool on the same database.
    let stats = Command::new(&bin)
        .args(["events", "--database", &db, "outbox", "stats", "--json"])
        .output()
        .unwrap();
    assert!(
        stats.status.success(),
        "{}",
        String::from_utf8_lossy(&stats.stderr)
    );
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(stats["pending"], 0);
    assert_eq!(stats["dead_letters"], summary.dead_lettered);
    let help = Command::new(&bin)
        .args(["events", "--help"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("Usage: orders events"));

    let bad = sample("bin-bad.csv", 20, 12, |l| replace(l, ",6.54,", b",1.2.3,"));
    for (input, want) in [
        (
            bad.clone(),
            format!(
                "error: {}:12: column \"Sales\": invalid decimal \"1.2.3\"\n",
                bad.display()
            ),
        ),
        (
            temp_dir().join("bin-missing.csv"),
            format!(
                "error: {}: cannot read the file: ",
                temp_dir().join("bin-missing.csv").display()
            ),
        ),
    ] {
        let out = Command::new(&bin)
            .args(["--database", &sqlite_db("bin_bad"), "--input"])
            .arg(&input)
            .output()
            .unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.starts_with(&want), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(out.stdout.is_empty());
    }
}

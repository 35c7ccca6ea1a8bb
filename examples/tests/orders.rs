//! The `orders` example against a direct computation from the CSV, with and without
//! redelivery, and on bad input. The expected numbers are computed here with the csv crate
//! alone, independently of the example's parser, aggregate and handlers.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
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
    customers: u64,
    lead_time_min: i64,
    lead_time_max: i64,
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
    let (row_id, order_id, customer, region, sales, profit, order_date, ship_date) = (
        col("Row ID"),
        col("Order ID"),
        col("Customer ID"),
        col("Region"),
        col("Sales"),
        col("Profit"),
        col("Order Date"),
        col("Ship Date"),
    );
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
        customers: 0,
        lead_time_min: i64::MAX,
        lead_time_max: i64::MIN,
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

fn args(redeliver_every: u64) -> Args {
    Args {
        redeliver_every,
        ..Args::default()
    }
}

fn run(args: &Args) -> Result<Report, RunError> {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(orders::run(args))
}

/// Handlers per event in this example: 2 for each of placed, line added, shipped.
const HANDLERS_PER_EVENT: u64 = 2;

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
    assert_eq!(s.customers, e.customers, "customers");
    assert_eq!(s.lead_time_days.min, e.lead_time_min, "lead time min");
    assert_eq!(s.lead_time_days.max, e.lead_time_max, "lead time max");
    assert_eq!(
        s.notifications_sent, s.orders_shipped,
        "one confirmation per shipment"
    );
    let events = e.orders + e.lines + e.orders;
    assert_eq!(s.events_dispatched, events, "events dispatched");
    assert_eq!(s.handler_runs, events * HANDLERS_PER_EVENT, "handler runs");
    assert_eq!(s.handler_failures, 0, "handler failures");
    assert_eq!(
        s.redelivered_runs, 0,
        "a redelivered envelope ran a handler"
    );
}

#[test]
fn bundled_data_matches_a_direct_computation_from_the_csv() {
    let e = expected(&orders::default_input());
    // The data set's known shape, so that a broken expectation cannot pass silently.
    assert_eq!(e.rows, 10_194);
    assert_eq!(e.rejected_row_ids, [5011, 5012, 5013, 7193, 7194, 7195]);

    let report = run(&args(10)).unwrap();
    let s = &report.summary;
    assert_matches_csv(s, &e);
    assert_eq!(s.redelivered, s.events_dispatched / 10);
    assert_eq!(
        s.duplicates_skipped,
        s.redelivered * HANDLERS_PER_EVENT,
        "every handler of every redelivered envelope is skipped"
    );
    assert!(s.duplicates_skipped > 0);
    assert_eq!(
        report
            .sample_confirmation
            .as_ref()
            .map(|c| c.order_id.as_str()),
        Some("US-2019-103800"),
        "first order of the file ships first"
    );
    // Per handler: each ran once per event of its type.
    for h in &report.handlers {
        let per_event = report.events_by_name.get(h.event).copied().unwrap_or(0);
        assert_eq!(h.ran, per_event, "{}", h.name);
        assert_eq!(h.failures, 0, "{}", h.name);
    }
    assert_eq!(report.handlers.len(), 6);

    // The summary line is one JSON object that reads back as the same summary.
    let line = s.line();
    let json = line.strip_prefix("summary: ").unwrap();
    assert!(!json.contains('\n'));
    let value: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(
        value["sales_total"],
        e.sales_total.to_string(),
        "decimal string"
    );
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
        "elapsed_ms",
    ] {
        assert!(value.get(key).is_some(), "summary lacks {key}");
    }
    let back: Summary = serde_json::from_str(json).unwrap();
    assert_eq!(&back, s);
}

#[test]
fn redelivery_changes_nothing_but_the_duplicate_count() {
    let e = expected(&orders::default_input());
    let once = run(&args(0)).unwrap();
    let every_10th = run(&args(10)).unwrap();
    let every = run(&args(1)).unwrap();

    assert_eq!(once.summary.duplicates_skipped, 0);
    assert_eq!(once.summary.redelivered, 0);
    assert!(every_10th.summary.duplicates_skipped > 0);
    assert_eq!(
        every.summary.duplicates_skipped, every.summary.handler_runs,
        "redelivering every envelope skips every handler once"
    );

    let normalise = |s: &Summary| Summary {
        redelivered: 0,
        duplicates_skipped: 0,
        elapsed_ms: 0,
        ..s.clone()
    };
    for r in [&once, &every_10th, &every] {
        assert_matches_csv(&r.summary, &e);
        assert_eq!(normalise(&r.summary), normalise(&once.summary));
        assert_eq!(r.regions, once.regions);
        assert_eq!(r.segments, once.segments);
        assert_eq!(r.top_customers, once.top_customers);
        assert_eq!(r.lead_times, once.lead_times);
        let ran = |r: &Report| {
            r.handlers
                .iter()
                .map(|h| (h.name, h.ran))
                .collect::<Vec<_>>()
        };
        assert_eq!(ran(r), ran(&once));
    }
}

#[test]
fn without_the_guard_a_redelivery_counts_twice() {
    // Shows the tests above would notice a guard that lets redeliveries through.
    let e = expected(&orders::default_input());
    let report = run(&Args {
        idempotency_capacity: 0,
        ..args(10)
    })
    .unwrap();
    let s = &report.summary;
    assert_eq!(s.duplicates_skipped, 0);
    assert_eq!(s.redelivered_runs, s.redelivered * HANDLERS_PER_EVENT);
    assert!(s.sales_total > e.sales_total);
    assert!(s.notifications_sent > s.events_dispatched / 4);
    assert_ne!(s.notifications_sent, e.orders);
}

// ---- bad input ----------------------------------------------------------------------------

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("orders-example-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

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

fn replace(line: &[u8], from: &str, to: &[u8]) -> Vec<u8> {
    let pos = line
        .windows(from.len())
        .position(|w| w == from.as_bytes())
        .unwrap_or_else(|| panic!("{from:?} not in {:?}", String::from_utf8_lossy(line)));
    [&line[..pos], to, &line[pos + from.len()..]].concat()
}

fn run_err(path: &Path) -> String {
    let err = run(&Args {
        input: path.to_owned(),
        ..Args::default()
    })
    .unwrap_err();
    err.to_string()
}

#[test]
fn a_sample_of_the_data_matches_too() {
    let path = sample("sample.csv", 200, 0, |l| l.to_vec());
    let report = run(&Args {
        input: path.clone(),
        redeliver_every: 3,
        ..Args::default()
    })
    .unwrap();
    assert_matches_csv(&report.summary, &expected(&path));
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

#[test]
fn the_example_binary_prints_a_summary_and_fails_cleanly_on_bad_input() {
    let Some(bin) = example_binary() else {
        eprintln!("skipped: the orders example is not built (run `cargo test -p examples`)");
        return;
    };

    let good = sample("bin-good.csv", 300, 0, |l| l.to_vec());
    let out = Command::new(&bin)
        .args(["--redeliver-every", "4", "--input"])
        .arg(&good)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last = stdout.lines().last().unwrap();
    let summary: Summary = serde_json::from_str(last.strip_prefix("summary: ").unwrap()).unwrap();
    assert_matches_csv(&summary, &expected(&good));
    assert!(summary.duplicates_skipped > 0);
    assert!(stdout.contains("Revenue by region"));

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
            .arg("--input")
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

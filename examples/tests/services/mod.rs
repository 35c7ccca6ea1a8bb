//! What the two-services tests share (`two_services.rs` on NATS, `two_services_rabbitmq.rs`
//! on RabbitMQ): what the bundled CSV says billing must end with, the example binaries, child
//! processes killed when dropped, and the summary lines they print.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use rust_decimal::Decimal;
use serde_json::Value;

/// Orders and revenue by region, from the CSV alone: a row whose customer is not its order's
/// (first row's) customer is refused; a line counts in its order's region.
pub struct Expected {
    pub orders: u64,
    pub revenue_by_region: BTreeMap<String, Decimal>,
}

pub fn expected(path: &Path) -> Expected {
    let mut reader = csv::Reader::from_path(path).unwrap();
    let headers: Vec<String> = reader
        .headers()
        .unwrap()
        .iter()
        .map(|h| h.trim_start_matches('\u{feff}').to_owned())
        .collect();
    let col = |name: &str| headers.iter().position(|h| h == name).unwrap();
    let (order_id, customer, region, sales) = (
        col("Order ID"),
        col("Customer ID"),
        col("Region"),
        col("Sales"),
    );
    let mut first: HashMap<String, (String, String)> = HashMap::new();
    let mut revenue_by_region: BTreeMap<String, Decimal> = BTreeMap::new();
    for record in reader.records() {
        let record = record.unwrap();
        let (order_customer, order_region) = first
            .entry(record[order_id].to_owned())
            .or_insert_with(|| (record[customer].to_owned(), record[region].to_owned()))
            .clone();
        if order_customer != record[customer] {
            continue;
        }
        *revenue_by_region.entry(order_region).or_default() +=
            Decimal::from_str(&record[sales]).unwrap();
    }
    Expected {
        orders: first.len() as u64,
        revenue_by_region,
    }
}

/// Says why a test is skipped on the process's standard error, which `cargo test` shows
/// (unlike `eprintln!`, which the test harness captures).
pub fn skip(message: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "note: {message}");
}

pub fn require() -> bool {
    std::env::var("EVENTS_TEST_REQUIRE_SERVICES").as_deref() == Ok("1")
}

/// The example `name` built by this `cargo test` run (`target/<profile>/examples/<name>`).
/// Cargo gives no `CARGO_BIN_EXE_` for examples, and `cargo run` from a test would wait on
/// the lock the running `cargo test` holds.
pub fn example_binary(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe
        .parent()?
        .parent()?
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    bin.exists().then_some(bin)
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A child process killed when dropped (a failed assertion must not leave it running), and
/// the port it serves its metrics on (0: none).
pub struct Running(pub Option<Child>, pub u16);

impl Running {
    pub fn spawn(command: Command) -> Running {
        Running::spawn_serving(command, 0)
    }

    /// A process serving its metrics on `port`.
    pub fn spawn_serving(mut command: Command, port: u16) -> Running {
        Running(
            Some(
                command
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap(),
            ),
            port,
        )
    }

    /// SIGKILL: no destructor, no flush, no ack.
    pub fn kill(mut self) -> Output {
        let mut child = self.0.take().unwrap();
        child.kill().unwrap();
        child.wait_with_output().unwrap()
    }

    /// Waits for the process to end on its own.
    pub fn finish(mut self) -> Output {
        self.0.take().unwrap().wait_with_output().unwrap()
    }

    /// Waits for `until` (polled every 100 ms) and returns `true`, or `false` when the process
    /// ended first.
    pub fn wait_for(&mut self, what: &str, mut until: impl FnMut() -> bool) -> bool {
        let started = Instant::now();
        loop {
            if self.0.as_mut().unwrap().try_wait().unwrap().is_some() {
                return false;
            }
            if until() {
                return true;
            }
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "waited 5 minutes for {what}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The JSON of the last stdout line, `summary: {…}`, of a run that succeeded.
pub fn summary(what: &str, out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what} failed ({}): {}\n{stdout}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    let json = last
        .strip_prefix("summary: ")
        .unwrap_or_else(|| panic!("{what}: no summary line: {stdout}"));
    serde_json::from_str(json).unwrap()
}

pub fn count(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("summary lacks {key}: {v}"))
}

pub fn revenue(v: &Value) -> BTreeMap<String, Decimal> {
    serde_json::from_value(v["revenue_by_region"].clone()).unwrap()
}

/// `billing` invoiced every shipped order once, exactly, and dead-lettered nothing.
pub fn assert_billing_exact(what: &str, billing: &Value, orders: &Value, e: &Expected) {
    assert_eq!(count(billing, "invoices"), e.orders, "{what}: {billing}");
    assert_eq!(
        count(billing, "invoices"),
        count(orders, "orders_shipped"),
        "{what}: one invoice per shipped order"
    );
    assert_eq!(
        revenue(billing),
        revenue(orders),
        "{what}: revenue by region as orders reports it"
    );
    assert_eq!(
        revenue(billing),
        e.revenue_by_region,
        "{what}: revenue by region against the CSV"
    );
    assert_eq!(count(billing, "dead_lettered"), 0, "{what}: {billing}");
    assert_eq!(
        count(billing, "out_of_order"),
        0,
        "{what}: every handler saw each order's events in the producer's order: {billing}"
    );
}

//! `cargo run --release --example orders [-- --input PATH --redeliver-every N]`
//!
//! Replays the bundled Superstore orders (10,194 rows) through the `Order` aggregate and six
//! event handlers, prints report tables, and ends with one line `summary: {…}` (JSON).
//!
//! This binary is thin on purpose: the job lives in the `examples` library
//! (`examples/src/orders/`: `domain.rs` for the aggregate and events, `handlers.rs` for the
//! `#[event_handler]`s and their read models, `csv_input.rs`, `report.rs`), so that the tests
//! run exactly this code in-process.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use examples::orders::{self, report, Args};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let report = match orders::run(&args).await {
        Ok(report) => report,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut stdout = std::io::stdout().lock();
    let printed = write!(stdout, "{}", report::render(&report))
        .and_then(|()| writeln!(stdout, "{}", report.summary.line()))
        .and_then(|()| stdout.flush());
    if let Err(e) = printed {
        eprintln!("error: cannot write the report: {e}");
        return ExitCode::FAILURE;
    }
    if report.summary.handler_failures > 0 {
        eprintln!(
            "error: {} handler runs failed; the totals are incomplete (see \"Failed handler runs\")",
            report.summary.handler_failures
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

//! The standalone `events` operations tool: dead letter queue and outbox backlog of any
//! event-runtime database. It knows no application event types; for `catalog` and `check`,
//! embed [`event_runtime::cli::run`] in the application's binary.

use std::process::ExitCode;

use event_runtime::cli::{self, App};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    cli::run(std::env::args_os(), App::standalone()).await
}

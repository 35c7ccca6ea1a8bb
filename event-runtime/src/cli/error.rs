//! [`CliError`]: why a command failed, one level per variant, for the chain the tool prints.

use std::io;
use std::process::ExitCode;

use super::format::{self, join_ids, join_names};
use super::DATABASE_ENV;
use crate::store::StoreError;

/// Why a command failed. Its `Display` says what failed at this level and its `source()` why,
/// so that the tool prints the chain after `error: ` with each cause once.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CliError {
    /// No database was named.
    #[error("no database: pass --database URL (sqlite://PATH or postgres://USER@HOST/DB) or set {DATABASE_ENV}")]
    NoDatabase,
    /// Opening the outbox failed (the database refused the connection or a query): the
    /// source says why. Errors that name the database themselves (unreachable, no such file,
    /// no outbox tables) are [`CliError::Store`].
    #[error("cannot open database {url}")]
    Connect {
        /// The URL, password masked.
        url: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// Connecting took longer than `--connect-timeout`.
    #[error("no answer from the database at {url} within {secs} s (--connect-timeout)")]
    ConnectTimeout {
        /// The URL, password masked.
        url: String,
        /// The timeout.
        secs: u64,
    },
    /// A query failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The application's outbox refused ([`App::outbox`](super::App::outbox)): it could not be built, or a
    /// replay through its inbox core failed (a dead letter that still does not decode, a
    /// place still taken); nothing was replayed then.
    #[error(transparent)]
    Outbox(#[from] crate::OutboxError),
    /// No dead letter has this id.
    #[error("no dead letter with id {}", join_ids(.0, 20))]
    NotFound(Vec<i64>),
    /// A replay or purge over a selection failed part-way: the pages before the failure are
    /// done and audited; `dlq audit` shows the unfinished row and `dlq resume ID` finishes it.
    #[error("{doing} stopped part-way: what was done is kept and audited; finish it with `dlq resume ID`, ID being the unfinished row of `dlq audit`")]
    Interrupted {
        /// What it was doing (`replaying`, `purging`, `resuming`).
        doing: String,
        /// Why it stopped.
        #[source]
        source: StoreError,
    },
    /// `handler purge` or `handler retarget` failed part-way: the pages before the failure
    /// are done and audited; the same command run again finishes it under the same audit row.
    #[error("{doing} stopped part-way: what was done is kept and audited; run the same command again to finish it")]
    Unfinished {
        /// What it was doing (`handler purge OLD`).
        doing: String,
        /// Why it stopped.
        #[source]
        source: StoreError,
    },
    /// A `--handler`, `--event` or destination name that matches nothing and that nothing
    /// knows: probably a typo.
    #[error("{what} `{name}`: nothing in this outbox{} has that name; {known_what}: {}", if *.embedded { " or application" } else { "" }, join_names(.known))]
    UnknownName {
        /// What was looked for (`no dead letters of handler`, `no destination`).
        what: &'static str,
        /// The name given.
        name: String,
        /// Whether the application's registry was consulted too.
        embedded: bool,
        /// What the list of known names holds (`handlers with open dead letters`).
        known_what: &'static str,
        /// The names that would have matched something.
        known: Vec<String>,
    },
    /// The command needs the application's event types: the standalone binary has none.
    #[error("the standalone `{program}` binary knows no application event types: run `your-app events {command}` from your application's binary, which embeds event_runtime::cli::run")]
    NoRegistry {
        /// The program name.
        program: String,
        /// The command.
        command: &'static str,
    },
    /// NATS refused or could not be reached (`events nats …`, feature `nats`).
    #[cfg(feature = "nats")]
    #[error("NATS JetStream")]
    Nats(#[source] crate::transport::nats::NatsError),
    /// RabbitMQ refused or could not be reached (`events rabbitmq …`, feature `rabbitmq`).
    #[cfg(feature = "rabbitmq")]
    #[error("the RabbitMQ topology")]
    Rabbitmq(#[source] Box<crate::transport::rabbitmq::AmqpError>),
    /// The command was refused (an empty reason or actor, a bulk operation not confirmed).
    #[error("{0}")]
    Refused(String),
    /// `check` found pending deliveries or dead letters that this application cannot handle,
    /// or delivery rows the engine cannot read.
    #[error("{}", check_counts(*.pending, *.dead, *.unreadable, *.unknown_status))]
    CheckFailed {
        /// Pending deliveries that would fail.
        pending: usize,
        /// Open dead letters whose replay would fail.
        dead: usize,
        /// Pending deliveries whose row the engine cannot read
        /// ([`OutboxStats::unreadable`](crate::OutboxStats::unreadable)).
        unreadable: u64,
        /// Deliveries in a status this version does not know
        /// ([`OutboxStats::unknown_status`](crate::OutboxStats::unknown_status)).
        unknown_status: u64,
    },
    /// `asyncapi --check FILE` or `flow --check FILE`: the file is not what the command
    /// generates now (or cannot be read).
    #[error("{file} is not the {what} of this application{}: regenerate it with `{command} > {file}` and review the diff", .detail.as_ref().map(|d| format!(" ({d})")).unwrap_or_default())]
    OutOfDate {
        /// The file compared.
        file: String,
        /// What it should hold (`AsyncAPI document`, `flow`).
        what: &'static str,
        /// The command that writes it.
        command: String,
        /// The first difference, or why the file could not be read.
        detail: Option<String>,
    },
    /// Writing the output failed.
    #[error("writing output failed")]
    Output(#[from] io::Error),
}

fn check_counts(pending: usize, dead: usize, unreadable: u64, unknown_status: u64) -> String {
    let mut parts = Vec::new();
    if pending + dead > 0 {
        let p = format::count(pending as u64, "pending delivery", "pending deliveries");
        let d = format::count(dead as u64, "dead letter", "dead letters");
        parts.push(
            match (pending, dead) {
                (_, 0) => p,
                (0, _) => d,
                _ => format!("{p} and {d}"),
            } + " cannot be handled by this application",
        );
    }
    if unreadable > 0 {
        parts.push(format!(
            "the engine cannot read the row of {}",
            format::count(unreadable, "pending delivery", "pending deliveries")
        ));
    }
    if unknown_status > 0 {
        parts.push(format!(
            "{} in a status this version does not know",
            format::count(unknown_status, "delivery is", "deliveries are")
        ));
    }
    format!("{} (listed above)", parts.join("; "))
}

impl CliError {
    /// The process exit status for this error (1).
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::FAILURE
    }
}

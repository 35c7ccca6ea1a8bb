//! The `events` command line as clap types: commands, options, their help and the parsing of
//! times. Declares only: must not connect, print or decide anything.

use std::time::Duration;

use chrono::{DateTime, NaiveDate, NaiveTime, Utc};
use clap::{ArgGroup, Args, Parser, Subcommand};

/// The `events` command line. Parse it with [`run`](super::run) /
/// [`run_with_output`](super::run_with_output), or nest it in an application's own clap parser
/// (it implements [`clap::Args`]) and call [`execute`](super::execute).
#[derive(Debug, Parser)]
#[command(
    name = "events",
    version,
    about = "Operate the transactional outbox: dead letter queue, backlog, handlers, event catalog.",
    propagate_version = true
)]
pub struct Cli {
    /// Database URL: sqlite://PATH or postgres://USER@HOST/DB [env: EVENTS_DATABASE_URL]
    #[arg(long, global = true, value_name = "URL")]
    pub(super) database: Option<String>,
    /// PostgreSQL schema holding the outbox tables, when the application keeps them in one
    #[arg(long, global = true, value_name = "NAME")]
    pub(super) schema: Option<String>,
    /// Give up connecting after this many seconds
    #[arg(long, global = true, value_name = "SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub(super) connect_timeout: u64,
    #[command(subcommand)]
    pub(super) command: Command,
}

impl Cli {
    pub(super) fn connect_timeout(&self) -> Duration {
        Duration::from_secs(self.connect_timeout)
    }
}

#[derive(Debug, Subcommand)]
pub(super) enum Command {
    /// The dead letter queue: list, show, replay, purge, audit log
    #[command(subcommand)]
    Dlq(Dlq),
    /// The outbox backlog
    #[command(subcommand)]
    Outbox(OutboxCommand),
    /// Destinations (handlers): list with their counts and pauses, pause, resume; purge or
    /// re-target what a removed handler left
    #[command(subcommand)]
    Handler(HandlerCommand),
    /// The application's event types: name, version, Rust type, handlers and JSON Schema
    /// (embedded only)
    Catalog {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Check that every pending delivery and dead letter can be decoded by this application
    /// (embedded only; needs --database)
    Check,
    /// The AsyncAPI 3.0.0 document of the application's events, relays, inboxes and handlers,
    /// as JSON (embedded only)
    Asyncapi {
        /// Compare with FILE instead of printing, and fail when it differs (for CI)
        #[arg(long, value_name = "FILE")]
        check: Option<std::path::PathBuf>,
    },
    /// The event flow as a Mermaid flowchart: aggregate -> event -> handlers, relays and
    /// subjects, inboxes (embedded only). With --database (or EVENTS_DATABASE_URL), each
    /// handler, relay and inbox shows its backlog, dead letters, held events and gaps
    Flow {
        /// Compare the picture without counts with FILE instead of printing, and fail when it
        /// differs (for CI)
        #[arg(long, value_name = "FILE")]
        check: Option<std::path::PathBuf>,
    },
    /// Received events: the gaps in their aggregates' chains, re-fetching and accepting them
    #[command(subcommand)]
    Inbox(super::gaps::InboxCommand),
    /// Relays: publish again what a broker lost
    #[command(subcommand)]
    Relay(super::relay::RelayCommand),
    /// NATS JetStream: the stream (create, check, repartition), an inbox's identity, a group
    /// of inbox instances (feature `nats`)
    #[cfg(feature = "nats")]
    #[command(subcommand)]
    Nats(super::nats::NatsCommand),
    /// RabbitMQ: the exchange and a consuming service's partition queues (feature `rabbitmq`)
    #[cfg(feature = "rabbitmq")]
    #[command(subcommand)]
    Rabbitmq(super::rabbitmq::RabbitmqCommand),
}

#[derive(Debug, Subcommand)]
pub(super) enum Dlq {
    /// List dead letters, oldest first
    List(ListArgs),
    /// Show one dead letter: every field, the error chain and the original envelope (its
    /// payload only with --payload)
    Show {
        /// Dead letter id
        id: i64,
        /// Print JSON
        #[arg(long)]
        json: bool,
        /// Print the payload, with the fields marked sensitive masked as "***"
        #[arg(long)]
        payload: bool,
    },
    /// Deliver dead letters again: same event id, attempts reset, audited
    Replay(ResolveArgs),
    /// Give up on dead letters, audited: later events of their aggregate flow
    Purge(ResolveArgs),
    /// Finish a replay or purge that was interrupted (its audit row has no finish time)
    Resume {
        /// The operation's audit id (`dlq audit` lists it as unfinished)
        audit_id: i64,
    },
    /// Show the audit log (replays, purges, pauses, resumes), newest first
    Audit {
        /// Print JSON
        #[arg(long)]
        json: bool,
        /// At most this many entries
        #[arg(long, value_name = "N", default_value_t = 50,
              value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
    },
}

#[derive(Debug, Args)]
pub(super) struct ListArgs {
    /// Print JSON
    #[arg(long)]
    pub(super) json: bool,
    /// With --json: keep each envelope's payload, with the fields marked sensitive masked
    /// as "***" (without it, `data` is "***")
    #[arg(long, requires = "json")]
    pub(super) payload: bool,
    /// Only this handler
    #[arg(long, value_name = "H")]
    pub(super) handler: Option<String>,
    /// Only this event name
    #[arg(long, value_name = "NAME")]
    pub(super) event: Option<String>,
    /// Dead-lettered at or after (RFC 3339 or YYYY-MM-DD)
    #[arg(long, value_name = "RFC3339", value_parser = parse_time)]
    pub(super) since: Option<DateTime<Utc>>,
    /// Dead-lettered before (RFC 3339 or YYYY-MM-DD)
    #[arg(long, value_name = "RFC3339", value_parser = parse_time)]
    pub(super) until: Option<DateTime<Utc>>,
    /// Include replayed and purged dead letters
    #[arg(long)]
    pub(super) all: bool,
    /// At most this many (1 or more)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) limit: Option<u32>,
}

#[derive(Debug, Args)]
#[command(group(
    ArgGroup::new("selector")
        .required(true)
        .multiple(true)
        .args(["ids", "all", "handler", "event"])
))]
pub(super) struct ResolveArgs {
    /// Dead letter ids
    #[arg(value_name = "ID", conflicts_with_all = ["all", "handler", "event"])]
    pub(super) ids: Vec<i64>,
    /// Every open dead letter
    #[arg(long, conflicts_with_all = ["handler", "event"])]
    pub(super) all: bool,
    /// Every open dead letter of this handler
    #[arg(long, value_name = "H")]
    pub(super) handler: Option<String>,
    /// Every open dead letter of this event name
    #[arg(long, value_name = "NAME")]
    pub(super) event: Option<String>,
    /// Why: written to the audit log
    #[arg(long, value_name = "TEXT")]
    pub(super) reason: String,
    /// Who: written to the audit log [default: your login name: $USER, $LOGNAME, $USERNAME]
    #[arg(long, value_name = "WHO")]
    pub(super) actor: Option<String>,
    /// Do not ask for confirmation of --all / --handler / --event
    #[arg(long, short = 'y')]
    pub(super) yes: bool,
}

#[derive(Debug, Subcommand)]
pub(super) enum OutboxCommand {
    /// Backlog, oldest pending age, per-handler counts, dead letters, pauses
    Stats {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum HandlerCommand {
    /// Every destination with its pending, completed and dead deliveries and its pauses
    List {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Pause a destination, audited: no worker of any process claims its deliveries
    ///
    /// Until `handler resume`, no worker of any process claims the destination's deliveries;
    /// deliveries already claimed finish, and no attempt is used. The pause and the actor are
    /// written to the audit log (`dlq audit`). Refused for an `in_transaction` handler
    /// (embedded): it has no deliveries to hold back.
    Pause {
        /// The destination (handler) name
        name: String,
        /// Why: shown by `handler list` and written to the audit log
        #[arg(long, value_name = "TEXT")]
        reason: String,
        /// Who: written to the audit log [default: your login name]
        #[arg(long, value_name = "WHO")]
        actor: Option<String>,
        /// Pause a name that no delivery, dead letter or registered handler has (yet)
        #[arg(long)]
        force: bool,
    },
    /// Lift the operator's pause of a destination, audited
    ///
    /// A pause the runtime set itself (a destination reported unavailable) stays until the
    /// runtime lifts it or it lapses.
    Resume {
        /// The destination (handler) name
        name: String,
        /// Why: written to the audit log
        #[arg(long, value_name = "TEXT", default_value = "resumed")]
        reason: String,
        /// Who: written to the audit log [default: your login name]
        #[arg(long, value_name = "WHO")]
        actor: Option<String>,
    },
    /// Give up on what a handler that no longer exists left, audited (embedded only)
    ///
    /// Its pending deliveries are marked purged and its open dead letters resolved as purged,
    /// in pages, with one audit row (`dlq audit`): those events never reach it. Says how many
    /// and asks for confirmation on a terminal; otherwise needs --yes. Refused for a handler
    /// of this application (its workers would race the purge), for a transport's relay (a
    /// name `TRANSPORT:…` such as `nats:orders`, whose pending deliveries are events not yet
    /// published) unless --force-relay, and while a live worker of any process holds one of
    /// its deliveries. Interrupted, run it again: it finishes under the same audit row.
    Purge {
        /// The handler that no longer exists
        name: String,
        /// Why: written to the audit log [default: no longer registered]
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
        /// Who: written to the audit log [default: your login name]
        #[arg(long, value_name = "WHO")]
        actor: Option<String>,
        /// Do not ask for confirmation
        #[arg(long, short = 'y')]
        yes: bool,
        /// Purge a transport's relay too: its unpublished events never reach the consumers
        #[arg(long)]
        force_relay: bool,
    },
    /// Move what a handler that no longer exists left onto a handler of this application,
    /// audited (embedded only)
    ///
    /// Its pending deliveries join the new handler's runs per aggregate in sequence order
    /// (due now, attempts reset), its open dead letters move with their deliveries and can be
    /// replayed to the new handler; a delivery of an event the new handler already has is
    /// dropped as a duplicate. In pages, with one audit row. Says how many and asks for
    /// confirmation on a terminal; otherwise needs --yes. Refused for an old handler of this
    /// application, a new one it does not have, a transport's relay (`nats:orders`: its
    /// events would go to the handler instead of being published) unless --force-relay, and
    /// while a live worker holds a delivery of the old one. Interrupted, run it again: it
    /// finishes under the same audit row.
    Retarget {
        /// The handler that no longer exists
        name: String,
        /// The handler of this application that takes over its deliveries
        #[arg(long, value_name = "HANDLER")]
        to: String,
        /// Why: written to the audit log [default: replaced by HANDLER]
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
        /// Who: written to the audit log [default: your login name]
        #[arg(long, value_name = "WHO")]
        actor: Option<String>,
        /// Do not ask for confirmation
        #[arg(long, short = 'y')]
        yes: bool,
        /// Re-target a transport's relay too: its unpublished events are never published
        #[arg(long)]
        force_relay: bool,
    },
}

pub(super) fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    if let Ok(d) = NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Ok(d.and_time(NaiveTime::MIN).and_utc());
    }
    Err("expected an RFC 3339 time such as 2026-01-31T12:00:00Z, or a date such as 2026-01-31 (midnight UTC)".into())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;
    use crate::cli::format::time;

    #[test]
    fn times() {
        assert_eq!(
            time(parse_time("2026-01-31").unwrap()),
            "2026-01-31T00:00:00Z"
        );
        assert_eq!(
            time(parse_time("2026-01-31T13:00:00+01:00").unwrap()),
            "2026-01-31T12:00:00Z"
        );
        assert!(parse_time("yesterday").is_err());
    }

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}

//! The `events` operations tool: the dead letter queue, the outbox backlog and (when embedded in
//! an application) its event catalog. Reads and resolves through [`Store`]; writes no SQL itself.
//!
//! # Commands
//!
//! ```text
//! events [--database URL] [--schema NAME] <command>
//!
//!   dlq list   [--json] [--handler H] [--event NAME] [--since T] [--until T] [--all] [--limit N]
//!   dlq show   ID [--json]
//!   dlq replay (ID... | --all | --handler H | --event NAME) --reason TEXT [--actor WHO] [--yes]
//!   dlq purge  (ID... | --all | --handler H | --event NAME) --reason TEXT [--actor WHO] [--yes]
//!   dlq audit  [--json] [--limit N]
//!   outbox stats [--json]
//!   catalog [--json]      (embedded only: the application's event types)
//!   check                 (embedded only: every pending delivery decodes)
//! ```
//!
//! - `--database URL` (or `EVENTS_DATABASE_URL`) names the store: `sqlite://PATH` or
//!   `postgres://USER@HOST/DB` (the latter needs the `postgres` feature). The tool refuses an
//!   SQLite path that does not exist rather than create an empty database, and applies pending
//!   migrations as the application does at start-up. `--schema NAME` selects the PostgreSQL
//!   schema of an application that uses [`Store::connect_postgres_schema`].
//! - Times (`--since`, `--until`) are RFC 3339 (`2026-01-31T12:00:00Z`) or a date
//!   (`2026-01-31`, midnight UTC); `--since` is inclusive, `--until` exclusive.
//! - `dlq list` shows open dead letters (`--all` adds replayed and purged ones), oldest first.
//!   `--json` prints [`DeadLetter`]s; the `envelope` field is the original envelope text,
//!   byte for byte (`jq '.[].envelope | fromjson'`).
//! - `dlq replay` makes each selected delivery due again with its attempts reset and the same
//!   event id; `dlq purge` gives up on them, so that later events of their aggregate flow.
//!   Both need `--reason`; the actor defaults to `$USER`. Selecting by `--all`, `--handler` or
//!   `--event` asks for confirmation on a terminal and otherwise needs `--yes`; naming ids
//!   does not. An unknown id is an error and nothing is changed.
//! - A replay or purge is one transaction with one audit row (who, when, why, which dead
//!   letters: `dlq audit`), however many rows it touches
//!   ([`Store::resolve_dead_letters_with_progress`]): it applies entirely or not at all, and the
//!   audit log has one entry per operation. On a terminal, more than 50 rows show a progress
//!   bar. On SQLite the transaction holds the write lock until it ends; split a very large
//!   replay with `--handler` / `--event` if workers must not wait for it.
//! - `outbox stats` prints [`OutboxStats`]: events in the outbox, the pending backlog (and how
//!   much of it waits behind a dead letter of its aggregate) and its oldest age in seconds,
//!   open dead letters, per-handler counts.
//!
//! Errors print one line, `error: …`, on standard error and exit with status 1; a command line
//! clap rejects exits with status 2.
//!
//! # Embedding
//!
//! The standalone `events` binary of this crate knows no event types of yours, so `catalog` and
//! `check` only work from your application's own binary, which links them in. Route one
//! sub-command to [`run`]:
//!
//! ```no_run
//! use std::process::ExitCode;
//! use event_runtime::cli::{self, App};
//! use event_runtime::Registry;
//!
//! #[tokio::main]
//! async fn main() -> ExitCode {
//!     let args: Vec<String> = std::env::args().collect();
//!     if args.get(1).map(String::as_str) == Some("events") {
//!         let registry = match Registry::from_inventory().build() {
//!             Ok(registry) => registry,
//!             Err(e) => {
//!                 eprintln!("error: {e}");
//!                 return ExitCode::FAILURE;
//!             }
//!         };
//!         let app = App::embedded("orders events", &registry).default_database("sqlite://orders.db");
//!         // `events` takes the place of the program name: `orders events dlq list` runs
//!         // `dlq list`, and help shows `Usage: orders events …`.
//!         return cli::run(args.into_iter().skip(1), app).await;
//!     }
//!     // … the application itself.
//!     ExitCode::SUCCESS
//! }
//! ```
//!
//! An application with its own clap parser can instead nest [`Cli`] as a sub-command
//! (`Events(event_runtime::cli::Cli)`, same clap major version) and call [`execute`].
//!
//! [`run_with_output`] writes to any [`Write`], for tests and for tools that capture the output:
//!
//! ```
//! use event_runtime::cli::{run_with_output, App};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // The application created its outbox (the tool itself never creates or migrates one).
//! let path = std::env::temp_dir().join(format!("events-cli-doc-{}.db", std::process::id()));
//! let url = format!("sqlite://{}", path.display());
//! event_runtime::Store::connect(&url).await.unwrap();
//!
//! let (mut out, mut err) = (Vec::new(), Vec::new());
//! let args = ["events", "--database", url.as_str(), "outbox", "stats", "--json"];
//! let code = run_with_output(args, App::standalone(), &mut out, &mut err).await;
//! assert_eq!(code, std::process::ExitCode::SUCCESS);
//! let stats: serde_json::Value = serde_json::from_slice(&out).unwrap();
//! assert_eq!(stats["pending"], 0);
//! # std::fs::remove_file(path).ok();
//! # }
//! ```

use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::{self, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, NaiveTime, SecondsFormat, Utc};
use clap::{ArgGroup, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use event_core::RawEnvelope;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::dispatch::registry::Registry;
use crate::store::{
    AuditEntry, ConnectOptions, DeadLetter, DeadLetterFilter, OutboxStats, Resolution, Store,
    StoreError,
};

/// The environment variable read when `--database` is not given.
pub const DATABASE_ENV: &str = "EVENTS_DATABASE_URL";

/// More rows than this show a progress bar (on a terminal).
const PROGRESS_THRESHOLD: usize = 50;

/// How long connecting may take before the tool gives up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// The program the commands run in: its name (shown in help and messages) and, when embedded
/// in an application, its [`Registry`] of event types.
#[derive(Debug, Clone, Copy)]
pub struct App<'a> {
    name: &'a str,
    registry: Option<&'a Registry>,
    default_database: Option<&'a str>,
}

impl<'a> App<'a> {
    /// The standalone `events` binary: no application event types.
    pub fn standalone() -> Self {
        App {
            name: "events",
            registry: None,
            default_database: None,
        }
    }

    /// Embedded in an application whose event types are `registry`, invoked as `name`
    /// (`"orders events"`).
    pub fn embedded(name: &'a str, registry: &'a Registry) -> Self {
        App {
            name,
            registry: Some(registry),
            default_database: None,
        }
    }

    /// The database used when neither `--database` nor `EVENTS_DATABASE_URL` is given (the
    /// application's own default).
    pub fn default_database(mut self, url: &'a str) -> Self {
        self.default_database = Some(url);
        self
    }

    /// The program name shown in help.
    pub fn name(&self) -> &str {
        self.name
    }

    /// The application's event types, when embedded.
    pub fn registry(&self) -> Option<&'a Registry> {
        self.registry
    }
}

/// Why a command failed. Its `Display` is the one-line message the tool prints after
/// `error: `.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CliError {
    /// No database was named.
    #[error("no database: pass --database URL (sqlite://PATH or postgres://USER@HOST/DB) or set {DATABASE_ENV}")]
    NoDatabase,
    /// Opening the outbox failed (the database is unreachable, does not exist, or holds no
    /// outbox): the source says why.
    #[error("cannot open database {url}")]
    Connect {
        /// The URL, password masked.
        url: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// Connecting took too long.
    #[error("cannot open database {url}: no answer within {secs} s")]
    ConnectTimeout {
        /// The URL, password masked.
        url: String,
        /// The timeout.
        secs: u64,
    },
    /// A query failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No dead letter has this id.
    #[error("no dead letter with id {}", join_ids(.0, 20))]
    NotFound(Vec<i64>),
    /// The command needs the application's event types: the standalone binary has none.
    #[error("the standalone `{program}` binary knows no application event types: run `your-app events {command}` from your application's binary, which embeds event_runtime::cli::run")]
    NoRegistry {
        /// The program name.
        program: String,
        /// The command.
        command: &'static str,
    },
    /// The command was refused (an empty reason, a bulk operation not confirmed).
    #[error("{0}")]
    Refused(String),
    /// `check` found pending deliveries that this application cannot handle.
    #[error("{0} pending deliveries cannot be handled by this application (listed above)")]
    CheckFailed(usize),
    /// Writing the output failed.
    #[error("writing output failed")]
    Output(#[from] io::Error),
}

impl CliError {
    /// The process exit status for this error (1).
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::FAILURE
    }
}

/// The `events` command line. Parse it with [`run`] / [`run_with_output`], or nest it in an
/// application's own clap parser (it implements [`clap::Args`]) and call [`execute`].
#[derive(Debug, Parser)]
#[command(
    name = "events",
    version,
    about = "Operate the transactional outbox: dead letter queue, backlog, event catalog.",
    propagate_version = true
)]
pub struct Cli {
    /// Database URL: sqlite://PATH or postgres://USER@HOST/DB [env: EVENTS_DATABASE_URL]
    #[arg(long, global = true, value_name = "URL")]
    database: Option<String>,
    /// PostgreSQL schema holding the outbox tables, when the application keeps them in one
    #[arg(long, global = true, value_name = "NAME")]
    schema: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The dead letter queue: list, show, replay, purge, audit log
    #[command(subcommand)]
    Dlq(Dlq),
    /// The outbox backlog
    #[command(subcommand)]
    Outbox(OutboxCommand),
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
}

#[derive(Debug, Subcommand)]
enum Dlq {
    /// List dead letters, oldest first
    List(ListArgs),
    /// Show one dead letter: every field, the error chain and the original envelope
    Show {
        /// Dead letter id
        id: i64,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Deliver dead letters again: same event id, attempts reset, audited
    Replay(ResolveArgs),
    /// Give up on dead letters, audited: later events of their aggregate flow
    Purge(ResolveArgs),
    /// Show the audit log of replays and purges, newest first
    Audit {
        /// Print JSON
        #[arg(long)]
        json: bool,
        /// At most this many entries
        #[arg(long, value_name = "N", default_value_t = 50)]
        limit: u32,
    },
}

#[derive(Debug, Args)]
struct ListArgs {
    /// Print JSON
    #[arg(long)]
    json: bool,
    /// Only this handler
    #[arg(long, value_name = "H")]
    handler: Option<String>,
    /// Only this event name
    #[arg(long, value_name = "NAME")]
    event: Option<String>,
    /// Dead-lettered at or after (RFC 3339 or YYYY-MM-DD)
    #[arg(long, value_name = "RFC3339", value_parser = parse_time)]
    since: Option<DateTime<Utc>>,
    /// Dead-lettered before (RFC 3339 or YYYY-MM-DD)
    #[arg(long, value_name = "RFC3339", value_parser = parse_time)]
    until: Option<DateTime<Utc>>,
    /// Include replayed and purged dead letters
    #[arg(long)]
    all: bool,
    /// At most this many
    #[arg(long, value_name = "N")]
    limit: Option<u32>,
}

#[derive(Debug, Args)]
#[command(group(
    ArgGroup::new("selector")
        .required(true)
        .multiple(true)
        .args(["ids", "all", "handler", "event"])
))]
struct ResolveArgs {
    /// Dead letter ids
    #[arg(value_name = "ID", conflicts_with_all = ["all", "handler", "event"])]
    ids: Vec<i64>,
    /// Every open dead letter
    #[arg(long, conflicts_with_all = ["handler", "event"])]
    all: bool,
    /// Every open dead letter of this handler
    #[arg(long, value_name = "H")]
    handler: Option<String>,
    /// Every open dead letter of this event name
    #[arg(long, value_name = "NAME")]
    event: Option<String>,
    /// Why: written to the audit log
    #[arg(long, value_name = "TEXT")]
    reason: String,
    /// Who: written to the audit log [default: $USER]
    #[arg(long, value_name = "WHO")]
    actor: Option<String>,
    /// Do not ask for confirmation of --all / --handler / --event
    #[arg(long, short = 'y')]
    yes: bool,
}

#[derive(Debug, Subcommand)]
enum OutboxCommand {
    /// Backlog, oldest pending age, per-handler counts, dead letters
    Stats {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
}

/// Where output goes, and what the terminal allows.
struct Io<'w> {
    out: &'w mut (dyn Write + Send),
    err: &'w mut (dyn Write + Send),
    /// Draw progress bars on the process's standard error.
    progress: bool,
    /// Ask for confirmation on the process's standard input.
    prompt: bool,
}

/// Parses `args` (the first item is the program name, as in [`std::env::args_os`]) and runs the
/// command on standard output and standard error. Returns the exit status: 0, 1 when the
/// command failed (the message is printed), 2 when the command line is wrong.
///
/// On a terminal, bulk replays and purges ask for confirmation and long ones show a progress
/// bar.
pub async fn run<I, T>(args: I, app: App<'_>) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut out = io::stdout();
    let mut err = io::stderr();
    let terminal = io::stderr().is_terminal();
    let mut io = Io {
        out: &mut out,
        err: &mut err,
        progress: terminal,
        prompt: terminal && io::stdin().is_terminal(),
    };
    let color = Color {
        out: io::stdout().is_terminal(),
        err: terminal,
    };
    run_io(args, app, &mut io, color).await
}

/// As [`run`], writing to `out` and `err` instead: never prompts (bulk operations need
/// `--yes`) and draws no progress bar.
pub async fn run_with_output<I, T>(
    args: I,
    app: App<'_>,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut io = Io {
        out,
        err,
        progress: false,
        prompt: false,
    };
    run_io(args, app, &mut io, Color::default()).await
}

/// Whether clap's help and errors may use colour on each stream (only on a terminal).
#[derive(Default)]
struct Color {
    out: bool,
    err: bool,
}

async fn run_io<I, T>(args: I, app: App<'_>, io: &mut Io<'_>, color: Color) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let parsed = Cli::command()
        .bin_name(app.name)
        .try_get_matches_from(args)
        .and_then(|m| Cli::from_arg_matches(&m));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => {
            let rendered = e.render();
            let (stream, color) = if e.use_stderr() {
                (&mut *io.err, color.err)
            } else {
                (&mut *io.out, color.out)
            };
            let text = if color {
                rendered.ansi().to_string()
            } else {
                rendered.to_string()
            };
            let _ = stream.write_all(text.as_bytes());
            let _ = stream.flush();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let result = execute_io(cli, app, io).await;
    let _ = io.out.flush();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `events dlq list | head`: the reader has gone, which is not a failure.
        Err(CliError::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(io.err, "error: {}", event_core::ErrorChain(&e));
            let _ = io.err.flush();
            e.exit_code()
        }
    }
}

/// Runs an already parsed command line (for applications that nest [`Cli`] in their own
/// parser), writing to `out` and `err` as [`run_with_output`] does.
///
/// # Errors
/// Every failure of the command, as a [`CliError`]; nothing has been printed about it.
pub async fn execute(
    cli: Cli,
    app: App<'_>,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let mut io = Io {
        out,
        err,
        progress: false,
        prompt: false,
    };
    execute_io(cli, app, &mut io).await
}

async fn execute_io(cli: Cli, app: App<'_>, io: &mut Io<'_>) -> Result<(), CliError> {
    let target = Target {
        database: cli.database,
        schema: cli.schema,
        default: app.default_database,
    };
    match cli.command {
        Command::Dlq(Dlq::List(args)) => dlq_list(&target.connect().await?, args, io).await,
        Command::Dlq(Dlq::Show { id, json }) => {
            dlq_show(&target.connect().await?, id, json, io).await
        }
        Command::Dlq(Dlq::Replay(args)) => resolve(&target, Resolution::Replay, args, io).await,
        Command::Dlq(Dlq::Purge(args)) => resolve(&target, Resolution::Purge, args, io).await,
        Command::Dlq(Dlq::Audit { json, limit }) => {
            let entries = target.connect().await?.audit_log(limit).await?;
            print_audit(&entries, json, io)
        }
        Command::Outbox(OutboxCommand::Stats { json }) => {
            let stats = target.connect().await?.stats().await?;
            print_stats(&stats, json, io)
        }
        Command::Catalog { json } => {
            let registry = app.registry.ok_or_else(|| no_registry(&app, "catalog"))?;
            print_catalog(registry, json, io)
        }
        Command::Check => {
            let registry = app.registry.ok_or_else(|| no_registry(&app, "check"))?;
            check(&target.connect().await?, registry, io).await
        }
    }
}

fn no_registry(app: &App<'_>, command: &'static str) -> CliError {
    CliError::NoRegistry {
        program: app.name.to_owned(),
        command,
    }
}

// ---- connecting ------------------------------------------------------------------------------

struct Target<'a> {
    database: Option<String>,
    schema: Option<String>,
    default: Option<&'a str>,
}

impl Target<'_> {
    async fn connect(&self) -> Result<Store, CliError> {
        let url = match &self.database {
            Some(url) => url.clone(),
            None => match std::env::var(DATABASE_ENV) {
                Ok(url) if !url.is_empty() => url,
                _ => self.default.ok_or(CliError::NoDatabase)?.to_owned(),
            },
        };
        let shown = redact(&url);
        // Operations never create or migrate anything: a mistyped URL or schema is an error,
        // not an empty outbox.
        let mut options = ConnectOptions::default()
            .create(false)
            .connect_timeout(CONNECT_TIMEOUT);
        options.schema = self.schema.clone();
        match tokio::time::timeout(CONNECT_TIMEOUT, Store::connect_with(&url, &options)).await {
            Ok(Ok(store)) => Ok(store),
            Ok(Err(source)) => Err(CliError::Connect { url: shown, source }),
            Err(_) => Err(CliError::ConnectTimeout {
                url: shown,
                secs: CONNECT_TIMEOUT.as_secs(),
            }),
        }
    }
}

/// The URL with its password masked, for messages.
fn redact(url: &str) -> String {
    crate::store::redact(url)
}

// ---- dlq list / show -------------------------------------------------------------------------

async fn dlq_list(store: &Store, args: ListArgs, io: &mut Io<'_>) -> Result<(), CliError> {
    if let (Some(since), Some(until)) = (args.since, args.until) {
        if since >= until {
            return Err(CliError::Refused(format!(
                "--since ({}) is not before --until ({})",
                time(since),
                time(until)
            )));
        }
    }
    let filter = DeadLetterFilter {
        handler: args.handler,
        event_name: args.event,
        since: args.since,
        until: args.until,
        include_resolved: args.all,
        limit: args.limit,
        ..DeadLetterFilter::default()
    };
    let letters = store.dead_letters(&filter).await?;
    if args.json {
        return print_json(&letters, io);
    }
    if letters.is_empty() {
        let what = if args.all {
            "dead letters"
        } else {
            "open dead letters"
        };
        writeln!(io.out, "no {what}")?;
        return Ok(());
    }
    let mut header = vec!["ID"];
    if args.all {
        header.push("STATUS");
    }
    header.extend([
        "EVENT",
        "EVENT ID",
        "HANDLER",
        "ATTEMPTS",
        "REASON",
        "LAST ERROR",
        "DEAD AT",
    ]);
    let mut table = Table::new(&header, &["ID", "ATTEMPTS"]);
    for d in &letters {
        let mut row = vec![d.id.to_string()];
        if args.all {
            row.push(status(d).to_owned());
        }
        row.extend([
            format!("{} v{}", d.event_name, d.event_version),
            d.event_id.to_string(),
            d.handler.clone(),
            d.attempts.to_string(),
            d.reason.to_string(),
            truncate(&one_line(&d.error_chain.join(": ")), 60),
            time(d.dead_at),
        ]);
        table.row(row);
    }
    table.write(io.out)?;
    Ok(())
}

async fn dlq_show(store: &Store, id: i64, json: bool, io: &mut Io<'_>) -> Result<(), CliError> {
    let d = store
        .dead_letter_by_id(id)
        .await?
        .ok_or_else(|| CliError::NotFound(vec![id]))?;
    if json {
        return print_json(&d, io);
    }
    let mut s = String::new();
    let _ = writeln!(s, "dead letter {} ({})", d.id, status(&d));
    let mut field = |k: &str, v: &str| {
        let _ = writeln!(s, "  {k:<14}{v}");
    };
    field("event", &format!("{} v{}", d.event_name, d.event_version));
    field("event id", &d.event_id.to_string());
    field("handler", &d.handler);
    field("attempts", &d.attempts.to_string());
    field("reason", d.reason.as_str());
    field("first failed", &time_ms(d.first_failed_at));
    field("last failed", &time_ms(d.last_failed_at));
    field("dead at", &time_ms(d.dead_at));
    if let Some(at) = d.resolved_at {
        let how = d.resolution.as_deref().unwrap_or("resolved");
        field("resolved", &format!("{how} at {}", time_ms(at)));
    }
    let _ = writeln!(s, "error chain:");
    if d.error_chain.is_empty() {
        let _ = writeln!(s, "  (empty)");
    }
    for (i, e) in d.error_chain.iter().enumerate() {
        let label = if i == 0 { "error" } else { "caused by" };
        let _ = writeln!(s, "  {label}: {e}");
    }
    let _ = writeln!(s, "envelope:");
    let pretty = serde_json::from_str::<serde_json::Value>(&d.envelope)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok());
    match pretty {
        Some(p) => {
            for line in p.lines() {
                let _ = writeln!(s, "  {line}");
            }
        }
        // Not JSON (a foreign or corrupted row): show it as stored.
        None => {
            let _ = writeln!(s, "  {}", d.envelope);
        }
    }
    io.out.write_all(s.as_bytes())?;
    Ok(())
}

fn status(d: &DeadLetter) -> &str {
    match (&d.resolved_at, &d.resolution) {
        (None, _) => "open",
        (Some(_), Some(r)) => r,
        (Some(_), None) => "resolved",
    }
}

// ---- dlq replay / purge ----------------------------------------------------------------------

async fn resolve(
    target: &Target<'_>,
    action: Resolution,
    args: ResolveArgs,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let (verb, doing, done) = match action {
        Resolution::Replay => ("replay", "replaying", "replayed"),
        Resolution::Purge => ("purge", "purging", "purged"),
    };
    let reason = args.reason.trim();
    if reason.is_empty() {
        return Err(CliError::Refused(format!(
            "--reason must say why: it is written to the audit log; nothing was {done}"
        )));
    }
    let actor = args.actor.clone().unwrap_or_else(default_actor);
    let store = target.connect().await?;

    let ids = if args.ids.is_empty() {
        let filter = DeadLetterFilter {
            handler: args.handler.clone(),
            event_name: args.event.clone(),
            ..DeadLetterFilter::default()
        };
        let ids: Vec<i64> = store
            .dead_letters(&filter)
            .await?
            .iter()
            .map(|d| d.id)
            .collect();
        if ids.is_empty() {
            writeln!(io.out, "no open dead letters match; nothing {done}")?;
            return Ok(());
        }
        if !args.yes {
            let selection = selection(&args);
            let question = format!("{verb} {} dead letters ({selection})?", ids.len());
            if !confirm(&question, io)? {
                return Err(CliError::Refused(if io.prompt {
                    format!("not confirmed; nothing was {done}")
                } else {
                    format!("{question} Pass --yes to confirm; nothing was {done}")
                }));
            }
        }
        ids
    } else {
        let mut ids = args.ids.clone();
        ids.sort_unstable();
        ids.dedup();
        let mut open = Vec::with_capacity(ids.len());
        let mut missing = Vec::new();
        for id in ids {
            match store.dead_letter_by_id(id).await? {
                None => missing.push(id),
                Some(d) if d.resolved_at.is_some() => {
                    writeln!(
                        io.err,
                        "warning: dead letter {id} was already {} at {}; skipped",
                        d.resolution.as_deref().unwrap_or("resolved"),
                        d.resolved_at.map(time).unwrap_or_default()
                    )?;
                }
                Some(_) => open.push(id),
            }
        }
        if !missing.is_empty() {
            return Err(CliError::NotFound(missing));
        }
        if open.is_empty() {
            writeln!(
                io.out,
                "nothing {done}: no open dead letter among those ids"
            )?;
            return Ok(());
        }
        open
    };

    let bar = if io.progress && ids.len() > PROGRESS_THRESHOLD {
        let style = ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        let bar =
            ProgressBar::with_draw_target(Some(ids.len() as u64), ProgressDrawTarget::stderr());
        bar.set_style(style);
        bar.set_message(doing);
        Some(bar)
    } else {
        None
    };
    let ticker = bar.clone();
    let entry = store
        .resolve_dead_letters_with_progress(&ids, action, &actor, reason, move |n| {
            if let Some(bar) = &ticker {
                bar.set_position(n as u64);
            }
        })
        .await;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let entry = entry?;
    let skipped = ids.len() - entry.dead_letter_ids.len();
    writeln!(
        io.out,
        "{done} {} dead letter{}: {}",
        entry.count,
        if entry.count == 1 { "" } else { "s" },
        join_ids(&entry.dead_letter_ids, 20)
    )?;
    if skipped > 0 {
        writeln!(
            io.out,
            "skipped {skipped} that another operation resolved in the meantime"
        )?;
    }
    writeln!(
        io.out,
        "audit #{}: {} by {} at {}: {}",
        entry.id,
        entry.action,
        entry.actor,
        time(entry.at),
        entry.reason
    )?;
    Ok(())
}

fn selection(args: &ResolveArgs) -> String {
    let mut parts = Vec::new();
    if args.all {
        parts.push("all open".to_owned());
    }
    if let Some(h) = &args.handler {
        parts.push(format!("handler {h}"));
    }
    if let Some(e) = &args.event {
        parts.push(format!("event {e}"));
    }
    parts.join(", ")
}

/// Asks on the terminal; `false` without one.
fn confirm(question: &str, io: &mut Io<'_>) -> Result<bool, CliError> {
    if !io.prompt {
        return Ok(false);
    }
    write!(io.err, "{question} [y/N] ")?;
    io.err.flush()?;
    let mut answer = String::new();
    // A blocking read is fine here: the tool waits for the operator and nothing else.
    io::stdin().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}

fn default_actor() -> String {
    ["USER", "USERNAME"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| "unknown".to_owned())
}

// ---- audit, stats, catalog, check ------------------------------------------------------------

fn print_audit(entries: &[AuditEntry], json: bool, io: &mut Io<'_>) -> Result<(), CliError> {
    if json {
        return print_json(&entries, io);
    }
    if entries.is_empty() {
        writeln!(io.out, "the audit log is empty")?;
        return Ok(());
    }
    let mut table = Table::new(
        &[
            "ID",
            "AT",
            "ACTION",
            "ACTOR",
            "COUNT",
            "DEAD LETTERS",
            "REASON",
        ],
        &["ID", "COUNT"],
    );
    for e in entries {
        table.row(vec![
            e.id.to_string(),
            time(e.at),
            e.action.clone(),
            e.actor.clone(),
            e.count.to_string(),
            join_ids(&e.dead_letter_ids, 10),
            one_line(&e.reason),
        ]);
    }
    table.write(io.out)?;
    Ok(())
}

fn print_stats(stats: &OutboxStats, json: bool, io: &mut Io<'_>) -> Result<(), CliError> {
    if json {
        return print_json(stats, io);
    }
    let oldest = stats
        .oldest_pending_age_secs
        .map_or_else(|| "-".to_owned(), |s| format!("{s:.1}"));
    writeln!(io.out, "events in outbox           {}", stats.events)?;
    writeln!(io.out, "pending deliveries         {}", stats.pending)?;
    writeln!(io.out, "  behind a dead letter     {}", stats.blocked)?;
    writeln!(io.out, "oldest pending age (s)     {oldest}")?;
    writeln!(io.out, "open dead letters          {}", stats.dead_letters)?;
    if !stats.handlers.is_empty() {
        writeln!(io.out)?;
        let mut table = Table::new(
            &["HANDLER", "PENDING", "COMPLETED", "DEAD", "PURGED"],
            &["PENDING", "COMPLETED", "DEAD", "PURGED"],
        );
        for h in &stats.handlers {
            table.row(vec![
                h.handler.clone(),
                h.pending.to_string(),
                h.completed.to_string(),
                h.dead.to_string(),
                h.purged.to_string(),
            ]);
        }
        table.write(io.out)?;
    }
    Ok(())
}

#[derive(serde::Serialize)]
struct CatalogEntry<'a> {
    name: &'a str,
    version: u32,
    aggregate_type: &'a str,
    rust_type: &'a str,
    handlers: Vec<&'a str>,
    /// The payload's JSON Schema; `null` when the type does not derive `JsonSchema`.
    schema: serde_json::Value,
}

fn print_catalog(registry: &Registry, json: bool, io: &mut Io<'_>) -> Result<(), CliError> {
    let mut entries: Vec<CatalogEntry<'_>> = registry
        .events()
        .iter()
        .map(|e| CatalogEntry {
            name: e.name,
            version: e.version,
            aggregate_type: e.aggregate_type,
            rust_type: e.type_name,
            handlers: registry
                .handlers()
                .iter()
                .filter(|h| ((h.event)().type_id)() == (e.type_id)())
                .map(|h| h.name)
                .collect(),
            schema: (e.schema)().unwrap_or(serde_json::Value::Null),
        })
        .collect();
    entries.sort_by(|a, b| (a.name, a.version).cmp(&(b.name, b.version)));
    if json {
        return print_json(&entries, io);
    }
    if entries.is_empty() {
        writeln!(io.out, "no event types registered")?;
        return Ok(());
    }
    let mut table = Table::new(
        &["NAME", "VERSION", "RUST TYPE", "HANDLERS", "SCHEMA FIELDS"],
        &["VERSION"],
    );
    for e in &entries {
        let fields = match e.schema.get("properties").and_then(|p| p.as_object()) {
            Some(p) => p.keys().cloned().collect::<Vec<_>>().join(", "),
            None if e.schema.is_null() => "(no JSON Schema: derive schemars::JsonSchema)".into(),
            None => "-".into(),
        };
        table.row(vec![
            e.name.to_owned(),
            e.version.to_string(),
            e.rust_type.to_owned(),
            e.handlers.len().to_string(),
            fields,
        ]);
    }
    table.write(io.out)?;
    Ok(())
}

/// Why `envelope` (CloudEvents JSON) does not decode with `registry`, if it does not.
fn decode_problem(registry: &Registry, envelope: &str) -> Option<String> {
    match RawEnvelope::from_json(envelope) {
        Err(e) => Some(format!("undecodable envelope: {e}")),
        Ok(raw) => registry.decode(&raw).err().map(|e| e.to_string()),
    }
}

/// Pre-deploy check: every pending delivery names a handler of this application and its
/// envelope decodes into a registered type, and every open dead letter's envelope decodes too
/// (so that a replay after the deploy can succeed).
async fn check(store: &Store, registry: &Registry, io: &mut Io<'_>) -> Result<(), CliError> {
    let pending = store.pending_envelopes().await?;
    let mut problems = 0;
    for (handler, event_id, envelope) in &pending {
        let problem = if !registry.handlers().iter().any(|h| h.name == handler) {
            Some(format!(
                "handler `{handler}` is not registered in this application"
            ))
        } else {
            decode_problem(registry, envelope)
        };
        if let Some(problem) = problem {
            problems += 1;
            writeln!(io.out, "{handler} / {event_id}: {problem}")?;
        }
    }
    let dead = store.dead_letters(&DeadLetterFilter::default()).await?;
    for d in &dead {
        if let Some(problem) = decode_problem(registry, &d.envelope) {
            problems += 1;
            writeln!(
                io.out,
                "dead letter {} ({} / {}): {problem}",
                d.id, d.handler, d.event_id
            )?;
        }
    }
    if problems > 0 {
        return Err(CliError::CheckFailed(problems));
    }
    writeln!(
        io.out,
        "ok: {} pending deliveries and {} dead letters, every one decodes with this application's event types",
        pending.len(),
        dead.len()
    )?;
    Ok(())
}

// ---- formatting ------------------------------------------------------------------------------

fn print_json<T: serde::Serialize + ?Sized>(value: &T, io: &mut Io<'_>) -> Result<(), CliError> {
    serde_json::to_writer_pretty(&mut *io.out, value).map_err(io::Error::from)?;
    writeln!(io.out)?;
    Ok(())
}

fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    if let Ok(d) = NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Ok(d.and_time(NaiveTime::MIN).and_utc());
    }
    Err("expected an RFC 3339 time such as 2026-01-31T12:00:00Z, or a date such as 2026-01-31 (midnight UTC)".into())
}

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn time_ms(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
    t.push('…');
    t
}

fn join_ids(ids: &[i64], max: usize) -> String {
    let mut s = ids
        .iter()
        .take(max)
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if ids.len() > max {
        let _ = write!(s, ", … ({} in all)", ids.len());
    }
    s
}

/// A plain-text table: columns as wide as their widest cell, two spaces apart.
struct Table {
    header: Vec<String>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(header: &[&str], right_aligned: &[&str]) -> Self {
        Table {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            right: header.iter().map(|h| right_aligned.contains(h)).collect(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    fn write(&self, out: &mut (dyn Write + Send)) -> io::Result<()> {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let last = widths.len().saturating_sub(1);
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                let pad = widths[i].saturating_sub(cell.chars().count());
                if i > 0 {
                    line.push_str("  ");
                }
                if self.right[i] {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    if i < last {
                        line.extend(std::iter::repeat_n(' ', pad));
                    }
                }
            }
            writeln!(out, "{line}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn tables_align() {
        let mut t = Table::new(&["ID", "NAME"], &["ID"]);
        t.row(vec!["7".into(), "a".into()]);
        t.row(vec!["12".into(), "bbb".into()]);
        let mut out = Vec::new();
        t.write(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "ID  NAME\n 7  a\n12  bbb\n"
        );
    }

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}

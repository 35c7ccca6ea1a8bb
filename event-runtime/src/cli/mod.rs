//! The `events` operations tool: dead letter queue, backlog, destinations and their pauses,
//! and an embedding application's catalog. Works through [`Store`]: must not write SQL itself.
//!
//! # Commands
//!
//! ```text
//! events [--database URL] [--schema NAME] [--connect-timeout SECS] <command>
//!
//!   dlq list   [--json] [--handler H] [--event NAME] [--since T] [--until T] [--all] [--limit N]
//!   dlq show   ID [--json] [--payload]
//!   dlq replay (ID... | --all | --handler H | --event NAME) --reason TEXT [--actor WHO] [--yes]
//!   dlq purge  (ID... | --all | --handler H | --event NAME) --reason TEXT [--actor WHO] [--yes]
//!   dlq resume AUDIT_ID
//!   dlq audit  [--json] [--limit N]
//!   outbox stats [--json]
//!   handler list [--json]
//!   handler pause  NAME --reason TEXT [--actor WHO] [--force]
//!   handler resume NAME [--reason TEXT] [--actor WHO]
//!   handler purge    OLD [--reason TEXT] [--actor WHO] [--yes] [--force-relay]
//!                                                                  (embedded only)
//!   handler retarget OLD --to NEW [--reason TEXT] [--actor WHO] [--yes] [--force-relay]
//!                                                                  (embedded only)
//!   catalog [--json]      (embedded only: the application's event types)
//!   check                 (embedded only: every pending delivery and dead letter decodes,
//!                          and the engine can read every delivery row)
//!   asyncapi [--check FILE]  (embedded only: the AsyncAPI 3.0.0 document of the application)
//!   flow     [--check FILE]  (embedded only: the event flow as Mermaid; with --database, live
//!                             counts)
//!   nats stream create|check [NAME] [--nats URL] [--subject S]... [--duplicate-window SECS]
//!                         [--max-msg-size BYTES]   (feature `nats`; NATS only, no database)
//!   nats inbox show DURABLE [--stream S] [--nats URL]         (feature `nats`)
//!   nats inbox adopt DURABLE --reason TEXT [--actor WHO] [--stream S] [--nats URL]
//!   rabbitmq topology create|check CONSUMER [--amqp URL] [--exchange E] [--partitions P]
//!                         [--routing-key-prefix PREFIX] [--binding PATTERN]...
//!                         [--delivery-limit N]   (feature `rabbitmq`; RabbitMQ only, no database)
//!   inbox gaps [--all] [--json]
//!   inbox gaps accept  (ID... | --all-open) --reason TEXT [--actor WHO]
//!   inbox gaps refetch (ID... | --all-open) --consumer DURABLE [--stream S] [--nats URL]
//!                      [--from SEQ] [--max-messages N] --reason TEXT [--actor WHO]
//!                                                  (feature `nats`; embedded with its outbox)
//!   relay republish --destination D (--aggregate TYPE ID ... | --since T) --reason TEXT
//!                   [--actor WHO]
//! ```
//!
//! - `--database URL` (or `EVENTS_DATABASE_URL`) names the store: `sqlite://PATH` or
//!   `postgres://USER@HOST/DB` (the latter needs the `postgres` feature). The tool opens an
//!   existing outbox only ([`Store::open`]): it creates no SQLite file, schema or table and
//!   applies no migration, so a mistyped URL or schema is an error rather than an empty
//!   outbox; the application creates and migrates its outbox at start-up. `--schema NAME`
//!   selects the PostgreSQL schema of an application that uses
//!   [`store::postgres::connect_in_schema`]. `--connect-timeout SECS` (default 10) bounds
//!   connecting; a server that refuses connections fails at once, with its address and why.
//! - Times (`--since`, `--until`) are RFC 3339 (`2026-01-31T12:00:00Z`) or a date
//!   (`2026-01-31`, midnight UTC); `--since` is inclusive, `--until` exclusive.
//! - `dlq list` shows open dead letters (`--all` adds replayed and purged ones), oldest first.
//!   `--limit N` (1 or more) shows the first N and says "showing N of M" when there are more.
//!   `--json` prints [`DeadLetter`]s; the `envelope` field is the original envelope text
//!   (`jq '.[].envelope | fromjson'`) with its payload withheld (`"data": "***"`) unless
//!   `--payload` is given too. Its LAST ERROR column is the error chain on one line, each
//!   cause once, without the row's own event id (the EVENT ID column has it), cut to 100
//!   characters. `dlq show` prints every field, the error chain whole, the envelope's
//!   attributes, and for an inbox dead letter (a received message the inbox could not accept)
//!   where it came from: stream, stream sequence, subject and delivery count.
//! - Payloads are private: `dlq show` and `dlq list --json` print an envelope's `data` only
//!   with `--payload`, and then with each field its event type marks `#[event(sensitive)]`
//!   masked as `"***"`. The standalone tool learns those fields from the database's
//!   `event_catalog` table, which each service's outbox records when its workers start
//!   ([`Outbox::record_catalog`](crate::Outbox::record_catalog)); an embedded tool knows its
//!   own types too. An event type in neither is printed whole, with a warning on standard
//!   error. Decode errors in the error chain never quote payload values
//!   ([`event_core::JsonError`]).
//! - In `dlq list`, `replay` and `purge`, a `--handler` or `--event` that matches nothing and
//!   that nothing knows is an error that lists the names with open dead letters, so that a
//!   typo fails instead of reporting an empty queue. A handler is known when a delivery or a
//!   dead letter (open or resolved) names it, an event name when a dead letter does; embedded,
//!   the application's handlers and event types are known too. A known name without dead
//!   letters is an empty result, not an error.
//! - `dlq replay` makes each selected delivery due again with its attempts reset and the same
//!   event id; `dlq purge` gives up on them, so that later events of their aggregate flow.
//!   Both need `--reason`. The actor is `--actor`, else the login name (`$USER`, `$LOGNAME`,
//!   `$USERNAME`, else the user of the process's uid in `/etc/passwd`); an empty one is
//!   refused. Selecting by `--all`, `--handler` or `--event` asks for confirmation on a
//!   terminal and otherwise needs `--yes`; naming ids does not. An unknown id is an error and
//!   nothing is changed.
//! - A replay or purge has one audit row (who, when, why, which dead letters: `dlq audit`),
//!   however many rows it touches. Over a selection (`--all`, `--handler`, `--event`) it
//!   works in pages of [`RESOLVE_PAGE`] (500) dead letters, each its own transaction
//!   ([`Store::resolve_matching`]): memory stays one page and, on SQLite, the write lock is
//!   released between pages, so workers go on. Interrupted (a crash, a lost connection), the
//!   pages done stay done and the audit row stays unfinished (`dlq audit` shows it); `dlq
//!   resume AUDIT_ID` finishes it under the same row ([`Store::resume_resolution`]). Dead
//!   letters that arrive while it runs are not touched. Named ids are resolved in one
//!   transaction ([`Store::resolve_dead_letters_with_progress`]): all of them or none. On a
//!   terminal, more than 50 rows show a progress bar.
//! - `outbox stats` prints [`OutboxStats`]: events in the outbox, the pending backlog (and how
//!   much of it waits behind a dead letter of its aggregate) and its oldest age in seconds,
//!   open dead letters, deliveries in a status this version does not know (shown as unknown,
//!   never as another status), pending deliveries whose row the engine cannot read
//!   ([`OutboxStats::unreadable`]: a column edited by hand, such as a text `next_attempt_at` on
//!   SQLite, which is never due; shown as `unreadable by the engine`: repair or purge it), paused
//!   destinations, per-handler counts.
//! - `check` (embedded) fails, listing them, when a pending delivery names a handler the
//!   application does not have or does not decode with its event types, when an open dead
//!   letter does not decode, and when a delivery row is unreadable or in an unknown status.
//! - `asyncapi` (embedded) prints the AsyncAPI 3.0.0 document of the application's events and
//!   routes ([`crate::topology::asyncapi`]), `flow` the Mermaid picture of its flow
//!   ([`crate::topology::flow`]), from its registry and the [`Topology`](crate::topology::Topology)
//!   it hands over with [`App::topology`] (without one, both show its own events and handlers
//!   and say so on standard error). `flow` with a database named by `--database` or
//!   `EVENTS_DATABASE_URL` (not the application's default) adds each handler's and relay's
//!   pending deliveries, oldest age, dead letters and pause, and each inbox's held events and
//!   open gaps. Without counts both are the same text on every run: `--check FILE` compares
//!   with a committed copy instead of printing, and fails naming the first differing line and
//!   the command that writes it again.
//! - `handler purge OLD` and `handler retarget OLD --to NEW` (embedded) deal with what a
//!   handler that no longer exists left (one replaced by an event union, say: start-up logs
//!   them): `purge` gives up on its pending deliveries and open dead letters
//!   ([`Store::purge_destination`]); `retarget` moves them onto `NEW`, merged into `NEW`'s
//!   runs per aggregate in sequence order, its dead letters replayable to `NEW`, and drops
//!   each delivery of an event `NEW` already has ([`Store::retarget_destination`]). Both work
//!   in pages with one audit row (action `handler-purge` / `handler-retarget`; `--reason`
//!   defaults to `no longer registered` / `replaced by NEW`; the actor as for `dlq replay`).
//!   `OLD` must not be a handler of the application (its workers would race the change),
//!   `NEW` must be one of its after-commit handlers, and no live worker of any process may
//!   hold a delivery of `OLD`; a refusal changes nothing and exits 1. Both say what `OLD`
//!   left (its pending deliveries and open dead letters) and ask for confirmation on a
//!   terminal; otherwise they need `--yes`. An interrupted one is finished by running the
//!   same command again.
//! - A transport's relay is a destination named `TRANSPORT:…` (a lower-case word and a
//!   single `:`, such as the NATS relay's `nats:<stream>`) that is not a handler of the
//!   application; handler names never take that form (a default name is a module path with
//!   `::`, a pinned one is dotted). Its pending deliveries are events committed but not yet
//!   published: they wait for the application to run with that transport configured.
//!   `handler purge` and `handler retarget` refuse a relay unless `--force-relay` is given
//!   (its unpublished events would never reach the consumers), and `handler list` shows it
//!   as `(relay)` (`"relay": true` in `--json`).
//! - `handler pause` stops every worker of every process from claiming the destination's
//!   deliveries ([`Store::pause_destination_audited`]); deliveries already claimed finish and
//!   no attempt is used. `handler resume` lifts the operator's pause; a pause the runtime set
//!   itself (a destination reported unavailable) stays until the runtime lifts it or it
//!   lapses. Pauses and resumes are audited like replays: one audit row each (action `pause`
//!   or `resume`, the actor, and the reason as `DESTINATION: TEXT`), in the same transaction
//!   as the pause, since a pause changes what every process delivers. A name that nothing
//!   knows is refused unless `--force` (to pause a handler before its first delivery).
//!   Embedded, an `in_transaction` handler is refused, `--force` or not: it runs inside the
//!   committing transaction and has no deliveries, so a pause would hold nothing back.
//! - `handler list` shows every destination that has deliveries, dead letters or a pause (and,
//!   embedded, every registered handler) with its counts and, for each pause in force, who
//!   set it (`operator`, or the runtime component), since when, why, and the actor of the
//!   operator's last audited pause.
//!
//! Tables are aligned by display width. On a terminal they have unicode borders and fit its
//! width (`COLUMNS` when set, else the size the terminal reports, else 120): free-text
//! columns wrap, then names; ids, numbers and times are never broken, and when that is not
//! enough a command leaves out the columns it can spare, saying which (`dlq list` drops
//! EVENT ID, then ATTEMPTS and HOLDS BACK: `dlq show ID` has them). Terminals narrower than
//! 60 columns get unfitted tables. Otherwise tables are plain text, one line per row, columns
//! two spaces apart. `--json` output has the
//! same shape whether or not it goes to a terminal.
//!
//! Errors print one line, `error: …`, on standard error: the error and each of its causes once,
//! outermost first. The exit status is 1; a command line clap rejects exits with status 2.
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
//!                 eprintln!("error: {}", event_core::ErrorChain(&e));
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
//!
//! [`Store`]: crate::Store
//! [`Store::open`]: crate::Store::open
//! [`store::postgres::connect_in_schema`]: crate::store::postgres::connect_in_schema
//! [`Store::resolve_dead_letters_with_progress`]: crate::Store::resolve_dead_letters_with_progress
//! [`Store::pause_destination_audited`]: crate::Store::pause_destination_audited
//! [`DeadLetter`]: crate::DeadLetter
//! [`OutboxStats`]: crate::OutboxStats
//! [`OutboxStats::unreadable`]: crate::OutboxStats::unreadable
//! [`Store::purge_destination`]: crate::Store::purge_destination
//! [`Store::retarget_destination`]: crate::Store::retarget_destination
//! [`Store::resolve_matching`]: crate::Store::resolve_matching
//! [`Store::resume_resolution`]: crate::Store::resume_resolution
//! [`RESOLVE_PAGE`]: crate::store::RESOLVE_PAGE

mod args;
mod catalog;
mod connect;
mod describe;
mod dlq;
mod error;
mod format;
mod gaps;
mod handler;
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "nats")]
mod nats_group;
#[cfg(feature = "rabbitmq")]
mod rabbitmq;
#[cfg(feature = "nats")]
mod refetch;
mod relay;
mod resolve;
mod retire;
mod stats;

use std::ffi::OsString;
use std::io::{self, IsTerminal, Write};
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

use crate::dispatch::registry::Registry;
use crate::store::Resolution;

pub use args::Cli;
use args::{Command, Dlq, HandlerCommand, OutboxCommand};
use connect::Target;
pub use error::CliError;

/// The environment variable read when `--database` is not given.
pub const DATABASE_ENV: &str = "EVENTS_DATABASE_URL";

/// How an embedding application builds its [`Outbox`](crate::Outbox) over the store the
/// tool opened (its dispatcher, resources and destinations, as at start-up).
pub type OutboxFactory<'a> =
    &'a (dyn Fn(crate::Store) -> Result<crate::Outbox, crate::OutboxError> + Send + Sync);

/// How an embedding application opens its store itself — a backend of its own, which
/// `Store::connect`'s URL schemes do not know — from the URL the tool was given and the
/// options it opens with (`create: false`: an existing outbox only; the schema; the connect
/// timeout). See [`App::store_opener`].
pub type StoreOpener<'a> = &'a (dyn Fn(
    &str,
    &crate::ConnectOptions,
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<crate::Store, crate::StoreError>> + Send>,
> + Send
         + Sync);

/// The program the commands run in: its name (shown in help and messages) and, when embedded
/// in an application, its [`Registry`] of event types and, optionally, how it builds its
/// outbox ([`outbox`](Self::outbox)).
#[derive(Clone, Copy)]
pub struct App<'a> {
    name: &'a str,
    registry: Option<&'a Registry>,
    default_database: Option<&'a str>,
    outbox: Option<OutboxFactory<'a>>,
    topology: Option<&'a crate::topology::Topology>,
    open_store: Option<StoreOpener<'a>>,
}

impl std::fmt::Debug for App<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("name", &self.name)
            .field("registry", &self.registry.is_some())
            .field("default_database", &self.default_database)
            .field("outbox", &self.outbox.is_some())
            .field("topology", &self.topology.is_some())
            .field("open_store", &self.open_store.is_some())
            .finish()
    }
}

impl<'a> App<'a> {
    /// The standalone `events` binary: no application event types.
    pub fn standalone() -> Self {
        App {
            name: "events",
            registry: None,
            default_database: None,
            outbox: None,
            topology: None,
            open_store: None,
        }
    }

    /// Embedded in an application whose event types are `registry`, invoked as `name`
    /// (`"orders events"`).
    pub fn embedded(name: &'a str, registry: &'a Registry) -> Self {
        App {
            name,
            registry: Some(registry),
            default_database: None,
            outbox: None,
            topology: None,
            open_store: None,
        }
    }

    /// The database used when neither `--database` nor `EVENTS_DATABASE_URL` is given (the
    /// application's own default).
    pub fn default_database(mut self, url: &'a str) -> Self {
        self.default_database = Some(url);
        self
    }

    /// How the application builds its outbox over a store: with it, `dlq replay ID` replays
    /// a transport inbox's dead letters too, through the inbox core
    /// ([`Outbox::replay_inbox_dead_letters`](crate::Outbox::replay_inbox_dead_letters):
    /// decoded by the application's registry, committed to its local handlers; no broker is
    /// needed). Without it the tool skips them and says so (it cannot know where the
    /// application routes a received event).
    ///
    /// ```no_run
    /// use event_runtime::{cli::App, Dispatcher, Outbox, OutboxError, Registry, Store};
    ///
    /// /// The application's outbox, as it builds it at start-up.
    /// fn outbox(store: Store) -> Result<Outbox, OutboxError> {
    ///     Outbox::builder(store).dispatcher(Dispatcher::builder()).build()
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = Registry::from_inventory().build()?;
    /// let app = App::embedded("billing events", &registry).outbox(&outbox);
    /// // `billing events dlq replay 17 --reason "order.shipped v2 deployed"`
    /// let code = event_runtime::cli::run(std::env::args().skip(2), app).await;
    /// # let _ = code;
    /// # Ok(())
    /// # }
    /// ```
    pub fn outbox(mut self, build: OutboxFactory<'a>) -> Self {
        self.outbox = Some(build);
        self
    }

    /// Where the application's events travel beyond its process — its relays, inboxes and
    /// handler options — for `asyncapi` and `flow`
    /// ([`Topology`](crate::topology::Topology)). Without it, both describe only the
    /// application's own events and handlers, and say so on standard error.
    pub fn topology(mut self, topology: &'a crate::topology::Topology) -> Self {
        self.topology = Some(topology);
        self
    }

    /// How the tool opens the store, instead of
    /// [`Store::connect_with`](crate::Store::connect_with): for a store backend of the
    /// application's own ([`store::backend`](crate::store::backend)), whose URL scheme the
    /// built-in backends do not know. A command whose operation needs a capability the backend
    /// does not offer fails naming it (`error: the mystore store does not offer Inspection,
    /// which this operation needs`); the others work.
    ///
    /// ```no_run
    /// use event_runtime::{cli::App, ConnectOptions, Store, StoreError};
    /// use std::future::Future;
    /// use std::pin::Pin;
    ///
    /// /// Opens the application's own backend (here: the built-in one, for the example).
    /// fn open(
    ///     url: &str,
    ///     options: &ConnectOptions,
    /// ) -> Pin<Box<dyn Future<Output = Result<Store, StoreError>> + Send>> {
    ///     let (url, options) = (url.to_owned(), options.clone());
    ///     Box::pin(async move { Store::connect_with(&url, &options).await })
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let app = App::standalone().store_opener(&open);
    /// let code = event_runtime::cli::run(std::env::args(), app).await;
    /// # let _ = code;
    /// # }
    /// ```
    pub fn store_opener(mut self, open: StoreOpener<'a>) -> Self {
        self.open_store = Some(open);
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

    /// How the application builds its outbox, when it said ([`outbox`](Self::outbox)).
    pub fn outbox_factory(&self) -> Option<OutboxFactory<'a>> {
        self.outbox
    }
}

/// Where output goes, and what the terminal allows.
pub(crate) struct Io<'w> {
    out: &'w mut (dyn Write + Send),
    err: &'w mut (dyn Write + Send),
    /// Draw progress bars on the process's standard error.
    progress: bool,
    /// Ask for confirmation on the process's standard input.
    prompt: bool,
    /// Standard output is a terminal of this width (`COLUMNS`, else its size, else 120):
    /// tables with borders, fitted to it. `None`: plain tables.
    terminal: Option<u16>,
}

/// Parses `args` (the first item is the program name, as in [`std::env::args_os`]) and runs the
/// command on standard output and standard error. Returns the exit status: 0, 1 when the
/// command failed (the message is printed), 2 when the command line is wrong.
///
/// On a terminal, bulk replays and purges ask for confirmation and long ones show a progress
/// bar, and tables have borders.
///
/// # Cancel safety
/// As the command it runs: reads are cancel safe; a replay or purge dropped part-way keeps
/// the pages it finished, audited, and `dlq resume` finishes it; a pause or resume either
/// happened with its audit row or did not.
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
        terminal: io::stdout().is_terminal().then(format::terminal_width),
    };
    let color = Color {
        out: io::stdout().is_terminal(),
        err: terminal,
    };
    run_io(args, app, &mut io, color).await
}

/// As [`run`], writing to `out` and `err` instead: never prompts (bulk operations need
/// `--yes`), draws no progress bar, and prints plain tables.
///
/// # Cancel safety
/// As [`run`].
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
    let mut io = Io::plain(out, err);
    run_io(args, app, &mut io, Color::default()).await
}

impl<'w> Io<'w> {
    fn plain(out: &'w mut (dyn Write + Send), err: &'w mut (dyn Write + Send)) -> Self {
        Io {
            out,
            err,
            progress: false,
            prompt: false,
            terminal: None,
        }
    }
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
/// Every failure of the command, as a [`CliError`]; nothing has been printed about it (print
/// it with its causes, as `event_core::ErrorChain` does).
///
/// # Cancel safety
/// As [`run`].
pub async fn execute(
    cli: Cli,
    app: App<'_>,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    execute_io(cli, app, &mut Io::plain(out, err)).await
}

async fn execute_io(cli: Cli, app: App<'_>, io: &mut Io<'_>) -> Result<(), CliError> {
    let target = Target {
        timeout: cli.connect_timeout(),
        database: cli.database,
        schema: cli.schema,
        default: app.default_database,
        opener: app.open_store,
    };
    match cli.command {
        Command::Dlq(Dlq::List(args)) => dlq::list(&target.connect().await?, &app, args, io).await,
        Command::Dlq(Dlq::Show { id, json, payload }) => {
            dlq::show(&target.connect().await?, &app, id, json, payload, io).await
        }
        Command::Dlq(Dlq::Replay(args)) => {
            resolve::resolve(&target, &app, Resolution::Replay, args, io).await
        }
        Command::Dlq(Dlq::Purge(args)) => {
            resolve::resolve(&target, &app, Resolution::Purge, args, io).await
        }
        Command::Dlq(Dlq::Resume { audit_id }) => resolve::resume(&target, audit_id, io).await,
        Command::Dlq(Dlq::Audit { json, limit }) => {
            let entries = target.connect().await?.audit_log(limit).await?;
            stats::print_audit(&entries, json, io)
        }
        Command::Outbox(OutboxCommand::Stats { json }) => {
            let stats = target.connect().await?.stats().await?;
            stats::print_stats(&stats, json, io)
        }
        Command::Handler(HandlerCommand::List { json }) => {
            handler::list(&target.connect().await?, &app, json, io).await
        }
        Command::Handler(HandlerCommand::Pause {
            name,
            reason,
            actor,
            force,
        }) => {
            let pause = handler::PauseArgs {
                name,
                reason,
                actor,
                force,
            };
            handler::pause(&target, &app, pause, io).await
        }
        Command::Handler(HandlerCommand::Resume {
            name,
            reason,
            actor,
        }) => handler::resume(&target, &app, &name, &reason, actor.as_deref(), io).await,
        Command::Handler(HandlerCommand::Purge {
            name,
            reason,
            actor,
            yes,
            force_relay,
        }) => {
            let args = retire::RetireArgs {
                name,
                to: None,
                reason,
                actor,
                yes,
                force_relay,
            };
            retire::retire(&target, &app, args, io).await
        }
        Command::Handler(HandlerCommand::Retarget {
            name,
            to,
            reason,
            actor,
            yes,
            force_relay,
        }) => {
            let args = retire::RetireArgs {
                name,
                to: Some(to),
                reason,
                actor,
                yes,
                force_relay,
            };
            retire::retire(&target, &app, args, io).await
        }
        Command::Catalog { json } => {
            let registry = app.registry.ok_or_else(|| no_registry(&app, "catalog"))?;
            catalog::print_catalog(registry, json, io)
        }
        Command::Asyncapi { check } => describe::asyncapi(&app, check.as_deref(), io),
        Command::Flow { check } => describe::flow(&target, &app, check.as_deref(), io).await,
        Command::Inbox(command) => gaps::run(&target.connect().await?, &app, command, io).await,
        Command::Relay(command) => relay::run(&target.connect().await?, &app, command, io).await,
        Command::Check => {
            let registry = app.registry.ok_or_else(|| no_registry(&app, "check"))?;
            catalog::check(&target.connect().await?, registry, io).await
        }
        #[cfg(feature = "rabbitmq")]
        Command::Rabbitmq(command) => rabbitmq::run(command, io).await,
        #[cfg(feature = "nats")]
        Command::Nats(nats::NatsCommand::Stream(command)) => nats::stream(command, io).await,
        #[cfg(feature = "nats")]
        Command::Nats(nats::NatsCommand::Inbox(command)) => nats::inbox(&target, command, io).await,
        #[cfg(feature = "nats")]
        Command::Nats(nats::NatsCommand::Group(command)) => {
            nats_group::run(&target, command, io).await
        }
    }
}

fn no_registry(app: &App<'_>, command: &'static str) -> CliError {
    CliError::NoRegistry {
        program: app.name.to_owned(),
        command,
    }
}

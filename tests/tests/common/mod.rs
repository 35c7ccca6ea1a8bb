//! Shared by the store suites: one store per backend, each isolated (a fresh SQLite file, a
//! fresh PostgreSQL schema), the rule for skipping a service, and this binary's temporary
//! folder (removed when it exits).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use event_runtime::Store;

/// The PostgreSQL URL from `EVENTS_TEST_POSTGRES_URL`, or `None` after printing why the
/// PostgreSQL case is skipped. With `EVENTS_TEST_REQUIRE_SERVICES=1` a missing URL fails.
pub fn postgres_url(test: &str) -> Option<String> {
    match std::env::var("EVENTS_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            if std::env::var("EVENTS_TEST_REQUIRE_SERVICES").as_deref() == Ok("1") {
                panic!("{test}: EVENTS_TEST_REQUIRE_SERVICES=1 but EVENTS_TEST_POSTGRES_URL is not set");
            }
            say_once(
                "PostgreSQL",
                &format!(
                    "PostgreSQL cases skipped ({test} and others): EVENTS_TEST_POSTGRES_URL is not set"
                ),
            );
            None
        }
    }
}

/// Prints `message` on the process's standard error (which `cargo test` shows, unlike
/// `eprintln!`, which the test harness captures) the first time this binary skips something
/// about `subject` (`PostgreSQL`, `NATS`): once per subject, so that one service's note never
/// hides another's. The harness reports a skipped case as passed; this note is what says it
/// was not run.
pub fn say_once(subject: &str, message: &str) {
    use std::io::Write;
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if said.iter().any(|s| s == subject) {
        return;
    }
    said.push(subject.to_owned());
    let _ = writeln!(
        std::io::stderr(),
        "note: {message} (reported as passed, not run)"
    );
}

/// The names of the folders [`temp_dir`] makes: this prefix and the process id.
const TEMP_PREFIX: &str = "event-tests-";

/// This test binary's folder in the temporary directory, for its SQLite files and other
/// scratch files: removed when the binary exits (passed or failed: the harness exits through
/// `exit`, which runs `atexit` handlers). A binary killed before that leaves its folder, so
/// the first call also removes the folders of processes that no longer exist (on Linux,
/// where `/proc` tells).
pub fn temp_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let root = std::env::temp_dir();
        remove_folders_of_dead_processes(&root);
        let dir = root.join(format!("{TEMP_PREFIX}{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        extern "C" fn remove_at_exit() {
            if let Some(dir) = DIR.get() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        extern "C" {
            fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
        }
        // SAFETY: `atexit` is the C library's, which every Rust program on a hosted target
        // links; the handler only reads a static that is set before it is registered.
        let registered = unsafe { atexit(remove_at_exit) } == 0;
        assert!(
            registered,
            "atexit refused the clean-up of {}",
            dir.display()
        );
        dir
    })
}

#[cfg(target_os = "linux")]
fn remove_folders_of_dead_processes(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(TEMP_PREFIX))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn remove_folders_of_dead_processes(_: &Path) {}

/// A unique, lower-case name for a schema or file: at most 63 characters (PostgreSQL cuts
/// longer identifiers, which would make two runs share a schema).
pub fn unique(test: &str) -> String {
    let short: String = test.chars().take(24).collect();
    format!("{}_{}", short, uuid::Uuid::now_v7().simple()).to_lowercase()
}

/// The URL of a fresh SQLite file in this binary's [`temp_dir`] (not created yet).
pub fn sqlite_url(test: &str) -> String {
    format!(
        "sqlite://{}",
        temp_dir().join(format!("{}.db", unique(test))).display()
    )
}

/// A fresh SQLite file store, in this binary's [`temp_dir`].
pub async fn sqlite(test: &str) -> (String, Store) {
    let url = sqlite_url(test);
    let store = Store::connect(&url).await.expect("open SQLite");
    (url, store)
}

/// A fresh PostgreSQL schema store, when PostgreSQL is configured.
pub async fn postgres(test: &str) -> Option<(String, String, Store)> {
    let url = postgres_url(test)?;
    let schema = unique(test);
    let store = event_runtime::store::postgres::connect_in_schema(&url, &schema)
        .await
        .unwrap_or_else(|e| panic!("{test}: cannot open PostgreSQL at {url}: {e}"));
    Some((url, schema, store))
}

/// Which backend a case runs on, and how to open another store on the same database (a
/// restarted process, a second worker pool).
#[derive(Clone, Debug)]
pub enum Db {
    Sqlite(String),
    Postgres { url: String, schema: String },
}

impl Db {
    pub async fn open(&self) -> Store {
        match self {
            Db::Sqlite(url) => Store::connect(url).await.expect("reopen SQLite"),
            Db::Postgres { url, schema } => {
                event_runtime::store::postgres::connect_in_schema(url, schema)
                    .await
                    .expect("reopen PostgreSQL")
            }
        }
    }

    pub fn label(&self) -> &'static str {
        match self {
            Db::Sqlite(_) => "sqlite",
            Db::Postgres { .. } => "postgres",
        }
    }
}

/// SQLite always; PostgreSQL when configured.
pub async fn databases(test: &str) -> Vec<Db> {
    let mut out = vec![Db::Sqlite(sqlite(test).await.0)];
    if let Some((url, schema, _)) = postgres(test).await {
        out.push(Db::Postgres { url, schema });
    }
    out
}

/// A `metrics` recorder whose gauges read back their last value (the debugging recorder of
/// `metrics-util` resets a gauge to 0 on every snapshot, so a gauge nobody sets any more
/// would look like one set to 0).
#[derive(Clone)]
pub struct Gauges(
    std::sync::Arc<
        metrics_util::registry::Registry<metrics::Key, metrics_util::registry::AtomicStorage>,
    >,
);

impl Gauges {
    pub fn new() -> Gauges {
        Gauges(std::sync::Arc::new(
            metrics_util::registry::Registry::atomic(),
        ))
    }

    /// The last value of gauge `name` with label `destination` = `handler`, if it was ever set.
    pub fn get(&self, name: &str, handler: &str) -> Option<f64> {
        self.0.get_gauge_handles().into_iter().find_map(|(key, g)| {
            let ours = key.name() == name
                && key
                    .labels()
                    .any(|l| l.key() == "destination" && l.value() == handler);
            ours.then(|| f64::from_bits(g.load(std::sync::atomic::Ordering::SeqCst)))
        })
    }
}

impl metrics::Recorder for Gauges {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        self.0
            .get_or_create_counter(key, |c| metrics::Counter::from_arc(c.clone()))
    }
    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        self.0
            .get_or_create_gauge(key, |g| metrics::Gauge::from_arc(g.clone()))
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        self.0
            .get_or_create_histogram(key, |h| metrics::Histogram::from_arc(h.clone()))
    }
}

/// The NATS URL from `EVENTS_TEST_NATS_URL`, or `None` after saying (once per binary) that the
/// `what` cases are skipped. With `EVENTS_TEST_REQUIRE_SERVICES=1` a missing URL fails `test`.
pub fn nats_url(test: &str, what: &str) -> Option<String> {
    match std::env::var("EVENTS_TEST_NATS_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var("EVENTS_TEST_REQUIRE_SERVICES").as_deref() != Ok("1"),
                "{test}: EVENTS_TEST_REQUIRE_SERVICES=1 but EVENTS_TEST_NATS_URL is not set"
            );
            say_once(
                "NATS",
                &format!("{what} skipped ({test} and others): EVENTS_TEST_NATS_URL is not set"),
            );
            None
        }
    }
}

/// The RabbitMQ URL of the RabbitMQ cases (`EVENTS_TEST_AMQP_URL`), or `None` after saying they
/// are skipped. With `EVENTS_TEST_REQUIRE_SERVICES=1` a missing URL fails `test`.
pub fn amqp_url(test: &str) -> Option<String> {
    match std::env::var("EVENTS_TEST_AMQP_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var("EVENTS_TEST_REQUIRE_SERVICES").as_deref() != Ok("1"),
                "{test}: EVENTS_TEST_REQUIRE_SERVICES=1 but EVENTS_TEST_AMQP_URL is not set"
            );
            say_once(
                "RabbitMQ",
                &format!(
                    "RabbitMQ cases skipped ({test} and others): EVENTS_TEST_AMQP_URL is not set"
                ),
            );
            None
        }
    }
}

/// With `EVENTS_TEST_LOG` set (`warn`, `info`…), the framework's log lines on standard error,
/// for a post-mortem.
pub fn log_from_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Ok(level) = std::env::var("EVENTS_TEST_LOG") {
            let level = level.parse().unwrap_or(tracing::Level::WARN);
            let _ = tracing::subscriber::set_global_default(
                tracing_subscriber::fmt()
                    .with_ansi(false)
                    .with_max_level(level)
                    .with_writer(std::io::stderr)
                    .finish(),
            );
        }
    });
}

impl Db {
    /// The `events` tool's arguments that open this database.
    pub fn cli_args(&self) -> Vec<String> {
        match self {
            Db::Sqlite(url) => vec!["--database".into(), url.clone()],
            Db::Postgres { url, schema } => vec![
                "--database".into(),
                url.clone(),
                "--schema".into(),
                schema.clone(),
            ],
        }
    }
}

/// Runs the standalone `events` tool on `argv` (its first item the program name): whether it
/// succeeded, its standard output and its standard error.
pub async fn events_tool(argv: Vec<String>) -> (bool, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = event_runtime::cli::run_with_output(
        argv,
        event_runtime::cli::App::standalone(),
        &mut out,
        &mut err,
    )
    .await;
    (
        code == std::process::ExitCode::SUCCESS,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

/// Every message in `queue`, taken (acknowledged) through a consumer until none arrives for
/// half a second: a quorum queue with a single active consumer refuses `basic.get`.
#[allow(dead_code)]
pub async fn amqp_take(channel: &lapin::Channel, queue: &str) -> Vec<lapin::message::Delivery> {
    use futures_util::StreamExt;
    let tag = format!("take-{}", uuid::Uuid::now_v7().simple());
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            tag.as_str().into(),
            lapin::options::BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    let mut out = Vec::new();
    while let Ok(Some(Ok(d))) =
        tokio::time::timeout(std::time::Duration::from_millis(500), consumer.next()).await
    {
        out.push(d);
    }
    channel
        .basic_cancel(tag.as_str().into(), Default::default())
        .await
        .unwrap();
    out
}

/// Waits until `check` holds (asked every 100 ms), failing the test after `limit` with `what`.
#[allow(dead_code)]
pub async fn eventually<F, Fut>(limit: std::time::Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    while !check().await {
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

//! The two services through the real NATS JetStream (`EVENTS_TEST_NATS_URL`; skipped visibly
//! without it, failing with `EVENTS_TEST_REQUIRE_SERVICES=1`): the built `orders` and
//! `billing` binaries, as a user runs them, on the bundled data, each test on a stream and a
//! subject prefix of its own and with its own SQLite files.
//!
//! `billing` must invoice every shipped order once, with revenue by region exact to the cent
//! against the CSV (computed here with the csv crate alone) and equal to what `orders`
//! reports, and no dead letter: after a clean run, after `--crash-after` (committed, not
//! acked) and a re-run, after a SIGKILL mid-run and a re-run, and after `orders` itself was
//! killed mid-run and run again on its database (its relay publishes the rest; the stream
//! holds each event once). On a three-server cluster of the test's own, with a stream of 3
//! replicas, both run at once while the stream's leader is killed and restarted.
//!
//! `cargo test -p examples` builds the binaries first; alone, run
//! `cargo build -p examples --examples && cargo test -p examples --test two_services`
//! (about 2.5 minutes in debug on 2 cores: `orders` twice on the full data, `billing` six
//! times).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "../../tests/tests/common/nats_cluster.rs"]
mod nats_cluster;
mod services;

use services::{
    assert_billing_exact, count, example_binary, expected, require, revenue, runtime, skip,
    summary, Expected, Running,
};

// ---- what the CSV says ----------------------------------------------------------------------

// ---- services -------------------------------------------------------------------------------

/// The NATS URL from `EVENTS_TEST_NATS_URL` once the server answers, or `None` after printing
/// that the test is skipped and why. With `EVENTS_TEST_REQUIRE_SERVICES=1` a missing URL or an
/// unreachable server fails the test.
fn nats_url(test: &str) -> Option<String> {
    let url = match std::env::var("EVENTS_TEST_NATS_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => {
            assert!(
                !require(),
                "{test}: EVENTS_TEST_REQUIRE_SERVICES=1 but EVENTS_TEST_NATS_URL is not set"
            );
            skip(&format!("{test}: skipped: EVENTS_TEST_NATS_URL is not set"));
            return None;
        }
    };
    match runtime().block_on(async_nats::connect(&url)) {
        Ok(_) => Some(url),
        Err(e) if require() => panic!("{test}: NATS at {url} is unreachable: {e}"),
        Err(e) => {
            skip(&format!(
                "{test}: skipped: NATS at {url} is unreachable: {e}"
            ));
            None
        }
    }
}

/// Both binaries, or `None` after saying why the test is skipped (failing with
/// `EVENTS_TEST_REQUIRE_SERVICES=1`).
fn binaries(test: &str) -> Option<(PathBuf, PathBuf)> {
    match (example_binary("orders"), example_binary("billing")) {
        (Some(o), Some(b)) => Some((o, b)),
        _ => {
            let why = "the orders and billing examples are not built (`cargo test -p examples` \
                       builds them; `--test two_services` alone does not: run \
                       `cargo build -p examples --examples` first)";
            assert!(!require(), "{test}: {why}");
            skip(&format!("{test}: skipped: {why}"));
            None
        }
    }
}

/// A client of the server, or of a cluster's servers (`url` comma-separated).
async fn client(url: &str) -> async_nats::Client {
    async_nats::connect(url.split(',').collect::<Vec<_>>())
        .await
        .unwrap()
}

/// A directory of this test's own for its SQLite files.
fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "two-services-{test}-{}",
        uuid::Uuid::now_v7().simple()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A stream of the test's own, and the subject prefix its events go under (two streams on
/// one server cannot capture the same subjects).
struct Pair {
    url: String,
    orders_bin: PathBuf,
    billing_bin: PathBuf,
    stream: String,
    prefix: String,
    dir: PathBuf,
}

impl Pair {
    fn new(test: &str) -> Option<Pair> {
        let url = nats_url(test)?;
        let (orders_bin, billing_bin) = binaries(test)?;
        let id = uuid::Uuid::now_v7().simple().to_string();
        Some(Pair {
            url,
            orders_bin,
            billing_bin,
            stream: format!("TWO{id}"),
            prefix: format!("two{id}"),
            dir: temp_dir(test),
        })
    }

    fn database(&self, name: &str) -> String {
        format!("sqlite://{}", self.dir.join(format!("{name}.db")).display())
    }

    fn orders(&self) -> Command {
        let mut c = Command::new(&self.orders_bin);
        c.args(["--database", &self.database("orders")])
            .args(["--nats", &self.url, "--stream", &self.stream])
            .args(["--subject-prefix", &self.prefix]);
        c
    }

    /// `billing` with its own database and durable consumer, both named `name`.
    fn billing(&self, name: &str, extra: &[&str]) -> Command {
        self.billing_idle(name, 3, extra)
    }

    /// [`billing`](Self::billing), idling out after `idle` seconds without a message.
    fn billing_idle(&self, name: &str, idle: u64, extra: &[&str]) -> Command {
        let mut c = Command::new(&self.billing_bin);
        c.args(["--database", &self.database(name), "--consumer", name])
            .args(["--nats", &self.url, "--stream", &self.stream])
            .args(["--subject-prefix", &self.prefix])
            .args(["--idle-exit", &idle.to_string()])
            .args(extra);
        c
    }

    /// A consumer `name` that fetched the stream's first `n` messages and died before it
    /// acknowledged them: created as billing creates its own, the messages fetched and
    /// dropped. They come back after the ack wait (10 s), after later ones.
    fn fetch_and_die(&self, name: &str, n: usize) {
        use futures_util::StreamExt;
        runtime().block_on(async {
            let client = client(&self.url).await;
            let js = async_nats::jetstream::new(client);
            let stream = js.get_stream(&self.stream).await.unwrap();
            let consumer = stream
                .get_or_create_consumer(
                    name,
                    async_nats::jetstream::consumer::pull::Config {
                        durable_name: Some(name.to_owned()),
                        ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
                        ack_wait: Duration::from_secs(10),
                        max_deliver: 50,
                        max_ack_pending: 256,
                        filter_subject: format!("{}.order.>", self.prefix),
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            let mut messages = consumer
                .fetch()
                .max_messages(n)
                .expires(Duration::from_secs(5))
                .messages()
                .await
                .unwrap();
            let mut got = 0;
            while let Some(m) = messages.next().await {
                m.unwrap();
                got += 1;
            }
            assert_eq!(got, n, "fetched the first {n} messages");
        });
    }

    /// Whether the stream holds `n` messages or more now (`false` while it cannot be read).
    fn holds(&self, n: u64) -> bool {
        runtime().block_on(async {
            let js = async_nats::jetstream::new(client(&self.url).await);
            match js.get_stream(&self.stream).await {
                Ok(mut s) => s.info().await.is_ok_and(|i| i.state.messages >= n),
                Err(_) => false,
            }
        })
    }

    /// Messages in the stream now.
    fn messages(&self) -> u64 {
        runtime().block_on(async {
            let client = client(&self.url).await;
            let js = async_nats::jetstream::new(client);
            let mut stream = js.get_stream(&self.stream).await.unwrap();
            stream.info().await.unwrap().state.messages
        })
    }

    /// Messages the durable consumer `name` has had delivered (its stream sequence).
    fn delivered(&self, name: &str) -> u64 {
        runtime().block_on(async {
            let client = client(&self.url).await;
            let js = async_nats::jetstream::new(client);
            let stream = js.get_stream(&self.stream).await.unwrap();
            match stream
                .get_consumer::<async_nats::jetstream::consumer::pull::Config>(name)
                .await
            {
                Ok(mut c) => c.info().await.unwrap().delivered.stream_sequence,
                Err(_) => 0,
            }
        })
    }

    /// Messages the durable consumers `names` have had delivered, in all (first deliveries:
    /// their consumer sequences, less their redeliveries).
    fn delivered_count(&self, names: &[String]) -> u64 {
        runtime().block_on(async {
            let client = client(&self.url).await;
            let js = async_nats::jetstream::new(client);
            let Ok(stream) = js.get_stream(&self.stream).await else {
                return 0;
            };
            let mut n = 0;
            for name in names {
                if let Ok(mut c) = stream
                    .get_consumer::<async_nats::jetstream::consumer::pull::Config>(name)
                    .await
                {
                    if let Ok(i) = c.info().await {
                        n += i.delivered.consumer_sequence - i.num_redelivered as u64;
                    }
                }
            }
            n
        })
    }

    /// The stream goes with a test that passed; a failed one leaves it for a post-mortem.
    fn delete_stream(&self) {
        runtime().block_on(async {
            let client = client(&self.url).await;
            let js = async_nats::jetstream::new(client);
            js.delete_stream(&self.stream).await.unwrap();
        });
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `orders` is complete: every placed order shipped, the stream holds each of its events once.
fn assert_orders_complete(pair: &Pair, orders: &Value, e: &Expected) {
    assert_eq!(count(orders, "orders_placed"), e.orders, "{orders}");
    assert_eq!(count(orders, "orders_shipped"), e.orders, "{orders}");
    assert_eq!(revenue(orders), e.revenue_by_region, "orders' revenue");
    assert_eq!(
        pair.messages(),
        count(orders, "events_dispatched"),
        "the stream holds each event once"
    );
}

/// A re-run after a crash committed only what the crashed run had not: something, not all.
fn assert_resumed(what: &str, again: &Value, events: u64) {
    let appended = count(again, "appended");
    assert!(
        0 < appended && appended < events,
        "{what}: the crashed run committed part of the stream: {again}"
    );
    eprintln!("{what}: {again}");
}

// ---- the tests ------------------------------------------------------------------------------

#[test]
fn billing_is_exact_after_a_clean_run_a_crash_before_the_ack_and_a_sigkill() {
    let test = "billing_is_exact";
    let Some(pair) = Pair::new(test) else {
        return;
    };
    let started = Instant::now();
    let e = expected(&examples::orders::default_input());
    let out = pair.orders().output().unwrap();
    let orders = summary("orders", &out);
    assert_orders_complete(&pair, &orders, &e);
    let events = count(&orders, "events_dispatched");
    eprintln!("{test}: orders done in {:?}", started.elapsed());
    // The report shows the relay among the destinations, every event published.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let relay = format!("nats:{}", pair.stream);
    let row = stdout
        .lines()
        .find(|l| l.contains(&relay))
        .unwrap_or_else(|| panic!("no row of {relay} in the report:\n{stdout}"));
    let cells: Vec<&str> = row
        .split(['│', '┆'])
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(cells[2], "relay, after commit", "{row}");
    assert_eq!(
        cells[4].replace(',', ""),
        events.to_string(),
        "published: {row}"
    );
    assert_eq!(cells[7], "0", "pending: {row}");

    // Three consumers of the same stream, each with its own database, at once.
    std::thread::scope(|s| {
        let pair = &pair;
        let (orders, e) = (&orders, &e);
        s.spawn(move || {
            let clean = summary("billing", &pair.billing("clean", &[]).output().unwrap());
            assert_billing_exact("clean run", &clean, orders, e);
            assert_eq!(count(&clean, "received"), events, "{clean}");
            assert_eq!(count(&clean, "appended"), events, "{clean}");
            assert_eq!(count(&clean, "duplicates_skipped"), 0, "{clean}");
        });
        s.spawn(move || {
            let crashed = pair
                .billing("crash", &["--crash-after", "5000"])
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&crashed.stderr);
            assert!(!crashed.status.success(), "{stderr}");
            assert!(stderr.contains("--crash-after: "), "{stderr}");
            assert!(crashed.stdout.is_empty(), "no report from a crashed run");
            let again = summary(
                "billing after --crash-after",
                &pair.billing("crash", &[]).output().unwrap(),
            );
            assert_billing_exact("after --crash-after", &again, orders, e);
            assert!(
                count(&again, "duplicates_skipped") > 0,
                "the batch committed before the crash is redelivered and skipped: {again}"
            );
            assert_resumed("after --crash-after", &again, events);
        });
        s.spawn(move || {
            let mut running = Running::spawn(pair.billing("kill", &[]));
            assert!(
                running.wait_for("billing to take 8,000 messages", || {
                    pair.delivered("kill") >= 8_000
                }),
                "billing ended before it was killed"
            );
            let killed = running.kill();
            assert!(!killed.status.success());
            assert!(killed.stdout.is_empty(), "no report from a killed run");
            let again = summary(
                "billing after SIGKILL",
                &pair.billing("kill", &[]).output().unwrap(),
            );
            assert_billing_exact("after SIGKILL", &again, orders, e);
            assert_resumed("after SIGKILL", &again, events);
        });
        // A consumer died holding the first 200 messages unacknowledged: they come back
        // after the ack wait, after later events of the same orders were received.
        s.spawn(move || {
            pair.fetch_and_die("unacked", 200);
            let out = summary(
                "billing after a consumer died holding messages",
                &pair.billing("unacked", &[]).output().unwrap(),
            );
            assert_billing_exact("after a consumer died holding messages", &out, orders, e);
            assert_eq!(count(&out, "appended"), events, "{out}");
        });
        // Two instances on one durable consumer and one database; one is killed mid-run,
        // the other takes its unacknowledged messages after the ack wait.
        s.spawn(move || {
            let two = ["--instances", "2"];
            let mut first = Running::spawn(pair.billing_idle("pair", 20, &two));
            let second = Running::spawn(pair.billing_idle("pair", 20, &two));
            assert!(
                first.wait_for("the pair to take 6,000 messages", || {
                    pair.delivered("pair") >= 6_000
                }),
                "the first instance ended before it was killed"
            );
            let killed = first.kill();
            assert!(!killed.status.success());
            let out = summary("the surviving instance", &second.finish());
            assert_billing_exact("two instances, one killed", &out, orders, e);
            eprintln!(
                "two instances, one killed: the survivor finished in {} ms",
                count(&out, "elapsed_ms")
            );
        });
    });
    eprintln!("{test}: passed in {:?}", started.elapsed());
    pair.delete_stream();
}

#[test]
fn orders_killed_mid_run_and_run_again_publishes_each_event_once() {
    let test = "orders_killed";
    let Some(pair) = Pair::new(test) else {
        return;
    };
    let started = Instant::now();
    let e = expected(&examples::orders::default_input());
    let mut running = Running::spawn(pair.orders());
    // The stream exists once orders has connected; kill it once a third of its events are out.
    let stream_holds = |n: u64| {
        runtime().block_on(async {
            let client = client(&pair.url).await;
            let js = async_nats::jetstream::new(client);
            match js.get_stream(&pair.stream).await {
                Ok(mut s) => s.info().await.unwrap().state.messages >= n,
                Err(_) => false,
            }
        })
    };
    assert!(
        running.wait_for("orders to publish 7,000 events", || stream_holds(7_000)),
        "orders ended before it was killed"
    );
    let killed = running.kill();
    assert!(!killed.status.success());
    let published = pair.messages();
    eprintln!(
        "{test}: orders killed after {:?} with {published} events in the stream",
        started.elapsed()
    );

    let orders = summary("orders after SIGKILL", &pair.orders().output().unwrap());
    assert!(
        count(&orders, "rows_already_imported") > 0,
        "the killed run had imported rows: {orders}"
    );
    assert!(
        published < count(&orders, "events_dispatched"),
        "killed mid-run"
    );
    assert_orders_complete(&pair, &orders, &e);

    let billing = summary("billing", &pair.billing("billing", &[]).output().unwrap());
    assert_billing_exact("after orders was killed", &billing, &orders, &e);
    assert_eq!(
        count(&billing, "received"),
        count(&orders, "events_dispatched"),
        "{billing}"
    );
    assert_eq!(count(&billing, "duplicates_skipped"), 0, "{billing}");
    eprintln!("{test}: passed in {:?}", started.elapsed());
    pair.delete_stream();
}

/// The header and the first `rows` data rows of the bundled file, in the pair's folder.
fn first_rows(pair: &Pair, rows: usize) -> PathBuf {
    let bytes = std::fs::read(examples::orders::default_input()).unwrap();
    let out: Vec<u8> = bytes
        .split_inclusive(|&b| b == b'\n')
        .take(rows + 1)
        .flatten()
        .copied()
        .collect();
    let path = pair.dir.join("first-rows.csv");
    std::fs::write(&path, out).unwrap();
    path
}

/// The README's NATS path followed on the main job's database: `orders --nats` there commits
/// nothing (every row is already imported) and its relay, added after those events, never
/// publishes them. It says so on stderr, with the fix; on a fresh database, and once the
/// relay has deliveries, it says nothing.
#[test]
fn orders_with_nats_on_a_database_filled_without_it_warns_that_nothing_is_published() {
    let test = "nats_on_a_filled_database";
    let Some(pair) = Pair::new(test) else {
        return;
    };
    let input = first_rows(&pair, 40);
    let input = input.to_str().unwrap();
    let quiet = [
        "--flaky-rate",
        "0",
        "--redeliver-every",
        "0",
        "--input",
        input,
    ];
    let main_job = Command::new(&pair.orders_bin)
        .args(["--database", &pair.database("orders")])
        .args(quiet)
        .output()
        .unwrap();
    assert!(main_job.status.success(), "{main_job:?}");

    let out = pair.orders().args(quiet).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: ")
            && stderr.contains("events committed without --nats")
            && stderr.contains("never publishes them")
            && stderr.contains("fresh database"),
        "{stderr}"
    );
    assert_eq!(pair.messages(), 0, "nothing was published");

    let fresh = |what: &str| {
        let out = Command::new(&pair.orders_bin)
            .args(["--database", &pair.database("fresh")])
            .args(["--nats", &pair.url, "--stream", &pair.stream])
            .args(["--subject-prefix", &pair.prefix])
            .args(quiet)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{what}: {stderr}");
        assert!(!stderr.contains("never publishes"), "{what}: {stderr}");
    };
    fresh("a fresh database");
    assert!(
        pair.messages() > 0,
        "the fresh database's events were published"
    );
    fresh("the same database again (its relay has deliveries)");
    pair.delete_stream();
}

#[test]
fn both_services_on_a_three_server_cluster_are_exact_when_the_stream_leader_is_killed_mid_run() {
    let test = "cluster";
    let Some(mut pair) = Pair::new(test) else {
        return;
    };
    let Some(mut cluster) = nats_cluster::OwnCluster::start() else {
        return;
    };
    let started = Instant::now();
    let rt = runtime();
    rt.block_on(cluster.ready());
    pair.url = cluster.url();
    let e = expected(&examples::orders::default_input());
    let mut orders_cmd = pair.orders();
    orders_cmd.args(["--stream-replicas", "3"]);
    let mut orders = Running::spawn(orders_cmd);
    assert!(
        orders.wait_for("orders to publish 2,000 events", || pair.holds(2_000)),
        "orders ended before billing started"
    );
    // Idle-exit after 30 s without a message: beyond a failover and the ack wait (10 s).
    let mut billing = Running::spawn(pair.billing_idle("billing", 30, &[]));
    assert!(
        billing.wait_for("billing to take 3,000 messages", || pair
            .delivered("billing")
            >= 3_000),
        "billing ended before the kill"
    );
    let leader = rt.block_on(cluster.stream_leader(&pair.stream));
    cluster.kill(leader);
    let killed = Instant::now();
    eprintln!(
        "{test}: killed the stream's leader {} after {:?}",
        cluster.nodes[leader].name,
        started.elapsed()
    );
    std::thread::sleep(Duration::from_secs(5));
    assert!(cluster.up(leader));
    let orders = summary("orders on the cluster", &orders.finish());
    assert_orders_complete(&pair, &orders, &e);
    let billing = summary("billing on the cluster", &billing.finish());
    assert_billing_exact("a stream leader killed mid-run", &billing, &orders, &e);
    eprintln!(
        "{test}: passed in {:?} ({:?} after the kill)",
        started.elapsed(),
        killed.elapsed()
    );
    let _ = std::fs::remove_dir_all(&pair.dir);
}

#[test]
fn three_billing_instances_share_a_partitioned_stream_and_stay_exact_when_one_and_a_server_are_killed(
) {
    let test = "group";
    let Some(mut pair) = Pair::new(test) else {
        return;
    };
    let Some(mut cluster) = nats_cluster::OwnCluster::start() else {
        return;
    };
    let started = Instant::now();
    let rt = runtime();
    rt.block_on(cluster.ready());
    pair.url = cluster.url();
    let e = expected(&examples::orders::default_input());
    let mut orders_cmd = pair.orders();
    orders_cmd.args(["--stream-replicas", "3", "--partitions", "4"]);
    let mut orders = Running::spawn(orders_cmd);
    assert!(
        orders.wait_for("orders to publish 2,000 events", || pair.holds(2_000)),
        "orders ended before billing started"
    );
    // Three instances of one billing (one database, one group), idling out after 30 s without
    // a message: beyond a lease (10 s), the ack wait (10 s) and a failover.
    let instance = |member: &str, idle: u64| {
        pair.billing_idle("billing", idle, &["--partitions", "4", "--member", member])
    };
    let mut b1 = Running::spawn(instance("b1", 30));
    let b2 = Running::spawn(instance("b2", 30));
    let b3 = Running::spawn(instance("b3", 30));
    let consumers: Vec<String> = (0..4).map(|p| format!("billing-{p}")).collect();
    assert!(
        b1.wait_for("the group to take 3,000 messages", || pair
            .delivered_count(&consumers)
            >= 3_000),
        "billing ended before the kills"
    );
    // An instance killed (SIGKILL: its batch unacknowledged, its lease left to expire), and
    // the server leading the stream.
    let out = b2.kill();
    eprintln!(
        "{test}: killed billing b2 after {:?}: {}",
        started.elapsed(),
        String::from_utf8_lossy(&out.stderr)
    );
    let leader = rt.block_on(cluster.stream_leader(&pair.stream));
    cluster.kill(leader);
    let killed = Instant::now();
    eprintln!(
        "{test}: killed the stream's leader {}",
        cluster.nodes[leader].name
    );
    std::thread::sleep(Duration::from_secs(5));
    assert!(cluster.up(leader));
    let orders = summary("orders on the cluster", &orders.finish());
    assert_orders_complete(&pair, &orders, &e);
    let b1 = summary("billing b1", &b1.finish());
    let b3 = summary("billing b3", &b3.finish());
    for (name, s) in [("b1", &b1), ("b3", &b3)] {
        assert_eq!(count(s, "dead_lettered"), 0, "{name}: {s}");
        assert_eq!(count(s, "out_of_order"), 0, "{name}: {s}");
        assert!(count(s, "received") > 0, "{name} took a share: {s}");
    }
    // The last to leave has every total; one more instance finds nothing left to do.
    let last = summary(
        "billing, the last",
        &Running::spawn(instance("b4", 3)).finish(),
    );
    assert_eq!(count(&last, "others_running"), 0, "{last}");
    assert_billing_exact("one instance and a server killed", &last, &orders, &e);
    eprintln!(
        "{test}: passed in {:?} ({:?} after the kills); b1 received {}, b3 {}",
        started.elapsed(),
        killed.elapsed(),
        count(&b1, "received"),
        count(&b3, "received")
    );
    let _ = std::fs::remove_dir_all(&pair.dir);
}

// ---- metrics --------------------------------------------------------------------------------

/// `GET /metrics` on `port`: the samples (`name{labels}` → value) of the Prometheus text, and
/// the `# TYPE` of each family; `None` while nothing answers.
fn scrape(port: u16) -> Option<(HashMap<String, f64>, HashMap<String, String>)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "{head}"
    );
    let (mut samples, mut types) = (HashMap::new(), HashMap::new());
    for line in body.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let (name, kind) = t.split_once(' ').unwrap();
            types.insert(name.to_owned(), kind.to_owned());
        } else if !line.starts_with('#') && !line.is_empty() {
            let (key, value) = line.rsplit_once(' ').unwrap();
            samples.insert(key.to_owned(), value.parse().unwrap());
        }
    }
    Some((samples, types))
}

/// Scrapes `port` every 200 ms while `running` runs, keeping each sample's highest value and
/// every family's type; returns them with the process's output.
fn scrape_while(mut running: Running) -> (Output, HashMap<String, f64>, HashMap<String, String>) {
    let (mut highest, mut types) = (HashMap::new(), HashMap::new());
    let port = running.1;
    while running.0.as_mut().unwrap().try_wait().unwrap().is_none() {
        if let Some((samples, t)) = scrape(port) {
            for (k, v) in samples {
                let e = highest.entry(k).or_insert(v);
                *e = f64::max(*e, v);
            }
            types.extend(t);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    (running.finish(), highest, types)
}

/// The label values of `name`'s samples for label `label`.
fn label_values(samples: &HashMap<String, f64>, name: &str, label: &str) -> Vec<String> {
    let prefix = format!("{name}{{");
    let key = format!("{label}=\"");
    samples
        .keys()
        .filter_map(|k| k.strip_prefix(&prefix))
        .filter_map(|rest| {
            let at = rest.find(&key)? + key.len();
            Some(rest[at..at + rest[at..].find('"')?].to_owned())
        })
        .collect()
}

#[test]
fn both_services_serve_their_metrics_to_prometheus_while_they_run() {
    let test = "metrics";
    let Some(pair) = Pair::new(test) else {
        return;
    };
    // The first 3,000 rows: several seconds of import, hundreds of retries and dead letters.
    let input = first_rows(&pair, 3_000);
    let e = expected(&input);
    let port = nats_cluster::free_port();
    let mut orders = pair.orders();
    orders.arg("--input").arg(&input);
    orders.args(["--metrics-addr", &format!("127.0.0.1:{port}")]);
    let (out, seen, types) = scrape_while(Running::spawn_serving(orders, port));
    let summary_orders = summary("orders", &out);
    assert_orders_complete(&pair, &summary_orders, &e);
    let relay = format!("nats:{}", pair.stream);
    let has = |name: &str| {
        seen.keys()
            .any(|k| k == name || k.starts_with(&format!("{name}{{")))
    };
    for name in [
        "events_outbox_backlog",
        "events_outbox_oldest_pending_age_seconds",
        "events_dead_letters",
        "events_delivery_retries_total",
        "events_deliveries_dead_lettered_total",
        "events_destination_oldest_pending_age_seconds",
        "events_nats_published_total",
    ] {
        assert!(has(name), "orders served no {name}: {:?}", seen.keys());
    }
    let max = |key: &str| seen.get(key).copied().unwrap_or(-1.0);
    assert!(
        max("events_outbox_backlog") > 0.0,
        "a backlog while importing"
    );
    let destinations = label_values(&seen, "events_delivery_retries_total", "destination");
    assert!(destinations.contains(&relay), "{destinations:?}");
    let retried: f64 = destinations
        .iter()
        .map(|d| {
            max(&format!(
                "events_delivery_retries_total{{destination=\"{d}\"}}"
            ))
        })
        .sum();
    assert!(retried > 0.0, "the flaky handlers' retries are counted");
    assert!(
        max("events_deliveries_dead_lettered_total{destination=\"orders.erp_export\"}") > 0.0,
        "the ERP export's refusals are counted"
    );
    // The relay's lag: its oldest pending delivery's age.
    assert!(
        max(&format!(
            "events_destination_oldest_pending_age_seconds{{destination=\"{relay}\"}}"
        )) >= 0.0
    );
    // A histogram with buckets (not a summary), labelled by destination only.
    assert_eq!(
        types
            .get("events_delivery_duration_seconds")
            .map(String::as_str),
        Some("histogram")
    );
    assert!(
        seen.contains_key(&format!(
            "events_delivery_duration_seconds_bucket{{destination=\"{relay}\",le=\"0.005\"}}"
        )),
        "{:?}",
        seen.keys()
            .filter(|k| k.contains("duration"))
            .collect::<Vec<_>>()
    );
    // Labels are destination names (a handler or the relay), never payload values.
    for d in label_values(
        &seen,
        "events_delivery_duration_seconds_bucket",
        "destination",
    ) {
        assert!(d == relay || d.starts_with("orders."), "{d}");
    }
    for k in seen.keys().filter(|k| k.starts_with("events_")) {
        let labels = k.split_once('{').map_or("", |(_, l)| l);
        for pair in labels
            .trim_end_matches('}')
            .split(',')
            .filter(|l| !l.is_empty())
        {
            let name = pair.split_once('=').unwrap().0;
            assert!(
                ["destination", "le", "reason", "group"].contains(&name),
                "{k}"
            );
        }
    }

    // billing: what it received, held events and gaps.
    let port = nats_cluster::free_port();
    let addr = format!("127.0.0.1:{port}");
    let billing = pair.billing("metrics", &["--metrics-addr", &addr]);
    let (out, seen, _) = scrape_while(Running::spawn_serving(billing, port));
    let summary_billing = summary("billing", &out);
    assert_billing_exact(
        "billing serving metrics",
        &summary_billing,
        &summary_orders,
        &e,
    );
    for name in [
        "events_inbox_held",
        "events_inbox_open_gaps",
        "events_outbox_backlog",
        "events_nats_received_total",
        "events_delivery_retries_total",
    ] {
        assert!(
            seen.keys()
                .any(|k| k == name || k.starts_with(&format!("{name}{{"))),
            "billing served no {name}: {:?}",
            seen.keys()
        );
    }
    assert_eq!(
        seen.get("events_nats_received_total").copied(),
        Some(count(&summary_orders, "events_dispatched") as f64),
        "every message received once"
    );
    pair.delete_stream();
}

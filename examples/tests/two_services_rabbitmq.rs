//! The two example services through RabbitMQ (`EVENTS_TEST_AMQP_URL`): `orders --broker
//! amqp://…` publishes the bundled data set to an exchange of the test's own, and `billing
//! --broker amqp://…` consumes its queue (declared with `billing events rabbitmq topology
//! create` before orders runs, each billing with a queue and a database of its own). The same
//! assertions as on NATS (`two_services.rs`): billing invoices every shipped order exactly once
//! with the revenue by region the CSV gives, in each order's order, after a clean run, after
//! `--crash-after` (committed, not acknowledged) and a re-run, after a SIGKILL mid-run and a
//! re-run; and after orders is killed mid-run and run again (RabbitMQ has no de-duplication:
//! what the killed run published but had not seen confirmed is published again, and billing's
//! inbox skips it). And a group: three billing instances sharing four partition queues, one
//! killed with SIGKILL and the broker restarted mid-run (`rabbitmqctl stop_app` / `start_app`;
//! that case runs alone in this binary, the others wait for it), the last to leave exact.

use std::path::PathBuf;
use std::process::Command;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use serde_json::Value;

mod services;

use services::{
    assert_billing_exact, count, example_binary, expected, require, revenue, runtime, skip,
    summary, Expected, Running,
};

/// The broker restart of the group case disturbs every other case of this binary: they share
/// it, the restart takes it alone.
static BROKER: RwLock<()> = RwLock::new(());

/// An exchange of the test's own and the routing key prefix its events go under, both
/// binaries, and a folder for the databases.
struct Pair {
    url: String,
    orders_bin: PathBuf,
    billing_bin: PathBuf,
    exchange: String,
    prefix: String,
    id: String,
    dir: PathBuf,
}

impl Pair {
    fn new(test: &str) -> Option<Pair> {
        let url = match std::env::var("EVENTS_TEST_AMQP_URL") {
            Ok(url) if !url.is_empty() => url,
            _ => {
                assert!(
                    !require(),
                    "{test}: EVENTS_TEST_REQUIRE_SERVICES=1 but EVENTS_TEST_AMQP_URL is not set"
                );
                skip(&format!("{test}: skipped: EVENTS_TEST_AMQP_URL is not set"));
                return None;
            }
        };
        let (Some(orders_bin), Some(billing_bin)) =
            (example_binary("orders"), example_binary("billing"))
        else {
            let why = "the orders and billing examples are not built (`cargo test -p examples` \
                       builds them; run `cargo build -p examples --examples` first)";
            assert!(!require(), "{test}: {why}");
            skip(&format!("{test}: skipped: {why}"));
            return None;
        };
        let id = uuid::Uuid::now_v7().simple().to_string();
        let dir = std::env::temp_dir().join(format!("two-services-amqp-{test}-{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        Some(Pair {
            url,
            orders_bin,
            billing_bin,
            exchange: format!("TWO{id}"),
            prefix: format!("two{id}"),
            id,
            dir,
        })
    }

    fn database(&self, name: &str) -> String {
        format!("sqlite://{}", self.dir.join(format!("{name}.db")).display())
    }

    /// The queue (and consumer name) of billing `name`.
    fn queue(&self, name: &str) -> String {
        format!("{name}-{}", self.id)
    }

    fn orders(&self) -> Command {
        let mut c = Command::new(&self.orders_bin);
        c.args(["--database", &self.database("orders")])
            .args(["--broker", &self.url, "--stream", &self.exchange])
            .args(["--subject-prefix", &self.prefix]);
        c
    }

    /// `billing events rabbitmq topology create` for billing `name`, before orders runs.
    fn topology(&self, name: &str) {
        self.topology_partitioned(name, 1);
    }

    /// The same with `partitions` queues.
    fn topology_partitioned(&self, name: &str, partitions: u32) {
        let out = Command::new(&self.billing_bin)
            .args([
                "events",
                "rabbitmq",
                "topology",
                "create",
                &self.queue(name),
            ])
            .args(["--amqp", &self.url, "--exchange", &self.exchange])
            .args(["--routing-key-prefix", &self.prefix, "--binding", "order.#"])
            .args(["--partitions", &partitions.to_string()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "topology of {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn billing(&self, name: &str, extra: &[&str]) -> Command {
        self.billing_idle(name, "3", extra)
    }

    /// Billing `name` idling out after `idle` seconds.
    fn billing_idle(&self, name: &str, idle: &str, extra: &[&str]) -> Command {
        let mut c = Command::new(&self.billing_bin);
        c.args(["--database", &self.database(name)])
            .args(["--consumer", &self.queue(name)])
            .args(["--broker", &self.url, "--stream", &self.exchange])
            .args(["--subject-prefix", &self.prefix])
            .args(["--idle-exit", idle])
            .args(extra);
        c
    }

    /// Messages ready in billing `name`'s queue (not counting those delivered and not yet
    /// acknowledged).
    fn ready(&self, name: &str) -> u64 {
        self.ready_in(&self.queue(name))
    }

    /// Messages ready in `queue`.
    fn ready_in(&self, queue: &str) -> u64 {
        runtime().block_on(async {
            let connection = Connection::connect(&self.url, ConnectionProperties::default())
                .await
                .unwrap();
            let channel = connection.create_channel().await.unwrap();
            let queue = channel
                .queue_declare(
                    queue.into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .unwrap();
            u64::from(queue.message_count())
        })
    }

    /// The queues, exchanges and databases go with a test that passed.
    fn delete(&self, names: &[&str]) {
        runtime().block_on(async {
            let connection = Connection::connect(&self.url, ConnectionProperties::default())
                .await
                .unwrap();
            let channel = connection.create_channel().await.unwrap();
            for name in names {
                let queues = (0..8)
                    .map(|k| format!("{}.{k}", self.queue(name)))
                    .chain([self.queue(name), format!("{}.parking", self.queue(name))]);
                for q in queues {
                    let _ = channel
                        .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                        .await;
                }
                let _ = channel
                    .exchange_delete(
                        format!("{}.dlx", self.queue(name)).as_str().into(),
                        Default::default(),
                    )
                    .await;
            }
            let _ = channel
                .exchange_delete(self.exchange.as_str().into(), Default::default())
                .await;
        });
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn assert_orders_complete(orders: &Value, e: &Expected) {
    assert_eq!(count(orders, "orders_placed"), e.orders, "{orders}");
    assert_eq!(count(orders, "orders_shipped"), e.orders, "{orders}");
    assert_eq!(revenue(orders), e.revenue_by_region, "orders' revenue");
}

#[test]
fn billing_on_rabbitmq_is_exact_after_a_clean_run_a_crash_before_the_ack_and_a_sigkill() {
    let test = "amqp_billing_is_exact";
    let Some(pair) = Pair::new(test) else {
        return;
    };
    let _shared = BROKER.read().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let e = expected(&examples::orders::default_input());
    for name in ["clean", "crash", "kill"] {
        pair.topology(name);
    }
    let out = pair.orders().output().unwrap();
    let orders = summary("orders", &out);
    assert_orders_complete(&orders, &e);
    let events = count(&orders, "events_dispatched");
    assert_eq!(
        pair.ready("clean"),
        events,
        "each queue holds every event once"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("amqp:{}", pair.exchange)),
        "the relay in the report:\n{stdout}"
    );
    eprintln!("{test}: orders done in {:?}", started.elapsed());

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
            let again = summary(
                "billing after --crash-after",
                &pair.billing("crash", &[]).output().unwrap(),
            );
            assert_billing_exact("after --crash-after", &again, orders, e);
            assert!(
                count(&again, "duplicates_skipped") > 0,
                "the batch committed before the crash comes back and is skipped: {again}"
            );
            let appended = count(&again, "appended");
            assert!(0 < appended && appended < events, "{again}");
        });
        s.spawn(move || {
            let mut running = Running::spawn(pair.billing("kill", &[]));
            assert!(
                running.wait_for("billing to take 8,000 messages", || {
                    pair.ready("kill") + 8_000 <= events
                }),
                "billing ended before it was killed"
            );
            let killed = running.kill();
            assert!(!killed.status.success());
            let again = summary(
                "billing after SIGKILL",
                &pair.billing("kill", &[]).output().unwrap(),
            );
            assert_billing_exact("after SIGKILL", &again, orders, e);
            let appended = count(&again, "appended");
            assert!(0 < appended && appended < events, "{again}");
        });
    });
    eprintln!("{test}: passed in {:?}", started.elapsed());
    pair.delete(&["clean", "crash", "kill"]);
}

#[test]
fn orders_killed_mid_run_on_rabbitmq_and_run_again_loses_nothing() {
    let test = "amqp_orders_killed";
    let Some(pair) = Pair::new(test) else {
        return;
    };
    let _shared = BROKER.read().unwrap_or_else(|e| e.into_inner());
    let e = expected(&examples::orders::default_input());
    pair.topology("billing");
    let mut running = Running::spawn(pair.orders());
    assert!(
        running.wait_for("orders to publish 7,000 events", || {
            pair.ready("billing") >= 7_000
        }),
        "orders ended before it was killed"
    );
    let killed = running.kill();
    assert!(!killed.status.success());
    let orders = summary("orders after SIGKILL", &pair.orders().output().unwrap());
    assert!(count(&orders, "rows_already_imported") > 0, "{orders}");
    assert_orders_complete(&orders, &e);
    let events = count(&orders, "events_dispatched");
    let queued = pair.ready("billing");
    assert!(
        queued >= events,
        "every event in the queue: {queued} < {events}"
    );

    let billing = summary("billing", &pair.billing("billing", &[]).output().unwrap());
    assert_billing_exact("after orders was killed", &billing, &orders, &e);
    assert_eq!(count(&billing, "appended"), events, "{billing}");
    assert_eq!(
        count(&billing, "received"),
        events + count(&billing, "duplicates_skipped"),
        "what orders published again is skipped: {billing}"
    );
    pair.delete(&["billing"]);
}

fn rabbitmqctl(args: &[&str]) -> Result<(), String> {
    let output = Command::new("rabbitmqctl")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run rabbitmqctl: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "rabbitmqctl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// Starts the broker's application again when dropped, whatever happened.
struct StartAgain;

impl Drop for StartAgain {
    fn drop(&mut self) {
        let _ = rabbitmqctl(&["start_app"]);
        let _ = rabbitmqctl(&["await_startup"]);
    }
}

#[test]
fn three_billing_instances_share_the_partition_queues_through_a_kill_and_a_broker_restart() {
    let test = "amqp_group";
    let Some(pair) = Pair::new(test) else {
        return;
    };
    if let Err(why) = rabbitmqctl(&["status"]) {
        assert!(!require(), "{test}: the broker cannot be driven: {why}");
        skip(&format!("{test}: skipped: {why}"));
        return;
    }
    let _alone = BROKER.write().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let e = expected(&examples::orders::default_input());
    pair.topology_partitioned("billing", 4);
    let queues: Vec<String> = (0..4)
        .map(|k| format!("{}.{k}", pair.queue("billing")))
        .collect();
    let ready = || queues.iter().map(|q| pair.ready_in(q)).sum::<u64>();
    let mut orders_cmd = pair.orders();
    orders_cmd.args(["--partitions", "4"]);
    let orders = Running::spawn(orders_cmd);
    // Three instances of one billing (one database, one group), idling out after 20 s without
    // a message: beyond a lease (10 s) and the broker's restart.
    let instance = |member: &str, idle: &str| {
        pair.billing_idle("billing", idle, &["--partitions", "4", "--member", member])
    };
    let mut b1 = Running::spawn(instance("b1", "20"));
    let b2 = Running::spawn(instance("b2", "20"));
    let b3 = Running::spawn(instance("b3", "20"));
    // Mid-run: a backlog in the queues, or ten seconds of consuming.
    let consuming = Instant::now();
    assert!(
        b1.wait_for("the group to consume", || {
            ready() >= 1_500 || consuming.elapsed() >= Duration::from_secs(10)
        }),
        "billing ended before the kill"
    );
    let out = b2.kill();
    eprintln!(
        "{test}: killed billing b2 after {:?}: {}",
        started.elapsed(),
        String::from_utf8_lossy(&out.stderr)
    );
    {
        let _start_again = StartAgain;
        rabbitmqctl(&["stop_app"]).unwrap();
        eprintln!("{test}: the broker is stopped");
        std::thread::sleep(Duration::from_secs(3));
    }
    eprintln!("{test}: the broker is back after {:?}", started.elapsed());
    let orders = summary("orders through a broker restart", &orders.finish());
    assert_orders_complete(&orders, &e);
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
        &Running::spawn(instance("b4", "3")).finish(),
    );
    assert_eq!(count(&last, "others_running"), 0, "{last}");
    assert_billing_exact(
        "one instance killed and the broker restarted",
        &last,
        &orders,
        &e,
    );
    eprintln!(
        "{test}: passed in {:?}; b1 received {}, b3 {}",
        started.elapsed(),
        count(&b1, "received"),
        count(&b3, "received")
    );
    pair.delete(&["billing"]);
}

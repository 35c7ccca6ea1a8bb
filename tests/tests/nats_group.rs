//! Partitioned streams and groups of inbox instances against the real server
//! (`EVENTS_TEST_NATS_URL`; skipped visibly without it, failing with
//! `EVENTS_TEST_REQUIRE_SERVICES=1`), each case on a stream of its own, the consuming
//! database PostgreSQL when configured (SQLite otherwise), every instance with its own store
//! on it as a process of its own would have:
//! - the relay spreads aggregates over the partitions' subjects, and the relay, the inbox,
//!   the group and the stream's declaration refuse a stream with another count, naming both;
//!   a stream made before partitions (no description) is one partition, with today's
//!   subjects;
//! - a group shares the partitions (no instance above ceil(P/N)) when instances start, hands
//!   a stopped instance's partitions over at once, and a killed one's after its lease; every
//!   event is handled once, in each aggregate's order, throughout (`rebalance:` lines give
//!   the times, BENCHMARKS.md);
//! - a running pair changes from 1 partition to 4 under load, with the documented procedure:
//!   nothing lost, nothing applied twice, nothing reordered.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
use event_runtime::cli::{run_with_output, App};
use event_runtime::transport::nats::{
    self, GroupConfig, InboxConfig, InboxReport, NatsError, NatsGroup, NatsInbox, NatsRelay,
    RelayConfig, StreamSpec,
};
use event_runtime::{
    CancellationToken, Dispatcher, Outbox, OutboxConfig, RetryPolicy, SqlValue, Store, Tx, Workers,
};
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use common::Db;

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "grouptest.tick", version = 1)]
struct Tick {
    #[event(aggregate_id)]
    account: String,
}

/// Records (account, sequence, event id, the next value of a counter) in the handler's
/// transaction: the counter row stays locked until the commit, so its values follow the
/// order the handlers' transactions commit in.
#[event_handler(name = "grouptest.record")]
async fn record(envelope: &Envelope<Tick>, tx: &mut Tx) -> Result<(), HandlerError> {
    tx.execute("UPDATE group_counter SET n = n + 1", &[])
        .await?;
    tx.execute(
        "INSERT INTO group_seen (account, sequence, event_id, n) VALUES ($1, $2, $3, (SELECT n FROM group_counter))",
        &[
            SqlValue::Text(&envelope.event().account),
            SqlValue::Int(envelope.sequence() as i64),
            SqlValue::Text(&envelope.id().to_string()),
        ],
    )
    .await?;
    Ok(())
}

/// The inbox's ack wait: a killed instance's unacknowledged messages come back after it.
const ACK_WAIT: Duration = Duration::from_secs(4);
/// The group's lease.
const LEASE: Duration = Duration::from_secs(2);

fn enabled(test: &str) -> Option<String> {
    common::nats_url(test, "NATS group cases")
}

fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// PostgreSQL when configured, SQLite otherwise.
async fn database(test: &str) -> Db {
    common::databases(test).await.pop().expect("a database")
}

/// A stream name and subject prefix of the test's own.
fn names() -> (String, String) {
    let id = uuid::Uuid::now_v7().simple().to_string();
    (format!("G{id}"), format!("g{id}"))
}

fn quick_retry() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 5,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(100),
    }
}

/// The producing service: a relay to `stream` with `partitions`, a writer committing one
/// event to each of `accounts` accounts every 40 ms until stopped.
struct Producer {
    workers: Option<Workers>,
    stop: CancellationToken,
    rounds: Arc<AtomicU64>,
    writer: Option<JoinHandle<()>>,
}

async fn relayed(
    client: &async_nats::Client,
    store: Store,
    stream: &str,
    prefix: &str,
    partitions: u32,
) -> Outbox {
    let relay = NatsRelay::new(
        client.clone(),
        RelayConfig::new(stream)
            .subject_prefix(prefix)
            .partitions(partitions)
            .retry(quick_retry()),
    );
    let outbox = Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().event::<Tick>())
        .destination(relay.clone())
        .config(
            OutboxConfig::default()
                .source("urn:test:group")
                .poll_interval(Duration::from_millis(20)),
        )
        .build()
        .unwrap();
    relay.check(&outbox).await.unwrap();
    outbox
}

impl Producer {
    /// Writes rounds `from`, `from + 1`… (the sequence of each account's event).
    async fn start(
        client: &async_nats::Client,
        db: &Db,
        stream: &str,
        prefix: &str,
        partitions: u32,
        accounts: usize,
        from: u64,
    ) -> Producer {
        let outbox = relayed(client, db.open().await, stream, prefix, partitions).await;
        let workers = outbox.spawn_workers(2);
        let stop = CancellationToken::new();
        let rounds = Arc::new(AtomicU64::new(0));
        let writer = tokio::spawn({
            let (outbox, stop, rounds) = (outbox.clone(), stop.clone(), rounds.clone());
            async move {
                let mut round = from - 1;
                while !stop.is_cancelled() {
                    round += 1;
                    let mut uow = outbox.begin().await.unwrap();
                    for a in 0..accounts {
                        uow.add(
                            Envelope::new(Tick {
                                account: format!("A{a}"),
                            })
                            .with_sequence(round),
                        );
                    }
                    uow.commit().await.unwrap();
                    rounds.store(round, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(40)).await;
                }
            }
        });
        Producer {
            workers: Some(workers),
            stop,
            rounds,
            writer: Some(writer),
        }
    }

    /// Stops writing; the rounds written.
    async fn stop_writing(&mut self) -> u64 {
        self.stop.cancel();
        if let Some(w) = self.writer.take() {
            w.await.unwrap();
        }
        self.rounds.load(Ordering::SeqCst)
    }

    /// Stops its relay's workers (a restart with another configuration follows).
    async fn stop_relay(&mut self) {
        if let Some(w) = self.workers.take() {
            w.shutdown(Duration::from_secs(10)).await.unwrap();
        }
    }
}

/// The consuming service's tables, once per database.
async fn consumer_tables(db: &Db) {
    let store = db.open().await;
    let mut tx = store.begin().await.unwrap();
    tx.execute(
        "CREATE TABLE group_seen (account TEXT NOT NULL, sequence BIGINT NOT NULL, event_id TEXT NOT NULL, n BIGINT NOT NULL)",
        &[],
    )
    .await
    .unwrap();
    tx.execute("CREATE TABLE group_counter (n BIGINT NOT NULL)", &[])
        .await
        .unwrap();
    tx.execute("INSERT INTO group_counter (n) VALUES (0)", &[])
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

async fn consuming(db: &Db) -> Outbox {
    Outbox::builder(db.open().await)
        .dispatcher(Dispatcher::builder_empty().handler::<record>())
        .config(OutboxConfig::default().poll_interval(Duration::from_millis(20)))
        .build()
        .unwrap()
}

fn inbox_config(stream: &str, prefix: &str, partitions: u32) -> InboxConfig {
    InboxConfig::new(stream, "billing")
        .filter_subject(format!("{prefix}.grouptest.>"))
        .partitions(partitions)
        .batch(64)
        .ack_wait(ACK_WAIT)
        .fetch_wait(Duration::from_millis(300))
}

/// One instance of the consuming service: its own store, workers and group member.
struct Instance {
    cancel: CancellationToken,
    group: Option<JoinHandle<Result<InboxReport, NatsError>>>,
    workers: Option<Workers>,
}

impl Instance {
    async fn start(
        url: &str,
        db: &Db,
        stream: &str,
        prefix: &str,
        partitions: u32,
        name: &str,
    ) -> Instance {
        let client = nats::connect(url, name).await.unwrap();
        let outbox = consuming(db).await;
        let group = NatsGroup::new(
            &jetstream::new(client),
            outbox.clone(),
            inbox_config(stream, prefix, partitions),
            GroupConfig::new().member(name).lease(LEASE),
        )
        .unwrap();
        let cancel = CancellationToken::new();
        let workers = outbox.spawn_workers(1);
        let run = tokio::spawn({
            let cancel = cancel.clone();
            async move { group.run(cancel, None).await }
        });
        Instance {
            cancel,
            group: Some(run),
            workers: Some(workers),
        }
    }

    /// A graceful stop: its partitions are handed over at once.
    async fn stop(&mut self) {
        self.cancel.cancel();
        if let Some(g) = self.group.take() {
            g.await.unwrap().unwrap();
        }
        if let Some(w) = self.workers.take() {
            w.shutdown(Duration::from_secs(10)).await.unwrap();
        }
    }

    /// As a kill -9 would: nothing released, nothing acknowledged, no lease given back.
    fn kill(&mut self) {
        if let Some(g) = self.group.take() {
            g.abort();
        }
        if let Some(w) = self.workers.take() {
            w.cancel_token().cancel();
            drop(w);
        }
    }
}

/// `e` is the refusal of a count `configured` on a stream of `found` partitions.
fn assert_mismatch(e: &NatsError, configured: u32, found: u32) {
    assert!(
        matches!(e, NatsError::PartitionsMismatch { configured: c, found: f, .. } if *c == configured && *f == found),
        "{e:?}"
    );
}

/// What `events nats group status billing` prints.
async fn group_status(db: &Db, url: &str, stream: &str) -> String {
    let mut argv: Vec<String> = vec!["events".into()];
    match db {
        Db::Sqlite(u) => argv.extend(["--database".into(), u.clone()]),
        Db::Postgres { url, schema } => argv.extend([
            "--database".into(),
            url.clone(),
            "--schema".into(),
            schema.clone(),
        ]),
    }
    argv.extend(
        [
            "nats", "group", "status", "billing", "--stream", stream, "--nats", url,
        ]
        .map(String::from),
    );
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_with_output(argv, App::standalone(), &mut out, &mut err).await;
    let (out, err) = (String::from_utf8_lossy(&out), String::from_utf8_lossy(&err));
    assert_eq!(code, std::process::ExitCode::SUCCESS, "{out}{err}");
    format!("{out}{err}")
}

/// Who holds which partition now, per the group's rows.
async fn holders(store: &Store) -> BTreeMap<String, Vec<u32>> {
    let view = store.group_view("billing").await.unwrap();
    let mut out: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for p in view.partitions.iter().filter(|p| p.held) {
        out.entry(p.owner.clone().unwrap())
            .or_default()
            .push(p.partition);
    }
    out
}

/// Waits until the partitions are held by exactly `members`, each at most ceil(P/N) of them
/// and every partition by one; the time it took.
async fn wait_balanced(store: &Store, members: &[&str], partitions: u32, what: &str) -> Duration {
    let started = Instant::now();
    let cap = (partitions as usize).div_ceil(members.len());
    loop {
        let h = holders(store).await;
        let all: usize = h.values().map(Vec::len).sum();
        let ok = all == partitions as usize
            && h.len() == members.len()
            && members
                .iter()
                .all(|m| h.get(*m).is_some_and(|p| p.len() <= cap));
        if ok {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{what}: partitions not balanced over {members:?} after 60 s: {h:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn fetch_i64(store: &Store, sql: &'static str, args: &[SqlValue<'_>]) -> i64 {
    let mut tx = store.begin().await.unwrap();
    let v = tx.fetch_i64(sql, args).await.unwrap().unwrap_or(0);
    tx.rollback().await.unwrap();
    v
}

/// Waits until every one of `accounts` × `rounds` events was handled, then asserts each once
/// and in order.
async fn assert_all_handled(store: &Store, accounts: usize, rounds: u64, what: &str) {
    let want = (accounts as u64 * rounds) as i64;
    let started = Instant::now();
    loop {
        let n = fetch_i64(store, "SELECT COUNT(*) FROM group_seen", &[]).await;
        if n >= want {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "{what}: {n} of {want} events handled after 90 s; held: {:?}; dead letters: {}",
            store.stats().await,
            fetch_i64(store, "SELECT COUNT(*) FROM event_dead_letters", &[]).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let n = fetch_i64(store, "SELECT COUNT(*) FROM group_seen", &[]).await;
    let distinct = fetch_i64(
        store,
        "SELECT COUNT(DISTINCT event_id) FROM group_seen",
        &[],
    )
    .await;
    assert_eq!(
        (n, distinct),
        (want, want),
        "{what}: every event handled once"
    );
    let rows = store
        .query("SELECT account, sequence FROM group_seen ORDER BY n")
        .fetch_all()
        .await
        .unwrap();
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    for r in &rows {
        let (account, seq): (String, i64) = (r.get_at(0).unwrap(), r.get_at(1).unwrap());
        let prev = last.insert(account.clone(), seq).unwrap_or(0);
        assert_eq!(
            seq,
            prev + 1,
            "{what}: {account} handled {seq} after {prev}"
        );
    }
    let dead = fetch_i64(store, "SELECT COUNT(*) FROM event_dead_letters", &[]).await;
    assert_eq!(dead, 0, "{what}: nothing dead-lettered");
}

/// Events of partitions `partitions` committed after `since` handled yet (the sequences
/// committed after it are above `round`).
async fn flowing(store: &Store, accounts: &[String], round: u64) -> bool {
    for a in accounts {
        let n = fetch_i64(
            store,
            "SELECT COUNT(*) FROM group_seen WHERE account = $1 AND sequence > $2",
            &[SqlValue::Text(a), SqlValue::Int(round as i64)],
        )
        .await;
        if n == 0 {
            return false;
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partition_counts_must_agree_and_old_streams_are_one_partition() {
    const T: &str = "partition_counts_must_agree";
    let Some(url) = enabled(T) else { return };
    common::log_from_env();
    let client = nats::connect(&url, T).await.unwrap();
    let js = jetstream::new(client.clone());
    let (stream, prefix) = names();
    let spec = StreamSpec::new(&stream)
        .subjects([format!("{prefix}.>")])
        .partitions(4);
    let shape = spec.create(&js).await.unwrap();
    assert_eq!(shape.partitions, 4);
    assert_eq!(
        shape.subjects,
        (0..4)
            .map(|p| format!("{prefix}.{p}.>"))
            .collect::<Vec<_>>()
    );
    // Each side configured with another count refuses to start, naming both.
    let db = database(T).await;
    let relay = NatsRelay::new(
        client.clone(),
        RelayConfig::new(&stream)
            .subject_prefix(&prefix)
            .partitions(8),
    );
    let producer = Outbox::builder(db.open().await)
        .dispatcher(Dispatcher::builder_empty().event::<Tick>())
        .destination(relay.clone())
        .build()
        .unwrap();
    let e = relay.check(&producer).await.unwrap_err();
    assert_mismatch(&e, 8, 4);
    let text = e.to_string();
    assert!(
        text.contains("8 partition") && text.contains("has 4"),
        "{text}"
    );
    consumer_tables(&db).await;
    let e = NatsInbox::new(&js, consuming(&db).await, inbox_config(&stream, &prefix, 1))
        .await
        .unwrap_err();
    assert_mismatch(&e, 1, 4);
    let group = NatsGroup::new(
        &js,
        consuming(&db).await,
        inbox_config(&stream, &prefix, 2),
        GroupConfig::new(),
    )
    .unwrap();
    let e = group
        .run(CancellationToken::new(), Some(Duration::from_secs(1)))
        .await
        .unwrap_err();
    assert_mismatch(&e, 2, 4);
    let e = StreamSpec::new(&stream)
        .subjects([format!("{prefix}.>")])
        .check(&js)
        .await
        .unwrap_err();
    assert_mismatch(&e, 1, 4);
    let e = StreamSpec::new(&stream)
        .partitions(0)
        .create(&js)
        .await
        .unwrap_err();
    assert!(matches!(e, NatsError::Config(_)), "{e:?}");
    // Going down while partition 3's consumer holds a message would strand it: refused.
    let acc = (0..)
        .map(|i| format!("S{i}"))
        .find(|a| nats::partition_of(Tick::AGGREGATE_TYPE, a, 4) == 3)
        .unwrap();
    js.get_stream(&stream)
        .await
        .unwrap()
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("billing-3".into()),
            filter_subject: format!("{prefix}.3.>"),
            ..Default::default()
        })
        .await
        .unwrap();
    publish_tick(&js, &prefix, 4, &acc, 1).await;
    let e = spec
        .clone()
        .partitions(2)
        .repartition(&js, false)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, NatsError::Config(m) if m.contains("billing-3 (1)")),
        "{e}"
    );

    // A stream as a release before partitions made it (no description): one partition,
    // today's subjects, no partition token.
    let (old, old_prefix) = names();
    js.create_stream(jetstream::stream::Config {
        name: old.clone(),
        subjects: vec![format!("{old_prefix}.>")],
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .unwrap();
    let shape = StreamSpec::new(&old)
        .subjects([format!("{old_prefix}.>")])
        .check(&js)
        .await
        .unwrap();
    assert_eq!(shape.partitions, 1);
    let producer = relayed(&client, db.open().await, &old, &old_prefix, 1).await;
    let mut uow = producer.begin().await.unwrap();
    uow.add(
        Envelope::new(Tick {
            account: "A1".into(),
        })
        .with_sequence(1),
    );
    uow.commit().await.unwrap();
    producer.drain(Duration::from_secs(10)).await.unwrap();
    let s = js.get_stream(&old).await.unwrap();
    let m = s
        .get_last_raw_message_by_subject(&format!("{old_prefix}.grouptest.tick"))
        .await;
    assert!(m.is_ok(), "published on today's subject: {m:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relay_spreads_aggregates_over_the_partitions() {
    const T: &str = "relay_spreads_aggregates";
    let Some(url) = enabled(T) else { return };
    common::log_from_env();
    let client = nats::connect(&url, T).await.unwrap();
    let js = jetstream::new(client.clone());
    let (stream, prefix) = names();
    StreamSpec::new(&stream)
        .subjects([format!("{prefix}.>")])
        .partitions(4)
        .create(&js)
        .await
        .unwrap();
    let db = database(T).await;
    let producer = relayed(&client, db.open().await, &stream, &prefix, 4).await;
    let mut uow = producer.begin().await.unwrap();
    for a in 0..40 {
        for seq in 1..=2 {
            uow.add(
                Envelope::new(Tick {
                    account: format!("A{a}"),
                })
                .with_sequence(seq),
            );
        }
    }
    uow.commit().await.unwrap();
    producer.drain(Duration::from_secs(20)).await.unwrap();
    let mut s = js.get_stream(&stream).await.unwrap();
    assert_eq!(s.info().await.unwrap().state.messages, 80);
    // Every message sits on its aggregate's partition, each partition has some.
    let mut per_partition = [0u32; 4];
    for seq in 1..=80u64 {
        let m = s.get_raw_message(seq).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
        let account = body["subject"].as_str().unwrap();
        let p = nats::partition_of(body["aggregatetype"].as_str().unwrap(), account, 4);
        assert_eq!(
            m.subject.as_str(),
            format!("{prefix}.{p}.grouptest.tick"),
            "{account}"
        );
        per_partition[p as usize] += 1;
    }
    assert!(per_partition.iter().all(|&n| n > 0), "{per_partition:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_shares_partitions_and_hands_them_over() {
    const T: &str = "group_shares_partitions";
    let Some(url) = enabled(T) else { return };
    common::log_from_env();
    const P: u32 = 6;
    const ACCOUNTS: usize = 24;
    let client = nats::connect(&url, T).await.unwrap();
    let js = jetstream::new(client.clone());
    let (stream, prefix) = names();
    StreamSpec::new(&stream)
        .subjects([format!("{prefix}.>")])
        .partitions(P)
        .create(&js)
        .await
        .unwrap();
    let producer_db = Db::Sqlite(common::sqlite(T).await.0);
    let db = database(T).await;
    consumer_tables(&db).await;
    let watch = db.open().await;
    let mut producer =
        Producer::start(&client, &producer_db, &stream, &prefix, P, ACCOUNTS, 1).await;

    let mut a = Instance::start(&url, &db, &stream, &prefix, P, "a").await;
    let mut b = Instance::start(&url, &db, &stream, &prefix, P, "b").await;
    let took = wait_balanced(&watch, &["a", "b"], P, "two instances start").await;
    say(&format!(
        "rebalance: two instances start: balanced after {took:?}"
    ));

    let started = Instant::now();
    let mut c = Instance::start(&url, &db, &stream, &prefix, P, "c").await;
    let took = wait_balanced(&watch, &["a", "b", "c"], P, "a third starts").await;
    say(&format!(
        "rebalance: a third instance starts: balanced after {took:?}"
    ));
    assert!(
        started.elapsed() < LEASE * 2 + Duration::from_secs(3),
        "a start rebalanced within two leases (and the batch in hand): {:?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The operator's view: three live instances, every partition held, the lag per partition.
    let status = group_status(&db, &url, &stream).await;
    for needle in ["instances: 3 live of 3", "billing-0", "billing-5", "held"] {
        assert!(status.contains(needle), "{needle}: {status}");
    }
    assert!(!status.contains("never taken"), "{status}");

    // Killed: its partitions come back after its lease, its messages after the ack wait.
    let held = holders(&watch).await;
    let orphans = held.get("c").cloned().unwrap_or_default();
    assert!(!orphans.is_empty(), "{held:?}");
    let orphaned: Vec<String> = (0..ACCOUNTS)
        .map(|i| format!("A{i}"))
        .filter(|acc| orphans.contains(&nats::partition_of(Tick::AGGREGATE_TYPE, acc, P)))
        .collect();
    let round = producer.rounds.load(Ordering::SeqCst);
    let killed = Instant::now();
    c.kill();
    let took = wait_balanced(&watch, &["a", "b"], P, "an instance killed").await;
    say(&format!(
        "rebalance: an instance killed (lease {LEASE:?}): partitions taken after {took:?}"
    ));
    assert!(took < LEASE * 2 + Duration::from_secs(2), "{took:?}");
    while !flowing(&watch, &orphaned, round + 2).await {
        assert!(
            killed.elapsed() < ACK_WAIT + LEASE * 2 + Duration::from_secs(5),
            "the killed instance's aggregates flow again within the ack wait + 2 leases: {:?}",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    say(&format!(
        "rebalance: an instance killed: its aggregates flow again after {:?} (ack wait {ACK_WAIT:?})",
        killed.elapsed()
    ));

    // Stopped: hands over at once.
    let stopped = Instant::now();
    b.stop().await;
    let took = wait_balanced(&watch, &["a"], P, "an instance stopped").await;
    say(&format!(
        "rebalance: an instance stopped: partitions taken {took:?} after its stop returned ({:?} in all)",
        stopped.elapsed()
    ));
    assert!(
        took < LEASE,
        "a graceful stop hands over within a lease: {took:?}"
    );
    // Its partitions' inboxes end after the batch in hand: a fetch wait and a commit each
    // (a fetch the server left open ran 5 s longer before the inbox bounded it).
    assert!(
        stopped.elapsed() < LEASE,
        "a graceful stop returns once its batches are in: {:?}",
        stopped.elapsed()
    );

    let rounds = producer.stop_writing().await;
    assert_all_handled(&watch, ACCOUNTS, rounds, "group").await;
    a.stop().await;
    assert!(holders(&watch).await.is_empty(), "every partition released");
    assert!(
        watch
            .group_view("billing")
            .await
            .unwrap()
            .members
            .iter()
            .all(|m| m.member == "c"),
        "the stopped instances left; the killed one's row remains until forgotten"
    );
    producer.stop_relay().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_running_pair_goes_from_one_partition_to_four_under_load() {
    const T: &str = "repartition_under_load";
    let Some(url) = enabled(T) else { return };
    common::log_from_env();
    const ACCOUNTS: usize = 16;
    let client = nats::connect(&url, T).await.unwrap();
    let js = jetstream::new(client.clone());
    let (stream, prefix) = names();
    let spec = StreamSpec::new(&stream).subjects([format!("{prefix}.>")]);
    spec.create(&js).await.unwrap();
    let producer_db = Db::Sqlite(common::sqlite(T).await.0);
    let db = database(T).await;
    consumer_tables(&db).await;
    let watch = db.open().await;

    // Before: one partition, one inbox on `<prefix>.grouptest.>`.
    let mut producer =
        Producer::start(&client, &producer_db, &stream, &prefix, 1, ACCOUNTS, 1).await;
    let old = consuming(&db).await;
    let old_workers = old.spawn_workers(1);
    let old_inbox = NatsInbox::new(&js, old.clone(), inbox_config(&stream, &prefix, 1))
        .await
        .unwrap();
    let stop_old = CancellationToken::new();
    let old_run = tokio::spawn({
        let stop = stop_old.clone();
        async move { old_inbox.run(stop, None).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;

    // 1. The stream: 4 partitions declared, today's subjects kept.
    let shape = spec
        .clone()
        .partitions(4)
        .repartition(&js, false)
        .await
        .unwrap();
    assert_eq!(shape.partitions, 4);
    // 2. The consumers: the old inbox's process is killed (nothing acknowledged of its batch
    // in hand) while the producer goes on publishing on today's subjects, then a group of
    // two starts in its place: it drains the consumer the old inbox leaves behind.
    old_run.abort();
    drop(stop_old);
    old_workers.cancel_token().cancel();
    drop(old_workers);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut a = Instance::start(&url, &db, &stream, &prefix, 4, "a").await;
    let mut b = Instance::start(&url, &db, &stream, &prefix, 4, "b").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // 3. The producer restarts with 4 partitions, writing on.
    let round = producer.stop_writing().await;
    producer.stop_relay().await;
    let mut producer = Producer::start(
        &client,
        &producer_db,
        &stream,
        &prefix,
        4,
        ACCOUNTS,
        round + 1,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // 4. Once every producer publishes with 4: only the partitions' subjects. Not with
    // another application's subjects: refused, the stream unchanged.
    let e = StreamSpec::new(&stream)
        .subjects(["elsewhere.>"])
        .partitions(4)
        .repartition(&js, true)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, NatsError::Config(m) if m.contains("not `elsewhere.>`")),
        "{e}"
    );
    let shape = spec
        .clone()
        .partitions(4)
        .repartition(&js, true)
        .await
        .unwrap();
    assert_eq!(shape.subjects.len(), 4);
    assert_eq!(shape.base_subjects(), [format!("{prefix}.>")]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rounds = producer.stop_writing().await;
    assert!(rounds > round, "the producer wrote on after its restart");
    // Every event either producer committed is handled once, in order.
    assert_all_handled(&watch, ACCOUNTS, rounds, "1 -> 4").await;
    // The last step: the old consumer, drained, deleted; the group goes on.
    js.get_stream(&stream)
        .await
        .unwrap()
        .delete_consumer("billing")
        .await
        .unwrap();
    tokio::time::sleep(LEASE * 2).await;
    assert!(
        a.group.as_ref().is_some_and(|g| !g.is_finished())
            && b.group.as_ref().is_some_and(|g| !g.is_finished()),
        "the group runs on without the old consumer"
    );
    a.stop().await;
    b.stop().await;
    producer.stop_relay().await;
}

/// Publishes the event `seq` of `account` on its partition's subject, as a relay would.
async fn publish_tick(
    js: &jetstream::Context,
    prefix: &str,
    partitions: u32,
    account: &str,
    seq: u64,
) {
    let e = Envelope::new(Tick {
        account: account.into(),
    })
    .with_sequence(seq)
    .with_source("urn:test:group");
    let json = serde_json::to_string(&e).unwrap();
    let body = event_runtime::Delivery::new(e.id(), "grouptest.tick", &json)
        .previous_sequence(seq - 1)
        .wire_envelope()
        .into_owned();
    let p = nats::partition_of(Tick::AGGREGATE_TYPE, account, partitions);
    js.publish(format!("{prefix}.{p}.grouptest.tick"), body.into())
        .await
        .unwrap()
        .await
        .unwrap();
}

/// A partition's inbox skips the other partitions' stream sequences on every batch without
/// a verdict, and still stops before committing a batch that follows messages of its
/// partition the stream removed unreceived (its limits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_inbox_stops_on_messages_removed_before_it_received_them() {
    const T: &str = "partition_messages_lost";
    let Some(url) = enabled(T) else { return };
    common::log_from_env();
    let client = nats::connect(&url, T).await.unwrap();
    let js = jetstream::new(client);
    let (stream, prefix) = names();
    let spec = StreamSpec::new(&stream)
        .subjects([format!("{prefix}.>")])
        .partitions(2);
    spec.create(&js).await.unwrap();
    // The stream keeps its last 20 messages.
    let mut s = js.get_stream(&stream).await.unwrap();
    let mut config = s.info().await.unwrap().config.clone();
    config.max_messages = 20;
    js.update_stream(config).await.unwrap();
    let on = |p: u32| {
        (0..)
            .map(|i| format!("A{i}"))
            .filter(move |a| nats::partition_of(Tick::AGGREGATE_TYPE, a, 2) == p)
    };
    let (mine, other): (Vec<String>, Vec<String>) =
        (on(0).take(4).collect(), on(1).take(4).collect());
    let db = database(T).await;
    consumer_tables(&db).await;
    let outbox = consuming(&db).await;
    let inbox = NatsInbox::new(
        &js,
        outbox.clone(),
        inbox_config(&stream, &prefix, 2).partition(0).batch(2),
    )
    .await
    .unwrap();
    // Interleaved with the other partition: each batch skips sequences, none is lost.
    for seq in 1..=2 {
        for (m, o) in mine.iter().zip(&other) {
            publish_tick(&js, &prefix, 2, m, seq).await;
            publish_tick(&js, &prefix, 2, o, seq).await;
        }
    }
    let mut received = 0;
    for _ in 0..3 {
        received += inbox.receive().await.unwrap().received;
    }
    assert_eq!(received, 6, "three batches of two, each after a skip");
    // 2 of partition 0 (stream sequences 13 and 15) are left unreceived; 20 more messages
    // push them out of the stream.
    for seq in 3..=6 {
        for o in &other {
            publish_tick(&js, &prefix, 2, o, seq).await;
        }
    }
    for m in &mine {
        publish_tick(&js, &prefix, 2, m, 3).await;
    }
    let e = inbox
        .receive()
        .await
        .expect_err("messages of partition 0 were removed");
    assert!(matches!(e, NatsError::MessagesLost { .. }), "{e}");
    let committed = fetch_i64(outbox.store(), "SELECT COUNT(*) FROM event_outbox", &[]).await;
    assert_eq!(committed, 6, "nothing committed past the hole");
}

/// A producer publishing with another count of partitions (2, on a stream of 4): its messages
/// on a partition their aggregate does not belong to under 4 are accepted — committed, in
/// each aggregate's order — and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_of_a_producer_with_another_count_are_accepted_and_counted() {
    const T: &str = "partition_mismatch";
    let Some(url) = enabled(T) else { return };
    common::log_from_env();
    let client = nats::connect(&url, T).await.unwrap();
    let js = jetstream::new(client);
    let (stream, prefix) = names();
    StreamSpec::new(&stream)
        .subjects([format!("{prefix}.>")])
        .partitions(4)
        .create(&js)
        .await
        .unwrap();
    let db = database(T).await;
    consumer_tables(&db).await;
    let outbox = consuming(&db).await;
    // One stream of 4 partitions is read one partition per consumer.
    let e = NatsInbox::new(&js, outbox.clone(), inbox_config(&stream, &prefix, 4))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, NatsError::Config(m) if m.contains("InboxConfig::partition")),
        "{e}"
    );
    let mut inboxes = Vec::new();
    for p in 0..4 {
        let mut config = inbox_config(&stream, &prefix, 4).partition(p);
        config.durable = nats::partition_durable("billing", p);
        inboxes.push(NatsInbox::new(&js, outbox.clone(), config).await.unwrap());
    }
    // Partitions under 2 for 20 aggregates: some differ from theirs under 4.
    let accounts: Vec<String> = (0..20).map(|i| format!("M{i}")).collect();
    let differ = accounts
        .iter()
        .filter(|a| {
            nats::partition_of(Tick::AGGREGATE_TYPE, a, 2)
                != nats::partition_of(Tick::AGGREGATE_TYPE, a, 4)
        })
        .count() as u64;
    assert!(differ > 0);
    for seq in 1..=2 {
        for a in &accounts {
            publish_tick(&js, &prefix, 2, a, seq).await;
        }
    }
    // Under 2, partitions 0 and 1 only; each message read where it was published.
    let mut received = 0;
    for inbox in &inboxes {
        for _ in 0..3 {
            received += inbox.receive().await.unwrap().received;
        }
    }
    assert_eq!(received, 40);
    let mismatches: u64 = inboxes.iter().map(|i| i.partition_mismatches()).sum();
    assert_eq!(mismatches, differ * 2);
    let workers = outbox.spawn_workers(1);
    assert_all_handled(outbox.store(), 20, 2, "another count").await;
    workers.shutdown(Duration::from_secs(10)).await.unwrap();
}

async fn ddl(store: &Store, sql: &'static str) {
    let mut tx = store.begin().await.unwrap();
    tx.execute(sql, &[]).await.unwrap();
    tx.commit().await.unwrap();
}

/// Consumer sequences the durable consumers `names` have delivered, in all.
async fn delivered(js: &jetstream::Context, stream: &str, names: &[String]) -> u64 {
    let s = js.get_stream(stream).await.unwrap();
    let mut n = 0;
    for name in names {
        let mut c = s
            .get_consumer::<jetstream::consumer::pull::Config>(name)
            .await
            .unwrap();
        n += c.info().await.unwrap().delivered.consumer_sequence;
    }
    n
}

/// An instance that cannot renew its lease stops consuming once the lease would have
/// expired, and consumes again when it can.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_instance_that_cannot_renew_its_lease_stops_consuming() {
    const T: &str = "group_lease_lapses";
    let Some(url) = enabled(T) else { return };
    common::log_from_env();
    let db = database(T).await;
    if !matches!(db, Db::Postgres { .. }) {
        common::say_once(
            T,
            &format!(
                "{T} skipped: it renames a table of PostgreSQL (EVENTS_TEST_POSTGRES_URL is not set)"
            ),
        );
        return;
    }
    const ACCOUNTS: usize = 8;
    let client = nats::connect(&url, T).await.unwrap();
    let js = jetstream::new(client.clone());
    let (stream, prefix) = names();
    StreamSpec::new(&stream)
        .subjects([format!("{prefix}.>")])
        .partitions(2)
        .create(&js)
        .await
        .unwrap();
    let producer_db = Db::Sqlite(common::sqlite(T).await.0);
    consumer_tables(&db).await;
    let watch = db.open().await;
    let mut producer =
        Producer::start(&client, &producer_db, &stream, &prefix, 2, ACCOUNTS, 1).await;
    let mut a = Instance::start(&url, &db, &stream, &prefix, 2, "a").await;
    wait_balanced(&watch, &["a"], 2, "one instance").await;
    let consumers: Vec<String> = (0..2).map(|p| format!("billing-{p}")).collect();

    // Its renewals fail (the group's table gone for a while), while everything else of the
    // database works: only the lease's lapse can stop it.
    let admin = db.open().await;
    ddl(
        &admin,
        "ALTER TABLE event_inbox_members RENAME TO event_inbox_members_away",
    )
    .await;
    // Past the lease (2 s) and the batch in hand, nothing more is delivered to it.
    tokio::time::sleep(LEASE * 2).await;
    let before = delivered(&js, &stream, &consumers).await;
    tokio::time::sleep(LEASE).await;
    let after = delivered(&js, &stream, &consumers).await;
    assert_eq!(
        before, after,
        "no message delivered while the instance cannot renew its lease"
    );
    ddl(
        &admin,
        "ALTER TABLE event_inbox_members_away RENAME TO event_inbox_members",
    )
    .await;
    // It takes its partitions again.
    let back = Instant::now();
    while delivered(&js, &stream, &consumers).await == after {
        assert!(
            back.elapsed() < LEASE * 3,
            "consuming again within 3 leases of the database's return"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rounds = producer.stop_writing().await;
    assert_all_handled(&watch, ACCOUNTS, rounds, "after the lapse").await;
    a.stop().await;
    producer.stop_relay().await;
}

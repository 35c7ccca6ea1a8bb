//! A three-server JetStream cluster of the test's own (three `nats-server` processes routed to
//! each other, a stream and a consumer of 3 replicas), a producer's relay and a consumer's
//! inbox connected with the server list, and servers killed (SIGKILL) mid-run and restarted:
//! the stream's leader; the server the producer, then the one the consumer, is connected to;
//! two servers at once (the stream loses its quorum). Each time nothing is lost, nothing is
//! applied twice, every aggregate's events are handled in the producer's order, nothing is
//! dead-lettered, no delivery uses an attempt (an election, a lost connection and a lost
//! quorum pause the relay), and both sides resume by themselves. The time from each kill to
//! the first event committed after it being handled by the consumer, and to the relay's first
//! publish of one, is printed (`resume:` lines, BENCHMARKS.md) and must stay below the
//! consumer's redelivery delay plus [`FAILOVER_ALLOWANCE`]: what the inbox requires the gap
//! wait to exceed.
//!
//! The cases kill servers, so they run one after the other (a lock): about 2.5 minutes in
//! all, each capped at 3 minutes. Skipped visibly without `EVENTS_TEST_NATS_URL` (the gate of
//! every NATS suite) or without the `nats-server` binary; failing instead with
//! `EVENTS_TEST_REQUIRE_SERVICES=1`.

mod common;
#[path = "common/nats_cluster.rs"]
mod nats_cluster;

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
use event_runtime::cli::{run_with_output, App};
use event_runtime::transport::nats::{
    self, InboxConfig, NatsInbox, NatsRelay, RelayConfig, StreamSpec, FAILOVER_ALLOWANCE,
};
use event_runtime::{
    CancellationToken, Dispatcher, Outbox, OutboxConfig, RetryPolicy, SqlValue, Store, Tx,
};
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use common::Db;
use nats_cluster::OwnCluster;

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "clustertest.tick", version = 1)]
struct Tick {
    #[event(aggregate_id)]
    account: String,
}

/// Records (account, sequence, a per-database counter) in the handler's transaction.
#[event_handler(name = "clustertest.record")]
async fn record(envelope: &Envelope<Tick>, tx: &mut Tx) -> Result<(), HandlerError> {
    tx.execute(
        "INSERT INTO cluster_seen (account, sequence, n) VALUES ($1, $2, (SELECT COUNT(*) + 1 FROM cluster_seen))",
        &[
            SqlValue::Text(&envelope.event().account),
            SqlValue::Int(envelope.sequence() as i64),
        ],
    )
    .await?;
    Ok(())
}

/// Node-killing cases run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Accounts the producer writes to, one event each per round.
const ACCOUNTS: usize = 8;
/// Time between two rounds.
const ROUND: Duration = Duration::from_millis(50);
/// The inbox's ack wait and fetch wait: its redelivery delay.
const ACK_WAIT: Duration = Duration::from_secs(5);
const FETCH_WAIT: Duration = Duration::from_millis(500);
/// The cap on each case.
const CASE_CAP: Duration = Duration::from_secs(180);

fn enabled(test: &str) -> bool {
    common::nats_url(test, "NATS cluster cases").is_some()
}

fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn fetch_i64(store: &Store, sql: &'static str, args: &[SqlValue<'_>]) -> Option<i64> {
    let mut tx = store.begin().await.unwrap();
    let v = tx.fetch_i64(sql, args).await.unwrap();
    tx.rollback().await.unwrap();
    v
}

/// The open dead letters' handler, reason and error chain, for a failed assertion's message.
async fn dead_letters(store: &Store) -> Vec<String> {
    store
        .query("SELECT handler, reason, error_chain FROM event_dead_letters")
        .fetch_all()
        .await
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{} {} {}",
                r.get_at::<String>(0).unwrap(),
                r.get_at::<String>(1).unwrap(),
                r.get_at::<String>(2).unwrap()
            )
        })
        .collect()
}

/// The two services of a case on the cluster: a producer whose relay publishes to a stream of
/// 3 replicas, a consumer whose inbox reads it through a durable consumer, and the task that
/// keeps committing events.
struct Services {
    producer: Outbox,
    consumer: Outbox,
    producer_client: async_nats::Client,
    consumer_client: async_nats::Client,
    /// Stops the writer.
    stop_writing: CancellationToken,
    /// Stops the inbox.
    cancel: CancellationToken,
    rounds: Arc<std::sync::atomic::AtomicU64>,
    writer: Option<JoinHandle<()>>,
    inbox: Option<JoinHandle<()>>,
    workers: Vec<event_runtime::Workers>,
}

impl Services {
    async fn start(cluster: &OwnCluster, db: &Db, consumer_db: &Db) -> Services {
        let url = cluster.url();
        let producer_client = nats::connect(&url, "orders").await.unwrap();
        let consumer_client = nats::connect(&url, "billing").await.unwrap();
        let js = async_nats::jetstream::new(producer_client.clone());
        let spec = StreamSpec::new("EVENTS")
            .subjects(["cluster.>"])
            .replicas(3);
        spec.create(&js).await.unwrap();
        let shape = spec.check(&js).await.unwrap();
        assert_eq!(shape.replicas, 3);
        assert!(shape.leader.is_some(), "{shape:?}");
        // Three quick attempts: a fault that used attempts would dead-letter within a second.
        let relay = NatsRelay::new(
            producer_client.clone(),
            RelayConfig::new("EVENTS")
                .subject_prefix("cluster")
                .publish_timeout(Duration::from_secs(2))
                .retry(RetryPolicy {
                    max_attempts: 3,
                    initial_backoff: Duration::from_millis(10),
                    max_backoff: Duration::from_millis(20),
                }),
        );
        let producer = Outbox::builder(db.open().await)
            .dispatcher(Dispatcher::builder_empty().event::<Tick>())
            .destination(relay.clone())
            .config(
                OutboxConfig::default()
                    .source("urn:test:cluster")
                    .poll_interval(Duration::from_millis(20)),
            )
            .build()
            .unwrap();
        relay.check(&producer).await.unwrap();

        let store = consumer_db.open().await;
        let mut tx = store.begin().await.unwrap();
        tx.execute(
            "CREATE TABLE cluster_seen (account TEXT NOT NULL, sequence BIGINT NOT NULL, n BIGINT NOT NULL)",
            &[],
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        let consumer = Outbox::builder(store)
            .dispatcher(Dispatcher::builder_empty().handler::<record>())
            .config(OutboxConfig::default().poll_interval(Duration::from_millis(20)))
            .build()
            .unwrap();
        let inbox = NatsInbox::new(
            &async_nats::jetstream::new(consumer_client.clone()),
            consumer.clone(),
            InboxConfig::new("EVENTS", "billing")
                .batch(64)
                .ack_wait(ACK_WAIT)
                .fetch_wait(FETCH_WAIT),
        )
        .await
        .unwrap();
        let cancel = CancellationToken::new();
        let workers = vec![producer.spawn_workers(2), consumer.spawn_workers(2)];
        let inbox = tokio::spawn({
            let cancel = cancel.clone();
            async move {
                // Only a verdict about the broker's data ends it: none may come.
                inbox.run(cancel, None).await.unwrap();
            }
        });
        let rounds = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let stop_writing = CancellationToken::new();
        let writer = tokio::spawn({
            let (producer, cancel, rounds) =
                (producer.clone(), stop_writing.clone(), rounds.clone());
            async move {
                let mut round = 0;
                while !cancel.is_cancelled() {
                    round += 1;
                    let mut uow = producer.begin().await.unwrap();
                    for a in 0..ACCOUNTS {
                        uow.add(
                            Envelope::new(Tick {
                                account: format!("A{a}"),
                            })
                            .with_sequence(round),
                        );
                    }
                    uow.commit().await.unwrap();
                    rounds.store(round, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(ROUND).await;
                }
            }
        });
        Services {
            producer,
            consumer,
            producer_client,
            consumer_client,
            stop_writing,
            cancel,
            rounds,
            writer: Some(writer),
            inbox: Some(inbox),
            workers,
        }
    }

    /// Events the consumer's handler has handled.
    async fn handled(&self) -> i64 {
        fetch_i64(
            self.consumer.store(),
            "SELECT COUNT(*) FROM cluster_seen",
            &[],
        )
        .await
        .unwrap_or(0)
    }

    /// Both sides' state, for a failed assertion's message.
    async fn state(&self) -> String {
        let producer = self.producer.store().stats().await;
        let consumer = self.consumer.store().stats().await;
        let held = self.consumer.held_events().await;
        let js = async_nats::jetstream::new(self.consumer_client.clone());
        let info = tokio::time::timeout(Duration::from_secs(5), async {
            let mut s = js.get_stream("EVENTS").await.ok()?;
            let stream = s.info().await.ok()?.clone();
            let mut c = s
                .get_consumer::<async_nats::jetstream::consumer::pull::Config>("billing")
                .await
                .ok()?;
            let consumer = c.info().await.ok()?.clone();
            Some((stream, consumer))
        })
        .await
        .ok()
        .flatten();
        let broker = info.map_or("the broker did not answer".to_owned(), |(s, c)| {
            format!(
                "stream: {} messages, last {}, leader {:?}; consumer: delivered {}, ack floor {}, pending {}, ack pending {}, redelivered {}, waiting {}, leader {:?}",
                s.state.messages,
                s.state.last_sequence,
                s.cluster.and_then(|c| c.leader),
                c.delivered.stream_sequence,
                c.ack_floor.stream_sequence,
                c.num_pending,
                c.num_ack_pending,
                c.num_redelivered,
                c.num_waiting,
                c.cluster.and_then(|c| c.leader)
            )
        });
        format!("producer {producer:?}; consumer {consumer:?}, held {held:?}; {broker}")
    }

    /// Waits until the consumer handled `n` events.
    async fn wait_handled(&self, n: i64, what: &str) {
        let started = Instant::now();
        while self.handled().await < n {
            if started.elapsed() > Duration::from_secs(60) {
                panic!(
                    "{what}: {} of {n} events handled after 60 s; {}",
                    self.handled().await,
                    self.state().await
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// After a kill at `killed_ms`: waits until an event committed after the kill was
    /// published (the relay resumed) and handled (the consumer resumed), and returns both
    /// times from the kill.
    async fn resumed(&self, killed_ms: i64, what: &str) -> (Duration, Duration) {
        let started = Instant::now();
        loop {
            let published = fetch_i64(
                self.producer.store(),
                "SELECT COALESCE(MIN(completed_at), 0) FROM event_deliveries WHERE status = 'completed' AND created_at > $1",
                &[SqlValue::Int(killed_ms)],
            )
            .await;
            let handled = fetch_i64(
                self.consumer.store(),
                "SELECT COALESCE(MIN(d.completed_at), 0) FROM event_deliveries d JOIN event_outbox o ON o.event_id = d.event_id \
                 WHERE d.status = 'completed' AND o.occurred_at > $1",
                &[SqlValue::Int(killed_ms)],
            )
            .await;
            if let (Some(p @ 1..), Some(h @ 1..)) = (published, handled) {
                let ms = |t: i64| Duration::from_millis((t - killed_ms).max(0) as u64);
                return (ms(p), ms(h));
            }
            assert!(
                started.elapsed() < FAILOVER_ALLOWANCE * 2,
                "{what}: not resumed {:?} after the kill",
                started.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops the writer, waits for every event to be handled, stops everything, and asserts:
    /// each account's events handled once each, 1..=rounds in order, no dead letter on either
    /// side, no delivery of the relay used more than its one successful attempt.
    async fn finish(mut self, what: &str) {
        self.stop_writing.cancel();
        self.writer.take().unwrap().await.unwrap();
        let rounds = self.rounds.load(std::sync::atomic::Ordering::SeqCst) as i64;
        let total = rounds * ACCOUNTS as i64;
        self.wait_handled(total, what).await;
        self.cancel.cancel();
        self.inbox.take().unwrap().await.unwrap();
        for w in self.workers.drain(..) {
            w.shutdown(Duration::from_secs(10)).await.unwrap();
        }
        assert_eq!(self.handled().await, total, "{what}: nothing applied twice");
        for a in 0..ACCOUNTS {
            let account = format!("A{a}");
            let seen: Vec<i64> = self
                .consumer
                .store()
                .query("SELECT sequence FROM cluster_seen WHERE account = $1 ORDER BY n")
                .bind(account.as_str())
                .fetch_all()
                .await
                .unwrap()
                .iter()
                .map(|r| r.get_at::<i64>(0).unwrap())
                .collect();
            assert_eq!(
                seen,
                (1..=rounds).collect::<Vec<_>>(),
                "{what}: account A{a} handled each event once, in order"
            );
        }
        for (side, outbox) in [("producer", &self.producer), ("consumer", &self.consumer)] {
            let stats = outbox.store().stats().await.unwrap();
            assert_eq!(
                (stats.pending, stats.dead_letters),
                (0, 0),
                "{what}: {side} has nothing pending and no dead letter: {:?}",
                dead_letters(outbox.store()).await
            );
        }
        let attempts = fetch_i64(
            self.producer.store(),
            "SELECT MAX(attempts) FROM event_deliveries",
            &[],
        )
        .await;
        assert_eq!(
            attempts,
            Some(1),
            "{what}: no publish used an attempt beyond its successful one"
        );
        let _ = (&self.producer_client, &self.consumer_client);
        say(&format!(
            "{what}: {total} events over {rounds} rounds, exact"
        ));
    }
}

/// Kills server `i`, measures the resumption, restarts it after a few seconds, and waits
/// for the consumer to go on.
async fn kill_and_restart(
    cluster: &mut OwnCluster,
    services: &Services,
    i: usize,
    kind: &str,
) -> (Duration, Duration) {
    let name = cluster.nodes[i].name.clone();
    cluster.kill(i);
    let killed_ms = now_ms();
    let (published, handled) = services.resumed(killed_ms, kind).await;
    say(&format!(
        "resume: {kind} ({name} killed): relay published again after {} ms, consumer handled after {} ms",
        published.as_millis(),
        handled.as_millis()
    ));
    // The consumer's redelivery delay (ack wait and fetch wait) plus the allowance: what the
    // inbox requires the gap wait to exceed.
    let bound = ACK_WAIT + FETCH_WAIT + FAILOVER_ALLOWANCE;
    assert!(
        handled < bound,
        "{kind}: resumed after {handled:?}, beyond the redelivery delay plus FAILOVER_ALLOWANCE ({bound:?})"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(cluster.up(i));
    let n = services.handled().await;
    services
        .wait_handled(
            n + 8 * ACCOUNTS as i64,
            &format!("{kind}: after {name} is back"),
        )
        .await;
    (published, handled)
}

/// A cluster, and both services running on it until the consumer handled 200 events; `None`
/// when the case is skipped.
async fn running(test: &str) -> Option<(OwnCluster, Services)> {
    let cluster = OwnCluster::start()?;
    cluster.ready().await;
    let (producer, consumer) = databases(test).await;
    let services = Services::start(&cluster, &producer, &consumer).await;
    services.wait_handled(200, "before the kills").await;
    Some((cluster, services))
}

/// Both services on their databases: the producer on SQLite, the consumer on PostgreSQL when
/// it is configured (SQLite otherwise).
async fn databases(test: &str) -> (Db, Db) {
    let mut dbs = common::databases(test).await;
    let consumer = dbs.pop().unwrap();
    let producer = Db::Sqlite(common::sqlite(&format!("{test}_producer")).await.0);
    (producer, consumer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_stream_leader_mid_run_loses_nothing_reorders_nothing_and_uses_no_attempt() {
    if !enabled("cluster_leader") {
        return;
    }
    let _serial = SERIAL.lock().await;
    common::log_from_env();
    tokio::time::timeout(CASE_CAP, async {
        let Some((mut cluster, services)) = running("cluster_leader").await else {
            return;
        };
        let leader = cluster.stream_leader("EVENTS").await;
        kill_and_restart(&mut cluster, &services, leader, "the stream's leader").await;
        // And the consumer's leader, when another server leads it now.
        let consumer_leader = cluster.consumer_leader("EVENTS", "billing").await;
        kill_and_restart(
            &mut cluster,
            &services,
            consumer_leader,
            "the consumer's leader",
        )
        .await;
        services.finish("leader kills").await;
    })
    .await
    .expect("the case took over 3 minutes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_server_the_clients_are_connected_to_loses_nothing_and_both_reconnect() {
    if !enabled("cluster_connected") {
        return;
    }
    let _serial = SERIAL.lock().await;
    common::log_from_env();
    tokio::time::timeout(CASE_CAP, async {
        let Some((mut cluster, services)) = running("cluster_connected").await else {
            return;
        };
        let p = cluster.index_of_port(services.producer_client.server_info().port);
        kill_and_restart(&mut cluster, &services, p, "the producer's server").await;
        let c = cluster.index_of_port(services.consumer_client.server_info().port);
        kill_and_restart(&mut cluster, &services, c, "the consumer's server").await;
        services.finish("connected-server kills").await;
    })
    .await
    .expect("the case took over 3 minutes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_its_quorum_pauses_the_relay_without_using_attempts_until_it_is_back() {
    if !enabled("cluster_quorum") {
        return;
    }
    let _serial = SERIAL.lock().await;
    common::log_from_env();
    tokio::time::timeout(CASE_CAP, async {
        let Some((mut cluster, services)) = running("cluster_quorum").await else {
            return;
        };
        // Two of three down: the stream cannot store anything (NATS needs 2 of 3 replicas).
        // The leader survives: for about ten seconds it still says it leads, while every
        // publish times out.
        let leader = cluster.stream_leader("EVENTS").await;
        let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
        cluster.kill(others[0]);
        cluster.kill(others[1]);
        let killed_ms = now_ms();
        tokio::time::sleep(Duration::from_secs(10)).await;
        let stats = services.producer.store().stats().await.unwrap();
        assert!(stats.pending > 0, "held back while the quorum is lost");
        assert_eq!(
            stats.dead_letters,
            0,
            "nothing dead-lettered: {:?}",
            dead_letters(services.producer.store()).await
        );
        let attempts = fetch_i64(
            services.producer.store(),
            "SELECT COALESCE(MAX(attempts), 0) FROM event_deliveries WHERE status = 'pending'",
            &[],
        )
        .await;
        assert_eq!(attempts, Some(0), "a lost quorum uses no attempt");
        // The tool says so too.
        let argv = ["events", "nats", "stream", "check", "EVENTS", "--subject", "cluster.>", "--nats"]
            .iter()
            .map(|s| s.to_string())
            .chain([cluster.url()])
            .collect::<Vec<_>>();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run_with_output(argv, App::standalone(), &mut out, &mut err).await;
        let err = String::from_utf8_lossy(&err);
        assert_ne!(code, std::process::ExitCode::SUCCESS, "{err}");
        assert!(err.contains("lost its quorum") || err.contains("did not answer"), "{err}");

        assert!(cluster.up(others[0]));
        let back_ms = now_ms();
        let (published, handled) = services.resumed(back_ms, "the quorum is back").await;
        say(&format!(
            "resume: a lost quorum ({} s without it): relay published again {} ms after a second server was back, consumer handled after {} ms",
            (back_ms - killed_ms) / 1000,
            published.as_millis(),
            handled.as_millis()
        ));
        assert!(cluster.up(others[1]));
        services.finish("lost quorum").await;
    })
    .await
    .expect("the case took over 3 minutes");
}

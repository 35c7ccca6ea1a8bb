//! A three-server JetStream cluster of the test's own: three `nats-server` processes on free
//! loopback ports, routed to each other (`--cluster`, `--routes`), JetStream on each with its
//! own storage folder, which the test kills (SIGKILL) and restarts one by one. Included by the
//! cluster test binaries (here and in `examples/tests`) with `#[path]`.
//!
//! The cluster is the one the README's three commands start, on other ports.

#![allow(dead_code)]

use std::time::{Duration, Instant};

/// One server of the cluster.
pub struct Node {
    /// Its server name (`n1`…): what a stream's `cluster.leader` names.
    pub name: String,
    /// The client port.
    pub port: u16,
    /// The route port.
    pub route_port: u16,
    dir: std::path::PathBuf,
    child: Option<std::process::Child>,
}

pub struct OwnCluster {
    pub nodes: Vec<Node>,
    cluster: String,
}

fn require() -> bool {
    std::env::var("EVENTS_TEST_REQUIRE_SERVICES").as_deref() == Ok("1")
}

/// A free loopback port (bound, then released for a process to bind).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl OwnCluster {
    /// Starts three servers, or says why the case is skipped (`nats-server` not installed) and
    /// returns `None`; with `EVENTS_TEST_REQUIRE_SERVICES=1` a missing binary fails the test.
    /// [`ready`](Self::ready) waits for its JetStream.
    pub fn start() -> Option<OwnCluster> {
        let id = uuid::Uuid::now_v7().simple().to_string();
        let nodes = (1..=3)
            .map(|i| Node {
                name: format!("n{i}"),
                port: free_port(),
                route_port: free_port(),
                dir: std::env::temp_dir().join(format!("nats-cluster-{id}-n{i}")),
                child: None,
            })
            .collect();
        let mut c = OwnCluster {
            nodes,
            cluster: format!("c{}", &id[id.len() - 8..]),
        };
        for i in 0..3 {
            if !c.up(i) {
                return None;
            }
        }
        Some(c)
    }

    /// Starts server `i` (again, on its own storage).
    pub fn up(&mut self, i: usize) -> bool {
        let routes = self
            .nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.route_port))
            .collect::<Vec<_>>()
            .join(",");
        let n = &mut self.nodes[i];
        let child = std::process::Command::new("nats-server")
            .args(["-js", "-a", "127.0.0.1", "-p", &n.port.to_string()])
            .args(["--server_name", &n.name, "--cluster_name", &self.cluster])
            .args(["--cluster", &format!("nats://127.0.0.1:{}", n.route_port)])
            .args(["--routes", &routes, "-sd"])
            .arg(&n.dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        match child {
            Ok(c) => {
                n.child = Some(c);
                true
            }
            Err(e) => {
                assert!(!require(), "cannot start nats-server: {e}");
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "note: cluster case skipped: no nats-server: {e}"
                );
                false
            }
        }
    }

    /// Kills server `i` (SIGKILL: a crash), keeping its storage.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Whether server `i` runs.
    pub fn is_up(&self, i: usize) -> bool {
        self.nodes[i].child.is_some()
    }

    /// The servers' URLs, comma-separated, as a service's `--nats` takes them.
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The index of the server named `name`.
    pub fn index(&self, name: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .unwrap_or_else(|| panic!("no server {name}"))
    }

    /// The index of the server listening on client port `port`.
    pub fn index_of_port(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .unwrap_or_else(|| panic!("no server on port {port}"))
    }

    /// A client of server `i` alone, once it answers (10 s at most).
    pub async fn client_of(&self, i: usize) -> async_nats::Client {
        let url = format!("nats://127.0.0.1:{}", self.nodes[i].port);
        for _ in 0..100 {
            if let Ok(c) = async_nats::ConnectOptions::new()
                .ignore_discovered_servers()
                .connect(&url)
                .await
            {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("server {} at {url} does not answer", self.nodes[i].name);
    }

    /// A client of the running servers once the cluster can place a stream of one replica per
    /// running server (60 s at most: it elects its meta leader, then learns its peers): a
    /// probe stream is created and deleted.
    pub async fn ready(&self) -> async_nats::Client {
        let started = Instant::now();
        let up: Vec<usize> = (0..3).filter(|&i| self.is_up(i)).collect();
        let client = self.client_of(up[0]).await;
        let js = async_nats::jetstream::new(client.clone());
        let probe = async_nats::jetstream::stream::Config {
            name: "CLUSTER_READY_PROBE".into(),
            subjects: vec!["cluster-ready-probe".into()],
            num_replicas: up.len(),
            ..Default::default()
        };
        loop {
            let created =
                tokio::time::timeout(Duration::from_secs(5), js.create_stream(probe.clone())).await;
            if let Ok(Ok(_)) = created {
                let _ = js.delete_stream("CLUSTER_READY_PROBE").await;
                return client;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the cluster's JetStream did not become ready in 60 s: {created:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The server leading `stream` now (its index), asked through running servers until one
    /// answers with a leader (30 s at most).
    pub async fn stream_leader(&self, stream: &str) -> usize {
        self.leader(&format!("stream {stream}"), |js| async move {
            let mut s = js.get_stream(stream).await.ok()?;
            s.info().await.ok()?.cluster.clone()?.leader
        })
        .await
    }

    /// The server leading the durable consumer `durable` of `stream` now (its index).
    pub async fn consumer_leader(&self, stream: &str, durable: &str) -> usize {
        self.leader(&format!("consumer {durable}"), |js| async move {
            let s = js.get_stream(stream).await.ok()?;
            let mut c = s
                .get_consumer::<async_nats::jetstream::consumer::pull::Config>(durable)
                .await
                .ok()?;
            c.info().await.ok()?.cluster.clone()?.leader
        })
        .await
    }

    /// The index of the leader `ask` names, asked through each running server in turn (2 s
    /// each) until one names it, 30 s at most.
    async fn leader<F, Fut>(&self, what: &str, ask: F) -> usize
    where
        F: Fn(async_nats::jetstream::Context) -> Fut,
        Fut: std::future::Future<Output = Option<String>>,
    {
        let started = Instant::now();
        loop {
            for i in (0..3).filter(|&i| self.is_up(i)) {
                let js = async_nats::jetstream::new(self.client_of(i).await);
                if let Ok(Some(leader)) =
                    tokio::time::timeout(Duration::from_secs(2), ask(js)).await
                {
                    return self.index(&leader);
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{what} has no leader after 30 s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        for i in 0..3 {
            self.kill(i);
            let _ = std::fs::remove_dir_all(&self.nodes[i].dir);
        }
    }
}

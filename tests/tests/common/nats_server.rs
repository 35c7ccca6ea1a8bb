//! A `nats-server` of the test's own, on a free loopback port with its own storage folder,
//! which the test kills, restarts and wipes. Included by the NATS test binaries (here and in
//! `examples/tests`) with `#[path]`, so that the others need no NATS client.

#![allow(dead_code)]

use std::time::Duration;

pub struct OwnServer {
    pub port: u16,
    pub dir: std::path::PathBuf,
    child: Option<std::process::Child>,
}

fn require() -> bool {
    std::env::var("EVENTS_TEST_REQUIRE_SERVICES").as_deref() == Ok("1")
}

impl OwnServer {
    /// Starts one, or says why the case is skipped (`nats-server` not installed) and returns
    /// `None`; with `EVENTS_TEST_REQUIRE_SERVICES=1` a missing binary fails the test.
    pub fn start() -> Option<OwnServer> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("nats-{}", uuid::Uuid::now_v7().simple()));
        let mut s = OwnServer {
            port,
            dir,
            child: None,
        };
        s.up().then_some(s)
    }

    pub fn up(&mut self) -> bool {
        let child = std::process::Command::new("nats-server")
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(&self.dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        match child {
            Ok(c) => {
                self.child = Some(c);
                true
            }
            Err(e) => {
                assert!(!require(), "cannot start nats-server: {e}");
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "note: broker fault case skipped: no nats-server: {e}"
                );
                false
            }
        }
    }

    /// Kills it (SIGKILL: a crash), keeping its storage.
    pub fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills it and deletes its storage: every stream and consumer is gone.
    pub fn wipe(&mut self) {
        self.down();
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// Stops it (SIGSTOP): it holds its connections and answers nothing, as a hung broker.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Continues it after [`freeze`](Self::freeze) (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        if let Some(c) = &self.child {
            let status = std::process::Command::new("kill")
                .args([signal, &c.id().to_string()])
                .status()
                .unwrap();
            assert!(status.success(), "kill {signal} failed");
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// A client once the server answers (10 s at most).
    pub async fn client(&self) -> async_nats::Client {
        for _ in 0..100 {
            if let Ok(c) = async_nats::connect(self.url()).await {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("own nats-server at {} does not answer", self.url());
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.wipe();
    }
}

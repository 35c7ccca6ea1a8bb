//! A clustered stream's health as the relay judges it from the stream's info: its leader,
//! and which of its replicas the leader hears from. NATS JetStream replicates a stream with
//! RAFT: a publish is acknowledged once a majority of the replicas stored it, a leader sends
//! its peers a heartbeat every second and steps down only after about ten seconds without a
//! majority (nats-server `raft.go`: `hbInterval`, `lostQuorumInterval`). Until it does, the
//! stream's info still names it leader while every publish times out: the replicas' `active`
//! (time since the leader last heard from each) tells the relay that the quorum is gone.

use std::time::{Duration, Instant};

use async_nats::jetstream::stream;

/// A replica the leader has not heard from for longer than this is taken as unreachable:
/// one and a half of NATS's RAFT heartbeat intervals (1 s).
pub(super) const PEER_SEEN_WITHIN: Duration = Duration::from_millis(1500);

/// A stream's replicas as its info shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Health {
    /// The leader's server name (`None`: a single server's stream, or no leader).
    pub leader: Option<String>,
    /// Whether the stream is clustered (its info has a `cluster` block with a RAFT group).
    pub clustered: bool,
    /// Replicas in all, the leader included.
    pub replicas: usize,
    /// Replicas the leader hears from, itself included.
    pub reachable: usize,
    /// The replicas it does not hear from, or that are behind: `name (why)`.
    pub unsure: Vec<String>,
}

impl Health {
    pub(super) fn of(info: &stream::Info) -> Health {
        let cluster = info.cluster.as_ref();
        let peers = cluster.map_or(&[][..], |c| &c.replicas[..]);
        let mut unsure = Vec::new();
        let mut reachable = usize::from(cluster.is_some_and(|c| c.leader.is_some()));
        for p in peers {
            if p.offline || p.active > PEER_SEEN_WITHIN {
                unsure.push(format!(
                    "{} (not heard from for {:.1} s)",
                    p.name,
                    p.active.as_secs_f64()
                ));
            } else {
                reachable += 1;
                if !p.current {
                    unsure.push(format!("{} (catching up)", p.name));
                }
            }
        }
        Health {
            leader: cluster.and_then(|c| c.leader.clone()),
            clustered: cluster.is_some_and(|c| c.raft_group.is_some() || !c.replicas.is_empty()),
            replicas: info.config.num_replicas.max(1),
            reachable,
            unsure,
        }
    }

    /// Why the stream cannot take a publish now (no leader, or fewer reachable replicas than
    /// a majority), or `None`.
    pub(super) fn unavailable(&self, stream: &str) -> Option<String> {
        if !self.clustered || self.replicas < 2 {
            return None;
        }
        if self.leader.is_none() {
            return Some(format!("stream `{stream}` has no leader"));
        }
        let majority = self.replicas / 2 + 1;
        (self.reachable < majority).then(|| {
            format!(
                "stream `{stream}` has lost its quorum: its leader hears from {} of {} replicas, {majority} needed ({})",
                self.reachable,
                self.replicas,
                self.unsure.join(", ")
            )
        })
    }

    /// Why a publish time-out is likely the cluster's (a replica unreachable or catching up),
    /// or `None` when every replica looks healthy.
    pub(super) fn degraded(&self, stream: &str) -> Option<String> {
        (!self.unsure.is_empty()).then(|| {
            format!(
                "stream `{stream}` has replicas the leader is not sure of: {}",
                self.unsure.join(", ")
            )
        })
    }
}

/// What is wrong with the replicas of stream `name` now, for `events nats stream check`:
/// `Err` when it cannot take a publish (no leader, no quorum), `Ok(Some)` when a replica is
/// away or behind, `Ok(None)` when all is well or the stream is not clustered.
#[cfg(feature = "cli")]
pub(crate) async fn replica_trouble(
    js: &async_nats::jetstream::Context,
    name: &str,
) -> Result<Option<String>, String> {
    let info = js
        .get_stream(name)
        .await
        .map_err(|e| format!("stream `{name}` did not answer: {e}"))?
        .cached_info()
        .clone();
    let health = Health::of(&info);
    match health.unavailable(name) {
        Some(why) => Err(why),
        None => Ok(health.degraded(name)),
    }
}

/// The stream's leader (a clustered stream's server name; `None` on a single server) as the
/// relay last saw it, and when it first saw it so.
#[derive(Debug)]
pub(super) struct LeaderSeen {
    name: Option<String>,
    changed: Instant,
    /// Whether a probe has seen the stream at all (the first sight is not a change).
    seen: bool,
}

impl Default for LeaderSeen {
    fn default() -> Self {
        LeaderSeen {
            name: None,
            changed: Instant::now(),
            seen: false,
        }
    }
}

impl LeaderSeen {
    /// Records the leader a probe found; a change (logged, after the first sight) restarts
    /// the grace within which a publish time-out counts as the election's.
    pub(super) fn saw(&mut self, leader: Option<String>, relay: &str, stream: &str) {
        if self.name == leader {
            self.seen = true;
            return;
        }
        match (&self.name, &leader) {
            (Some(from), Some(to)) => {
                tracing::info!(
                    relay,
                    stream,
                    from,
                    to,
                    "stream `{stream}` has a new leader: {to}"
                )
            }
            (Some(from), None) => {
                tracing::info!(
                    relay,
                    stream,
                    from,
                    "stream `{stream}` has no leader (was {from})"
                )
            }
            (None, Some(to)) if self.seen => {
                tracing::info!(
                    relay,
                    stream,
                    to,
                    "stream `{stream}` has a leader again: {to}"
                )
            }
            _ => {}
        }
        self.seen = true;
        self.name = leader;
        self.changed = Instant::now();
    }

    /// Why a publish sent at `sent` may have been lost to a change of leader: it went out
    /// before the relay saw the current leader take over, or within `grace` (one publish
    /// time-out: the new leader catching up) after; `None` otherwise.
    pub(super) fn within_election(
        &self,
        sent: Instant,
        grace: Duration,
        stream: &str,
    ) -> Option<String> {
        (sent < self.changed + grace).then(|| {
            format!(
                "stream `{stream}` changed leader (now {}) while the publish was in flight",
                self.name.as_deref().unwrap_or("none")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(replicas: usize, leader: Option<&str>, peers: &[(&str, u64, bool)]) -> stream::Info {
        let peers: Vec<serde_json::Value> = peers
            .iter()
            .map(|(name, active_ms, current)| {
                serde_json::json!({"name": name, "current": current, "active": active_ms * 1_000_000})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "config": {"name": "S", "subjects": ["s.>"], "num_replicas": replicas,
                       "retention": "limits", "storage": "file", "discard": "old",
                       "max_consumers": -1, "max_msgs": -1, "max_bytes": -1, "max_age": 0,
                       "max_msgs_per_subject": -1, "max_msg_size": -1, "duplicate_window": 120000000000u64},
            "created": "2026-12-06T10:00:00Z",
            "state": {"messages": 0, "bytes": 0, "first_seq": 0, "first_ts": "0001-01-01T00:00:00Z",
                      "last_seq": 0, "last_ts": "0001-01-01T00:00:00Z", "consumer_count": 0},
            "cluster": {"name": "c", "raft_group": "S-R3F", "leader": leader, "replicas": peers},
        }))
        .unwrap()
    }

    #[test]
    fn a_healthy_stream_is_neither_unavailable_nor_degraded() {
        let h = Health::of(&info(
            3,
            Some("n1"),
            &[("n2", 200, true), ("n3", 900, true)],
        ));
        assert_eq!((h.reachable, h.replicas), (3, 3));
        assert_eq!(h.unavailable("S"), None);
        assert_eq!(h.degraded("S"), None);
    }

    #[test]
    fn one_replica_down_is_degraded_two_lose_the_quorum() {
        let h = Health::of(&info(
            3,
            Some("n1"),
            &[("n2", 4_000, true), ("n3", 300, true)],
        ));
        assert_eq!(h.unavailable("S"), None);
        assert!(h
            .degraded("S")
            .unwrap()
            .contains("n2 (not heard from for 4.0 s)"));
        let h = Health::of(&info(
            3,
            Some("n1"),
            &[("n2", 4_000, true), ("n3", 2_000, true)],
        ));
        let why = h.unavailable("S").unwrap();
        assert!(
            why.contains("lost its quorum: its leader hears from 1 of 3 replicas, 2 needed"),
            "{why}"
        );
        let h = Health::of(&info(3, None, &[]));
        assert_eq!(
            h.unavailable("S").as_deref(),
            Some("stream `S` has no leader")
        );
        let h = Health::of(&info(
            3,
            Some("n1"),
            &[("n2", 100, false), ("n3", 100, true)],
        ));
        assert!(h.degraded("S").unwrap().contains("n2 (catching up)"));
    }

    #[test]
    fn a_time_out_sent_before_a_new_leader_took_over_is_the_elections() {
        let mut seen = LeaderSeen::default();
        let grace = Duration::from_millis(50);
        seen.saw(Some("n1".into()), "nats:S", "S");
        std::thread::sleep(grace * 2);
        let before = Instant::now();
        assert_eq!(
            seen.within_election(before, grace, "S"),
            None,
            "n1 long in office"
        );
        seen.saw(Some("n2".into()), "nats:S", "S");
        let why = seen.within_election(before, grace, "S").unwrap();
        assert!(why.contains("changed leader (now n2)"), "{why}");
        std::thread::sleep(grace * 2);
        assert_eq!(seen.within_election(Instant::now(), grace, "S"), None);
    }

    #[test]
    fn a_single_servers_stream_is_never_judged() {
        let mut i = info(1, None, &[]);
        i.cluster = None;
        let h = Health::of(&i);
        assert_eq!(h.unavailable("S"), None);
        assert_eq!(h.degraded("S"), None);
    }
}

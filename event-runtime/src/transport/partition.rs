//! Partitions of a stream (NATS) or of an exchange's queues (RabbitMQ) and their assignment to
//! a group of inbox instances: which partition an aggregate's events go to ([`partition_of`]),
//! the subject or routing key that carries it (a partition token after its first token), and
//! which live instance consumes which partition ([`assign`]). Pure functions: no broker, no
//! store; every transport shares them.
//!
//! # Stability
//! Both functions are part of the wire contract, not an implementation detail: producers and
//! consumers of different releases, processes and platforms must agree on them. They hash with
//! XXH3-64 (seed 0; the `xxhash-rust` crate, the reference algorithm's published output), which
//! every language has, over bytes spelled out below, and their results are pinned by fixed
//! vectors in the tests. A change to either is a breaking change of the wire format.

use std::collections::BTreeMap;

use xxhash_rust::xxh3::xxh3_64;

/// Most partitions a stream may have: one durable consumer each on the server, one lease row
/// each in the consuming database.
pub const MAX_PARTITIONS: u32 = 1024;

/// The partition, `0..partitions`, of the aggregate `(aggregate_type, aggregate_id)` — as the
/// producer names it (`order`, `A-17`): `XXH3-64(aggregate_type ‖ 0x00 ‖ aggregate_id) mod
/// partitions`, the strings as UTF-8 (neither may hold U+0000: the outbox refuses it). Every
/// event of one aggregate goes to one partition. 0 when `partitions` is 0 or 1.
///
/// ```
/// use event_runtime::transport::partition_of;
/// assert_eq!(partition_of("order", "A-17", 1), 0);
/// assert!(partition_of("order", "A-17", 8) < 8);
/// assert_eq!(partition_of("order", "A-17", 8), partition_of("order", "A-17", 8));
/// ```
pub fn partition_of(aggregate_type: &str, aggregate_id: &str, partitions: u32) -> u32 {
    if partitions <= 1 {
        return 0;
    }
    let mut key = Vec::with_capacity(aggregate_type.len() + 1 + aggregate_id.len());
    key.extend_from_slice(aggregate_type.as_bytes());
    key.push(0);
    key.extend_from_slice(aggregate_id.as_bytes());
    (xxh3_64(&key) % u64::from(partitions)) as u32
}

/// `subject` with the partition token `partition` after its first token:
/// `events.order.placed` → `events.3.order.placed`; `orders` → `orders.3`.
pub(crate) fn partitioned_subject(subject: &str, partition: impl std::fmt::Display) -> String {
    match subject.split_once('.') {
        Some((first, rest)) => format!("{first}.{partition}.{rest}"),
        None => format!("{subject}.{partition}"),
    }
}

/// The subject filter of an inbox on a stream of `partitions` partitions: `filter` (the whole
/// stream when `None`) within `partition`, or within every partition when `None`
/// (`events.order.>` → `events.3.order.>` or `events.*.order.>`; the whole stream → `*.3.>`).
/// `filter` itself when unpartitioned.
#[cfg(feature = "nats")]
pub(crate) fn partition_filter(
    filter: Option<&str>,
    partitions: u32,
    partition: Option<u32>,
) -> Option<String> {
    if partitions <= 1 {
        return filter.map(str::to_owned);
    }
    let token = partition.map_or_else(|| "*".to_owned(), |p| p.to_string());
    Some(match filter {
        None | Some(">") => format!("*.{token}.>"),
        Some(f) => partitioned_subject(f, token),
    })
}

/// The subjects `subjects` (a stream's) without their partition token, each once:
/// `events.0.>`, `events.1.>` → `events.>`.
#[cfg(feature = "nats")]
pub(crate) fn base_subjects(subjects: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in subjects {
        let base = match partition_token(s) {
            Some(_) => {
                let mut tokens: Vec<&str> = s.split('.').collect();
                tokens.remove(1);
                tokens.join(".")
            }
            None => s.clone(),
        };
        if !out.contains(&base) {
            out.push(base);
        }
    }
    out
}

/// The partition token of a partitioned subject (its second token, digits only); `None` when
/// it has none.
#[cfg(feature = "nats")]
pub(crate) fn partition_token(subject: &str) -> Option<u32> {
    let second = subject.split('.').nth(1)?;
    if second.is_empty() || !second.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    second.parse().ok()
}

/// The rendezvous score of `member` for `partition` in `group`:
/// `XXH3-64(group ‖ 0x00 ‖ member ‖ 0x00 ‖ partition as decimal digits)`.
fn score(group: &str, member: &str, partition: u32) -> u64 {
    let key = format!("{group}\0{member}\0{partition}");
    xxh3_64(key.as_bytes())
}

/// Which of `members` consumes which of `partitions` partitions in `group`: rendezvous
/// (highest random weight) hashing with a bounded load. Partitions are placed in order
/// `0..partitions`; each goes to the member of highest score that may take one more — every
/// member takes `floor(partitions / members)`, and `partitions mod members` of them one
/// more; a member's score for a partition is
/// `XXH3-64(group ‖ 0x00 ‖ member ‖ 0x00 ‖ partition as decimal digits)`. Every instance that sees the same members computes the
/// same assignment with no coordination; a member joining or leaving moves few partitions
/// (those it takes or held, and the few the load bound pushes on); every member gets
/// `floor(partitions / members)` or `ceil(partitions / members)`. Members are deduplicated; no member: an empty map. Every
/// member is a key, with its partitions ascending (possibly none).
///
/// ```
/// use event_runtime::transport::assign;
/// let members = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
/// let plan = assign("billing", &members, 8);
/// assert!(plan.values().all(|p| p.len() <= 3));
/// assert_eq!(plan.values().map(Vec::len).sum::<usize>(), 8);
/// ```
pub fn assign(group: &str, members: &[String], partitions: u32) -> BTreeMap<String, Vec<u32>> {
    let mut plan: BTreeMap<String, Vec<u32>> =
        members.iter().map(|m| (m.clone(), Vec::new())).collect();
    if plan.is_empty() {
        return plan;
    }
    // Each member takes floor(P/N) or ceil(P/N): the first P mod N members to reach the floor
    // may go one above it. The capacities add up to P, so every member ends at its floor or
    // one above: none idle while another holds two more.
    let n = plan.len();
    let floor = partitions as usize / n;
    let mut above = partitions as usize % n;
    let names: Vec<String> = plan.keys().cloned().collect();
    for p in 0..partitions {
        let mut ranked: Vec<(u64, &String)> =
            names.iter().map(|m| (score(group, m, p), m)).collect();
        // Highest score first; ties (astronomically rare) by name, so that all agree.
        ranked.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        let taker = ranked.into_iter().find(|(_, m)| {
            let load = plan[*m].len();
            load < floor || (load == floor && above > 0)
        });
        if let Some((_, m)) = taker {
            let load = plan[m].len();
            if load == floor {
                above -= 1;
            }
            plan.get_mut(m).expect("a member").push(p);
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fixed vectors: these values are the wire contract (a change breaks every producer and
    /// consumer of another release). XXH3-64 of the key bytes, from the reference algorithm.
    #[test]
    fn partition_vectors() {
        assert_eq!(xxh3_64(b""), 0x2D06800538D394C2);
        assert_eq!(xxh3_64(b"order\0A-17"), 0x050B_6671_1426_525B);
        let cases = [
            ("order", "A-17", 8),
            ("order", "A-18", 8),
            ("order", "CA-2016-152156", 16),
            ("customer", "CG-12520", 3),
            ("order", "", 5),
            ("", "x", 7),
            ("order", "Zoë ☃", 1024),
        ];
        let got: Vec<u32> = cases
            .iter()
            .map(|(t, id, p)| partition_of(t, id, *p))
            .collect();
        assert_eq!(
            got, FIXED,
            "partition_of changed: a breaking change of the wire format"
        );
        assert_eq!(partition_of("order", "A-17", 1), 0);
        assert_eq!(partition_of("order", "A-17", 0), 0);
    }

    /// Computed independently with the C reference implementation (python-xxhash 3,
    /// `xxh3_64_intdigest(type + b"\0" + id) % p`).
    const FIXED: [u32; 7] = [3, 7, 3, 1, 3, 1, 626];

    #[test]
    fn every_partition_used_evenly() {
        let mut counts = [0u32; 8];
        for i in 0..8000 {
            counts[partition_of("order", &format!("A-{i}"), 8) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (850..1150).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    #[cfg(feature = "nats")]
    fn subjects() {
        assert_eq!(
            partitioned_subject("events.order.placed", 3),
            "events.3.order.placed"
        );
        assert_eq!(partitioned_subject("events.>", 0), "events.0.>");
        assert_eq!(partitioned_subject("orders", 12), "orders.12");
        assert_eq!(partition_token("events.3.order.placed"), Some(3));
        let stream = ["t.0.>", "t.1.>", "u.x"].map(String::from);
        assert_eq!(base_subjects(&stream), ["t.>", "u.x"]);
        assert_eq!(
            partition_filter(Some("events.order.>"), 1, Some(3)).as_deref(),
            Some("events.order.>")
        );
        assert_eq!(partition_filter(None, 1, Some(3)), None);
        assert_eq!(
            partition_filter(Some("events.order.>"), 8, Some(3)).as_deref(),
            Some("events.3.order.>")
        );
        assert_eq!(
            partition_filter(Some("events.order.>"), 8, None).as_deref(),
            Some("events.*.order.>")
        );
        assert_eq!(partition_filter(None, 8, Some(0)).as_deref(), Some("*.0.>"));
        assert_eq!(partition_token("events.order.placed"), None);
        assert_eq!(partition_token("events"), None);
        assert_eq!(partition_token("events..x"), None);
    }

    #[test]
    fn assignment_bounded_and_stable() {
        let names = |n: usize| (0..n).map(|i| format!("m{i}")).collect::<Vec<_>>();
        for members in 1..=5 {
            for partitions in [1, 2, 3, 7, 8, 16, 64] {
                let plan = assign("billing", &names(members), partitions);
                let (lo, hi) = (
                    partitions as usize / members,
                    (partitions as usize).div_ceil(members),
                );
                assert!(
                    plan.values().all(|p| (lo..=hi).contains(&p.len())),
                    "{members} members, {partitions} partitions: {plan:?}"
                );
                let mut all: Vec<u32> = plan.values().flatten().copied().collect();
                all.sort_unstable();
                assert_eq!(all, (0..partitions).collect::<Vec<_>>());
                // The order of the members given does not matter.
                let mut reversed = names(members);
                reversed.reverse();
                assert_eq!(assign("billing", &reversed, partitions), plan);
            }
        }
        // One member leaving moves its partitions and few others.
        let before = assign("billing", &names(4), 64);
        let after = assign("billing", &names(3), 64);
        let moved = (0..3)
            .map(|i| {
                let m = format!("m{i}");
                before[&m].iter().filter(|p| !after[&m].contains(p)).count()
            })
            .sum::<usize>();
        assert!(
            moved <= 8,
            "{moved} partitions moved between the members that stayed"
        );
        assert!(assign("billing", &[], 8).is_empty());
        // The names a user picks: each of three takes one or two of four.
        let b = ["b1", "b2", "b3"].map(String::from);
        let plan = assign("billing", &b, 4);
        assert!(plan.values().all(|p| !p.is_empty()), "{plan:?}");
    }
}

//! JetStream streams: the declared shape of the stream the relay publishes to
//! ([`StreamSpec`]), creating or verifying it, and the size arithmetic shared by the start-up
//! checks. Publishes nothing.

use std::time::Duration;

use async_nats::jetstream::{self, stream};

use super::NatsError;

/// The stream events are published to: created by [`StreamSpec::create`] (or
/// `events nats stream create`), verified by [`StreamSpec::check`].
///
/// Streams are explicit: the relay never creates one on its own, so that the subjects,
/// storage and limits are decided by whoever operates the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSpec {
    /// The stream name (`EVENTS`).
    pub name: String,
    /// Subjects it captures (default `events.>`).
    pub subjects: Vec<String>,
    /// How long the server remembers a `Nats-Msg-Id` to drop a re-publish (default 2 min,
    /// NATS's default). It must cover the relay's retry horizon, checked at start-up
    /// ([`NatsRelay::check`](super::NatsRelay::check)).
    pub duplicate_window: Duration,
    /// The largest message the stream accepts, headers included, in bytes; `None`: no limit of
    /// its own (the server's `max_payload` applies).
    pub max_msg_size: Option<u32>,
    /// Copies of the stream on the servers of a cluster (default 1; 3 to survive one
    /// server's loss; at most 5, and at most the cluster's servers). A stream of 3 replicas
    /// takes a publish once 2 of them stored it (the RAFT quorum), elects a new leader within
    /// seconds when its leader dies, and takes nothing while 2 are down (NATS docs,
    /// *JetStream clustering*).
    pub replicas: usize,
    /// Partitions (default 1: no partition token, the subjects as they are). With P > 1 the
    /// stream captures each of [`subjects`](Self::subjects) once per partition, with the
    /// partition's number as a token after its first one (`events.>` → `events.0.>` …
    /// `events.7.>`), and its description records P (`partitions=8`): relays and inboxes
    /// configured for another count refuse to start ([`NatsError::PartitionsMismatch`]).
    /// An aggregate's events all go to one partition ([`partition_of`](super::partition_of)),
    /// so that a group of inbox instances can share the partitions
    /// ([`NatsGroup`](super::NatsGroup)). At most [`MAX_PARTITIONS`](super::MAX_PARTITIONS).
    pub partitions: u32,
}

/// How a stream's description records its partitions: `partitions=P`.
const PARTITIONS_KEY: &str = "partitions=";

impl StreamSpec {
    /// A stream `name` on `events.>`, file storage, a 2-minute duplicate window, no size limit
    /// of its own.
    pub fn new(name: impl Into<String>) -> Self {
        StreamSpec {
            name: name.into(),
            subjects: vec!["events.>".into()],
            duplicate_window: Duration::from_secs(120),
            max_msg_size: None,
            replicas: 1,
            partitions: 1,
        }
    }

    /// With [`partitions`](Self::partitions) set.
    pub fn partitions(mut self, partitions: u32) -> Self {
        self.partitions = partitions;
        self
    }

    /// The subjects the stream captures: [`subjects`](Self::subjects), once per partition
    /// when partitioned.
    pub fn stream_subjects(&self) -> Vec<String> {
        if self.partitions <= 1 {
            return self.subjects.clone();
        }
        (0..self.partitions)
            .flat_map(|p| {
                self.subjects
                    .iter()
                    .map(move |s| super::partition::partitioned_subject(s, p))
            })
            .collect()
    }

    fn description(&self) -> Option<String> {
        (self.partitions > 1).then(|| {
            format!(
                "{PARTITIONS_KEY}{} (event-runtime: a partition token follows each subject's first token)",
                self.partitions
            )
        })
    }

    fn validate(&self) -> Result<(), NatsError> {
        if !(1..=super::MAX_PARTITIONS).contains(&self.partitions) {
            return Err(NatsError::Config(format!(
                "stream `{}`: partitions must be 1 to {}, not {}",
                self.name,
                super::MAX_PARTITIONS,
                self.partitions
            )));
        }
        Ok(())
    }

    /// With these subjects.
    pub fn subjects(mut self, subjects: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.subjects = subjects.into_iter().map(Into::into).collect();
        self
    }

    /// With this duplicate window.
    pub fn duplicate_window(mut self, window: Duration) -> Self {
        self.duplicate_window = window;
        self
    }

    /// With this largest message size, in bytes, headers included.
    pub fn max_msg_size(mut self, bytes: u32) -> Self {
        self.max_msg_size = Some(bytes);
        self
    }

    /// With [`replicas`](Self::replicas) set: copies of the stream in a cluster.
    pub fn replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas;
        self
    }

    fn config(&self) -> stream::Config {
        stream::Config {
            name: self.name.clone(),
            subjects: self.stream_subjects(),
            description: self.description(),
            storage: stream::StorageType::File,
            duplicate_window: self.duplicate_window,
            max_message_size: self
                .max_msg_size
                .map_or(-1, |b| b.min(i32::MAX as u32) as i32),
            num_replicas: self.replicas,
            ..Default::default()
        }
    }

    /// Creates the stream, or checks it when it exists ([`check`](Self::check)'s rules).
    ///
    /// # Errors
    /// [`NatsError::Broker`] when the server refuses or cannot be reached;
    /// [`NatsError::Config`] when [`replicas`](Self::replicas) is not 1 to 5, or more than
    /// the cluster has servers (or more than 1 on a server outside a cluster);
    /// [`NatsError::Config`] when [`partitions`](Self::partitions) is not 1 to
    /// [`MAX_PARTITIONS`](super::MAX_PARTITIONS);
    /// [`NatsError::StreamMismatch`] when a stream of that name exists with another shape,
    /// [`NatsError::PartitionsMismatch`] with another count of partitions (change it with
    /// [`repartition`](Self::repartition)).
    ///
    /// # Cancel safety
    /// Cancel safe: dropped, the stream was created or it was not; calling again finishes.
    pub async fn create(&self, js: &jetstream::Context) -> Result<StreamShape, NatsError> {
        self.validate()?;
        match StreamShape::fetch(js, &self.name).await {
            Ok(shape) => {
                self.compare(&shape)?;
                Ok(shape)
            }
            Err(NatsError::NoStream(_)) => {
                if !(1..=5).contains(&self.replicas) {
                    return Err(NatsError::Config(format!(
                        "stream `{}`: replicas must be 1 to 5 (NATS's limit), not {}",
                        self.name, self.replicas
                    )));
                }
                let info = js.create_stream(self.config()).await.map_err(|e| {
                    let code = match e.kind() {
                        jetstream::context::CreateStreamErrorKind::JetStream(j) => {
                            Some(j.error_code())
                        }
                        _ => None,
                    };
                    match code {
                        Some(jetstream::ErrorCode::CLUSTER_NO_PEERS) => NatsError::Config(format!(
                            "stream `{}` wants {} replicas, and the cluster has fewer servers with JetStream to hold them (each replica needs a server of its own): lower the replicas, or start more servers ({e})",
                            self.name, self.replicas
                        )),
                        Some(jetstream::ErrorCode::STREAM_REPLICAS_NOT_SUPPORTED) => NatsError::Config(format!(
                            "stream `{}` wants {} replicas, and the server is not part of a cluster: use 1 replica, or run a cluster ({e})",
                            self.name, self.replicas
                        )),
                        _ => NatsError::broker("create stream")(e),
                    }
                })?;
                Ok(StreamShape::from_info(info.cached_info()))
            }
            Err(e) => Err(e),
        }
    }

    /// Verifies that the stream exists with these subjects (a superset is fine), file storage,
    /// this duplicate window or a longer one, this `max_msg_size` or a larger one, and this
    /// many replicas or more.
    ///
    /// # Errors
    /// [`NatsError::NoStream`], [`NatsError::StreamMismatch`],
    /// [`NatsError::PartitionsMismatch`], [`NatsError::Broker`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn check(&self, js: &jetstream::Context) -> Result<StreamShape, NatsError> {
        let shape = StreamShape::fetch(js, &self.name).await?;
        self.compare(&shape)?;
        Ok(shape)
    }

    /// Changes the partitions of the existing stream to [`partitions`](Self::partitions), in
    /// place, for the procedure in the [module docs](super#changing-the-partitions): its
    /// description records the new count, and it captures the new count's subjects besides
    /// those it had (those a subject it has covers already are not added), so that producers
    /// still on the old count keep publishing and nothing they publish is refused. With
    /// `prune`, it captures only the new count's subjects: run it once every producer runs
    /// with the new count. Messages already stored stay where they are, under their subjects.
    ///
    /// # Errors
    /// [`NatsError::Config`] for a count out of range, [`subjects`](Self::subjects) that
    /// are not the stream's own (partition tokens aside), or a count below the stream's
    /// while a consumer of a partition that goes away still holds messages; [`NatsError::NoStream`];
    /// [`NatsError::Broker`] when the server refuses or cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: one update, made or not.
    pub async fn repartition(
        &self,
        js: &jetstream::Context,
        prune: bool,
    ) -> Result<StreamShape, NatsError> {
        self.validate()?;
        StreamShape::fetch(js, &self.name).await?;
        let mut stream = js
            .get_stream(&self.name)
            .await
            .map_err(NatsError::broker("get stream"))?;
        let mut config = stream
            .info()
            .await
            .map_err(NatsError::broker("stream info"))?
            .config
            .clone();
        // The spec must name what the stream carries: another subject would capture another
        // application's events (or, pruned, drop this one's).
        let carried = super::partition::base_subjects(&config.subjects);
        if let Some(other) = self.subjects.iter().find(|s| !carried.contains(s)) {
            return Err(NatsError::Config(format!(
                "stream `{}` carries {} (partition tokens aside), not `{other}`: repartition it with its own subjects",
                self.name,
                carried.join(", ")
            )));
        }
        let had = StreamShape::from(&config).partitions;
        if self.partitions < had {
            self.refuse_stranded(&mut stream).await?;
        }
        let wanted = self.stream_subjects();
        if prune {
            config.subjects = wanted;
        } else {
            for s in wanted {
                if !config.subjects.iter().any(|f| subject_matches(f, &s)) {
                    config.subjects.push(s);
                }
            }
        }
        config.description = self.description();
        let info = js
            .update_stream(config)
            .await
            .map_err(NatsError::broker("update stream"))?;
        Ok(StreamShape::from_info(&info))
    }

    /// Fails when a consumer of a partition from [`partitions`](Self::partitions) up still
    /// holds messages: going down would strand them.
    async fn refuse_stranded(
        &self,
        stream: &mut jetstream::stream::Stream,
    ) -> Result<(), NatsError> {
        use futures_util::StreamExt;
        let mut consumers = stream.consumers();
        let mut stranded = Vec::new();
        while let Some(info) = consumers.next().await {
            let info = info.map_err(NatsError::broker("list consumers"))?;
            let partition = super::partition::partition_token(&info.config.filter_subject);
            let held = info.num_pending + info.num_ack_pending as u64;
            if partition.is_some_and(|p| p >= self.partitions) && held > 0 {
                stranded.push(format!("{} ({held})", info.name));
            }
        }
        if stranded.is_empty() {
            return Ok(());
        }
        Err(NatsError::Config(format!(
            "stream `{}`: consumers of partitions from {} up still hold messages: {}; pause the producers' relays and let them drain before going down to {} partitions",
            self.name,
            self.partitions,
            stranded.join(", "),
            self.partitions
        )))
    }

    fn compare(&self, shape: &StreamShape) -> Result<(), NatsError> {
        let mismatch = |field: &'static str, expected: String, found: String| {
            Err(NatsError::StreamMismatch {
                stream: self.name.clone(),
                field,
                expected,
                found,
            })
        };
        if shape.partitions != self.partitions {
            return Err(NatsError::PartitionsMismatch {
                stream: self.name.clone(),
                what: "the stream's declaration".into(),
                configured: self.partitions,
                found: shape.partitions,
            });
        }
        let subjects = self.stream_subjects();
        if let Some(missing) = subjects
            .iter()
            .find(|s| !shape.subjects.iter().any(|f| subject_matches(f, s)))
        {
            return mismatch("subjects", missing.clone(), shape.subjects.join(", "));
        }
        if !shape.file_storage {
            return mismatch("storage", "file".into(), "memory".into());
        }
        if shape.duplicate_window < self.duplicate_window {
            return mismatch(
                "duplicate_window",
                format!("{:?} or longer", self.duplicate_window),
                format!("{:?}", shape.duplicate_window),
            );
        }
        if shape.replicas < self.replicas {
            return mismatch(
                "replicas",
                format!("{} or more", self.replicas),
                shape.replicas.to_string(),
            );
        }
        if let Some(want) = self.max_msg_size {
            if shape.max_msg_size.is_some_and(|have| have < want) {
                return mismatch(
                    "max_msg_size",
                    format!("{want} bytes or more"),
                    format!("{:?}", shape.max_msg_size),
                );
            }
        }
        Ok(())
    }
}

/// What a stream on the server is, as far as the relay cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamShape {
    /// The stream name.
    pub name: String,
    /// Its subjects.
    pub subjects: Vec<String>,
    /// File (true) or memory storage.
    pub file_storage: bool,
    /// Its duplicate window.
    pub duplicate_window: Duration,
    /// Its largest message in bytes, headers included (`None`: unlimited).
    pub max_msg_size: Option<u32>,
    /// Its replicas (1 on a single server).
    pub replicas: usize,
    /// Its partitions, as its description records them (`partitions=P`; 1 when it records
    /// none: a stream made before partitions, or by another tool).
    pub partitions: u32,
    /// The server leading it when it was read (a clustered stream's; `None` on a single server,
    /// or while it elects one).
    pub leader: Option<String>,
}

/// A stream's shape from its configuration alone: [`leader`](StreamShape::leader) is `None`
/// (only the stream's info names it: [`StreamShape::fetch`]).
impl From<&stream::Config> for StreamShape {
    fn from(c: &stream::Config) -> Self {
        StreamShape {
            name: c.name.clone(),
            subjects: c.subjects.clone(),
            file_storage: c.storage == stream::StorageType::File,
            duplicate_window: c.duplicate_window,
            max_msg_size: u32::try_from(c.max_message_size).ok().filter(|&n| n > 0),
            replicas: c.num_replicas.max(1),
            partitions: c
                .description
                .as_deref()
                .and_then(|d| {
                    d.split_whitespace()
                        .find_map(|w| w.strip_prefix(PARTITIONS_KEY)?.parse().ok())
                })
                .unwrap_or(1),
            leader: None,
        }
    }
}

impl StreamShape {
    fn from_info(info: &stream::Info) -> Self {
        StreamShape {
            leader: info.cluster.as_ref().and_then(|c| c.leader.clone()),
            ..StreamShape::from(&info.config)
        }
    }

    /// Its [`subjects`](Self::subjects) without their partition token, each once
    /// (`events.0.>`, `events.1.>` → `events.>`): what a [`StreamSpec`] of it names.
    pub fn base_subjects(&self) -> Vec<String> {
        super::partition::base_subjects(&self.subjects)
    }

    /// Reads the stream `name` from the server.
    ///
    /// # Errors
    /// [`NatsError::NoStream`] when there is none; [`NatsError::Broker`] otherwise.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn fetch(js: &jetstream::Context, name: &str) -> Result<StreamShape, NatsError> {
        let mut s = js.get_stream(name).await.map_err(|e| match e.kind() {
            jetstream::context::GetStreamErrorKind::JetStream(j)
                if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND =>
            {
                NatsError::NoStream(name.to_owned())
            }
            jetstream::context::GetStreamErrorKind::Request => NatsError::Broker(
                "get stream",
                format!("stream `{name}` did not answer ({e}): it has no leader (a cluster electing one, or without its quorum), or the server is unreachable").into(),
            ),
            _ => NatsError::broker("get stream")(e),
        })?;
        let info = s.info().await.map_err(NatsError::broker("stream info"))?;
        Ok(StreamShape::from_info(info))
    }
}

/// Whether the subject filter `filter` (`*` one token, `>` the rest) matches `subject`.
pub(crate) fn subject_matches(filter: &str, subject: &str) -> bool {
    let mut f = filter.split('.');
    let mut s = subject.split('.');
    loop {
        match (f.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::subject_matches;

    #[test]
    fn subject_filters() {
        assert!(subject_matches("events.>", "events.order.placed"));
        assert!(subject_matches("events.*.placed", "events.order.placed"));
        assert!(!subject_matches("events.*", "events.order.placed"));
        assert!(!subject_matches("events.>", "events"));
        assert!(subject_matches("a.b", "a.b"));
    }
}

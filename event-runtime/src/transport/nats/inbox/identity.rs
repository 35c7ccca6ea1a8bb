//! The identity of what an inbox consumes, as the server has it: the stream's and the durable
//! consumer's creation times, read and compared with what the store recorded. Decides nothing
//! about messages.

use async_nats::jetstream;

use super::super::NatsError;

/// The broker's creation time as stored: RFC 3339 with nanoseconds, UTC.
pub(crate) fn created(t: time::OffsetDateTime) -> String {
    let nanos = i64::try_from(t.unix_timestamp_nanos()).unwrap_or(i64::MAX);
    chrono::DateTime::from_timestamp_nanos(nanos)
        .to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

/// Whether two creation times as stored are the same object's: within a second. nats-server
/// 2.9 reports a consumer's creation time a fraction of a millisecond later after its first
/// restart on the same storage; a stream or consumer deleted and created again is created
/// seconds to days later (its creator has to notice first).
pub(crate) fn same_time(a: &str, b: &str) -> bool {
    match (
        chrono::DateTime::parse_from_rfc3339(a),
        chrono::DateTime::parse_from_rfc3339(b),
    ) {
        (Ok(a), Ok(b)) => (a - b).num_milliseconds().abs() < 1_000,
        _ => a == b,
    }
}

/// The stream and the durable consumer as the server has them now.
pub(crate) struct Observed {
    pub(crate) stream_created: String,
    pub(crate) first_sequence: u64,
    /// The stream's partitions, as its description records them.
    pub(crate) partitions: u32,
    /// The consumer's creation time and the stream sequence below which it acked every
    /// message; `None` when there is no such consumer.
    pub(crate) consumer: Option<(String, u64)>,
}

/// Reads the stream `stream` and its durable consumer `durable` from the server: the stream
/// first, then the consumer, so that a consumer acking meanwhile never looks like a loss.
///
/// # Errors
/// [`NatsError::NoStream`] when the server says there is no such stream; [`NatsError::Broker`]
/// when it cannot be asked.
pub(crate) async fn observe(
    js: &jetstream::Context,
    stream: &str,
    durable: &str,
) -> Result<Observed, NatsError> {
    let s = js.get_stream(stream).await.map_err(|e| match e.kind() {
        jetstream::context::GetStreamErrorKind::JetStream(j)
            if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND =>
        {
            NatsError::NoStream(stream.to_owned())
        }
        _ => NatsError::broker("get stream")(e),
    })?;
    let info = s.cached_info();
    let (stream_created, first_sequence) = (created(info.created), info.state.first_sequence);
    let partitions = super::super::StreamShape::from(&info.config).partitions;
    let consumer = match s.consumer_info(durable).await {
        Ok(c) => Some((created(c.created), c.ack_floor.stream_sequence)),
        Err(e) => match e.kind() {
            jetstream::context::ConsumerInfoErrorKind::NotFound => None,
            jetstream::context::ConsumerInfoErrorKind::JetStream(j)
                if j.error_code() == jetstream::ErrorCode::CONSUMER_NOT_FOUND =>
            {
                None
            }
            jetstream::context::ConsumerInfoErrorKind::StreamNotFound => {
                return Err(NatsError::NoStream(stream.to_owned()))
            }
            _ => return Err(NatsError::broker("consumer info")(e)),
        },
    };
    Ok(Observed {
        stream_created,
        first_sequence,
        partitions,
        consumer,
    })
}

/// The first sequence the stream `stream` still holds (what its limits or a purge removed is
/// below it).
///
/// # Errors
/// [`NatsError::Broker`] when it cannot be asked.
pub(super) async fn first_sequence(
    js: &jetstream::Context,
    stream: &str,
) -> Result<u64, NatsError> {
    let s = js
        .get_stream(stream)
        .await
        .map_err(NatsError::broker("get stream"))?;
    Ok(s.cached_info().state.first_sequence)
}

pub(super) fn describe_observed(stream: &str, durable: &str, o: &Observed) -> String {
    match &o.consumer {
        Some((at, _)) => format!(
            "stream `{stream}` created {}, consumer created {at}",
            o.stream_created
        ),
        None => format!(
            "stream `{stream}` created {}, no consumer `{durable}`",
            o.stream_created
        ),
    }
}

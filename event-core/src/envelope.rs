//! Envelopes: an event plus the metadata that travels with it, typed ([`Envelope<E>`]) and raw
//! ([`RawEnvelope`]), and their CloudEvents 1.0 structured JSON form. No I/O here.

use std::any::{Any, TypeId};
use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::error::{DecodeError, HeaderError};
use crate::event::DomainEvent;

/// The CloudEvents `source` used when none is set: a URI-reference naming this framework.
pub const DEFAULT_SOURCE: &str = "urn:event-core";

/// The CloudEvents extension attribute a relay adds to the bytes it publishes: the `sequence`
/// of the previous event of the same aggregate that this relay published (`0`: none known).
/// A consuming inbox releases an event to its handlers only once that predecessor was
/// released, so that a broker's redelivery order never reorders an aggregate's events. It is
/// never part of a stored envelope of the producer, and a header may not use the name. The
/// value is a string of digits or a JSON number.
pub const PREVIOUS_SEQUENCE_ATTRIBUTE: &str = "prevsequence";

/// Attribute names the envelope writes itself; a header may not use them.
const RESERVED: &[&str] = &[
    "specversion",
    "id",
    "source",
    "type",
    "subject",
    "time",
    "datacontenttype",
    "dataschema",
    "data",
    "data_base64",
    "schemaversion",
    "aggregatetype",
    "sequence",
    "correlationid",
    "causationid",
    TRACE_PARENT_ATTRIBUTE,
    TRACE_STATE_ATTRIBUTE,
    PREVIOUS_SEQUENCE_ATTRIBUTE,
];

/// The CloudEvents distributed tracing extension's attribute (CloudEvents 1.0,
/// `extensions/distributed-tracing.md`) carrying the W3C Trace Context `traceparent` of the
/// event's creation: [`Metadata::trace_parent`]. A header may not use the name.
pub const TRACE_PARENT_ATTRIBUTE: &str = "traceparent";

/// The distributed tracing extension's `tracestate` (W3C Trace Context, vendor-specific
/// trace data): [`Metadata::trace_state`]. A header may not use the name.
pub const TRACE_STATE_ATTRIBUTE: &str = "tracestate";

/// Application headers of an envelope, carried as CloudEvents extension attributes.
///
/// Names follow the CloudEvents 1.0 attribute naming rule (§ "Attribute Naming Convention"):
/// lower-case ASCII letters and digits only, at most 20 characters, and not one of the
/// attributes the envelope writes itself. Values are strings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Headers(BTreeMap<String, String>);

impl Headers {
    /// An empty set of headers.
    pub fn new() -> Self {
        Headers::default()
    }

    /// Sets `name` to `value`, replacing an earlier value.
    ///
    /// # Errors
    /// [`HeaderError`] when `name` is empty, longer than 20 characters, holds anything but
    /// `a-z` and `0-9`, or is a reserved attribute (`id`, `type`, `sequence`, …).
    pub fn insert(
        &mut self,
        name: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<(), HeaderError> {
        let name = name.into();
        validate_header_name(&name)?;
        self.0.insert(name, value.into());
        Ok(())
    }

    /// The value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// All headers, ordered by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Number of headers.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// `true` when there are no headers.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn validate_header_name(name: &str) -> Result<(), HeaderError> {
    if name.is_empty()
        || name.len() > 20
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return Err(HeaderError::InvalidName(name.to_owned()));
    }
    if RESERVED.contains(&name) {
        return Err(HeaderError::Reserved(name.to_owned()));
    }
    Ok(())
}

/// Metadata that travels with every event, typed or raw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metadata {
    /// Unique id of this event (UUIDv7 when created here). CloudEvents `id`.
    pub id: Uuid,
    /// When the event happened, UTC. CloudEvents `time` (RFC 3339).
    pub occurred_at: DateTime<Utc>,
    /// Which system produced the event. CloudEvents `source`, a URI-reference.
    pub source: String,
    /// The aggregate type (`order`). Extension attribute `aggregatetype`.
    pub aggregate_type: String,
    /// The aggregate instance id. CloudEvents `subject`.
    pub aggregate_id: String,
    /// Position of this event in its aggregate's stream, starting at 1 (0 when unsequenced).
    /// Extension attribute `sequence` (the CloudEvents sequence extension).
    pub sequence: u64,
    /// Id shared by every event of one business flow. Extension attribute `correlationid`.
    pub correlation_id: Option<Uuid>,
    /// Id of the event (or command) that caused this one. Extension attribute `causationid`.
    pub causation_id: Option<Uuid>,
    /// Application headers, as extension attributes.
    pub headers: Headers,
    /// The W3C Trace Context `traceparent` of the event's creation
    /// (`00-<trace id>-<span id>-<flags>`), extension attribute `traceparent` of the
    /// CloudEvents distributed tracing extension. `event-runtime` (feature `otel`) sets it when
    /// a unit of work commits inside a traced span and it is `None`; a received envelope keeps
    /// its producer's value. Carried as it is: it is not validated here (a received attribute
    /// that is not a string is dropped, not an error). `event-runtime` ignores a value that is
    /// not a valid W3C `traceparent` when it reads one, and replaces it at commit, with a
    /// warning.
    pub trace_parent: Option<String>,
    /// The W3C Trace Context `tracestate` that goes with [`trace_parent`](Self::trace_parent),
    /// extension attribute `tracestate`.
    pub trace_state: Option<String>,
}

impl Metadata {
    fn new(aggregate_type: &str, aggregate_id: String) -> Self {
        Metadata {
            id: Uuid::now_v7(),
            occurred_at: Utc::now(),
            source: DEFAULT_SOURCE.to_owned(),
            aggregate_type: aggregate_type.to_owned(),
            aggregate_id,
            sequence: 0,
            correlation_id: None,
            causation_id: None,
            headers: Headers::new(),
            trace_parent: None,
            trace_state: None,
        }
    }
}

/// A typed event with its [`Metadata`].
///
/// Serialises as a CloudEvents 1.0 structured JSON event (see [`RawEnvelope`] for the exact
/// attributes) and deserialises from one whose `type` and `schemaversion` are `E`'s.
///
/// ```
/// # use event_core::{DomainEvent, Envelope};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Serialize, Deserialize, DomainEvent, Debug, PartialEq)]
/// # #[event(name = "order.placed", version = 1)]
/// # struct OrderPlaced { #[event(aggregate_id)] order_id: String }
/// let env = Envelope::new(OrderPlaced { order_id: "A-1".into() }).with_sequence(1);
/// let json = serde_json::to_string(&env).unwrap();
/// assert!(json.contains(r#""type":"order.placed""#));
/// assert!(json.contains(r#""subject":"A-1""#));
/// let back: Envelope<OrderPlaced> = serde_json::from_str(&json).unwrap();
/// assert_eq!(back, env);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope<E> {
    meta: Metadata,
    event: E,
}

impl<E: DomainEvent> Envelope<E> {
    /// Wraps `event` with a fresh UUIDv7 id, the current time, the event's aggregate type and
    /// id, sequence 0, no correlation or causation, and [`DEFAULT_SOURCE`].
    pub fn new(event: E) -> Self {
        let meta = Metadata::new(E::AGGREGATE_TYPE, event.aggregate_id().to_string());
        Envelope { meta, event }
    }

    /// Wraps `event` with metadata read elsewhere (a store, a broker). The aggregate id is
    /// taken from `meta` as given.
    pub fn from_parts(meta: Metadata, event: E) -> Self {
        Envelope { meta, event }
    }

    /// Decodes a raw envelope of `E`'s name and version, following the
    /// [decoding policy](crate#decoding-policy): unknown payload fields are ignored unless `E`
    /// is declared with `#[event(deny_unknown_fields)]`; missing fields take their
    /// `#[serde(default)]` or fail.
    ///
    /// # Errors
    /// [`DecodeError::TypeMismatch`] when the raw name or version is not `E`'s;
    /// [`DecodeError::Payload`] when `data` does not deserialise into `E` — a missing required
    /// field, a wrong type (the message names the field and position serde reports);
    /// [`DecodeError::UnknownField`] when `E` denies unknown fields and `data` has one.
    pub fn decode(raw: &RawEnvelope) -> Result<Self, DecodeError> {
        if raw.name != E::NAME || raw.version != E::VERSION {
            return Err(DecodeError::TypeMismatch {
                expected_name: E::NAME,
                expected_version: E::VERSION,
                name: raw.name.clone(),
                version: raw.version,
            });
        }
        Ok(Envelope {
            meta: raw.meta.clone(),
            event: decode_payload::<E>(raw)?,
        })
    }

    /// Encodes into a [`RawEnvelope`] (payload serialised to JSON).
    ///
    /// # Errors
    /// The payload's `Serialize` impl failed (for example a map with non-string keys).
    pub fn to_raw(&self) -> Result<RawEnvelope, serde_json::Error> {
        Ok(RawEnvelope {
            meta: self.meta.clone(),
            name: E::NAME.to_owned(),
            version: E::VERSION,
            data: serde_json::value::to_raw_value(&self.event)?,
        })
    }
}

impl<E> Envelope<E> {
    /// The same metadata around `f` of the event, which `f` clones: how an event union's
    /// handler gets `&Envelope<Union>` for an envelope of one of its variants.
    pub(crate) fn map_cloned<U>(&self, f: impl FnOnce(&E) -> U) -> Envelope<U> {
        Envelope {
            meta: self.meta.clone(),
            event: f(&self.event),
        }
    }

    /// The event.
    pub fn event(&self) -> &E {
        &self.event
    }

    /// Unwraps the event, dropping the metadata.
    pub fn into_event(self) -> E {
        self.event
    }

    /// The metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.meta
    }

    /// The event id (also the CloudEvents `id`).
    pub fn id(&self) -> Uuid {
        self.meta.id
    }

    /// The aggregate instance id.
    pub fn aggregate_id(&self) -> &str {
        &self.meta.aggregate_id
    }

    /// The per-aggregate sequence number.
    pub fn sequence(&self) -> u64 {
        self.meta.sequence
    }

    /// When the event happened.
    pub fn occurred_at(&self) -> DateTime<Utc> {
        self.meta.occurred_at
    }

    /// The correlation id, if any.
    pub fn correlation_id(&self) -> Option<Uuid> {
        self.meta.correlation_id
    }

    /// The causation id, if any.
    pub fn causation_id(&self) -> Option<Uuid> {
        self.meta.causation_id
    }

    /// The headers.
    pub fn headers(&self) -> &Headers {
        &self.meta.headers
    }

    /// Sets the per-aggregate sequence number.
    pub fn with_sequence(mut self, sequence: u64) -> Self {
        self.meta.sequence = sequence;
        self
    }

    /// Sets the event id (for a deterministic id derived from the command, for example).
    pub fn with_id(mut self, id: Uuid) -> Self {
        self.meta.id = id;
        self
    }

    /// Sets when the event happened.
    pub fn with_occurred_at(mut self, at: DateTime<Utc>) -> Self {
        self.meta.occurred_at = at;
        self
    }

    /// Sets the CloudEvents `source`.
    pub fn with_source(mut self, source: impl Into<String>) -> Self {
        self.meta.source = source.into();
        self
    }

    /// Sets the correlation id.
    pub fn with_correlation_id(mut self, id: Uuid) -> Self {
        self.meta.correlation_id = Some(id);
        self
    }

    /// Sets the causation id.
    pub fn with_causation_id(mut self, id: Uuid) -> Self {
        self.meta.causation_id = Some(id);
        self
    }

    /// Sets the W3C Trace Context of the event's creation (CloudEvents distributed tracing
    /// extension: `traceparent`, and `tracestate` when `Some`), for an application that
    /// propagates a context itself: `00-<32 lower-case hex trace id>-<16 lower-case hex parent
    /// id>-<2 hex flags>`, ids not all zero (W3C Trace Context § 3.2). `event-runtime` keeps a
    /// valid context set here; one that is not valid it replaces at commit with its own (feature
    /// `otel`, inside a traced span), logging a warning.
    pub fn with_trace_context(
        mut self,
        traceparent: impl Into<String>,
        tracestate: Option<String>,
    ) -> Self {
        self.meta.trace_parent = Some(traceparent.into());
        self.meta.trace_state = tracestate;
        self
    }

    /// Marks this event as caused by `cause`: causation id = `cause`'s id, correlation id =
    /// `cause`'s correlation id, or its id when it has none.
    pub fn caused_by(mut self, cause: &Metadata) -> Self {
        self.meta.causation_id = Some(cause.id);
        self.meta.correlation_id = Some(cause.correlation_id.unwrap_or(cause.id));
        self
    }

    /// Sets a header.
    ///
    /// # Errors
    /// See [`Headers::insert`].
    pub fn with_header(
        mut self,
        name: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<Self, HeaderError> {
        self.meta.headers.insert(name, value)?;
        Ok(self)
    }

    /// Mutable access to the metadata.
    pub fn metadata_mut(&mut self) -> &mut Metadata {
        &mut self.meta
    }
}

fn decode_payload<E: DomainEvent>(raw: &RawEnvelope) -> Result<E, DecodeError> {
    let payload = |source: serde_json::Error| DecodeError::Payload {
        name: raw.name.clone(),
        version: raw.version,
        event_id: raw.meta.id,
        source: source.into(),
    };
    if !E::DENY_UNKNOWN_FIELDS {
        return serde_json::from_str::<E>(raw.data.get()).map_err(payload);
    }
    // serde's own `deny_unknown_fields` is per struct: every nested struct would need it too.
    // Watching what the deserialisation of the whole payload ignores covers every level, and
    // names the field by its path. (Keys left over by `#[serde(flatten)]` are dropped by
    // serde without being ignored through the deserialiser: neither way sees them.)
    let mut unknown: Option<String> = None;
    let mut de = serde_json::Deserializer::from_str(raw.data.get());
    let event: E = serde_ignored::deserialize(&mut de, |path| {
        unknown.get_or_insert_with(|| path.to_string());
    })
    .map_err(payload)?;
    de.end().map_err(payload)?;
    match unknown {
        None => Ok(event),
        Some(field) => Err(DecodeError::UnknownField {
            name: raw.name.clone(),
            version: raw.version,
            event_id: raw.meta.id,
            type_name: std::any::type_name::<E>(),
            field,
        }),
    }
}

/// An envelope whose payload has not been decoded: what stores, brokers and the dead letter
/// queue hold. `data` keeps the payload's JSON text byte for byte.
///
/// # Wire format
/// A CloudEvents 1.0 structured-mode JSON event (CloudEvents spec §3 and the JSON event
/// format spec):
///
/// | attribute | from |
/// |---|---|
/// | `specversion` | always `"1.0"` |
/// | `id` | [`Metadata::id`] |
/// | `source` | [`Metadata::source`] |
/// | `type` | the event name |
/// | `subject` | [`Metadata::aggregate_id`] |
/// | `time` | [`Metadata::occurred_at`], RFC 3339 UTC |
/// | `datacontenttype` | always `"application/json"` |
/// | `schemaversion` | the event version (Integer) |
/// | `aggregatetype` | [`Metadata::aggregate_type`] |
/// | `sequence` | [`Metadata::sequence`], as a zero-padded 20-digit String so that it is lexicographically orderable, as the CloudEvents sequence extension requires |
/// | `correlationid`, `causationid` | when set |
/// | `traceparent`, `tracestate` | [`Metadata::trace_parent`], [`Metadata::trace_state`], when set (CloudEvents distributed tracing extension) |
/// | any other | [`Metadata::headers`] |
/// | `data` | the payload |
///
/// # Numbers
/// Payload integers are written as exact JSON integers, whatever their size: `u64::MAX` is
/// `18446744073709551615`, `i64::MIN` is `-9223372036854775808`, and `u128`/`i128` values are
/// written in full too. serde_json reads them back exactly, and the stores keep the envelope as
/// text, byte for byte. The `sequence` attribute is a string; the aggregate id (`subject`) is a
/// string.
///
/// A JavaScript consumer must not read such a payload with plain `JSON.parse`: it turns every
/// number into an IEEE 754 double, which is exact only up to 2^53 − 1
/// (`Number.MAX_SAFE_INTEGER`, 9007199254740991), so `9007199254740993` silently becomes
/// `9007199254740992`. Read it with a BigInt-aware parser (the `json-bigint` npm package with
/// `useNativeBigInt: true`, or `lossless-json`), or with a `JSON.parse` reviver that uses the
/// TC39 "JSON.parse source text access" proposal (`(key, value, { source }) =>
/// BigInt(source)` for integer fields, where the runtime supports it). Alternatively, have the
/// producer write such fields as strings, with serde's `#[serde(with = …)]` or
/// `serde_with::DisplayFromStr`, which every consumer reads exactly — a change of the field's
/// type, so a new event version.
///
/// Its `Debug` prints the payload's size, never its text (payloads stay out of logs).
#[derive(Clone)]
pub struct RawEnvelope {
    /// The metadata.
    pub meta: Metadata,
    /// The event name (`type`).
    pub name: String,
    /// The schema version (`schemaversion`).
    pub version: u32,
    /// The payload as JSON text.
    pub data: Box<RawValue>,
}

impl fmt::Debug for RawEnvelope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawEnvelope")
            .field("meta", &self.meta)
            .field("name", &self.name)
            .field("version", &self.version)
            .field(
                "data",
                &format_args!("({} bytes of JSON)", self.data.get().len()),
            )
            .finish()
    }
}

impl PartialEq for RawEnvelope {
    fn eq(&self, other: &Self) -> bool {
        self.meta == other.meta
            && self.name == other.name
            && self.version == other.version
            && self.data.get() == other.data.get()
    }
}

impl RawEnvelope {
    /// Parses a CloudEvents structured JSON event.
    ///
    /// # Errors
    /// [`DecodeError::Envelope`] when the text is not JSON, a required attribute (`id`,
    /// `source`, `type`, `specversion`, `subject`, `time`, `schemaversion`, `data`) is missing
    /// or malformed, or `specversion` is not `"1.0"`. The message carries serde's line and
    /// column.
    pub fn from_json(json: &str) -> Result<Self, DecodeError> {
        serde_json::from_str(json).map_err(|e| DecodeError::Envelope(crate::JsonError::verbatim(e)))
    }

    /// Parses a CloudEvents structured JSON event from bytes. Errors as [`Self::from_json`],
    /// plus invalid UTF-8.
    pub fn from_slice(json: &[u8]) -> Result<Self, DecodeError> {
        serde_json::from_slice(json)
            .map_err(|e| DecodeError::Envelope(crate::JsonError::verbatim(e)))
    }

    /// The CloudEvents structured JSON text.
    pub fn to_json(&self) -> String {
        // Serialising a RawEnvelope cannot fail: every field is a string, integer or raw JSON.
        serde_json::to_string(self).unwrap_or_default()
    }
}

struct CloudEvent<'a, D: ?Sized> {
    meta: &'a Metadata,
    name: &'a str,
    version: u32,
    data: &'a D,
}

impl<D: Serialize + ?Sized> Serialize for CloudEvent<'_, D> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let m = self.meta;
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("specversion", "1.0")?;
        map.serialize_entry("id", &m.id)?;
        map.serialize_entry("source", &m.source)?;
        map.serialize_entry("type", self.name)?;
        map.serialize_entry("subject", &m.aggregate_id)?;
        map.serialize_entry(
            "time",
            &m.occurred_at.to_rfc3339_opts(SecondsFormat::AutoSi, true),
        )?;
        map.serialize_entry("datacontenttype", "application/json")?;
        map.serialize_entry("schemaversion", &self.version)?;
        map.serialize_entry("aggregatetype", &m.aggregate_type)?;
        map.serialize_entry("sequence", &format_args!("{:020}", m.sequence).to_string())?;
        if let Some(c) = &m.correlation_id {
            map.serialize_entry("correlationid", c)?;
        }
        if let Some(c) = &m.causation_id {
            map.serialize_entry("causationid", c)?;
        }
        if let Some(t) = &m.trace_parent {
            map.serialize_entry(TRACE_PARENT_ATTRIBUTE, t)?;
        }
        if let Some(t) = &m.trace_state {
            map.serialize_entry(TRACE_STATE_ATTRIBUTE, t)?;
        }
        for (k, v) in m.headers.iter() {
            map.serialize_entry(k, v)?;
        }
        map.serialize_entry("data", self.data)?;
        map.end()
    }
}

impl Serialize for RawEnvelope {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        CloudEvent {
            meta: &self.meta,
            name: &self.name,
            version: self.version,
            data: &*self.data,
        }
        .serialize(s)
    }
}

impl<E: DomainEvent> Serialize for Envelope<E> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        CloudEvent {
            meta: &self.meta,
            name: E::NAME,
            version: E::VERSION,
            data: &self.event,
        }
        .serialize(s)
    }
}

impl<'de, E: DomainEvent> Deserialize<'de> for Envelope<E> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = RawEnvelope::deserialize(d)?;
        // serde's error is text only: the decode error with its causes, each once.
        Envelope::decode(&raw).map_err(|e| de::Error::custom(crate::ErrorChain(&e)))
    }
}

impl<'de> Deserialize<'de> for RawEnvelope {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(RawVisitor)
    }
}

struct RawVisitor;

fn parse_sequence<E: de::Error>(v: &serde_json::Value) -> Result<u64, E> {
    match v {
        serde_json::Value::String(s) => s
            .parse::<u64>()
            .map_err(|_| E::custom(format!("`sequence` is not an unsigned integer: {s:?}"))),
        serde_json::Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| E::custom(format!("`sequence` is not an unsigned integer: {n}"))),
        other => Err(E::custom(format!(
            "`sequence` must be a string of digits, found {other}"
        ))),
    }
}

fn string_or_none(value: serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::String(s) => Some(s),
        _ => None,
    }
}

impl<'de> Visitor<'de> for RawVisitor {
    type Value = RawEnvelope;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a CloudEvents 1.0 structured JSON event")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawEnvelope, A::Error> {
        let mut specversion: Option<String> = None;
        let mut id: Option<Uuid> = None;
        let mut source: Option<String> = None;
        let mut name: Option<String> = None;
        let mut subject: Option<String> = None;
        let mut time: Option<DateTime<Utc>> = None;
        let mut version: Option<u32> = None;
        let mut aggregate_type: Option<String> = None;
        let mut sequence: Option<u64> = None;
        let mut correlation_id: Option<Uuid> = None;
        let mut causation_id: Option<Uuid> = None;
        let mut trace_parent: Option<String> = None;
        let mut trace_state: Option<String> = None;
        let mut data: Option<Box<RawValue>> = None;
        let mut headers = Headers::new();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "specversion" => specversion = Some(map.next_value()?),
                "id" => id = Some(map.next_value()?),
                "source" => source = Some(map.next_value()?),
                "type" => name = Some(map.next_value()?),
                "subject" => subject = Some(map.next_value()?),
                "time" => time = Some(map.next_value()?),
                "schemaversion" => version = Some(map.next_value()?),
                "aggregatetype" => aggregate_type = Some(map.next_value()?),
                "sequence" => sequence = Some(parse_sequence(&map.next_value()?)?),
                "correlationid" => correlation_id = map.next_value()?,
                "causationid" => causation_id = map.next_value()?,
                // A context is carried, never required: a value that is not a string (a
                // producer's bug) is dropped rather than refusing the event.
                TRACE_PARENT_ATTRIBUTE => trace_parent = string_or_none(map.next_value()?),
                TRACE_STATE_ATTRIBUTE => trace_state = string_or_none(map.next_value()?),
                "data" => data = Some(map.next_value()?),
                "datacontenttype" => {
                    let ct: String = map.next_value()?;
                    if !ct.starts_with("application/json") && !ct.ends_with("+json") {
                        return Err(de::Error::custom(format!(
                            "unsupported datacontenttype {ct:?}: only JSON payloads are supported"
                        )));
                    }
                }
                "dataschema" => {
                    let _: serde::de::IgnoredAny = map.next_value()?;
                }
                "data_base64" => {
                    return Err(de::Error::custom(
                        "binary payloads (`data_base64`) are not supported: the payload must be JSON `data`",
                    ))
                }
                _ => {
                    let value: serde_json::Value = map.next_value()?;
                    let value = match value {
                        serde_json::Value::String(s) => s,
                        serde_json::Value::Null => continue,
                        other => other.to_string(),
                    };
                    headers.0.insert(key, value);
                }
            }
        }
        let missing = |n: &'static str| de::Error::missing_field(n);
        let specversion = specversion.ok_or_else(|| missing("specversion"))?;
        if specversion != "1.0" {
            return Err(de::Error::custom(format!(
                "unsupported CloudEvents specversion {specversion:?}: expected \"1.0\""
            )));
        }
        let name = name.ok_or_else(|| missing("type"))?;
        Ok(RawEnvelope {
            meta: Metadata {
                id: id.ok_or_else(|| missing("id"))?,
                occurred_at: time.ok_or_else(|| missing("time"))?,
                source: source.ok_or_else(|| missing("source"))?,
                aggregate_type: aggregate_type
                    .unwrap_or_else(|| name.split('.').next().unwrap_or_default().to_owned()),
                aggregate_id: subject.ok_or_else(|| missing("subject"))?,
                sequence: sequence.unwrap_or(0),
                correlation_id,
                causation_id,
                headers,
                trace_parent,
                trace_state,
            },
            version: version.ok_or_else(|| missing("schemaversion"))?,
            data: data.ok_or_else(|| missing("data"))?,
            name,
        })
    }
}

/// A typed envelope behind a trait object, so that events of different types can sit in one
/// list (a recorder, a unit of work) and be dispatched by type id.
pub trait AnyEnvelope: Any + Send + Sync {
    /// The metadata.
    fn metadata(&self) -> &Metadata;
    /// Mutable metadata.
    fn metadata_mut(&mut self) -> &mut Metadata;
    /// The event name.
    fn name(&self) -> &'static str;
    /// The schema version.
    fn version(&self) -> u32;
    /// The type id of the event (not of the envelope).
    fn event_type_id(&self) -> TypeId;
    /// Encodes into a [`RawEnvelope`].
    ///
    /// # Errors
    /// The payload's `Serialize` impl failed.
    fn to_raw(&self) -> Result<RawEnvelope, serde_json::Error>;
    /// Encodes as CloudEvents structured JSON text in one pass (what [`RawEnvelope::to_json`]
    /// of [`to_raw`](Self::to_raw) gives, without the intermediate copy).
    ///
    /// # Errors
    /// The payload's `Serialize` impl failed.
    fn to_json(&self) -> Result<String, serde_json::Error>;
    /// The envelope as `Any`, to downcast to `Envelope<E>`.
    fn as_any(&self) -> &(dyn Any + Send + Sync);
}

impl<E: DomainEvent> AnyEnvelope for Envelope<E> {
    fn metadata(&self) -> &Metadata {
        &self.meta
    }
    fn metadata_mut(&mut self) -> &mut Metadata {
        &mut self.meta
    }
    fn name(&self) -> &'static str {
        E::NAME
    }
    fn version(&self) -> u32 {
        E::VERSION
    }
    fn event_type_id(&self) -> TypeId {
        TypeId::of::<E>()
    }
    fn to_raw(&self) -> Result<RawEnvelope, serde_json::Error> {
        Envelope::to_raw(self)
    }
    fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }
    fn as_any(&self) -> &(dyn Any + Send + Sync) {
        self
    }
}

impl fmt::Debug for dyn AnyEnvelope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnyEnvelope")
            .field("name", &self.name())
            .field("version", &self.version())
            .field("metadata", self.metadata())
            .finish_non_exhaustive()
    }
}

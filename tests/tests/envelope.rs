//! The envelope's CloudEvents 1.0 structured JSON form: attributes, round trips, large
//! integers, headers, and clear errors for malformed input.

use event_core::{DecodeError, DomainEvent, Envelope, HeaderError, RawEnvelope};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, DomainEvent)]
#[event(name = "ledger.posted", version = 3, aggregate = "account")]
struct Posted {
    #[event(aggregate_id)]
    account: Uuid,
    big: u64,
    negative: i64,
    note: String,
}

fn posted() -> Envelope<Posted> {
    let cause = Envelope::new(Posted {
        account: Uuid::now_v7(),
        big: 1,
        negative: -1,
        note: "cause".into(),
    });
    Envelope::new(Posted {
        account: Uuid::now_v7(),
        big: u64::MAX,
        negative: i64::MIN,
        note: "caf\u{e9} \"quoted\" \u{a0}".into(),
    })
    .with_sequence(42)
    .with_source("/services/ledger")
    .caused_by(cause.metadata())
    .with_header("tenant", "acme")
    .unwrap()
}

#[test]
fn serialises_as_a_cloudevents_structured_event() {
    let e = posted();
    let v: Value = serde_json::to_value(&e).unwrap();
    assert_eq!(v["specversion"], "1.0");
    assert_eq!(v["id"], e.id().to_string());
    assert_eq!(v["source"], "/services/ledger");
    assert_eq!(v["type"], "ledger.posted");
    assert_eq!(v["subject"], e.aggregate_id());
    assert_eq!(v["datacontenttype"], "application/json");
    assert_eq!(v["schemaversion"], 3);
    assert_eq!(v["aggregatetype"], "account");
    assert_eq!(v["sequence"], "00000000000000000042");
    assert_eq!(v["causationid"], e.causation_id().unwrap().to_string());
    assert_eq!(v["correlationid"], e.correlation_id().unwrap().to_string());
    assert_eq!(
        e.causation_id(),
        e.correlation_id(),
        "the cause had no correlation id"
    );
    assert_eq!(v["tenant"], "acme");
    let time = v["time"].as_str().unwrap();
    assert!(time.ends_with('Z'), "{time}");
    assert_eq!(
        chrono::DateTime::parse_from_rfc3339(time).unwrap(),
        e.occurred_at()
    );
    assert_eq!(v["data"]["note"], "caf\u{e9} \"quoted\" \u{a0}");
}

#[test]
fn round_trips_typed_and_raw_without_losing_integers_beyond_2_pow_53() {
    let e = posted();
    let json = serde_json::to_string(&e).unwrap();
    assert!(json.contains(&format!("\"big\":{}", u64::MAX)), "{json}");
    assert!(
        json.contains(&format!("\"negative\":{}", i64::MIN)),
        "{json}"
    );
    let back: Envelope<Posted> = serde_json::from_str(&json).unwrap();
    assert_eq!(back, e);

    let raw = RawEnvelope::from_json(&json).unwrap();
    assert_eq!(
        raw.to_json(),
        json,
        "raw envelopes keep the text byte for byte"
    );
    assert_eq!(Envelope::<Posted>::decode(&raw).unwrap(), e);
    assert_eq!(e.to_raw().unwrap(), raw);
}

#[test]
fn header_names_follow_cloudevents_attribute_naming() {
    let e = posted();
    assert!(matches!(
        e.clone().with_header("Tenant", "x"),
        Err(HeaderError::InvalidName(_))
    ));
    assert!(matches!(
        e.clone().with_header("averyveryverylongname1", "x"),
        Err(HeaderError::InvalidName(_))
    ));
    assert!(matches!(
        e.clone().with_header("sequence", "x"),
        Err(HeaderError::Reserved(_))
    ));
    for name in ["traceparent", "tracestate"] {
        assert!(
            matches!(
                e.clone().with_header(name, "x"),
                Err(HeaderError::Reserved(_))
            ),
            "{name}"
        );
    }
}

/// The CloudEvents distributed tracing extension: `traceparent` and `tracestate` are written
/// when set, read back into the metadata (not the headers), and absent otherwise.
#[test]
fn trace_context_travels_as_the_distributed_tracing_extension() {
    let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let e = posted().with_trace_context(parent, Some("congo=t61rcWkgMzE".into()));
    let json: Value = serde_json::to_value(&e).unwrap();
    assert_eq!(json["traceparent"], parent);
    assert_eq!(json["tracestate"], "congo=t61rcWkgMzE");
    let raw = RawEnvelope::from_json(&json.to_string()).unwrap();
    assert_eq!(raw.meta.trace_parent.as_deref(), Some(parent));
    assert_eq!(raw.meta.trace_state.as_deref(), Some("congo=t61rcWkgMzE"));
    assert_eq!(raw.meta.headers.get("traceparent"), None);
    assert_eq!(Envelope::<Posted>::decode(&raw).unwrap(), e);

    // A producer's attribute that is not a string is dropped, not an error.
    let mut odd = json.clone();
    odd["traceparent"] = json!(12345);
    odd["tracestate"] = json!({"k": "v"});
    let raw = RawEnvelope::from_json(&odd.to_string()).unwrap();
    assert_eq!(raw.meta.trace_parent, None);
    assert_eq!(raw.meta.trace_state, None);

    let plain: Value = serde_json::to_value(posted()).unwrap();
    assert!(plain.get("traceparent").is_none() && plain.get("tracestate").is_none());
}

#[test]
fn malformed_envelopes_are_errors_that_say_what_is_wrong() {
    let good: Value = serde_json::to_value(posted()).unwrap();
    let cases: Vec<(Value, &str)> = vec![
        (json!({}), "missing field `specversion`"),
        (
            {
                let mut v = good.clone();
                v["specversion"] = json!("0.3");
                v
            },
            "unsupported CloudEvents specversion",
        ),
        (
            {
                let mut v = good.clone();
                v.as_object_mut().unwrap().remove("type");
                v
            },
            "missing field `type`",
        ),
        (
            {
                let mut v = good.clone();
                v["sequence"] = json!("12a");
                v
            },
            "`sequence` is not an unsigned integer",
        ),
        (
            {
                let mut v = good.clone();
                v["id"] = json!("not-a-uuid");
                v
            },
            "UUID",
        ),
        (
            {
                let mut v = good.clone();
                v["data"]["big"] = json!("many");
                v
            },
            // A payload's values are withheld from its decode error.
            "invalid type: string (value withheld), expected u64",
        ),
    ];
    for (value, expected) in cases {
        let err = serde_json::from_value::<Envelope<Posted>>(value.clone()).unwrap_err();
        assert!(err.to_string().contains(expected), "{expected}: {err}");
    }
    let err = RawEnvelope::from_json("{\"specversion\":\"1.0\",\n\"id\": 5}").unwrap_err();
    assert!(matches!(err, DecodeError::Envelope(_)));
    // serde's message, with the line, is the source of the decode error.
    let chain = event_core::ErrorChain(&err).to_string();
    assert!(chain.contains("line 2"), "{chain}");
}

#[test]
fn decoding_into_the_wrong_type_is_a_mismatch() {
    #[derive(Debug, Serialize, Deserialize, DomainEvent)]
    #[event(name = "ledger.closed", version = 1)]
    struct Closed {
        #[event(aggregate_id)]
        account: Uuid,
    }
    let raw = posted().to_raw().unwrap();
    match Envelope::<Closed>::decode(&raw) {
        Err(DecodeError::TypeMismatch {
            expected_name: "ledger.closed",
            name,
            version: 3,
            ..
        }) => assert_eq!(name, "ledger.posted"),
        other => panic!("{other:?}"),
    }
}

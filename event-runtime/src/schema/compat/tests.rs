use super::*;
use schemars::JsonSchema;
use serde_json::json;

fn schema<T: JsonSchema>() -> Value {
    schemars::schema_for!(T).to_value()
}

fn check<Old: JsonSchema, New: JsonSchema>(mode: Compatibility) -> Vec<Violation> {
    check_schema("order.placed v1", &schema::<Old>(), &schema::<New>(), mode)
}

fn rules(v: &[Violation]) -> Vec<(Direction, &str, Rule)> {
    v.iter()
        .map(|v| (v.direction, v.field.as_str(), v.rule))
        .collect()
}

mod v1 {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Order {
        pub(super) order_id: String,
        pub(super) total_cents: u32,
    }
}

mod v2_optional {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Order {
        pub(super) order_id: String,
        pub(super) total_cents: u32,
        pub(super) note: Option<String>,
        #[serde(default)]
        pub(super) currency: String,
        #[serde(default)]
        pub(super) lines: Vec<u32>,
    }
}

mod v2_required {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Order {
        pub(super) order_id: String,
        pub(super) total_cents: u32,
        pub(super) currency: String,
    }
}

mod v2_removed {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Order {
        pub(super) order_id: String,
    }
}

mod v2_string {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Order {
        pub(super) order_id: String,
        pub(super) total_cents: String,
    }
}

mod v2_u64 {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Order {
        pub(super) order_id: String,
        pub(super) total_cents: u64,
    }
}

mod v2_f64 {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Order {
        pub(super) order_id: String,
        pub(super) total_cents: f64,
    }
}

mod v2_option {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Order {
        pub(super) order_id: String,
        pub(super) total_cents: Option<u32>,
    }
}

#[test]
fn adding_an_optional_field_is_full_compatible() {
    assert_eq!(
        check::<v1::Order, v2_optional::Order>(Compatibility::Full),
        vec![]
    );
    // And removing it again too.
    assert_eq!(
        check::<v2_optional::Order, v1::Order>(Compatibility::Full),
        vec![]
    );
}

#[test]
fn adding_a_required_field_fails_backward_and_passes_forward() {
    let v = check::<v1::Order, v2_required::Order>(Compatibility::Backward);
    assert_eq!(
        rules(&v),
        vec![(Direction::Backward, "currency", Rule::RequiredFieldAdded)]
    );
    assert_eq!(
        v[0].message,
        "required in the new schema but absent from data written with the old one \
         (make it optional or give it a #[serde(default)])"
    );
    assert_eq!(
        check::<v1::Order, v2_required::Order>(Compatibility::Forward),
        vec![]
    );
    // FULL reports the backward failure only.
    assert_eq!(
        rules(&check::<v1::Order, v2_required::Order>(Compatibility::Full)),
        vec![(Direction::Backward, "currency", Rule::RequiredFieldAdded)]
    );
}

#[test]
fn removing_a_required_field_fails_forward_and_passes_backward() {
    assert_eq!(
        check::<v1::Order, v2_removed::Order>(Compatibility::Backward),
        vec![]
    );
    let v = check::<v1::Order, v2_removed::Order>(Compatibility::Forward);
    assert_eq!(
        rules(&v),
        vec![(Direction::Forward, "total_cents", Rule::RequiredFieldAdded)]
    );
    assert!(
        v[0].message.contains("required in the old schema"),
        "{}",
        v[0]
    );
    assert!(v[0]
        .message
        .contains("absent from data written with the new one"));
}

mod closed_v1 {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Order {
        pub(super) order_id: String,
        pub(super) note: Option<String>,
    }
}

mod closed_v2_removed {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Order {
        pub(super) order_id: String,
    }
}

#[test]
fn closed_reader_rejects_a_removed_field_and_an_added_one() {
    // Removing `note` from a deny_unknown_fields type: the new reader rejects it in old data.
    let v = check::<closed_v1::Order, closed_v2_removed::Order>(Compatibility::Full);
    assert_eq!(
        rules(&v),
        vec![(
            Direction::Backward,
            "note",
            Rule::FieldRemovedFromClosedReader
        )]
    );
    assert!(v[0].message.contains("deny_unknown_fields"), "{}", v[0]);
    // Adding an optional field to it: old closed readers reject it in new data.
    let v = check::<closed_v2_removed::Order, closed_v1::Order>(Compatibility::Full);
    assert_eq!(
        rules(&v),
        vec![(
            Direction::Forward,
            "note",
            Rule::FieldRemovedFromClosedReader
        )]
    );
    // An open reader ignores unknown fields: removing from an open type is fine.
    assert_eq!(
        check::<v2_optional::Order, v1::Order>(Compatibility::Backward),
        vec![]
    );
}

#[test]
fn u32_to_string_fails_both_ways() {
    let v = check::<v1::Order, v2_string::Order>(Compatibility::Full);
    assert_eq!(
        rules(&v),
        vec![
            (Direction::Backward, "total_cents", Rule::TypeChanged),
            (Direction::Forward, "total_cents", Rule::TypeChanged),
        ]
    );
    assert_eq!(
        v[0].message,
        "data written with the old schema holds integer (uint32), the new schema reads string"
    );
    assert_eq!(
        v[1].message,
        "data written with the new schema holds string, the old schema reads integer (uint32)"
    );
}

#[test]
fn integer_widening_is_backward_only() {
    assert_eq!(
        check::<v1::Order, v2_u64::Order>(Compatibility::Backward),
        vec![]
    );
    let v = check::<v1::Order, v2_u64::Order>(Compatibility::Full);
    assert_eq!(
        rules(&v),
        vec![(Direction::Forward, "total_cents", Rule::TypeChanged)]
    );
    assert!(v[0].message.contains("integer (uint64)"), "{}", v[0]);
    assert!(
        v[0].message.contains("integer (uint32) (0..=4294967295)"),
        "{}",
        v[0]
    );
    // integer -> number is a widening too.
    assert_eq!(
        rules(&check::<v1::Order, v2_f64::Order>(Compatibility::Full)),
        vec![(Direction::Forward, "total_cents", Rule::TypeChanged)]
    );
}

#[test]
fn float_to_double_is_a_widening() {
    let f32_schema = json!({"type": "object", "properties": {"x": {"type": "number", "format": "float"}}, "required": ["x"]});
    let f64_schema = json!({"type": "object", "properties": {"x": {"type": "number", "format": "double"}}, "required": ["x"]});
    let v = check_schema("e v1", &f32_schema, &f64_schema, Compatibility::Full);
    assert_eq!(
        rules(&v),
        vec![(Direction::Forward, "x", Rule::TypeChanged)]
    );
}

#[test]
fn a_format_narrowing_is_a_type_change() {
    let plain =
        json!({"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]});
    let uuid = json!({"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}}, "required": ["id"]});
    let v = check_schema("e v1", &plain, &uuid, Compatibility::Full);
    assert_eq!(
        rules(&v),
        vec![(Direction::Backward, "id", Rule::TypeChanged)]
    );
    assert!(v[0].message.contains("string (uuid)"), "{}", v[0]);
}

#[test]
fn t_to_option_t_is_backward_only() {
    assert_eq!(
        check::<v1::Order, v2_option::Order>(Compatibility::Backward),
        vec![]
    );
    let v = check::<v1::Order, v2_option::Order>(Compatibility::Forward);
    assert_eq!(
        rules(&v),
        vec![
            (Direction::Forward, "total_cents", Rule::RequiredFieldAdded),
            (Direction::Forward, "total_cents", Rule::TypeChanged),
        ]
    );
    assert!(v[0].message.contains("optional in the new one"), "{}", v[0]);
    assert!(v[1].message.contains("null"), "{}", v[1]);
}

mod nested_v1 {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Address {
        pub(super) zip: String,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Customer {
        pub(super) address: Address,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Order {
        pub(super) customer: Customer,
        pub(super) lines: Vec<Address>,
    }
}

mod nested_v2 {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Address {
        pub(super) zip: u32,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Customer {
        pub(super) address: Address,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Order {
        pub(super) customer: Customer,
        pub(super) lines: Vec<Address>,
    }
}

#[test]
fn nested_change_reports_the_dotted_path_through_refs() {
    let old = schema::<nested_v1::Order>();
    assert!(old["properties"]["customer"].get("$ref").is_some());
    let v = check::<nested_v1::Order, nested_v2::Order>(Compatibility::Backward);
    assert_eq!(
        rules(&v),
        vec![
            (
                Direction::Backward,
                "customer.address.zip",
                Rule::TypeChanged
            ),
            (Direction::Backward, "lines[].zip", Rule::TypeChanged),
        ]
    );
}

mod enum_v1 {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) enum Status {
        Placed,
        Paid,
        Shipped,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) enum Payment {
        Cash,
        Card { last4: String },
        Voucher(u32),
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Order {
        pub(super) status: Status,
        pub(super) payment: Payment,
    }
}

mod enum_v2 {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) enum Status {
        Placed,
        Paid,
        Cancelled,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) enum Payment {
        Cash,
        Card { last4: u16 },
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Order {
        pub(super) status: Status,
        pub(super) payment: Payment,
    }
}

#[test]
fn enum_variants_removed_and_added() {
    let v = check::<enum_v1::Order, enum_v2::Order>(Compatibility::Full);
    assert_eq!(
        rules(&v),
        vec![
            // Old data may hold `Shipped` and `Voucher`, which the new enums lack.
            (Direction::Backward, "payment.Card.last4", Rule::TypeChanged),
            (Direction::Backward, "payment", Rule::EnumValueRemoved),
            (Direction::Backward, "status", Rule::EnumValueRemoved),
            // New data may hold `Cancelled`, which old readers lack.
            (Direction::Forward, "payment.Card.last4", Rule::TypeChanged),
            (Direction::Forward, "status", Rule::EnumValueRemoved),
        ]
    );
    assert!(v[1].message.contains("`Voucher`"), "{}", v[1]);
    assert!(v[2].message.contains("\"Shipped\""), "{}", v[2]);
    assert!(v[4].message.contains("\"Cancelled\""), "{}", v[4]);
}

mod tagged_v1 {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(tag = "type")]
    pub(super) enum Shipment {
        Pickup,
        Courier { carrier: String },
    }
}

mod tagged_v2 {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(tag = "type")]
    pub(super) enum Shipment {
        Pickup,
        Courier { carrier: String, tracking: String },
    }
}

#[test]
fn internally_tagged_variant_is_matched_by_its_tag() {
    let v = check::<tagged_v1::Shipment, tagged_v2::Shipment>(Compatibility::Full);
    assert_eq!(
        rules(&v),
        vec![(Direction::Backward, "tracking", Rule::RequiredFieldAdded)]
    );
}

mod tree_v1 {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Node {
        pub(super) value: u32,
        pub(super) children: Vec<Node>,
        pub(super) parent: Option<Box<Node>>,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Event {
        pub(super) root: Node,
    }
}

mod tree_v2 {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Node {
        pub(super) value: String,
        pub(super) children: Vec<Node>,
        pub(super) parent: Option<Box<Node>>,
        pub(super) label: Option<String>,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Event {
        pub(super) root: Node,
    }
}

#[test]
fn recursive_types_terminate() {
    // Recursive through `$defs` and through the root itself (`"$ref": "#"`).
    assert_eq!(
        check::<tree_v1::Event, tree_v1::Event>(Compatibility::Full),
        vec![]
    );
    assert_eq!(
        check::<tree_v1::Node, tree_v1::Node>(Compatibility::Full),
        vec![]
    );
    let v = check::<tree_v1::Event, tree_v2::Event>(Compatibility::Backward);
    assert_eq!(
        rules(&v),
        vec![(Direction::Backward, "root.value", Rule::TypeChanged)]
    );
    let v = check::<tree_v1::Node, tree_v2::Node>(Compatibility::Backward);
    assert_eq!(
        rules(&v),
        vec![(Direction::Backward, "value", Rule::TypeChanged)]
    );
}

mod rich {
    use std::collections::{BTreeMap, BTreeSet};

    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Inner {
        pub(super) zip: String,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) enum Mixed {
        /// Documented unit variants become `const` branches.
        A,
        B(u32),
        C {
            x: i64,
        },
        D(Inner),
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(tag = "t", content = "c")]
    pub(super) enum Adjacent {
        X(u8),
        Y,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(untagged)]
    pub(super) enum Untagged {
        N(u8),
        S { s: String },
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Tree {
        pub(super) kids: Vec<Tree>,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Event {
        pub(super) a: u8,
        #[serde(default)]
        pub(super) b: f64,
        pub(super) c: Option<Inner>,
        pub(super) d: BTreeMap<String, u64>,
        pub(super) e: Option<Mixed>,
        pub(super) f: Adjacent,
        pub(super) g: Untagged,
        pub(super) h: Tree,
        pub(super) i: BTreeSet<String>,
        pub(super) j: (u32, String),
        pub(super) k: [u8; 3],
        pub(super) l: char,
        pub(super) m: serde_json::Value,
        pub(super) n: Vec<Option<i16>>,
        pub(super) o: (),
        #[serde(flatten)]
        pub(super) p: Inner,
    }
}

#[test]
fn every_schema_reads_itself() {
    assert_eq!(
        check::<rich::Event, rich::Event>(Compatibility::Full),
        vec![]
    );
    assert_eq!(
        check::<rich::Mixed, rich::Mixed>(Compatibility::Full),
        vec![]
    );
    assert_eq!(
        check::<rich::Untagged, rich::Untagged>(Compatibility::Full),
        vec![]
    );
}

#[test]
fn none_reports_nothing() {
    assert_eq!(
        check::<v1::Order, v2_string::Order>(Compatibility::None),
        vec![]
    );
    assert_eq!(
        check::<enum_v1::Order, enum_v2::Order>(Compatibility::None),
        vec![]
    );
}

#[test]
fn maps_and_arrays() {
    let old = json!({"type": "object", "properties": {
        "prices": {"type": "object", "additionalProperties": {"type": "integer", "format": "uint32"}},
        "tags": {"type": "array", "items": {"type": "integer", "format": "uint32"}},
        "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "minItems": 2, "maxItems": 2}
    }, "required": ["prices", "tags", "pair"]});
    let new = json!({"type": "object", "properties": {
        "prices": {"type": "object", "additionalProperties": {"type": "string"}},
        "tags": {"type": "array", "items": {"type": "string"}},
        "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}, {"type": "integer"}], "minItems": 3, "maxItems": 3}
    }, "required": ["prices", "tags", "pair"]});
    let v = check_schema("e v1", &old, &new, Compatibility::Backward);
    assert_eq!(
        rules(&v),
        vec![
            (Direction::Backward, "pair", Rule::ItemsChanged),
            (Direction::Backward, "prices.*", Rule::TypeChanged),
            (Direction::Backward, "tags[]", Rule::ItemsChanged),
        ]
    );
    assert!(v[2].message.starts_with("array items:"), "{}", v[2]);
}

#[test]
fn unresolved_references_are_reported() {
    let old = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}, "required": ["a"]});
    let v = check_schema("e v1", &old, &old, Compatibility::Backward);
    assert_eq!(
        rules(&v),
        vec![
            (Direction::Backward, "a", Rule::UnresolvedReference),
            (Direction::Backward, "a", Rule::UnresolvedReference),
        ]
    );
}

fn entry(name: &str, version: u32, schema: Value) -> CatalogEntry {
    CatalogEntry {
        name: name.into(),
        version,
        rust_type: format!("app::{}V{version}", name.replace('.', "_")),
        schema,
    }
}

#[test]
fn catalog_version_removed_and_overrides() {
    let old = vec![
        entry("order.placed", 1, schema::<v1::Order>()),
        entry("order.shipped", 1, schema::<v1::Order>()),
    ];
    let new = vec![
        // order.placed v1 gone, though v2 is registered: still a violation.
        entry("order.placed", 2, schema::<v2_required::Order>()),
        entry("order.shipped", 1, schema::<v2_string::Order>()),
        entry("order.cancelled", 1, schema::<v1::Order>()),
    ];
    let none = HashMap::new();
    let v = check_catalog(&old, &new, Compatibility::Backward, &none);
    let got: Vec<_> = v
        .iter()
        .map(|v| (v.event.as_str(), v.field.as_str(), v.rule))
        .collect();
    assert_eq!(
        got,
        vec![
            ("order.placed v1", "", Rule::VersionRemoved),
            ("order.shipped v1", "total_cents", Rule::TypeChanged),
        ]
    );
    assert!(v[0].message.contains("dead letter queues"), "{}", v[0]);
    // FULL reports the removal too; FORWARD does not.
    assert_eq!(
        check_catalog(&old, &new, Compatibility::Full, &none)
            .iter()
            .filter(|v| v.rule == Rule::VersionRemoved)
            .count(),
        1
    );
    assert!(check_catalog(&old, &new, Compatibility::Forward, &none)
        .iter()
        .all(|v| v.rule != Rule::VersionRemoved));
    // Overrides by event name.
    let overrides = HashMap::from([
        ("order.placed".to_owned(), Compatibility::None),
        ("order.shipped".to_owned(), Compatibility::None),
    ]);
    assert_eq!(
        check_catalog(&old, &new, Compatibility::Full, &overrides),
        vec![]
    );
    // Identical catalogs pass.
    assert_eq!(
        check_catalog(&old, &old, Compatibility::Full, &none),
        vec![]
    );
}

#[test]
fn violation_displays_on_one_line() {
    let v = check::<v1::Order, v2_required::Order>(Compatibility::Backward);
    let line = v[0].to_string();
    assert_eq!(
        line,
        "order.placed v1: field `currency`: BACKWARD RequiredFieldAdded: required in the new \
         schema but absent from data written with the old one (make it optional or give it a \
         #[serde(default)])"
    );
    for v in check::<enum_v1::Order, enum_v2::Order>(Compatibility::Full)
        .iter()
        .chain(&check::<nested_v1::Order, nested_v2::Order>(
            Compatibility::Full,
        ))
    {
        let line = v.to_string();
        assert!(!line.contains('\n'), "{line}");
        assert!(line.starts_with("order.placed v1: field `"), "{line}");
        assert!(line.contains(v.rule.as_str()), "{line}");
    }
    let root = Violation {
        event: "e v1".into(),
        field: String::new(),
        direction: Direction::Backward,
        rule: Rule::VersionRemoved,
        message: "gone".into(),
    };
    assert_eq!(
        root.to_string(),
        "e v1: root: BACKWARD VersionRemoved: gone"
    );
}

#[test]
fn compatibility_parses_displays_and_serializes() {
    for (text, mode) in [
        ("BACKWARD", Compatibility::Backward),
        ("forward", Compatibility::Forward),
        ("Full", Compatibility::Full),
        ("none", Compatibility::None),
    ] {
        assert_eq!(text.parse::<Compatibility>().unwrap(), mode);
        assert_eq!(mode.to_string(), text.to_ascii_uppercase());
        assert_eq!(
            serde_json::to_value(mode).unwrap(),
            json!(text.to_ascii_uppercase())
        );
        assert_eq!(
            serde_json::from_value::<Compatibility>(json!(text)).unwrap(),
            mode
        );
    }
    assert!("sideways".parse::<Compatibility>().is_err());
    assert!(serde_json::from_value::<Compatibility>(json!("sideways")).is_err());
    assert_eq!(Compatibility::default(), Compatibility::Backward);
}

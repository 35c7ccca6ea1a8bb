//! How the `events` tool prints an envelope: its payload withheld, or its sensitive fields
//! masked, the rest of the stored text as it is.

use std::collections::HashMap;

use event_core::EventDescriptor;
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

use super::MASK;
use crate::store::CatalogRecord;

/// The sensitive fields of each (name, version) known, from a registry or from the database's
/// catalog.
#[derive(Debug, Default, Clone)]
pub(crate) struct Masking {
    by_event: HashMap<(String, u32), Vec<String>>,
}

/// An envelope as the tool prints it.
pub(crate) struct Printed {
    /// The envelope JSON with the payload withheld or its sensitive fields masked; the
    /// original text when nothing was changed.
    pub(crate) text: String,
    /// Whether the payload was withheld whole.
    pub(crate) withheld: bool,
    /// How many fields were masked.
    pub(crate) masked: usize,
    /// Whether the event type is known (has a catalog entry) at all.
    pub(crate) known: bool,
}

impl Masking {
    /// Adds what `records` (the database's catalog) say.
    pub(crate) fn add_records(&mut self, records: &[CatalogRecord]) {
        for r in records {
            self.by_event
                .insert((r.name.clone(), r.version), r.sensitive.clone());
        }
    }

    /// Adds the event types of a registry (over the database's records of the same type).
    pub(crate) fn add_descriptors(&mut self, events: &[EventDescriptor]) {
        for e in events {
            self.by_event.insert(
                (e.name.to_owned(), e.version),
                e.sensitive_fields.iter().map(|f| (*f).to_owned()).collect(),
            );
        }
    }

    /// `envelope` (CloudEvents JSON, as stored) with its `data` replaced by [`MASK`] unless
    /// `payload`, else with each sensitive field of its type's `data` masked. Everything else
    /// is the stored text, attributes in their order, values byte for byte.
    pub(crate) fn print(&self, envelope: &str, payload: bool) -> Printed {
        let Ok(mut map) = serde_json::from_str::<Ordered>(envelope) else {
            // Not an envelope (a foreign or corrupted row): all of it is withheld.
            return Printed {
                text: if payload {
                    envelope.to_owned()
                } else {
                    format!("\"(not a JSON object: {} bytes withheld)\"", envelope.len())
                },
                withheld: !payload,
                masked: 0,
                known: false,
            };
        };
        let attribute = |name: &str| {
            map.0
                .iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| serde_json::from_str::<Value>(v.get()).ok())
        };
        let key = (
            attribute("type")
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            attribute("schemaversion")
                .and_then(|v| v.as_u64())
                .and_then(|v| u32::try_from(v).ok())
                .unwrap_or(0),
        );
        let exact = self.by_event.get(&key);
        // A version no catalog knows (a newer producer's) is masked by what every known
        // version of its name marks: a field keeps its name across versions more often than
        // not, and masking too much is the safe side.
        let fallback: Vec<String>;
        let fields = match exact {
            Some(f) => Some(f),
            None => {
                fallback = self
                    .by_event
                    .iter()
                    .filter(|((name, _), _)| *name == key.0)
                    .flat_map(|(_, f)| f.iter().cloned())
                    .collect();
                Some(&fallback).filter(|f| !f.is_empty())
            }
        };
        // Every payload member: a body may repeat `data` (JSON readers keep the last one) or
        // carry `data_base64`.
        let mut masked = 0;
        let mut changed = false;
        for (_, data) in map
            .0
            .iter_mut()
            .filter(|(k, _)| k == "data" || k == "data_base64")
        {
            if !payload {
                *data = mask();
                changed = true;
                continue;
            }
            let Some(fields) = fields else {
                continue;
            };
            match serde_json::from_str::<Ordered>(data.get()) {
                Ok(mut object) => {
                    let before = masked;
                    for (k, v) in &mut object.0 {
                        if fields.contains(k) {
                            *v = mask();
                            masked += 1;
                        }
                    }
                    if masked > before {
                        *data = serde_json::value::to_raw_value(&object).unwrap_or_else(|_| mask());
                        changed = true;
                    }
                }
                // Not an object (a string, base64): its sensitive fields cannot be told apart,
                // so all of it is withheld.
                Err(_) => {
                    *data = mask();
                    masked += 1;
                    changed = true;
                }
            }
        }
        let text = if changed {
            serde_json::to_string(&map).unwrap_or_else(|_| String::from("\"***\""))
        } else {
            envelope.to_owned()
        };
        Printed {
            text,
            withheld: !payload,
            masked,
            known: exact.is_some(),
        }
    }
}

fn mask() -> Box<RawValue> {
    serde_json::value::to_raw_value(MASK).expect("a string serialises")
}

/// A JSON object's members in their order, each value as its text.
struct Ordered(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> Visitor<'de> for Members {
            type Value = Ordered;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered, A::Error> {
                let mut members = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    members.push(entry);
                }
                Ok(Ordered(members))
            }
        }
        d.deserialize_map(Members)
    }
}

impl Serialize for Ordered {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn masking() -> Masking {
        let mut m = Masking::default();
        m.add_records(&[CatalogRecord::new(
            "customer.registered",
            1,
            "app::Registered",
            vec!["email".into()],
            None,
        )]);
        m
    }

    const HEAD: &str = r#""type":"customer.registered","schemaversion":1"#;

    #[test]
    fn every_payload_member_is_withheld_or_masked() {
        let m = masking();
        // A repeated `data` (readers keep the last) and `data_base64`.
        for body in [
            format!(r#"{{{HEAD},"data":{{}},"data":{{"email":"SECRET","age":3}}}}"#),
            format!(r#"{{{HEAD},"data_base64":"SECRET"}}"#),
        ] {
            let withheld = m.print(&body, false);
            assert!(!withheld.text.contains("SECRET"), "{}", withheld.text);
            let shown = m.print(&body, true);
            assert!(!shown.text.contains("SECRET"), "{}", shown.text);
        }
        // A payload that is no object cannot be masked field by field: withheld whole.
        let body = format!(r#"{{{HEAD},"data":"{{\"email\":\"SECRET\"}}"}}"#);
        let shown = m.print(&body, true);
        assert!(!shown.text.contains("SECRET"), "{}", shown.text);
        // The rest is printed as stored.
        let body = format!(r#"{{{HEAD},"data":{{"email":"SECRET","age":3}}}}"#);
        let shown = m.print(&body, true);
        assert_eq!(
            shown.text,
            format!(r#"{{{HEAD},"data":{{"email":"***","age":3}}}}"#)
        );
    }
}

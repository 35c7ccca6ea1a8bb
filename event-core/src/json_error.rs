//! [`JsonError`]: serde_json's error with the input's values withheld, so that a decode error
//! can be logged, stored with a dead letter and printed without leaking the payload.
//!
//! serde's messages quote what they refused (`invalid type: string "4111 1111 1111 1111",
//! expected u64`); a payload's values can be personal data. Ours keeps what locates and
//! explains the problem — the category, the kinds involved (`string`, `expected u64`), field
//! and variant *names* of the type, the line and column — and drops the values: `invalid type:
//! string (value withheld), expected u64 at line 1 column 42`. A message a type's own
//! `Deserialize` wrote (a custom error) is kept only when it quotes nothing. The errors of an
//! envelope's attributes (`id`, `sequence`…), which are not payload, keep serde's message.

use std::fmt;

use serde_json::error::Category;

/// What a JSON text could not be read as, with the input's values withheld (see the module
/// docs). Built from a [`serde_json::Error`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonError {
    message: String,
    line: usize,
    column: usize,
    category: Category,
}

/// The placeholder for a withheld value.
const WITHHELD: &str = "(value withheld)";

impl JsonError {
    /// The message without the position, values withheld.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The line of the error, from 1; 0 when serde gave none.
    pub fn line(&self) -> usize {
        self.line
    }

    /// The column of the error, from 1; 0 when serde gave none.
    pub fn column(&self) -> usize {
        self.column
    }

    /// serde_json's category (`serde_json::error::Category`): syntax, end of input, data that
    /// does not fit the type, I/O.
    pub fn classify(&self) -> Category {
        self.category
    }
}

impl JsonError {
    /// serde's error as it is for an envelope's attributes, which are not payload (`data` is
    /// kept as raw JSON text there, never decoded), the values of type errors withheld…
    pub(crate) fn verbatim(e: serde_json::Error) -> Self {
        // …but a body that is not an object at all (a bare string) is quoted whole by serde.
        Self::with_message(&e, |bare| {
            if bare.starts_with("invalid type: ") || bare.starts_with("invalid value: ") {
                withhold(bare)
            } else {
                bare.to_owned()
            }
        })
    }

    /// `e` with its message (without the position) passed through `message`.
    fn with_message(e: &serde_json::Error, message: impl FnOnce(&str) -> String) -> Self {
        let text = e.to_string();
        let position = format!(" at line {} column {}", e.line(), e.column());
        JsonError {
            message: message(text.strip_suffix(&position).unwrap_or(&text)),
            line: e.line(),
            column: e.column(),
            category: e.classify(),
        }
    }
}

impl From<serde_json::Error> for JsonError {
    fn from(e: serde_json::Error) -> Self {
        Self::with_message(&e, |bare| match e.classify() {
            // serde_json's own syntax messages name what it expected, never the input.
            Category::Syntax | Category::Eof | Category::Io => bare.to_owned(),
            Category::Data => withhold(bare),
        })
    }
}

/// A data error's message with the values it quotes withheld.
fn withhold(message: &str) -> String {
    // `invalid type: string "…", expected u32`, `invalid value: integer `7`, expected …`: the
    // kind is the words before the quoted value; the expectation is the type's.
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix) {
            let kind_end = rest.find(['"', '`']).unwrap_or(rest.len());
            let kind = rest[..kind_end].trim_end().trim_end_matches(',');
            let expected = rest.rfind(", expected ").map_or("", |i| &rest[i..]);
            return if kind_end == rest.len() {
                // Nothing quoted (`sequence`, `map`, `unit value`).
                message.to_owned()
            } else {
                format!("{prefix}{kind} {WITHHELD}{expected}")
            };
        }
    }
    if message.starts_with("unknown variant ") {
        let tail = message
            .rfind(", expected ")
            .or_else(|| message.rfind(", there are no variants"))
            .map_or("", |i| &message[i..]);
        return format!("unknown variant {WITHHELD}{tail}");
    }
    // Names of the type's fields, lengths: no input values.
    let known = [
        "unknown field ",
        "missing field ",
        "duplicate field ",
        "invalid length ",
    ];
    if known.iter().any(|k| message.starts_with(k)) || !message.contains(['"', '`', '\'']) {
        return message.to_owned();
    }
    "the value does not fit the type (its message is withheld: it quotes the input)".to_owned()
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            f.write_str(&self.message)
        } else {
            write!(
                f,
                "{} at line {} column {}",
                self.message, self.line, self.column
            )
        }
    }
}

impl std::error::Error for JsonError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn error<T: serde::de::DeserializeOwned + fmt::Debug>(json: &str) -> String {
        let e = serde_json::from_str::<T>(json).unwrap_err();
        JsonError::from(e).to_string()
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Card {
        number: u64,
        kind: Kind,
        #[serde(default)]
        id: Option<uuid::Uuid>,
    }

    #[derive(Debug, serde::Deserialize)]
    enum Kind {
        Visa,
    }

    #[test]
    fn values_are_withheld_and_the_rest_is_kept() {
        let cases = [
            (
                r#"{"number": "4111 SECRET", "kind": "Visa"}"#,
                "invalid type: string (value withheld), expected u64 at line 1 column 24",
            ),
            (
                r#"{"number": -4111, "kind": "Visa"}"#,
                "invalid value: integer (value withheld), expected u64 at line 1 column 16",
            ),
            (
                r#"{"number": 1, "kind": "SECRET"}"#,
                "unknown variant (value withheld), expected `Visa` at line 1 column 30",
            ),
            (
                r#"{"number": 1}"#,
                "missing field `kind` at line 1 column 13",
            ),
            (
                r#"{"number": 1, "kind": "Visa", "id": "SECRET"}"#,
                "the value does not fit the type (its message is withheld: it quotes the input) at line 1 column 44",
            ),
            (r#"{"number": 1,"#, "EOF while parsing a value at line 1 column 13"),
        ];
        for (json, expected) in cases {
            let got = error::<Card>(json);
            assert_eq!(got, expected, "{json}");
            assert!(!got.contains("SECRET") && !got.contains("4111"), "{got}");
        }
        // An envelope whose body is a bare string: serde would quote all of it.
        let e = crate::RawEnvelope::from_json(r#""SECRET body""#).unwrap_err();
        let text = crate::ErrorChain(&e).to_string();
        assert!(
            text.contains("invalid type: string (value withheld)"),
            "{text}"
        );
        assert!(!text.contains("SECRET"), "{text}");
    }
}

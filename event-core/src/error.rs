//! Error types shared by domain crates and the runtime: decoding, headers, and the error a
//! handler returns. Classification (transient or permanent) lives here; retry policy does not.

use std::error::Error as StdError;
use std::fmt;

use uuid::Uuid;

/// A raw envelope could not be turned into a typed one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The text is not a CloudEvents 1.0 structured JSON event (the source, serde's error
    /// with the input's values withheld, has the line and column).
    #[error("malformed event envelope")]
    Envelope(#[source] crate::JsonError),
    /// No registered event type has this name.
    #[error(
        "unknown event type `{name}` (version {version}): no event with this name is registered"
    )]
    UnknownName {
        /// The `type` attribute.
        name: String,
        /// The `schemaversion` attribute.
        version: u32,
    },
    /// The name is registered, but not this version.
    #[error("unknown version {version} of event `{name}`: registered versions are {known:?}")]
    UnknownVersion {
        /// The `type` attribute.
        name: String,
        /// The `schemaversion` attribute.
        version: u32,
        /// The versions this code knows, ascending.
        known: Vec<u32>,
    },
    /// Decoding was asked for a type whose name or version differs from the envelope's.
    #[error("envelope holds `{name}` v{version}, expected `{expected_name}` v{expected_version}")]
    TypeMismatch {
        /// The name the target type has.
        expected_name: &'static str,
        /// The version the target type has.
        expected_version: u32,
        /// The envelope's name.
        name: String,
        /// The envelope's version.
        version: u32,
    },
    /// The payload does not deserialise into the registered type.
    #[error("payload of `{name}` v{version} (event {event_id}) does not decode")]
    Payload {
        /// The event name.
        name: String,
        /// The event version.
        version: u32,
        /// The event id.
        event_id: Uuid,
        /// serde's error, values withheld ([`JsonError`](crate::JsonError)): names the field
        /// and the position.
        #[source]
        source: crate::JsonError,
    },
    /// The payload has a field the event type does not declare, and the type is declared with
    /// `#[event(deny_unknown_fields)]`. (Without it, unknown fields are ignored.)
    #[error("payload of `{name}` v{version} (event {event_id}) has unknown field `{field}`, and `{type_name}` is declared with #[event(deny_unknown_fields)]")]
    UnknownField {
        /// The event name.
        name: String,
        /// The event version.
        version: u32,
        /// The event id.
        event_id: Uuid,
        /// The Rust type the payload was decoded into.
        type_name: &'static str,
        /// The first unknown field, as a path from the payload's root (`discount` or
        /// `lines.0.note`).
        field: String,
    },
    /// An envelope cannot be converted into the version asked for: that version is older than
    /// the envelope's (envelopes are never downcast), belongs to another event, or no chain of
    /// registered upcasters leads to it.
    #[error("`{name}` v{version} cannot be upcast to `{target_name}` v{target_version} (`{target_type}`): {reason}")]
    NoUpcastPath {
        /// The envelope's event name.
        name: String,
        /// The envelope's version.
        version: u32,
        /// The target's event name.
        target_name: &'static str,
        /// The target's version.
        target_version: u32,
        /// The target's Rust type.
        target_type: &'static str,
        /// Why.
        reason: &'static str,
    },
}

/// A header name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// Not a CloudEvents attribute name: `a-z0-9` only, 1 to 20 characters.
    #[error(
        "invalid header name {0:?}: CloudEvents attribute names are 1-20 characters of a-z and 0-9"
    )]
    InvalidName(String),
    /// The envelope writes this attribute itself.
    #[error("header name {0:?} is reserved by the envelope")]
    Reserved(String),
}

/// Whether retrying can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// May succeed on a later attempt (a timeout, a lock, a service restarting). The default.
    Transient,
    /// Will fail again however often it is retried (a validation rule, an unsupported input):
    /// durable delivery dead-letters it at once.
    Permanent,
}

/// The error a handler returns.
///
/// Any `std::error::Error + Send + Sync + 'static` converts into it with `?`, as a
/// [transient](ErrorKind::Transient) error; wrap with [`HandlerError::permanent`] to say that
/// retrying is pointless.
///
/// Like `anyhow::Error`, `HandlerError` does not itself implement `std::error::Error`, so that
/// the blanket conversion can exist.
///
/// ```
/// use event_core::HandlerError;
///
/// fn parse(qty: &str) -> Result<u32, HandlerError> {
///     // transient by default
///     let n: u32 = qty.parse()?;
///     if n == 0 {
///         return Err(HandlerError::permanent_msg("quantity must be positive"));
///     }
///     Ok(n)
/// }
/// assert!(parse("x").unwrap_err().is_transient());
/// assert!(parse("0").unwrap_err().is_permanent());
/// ```
pub struct HandlerError(Box<Inner>);

// One pointer wide: handler results and dispatch reports stay small on the success path.
struct Inner {
    kind: ErrorKind,
    error: Box<dyn StdError + Send + Sync + 'static>,
}

impl HandlerError {
    /// A transient error: retried by durable delivery.
    pub fn transient(error: impl Into<Box<dyn StdError + Send + Sync + 'static>>) -> Self {
        HandlerError(Box::new(Inner {
            kind: ErrorKind::Transient,
            error: error.into(),
        }))
    }

    /// A permanent error: dead-lettered at once by durable delivery.
    pub fn permanent(error: impl Into<Box<dyn StdError + Send + Sync + 'static>>) -> Self {
        HandlerError(Box::new(Inner {
            kind: ErrorKind::Permanent,
            error: error.into(),
        }))
    }

    /// A transient error from a message.
    pub fn transient_msg(message: impl fmt::Display) -> Self {
        Self::transient(message.to_string())
    }

    /// A permanent error from a message.
    pub fn permanent_msg(message: impl fmt::Display) -> Self {
        Self::permanent(message.to_string())
    }

    /// Transient or permanent.
    pub fn kind(&self) -> ErrorKind {
        self.0.kind
    }

    /// `true` for [`ErrorKind::Permanent`].
    pub fn is_permanent(&self) -> bool {
        self.0.kind == ErrorKind::Permanent
    }

    /// `true` for [`ErrorKind::Transient`].
    pub fn is_transient(&self) -> bool {
        self.0.kind == ErrorKind::Transient
    }

    /// The underlying error.
    pub fn source_error(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.0.error
    }

    /// The messages of the error and of each of its sources, outermost first: the
    /// [`ErrorChain`] of [`source_error`](Self::source_error), without the kind.
    pub fn chain(&self) -> Vec<String> {
        ErrorChain(self.source_error()).messages()
    }
}

/// An error and each of its sources, outermost first: the one walk of an error chain, used by
/// logs, dead letters and the `events` tool. `Display` joins the messages with `": "`;
/// [`messages`](Self::messages) lists them (as a dead letter stores them); iterating gives
/// the errors themselves.
///
/// Each error of the chain is printed exactly once, as it displays itself. That is the
/// convention of `std::error::Error` that thiserror and anyhow users rely on: `Display` says
/// what failed at its own level and leaves the cause to `source()`. Every error of this
/// project follows it. An error that breaks it — its message ends in `": {source}"` and it
/// also returns that source — shows the cause twice here: the walk does not guess which text
/// repeats which (a guess also drops a cause whose message merely ends like the one before).
/// Wrap such a foreign error at your boundary in one that follows the convention.
///
/// ```
/// use event_core::ErrorChain;
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("loading order A-1 failed")]
/// struct Load(#[source] std::io::Error);
///
/// let e = Load(std::io::Error::other("disk full"));
/// assert_eq!(ErrorChain(&e).to_string(), "loading order A-1 failed: disk full");
/// assert_eq!(ErrorChain(&e).messages(), ["loading order A-1 failed", "disk full"]);
/// assert_eq!(ErrorChain(&e).into_iter().count(), 2);
/// ```
#[derive(Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn StdError + 'static));

impl<'a> ErrorChain<'a> {
    /// The message of each error of the chain, outermost first.
    pub fn messages(self) -> Vec<String> {
        self.into_iter().map(ToString::to_string).collect()
    }
}

impl<'a> IntoIterator for ErrorChain<'a> {
    type Item = &'a (dyn StdError + 'static);
    type IntoIter = ErrorChainIter<'a>;

    fn into_iter(self) -> ErrorChainIter<'a> {
        ErrorChainIter { next: Some(self.0) }
    }
}

/// The errors of an [`ErrorChain`], outermost first.
#[derive(Clone)]
pub struct ErrorChainIter<'a> {
    next: Option<&'a (dyn StdError + 'static)>,
}

impl<'a> Iterator for ErrorChainIter<'a> {
    type Item = &'a (dyn StdError + 'static);

    fn next(&mut self) -> Option<Self::Item> {
        let error = self.next?;
        self.next = error.source();
        Some(error)
    }
}

impl std::iter::FusedIterator for ErrorChainIter<'_> {}

impl fmt::Debug for ErrorChainIter<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.clone().map(|e| e.to_string()))
            .finish()
    }
}

impl fmt::Display for ErrorChain<'_> {
    /// The messages joined with `: `, outermost first. A cause whose message the error before
    /// it already ends with (an error that prints its source itself, as many libraries'
    /// wrappers do: `IO error: refused` over `refused`) is written once.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut previous = String::new();
        for (i, error) in self.into_iter().enumerate() {
            let message = error.to_string();
            if i > 0 {
                if previous.ends_with(&message) {
                    continue;
                }
                f.write_str(": ")?;
            }
            f.write_str(&message)?;
            previous = message;
        }
        Ok(())
    }
}

impl fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl<E: StdError + Send + Sync + 'static> From<E> for HandlerError {
    fn from(error: E) -> Self {
        HandlerError::transient(error)
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("kind", &self.0.kind)
            .field("chain", &self.chain())
            .finish()
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.0.kind {
            ErrorKind::Transient => "transient",
            ErrorKind::Permanent => "permanent",
        };
        write!(f, "{kind} error: {}", ErrorChain(self.source_error()))
    }
}

#[cfg(test)]
mod tests {
    use super::{DecodeError, ErrorChain, HandlerError};

    #[test]
    fn a_cause_its_wrapper_already_printed_is_written_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("IO error: {0}")]
        struct Wraps(#[source] std::io::Error);
        #[derive(Debug, thiserror::Error)]
        #[error("cannot connect")]
        struct Outer(#[source] Wraps);
        let e = Outer(Wraps(std::io::Error::other("refused")));
        assert_eq!(
            ErrorChain(&e).to_string(),
            "cannot connect: IO error: refused"
        );
        assert_eq!(ErrorChain(&e).messages().len(), 3);
    }
    use crate::RawEnvelope;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[from] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("reconnecting after: timeout")]
    struct EndsLikeItsSource(#[source] Timeout);

    #[derive(Debug, thiserror::Error)]
    #[error("timeout")]
    struct Timeout;

    #[test]
    fn the_chain_lists_each_error_once() {
        let e = HandlerError::from(Outer(std::io::Error::other("disk full")));
        assert_eq!(e.chain(), ["outer", "disk full"]);
        assert_eq!(e.to_string(), "transient error: outer: disk full");
        let e = Outer(std::io::Error::other("disk full"));
        assert_eq!(ErrorChain(&e).to_string(), "outer: disk full");
        assert_eq!(ErrorChain(&e).messages(), ["outer", "disk full"]);
    }

    /// The walk prints what each error says: a cause is never taken for a repetition of the
    /// message before because that message happens to end like it (the old suffix rule dropped
    /// `timeout` here).
    #[test]
    fn a_cause_is_printed_whatever_the_message_before_ends_with() {
        let e = EndsLikeItsSource(Timeout);
        assert_eq!(
            ErrorChain(&e).messages(),
            ["reconnecting after: timeout", "timeout"]
        );
    }

    /// `Display` of every error here says what failed at its level, never its source's text.
    fn assert_says_its_level_only(e: &(dyn std::error::Error + 'static)) {
        let source = e.source().expect("an error with a source").to_string();
        assert!(
            !e.to_string().contains(&source),
            "`{e}` repeats its source `{source}`"
        );
        let chain = ErrorChain(e).to_string();
        assert_eq!(chain.matches(&source).count(), 1, "{chain}");
    }

    #[test]
    fn decode_errors_do_not_repeat_their_source() {
        let e = RawEnvelope::from_json("{ not json").unwrap_err();
        assert!(matches!(e, DecodeError::Envelope(_)), "{e:?}");
        assert_says_its_level_only(&e);

        let e = DecodeError::Payload {
            name: "order.placed".into(),
            version: 1,
            event_id: uuid::Uuid::nil(),
            source: serde_json::from_str::<u32>("\"seven\"").unwrap_err().into(),
        };
        assert_says_its_level_only(&e);
    }
}

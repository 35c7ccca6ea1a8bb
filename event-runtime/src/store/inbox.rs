//! What each transport inbox consumes, as the broker identifies it (`event_inbox_identity`):
//! recorded on an inbox's first start, compared on every later one, replaced only by an
//! operator's audited adopt. Talks to no broker: the transport reads the broker's side; the
//! SQL is the backend's.

use crate::store::backend::AuditStamp;
use chrono::{DateTime, Utc};

use super::types::AuditEntry;
use super::{now_ms, Store, StoreError};

/// The broker-side identity an inbox consumes from: a stream (or queue) and a durable
/// consumer, each named and stamped with the time the broker created it. A broker that lost
/// its data and had them created again reports other times, so a changed identity is how an
/// inbox notices that messages may never arrive.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct InboxIdentity {
    /// The inbox, as its dead letters name it (`nats-inbox:<durable>`).
    pub inbox: String,
    /// The stream's name.
    pub stream: String,
    /// When the broker created the stream (RFC 3339, as the broker reports it).
    pub stream_created: String,
    /// When the broker created the durable consumer; `None` when the inbox may create it
    /// (adopted while it did not exist).
    pub consumer_created: Option<String>,
    /// When this identity was recorded.
    pub recorded_at: DateTime<Utc>,
}

impl InboxIdentity {
    /// An identity to record now.
    pub fn new(
        inbox: impl Into<String>,
        stream: impl Into<String>,
        stream_created: impl Into<String>,
        consumer_created: Option<String>,
    ) -> Self {
        InboxIdentity {
            inbox: inbox.into(),
            stream: stream.into(),
            stream_created: stream_created.into(),
            consumer_created,
            recorded_at: Utc::now(),
        }
    }

    /// `stream S created T, consumer created U` (or `no consumer yet`), for messages.
    pub fn describe(&self) -> String {
        let consumer = match &self.consumer_created {
            Some(at) => format!("consumer created {at}"),
            None => "no consumer yet".to_owned(),
        };
        format!(
            "stream `{}` created {}, {consumer}",
            self.stream, self.stream_created
        )
    }
}

impl Store {
    /// The identity recorded for `inbox`, if any.
    ///
    /// # Errors
    /// [`StoreError::Database`]; [`StoreError::Corrupt`] for a row of the wrong shape.
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn inbox_identity(&self, inbox: &str) -> Result<Option<InboxIdentity>, StoreError> {
        self.backend.inbox_identity(inbox).await
    }

    /// Records `identity` when its inbox has none yet, or has one without a consumer on the
    /// same stream (the consumer was just created); returns what is recorded afterwards —
    /// another instance's identity when it recorded first, which the caller compares with
    /// its own.
    ///
    /// # Errors
    /// [`StoreError::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: one statement, then a read.
    pub async fn record_inbox_identity(
        &self,
        identity: &InboxIdentity,
    ) -> Result<InboxIdentity, StoreError> {
        self.backend.record_inbox_identity(identity, now_ms()).await
    }

    /// Replaces the identity recorded for `identity.inbox` — an operator accepting a stream or
    /// consumer the broker created anew (`events nats inbox adopt`) — and, in the same
    /// transaction, appends an audit row: action `inbox-adopt`, `actor`, reason
    /// `INBOX: REASON (was: OLD; now: NEW)`. Returns the audit row.
    ///
    /// # Errors
    /// [`StoreError::Database`]; nothing is changed then.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped before its COMMIT, nothing is changed.
    pub async fn adopt_inbox_identity(
        &self,
        identity: &InboxIdentity,
        actor: &str,
        reason: &str,
    ) -> Result<AuditEntry, StoreError> {
        let was = self.inbox_identity(&identity.inbox).await?;
        let was = was.map_or_else(|| "nothing recorded".to_owned(), |w| w.describe());
        let reason = format!(
            "{}: {reason} (was: {was}; now: {})",
            identity.inbox,
            identity.describe()
        );
        self.backend
            .adopt_inbox_identity(identity, &AuditStamp::now(actor, &reason))
            .await
    }

    /// Where the event `event_id` came from, when a transport's inbox received it (see
    /// [`Outbox::receive`](crate::Outbox::receive)); `None` for this service's own events,
    /// for events received before origins were stored (schema v5), and for an id the outbox
    /// does not hold (any more: completed events are purged after the retention).
    ///
    /// # Errors
    /// [`StoreError::Database`]; [`StoreError::Corrupt`] when the stored origin does not
    /// read.
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn received_origin(
        &self,
        event_id: uuid::Uuid,
    ) -> Result<Option<crate::inbox::Origin>, StoreError> {
        self.backend.received_origin(event_id).await
    }
}

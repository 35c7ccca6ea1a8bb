//! What each transport inbox consumes, as the broker identifies it (`event_inbox_identity`):
//! recorded on an inbox's first start, compared on every later one, replaced only by an
//! operator's audited adopt. Talks to no broker: the transport reads the broker's side.

use chrono::{DateTime, Utc};

use super::operator::audit;
use super::types::AuditEntry;
use super::{from_ms, now_ms, Store, StoreError};

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

fn from_row(row: &super::Row) -> Result<InboxIdentity, StoreError> {
    Ok(InboxIdentity {
        inbox: row.get("inbox")?,
        stream: row.get("stream")?,
        stream_created: row.get("stream_created")?,
        consumer_created: row.get("consumer_created")?,
        recorded_at: from_ms(row.get("recorded_at")?),
    })
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
        const SQL: &str = "SELECT inbox, stream, stream_created, consumer_created, recorded_at \
             FROM event_inbox_identity WHERE inbox = $1";
        self.query(SQL)
            .bind(inbox)
            .fetch_optional()
            .await?
            .as_ref()
            .map(from_row)
            .transpose()
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
        const SQL: &str = "INSERT INTO event_inbox_identity \
             (inbox, stream, stream_created, consumer_created, recorded_at) \
             VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (inbox) DO UPDATE SET consumer_created = excluded.consumer_created, \
                 recorded_at = excluded.recorded_at \
             WHERE event_inbox_identity.consumer_created IS NULL \
               AND event_inbox_identity.stream = excluded.stream \
               AND event_inbox_identity.stream_created = excluded.stream_created";
        self.query(SQL)
            .bind(identity.inbox.as_str())
            .bind(identity.stream.as_str())
            .bind(identity.stream_created.as_str())
            .bind(identity.consumer_created.as_deref())
            .bind(now_ms())
            .execute()
            .await?;
        self.inbox_identity(&identity.inbox)
            .await?
            .ok_or_else(|| StoreError::Corrupt("the inbox identity just written is gone".into()))
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
        const SQL: &str = "INSERT INTO event_inbox_identity \
             (inbox, stream, stream_created, consumer_created, recorded_at) \
             VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (inbox) DO UPDATE SET stream = excluded.stream, \
                 stream_created = excluded.stream_created, \
                 consumer_created = excluded.consumer_created, recorded_at = excluded.recorded_at";
        let was = self.inbox_identity(&identity.inbox).await?;
        let now = now_ms();
        let mut tx = self.begin().await?;
        tx.query(SQL)
            .bind(identity.inbox.as_str())
            .bind(identity.stream.as_str())
            .bind(identity.stream_created.as_str())
            .bind(identity.consumer_created.as_deref())
            .bind(now)
            .execute()
            .await?;
        let was = was.map_or_else(|| "nothing recorded".to_owned(), |w| w.describe());
        let entry = audit(
            &mut tx,
            "inbox-adopt",
            actor,
            &format!(
                "{}: {reason} (was: {was}; now: {})",
                identity.inbox,
                identity.describe()
            ),
            now,
        )
        .await?;
        tx.commit().await?;
        Ok(entry)
    }
}

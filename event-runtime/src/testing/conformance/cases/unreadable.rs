//! A pending delivery whose row the engine cannot read (a hand-edited column) is counted as
//! unreadable by the store's statistics, per handler and in all, instead of staying pending
//! silently.

use super::outbox::{commit, count, deposit, outbox, Fail};
use super::Case;
use crate::SqlValue;

pub async fn a_delivery_the_engine_cannot_read_is_counted_as_unreadable(db: &Case) {
    let (effects, edit) = (db.effects_table(), db.unreadable_delivery());
    let (Some(_), Some(edit)) = (effects, edit) else {
        return;
    };
    let label = db.label();
    let outbox = outbox(db).await;
    let edited = commit(&outbox, vec![deposit("unreadable", 1, Fail::Never)])
        .await
        .unwrap()[0];
    commit(&outbox, vec![deposit("readable", 1, Fail::Never)])
        .await
        .unwrap();
    let store = outbox.store();
    let before = store.stats().await.unwrap();
    assert_eq!((before.pending, before.unreadable), (2, 0), "{label}");

    // What an operator's hand-edit leaves: SQLite keeps any value in any column (a text
    // time where the engine writes milliseconds); PostgreSQL enforces the column types, so
    // what is left there is a value the engine never writes (a negative sequence). The
    // backend's fixture says which.
    let mut tx = store.begin().await.unwrap();
    let n = tx
        .execute(edit, &[SqlValue::Text(&edited.to_string())])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(n, 1, "{label}");
    assert_eq!(
        count(
            store,
            "SELECT COUNT(*) FROM event_deliveries WHERE status = 'pending'",
            &[]
        )
        .await,
        2,
        "{label}: still pending"
    );

    let stats = store.stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.unreadable),
        (2, 1),
        "{label}: counted as unreadable, and still as pending"
    );
    let apply = stats
        .handlers
        .iter()
        .find(|h| h.handler == "apply")
        .unwrap();
    assert_eq!((apply.pending, apply.unreadable), (2, 1), "{label}");
}

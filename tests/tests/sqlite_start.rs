//! Several processes starting on a fresh SQLite file at once each migrate it: sqlx's migrator
//! takes no lock there, so the second one's migration met what the first one created (`table
//! event_outbox already exists`, `duplicate column name: kind`) about half the time.

mod common;

use event_runtime::Store;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_opening_a_fresh_sqlite_file_at_once_both_open_it() {
    for i in 0..10 {
        let path = common::temp_dir().join(format!("{}.db", common::unique("fresh_start")));
        let url = format!("sqlite://{}", path.display());
        let (a, b) = tokio::join!(Store::connect(&url), Store::connect(&url));
        for (which, store) in [("first", a), ("second", b)] {
            store.unwrap_or_else(|e| {
                panic!(
                    "try {i}: the {which} store failed: {}",
                    event_core::ErrorChain(&e)
                )
            });
        }
    }
}

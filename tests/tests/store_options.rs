//! Connection options that cannot work are refused with `StoreError::InvalidOption` before
//! anything is created: a pool of no connections (it panicked inside sqlx), a PostgreSQL schema
//! name `search_path` cannot hold (the schema was created, then the connection failed).

mod common;

use event_runtime::{ConnectOptions, Store, StoreError};

fn assert_invalid(result: Result<Store, StoreError>, option: &str, says: &str) {
    match result {
        Err(e @ StoreError::InvalidOption { option: o, .. }) if o == option => {
            assert!(e.to_string().contains(says), "{e}");
        }
        other => panic!("expected InvalidOption {option}, got {other:?}"),
    }
}

#[tokio::test]
async fn a_pool_of_no_connections_is_refused() {
    let url = common::sqlite_url("no_connections");
    let options = ConnectOptions::default().max_connections(0);
    assert_invalid(
        Store::connect_with(&url, &options).await,
        "max_connections",
        "at least one connection",
    );
}

#[tokio::test]
async fn a_schema_name_search_path_cannot_hold_is_refused_and_nothing_is_created() {
    let Some(url) = common::postgres_url("bad_schema_names") else {
        return;
    };
    let long = "s".repeat(64);
    for (schema, says) in [
        ("", "cannot be empty"),
        ("bad\"; drop", "double quote"),
        ("a,b", "comma"),
        (long.as_str(), "63 bytes"),
    ] {
        assert_invalid(
            event_runtime::store::postgres::connect_in_schema(&url, schema).await,
            "schema",
            says,
        );
    }
    // None of them was created.
    let store = Store::connect_with(
        &url,
        &ConnectOptions::default().schema(common::unique("bad_schema_probe")),
    )
    .await
    .unwrap();
    let created: i64 = store
        .query("SELECT COUNT(*) AS n FROM pg_namespace WHERE nspname IN ('bad\"; drop', 'a,b')")
        .fetch_one()
        .await
        .unwrap()
        .get("n")
        .unwrap();
    assert_eq!(created, 0);
    store.close().await;
}

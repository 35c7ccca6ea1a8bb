//! The conformance suite of the store boundary and the delivery engine
//! (`event_runtime::testing::conformance`), run by every backend of this repository: SQLite
//! always, PostgreSQL against the real server of `EVENTS_TEST_POSTGRES_URL` (skipped, and said
//! so, without it). A backend adds a set-up and one line.

mod common;

use event_runtime::testing::conformance::{SqlFixtures, TestDatabase};
use event_runtime::ConnectOptions;

/// A fresh SQLite file.
async fn sqlite(case: &str) -> Option<TestDatabase> {
    Some(TestDatabase::connect(
        "sqlite",
        common::sqlite_url(case),
        ConnectOptions::default(),
        SqlFixtures::SQLITE,
    ))
}

/// A fresh schema of the PostgreSQL server of `EVENTS_TEST_POSTGRES_URL`; `None` (said once
/// per test binary) when it is not set.
async fn postgres(case: &str) -> Option<TestDatabase> {
    let url = common::postgres_url(case)?;
    Some(TestDatabase::connect(
        "postgres",
        url,
        ConnectOptions::default().schema(common::unique(case)),
        SqlFixtures::POSTGRES,
    ))
}

event_runtime::conformance_suite!(sqlite, sqlite);
event_runtime::conformance_suite!(postgres, postgres);

//! The conformance suite of the store boundary and the delivery engine (`conformance/`), run by
//! every backend: SQLite always, PostgreSQL against the real server of
//! `EVENTS_TEST_POSTGRES_URL` (skipped, and said so, without it). A new backend adds one line.

mod common;
mod conformance;

conformance_suite!(sqlite, crate::conformance::sqlite);
conformance_suite!(postgres, crate::conformance::postgres);

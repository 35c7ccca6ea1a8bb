//! Tests of `event-core` and its macros; everything is under `tests/`.

//! Runnable programs for the domain-events framework.
//!
//! The example binaries under `examples/` are thin: each parses its arguments and calls the
//! library part here, so that the integration tests run the same code in-process.
//!
//! - [`orders`]: the main job. Replays a public retail data set (Superstore orders) through an
//!   `Order` aggregate, a unit of work per command, and six handlers (projections and a
//!   confirmation sender), with simulated at-least-once redelivery.
//!   Run it with `cargo run --release --example orders`.
#![warn(missing_docs, unreachable_pub)]

pub mod orders;

//! The macros' output compiles without a warning under strict lints, as part of a crate
//! whose public API is documented: users who deny warnings are not broken by it.
#![deny(
    warnings,
    missing_docs,
    unreachable_pub,
    unused_qualifications,
    unused_results,
    clippy::all,
    clippy::pedantic
)]

/// Events and handlers of the order context, as a domain crate would declare them.
pub mod orders {
    use std::sync::atomic::{AtomicU64, Ordering};

    use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
    use serde::{Deserialize, Serialize};

    /// An order was placed, as first recorded: without a total.
    #[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
    #[event(name = "order.placed", version = 1)]
    pub struct OrderPlacedV1 {
        /// The order.
        #[event(aggregate_id)]
        pub order_id: String,
    }

    /// An order was placed.
    #[derive(Debug, Serialize, Deserialize, DomainEvent)]
    #[event(
        name = "order.placed",
        version = 2,
        aggregate = "order",
        upcast_from = OrderPlacedV1,
        deny_unknown_fields
    )]
    pub struct OrderPlaced {
        /// The order.
        #[event(aggregate_id)]
        pub order_id: String,
        /// Total, in cents.
        pub total_cents: u64,
    }

    impl From<OrderPlacedV1> for OrderPlaced {
        fn from(v1: OrderPlacedV1) -> Self {
            OrderPlaced {
                order_id: v1.order_id,
                total_cents: 0,
            }
        }
    }

    /// A resource: counts what was placed.
    #[derive(Debug, Default)]
    pub struct Revenue(pub AtomicU64);

    /// The open transaction.
    #[derive(Debug, Default)]
    pub struct Tx {
        /// Rows written.
        pub rows: Vec<String>,
    }

    /// Adds the order to the revenue.
    #[event_handler(priority = -1)]
    pub fn add_revenue(event: &OrderPlaced, revenue: &Revenue) {
        let _ = revenue.0.fetch_add(event.total_cents, Ordering::Relaxed);
    }

    /// Projects the order inside the unit of work's transaction.
    ///
    /// # Errors
    /// Never; the signature shows the permanent error a projection would return.
    #[event_handler(in_transaction, name = "orders.project")]
    pub async fn project(event: &Envelope<OrderPlaced>, tx: &mut Tx) -> Result<(), HandlerError> {
        std::future::ready(()).await;
        tx.rows.push(event.aggregate_id().to_owned());
        Ok(())
    }

    // A private handler: neither it nor its marker type may be reported as dead code.
    #[event_handler]
    fn audit(event: &OrderPlaced) -> Result<(), std::io::Error> {
        if event.order_id.is_empty() {
            return Err(std::io::Error::other("empty order id"));
        }
        Ok(())
    }

    pub(crate) mod internal {
        use super::OrderPlaced;
        use event_core::event_handler;

        // A crate-visible handler in a private module.
        #[event_handler(priority = 5)]
        pub(crate) fn note(event: &OrderPlaced) {
            let _ = event;
        }
    }
}

#[test]
fn generated_code_is_lint_clean() {
    let names: Vec<_> = event_core::registered_handlers().map(|h| h.name).collect();
    assert!(names.contains(&"orders.project"), "{names:?}");
    assert_eq!(names.len(), 4, "{names:?}");
}

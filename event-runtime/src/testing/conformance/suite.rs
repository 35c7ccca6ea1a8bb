//! [`conformance_suite!`](crate::conformance_suite): one test per case.

/// Declares the [conformance suite](crate::testing::conformance) of a store backend:
/// `conformance_suite!(name, set_up)` expands to a module `name` with one `#[tokio::test]`
/// per case, each calling `set_up` with the case's name for a fresh
/// [`TestDatabase`](crate::testing::conformance::TestDatabase) (`None`: the case is skipped).
///
/// `set_up` is an `async fn(&str) -> Option<TestDatabase>` in scope where the macro is
/// invoked, or an absolute path (`crate::backends::open`). The tests run on tokio's
/// multi-threaded runtime, through this crate's re-export: the calling crate needs neither
/// tokio's macros nor anything else than `event-runtime` with the feature `testing`.
///
/// See [the module documentation](crate::testing::conformance) for an example, what the
/// set-up returns, and what each family of cases proves.
#[macro_export]
macro_rules! conformance_suite {
    ($backend:ident, $set_up:path $(,)?) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;
            use $crate::testing::conformance::cases::tokio as __conformance_tokio;

            $crate::conformance_suite!(@cases $set_up;
                outbox::committed_events_are_delivered_once_with_their_effects,
                outbox::an_in_transaction_failure_rolls_back_state_outbox_and_deliveries,
                outbox::appending_an_event_id_twice_has_one_effect,
                outbox::a_second_commit_of_the_same_aggregate_sequence_is_a_conflict,
                outbox::transient_failures_and_panics_are_retried_and_their_effects_rolled_back,
                outbox::permanent_and_exhausted_failures_go_to_the_dead_letter_queue_untouched,
                outbox::replay_keeps_the_event_id_resets_attempts_and_is_audited,
                outbox::later_events_of_an_aggregate_wait_for_a_dead_lettered_earlier_one,
                outbox::purging_a_dead_letter_lets_the_aggregate_flow_and_is_audited,
                outbox::unknown_event_types_and_undecodable_payloads_are_dead_lettered_with_the_reason,
                outbox::workers_deliver_in_the_background_and_shut_down_gracefully,
                outbox::an_expired_lease_is_claimed_again_and_a_live_one_is_not,
                outbox::an_unordered_handler_is_not_held_back_by_a_dead_letter,
                outbox::a_process_without_a_handler_leaves_its_deliveries_to_one_that_has_it,
                crash::crash_before_commit,
                crash::crash_after_commit_before_delivery,
                catalog::the_catalog_is_recorded_by_name_and_version_and_replaced,
                crash::crash_during_a_handler,
                crash::crash_after_the_handlers_before_completion,
                engine::a_handler_slower_than_the_lease_is_not_taken_over_by_other_workers,
                engine::a_worker_that_lost_its_lease_records_nothing_and_undoes_only_what_was_taken_over,
                engine::a_handler_without_a_transaction_does_not_hold_back_application_writes,
                engine::handlers_without_a_transaction_run_concurrently_across_aggregates,
                engine::a_claim_takes_a_whole_run_of_one_aggregate,
                engine::a_failing_head_uses_no_attempt_of_the_run_behind_it,
                engine::a_handler_over_its_time_limit_is_retried,
                engine::a_statement_over_the_time_limit_is_stopped_in_the_database,
                engine::an_error_message_with_nul_is_stored_and_the_rest_of_the_batch_completes,
                engine::an_outcome_the_database_refuses_is_dead_lettered_alone,
                engine::a_conflict_names_the_rejected_event,
                engine::a_paused_destination_is_not_claimed_and_uses_no_attempts,
                engine::an_unavailable_destination_pauses_itself_until_it_is_back,
                engine::workers_stop_with_the_applications_cancellation_token,
                engine::an_aborted_shutdown_gives_its_deliveries_back_at_once,
                failure_times::a_retry_is_never_due_before_its_recorded_failure,
                retention::retention_purges_old_rows_in_bounded_steps_and_nothing_else,
                retarget::purging_an_unregistered_handler_removes_only_its_rows_and_is_audited,
                retarget::retargeting_onto_a_union_handler_merges_runs_in_order_and_skips_duplicates,
                retarget::purging_or_retargeting_is_refused_for_live_or_unknown_handlers,
                retarget::retargeting_in_pages_resumes_after_an_interruption_with_one_head_per_run,
                retarget::retargeting_onto_an_unordered_handler_makes_each_delivery_ready,
                unreadable::a_delivery_the_engine_cannot_read_is_counted_as_unreadable,
            );
        }
    };
    (@cases $set_up:path; $($family:ident :: $case:ident),* $(,)?) => {
        $(
            #[__conformance_tokio::test(
                crate = "__conformance_tokio",
                flavor = "multi_thread",
                worker_threads = 2
            )]
            async fn $case() {
                let db: ::core::option::Option<$crate::testing::conformance::TestDatabase> =
                    $set_up(::core::stringify!($case)).await;
                if let ::core::option::Option::Some(db) = db {
                    let case =
                        $crate::testing::conformance::cases::Case::new(::core::stringify!($case), db);
                    $crate::testing::conformance::cases::$family::$case(&case).await;
                }
            }
        )*
    };
}

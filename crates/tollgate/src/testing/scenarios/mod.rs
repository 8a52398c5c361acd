//! The limiter behaviour scenarios (spec-shards-windows-quotas.md §5, history-and-scenarios.md
//! §5.2), as functions over a [`Backend`](super::Backend).

pub mod basics;
pub mod sharded;

/// Generate one `#[tokio::test]` per limiter behaviour scenario, on `$backend`
/// (an expression of type [`Backend`](crate::testing::Backend)).
#[macro_export]
macro_rules! scenario_tests {
    ($backend:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s01_refill_through_the_limiter() {
            $crate::testing::scenarios::basics::s01_refill_through_the_limiter(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s04_fast_path_composes_with_slow_path() {
            $crate::testing::scenarios::basics::s04_fast_path_composes_with_slow_path(&$backend)
                .await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s05_retry_touches_only_balances() {
            $crate::testing::scenarios::basics::s05_retry_touches_only_balances(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s06_adjust_and_rollback() {
            $crate::testing::scenarios::basics::s06_adjust_and_rollback(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s07_zero_estimate_lease() {
            $crate::testing::scenarios::basics::s07_zero_estimate_lease(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn l4_zero_estimates_both_paths() {
            $crate::testing::scenarios::basics::l4_zero_estimates_both_paths(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn l1_l2_lease_operations() {
            $crate::testing::scenarios::basics::l1_l2_lease_operations(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn dropped_lease_keeps_its_debit_only() {
            $crate::testing::scenarios::basics::dropped_lease_keeps_its_debit_only(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn l3_lost_lock_retries_consumption_only() {
            $crate::testing::scenarios::basics::l3_lost_lock_retries_consumption_only(&$backend)
                .await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s08_refund_above_ceiling_is_clamped() {
            $crate::testing::scenarios::basics::s08_refund_above_ceiling_is_clamped(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn reset_is_a_set_despite_a_concurrent_refund() {
            $crate::testing::scenarios::basics::reset_is_a_set_despite_a_concurrent_refund(
                &$backend,
            )
            .await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s09_fast_condition_set() {
            $crate::testing::scenarios::basics::s09_fast_condition_set(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s10_wcu_accounting() {
            $crate::testing::scenarios::basics::s10_wcu_accounting(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s19_create_marks() {
            $crate::testing::scenarios::basics::s19_create_marks(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s20_zero_token_anchor() {
            $crate::testing::scenarios::basics::s20_zero_token_anchor(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s21_s24_half_open_end() {
            $crate::testing::scenarios::basics::s21_s24_half_open_end(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s22_idle_restart() {
            $crate::testing::scenarios::basics::s22_idle_restart(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s23_rejection_does_not_anchor() {
            $crate::testing::scenarios::basics::s23_rejection_does_not_anchor(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s25_retry_after_and_resets_at() {
            $crate::testing::scenarios::basics::s25_retry_after_and_resets_at(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s26_ttl_horizon() {
            $crate::testing::scenarios::basics::s26_ttl_horizon(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn calendar_reset_across_dst() {
            $crate::testing::scenarios::basics::calendar_reset_across_dst(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn request_counts() {
            $crate::testing::scenarios::basics::request_counts(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn bad_input_is_refused() {
            $crate::testing::scenarios::basics::bad_input_is_refused(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn corrupt_item_names_the_attribute() {
            $crate::testing::scenarios::basics::corrupt_item_names_the_attribute(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn limit_levels_and_param_sync() {
            $crate::testing::scenarios::basics::limit_levels_and_param_sync(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s38_fanout_write_shape() {
            $crate::testing::scenarios::sharded::s38_fanout_write_shape(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s43_fanout_touches_no_balance() {
            $crate::testing::scenarios::sharded::s43_fanout_touches_no_balance(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s45_roll_target() {
            $crate::testing::scenarios::sharded::s45_roll_target(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s40_lost_fanout() {
            $crate::testing::scenarios::sharded::s40_lost_fanout(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s42_s44_fanout_floor_and_deleted_sibling() {
            $crate::testing::scenarios::sharded::s42_s44_fanout_floor_and_deleted_sibling(&$backend)
                .await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s47_burnt_shard_still_rolls() {
            $crate::testing::scenarios::sharded::s47_burnt_shard_still_rolls(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s49_retry_that_lost_the_lock_is_charged() {
            $crate::testing::scenarios::sharded::s49_retry_that_lost_the_lock_is_charged(&$backend)
                .await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s54_backward_rf() {
            $crate::testing::scenarios::sharded::s54_backward_rf(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s58_unmarked_fallback() {
            $crate::testing::scenarios::sharded::s58_unmarked_fallback(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s59_migration_marks_without_rolling() {
            $crate::testing::scenarios::sharded::s59_migration_marks_without_rolling(&$backend)
                .await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s61_wa_is_a_value() {
            $crate::testing::scenarios::sharded::s61_wa_is_a_value(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s62_rf_monotonic() {
            $crate::testing::scenarios::sharded::s62_rf_monotonic(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s64_fast_path_projection() {
            $crate::testing::scenarios::sharded::s64_fast_path_projection(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s27_s28_join_by_move() {
            $crate::testing::scenarios::sharded::s27_s28_join_by_move(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s29_no_sibling_window() {
            $crate::testing::scenarios::sharded::s29_no_sibling_window(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s30_s31_sibling_window_ended() {
            $crate::testing::scenarios::sharded::s30_s31_sibling_window_ended(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s65_seed_joins_live_window() {
            $crate::testing::scenarios::sharded::s65_seed_joins_live_window(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn q1_q2_q3_q7_splits() {
            $crate::testing::scenarios::sharded::q1_q2_q3_q7_splits(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn q4_exact_reset() {
            $crate::testing::scenarios::sharded::q4_exact_reset(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn q10_rejected_acquire_keeps_the_move() {
            $crate::testing::scenarios::sharded::q10_rejected_acquire_keeps_the_move(&$backend)
                .await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn q12_lost_move_replanned() {
            $crate::testing::scenarios::sharded::q12_lost_move_replanned(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s76_conservation_walk() {
            $crate::testing::scenarios::sharded::s76_conservation_walk(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s12_s14_s15_doubling() {
            $crate::testing::scenarios::sharded::s12_s14_s15_doubling(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s11_no_doubling_for_app_limits() {
            $crate::testing::scenarios::sharded::s11_no_doubling_for_app_limits(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s13_concurrent_doublers() {
            $crate::testing::scenarios::sharded::s13_concurrent_doublers(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s16_create_race() {
            $crate::testing::scenarios::sharded::s16_create_race(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s17_s5_shard_probes() {
            $crate::testing::scenarios::sharded::s17_s5_shard_probes(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s6_wcu_is_invisible() {
            $crate::testing::scenarios::sharded::s6_wcu_is_invisible(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s9_gsi3_discovery() {
            $crate::testing::scenarios::sharded::s9_gsi3_discovery(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s10_refill_recovery() {
            $crate::testing::scenarios::sharded::s10_refill_recovery(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s11_dripping_on_new_shard() {
            $crate::testing::scenarios::sharded::s11_dripping_on_new_shard(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s18_random_selection() {
            $crate::testing::scenarios::sharded::s18_random_selection(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn entity_wide_statuses() {
            $crate::testing::scenarios::sharded::entity_wide_statuses(&$backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn doubling_clamps_old_shards_to_the_new_share() {
            $crate::testing::scenarios::sharded::doubling_clamps_old_shards_to_the_new_share(
                &$backend,
            )
            .await
        }
    };
}

//! The limiter behaviour scenarios (spec-shards-windows-quotas.md §5, history-and-scenarios.md
//! §5.2), as functions over a [`Backend`](super::Backend).

pub mod aggregator;
pub mod basics;
pub mod cascade;
pub mod exactness;
pub mod gaps;
pub mod repair;
pub mod schedules;
pub mod sharded;

/// Generate one `#[tokio::test]` per limiter behaviour scenario, on `$backend`: an
/// expression of type `Option<`[`Backend`](crate::testing::Backend)`>` (`None` skips, for a
/// backend whose server is deliberately not available).
#[macro_export]
macro_rules! scenario_tests {
    ($backend:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn idle_burst_admits_capacity_plus_refill() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::exactness::idle_burst_admits_capacity_plus_refill(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn statuses_report_the_balance_after_the_debit() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::exactness::statuses_report_the_balance_after_the_debit(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn over_refund_is_refused() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::exactness::over_refund_is_refused(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_request_larger_than_one_share_is_admitted() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::exactness::a_request_larger_than_one_share_is_admitted(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn lease_debt_is_not_absorbed_by_refill() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::exactness::lease_debt_is_not_absorbed_by_refill(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn debt_on_one_shard_holds_back_its_siblings() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::exactness::debt_on_one_shard_holds_back_its_siblings(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_refusal_never_says_it_would_fit() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::exactness::a_refusal_never_says_it_would_fit(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_doubling_mints_nothing() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::exactness::a_doubling_mints_nothing(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s01_refill_through_the_limiter() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::s01_refill_through_the_limiter(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s04_fast_path_composes_with_slow_path() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::s04_fast_path_composes_with_slow_path(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s05_retry_touches_only_balances() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::s05_retry_touches_only_balances(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s06_adjust_and_rollback() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::s06_adjust_and_rollback(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s07_zero_estimate_lease() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::s07_zero_estimate_lease(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn l4_zero_estimates_both_paths() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::l4_zero_estimates_both_paths(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn l1_l2_lease_operations() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::l1_l2_lease_operations(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn dropped_lease_keeps_its_debit_only() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::dropped_lease_keeps_its_debit_only(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn l3_lost_lock_retries_consumption_only() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::l3_lost_lock_retries_consumption_only(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s08_refund_above_ceiling_is_clamped() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::s08_refund_above_ceiling_is_clamped(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn reset_is_a_set_despite_a_concurrent_refund() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::reset_is_a_set_despite_a_concurrent_refund(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn refund_after_a_reset_stays_in_its_period() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::refund_after_a_reset_stays_in_its_period(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s09_fast_condition_set() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::s09_fast_condition_set(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s09_disabled_refuses_without_slow_path() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::s09_disabled_refuses_without_slow_path(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s10_wcu_accounting() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::s10_wcu_accounting(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s19_create_marks() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::s19_create_marks(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s20_zero_token_anchor() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::s20_zero_token_anchor(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s21_s24_half_open_end() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::s21_s24_half_open_end(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s22_idle_restart() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::s22_idle_restart(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s23_rejection_does_not_anchor() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::s23_rejection_does_not_anchor(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s25_retry_after_and_resets_at() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::s25_retry_after_and_resets_at(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s26_ttl_horizon() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::s26_ttl_horizon(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn calendar_reset_across_dst() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::calendar_reset_across_dst(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn request_counts() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::request_counts(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn bad_input_is_refused() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::bad_input_is_refused(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn corrupt_item_names_the_attribute() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::corrupt_item_names_the_attribute(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn doctor_lists_and_limits_set_replaces() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::repair::doctor_lists_and_limits_set_replaces(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn entity_delete_removes_a_corrupt_entity() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::repair::entity_delete_removes_a_corrupt_entity(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn repairs_over_items_the_store_cannot_decode() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::repair::repairs_over_items_the_store_cannot_decode(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn doctor_finds_nothing_in_sound_items() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::repair::doctor_finds_nothing_in_sound_items(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn doctor_repair_deletes_every_shard() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::repair::doctor_repair_deletes_every_shard(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn limit_levels_and_param_sync() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::basics::limit_levels_and_param_sync(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s38_fanout_write_shape() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s38_fanout_write_shape(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s43_fanout_touches_no_balance() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s43_fanout_touches_no_balance(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s45_roll_target() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s45_roll_target(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s40_lost_fanout() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s40_lost_fanout(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s42_s44_fanout_floor_and_deleted_sibling() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s42_s44_fanout_floor_and_deleted_sibling(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s47_burnt_shard_still_rolls() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s47_burnt_shard_still_rolls(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s49_retry_that_lost_the_lock_is_charged() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s49_retry_that_lost_the_lock_is_charged(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s54_backward_rf() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s54_backward_rf(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s58_unmarked_fallback() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s58_unmarked_fallback(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s59_migration_marks_without_rolling() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s59_migration_marks_without_rolling(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s61_wa_is_a_value() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s61_wa_is_a_value(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s62_rf_monotonic() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s62_rf_monotonic(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s64_fast_path_projection() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s64_fast_path_projection(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s27_s28_join_by_move() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s27_s28_join_by_move(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s29_no_sibling_window() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s29_no_sibling_window(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s30_s31_sibling_window_ended() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s30_s31_sibling_window_ended(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s65_seed_joins_live_window() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s65_seed_joins_live_window(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn q1_q2_q3_q7_splits() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::q1_q2_q3_q7_splits(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn q4_exact_reset() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::q4_exact_reset(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn q10_rejected_acquire_keeps_the_move() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::q10_rejected_acquire_keeps_the_move(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn q12_lost_move_replanned() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::q12_lost_move_replanned(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn q14_reset_losing_its_pin() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::q14_reset_losing_its_pin(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn q15_create_overtaken_by_a_doubling() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::q15_create_overtaken_by_a_doubling(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s76_conservation_walk() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s76_conservation_walk(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s12_s14_s15_doubling() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s12_s14_s15_doubling(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s11_no_doubling_for_app_limits() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s11_no_doubling_for_app_limits(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s13_concurrent_doublers() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s13_concurrent_doublers(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s16_create_race() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s16_create_race(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s17_s5_shard_probes() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s17_s5_shard_probes(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s6_wcu_is_invisible() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s6_wcu_is_invisible(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s9_gsi3_discovery() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s9_gsi3_discovery(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s10_refill_recovery() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s10_refill_recovery(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s11_dripping_on_new_shard() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s11_dripping_on_new_shard(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s18_random_selection() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s18_random_selection(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn entity_wide_statuses() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::entity_wide_statuses(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn doubling_clamps_old_shards_to_the_new_share() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::doubling_clamps_old_shards_to_the_new_share(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn stagger_join_newest_live_start() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::stagger_join_newest_live_start(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn stagger_dead_cover_grants_nothing() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::stagger_dead_cover_grants_nothing(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s35_corrupt_sibling_ws() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::s35_corrupt_sibling_ws(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn two_quotas_move_from_one_donor() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::sharded::two_quotas_move_from_one_donor(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s81_daily_quota_at_midnight() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::gaps::s81_daily_quota_at_midnight(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s79_ceiling_until_reset() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::gaps::s79_ceiling_until_reset(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s55_s56_old_writer_stamps_both_ways() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::gaps::s55_s56_old_writer_stamps_both_ways(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn w13_when_the_fanout_runs() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::gaps::w13_when_the_fanout_runs(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn w18_reporting() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::gaps::w18_reporting(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn w12_windows_at_the_write() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::gaps::w12_windows_at_the_write(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn q5_walk_with_spending() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::gaps::q5_walk_with_spending(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn q11_transaction_conflicts() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::gaps::q11_transaction_conflicts(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s52_clone_of_a_pending_shard_restarts_the_snapshot() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::aggregator::s52_clone_of_a_pending_shard_restarts_the_snapshot(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s53_w11_clone_of_an_unapplied_shard_rolls_to_one_allowance() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::aggregator::s53_w11_clone_of_an_unapplied_shard_rolls_to_one_allowance(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s54_aggregator_leaves_a_backward_rf_alone() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::aggregator::s54_aggregator_leaves_a_backward_rf_alone(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s60_aggregator_marks_an_unmarked_roll() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::aggregator::s60_aggregator_marks_an_unmarked_roll(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s80_proactive_doubling_walk_with_clones() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::aggregator::s80_proactive_doubling_walk_with_clones(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn q9_seed_racing_a_doubling_and_a_clone() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::aggregator::q9_seed_racing_a_doubling_and_a_clone(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn aggregator_roll_pinned_on_ws() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::aggregator::aggregator_roll_pinned_on_ws(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn aggregator_refill_pinned_on_rf() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::aggregator::aggregator_refill_pinned_on_rf(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn aggregator_reset_pinned_on_the_shard_count() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::aggregator::aggregator_reset_pinned_on_the_shard_count(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn aggregator_reset_is_a_set_despite_a_concurrent_refund() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::aggregator::aggregator_reset_is_a_set_despite_a_concurrent_refund(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn aggregator_skips_an_item_whose_pending_window_ended() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::aggregator::aggregator_skips_an_item_whose_pending_window_ended(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn aggregator_restamp_pinned_on_vu() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::aggregator::aggregator_restamp_pinned_on_vu(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s33_w6_cascade_windows_anchor_independently() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::cascade::s33_w6_cascade_windows_anchor_independently(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn q13_cascade_quota_shards() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::cascade::q13_cascade_quota_shards(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn c2_parent_draws_its_own_shard() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::cascade::c2_parent_draws_its_own_shard(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn c3_s115_policy_walk() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::cascade::c3_s115_policy_walk(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn c4_no_grandparent_and_disabled_parent() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::cascade::c4_no_grandparent_and_disabled_parent(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn cascade_parent_short_charges_no_child() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::cascade::cascade_parent_short_charges_no_child(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn cascade_lease_rollback_restores_both() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::cascade::cascade_lease_rollback_restores_both(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn cascade_child_undo_survives_a_throttle() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::cascade::cascade_child_undo_survives_a_throttle(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s85_scheduled_capacity_at_a_boundary() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::schedules::s85_scheduled_capacity_at_a_boundary(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s85_boundary_divides_after_the_schedule() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::schedules::s85_boundary_divides_after_the_schedule(&b).await
            }
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn s85_schedule_change_syncs() {
            if let Some(b) = $backend {
                $crate::testing::scenarios::schedules::s85_schedule_change_syncs(&b).await
            }
        }
    };
}

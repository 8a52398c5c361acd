//! The limiter behaviour scenarios (spec-shards-windows-quotas.md §5, history-and-scenarios.md
//! §5.2), as functions over a [`Backend`](super::Backend).

pub mod aggregator;
pub mod audit;
pub mod basics;
pub mod bypass;
pub mod cascade;
pub mod exactness;
pub mod gaps;
pub mod limits_file;
pub mod merge;
pub mod modes;
pub mod multi;
pub mod namespaces;
pub mod operator;
pub mod outage;
pub mod repair;
pub mod schedules;
pub mod sharded;
pub mod shared_leases;
pub mod soft;
pub mod usage;
pub mod usage_commit;

/// Generate one `#[tokio::test]` per limiter behaviour scenario, on `$backend`: an
/// expression of type `Option<`[`Backend`](crate::testing::Backend)`>` (`None` skips, for a
/// backend whose server is deliberately not available).
#[macro_export]
macro_rules! scenario_tests {
    ($backend:expr) => {
        $crate::__scenario_tests!($backend;
            limits_file::a_file_plans_against_the_store_and_applies_exactly,
            limits_file::a_corrupt_level_is_named_by_the_plan,
            repair::doctor_lists_and_limits_set_replaces,
            repair::entity_delete_removes_a_corrupt_entity,
            repair::repairs_over_items_the_store_cannot_decode,
            repair::doctor_finds_nothing_in_sound_items,
            repair::doctor_repair_deletes_every_shard,
            shared_leases::shared_lease_commits_on_a_second_limiter,
            shared_leases::shared_rollback_refunds_once,
            shared_leases::resumed_leases_write_what_the_granting_limiter_would,
            shared_leases::shared_cascade_lease_closes_both_once,
            shared_leases::shared_lease_over_several_shards_rolls_back,
            shared_leases::bad_lease_tokens_are_typed_errors,
            shared_leases::a_close_that_fails_after_its_record,
            shared_leases::an_ambiguous_record_is_recognised_as_its_own,
            shared_leases::late_closes_of_shared_leases,
            shared_leases::closure_records_are_purged_after_their_ttl,
            shared_leases::resumed_sharded_leases_write_what_the_granting_limiter_would,
            shared_leases::resumed_refund_to_a_shard_in_debt_repays_the_entity,
            outage::a_hung_store_fails_within_its_deadline,
            outage::a_hung_store_answers_a_queue_of_writers_within_its_deadline,
            outage::a_misconfigured_store_never_fails_open,
            outage::limits_and_policy_outlive_the_config_ttl,
            exactness::idle_burst_admits_capacity_plus_refill,
            exactness::statuses_report_the_balance_after_the_debit,
            exactness::over_refund_is_refused,
            exactness::a_request_larger_than_one_share_is_admitted,
            exactness::lease_debt_is_not_absorbed_by_refill,
            exactness::debt_on_one_shard_holds_back_its_siblings,
            exactness::a_refusal_never_says_it_would_fit,
            exactness::a_doubling_mints_nothing,
            basics::s01_refill_through_the_limiter,
            basics::s04_fast_path_composes_with_slow_path,
            basics::s05_retry_touches_only_balances,
            basics::s06_adjust_and_rollback,
            basics::s07_zero_estimate_lease,
            basics::l4_zero_estimates_both_paths,
            basics::l1_l2_lease_operations,
            basics::dropped_lease_keeps_its_debit_only,
            basics::l3_lost_lock_retries_consumption_only,
            basics::concurrent_writers_of_one_shard_write_once_each,
            basics::a_horizon_passed_before_the_write_costs_one_write,
            basics::s08_refund_above_ceiling_is_clamped,
            basics::reset_is_a_set_despite_a_concurrent_refund,
            basics::refund_after_a_reset_stays_in_its_period,
            basics::s09_fast_condition_set,
            basics::s09_disabled_refuses_without_slow_path,
            basics::s10_wcu_accounting,
            basics::s19_create_marks,
            basics::s20_zero_token_anchor,
            basics::s21_s24_half_open_end,
            basics::s22_idle_restart,
            basics::s23_rejection_does_not_anchor,
            basics::s25_retry_after_and_resets_at,
            basics::s26_ttl_horizon,
            basics::calendar_reset_across_dst,
            basics::request_counts,
            basics::bad_input_is_refused,
            basics::corrupt_item_names_the_attribute,
            basics::limit_levels_and_param_sync,
            sharded::s38_fanout_write_shape,
            sharded::s43_fanout_touches_no_balance,
            sharded::s45_roll_target,
            sharded::s40_lost_fanout,
            sharded::s42_s44_fanout_floor_and_deleted_sibling,
            sharded::s47_burnt_shard_still_rolls,
            sharded::s49_retry_that_lost_the_lock_is_charged,
            sharded::s54_backward_rf,
            sharded::s58_unmarked_fallback,
            sharded::s59_migration_marks_without_rolling,
            sharded::s61_wa_is_a_value,
            sharded::s62_rf_monotonic,
            sharded::s64_fast_path_projection,
            sharded::s27_s28_join_by_move,
            sharded::s29_no_sibling_window,
            sharded::s30_s31_sibling_window_ended,
            sharded::s65_seed_joins_live_window,
            sharded::q1_q2_q3_q7_splits,
            sharded::q4_exact_reset,
            sharded::q10_rejected_acquire_keeps_the_move,
            sharded::q12_lost_move_replanned,
            sharded::q14_reset_losing_its_pin,
            sharded::q15_create_overtaken_by_a_doubling,
            sharded::s76_conservation_walk,
            sharded::s12_s14_s15_doubling,
            sharded::s11_no_doubling_for_app_limits,
            sharded::s13_concurrent_doublers,
            sharded::s16_create_race,
            sharded::s17_s5_shard_probes,
            sharded::s6_wcu_is_invisible,
            sharded::s9_gsi3_discovery,
            sharded::s10_refill_recovery,
            sharded::s11_dripping_on_new_shard,
            sharded::s18_random_selection,
            sharded::entity_wide_statuses,
            sharded::doubling_clamps_old_shards_to_the_new_share,
            sharded::stagger_join_newest_live_start,
            sharded::stagger_dead_cover_grants_nothing,
            sharded::s35_corrupt_sibling_ws,
            sharded::two_quotas_move_from_one_donor,
            gaps::s81_daily_quota_at_midnight,
            gaps::s79_ceiling_until_reset,
            gaps::s55_s56_old_writer_stamps_both_ways,
            gaps::w13_when_the_fanout_runs,
            gaps::w18_reporting,
            gaps::w12_windows_at_the_write,
            gaps::q5_walk_with_spending,
            gaps::q11_transaction_conflicts,
            aggregator::s52_clone_of_a_pending_shard_restarts_the_snapshot,
            aggregator::s53_w11_clone_of_an_unapplied_shard_rolls_to_one_allowance,
            aggregator::s54_aggregator_leaves_a_backward_rf_alone,
            aggregator::s60_aggregator_marks_an_unmarked_roll,
            aggregator::s80_proactive_doubling_walk_with_clones,
            aggregator::q9_seed_racing_a_doubling_and_a_clone,
            aggregator::aggregator_roll_pinned_on_ws,
            aggregator::aggregator_refill_pinned_on_rf,
            aggregator::aggregator_reset_pinned_on_the_shard_count,
            aggregator::aggregator_reset_is_a_set_despite_a_concurrent_refund,
            aggregator::aggregator_skips_an_item_whose_pending_window_ended,
            aggregator::aggregator_restamp_pinned_on_vu,
            cascade::s33_w6_cascade_windows_anchor_independently,
            cascade::q13_cascade_quota_shards,
            cascade::c2_parent_draws_its_own_shard,
            cascade::c3_s115_policy_walk,
            cascade::c3_stamp_adds_the_missing_parent_write,
            cascade::c3_an_added_parent_write_that_refuses_rolls_the_child_back,
            cascade::c3_stamp_drops_the_parent_write,
            cascade::c3_a_stale_stamp_is_questioned_once,
            cascade::c4_no_grandparent_and_disabled_parent,
            cascade::cascade_parent_short_charges_no_child,
            cascade::cascade_lease_rollback_restores_both,
            cascade::cascade_child_undo_survives_a_throttle,
            schedules::s85_scheduled_capacity_at_a_boundary,
            schedules::s85_boundary_divides_after_the_schedule,
            schedules::s85_schedule_change_syncs,
            audit::every_admin_change_writes_one_record,
            audit::a_refused_change_writes_no_record,
            audit::pages_retention_and_purge,
            audit::a_doctor_repair_is_recorded,
            merge::s112_inherit_exclude_patch,
            merge::s113_system_cannot_inherit,
            merge::s114_time_zones_conflict,
            merge::s116_change_reaches_merged_buckets_only,
            namespaces::ns_register_and_isolation,
            namespaces::ns_delete_recover_purge,
            multi::s92_exhausted_resource_refunds_the_others,
            multi::s93_seventeen_resources_are_refused,
            multi::s94_disabled_outranks_exceeded,
            multi::s95_warm_multi_acquire_is_one_write_per_resource,
            soft::s107_soft_limit_records_and_never_refuses,
            soft::soft_limit_leaves_its_siblings_enforced,
            soft::enforcing_a_soft_limit_keeps_its_debt,
            soft::s110_soft_quota_reset_forgives_debt,
            soft::s107_overdraw_in_usage,
            bypass::s108_bypass_records_without_debiting,
            bypass::s109_bypass_opens_no_window,
            bypass::s111_a_bypass_write_needs_the_stamp,
            bypass::bypass_reaches_new_shards_and_is_audited,
            modes::resource_bypass_reaches_every_bucket,
            modes::the_most_specific_mode_wins,
            modes::a_disabled_resource_and_its_stored_mode,
            operator::s96_reset_two_shards,
            operator::s97_retry_lands_once,
            operator::s98_top_up_splits_by_grant,
            operator::s99_reset_after_a_top_up,
            operator::s100_session_reset,
            operator::s101_top_up_opens_and_creates,
            operator::s102_condition_pins,
            operator::reset_and_top_up_edges,
            operator::s103_move_to_a_new_parent,
            operator::s104_moves_pin_the_generation,
            operator::s105_cycles_refused_and_roots,
            operator::s106_leases_settle_with_the_parent_they_debited,
            usage::usage_equals_admitted_net_consumption,
            usage::usage_survives_restart_and_duplicate_aggregators,
            usage::usage_commit_with_a_lost_response_counts_once,
            usage::usage_absorbed_between_passes_counts_once,
            usage_commit::usage_pass_beyond_one_transaction_counts_once,
            usage_commit::usage_claim_left_by_a_crash_is_finished_once
        );
    };
}

/// One `#[tokio::test]` per `module::scenario` (the expansion of [`scenario_tests!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __scenario_tests {
    ($backend:expr; $($module:ident :: $name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                if let Some(b) = $backend {
                    $crate::testing::scenarios::$module::$name(&b).await
                }
            }
        )*
    };
}

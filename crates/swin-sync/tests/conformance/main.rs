//! One conformance suite, run against the real PostgreSQL, Redis and SQLite.
//!
//! Every scenario runs against every store (`swin_testkit::for_stores!` below), so a store
//! conforms exactly when this suite passes; the scenarios are in modules by area. The
//! Redis store runs on Debian's Redis, on a Redis Cluster, on Valkey 9 (`valkey`) and on
//! Redis 8 (`redis8`).

#[path = "../common/mod.rs"]
mod common;

mod admission;
mod buckets;
mod demands;
mod engines;
mod idempotency;
mod leases;
mod limits;
mod pushes;
mod raced;
mod redis_only;
mod refunds;
mod reservations;

use std::sync::Arc;
use std::time::Duration;

use admission::*;
use buckets::*;
use demands::*;
use engines::*;
use idempotency::*;
use leases::*;
use limits::*;
use pushes::*;
use raced::*;
use refunds::*;
use reservations::*;
use swin_core::{
    Advance, CompactString, CounterOptions, Diff, Gcra, NamespaceCounters, Total, UnixMs,
    WindowSize,
};
use swin_sync::store::Fault;
use swin_sync::{Holder, PushId};
use swin_sync::{NamespaceSync, Push, Store, SyncMode, TatPush, WindowKey};
use swin_testkit::TestStore;

const NOW: i64 = 1_763_784_030; // 30 s into a minute

const CUR: i64 = 1_763_784_000;

const PREV: i64 = CUR - 60;

fn diff(key: &str, start: i64, value: f64) -> Diff {
    Diff {
        key: key.into(),
        window_size: 60,
        window_start: start,
        value,
    }
}

fn wk(key: &str, start: i64) -> WindowKey {
    WindowKey {
        key: key.into(),
        window_size: 60,
        window_start: start,
    }
}

async fn totals(store: &Store, ns: &str, keys: &[WindowKey]) -> Vec<(String, i64, f64)> {
    let mut t: Vec<_> = store
        .read(ns, keys)
        .await
        .expect("read")
        .into_iter()
        .map(|t| (t.key.to_string(), t.window_start, t.count))
        .collect();
    t.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    t
}

fn push<'a>(node: &'a PushId, seq: u64, diffs: &'a [Diff]) -> Push<'a> {
    Push {
        node_id: node,
        seq: Some(seq),
        diffs,
    }
}

fn engine(store: &Store, mode: SyncMode, sizes: &[u64]) -> Arc<NamespaceSync> {
    engine_answering(store, mode, sizes, swin_sync::DEFAULT_ANSWER_WITHIN)
}

/// [`engine`] whose requests wait for the store at most `within`.
fn engine_answering(
    store: &Store,
    mode: SyncMode,
    sizes: &[u64],
    within: Duration,
) -> Arc<NamespaceSync> {
    let sizes: Vec<WindowSize> = sizes
        .iter()
        .map(|s| WindowSize::new(*s).expect("size"))
        .collect();
    let counters = Arc::new(NamespaceCounters::new(
        "api",
        &sizes,
        CounterOptions::default(),
    ));
    Arc::new(
        NamespaceSync::new(
            counters,
            mode,
            Some(store.clone()),
            swin_sync::new_node_id().into(),
            Duration::from_secs(5),
        )
        .answering_within(within),
    )
}

const SEC: i64 = 1_000_000_000;

const NOW_NS: i64 = NOW * SEC;

fn adv(key: &str, secs: i64) -> Advance {
    Advance {
        key: key.into(),
        ns: secs * SEC,
    }
}

/// The node every `tat_push` comes from.
static N1: std::sync::LazyLock<PushId> = std::sync::LazyLock::new(|| PushId::from("n1"));

fn tat_push<'a>(seq: Option<u64>, now_ns: i64, advances: &'a [Advance]) -> TatPush<'a> {
    TatPush {
        node_id: &N1,
        seq,
        now_ns,
        advances,
    }
}

async fn tat_of(store: &Store, ns: &str, key: &str) -> Option<i64> {
    let keys = [CompactString::from(key)];
    store
        .read_tats(ns, &keys)
        .await
        .expect("read tats")
        .first()
        .map(|t| t.tat_ns)
}

swin_testkit::for_stores!([postgres, redis, redis_cluster, sqlite, valkey, redis8] [
    every_call_honours_its_faults,
    a_hanging_store_costs_one_timeout_not_one_per_request,
    requested_syncs_share_one_run,
    doubles_round_trip_exactly,
    unconfirmed_pushes_replay_exactly_once,
    counts_never_go_below_zero,
    refused_rows_never_hold_back_the_others,
    a_refused_window_does_not_degrade_the_namespace,
    large_batches_go_in_chunks_exactly_once,
    pushed_windows_are_not_read_again,
    reset_reaches_every_node,
    tat_advances_apply_max_then_add,
    gcra_buckets_are_shared,
    gcra_synchronous_admits_exactly_the_burst,
    kong_push_vectors,
    kong_seeded_sync,
    retried_push_applies_once,
    a_diff_of_0_in_a_push_reads_and_writes_nothing,
    fractional_and_negative,
    fractional_counts_keep_every_bit,
    odd_keys_round_trip,
    load_namespace_returns_live_windows,
    purge_drops_old_windows,
    concurrent_pushers_same_keys,
    two_engines_converge,
    failures_lose_and_double_nothing,
    a_key_read_while_its_push_is_unconfirmed_keeps_it_in_view,
    idle_keys_are_still_refreshed,
    synchronous_mode_reads_store_totals,
    a_sync_read_answered_after_a_round_trip_leaves_its_newer_count,
    a_first_touch_answered_after_a_sync_leaves_its_newer_count,
    a_start_load_answered_after_a_first_touch_leaves_its_newer_count,
    a_tick_while_a_start_load_is_out_keeps_a_first_touch_count,
    a_first_touch_of_many_keys_fills_every_size,
    synchronous_mode_falls_back_when_down,
    a_fallback_hit_answered_late_is_pushed_once,
    a_refund_after_an_outage_is_in_the_store_at_once,
    shutdown_pushes_last_diffs,
    runtime_limits_round_trip_and_log_every_change,
    a_change_past_its_deadline_is_not_applied,
    a_ping_tells_the_stores_time,
    runtime_limits_list_in_key_order_without_lapsed_ones,
    a_page_after_any_key_goes_on_from_where_it_sorts,
    a_cursor_the_store_cannot_reach_back_to_is_incomplete,
    leases_never_pass_the_limit_under_racing_acquires,
    a_lease_change_past_its_deadline_changes_nothing,
    leases_lapse_and_renew_only_while_live,
    slots_released_by_prefix_end_the_earliest_first,
    leases_in_flight_count_the_live_slots_of_one_namespace,
    a_lease_change_retried_after_a_lost_reply_applies_once,
    demands_are_shared_replaced_and_lapse,
    idempotency_claims_race_to_one_winner_and_answer_again,
    idempotency_claims_released_or_held_no_longer_run_again,
    idempotency_records_are_capped_and_purged_when_lapsed,
    idempotency_clients_hold_their_share_and_no_more,
    idempotency_client_counts_go_with_their_records,
    an_idempotency_answer_whose_reply_is_lost_is_kept_once,
    an_idempotency_claim_that_failed_to_its_caller_is_released,
    a_reservation_is_taken_exactly_once_under_racing_commits,
    an_extend_raises_an_open_reservation_only,
    an_extend_is_applied_once_per_identity_and_says_by_whom,
    a_reservation_change_retried_after_a_lost_reply_applies_once,
    open_reservations_are_capped_per_namespace_and_per_client,
    a_record_says_where_its_total_was_counted_up_to_its_most,
    a_reservation_change_past_its_deadline_changes_nothing,
    open_reservations_are_counted_per_namespace,
    an_undo_after_a_window_ends_takes_back_in_its_take_s_window,
]);

//! With every guard in place, a few hundred seeds over every workload break no invariant.

use tollgate_sim::{run_many, run_seed, RunConfig};

#[test]
fn no_violations_without_mutants() {
    let s = run_many(0, 150, None, None, None);
    let detail: Vec<String> = s
        .failing
        .iter()
        .map(|(seed, wl, v)| {
            format!(
                "seed {seed} [{wl}] {}: {} (replay: cargo run --release -p tollgate-sim -- --seed {seed} --trace --workload {wl})",
                v.invariant, v.detail
            )
        })
        .collect();
    assert_eq!(s.violations, 0, "{}", detail.join("\n"));
    assert!(
        s.admitted > 1000,
        "the workloads admitted too little: {}",
        s.admitted
    );
    assert!(s.faults.total() > 0);
    assert!(
        s.max_shards >= 8,
        "no hot entity doubled far: {}",
        s.max_shards
    );
}

/// Regression (fixed): `writes::next_rf` used to stamp `max(now, stored rf, ws)`, so a writer whose clock is not ahead of the stored `rf` (an
/// older writer stamped it forward, or a skewed or slow client) writes `rf` unchanged — and a
/// concurrent slow path that read the same `rf` still holds the lock. Here two clients open
/// the same window on shard 0 under one `rf` (the second write moves `ws` back and adds a
/// second share): 21 admitted against 19. ADR-140/C5 make the stamp strictly greater than the
/// locked `rf` (`max(now, stored rf + 1, ws)`), which this seed now checks.
#[test]
fn seed_584_rf_lock_not_advanced() {
    let r = run_seed(&RunConfig {
        seed: 584,
        workload: Some("window"),
        ..RunConfig::default()
    });
    assert!(r.violations.is_empty(), "{:?}", r.violations);
}

/// The cascade workload (ADR-146) breaks nothing with every guard in place: the ledger
/// attributes each cascade admission to the child and to the shared parent, so the
/// allowance invariants bound the parent too, and the parent (the hot entity) doubles.
#[test]
fn cascade_workload_is_clean() {
    let s = run_many(0, 40, None, Some("cascade"), None);
    let detail: Vec<String> = s
        .failing
        .iter()
        .map(|(seed, wl, v)| format!("seed {seed} [{wl}] {}: {}", v.invariant, v.detail))
        .collect();
    assert_eq!(s.violations, 0, "{}", detail.join("\n"));
    assert!(
        s.admitted > 1000,
        "cascade admitted too little: {}",
        s.admitted
    );
    assert!(s.refused > 100, "the parent never refused: {}", s.refused);
    assert!(
        s.max_shards >= 8,
        "the parent never doubled far: {}",
        s.max_shards
    );
}

/// Seeds `0..60` with the aggregator actor (`absorb`: the absorbing one): every violation,
/// and how many runs admitted anything.
fn aggregator_runs(absorb: bool) -> (Vec<String>, u64) {
    let mut violations = Vec::new();
    let mut with_usage = 0;
    for seed in 0..60 {
        let r = run_seed(&RunConfig {
            seed,
            aggregator: true,
            absorb,
            ..RunConfig::default()
        });
        violations.extend(
            r.violations
                .iter()
                .map(|v| format!("seed {seed}: {}: {}", v.invariant, v.detail)),
        );
        with_usage += u64::from(r.admitted > 0);
    }
    (violations, with_usage)
}

/// The feed aggregator as one more actor — killed, restarted, run twice at once, faulted —
/// never counts a change twice or skips one (`usage-counted-once`).
#[test]
fn usage_counted_once_with_the_aggregator_actor() {
    let (violations, passes_with_usage) = aggregator_runs(false);
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    assert!(passes_with_usage > 50);
}

/// The absorbing aggregator (`UsageOptions::absorb`, what `tollgate serve` runs on a memory
/// store) as the actor — summing and trimming the feed between passes, its commits faulted
/// (lost answers, throttles, races, hangs) — counts every change once from what it holds
/// (`usage-counted-once`, `usage-overdraw`), though the feed no longer has what it read.
#[test]
fn usage_counted_once_with_an_absorbing_aggregator() {
    let (violations, passes_with_usage) = aggregator_runs(true);
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    assert!(passes_with_usage > 50);
}

/// ADR-151's overdraw with the aggregator actor, on the workload that switches soft limits
/// and modes: every window kind's snapshots count exactly the overdraw the applied writes
/// made (`usage-overdraw`, from each write's own images).
#[test]
fn overdraw_counted_exactly_on_the_soft_workload() {
    let mut violations = Vec::new();
    for seed in 0..40 {
        let r = run_seed(&RunConfig {
            seed,
            aggregator: true,
            workload: Some("soft"),
            ..RunConfig::default()
        });
        violations.extend(
            r.violations
                .iter()
                .map(|v| format!("seed {seed}: {}: {}", v.invariant, v.detail)),
        );
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

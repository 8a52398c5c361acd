//! A seed replays exactly: two runs of the same seed give the same trace hash (scheduling,
//! outcomes and the final store), and different seeds explore different runs.

use tollgate_sim::{run_seed, RunConfig, WORKLOADS};

#[test]
fn same_seed_same_trace_hash() {
    for seed in 0..WORKLOADS.len() as u64 * 2 {
        let cfg = RunConfig {
            seed,
            ..RunConfig::default()
        };
        let a = run_seed(&cfg);
        let b = run_seed(&cfg);
        assert_eq!(
            a.hash, b.hash,
            "seed {seed} ({}) is not deterministic",
            a.workload
        );
        assert_eq!(a.store_ops, b.store_ops);
        assert_eq!(a.admitted, b.admitted);
        assert!(a.store_ops > 0, "seed {seed} did nothing");
    }
}

#[test]
fn traced_run_matches_untraced_run() {
    let plain = run_seed(&RunConfig {
        seed: 3,
        ..RunConfig::default()
    });
    let traced = run_seed(&RunConfig {
        seed: 3,
        trace: true,
        ..RunConfig::default()
    });
    assert_eq!(plain.hash, traced.hash);
    assert!(!traced.trace.is_empty());
}

#[test]
fn different_seeds_differ() {
    let a = run_seed(&RunConfig {
        seed: 1,
        workload: Some("window"),
        ..RunConfig::default()
    });
    let b = run_seed(&RunConfig {
        seed: 2,
        workload: Some("window"),
        ..RunConfig::default()
    });
    assert_ne!(a.hash, b.hash);
}

//! tollgate-sim: a deterministic simulator of tollgate.
//!
//! A seeded run creates one [`tollgate_store::MemoryStore`] wrapped in a
//! [`tollgate_store::FaultyStore`] and in this crate's scheduling wrapper
//! ([`sched::SimStore`]), N simulated clients (each its own [`tollgate::Limiter`] with its own
//! skewed clock and seeded shard draws), an older-writer / hot-spot actor, and drives a
//! [`workload`]. Every store request is a scheduling point and a seeded scheduler picks which
//! pending request runs next, so interleavings are explored and a seed replays exactly. A
//! ground-truth [`ledger`] records what was admitted and every `tc` change the store saw, and
//! checks the invariants listed there. [`run::run_seed`] runs one seed; the `tollgate-sim`
//! binary runs many and prints a summary.
//!
//! Guards of the rules can be disabled one at a time with
//! [`tollgate_core::mutants`] (`--mutant NAME`) to show that the invariants catch the bug
//! each guard prevents.

pub mod ledger;
pub mod run;
pub mod sched;
pub mod usage;
pub mod workload;

pub use ledger::Violation;
pub use run::{run_seed, workload_of, Faults, RunConfig, SeedReport};
pub use tollgate_core::mutants::{self, Mutant};
pub use workload::WORKLOADS;

/// Aggregate of many seeds.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Seeds run.
    pub seeds: u64,
    /// Store requests.
    pub store_ops: u64,
    /// Acquires granted.
    pub admitted: u64,
    /// Acquires refused or failed.
    pub refused: u64,
    /// Faults injected.
    pub faults: Faults,
    /// Lost-response residuals (documented, not violations).
    pub residuals: u64,
    /// Violations found.
    pub violations: u64,
    /// Failing seeds with their first violation.
    pub failing: Vec<(u64, &'static str, Violation)>,
    /// Violations per invariant name.
    pub by_invariant: std::collections::BTreeMap<&'static str, u64>,
    /// The first seed that broke each invariant.
    pub first_seed: std::collections::BTreeMap<&'static str, u64>,
    /// Largest shard count any run reached.
    pub max_shards: i64,
}

impl Summary {
    /// Fold one seed's report in.
    pub fn add(&mut self, r: &SeedReport) {
        self.seeds += 1;
        self.store_ops += r.store_ops;
        self.admitted += r.admitted;
        self.refused += r.refused;
        self.faults.add(&r.faults);
        self.residuals += r.residuals.len() as u64;
        self.violations += r.violations.len() as u64;
        self.max_shards = self.max_shards.max(r.max_shards);
        for v in &r.violations {
            *self.by_invariant.entry(v.invariant).or_default() += 1;
            self.first_seed.entry(v.invariant).or_insert(r.seed);
        }
        if let Some(v) = r.violations.first() {
            self.failing.push((r.seed, r.workload, v.clone()));
        }
    }
}

/// Run seeds `start..start + n` with the given settings; `mutant` disables one guard for the
/// whole run (process-global).
pub fn run_many(
    start: u64,
    n: u64,
    clients: Option<usize>,
    workload: Option<&'static str>,
    mutant: Option<Mutant>,
) -> Summary {
    mutants::set(mutant.as_slice());
    let mut s = Summary::default();
    for seed in start..start + n {
        let r = run_seed(&RunConfig {
            seed,
            clients,
            workload,
            trace: false,
            aggregator: false,
            absorb: false,
        });
        s.add(&r);
    }
    mutants::set(&[]);
    s
}

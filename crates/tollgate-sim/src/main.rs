//! `tollgate-sim`: run many seeds of the deterministic simulation and print a summary whose
//! last line is `violations: N`. Exits non-zero when any invariant broke.

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;

// The simulator allocates for every store request it models (items are copied in and out of
// the in-memory store, as over a wire); mimalloc serves those small allocations faster than
// the system allocator. The binary only: the library and its tests keep the default.
#[global_allocator]
static ALLOC: tollgate_alloc::Mimalloc = tollgate_alloc::Mimalloc;
use tollgate_sim::{ledger::fmt_milli, run_seed, Mutant, RunConfig, Summary, WORKLOADS};

/// Deterministic simulation of tollgate: seeded interleavings, injected faults, older
/// writers, clock skew and invariant checks.
#[derive(Debug, Parser)]
#[command(name = "tollgate-sim", version)]
struct Cli {
    /// How many seeds to run (from --start).
    #[arg(long, default_value_t = 200)]
    seeds: u64,
    /// Run exactly this seed (overrides --seeds/--start).
    #[arg(long)]
    seed: Option<u64>,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// Clients per run (default: drawn from the seed).
    #[arg(long)]
    clients: Option<usize>,
    /// Print a readable trace of each run (meant with --seed).
    #[arg(long)]
    trace: bool,
    /// Disable one guard: WindowFloor, WaMarker, WtcCharge, MonotonicRf,
    /// ConsistentSiblingRead, GrantMove, RfLock, TrustHorizon, LeaseNet, EntityDebit,
    /// DripSplit, StoreDeadline, MultiRefund, SoftScope, OpOnce, UsageCheckpoint (with
    /// --aggregator), BypassStamp, HeldCommit (with --aggregator --absorb).
    #[arg(long)]
    mutant: Option<String>,
    /// Workload: rate, calendar, window, multi, lease, hot, cascade, burst, drip, many
    /// (multi-resource acquire), soft (soft limits switched on and off), topup (an operator
    /// resetting and topping up), or all (rotate by seed).
    #[arg(long, default_value = "all")]
    workload: String,
    /// Also run every seed twice and compare the trace hashes.
    #[arg(long)]
    check_determinism: bool,
    /// Run the feed aggregator as one more actor (killed, restarted, duplicated) and check
    /// that usage snapshots count every change once.
    #[arg(long)]
    aggregator: bool,
    /// With --aggregator: the actor is one absorbing aggregator (as `tollgate serve` runs
    /// on a memory store), never restarted nor duplicated.
    #[arg(long, requires = "aggregator")]
    absorb: bool,
    /// Seeds run at once, each on its own thread (default: the machine's cores). Seeds are
    /// independent and their reports are summed in seed order, so the summary is the same
    /// for any value.
    #[arg(long)]
    jobs: Option<usize>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mutant = match cli.mutant.as_deref() {
        None => None,
        Some(m) => match Mutant::parse(m) {
            Some(m) => Some(m),
            None => {
                eprintln!(
                    "unknown mutant {m:?}; one of: {}",
                    Mutant::ALL.map(|m| m.name()).join(", ")
                );
                return ExitCode::from(2);
            }
        },
    };
    let workload: Option<&'static str> = match cli.workload.as_str() {
        "all" => None,
        w => match WORKLOADS.iter().find(|x| **x == w) {
            Some(x) => Some(*x),
            None => {
                eprintln!(
                    "unknown workload {w:?}; one of: all, {}",
                    WORKLOADS.join(", ")
                );
                return ExitCode::from(2);
            }
        },
    };
    tollgate_sim::mutants::set(mutant.as_slice());
    let (start, n) = match cli.seed {
        Some(s) => (s, 1),
        None => (cli.start, cli.seeds),
    };
    let t0 = Instant::now();
    let mut sum = Summary::default();
    let mut nondeterministic = Vec::new();
    let cfg_of = |seed: u64| RunConfig {
        seed,
        clients: cli.clients,
        workload,
        trace: cli.trace,
        aggregator: cli.aggregator,
        absorb: cli.absorb,
    };
    let jobs = cli
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, 64);
    // `jobs` threads take the next seed from a shared counter; the reports are folded in
    // seed order (a report that arrives early waits), so the summary — first failing seeds
    // included — is the same for any `jobs`.
    let end = start + n;
    let counter = std::sync::atomic::AtomicU64::new(start);
    let (tx, rx) = std::sync::mpsc::channel::<(u64, tollgate_sim::SeedReport, bool)>();
    std::thread::scope(|sc| {
        for _ in 0..jobs.min(n.max(1) as usize) {
            let tx = tx.clone();
            let counter = &counter;
            let cfg_of = &cfg_of;
            let twice = cli.check_determinism;
            sc.spawn(move || loop {
                let seed = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if seed >= end {
                    break;
                }
                let cfg = cfg_of(seed);
                let r = run_seed(&cfg);
                let same = !twice || run_seed(&cfg).hash == r.hash;
                if tx.send((seed, r, same)).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        let mut waiting = std::collections::BTreeMap::new();
        let mut want = start;
        for (seed, r, same) in rx {
            waiting.insert(seed, (r, same));
            while let Some((r, same)) = waiting.remove(&want) {
                if !same {
                    nondeterministic.push(want);
                }
                if cli.trace {
                    println!(
                        "=== seed {want}: workload {}, {} clients, trace hash {:016x} ===",
                        r.workload, r.clients, r.hash
                    );
                    for l in &r.trace {
                        println!("{l}");
                    }
                    for x in &r.residuals {
                        println!("residual: {x}");
                    }
                    for v in &r.violations {
                        println!("VIOLATION {}: {}", v.invariant, v.detail);
                    }
                }
                sum.add(&r);
                want += 1;
            }
        }
    });
    let secs = t0.elapsed().as_secs_f64();
    let replay = |seed: u64, wl: &str| {
        let mut c =
            format!("cargo run --release -p tollgate-sim -- --seed {seed} --trace --workload {wl}");
        if let Some(k) = cli.clients {
            c.push_str(&format!(" --clients {k}"));
        }
        if let Some(m) = mutant {
            c.push_str(&format!(" --mutant {}", m.name()));
        }
        c
    };
    for (seed, wl, v) in sum.failing.iter().take(10) {
        println!("seed {seed} [{wl}] violates {}: {}", v.invariant, v.detail);
        println!("  replay: {}", replay(*seed, wl));
    }
    if sum.failing.len() > 10 {
        println!("... and {} more failing seeds", sum.failing.len() - 10);
    }
    for s in &nondeterministic {
        println!("seed {s}: NOT deterministic (two runs gave different trace hashes)");
    }
    let f = &sum.faults;
    println!("mutant: {}", mutant.map(|m| m.name()).unwrap_or("none"));
    println!("seeds run: {}", sum.seeds);
    println!(
        "seeds/s: {:.1} ({jobs} thread(s))",
        sum.seeds as f64 / secs.max(1e-9)
    );
    println!("operations: {} store requests", sum.store_ops);
    println!(
        "admitted: {} acquires ({} refused or failed); largest shard count {}",
        sum.admitted, sum.refused, sum.max_shards
    );
    println!(
        "faults injected: {} (condition races {}, conflicts {}, throttles {}, lost responses {}, stale reads {}, delays {}, lost fan-outs {}, older-writer/wcu raw writes {}, hung requests {})",
        f.total(),
        f.store.condition_races,
        f.store.transaction_conflicts,
        f.store.throttles,
        f.store.lost_responses,
        f.store.stale_reads,
        f.delays,
        f.lost_fanouts,
        f.raw_writes,
        f.hangs
    );
    println!(
        "residuals: {} (lost responses whose write applied: caller told error, tc moved; cascade partial outcomes: one side applied, the other's write failed; documented, not violations)",
        sum.residuals
    );
    let _ = fmt_milli;
    for (inv, n) in &sum.by_invariant {
        let first = sum.first_seed.get(inv).copied().unwrap_or_default();
        println!("  {inv}: {n} violation(s), first at seed {first}");
    }
    for (inv, k) in &sum.by_invariant {
        println!(
            "violated invariant {inv}: {k} times in {} seeds",
            sum.failing
                .iter()
                .filter(|(_, _, v)| v.invariant == *inv)
                .count()
        );
    }
    let total = sum.violations + nondeterministic.len() as u64;
    println!("violations: {total}");
    if total == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

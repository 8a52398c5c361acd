//! One seeded run: build the workload, drive the clients under the scheduler, quiesce, and
//! check the ledger.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tollgate::{Limiter, OnUnavailable, Options, SeededRng};
use tollgate_core::value::Value;
use tollgate_store::{FaultConfig, FaultStats, FaultyStore, MemoryStore};

use crate::ledger::Violation;
use crate::sched::{drive, hash_item, Shared, SimStore, SkewClock, Task};
use crate::workload::{self, NS, WORKLOADS};

/// The deadline of every client's store calls in a run with hung requests.
const CLIENT_DEADLINE: Duration = Duration::from_secs(1);

/// What to run.
#[derive(Debug, Clone, Default)]
pub struct RunConfig {
    /// The seed.
    pub seed: u64,
    /// Clients (default: drawn from the seed).
    pub clients: Option<usize>,
    /// Workload (default: rotate through [`WORKLOADS`] by seed).
    pub workload: Option<&'static str>,
    /// Keep a readable trace.
    pub trace: bool,
    /// Run the feed aggregator as one more actor and check `usage-counted-once`.
    pub aggregator: bool,
    /// With `aggregator`: the actor is one absorbing aggregator (`UsageOptions::absorb`, as
    /// `tollgate serve` runs on a memory store) — the feed's only consumer, never restarted
    /// nor duplicated, summing and trimming the feed between its passes.
    pub absorb: bool,
}

/// Faults injected in one run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// By the FaultyStore.
    pub store: FaultStats,
    /// Scheduler delays.
    pub delays: u64,
    /// Fan-out writes lost.
    pub lost_fanouts: u64,
    /// Older-writer and `wcu`-drain raw writes.
    pub raw_writes: u64,
    /// Store requests that hung past the client's deadline.
    pub hangs: u64,
}

impl Faults {
    /// Every injected fault.
    pub fn total(&self) -> u64 {
        self.store.total() + self.delays + self.lost_fanouts + self.raw_writes + self.hangs
    }
    /// Add another run's counts.
    pub fn add(&mut self, o: &Faults) {
        let s = &mut self.store;
        s.condition_races += o.store.condition_races;
        s.transaction_conflicts += o.store.transaction_conflicts;
        s.throttles += o.store.throttles;
        s.lost_responses += o.store.lost_responses;
        s.stale_reads += o.store.stale_reads;
        s.delays += o.store.delays;
        self.delays += o.delays;
        self.lost_fanouts += o.lost_fanouts;
        self.raw_writes += o.raw_writes;
        self.hangs += o.hangs;
    }
}

/// The outcome of one seed.
#[derive(Debug, Clone)]
pub struct SeedReport {
    /// The seed.
    pub seed: u64,
    /// Workload name.
    pub workload: &'static str,
    /// Clients.
    pub clients: usize,
    /// Broken invariants.
    pub violations: Vec<Violation>,
    /// Documented residuals (lost responses whose write applied).
    pub residuals: Vec<String>,
    /// Hash of the whole run (scheduling, outcomes, final store).
    pub hash: u64,
    /// Store requests executed.
    pub store_ops: u64,
    /// Acquires granted.
    pub admitted: u64,
    /// Acquires refused or failed.
    pub refused: u64,
    /// Faults injected.
    pub faults: Faults,
    /// Largest shard count reached.
    pub max_shards: i64,
    /// The readable trace (when asked for).
    pub trace: Vec<String>,
}

/// Pick the workload of a seed.
pub fn workload_of(seed: u64, fixed: Option<&'static str>) -> &'static str {
    fixed.unwrap_or(WORKLOADS[(seed % WORKLOADS.len() as u64) as usize])
}

/// Run one seed.
pub fn run_seed(cfg: &RunConfig) -> SeedReport {
    let mut rng = SmallRng::seed_from_u64(cfg.seed ^ 0x9e37_79b9_7f4a_7c15);
    let wl = workload_of(cfg.seed, cfg.workload);
    let spec = Arc::new(workload::build(wl, &mut rng, cfg.clients));
    let p = spec.fault_p;
    // In a quarter of the faulty runs, eventually consistent reads are mostly stale.
    let stale = if p > 0.0 && rng.gen_bool(0.25) {
        0.6
    } else {
        (p * 4.0).min(1.0)
    };
    let fc = FaultConfig {
        condition_race: p,
        transaction_conflict: p,
        throttle: p,
        lost_response: p / 2.0,
        stale_read: stale,
        delay: 0.0,
        max_delay: Duration::ZERO,
    };
    // The aggregator actor reads the change feed; without it the store keeps none.
    let mem = Arc::new(if cfg.aggregator {
        MemoryStore::with_change_feed()
    } else {
        MemoryStore::new()
    });
    let faulty = FaultyStore::new(mem.clone(), rng.gen(), fc);
    // Clients, the older writer, the quiesce check, then the feed aggregator and the
    // operator where there are.
    let operator = spec.clients + 2 + usize::from(cfg.aggregator);
    let participants = operator + usize::from(spec.operator_actions > 0);
    let sh = Shared::new(
        mem.clone(),
        faulty,
        spec.start_ms,
        SmallRng::seed_from_u64(rng.gen()),
        spec.knobs,
        participants,
        cfg.trace,
    );
    // Hung requests, from a stream of their own (a run without them draws exactly what it
    // drew before they existed): in a third of the faulty runs, requests hang with the
    // run's fault probability, every client bounds its store calls by a deadline, and
    // each client's `on_unavailable` is drawn.
    let mut hrng = SmallRng::seed_from_u64(cfg.seed ^ 0x4855_4e47_4855_4e47);
    let hang_p = if p > 0.0 && hrng.gen_bool(1.0 / 3.0) {
        p
    } else {
        0.0
    };
    sh.set_hang(hang_p, SmallRng::seed_from_u64(hrng.gen()));
    let mut violations = Vec::new();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return failed(cfg, &spec, format!("cannot build a runtime: {e}"));
        }
    };
    if let Err(e) = rt.block_on(workload::setup(mem.clone(), &spec)) {
        return failed(cfg, &spec, format!("setup failed: {e}"));
    }
    let mut tasks: Vec<(usize, Task)> = Vec::new();
    for c in 0..spec.clients {
        let skew = if spec.skew > 0 {
            rng.gen_range(-spec.skew..=spec.skew)
        } else {
            0
        };
        let clock = Arc::new(SkewClock {
            base: sh.now.clone(),
            skew,
        });
        let allow = hang_p > 0.0 && hrng.gen_bool(0.5);
        let opts = Options {
            namespace: NS.into(),
            // A workload that switches soft limits needs clients to see the switch.
            config_cache_ttl: Duration::from_secs(if spec.soft_switch_p > 0.0 { 2 } else { 3600 }),
            speculative: rng.gen_bool(spec.speculative_p),
            on_unavailable: if allow {
                OnUnavailable::Allow
            } else {
                OnUnavailable::Block
            },
            ..Options::default()
        };
        let store = Arc::new(SimStore {
            client: c,
            sh: sh.clone(),
        });
        let mut builder = Limiter::builder(store)
            .clock(clock)
            .rng(Arc::new(SeededRng::new(rng.gen())))
            .audit_seed(cfg.seed.wrapping_mul(1000).wrapping_add(c as u64))
            .options(opts);
        if hang_p > 0.0 {
            builder = builder.store_timeout(CLIENT_DEADLINE);
        }
        let lim = match builder.build() {
            Ok(l) => l,
            Err(e) => return failed(cfg, &spec, format!("limiter: {e}")),
        };
        if let Some(t) = sh.lock().trace.as_mut() {
            t.push(format!("client c{c}: clock skew {skew} ms"));
        }
        let crng = SmallRng::seed_from_u64(rng.gen());
        tasks.push((
            c,
            Box::pin(workload::client(
                sh.clone(),
                c,
                lim,
                spec.clone(),
                crng,
                allow,
            )),
        ));
    }
    // The older writer's clock: within the bound, and in half the runs as far behind as
    // the bound allows (its `rf` stamps then land below window starts).
    let mut chaos_skew = if spec.skew > 0 {
        let s = rng.gen_range(-spec.skew..=spec.skew);
        if rng.gen_bool(0.5) {
            -spec.skew
        } else {
            s
        }
    } else {
        0
    };
    // An older writer runs on some other machine, outside our clients' skew bound: where a
    // duration window is in play, half the runs give it a clock up to 30 s behind
    // (scenario 54's backward `rf`), the hazard the `wa` marker exists for. (Drawn only for
    // window workloads, so the other workloads' runs are unchanged.)
    let has_window = spec
        .limits
        .iter()
        .any(|l| matches!(l.refill(), tollgate_core::Refill::Window { .. }));
    if has_window && spec.old_writes > 0 && rng.gen_bool(0.5) {
        chaos_skew = -rng.gen_range(1000..=30_000);
    }
    if spec.old_writes + spec.wcu_drains > 0 {
        let crng = SmallRng::seed_from_u64(rng.gen());
        tasks.push((
            spec.clients,
            Box::pin(workload::chaos(
                sh.clone(),
                spec.clients,
                spec.clone(),
                crng,
                chaos_skew,
            )),
        ));
    }
    // The absorbing aggregator, kept for the final pass: what it holds is in no feed.
    let absorber = crate::usage::Absorber::default();
    if cfg.aggregator {
        // From a stream of its own: the other actors draw what they drew without it.
        let arng = SmallRng::seed_from_u64(cfg.seed ^ 0x5553_4147_4553_4e41);
        let deadline = (hang_p > 0.0).then_some(CLIENT_DEADLINE);
        tasks.push((
            spec.clients + 2,
            Box::pin(crate::usage::aggregator(
                sh.clone(),
                spec.clients + 2,
                arng,
                deadline,
                cfg.absorb.then(|| absorber.clone()),
            )),
        ));
    }
    if spec.operator_actions > 0 {
        let skew = if spec.skew > 0 {
            rng.gen_range(-spec.skew..=spec.skew)
        } else {
            0
        };
        let clock = Arc::new(SkewClock {
            base: sh.now.clone(),
            skew,
        });
        let store = Arc::new(SimStore {
            client: operator,
            sh: sh.clone(),
        });
        let built = Limiter::builder(store)
            .clock(clock)
            .rng(Arc::new(SeededRng::new(rng.gen())))
            .audit_seed(cfg.seed.wrapping_mul(1000).wrapping_add(operator as u64))
            .options(Options {
                namespace: NS.into(),
                config_cache_ttl: Duration::from_secs(3600),
                ..Options::default()
            })
            .principal("operator")
            .build();
        let lim = match built {
            Ok(l) => l,
            Err(e) => return failed(cfg, &spec, format!("limiter: {e}")),
        };
        let orng = SmallRng::seed_from_u64(rng.gen());
        tasks.push((
            operator,
            Box::pin(workload::operator(
                sh.clone(),
                operator,
                lim,
                spec.clone(),
                orng,
            )),
        ));
    }
    rt.block_on(drive(&sh, tasks));

    // Quiesce: faults off, then the one-reset-instant check.
    sh.faulty.set_enabled(false);
    {
        let mut g = sh.lock();
        g.knobs.lost_fanout_p = 0.0;
        g.knobs.delay_p = 0.0;
        g.knobs.advance_p = 0.0;
        g.hang_p = 0.0;
        if let Some(t) = g.trace.as_mut() {
            t.push("--- quiesce: faults off, every window ended ---".into());
        }
    }
    let out = Arc::new(Mutex::new(Vec::new()));
    rt.block_on(drive(
        &sh,
        vec![(
            spec.clients + 1,
            Box::pin(workload::quiesce(
                sh.clone(),
                spec.clients + 1,
                spec.clone(),
                out.clone(),
            )) as Task,
        )],
    ));
    violations.extend(out.lock().unwrap_or_else(|e| e.into_inner()).drain(..));
    if cfg.aggregator {
        rt.block_on(drive(
            &sh,
            vec![(
                spec.clients + 2,
                Box::pin(crate::usage::catch_up(
                    sh.clone(),
                    spec.clients + 2,
                    out.clone(),
                    absorber.clone(),
                )) as Task,
            )],
        ));
        violations.extend(out.lock().unwrap_or_else(|e| e.into_inner()).drain(..));
        let overdraw = sh.lock().ledger.overdraw.clone();
        violations.extend(crate::usage::check(&mem, &overdraw));
    }

    let items = mem.raw_items();
    let mut limits: BTreeMap<String, Vec<tollgate_core::Limit>> =
        [(spec.resource.clone(), spec.limits.clone())].into();
    if let Some((r, ls)) = &spec.also {
        limits.insert(r.clone(), ls.clone());
    }
    let mut g = sh.lock();
    let st = &mut *g;
    st.ledger.finish(&limits, &items, spec.skew);
    violations.append(&mut st.ledger.violations);
    let mut hash = st.hash;
    let mut max_shards = 1;
    for i in &items {
        hash = hash_item(hash, Some(i));
        if let Some(s) = i.get("shard_count").and_then(Value::as_n) {
            max_shards = max_shards.max(s);
        }
    }
    let (admitted, refused) =
        st.ledger
            .ops
            .iter()
            .fold((0, 0), |(a, r), o| match (&o.kind, o.ok) {
                (crate::ledger::OpKind::Acquire { .. }, Some(true)) => (a + 1, r),
                (crate::ledger::OpKind::Acquire { .. }, _) => (a, r + 1),
                _ => (a, r),
            });
    SeedReport {
        seed: cfg.seed,
        workload: wl,
        clients: spec.clients,
        violations,
        residuals: std::mem::take(&mut st.ledger.residuals),
        hash,
        store_ops: st.store_ops,
        admitted,
        refused,
        faults: Faults {
            store: sh.faulty.stats(),
            delays: st.delays,
            lost_fanouts: st.lost_fanouts,
            raw_writes: st.raw_writes,
            hangs: st.hangs,
        },
        max_shards,
        trace: st.trace.take().unwrap_or_default(),
    }
}

fn failed(cfg: &RunConfig, spec: &workload::Spec, why: String) -> SeedReport {
    SeedReport {
        seed: cfg.seed,
        workload: spec.name,
        clients: spec.clients,
        violations: vec![Violation {
            invariant: "harness",
            detail: why,
        }],
        residuals: Vec::new(),
        hash: 0,
        store_ops: 0,
        admitted: 0,
        refused: 0,
        faults: Faults::default(),
        max_shards: 0,
        trace: Vec::new(),
    }
}

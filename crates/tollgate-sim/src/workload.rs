//! Workloads: the limits, entities, time scale and client behaviour of one seeded run, and
//! the actors that drive them (clients, the older writer / hot-spot actor, the quiesce check).

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::Rng;
use tollgate::{Error, Limiter, PinnedRng, Scope};
use tollgate_core::keys;
use tollgate_core::value::{Item, Value};
use tollgate_core::{Limit, Refill};
use tollgate_store::StoreError;

use crate::ledger::{OpKind, Outcome, Violation, Waited};
use crate::sched::{Knobs, Shared};

/// Namespace of every simulated key.
pub const NS: &str = "sim";

/// T0 of the project's unit tests (2025-09-04T15:33:20Z).
pub const T0: i64 = 1_757_000_000_000;

/// The first UTC midnight after [`T0`].
pub const MIDNIGHT: i64 = 1_757_030_400_000;

/// Names of the workloads, in the order `--workload all` rotates through them (new ones are
/// appended, so a workload keeps its name; the rotation by seed moves when one is added).
pub const WORKLOADS: [&str; 12] = [
    "rate", "calendar", "window", "multi", "lease", "hot", "cascade", "burst", "drip", "many",
    "soft", "topup",
];

/// The cascade workload's family (ADR-146): children that spend from one shared parent.
#[derive(Debug, Clone)]
pub struct Cascade {
    /// The parent (also `entities[0]`: the hot one).
    pub parent: String,
    /// The children (the rest of `entities`), each created with the parent as its parent.
    pub children: Vec<String>,
    /// Cascade switched on by the resource's policy (`set_cascade` on the resource scope)
    /// rather than by each child's META flag.
    pub via_resource: bool,
    /// Probability that a client acquires on the parent itself (no cascade).
    pub parent_p: f64,
}

/// One run's workload, drawn from the seed.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Workload name.
    pub name: &'static str,
    /// The one resource every client uses.
    pub resource: String,
    /// Its limits (stored at the resource level).
    pub limits: Vec<Limit>,
    /// Entities (the first is the hot one).
    pub entities: Vec<String>,
    /// True time at the start.
    pub start_ms: i64,
    /// Clients.
    pub clients: usize,
    /// Acquires per client.
    pub ops_per_client: usize,
    /// Probability that a granted acquire is followed by an adjust/commit or rollback.
    pub lease_p: f64,
    /// Raw writes that drive a shard's `wcu` far below zero (forcing a doubling).
    pub wcu_drains: usize,
    /// Older-writer writes (`SET rf = own clock, REMOVE vu`).
    pub old_writes: usize,
    /// Clock-skew bound (ms): every clock is true time + a skew in `[-skew, skew]`.
    pub skew: i64,
    /// Probability of the speculative fast path being on for a client.
    pub speculative_p: f64,
    /// Scheduler knobs.
    pub knobs: Knobs,
    /// Per-request fault probability of the FaultyStore.
    pub fault_p: f64,
    /// The cascade family, when the workload cascades.
    pub cascade: Option<Cascade>,
    /// Largest amount of the `tok` limit one acquire asks for (tokens).
    pub tok_max: i64,
    /// Probability that a client idles (true time jumps past a full refill) and then bursts.
    pub idle_p: f64,
    /// Probability that a lease adjustment tries to refund more than the lease holds.
    pub over_refund_p: f64,
    /// A second resource and its limits (names distinct from `limits`): every acquire takes
    /// both at once, all or none (ADR-148).
    pub also: Option<(String, Vec<Limit>)>,
    /// Probability, before each acquire, that the client switches the soft limits of
    /// `limits` (the ones stored soft at the start) to soft or enforced (ADR-151).
    pub soft_switch_p: f64,
    /// Probability, before each acquire, that the client sets the entity's use of the
    /// resource to bypass or back to enforce (ADR-151).
    pub bypass_switch_p: f64,
    /// Operator actions (ADR-149 resets and top-ups) racing the clients; 0: no operator.
    pub operator_actions: usize,
}

fn secs(s: i64) -> Duration {
    Duration::from_secs(s.unsigned_abs())
}

/// Build the workload `name` from the seed's RNG.
pub fn build(name: &'static str, rng: &mut SmallRng, clients: Option<usize>) -> Spec {
    let skew = *[0, 50, 500, 2000].choose(rng).unwrap_or(&0);
    let fault_p = *[0.0, 0.005, 0.02, 0.05].choose(rng).unwrap_or(&0.0);
    let old = rng.gen_bool(0.5);
    let n_ent = rng.gen_range(1..=2);
    let entities: Vec<String> = (0..n_ent).map(|i| format!("e{i}")).collect();
    let clients = clients.unwrap_or_else(|| rng.gen_range(2..=5));
    let mut s = Spec {
        name,
        resource: format!("r-{name}"),
        limits: Vec::new(),
        entities,
        start_ms: T0,
        clients,
        ops_per_client: rng.gen_range(12..=30),
        lease_p: 0.0,
        wcu_drains: 0,
        old_writes: if old { rng.gen_range(4..=16) } else { 0 },
        skew,
        speculative_p: 0.85,
        knobs: Knobs {
            advance_p: 0.3,
            max_step_ms: 1000,
            delay_p: if fault_p > 0.0 { 0.05 } else { 0.0 },
            lost_fanout_p: if fault_p > 0.0 { 0.1 } else { 0.0 },
        },
        fault_p,
        cascade: None,
        tok_max: 1,
        idle_p: 0.0,
        over_refund_p: 0.0,
        also: None,
        soft_switch_p: 0.0,
        bypass_switch_p: 0.0,
        operator_actions: 0,
    };
    let window = |rng: &mut SmallRng, cap: i64| -> (Limit, i64) {
        let w = *[60, 120, 300].choose(rng).unwrap_or(&60);
        (
            Limit::quota_after("session", cap, secs(w)).expect("valid window limit"),
            w * 1000,
        )
    };
    let daily = |cap: i64| Limit::quota_calendar("rpd", cap, "0 0 * * *", "UTC").expect("valid");
    match name {
        "rate" => {
            let cap = rng.gen_range(5..=20);
            s.limits = vec![
                Limit::rate("rps", cap, cap, secs(10)).expect("valid rate"),
                Limit::rate("tpm", 200, 200, secs(60)).expect("valid rate"),
            ];
            s.knobs.max_step_ms = 2000;
        }
        "calendar" => {
            s.limits = vec![daily(rng.gen_range(10..=40))];
            s.start_ms = MIDNIGHT - rng.gen_range(60_000..=1_200_000);
            s.knobs.max_step_ms = 40_000;
        }
        "window" => {
            let cap = rng.gen_range(8..=30);
            let (l, w) = window(rng, cap);
            s.limits = vec![l];
            s.wcu_drains = rng.gen_range(0..=3);
            s.knobs.max_step_ms = w / 20;
        }
        "multi" => {
            let cap = rng.gen_range(10..=30);
            let (l, w) = window(rng, cap);
            s.limits = vec![
                Limit::rate("rps", 10, 10, secs(5)).expect("valid rate"),
                l,
                daily(rng.gen_range(20..=60)),
            ];
            s.start_ms = MIDNIGHT - rng.gen_range(60_000..=600_000);
            s.knobs.max_step_ms = w / 10;
        }
        "lease" => {
            let cap = rng.gen_range(10..=30);
            let (l, w) = window(rng, cap);
            s.limits = vec![
                l,
                Limit::rate("tpm", 100, 100, secs(60)).expect("valid rate"),
                daily(rng.gen_range(20..=60)),
            ];
            s.start_ms = MIDNIGHT - rng.gen_range(60_000..=600_000);
            s.lease_p = 0.6;
            s.knobs.max_step_ms = w / 10;
        }
        "cascade" => {
            // Children charge their own bucket and the shared parent's (ADR-146); the parent
            // carries every child's traffic, so it is the hot one, doubled by drained `wcu`.
            let n_children = rng.gen_range(2..=4);
            let children: Vec<String> = (0..n_children).map(|i| format!("k{i}")).collect();
            s.entities = std::iter::once("p".to_string())
                .chain(children.iter().cloned())
                .collect();
            let tpm = rng.gen_range(60..=160);
            let mut limits = vec![Limit::rate("tpm", tpm, tpm, secs(60)).expect("valid rate")];
            let quota = rng.gen_range(0..3);
            let mut step = 20_000;
            if quota != 1 {
                limits.push(daily(rng.gen_range(20..=60)));
            }
            if quota != 0 {
                let cap = rng.gen_range(12..=40);
                let (l, w) = window(rng, cap);
                limits.push(l);
                step = w / 12;
            }
            s.limits = limits;
            s.start_ms = MIDNIGHT - rng.gen_range(60_000..=600_000);
            s.clients = clients.max(3);
            s.ops_per_client = rng.gen_range(20..=40);
            s.wcu_drains = rng.gen_range(2..=6);
            s.lease_p = 0.5;
            s.knobs.max_step_ms = step;
            s.cascade = Some(Cascade {
                parent: "p".into(),
                children,
                via_resource: rng.gen_bool(0.5),
                parent_p: 0.15,
            });
        }
        "burst" => {
            // The idle-then-burst repro: a bucket left idle past a full refill is spent in a
            // burst by warm clients; leases adjust both ways (debt included) and roll back.
            let cap = rng.gen_range(5..=20);
            s.limits = vec![
                Limit::rate("tok", cap, cap, secs(6)).expect("valid rate"),
                Limit::rate("rpm", 60, 60, secs(60)).expect("valid rate"),
            ];
            s.tok_max = rng.gen_range(1..=4);
            s.idle_p = 0.15;
            s.lease_p = 0.5;
            s.over_refund_p = 0.2;
            s.knobs.max_step_ms = *[20, 100, 400].choose(rng).unwrap_or(&100);
            s.ops_per_client = rng.gen_range(20..=40);
        }
        "drip" => {
            // Sharded dripping limits: a hot entity doubled by drained `wcu` after drains,
            // requests larger than one shard's share, debt from positive adjustments on one
            // shard, refusals on uneven shards.
            let cap = rng.gen_range(16..=64);
            s.limits = vec![Limit::rate("tok", cap, cap, secs(10)).expect("valid rate")];
            s.entities = vec!["hot".into()];
            s.clients = clients.max(3);
            s.tok_max = rng.gen_range(2..=(cap / 2).max(3));
            s.idle_p = 0.05;
            s.lease_p = 0.5;
            s.over_refund_p = 0.1;
            s.wcu_drains = rng.gen_range(1..=5);
            s.ops_per_client = rng.gen_range(20..=40);
            s.knobs.max_step_ms = *[50, 300, 1000].choose(rng).unwrap_or(&300);
        }
        "many" => {
            // ADR-148: "the model and the tool call" in one step — a rate limit on the
            // model, a tight rate limit and a daily quota on the tool; refusals of either
            // must leave the other uncharged.
            s.limits = vec![Limit::rate("rps", 10, 10, secs(5)).expect("valid rate")];
            let tool = rng.gen_range(3..=8);
            s.also = Some((
                "r-many-tool".into(),
                vec![
                    Limit::rate("tool", tool, tool, secs(10)).expect("valid rate"),
                    daily(rng.gen_range(15..=40)),
                ],
            ));
            s.start_ms = MIDNIGHT - rng.gen_range(60_000..=600_000);
            s.lease_p = 0.5;
            s.knobs.max_step_ms = *[200, 1000, 3000].choose(rng).unwrap_or(&1000);
            s.ops_per_client = rng.gen_range(15..=35);
        }
        "soft" => {
            // ADR-151: an enforced `tok` beside a `shadow` limit that clients switch
            // between soft and enforced while traffic runs; `tok` must never over-admit,
            // `shadow`'s consumption is recorded exactly either way.
            let cap = rng.gen_range(5..=15);
            let shadow = rng.gen_range(3..=6);
            s.limits = vec![
                Limit::rate("tok", cap, cap, secs(6)).expect("valid rate"),
                Limit::rate("shadow", shadow, shadow, secs(10))
                    .expect("valid rate")
                    .with_soft(true),
            ];
            s.tok_max = rng.gen_range(1..=3);
            s.soft_switch_p = *[0.03, 0.1, 0.25].choose(rng).unwrap_or(&0.1);
            // ADR-151 bypass: the entity is bypassed and enforced again while it runs.
            s.bypass_switch_p = *[0.05, 0.1, 0.2].choose(rng).unwrap_or(&0.1);
            s.lease_p = 0.4;
            s.knobs.max_step_ms = *[100, 500, 2000].choose(rng).unwrap_or(&500);
            s.ops_per_client = rng.gen_range(20..=40);
        }
        "topup" => {
            // ADR-149: an operator tops up and resets a sharded calendar quota while clients
            // drain it; responses are lost often enough that top-ups are retried.
            s.limits = vec![daily(rng.gen_range(10..=40))];
            s.start_ms = MIDNIGHT - rng.gen_range(60_000..=1_200_000);
            s.fault_p = *[0.02, 0.05, 0.1].choose(rng).unwrap_or(&0.05);
            s.knobs.delay_p = 0.05;
            s.knobs.lost_fanout_p = 0.1;
            s.clients = clients.max(3);
            s.ops_per_client = rng.gen_range(20..=40);
            s.wcu_drains = rng.gen_range(0..=4);
            s.lease_p = 0.3;
            s.operator_actions = rng.gen_range(3..=10);
            s.knobs.max_step_ms = 40_000;
        }
        _ => {
            // hot: one entity hammered, doubled up to 32 shards by drained `wcu`.
            let cap = rng.gen_range(64..=160);
            let (l, w) = window(rng, cap);
            s.limits = vec![l, daily(rng.gen_range(64..=160))];
            s.entities = vec!["hot".into()];
            s.start_ms = MIDNIGHT - rng.gen_range(60_000..=600_000);
            s.clients = clients.max(3);
            s.ops_per_client = rng.gen_range(25..=45);
            s.wcu_drains = rng.gen_range(3..=8);
            s.lease_p = 0.2;
            s.knobs.max_step_ms = w / 15;
        }
    }
    s
}

/// Store the workload's limits at the resource level (directly, before the run); for the
/// cascade workload, create the parent and its children and switch cascade on (by each
/// child's META flag or by the resource's policy).
pub async fn setup(mem: Arc<tollgate_store::MemoryStore>, spec: &Spec) -> Result<(), Error> {
    // Simulated time and a fixed shard draw: the entities' `created_at` stamps end up in the
    // final store, which the run's hash covers.
    let clock = Arc::new(crate::sched::SkewClock {
        base: Arc::new(std::sync::atomic::AtomicI64::new(spec.start_ms)),
        skew: 0,
    });
    let lim = Limiter::builder(mem)
        .namespace(NS)
        .clock(clock)
        .rng(Arc::new(PinnedRng::new(0)))
        .audit_seed(0)
        .build()?;
    let scope = Scope::Resource(spec.resource.clone());
    lim.admin().set_limits(&scope, &spec.limits).await?;
    if let Some((r, ls)) = &spec.also {
        lim.admin()
            .set_limits(&Scope::Resource(r.clone()), ls)
            .await?;
    }
    let Some(c) = &spec.cascade else {
        return Ok(());
    };
    lim.admin()
        .create_entity(&c.parent, None, None, Default::default())
        .await?;
    for k in &c.children {
        let new = tollgate::NewEntity {
            name: None,
            parent_id: Some(&c.parent),
            cascade: !c.via_resource,
            metadata: Default::default(),
        };
        lim.admin().create_entity_with(k, new).await?;
    }
    if c.via_resource {
        lim.admin().set_cascade(&scope, Some(true)).await?;
    }
    Ok(())
}

/// Pick the amounts (tokens) of one acquire.
fn amounts(spec: &Spec, rng: &mut SmallRng) -> Vec<(String, i64)> {
    amounts_of(spec, &spec.limits, rng)
}

/// Pick amounts (tokens) for `limits`.
fn amounts_of(spec: &Spec, limits: &[Limit], rng: &mut SmallRng) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for l in limits {
        let name = l.name().to_string();
        let a = match l.refill() {
            Refill::Drip { .. } if name == "tpm" => rng.gen_range(1..=20),
            Refill::Drip { .. } if name == "tok" => rng.gen_range(1..=spec.tok_max.max(1)),
            Refill::Drip { .. } => 1,
            Refill::Calendar(_) => rng.gen_range(1..=3),
            Refill::Window { .. } => rng.gen_range(0..=3),
        };
        out.push((name, a));
    }
    if out.len() > 1 {
        // Several limits per acquire: name a non-empty random subset.
        let keep = rng.gen_range(1..=out.len());
        out.shuffle(rng);
        out.truncate(keep);
        out.sort();
    }
    out
}

fn answer(admitted: bool, statuses: &[tollgate::LimitStatus]) -> crate::ledger::Answer {
    crate::ledger::Answer {
        admitted,
        statuses: statuses
            .iter()
            .map(|s| crate::ledger::Reported {
                limit: s.limit.to_string(),
                capacity: s.capacity,
                available: s.available,
                requested: s.requested,
                exceeded: s.exceeded,
                retry_after_ms: s.retry_after_ms,
            })
            .collect(),
    }
}

fn milli(a: &[(String, i64)]) -> Vec<(String, i64)> {
    a.iter().map(|(n, v)| (n.clone(), v * 1000)).collect()
}

fn err_text(e: &Error) -> String {
    match e {
        Error::RateLimitExceeded(x) => format!("rate limited [{}]", x.violations().join(",")),
        Error::Unavailable(s) => format!("unavailable: {s}"),
        other => other.to_string(),
    }
}

/// The operator (ADR-149): top-ups and resets of the workload's quotas racing the clients,
/// each under its own operation id, retried with the same id (as an HTTP client retries a
/// request that timed out) until it is answered.
pub async fn operator(
    sh: Arc<Shared>,
    id: usize,
    lim: Limiter,
    spec: Arc<Spec>,
    mut rng: SmallRng,
) {
    let quotas: Vec<String> = spec
        .limits
        .iter()
        .filter(|l| l.is_quota())
        .map(|l| l.name().to_string())
        .collect();
    if quotas.is_empty() {
        return;
    }
    for k in 0..spec.operator_actions {
        for _ in 0..rng.gen_range(1..=8) {
            sh.turn(id).await;
        }
        let ent = spec.entities[rng.gen_range(0..spec.entities.len())].clone();
        let op_id = format!("op-{id}-{k}");
        let reset = rng.gen_bool(0.2);
        let amounts: Vec<(String, i64)> = if reset {
            Vec::new()
        } else {
            vec![(
                quotas[rng.gen_range(0..quotas.len())].clone(),
                rng.gen_range(1..=10),
            )]
        };
        let kind = if reset {
            OpKind::Reset {
                entity: ent.clone(),
                resource: spec.resource.clone(),
                op: op_id.clone(),
            }
        } else {
            OpKind::TopUp {
                entity: ent.clone(),
                resource: spec.resource.clone(),
                amounts: milli(&amounts),
                op: op_id.clone(),
            }
        };
        let op = sh.begin_op(id, kind);
        let refs: Vec<(&str, i64)> = amounts.iter().map(|(n, a)| (n.as_str(), *a)).collect();
        let mut err = None;
        for _ in 0..3 {
            let r = if reset {
                lim.admin().reset(&ent, &spec.resource, Some(&op_id)).await
            } else {
                lim.admin()
                    .top_up(&ent, &spec.resource, &refs, Some(&op_id))
                    .await
            };
            match r {
                Ok(_) => {
                    err = None;
                    break;
                }
                Err(e) => err = Some(err_text(&e)),
            }
        }
        sh.end_op(id, op, err);
    }
}

/// One simulated client: acquires, leases with adjust/commit or rollback, and the retry a
/// real client makes after a lost response.
///
/// `allow`: the client's `on_unavailable` is `allow` (checked by the `deadline` invariant
/// with how long each acquire waited).
pub async fn client(
    sh: Arc<Shared>,
    id: usize,
    lim: Limiter,
    spec: Arc<Spec>,
    mut rng: SmallRng,
    allow: bool,
) {
    let mut burst = 0;
    for _ in 0..spec.ops_per_client {
        if burst > 0 {
            burst -= 1;
        } else if spec.idle_p > 0.0 && rng.gen_bool(spec.idle_p) {
            // Idle past a full refill, then burst: the next few acquires go back to back.
            let idle = rng.gen_range(5_000..=15_000);
            sh.advance_to(sh.now() + idle);
            burst = rng.gen_range(3..=12);
        } else {
            for _ in 0..rng.gen_range(0..3) {
                sh.turn(id).await;
            }
        }
        let (ent, parent) = match &spec.cascade {
            Some(c) if !rng.gen_bool(c.parent_p) => (
                c.children[rng.gen_range(0..c.children.len())].clone(),
                Some(c.parent.clone()),
            ),
            Some(c) => (c.parent.clone(), None),
            None if rng.gen_bool(0.7) => (spec.entities[0].clone(), None),
            None => (
                spec.entities[rng.gen_range(0..spec.entities.len())].clone(),
                None,
            ),
        };
        if spec.soft_switch_p > 0.0 && rng.gen_bool(spec.soft_switch_p) {
            switch_soft(&sh, id, &lim, &spec, &mut rng).await;
        }
        if spec.bypass_switch_p > 0.0 && rng.gen_bool(spec.bypass_switch_p) {
            switch_bypass(&sh, id, &lim, &spec, &ent, &mut rng).await;
        }
        if let Some((also, also_limits)) = &spec.also {
            let a = amounts(&spec, &mut rng);
            let b = amounts_of(&spec, also_limits, &mut rng);
            multi_acquire(&sh, id, &lim, &spec, &ent, (&a, also, &b), &mut rng).await;
            continue;
        }
        let amts = amounts(&spec, &mut rng);
        let refs: Vec<(&str, i64)> = amts.iter().map(|(n, a)| (n.as_str(), *a)).collect();
        let mut retried = false;
        loop {
            let op = sh.begin_op(
                id,
                OpKind::Acquire {
                    entity: ent.clone(),
                    resource: spec.resource.clone(),
                    amounts: milli(&amts),
                    parent: parent.clone(),
                    multi: false,
                },
            );
            let called = tokio::time::Instant::now();
            let r = lim.acquire(&ent, &spec.resource, &refs).await;
            let outcome = match &r {
                Ok(l) if l.is_degraded() => Outcome::Degraded,
                Ok(_) => Outcome::Admitted,
                Err(e) if e.is_outage() => Outcome::Outage,
                Err(_) => Outcome::Other,
            };
            let ms = i64::try_from(called.elapsed().as_millis()).unwrap_or(i64::MAX);
            sh.waited(op, Waited { ms, allow, outcome });
            match &r {
                Ok(lease) if lease.is_degraded() => {}
                Ok(lease) => sh.answer(op, answer(true, lease.statuses())),
                Err(Error::RateLimitExceeded(x)) => sh.answer(op, answer(false, &x.statuses)),
                Err(_) => {}
            }
            let err = match &r {
                // Admitted without the store: nothing landed, nothing to reconcile.
                Ok(l) if l.is_degraded() => Some("degraded admit (store unavailable)".to_string()),
                r => r.as_ref().err().map(err_text),
            };
            sh.end_op(id, op, err);
            match r {
                Ok(lease) if lease.is_degraded() => break,
                Ok(mut lease) => {
                    if rng.gen_bool(spec.lease_p) {
                        lease_action(&sh, id, op, &mut lease, &spec, &amts, &mut rng).await;
                    }
                    break;
                }
                Err(Error::Unavailable(StoreError::Ambiguous(_))) if !retried => {
                    // The caller cannot tell whether it was admitted: it asks again.
                    retried = true;
                }
                Err(_) => break,
            }
        }
    }
}

/// ADR-151: store the resource's limits with every soft-at-start limit switched to soft or
/// enforced (a configuration write, outside any ledger operation; other clients see it when
/// their config cache expires).
async fn switch_soft(sh: &Arc<Shared>, id: usize, lim: &Limiter, spec: &Spec, rng: &mut SmallRng) {
    let soft = rng.gen_bool(0.5);
    let limits: Vec<Limit> = spec
        .limits
        .iter()
        .map(|l| {
            if l.is_soft() {
                l.clone().with_soft(soft)
            } else {
                l.clone()
            }
        })
        .collect();
    let r = lim
        .admin()
        .set_limits(&Scope::Resource(spec.resource.clone()), &limits)
        .await;
    if let Some(t) = sh.lock().trace.as_mut() {
        t.push(format!(
            "c{id}: soft limits of {} switched to {} ({})",
            spec.resource,
            if soft { "soft" } else { "enforced" },
            r.as_ref().map_or_else(err_text, |_| "ok".into())
        ));
    }
}

/// ADR-151: set `ent`'s use of the resource to bypass or back to enforce (an
/// administrative write, outside any ledger operation; other clients learn the stamp from
/// their next write on the item).
async fn switch_bypass(
    sh: &Arc<Shared>,
    id: usize,
    lim: &Limiter,
    spec: &Spec,
    ent: &str,
    rng: &mut SmallRng,
) {
    let mode = if rng.gen_bool(0.5) {
        tollgate::Enforcement::Bypass
    } else {
        tollgate::Enforcement::Enforce
    };
    // The pair's level (stamped at once), the resource's level (reaching each bucket on
    // its next slow pass, other clients within their config cache TTL), or the resource's
    // level cleared.
    let (scope, mode) = match rng.gen_range(0..4) {
        0 | 1 => (
            tollgate::Scope::Entity(ent.into(), Some(spec.resource.clone())),
            Some(mode),
        ),
        2 => (tollgate::Scope::Resource(spec.resource.clone()), Some(mode)),
        _ => (tollgate::Scope::Resource(spec.resource.clone()), None),
    };
    let r = lim.admin().set_scope_enforcement(&scope, mode).await;
    if let Some(t) = sh.lock().trace.as_mut() {
        t.push(format!(
            "c{id}: {scope:?} set to {mode:?} ({})",
            r.as_ref()
                .map_or_else(err_text, |n| format!("{n} shard(s)"))
        ));
    }
}

/// Named amounts in tokens.
type Tokens = [(String, i64)];

/// ADR-148: one multi-resource acquire of `spec.resource` (amounts `a`) and `also`
/// (amounts `b`), recorded as one acquire of both amounts; then, sometimes, a rollback or a
/// commit of every lease.
async fn multi_acquire(
    sh: &Arc<Shared>,
    id: usize,
    lim: &Limiter,
    spec: &Spec,
    ent: &str,
    (a, also, b): (&Tokens, &str, &Tokens),
    rng: &mut SmallRng,
) {
    let ra: Vec<(&str, i64)> = a.iter().map(|(n, v)| (n.as_str(), *v)).collect();
    let rb: Vec<(&str, i64)> = b.iter().map(|(n, v)| (n.as_str(), *v)).collect();
    let wants: Vec<(&str, &[(&str, i64)])> =
        vec![(spec.resource.as_str(), &ra[..]), (also, &rb[..])];
    let both: Vec<(String, i64)> = a.iter().chain(b).cloned().collect();
    let op = sh.begin_op(
        id,
        OpKind::Acquire {
            entity: ent.to_string(),
            resource: spec.resource.clone(),
            amounts: milli(&both),
            parent: None,
            multi: true,
        },
    );
    let r = lim.acquire_many(ent, &wants).await;
    let all_degraded = |m: &tollgate::MultiLease| m.leases().iter().all(|l| l.is_degraded());
    if let Ok(m) = &r {
        if m.is_degraded() && !all_degraded(m) {
            // Some resources admitted without the store: only the others were charged.
            let charged: Vec<(String, i64)> = m
                .leases()
                .iter()
                .zip([a, b])
                .filter(|(l, _)| !l.is_degraded())
                .flat_map(|(_, x)| x.iter().cloned())
                .collect();
            sh.charged_only(op, milli(&charged));
        }
    }
    match &r {
        Ok(m) if all_degraded(m) => {}
        Ok(m) => {
            let statuses: Vec<tollgate::LimitStatus> = m
                .leases()
                .iter()
                .flat_map(|l| l.statuses().iter().cloned())
                .collect();
            sh.answer(op, answer(true, &statuses));
        }
        Err(Error::RateLimitExceeded(x)) => sh.answer(op, answer(false, &x.statuses)),
        Err(_) => {}
    }
    let err = match &r {
        Ok(m) if all_degraded(m) => Some("degraded admit (store unavailable)".to_string()),
        r => r.as_ref().err().map(err_text),
    };
    sh.end_op(id, op, err);
    let Ok(m) = r else { return };
    if m.is_degraded() || !rng.gen_bool(spec.lease_p) {
        return;
    }
    for _ in 0..rng.gen_range(0..3) {
        sh.turn(id).await;
    }
    // Each resource's lease is finished (and recorded) on its own: one may fail while the
    // other lands, as with single leases.
    let rollback = rng.gen_bool(0.5);
    for (mut lease, amts) in m.into_leases().into_iter().zip([a, b]) {
        let kind = if rollback {
            OpKind::Rollback {
                lease_of: op,
                debits: milli(amts),
            }
        } else {
            OpKind::Commit {
                lease_of: op,
                deltas: Vec::new(),
            }
        };
        let fin = sh.begin_op(id, kind);
        let r = if rollback {
            lease.rollback().await
        } else {
            lease.commit().await
        };
        sh.end_op(id, fin, r.as_ref().err().map(err_text));
    }
}

async fn lease_action(
    sh: &Arc<Shared>,
    id: usize,
    acq: usize,
    lease: &mut tollgate::Lease,
    spec: &Spec,
    amts: &[(String, i64)],
    rng: &mut SmallRng,
) {
    for _ in 0..rng.gen_range(0..3) {
        sh.turn(id).await;
    }
    if rng.gen_bool(0.35) {
        let op = sh.begin_op(
            id,
            OpKind::Rollback {
                lease_of: acq,
                debits: milli(amts),
            },
        );
        let r = lease.rollback().await;
        sh.end_op(id, op, r.as_ref().err().map(err_text));
        return;
    }
    let mut deltas: Vec<(String, i64)> = Vec::new();
    for _ in 0..rng.gen_range(1..=2) {
        let l = &spec.limits[rng.gen_range(0..spec.limits.len())];
        let named = amts
            .iter()
            .find(|(n, _)| n == l.name())
            .map(|(_, a)| *a)
            .unwrap_or(0);
        // Refund at most what was debited (net of earlier adjustments); consume more freely.
        let already = deltas
            .iter()
            .filter(|(n, _)| n == l.name())
            .map(|(_, d)| *d)
            .sum::<i64>();
        let d = if spec.over_refund_p > 0.0 && rng.gen_bool(spec.over_refund_p) {
            // More than the lease holds: the limiter must refuse it.
            -(named + already) - rng.gen_range(1..=3)
        } else {
            rng.gen_range(-(named + already)..=3)
        };
        if d != 0 && lease.adjust(l.name(), d).is_ok() {
            deltas.push((l.name().to_string(), d));
        }
    }
    let mut net: std::collections::BTreeMap<String, i64> = Default::default();
    for (n, d) in deltas {
        *net.entry(n).or_default() += d * 1000;
    }
    let op = sh.begin_op(
        id,
        OpKind::Commit {
            lease_of: acq,
            deltas: net.into_iter().collect(),
        },
    );
    let r = lease.commit().await;
    sh.end_op(id, op, r.as_ref().err().map(err_text));
}

/// The older writer and hot-spot actor: at seeded moments, a raw `SET rf = its own clock,
/// REMOVE vu` (touching nothing else; `vu` is kept on items carrying a calendar quota, which
/// a pre-v0.15 client knows is scheduled) on a bucket item, or a raw drain of a shard's `wcu`.
pub async fn chaos(sh: Arc<Shared>, id: usize, spec: Arc<Spec>, mut rng: SmallRng, skew: i64) {
    let mut plan: Vec<bool> = std::iter::repeat_n(true, spec.old_writes)
        .chain(std::iter::repeat_n(false, spec.wcu_drains))
        .collect();
    plan.shuffle(&mut rng);
    for old in plan {
        for _ in 0..rng.gen_range(3..=25) {
            sh.turn(id).await;
        }
        sh.turn(id).await;
        let ent = &spec.entities[rng.gen_range(0..spec.entities.len())];
        // The cascade workload's parent is its hot entity: the drains double it.
        let ent = match &spec.cascade {
            Some(c) if !old => &c.parent,
            _ => ent,
        };
        let k0 = keys::bucket(NS, ent, &spec.resource, 0);
        let s = sh
            .mem
            .raw_get(&k0)
            .and_then(|i| i.get("shard_count").and_then(Value::as_n))
            .unwrap_or(1);
        let mut shard = rng.gen_range(0..s.max(1)) as u32;
        if old && rng.gen_bool(0.7) {
            // Adversarial moments: a shard with a pending roll (`ws > wa`: removing `vu`
            // lets the fast path spend the ended window's leftover), else a shard whose
            // window started after this writer's clock (its `rf` stamp goes below `ws`).
            let own = sh.now() + skew;
            let mut best: Option<(u8, u32)> = None;
            for j in 0..s.max(1) as u32 {
                let Some(i) = sh.mem.raw_get(&keys::bucket(NS, ent, &spec.resource, j)) else {
                    continue;
                };
                for l in crate::ledger::limits_on(&i) {
                    let g = |a: &str| i.get(format!("b_{l}_{a}").as_str()).and_then(Value::as_n);
                    let prio = match (g("ws"), g("wa")) {
                        (Some(ws), Some(wa)) if ws > wa => 2,
                        (Some(ws), _) if ws > own => 1,
                        _ => 0,
                    };
                    if prio > 0 && best.is_none_or(|(p, _)| prio > p) {
                        best = Some((prio, j));
                    }
                }
            }
            if let Some((_, j)) = best {
                shard = j;
            }
        }
        let key = keys::bucket(NS, ent, &spec.resource, shard);
        let Some(before) = sh.mem.raw_get(&key) else {
            continue;
        };
        let mut after: Item = before.clone();
        if old {
            after.insert("rf".into(), Value::N(sh.now() + skew));
            // A pre-v0.15 client sees calendar quotas (they are stored under `l_`) and keeps
            // `vu` on an item that carries one, since one of *its* limits is scheduled; it
            // removes `vu` only where every scheduled limit is a window it cannot see
            // (spec §6). It still stamps `rf` with its own clock either way.
            let has_calendar = after
                .keys()
                .any(|a| a.starts_with("b_") && a.ends_with("_rsched"));
            if !has_calendar {
                after.remove("vu");
            }
        } else {
            after.insert("b_wcu_tk".into(), Value::N(-10_000_000));
        }
        sh.mem.raw_put(&key, after.clone());
        sh.raw_write(
            if old { "OLD-WRITER" } else { "WCU-DRAIN" },
            &key,
            &before,
            &after,
            old,
        );
    }
}

/// After the workload: with faults off and every window ended, one zero acquire per shard
/// (shard 0 first: it opens a window and fans it out; every other shard rolls into it or
/// joins it), then every shard must carry the same `ws` (and `wa`), availability must report
/// `ws + rsa` as the window's reset instant, and the shards must hold at most one allowance.
pub async fn quiesce(
    sh: Arc<Shared>,
    id: usize,
    spec: Arc<Spec>,
    out: Arc<std::sync::Mutex<Vec<Violation>>>,
) {
    let windows: Vec<(String, i64, i64)> = spec
        .limits
        .iter()
        .filter_map(|l| match l.refill() {
            Refill::Window { reset_after_s } => Some((
                l.name().to_string(),
                reset_after_s * 1000,
                l.capacity_milli(),
            )),
            _ => None,
        })
        .collect();
    let mut bad = Vec::new();
    for (name, len, cap) in &windows {
        for ent in &spec.entities {
            let k0 = keys::bucket(NS, ent, &spec.resource, 0);
            let Some(i0) = sh.mem.raw_get(&k0) else {
                continue;
            };
            let s = i0.get("shard_count").and_then(Value::as_n).unwrap_or(1);
            let mut latest = sh.now();
            for j in 0..s as u32 {
                if let Some(i) = sh.mem.raw_get(&keys::bucket(NS, ent, &spec.resource, j)) {
                    for a in ["rf", &format!("b_{name}_ws")] {
                        if let Some(v) = i.get(a).and_then(Value::as_n) {
                            latest = latest.max(v + len);
                        }
                    }
                }
            }
            sh.advance_to(latest + 2 * spec.skew + 1000);
            let pin = Arc::new(PinnedRng::new(0));
            let clock = Arc::new(crate::sched::SkewClock {
                base: sh.now.clone(),
                skew: 0,
            });
            let Ok(lim) = Limiter::builder(Arc::new(crate::sched::SimStore {
                client: id,
                sh: sh.clone(),
            }))
            .namespace(NS)
            .clock(clock)
            .rng(pin.clone())
            .audit_seed(id as u64)
            .speculative(false)
            .build() else {
                continue;
            };
            for j in 0..s as u32 {
                pin.pin(j);
                let op = sh.begin_op(id, OpKind::Check);
                let r = lim
                    .acquire(ent, &spec.resource, &[(name.as_str(), 0)])
                    .await;
                sh.end_op(id, op, r.as_ref().err().map(err_text));
                if let Err(e) = r {
                    bad.push(format!(
                        "{ent}: quiesce acquire(0) on shard {j} failed: {}",
                        err_text(&e)
                    ));
                }
            }
            let mut starts = Vec::new();
            let mut held = 0;
            for j in 0..s as u32 {
                let Some(i) = sh.mem.raw_get(&keys::bucket(NS, ent, &spec.resource, j)) else {
                    continue;
                };
                let g = |a: &str| {
                    i.get(format!("b_{name}_{a}").as_str())
                        .and_then(Value::as_n)
                };
                starts.push((j, g("ws"), g("wa")));
                held += g("tk").unwrap_or(0);
            }
            let ws0 = starts.first().and_then(|s| s.1);
            let disagree: Vec<String> = starts
                .iter()
                .filter(|(_, ws, wa)| *ws != ws0 || *wa != ws0)
                .map(|(j, ws, wa)| format!("shard {j}: ws={ws:?} wa={wa:?}"))
                .collect();
            if !disagree.is_empty() {
                bad.push(format!(
                    "{ent}/{} {name}: shards disagree with shard 0's ws={ws0:?} once quiet: {}",
                    spec.resource,
                    disagree.join(", ")
                ));
            }
            if held > *cap {
                bad.push(format!(
                    "{ent}/{} {name}: a fresh window holds {} > capacity {} over {} shards",
                    spec.resource,
                    crate::ledger::fmt_milli(held),
                    crate::ledger::fmt_milli(*cap),
                    s
                ));
            }
            match lim
                .check_availability(ent, &spec.resource, tollgate::Amounts::new())
                .await
            {
                Ok(av) => {
                    let got = av
                        .limits
                        .iter()
                        .find(|st| st.limit == *name)
                        .and_then(|st| st.resets_at_ms);
                    let want = ws0.map(|w| w + len);
                    if got != want {
                        bad.push(format!(
                            "{ent}/{} {name}: check_availability resets_at={got:?}, expected ws+rsa={want:?}",
                            spec.resource
                        ));
                    }
                }
                Err(e) => bad.push(format!(
                    "{ent}: check_availability failed: {}",
                    err_text(&e)
                )),
            }
        }
    }
    let mut g = out.lock().unwrap_or_else(|e| e.into_inner());
    for d in bad {
        g.push(Violation {
            invariant: "one-reset-instant",
            detail: d,
        });
    }
}

//! The seeded scheduler and the store wrapper every simulated client talks through.
//!
//! Every store request is a scheduling point: [`SimStore`] registers it as pending and waits
//! for a permit; the driver ([`drive`]) polls the client futures itself, and whenever every
//! live client is blocked it lets the seeded [`Shared::grant_next`] pick which pending request
//! runs next. The granted request then runs to completion before any other client moves (the
//! in-memory store answers synchronously), so the wrapper can read the item images before and
//! after each write and hand them to the [`Ledger`]. Simulated time moves forward in seeded
//! steps at grant time. The same seed therefore replays the same interleaving exactly.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use async_trait::async_trait;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tollgate::Clock;
use tollgate_core::expr::{Action, SetValue, Update};
use tollgate_core::value::{Item, Key, Value};
use tollgate_store::{
    DeleteRequest, FaultyStore, MemoryStore, PutRequest, Query, Store, StoreError, TransactOp,
    UpdateRequest,
};

use crate::ledger::Ledger;

/// A boxed client task.
pub type Task = Pin<Box<dyn Future<Output = ()>>>;

/// One request waiting for its permit.
#[derive(Debug, Clone)]
struct Pending {
    client: usize,
    /// Scheduling rounds this request still sits out (an injected delay).
    delay: u32,
}

/// Scheduler knobs drawn from the seed.
#[derive(Debug, Clone, Copy)]
pub struct Knobs {
    /// Probability that a grant is preceded by a step of simulated time.
    pub advance_p: f64,
    /// Largest step of simulated time (ms).
    pub max_step_ms: i64,
    /// Probability that a request is delayed (sits out 1..=8 scheduling rounds).
    pub delay_p: f64,
    /// Probability that a rollover fan-out write is lost (never reaches the store).
    pub lost_fanout_p: f64,
}

/// Mutable scheduler state (behind one mutex; only one request runs at a time anyway).
pub struct SchedState {
    pending: BTreeMap<u64, Pending>,
    next_id: u64,
    granted: Option<u64>,
    /// Requests granted so far.
    pub step: u64,
    rng: SmallRng,
    /// Scheduler knobs.
    pub knobs: Knobs,
    /// Readable trace lines (only when tracing).
    pub trace: Option<Vec<String>>,
    /// FNV-1a hash of everything that happened, in order.
    pub hash: u64,
    /// The ground-truth ledger.
    pub ledger: Ledger,
    /// Per client: the ledger operation in progress.
    pub current_op: Vec<Option<usize>>,
    /// Store requests executed.
    pub store_ops: u64,
    /// Delays injected by the scheduler.
    pub delays: u64,
    /// Fan-out writes dropped.
    pub lost_fanouts: u64,
    /// Older-writer and hot-spot raw writes.
    pub raw_writes: u64,
    /// Probability that a request hangs (never answers within the client's deadline).
    pub hang_p: f64,
    /// The hang draws (their own stream: a run without hangs draws nothing from it).
    pub hang_rng: SmallRng,
    /// Requests hung.
    pub hangs: u64,
}

/// How long a hung request takes to answer (tokio time): far past any client deadline,
/// so a client without one is seen waiting (the `deadline` invariant).
pub const HANG: std::time::Duration = std::time::Duration::from_secs(600);

/// What a hung request does before it hangs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hang {
    /// It never reached the store.
    Lost,
    /// It was applied; its answer never comes.
    Applied,
}

/// State shared by the driver, every client's store handle and the ledger.
pub struct Shared {
    /// The reference store (raw access for images and raw writers).
    pub mem: Arc<MemoryStore>,
    /// The fault-injecting wrapper every client request goes through.
    pub faulty: FaultyStore<Arc<MemoryStore>>,
    /// True simulated time (epoch ms); client clocks are this plus a skew.
    pub now: Arc<AtomicI64>,
    st: Mutex<SchedState>,
}

/// FNV-1a step.
pub fn fnv(h: u64, bytes: &[u8]) -> u64 {
    // FNV-1a over 8-byte words (then the tail bytes), with the length mixed in: as
    // deterministic as byte-wise FNV and an eighth of the multiplications.
    let mut h = h ^ bytes.len() as u64;
    h = h.wrapping_mul(0x0000_0100_0000_01b3);
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let mut a = [0u8; 8];
        a.copy_from_slice(w);
        h ^= u64::from_le_bytes(a);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    for b in words.remainder() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// [`fnv`] of one 8-byte word (`fnv(h, &w.to_le_bytes())`), without the slice walk.
#[inline]
pub fn fnv_word(h: u64, w: u64) -> u64 {
    let h = (h ^ 8).wrapping_mul(0x0000_0100_0000_01b3);
    (h ^ w).wrapping_mul(0x0000_0100_0000_01b3)
}

/// FNV-1a offset basis.
pub const FNV0: u64 = 0xcbf2_9ce4_8422_2325;

impl Shared {
    /// A world over `mem` with faults from `faulty`, time starting at `start_ms`.
    pub fn new(
        mem: Arc<MemoryStore>,
        faulty: FaultyStore<Arc<MemoryStore>>,
        start_ms: i64,
        rng: SmallRng,
        knobs: Knobs,
        clients: usize,
        trace: bool,
    ) -> Arc<Self> {
        Arc::new(Shared {
            mem,
            faulty,
            now: Arc::new(AtomicI64::new(start_ms)),
            st: Mutex::new(SchedState {
                pending: BTreeMap::new(),
                next_id: 0,
                granted: None,
                step: 0,
                rng,
                knobs,
                trace: trace.then(Vec::new),
                hash: FNV0,
                ledger: Ledger::default(),
                current_op: vec![None; clients],
                store_ops: 0,
                delays: 0,
                lost_fanouts: 0,
                raw_writes: 0,
                hang_p: 0.0,
                hang_rng: SmallRng::seed_from_u64(0),
                hangs: 0,
            }),
        })
    }

    /// Lock the scheduler state (a poisoned lock is still usable: every section is short).
    pub fn lock(&self) -> MutexGuard<'_, SchedState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True simulated time.
    pub fn now(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }

    /// Move true time to at least `t`.
    pub fn advance_to(&self, t: i64) {
        self.now.fetch_max(t, Ordering::SeqCst);
    }

    /// A scheduling point for `client`: resolves once the scheduler grants it.
    pub fn turn(self: &Arc<Self>, client: usize) -> Turn {
        Turn {
            sh: self.clone(),
            client,
            id: None,
        }
    }

    /// Pick the next pending request (seeded), after maybe stepping time. `None` when
    /// nothing is pending.
    pub fn grant_next(&self) -> Option<usize> {
        let mut g = self.lock();
        let st = &mut *g;
        if st.pending.is_empty() {
            return None;
        }
        if st.rng.gen_bool(st.knobs.advance_p) {
            let step = st.rng.gen_range(1..=st.knobs.max_step_ms.max(1));
            self.now.fetch_add(step, Ordering::SeqCst);
        }
        // The pool: the requests not delayed, else every pending one (in id order); one is
        // drawn by its index in the pool, without collecting the pool.
        let ready = st.pending.values().filter(|p| p.delay == 0).count();
        let pool_len = if ready == 0 { st.pending.len() } else { ready };
        let k = st.rng.gen_range(0..pool_len);
        let id = st
            .pending
            .iter()
            .filter(|(_, p)| ready == 0 || p.delay == 0)
            .nth(k)
            .map(|(id, _)| *id)?;
        for p in st.pending.values_mut() {
            p.delay = p.delay.saturating_sub(1);
        }
        let p = st.pending.remove(&id)?;
        st.granted = Some(id);
        st.step += 1;
        st.hash = fnv(st.hash, &id.to_le_bytes());
        Some(p.client)
    }

    /// Append a trace line (and hash it) — built only when tracing.
    pub fn trace(&self, st: &mut SchedState, line: impl FnOnce() -> String) {
        if let Some(t) = st.trace.as_mut() {
            let l = format!("#{:<5} t={} {}", st.step, self.now(), line());
            t.push(l);
        }
    }

    /// Current images of `keys` (raw, strongly consistent).
    pub fn images(&self, keys: &[Key]) -> Vec<Option<Arc<Item>>> {
        keys.iter().map(|k| self.mem.raw_image(k)).collect()
    }

    /// After a write by `client`: hash and trace it, and give the images to the ledger.
    pub fn after_write(
        &self,
        client: usize,
        kind: &str,
        keys: &[Key],
        before: Vec<Option<Arc<Item>>>,
        err: Option<&StoreError>,
        t_call: i64,
    ) {
        let after = self.images(keys);
        let mut g = self.lock();
        let st = &mut *g;
        st.store_ops += 1;
        let outcome = outcome_tag(err);
        st.hash = fnv(st.hash, &(client as u64).to_le_bytes());
        st.hash = fnv(st.hash, kind.as_bytes());
        st.hash = fnv(st.hash, outcome.as_bytes());
        for (k, a) in keys.iter().zip(&after) {
            st.hash = fnv(st.hash, k.pk.as_bytes());
            st.hash = hash_item(st.hash, a.as_deref());
        }
        if st.trace.is_some() {
            let diffs: Vec<String> = keys
                .iter()
                .zip(before.iter().zip(&after))
                .map(|(k, (b, a))| format!("{} {}", short(k), diff(b.as_deref(), a.as_deref())))
                .collect();
            let op = st.current_op.get(client).copied().flatten();
            self.trace(st, || {
                format!(
                    "c{client} {kind} -> {outcome} op={} {}",
                    op.map(|o| o.to_string()).unwrap_or_else(|| "-".into()),
                    diffs.join(" | ")
                )
            });
        }
        let now = self.now();
        let step = st.step;
        let op = st.current_op.get(client).copied().flatten();
        let lost = matches!(err, Some(StoreError::Ambiguous(_)));
        // One pass per key (its key parsed once): latencies, failed writes and `tc` changes
        // are kept in lists of their own, so each still lists the keys in order.
        for (k, (b, a)) in keys.iter().zip(before.into_iter().zip(after)) {
            let Some(bucket) = st.ledger.bucket_of(k) else {
                continue;
            };
            st.ledger.record_latency(&bucket, step, now - t_call);
            if err.is_some() {
                st.ledger.record_failed_write_at(op, &bucket, step);
            }
            // The store keeps an item it did not write as the same allocation: the images
            // are equal, which the ledger skips (it compares them in full otherwise).
            let untouched = match (&b, &a) {
                (Some(b), Some(a)) => Arc::ptr_eq(b, a),
                (None, None) => true,
                _ => false,
            };
            if untouched {
                continue;
            }
            st.ledger.record_write(
                client,
                op,
                &bucket,
                b.as_deref(),
                a.as_deref(),
                now,
                step,
                lost,
            );
        }
    }

    /// After a read by `client`: hash and trace it.
    pub fn after_read(&self, client: usize, kind: &str, keys: &[Key], err: Option<&StoreError>) {
        let mut g = self.lock();
        let st = &mut *g;
        st.store_ops += 1;
        let outcome = outcome_tag(err);
        st.hash = fnv(st.hash, &(client as u64).to_le_bytes());
        st.hash = fnv(st.hash, kind.as_bytes());
        st.hash = fnv(st.hash, outcome.as_bytes());
        if st.trace.is_some() {
            let ks: Vec<String> = keys.iter().map(short).collect();
            self.trace(st, || {
                format!("c{client} {kind} {} -> {outcome}", ks.join(","))
            });
        }
    }

    /// A read by `client` that hangs: what the caller will see (an outage at its deadline)
    /// is recorded now, as a failed request of its operation on those items.
    pub fn hung_read(&self, client: usize, keys: &[Key]) {
        self.after_read(
            client,
            "hung(read)",
            keys,
            Some(&StoreError::Unavailable("sim: hung".into())),
        );
        let mut g = self.lock();
        let st = &mut *g;
        let op = st.current_op.get(client).copied().flatten();
        let step = st.step;
        for k in keys {
            st.ledger.record_failed_write(op, k, step);
        }
    }

    /// Start a ledger operation for `client`.
    pub fn begin_op(&self, client: usize, kind: crate::ledger::OpKind) -> usize {
        let t = self.now();
        let mut g = self.lock();
        let st = &mut *g;
        let id = st.ledger.begin(client, kind, t);
        if let Some(c) = st.current_op.get_mut(client) {
            *c = Some(id);
        }
        id
    }

    /// Narrow a multi-resource acquire's amounts to what the store charged: the resources
    /// admitted degraded (`on_unavailable = allow`) wrote nothing.
    pub fn charged_only(&self, op: usize, charged: Vec<(String, i64)>) {
        let mut g = self.lock();
        if let Some(crate::ledger::OpKind::Acquire { amounts, .. }) =
            g.ledger.ops.get_mut(op).map(|o| &mut o.kind)
        {
            *amounts = charged;
        }
    }

    /// Record what an acquire's answer reported.
    pub fn answer(&self, op: usize, answer: crate::ledger::Answer) {
        self.lock().ledger.answer(op, answer);
    }

    /// Finish a ledger operation (`err` = the caller's error, if any).
    pub fn end_op(&self, client: usize, op: usize, err: Option<String>) {
        let mut g = self.lock();
        let st = &mut *g;
        st.hash = fnv(st.hash, &(op as u64).to_le_bytes());
        st.hash = fnv(st.hash, err.as_deref().unwrap_or("ok").as_bytes());
        if st.trace.is_some() {
            let what = format!("{:?}", st.ledger.ops.get(op).map(|o| &o.kind));
            let e = err.clone();
            self.trace(st, || {
                format!(
                    "c{client} op {op} {} => {}",
                    what,
                    e.as_deref().unwrap_or("OK")
                )
            });
        }
        let t = self.now();
        st.ledger.end(op, err, t);
        if let Some(c) = st.current_op.get_mut(client) {
            *c = None;
        }
    }

    /// A raw write by the older-writer / hot-spot actor (already applied to `mem`).
    pub fn raw_write(&self, kind: &str, key: &Key, before: &Item, after: &Item, old_writer: bool) {
        let mut g = self.lock();
        let st = &mut *g;
        st.raw_writes += 1;
        st.hash = fnv(st.hash, kind.as_bytes());
        st.hash = hash_item(st.hash, Some(after));
        if st.trace.is_some() {
            let d = format!("{} {}", short(key), diff(Some(before), Some(after)));
            self.trace(st, || format!("{kind} {d}"));
        }
        if old_writer {
            let step = st.step;
            let t = self.now();
            st.ledger.record_old_writer(key, before, after, step, t);
        }
    }

    /// Record how long an acquire waited and how it was answered.
    pub fn waited(&self, op: usize, w: crate::ledger::Waited) {
        let mut g = self.lock();
        let st = &mut *g;
        st.hash = fnv(st.hash, &w.ms.to_le_bytes());
        st.ledger.waited(op, w);
    }

    /// Make requests hang with probability `p`, drawn from `rng`.
    pub fn set_hang(&self, p: f64, rng: SmallRng) {
        let mut g = self.lock();
        g.hang_p = p;
        g.hang_rng = rng;
    }

    /// Whether this request hangs, and how (seeded; `None` when hangs are off).
    fn hang(&self) -> Option<Hang> {
        let mut g = self.lock();
        let st = &mut *g;
        if st.hang_p <= 0.0 || !st.hang_rng.gen_bool(st.hang_p) {
            return None;
        }
        st.hangs += 1;
        st.hash = fnv(st.hash, b"hang");
        Some(if st.hang_rng.gen_bool(0.5) {
            Hang::Applied
        } else {
            Hang::Lost
        })
    }

    /// Whether to drop this fan-out write (seeded).
    fn drop_fanout(&self) -> bool {
        let mut g = self.lock();
        let st = &mut *g;
        let p = st.knobs.lost_fanout_p;
        if p > 0.0 && st.rng.gen_bool(p) {
            st.lost_fanouts += 1;
            true
        } else {
            false
        }
    }
}

fn outcome_tag(err: Option<&StoreError>) -> &'static str {
    match err {
        None => "ok",
        Some(StoreError::ConditionFailed { .. }) => "condition-failed",
        Some(StoreError::TransactionCanceled { .. }) => "tx-canceled",
        Some(StoreError::TransactionConflict) => "tx-conflict",
        Some(StoreError::Throttled(_)) => "throttled",
        Some(StoreError::Validation(_)) => "invalid",
        Some(StoreError::Ambiguous(_)) => "LOST-RESPONSE",
        Some(StoreError::Unavailable(_)) => "unavailable",
        Some(StoreError::Corrupt(_)) => "corrupt",
    }
}

/// Hash an item's attributes (names and numbers/strings) into `h`.
pub fn hash_item(mut h: u64, item: Option<&Item>) -> u64 {
    let Some(i) = item else {
        return fnv(h, b"none");
    };
    for (k, v) in i {
        h = fnv(h, k.as_bytes());
        h = match v {
            Value::N(n) => fnv_word(h, u64::from_le_bytes(n.to_le_bytes())),
            Value::S(s) => fnv(h, s.as_bytes()),
            Value::Bool(b) => fnv(h, &[u8::from(*b)]),
            _ => fnv(h, b"?"),
        };
    }
    h
}

/// A short readable name of a key: `e0/res#shard` for buckets, the PK otherwise.
pub fn short(k: &Key) -> String {
    match crate::ledger::parse_bucket(k) {
        Some((e, r, s)) => format!("{e}/{r}#{s}"),
        None => format!("{}|{}", k.pk, k.sk),
    }
}

fn num(v: &Value) -> String {
    match v {
        Value::N(n) => n.to_string(),
        Value::S(s) => format!("{s:?}"),
        Value::Bool(b) => b.to_string(),
        other => format!("{other:?}"),
    }
}

/// The attributes that changed between two images (GSI and static attributes left out).
pub fn diff(b: Option<&Item>, a: Option<&Item>) -> String {
    match (b, a) {
        (None, None) => "(absent)".into(),
        (Some(_), None) => "DELETED".into(),
        (b, Some(a)) => {
            let mut out = Vec::new();
            if b.is_none() {
                out.push("CREATED".to_string());
            }
            let skip = |k: &str| {
                k.starts_with("GSI")
                    || k == "PK"
                    || k == "SK"
                    || k == "entity_id"
                    || k == "resource"
                    || k == "shard"
                    || k == "ph"
                    || k.ends_with("_cp")
                    || k.ends_with("_ra")
                    || k.ends_with("_rp")
                    || k.ends_with("_rsched")
                    || k.ends_with("_tz")
            };
            for (k, v) in a {
                if skip(k) {
                    continue;
                }
                match b.and_then(|b| b.get(k)) {
                    Some(old) if old == v => {}
                    Some(old) => out.push(format!("{k}:{}→{}", num(old), num(v))),
                    None => out.push(format!("{k}={}", num(v))),
                }
            }
            if let Some(b) = b {
                for k in b.keys() {
                    if !a.contains_key(k) && !skip(k) {
                        out.push(format!("-{k}"));
                    }
                }
            }
            if out.is_empty() {
                "(unchanged)".into()
            } else {
                out.join(" ")
            }
        }
    }
}

/// A scheduling point: `Pending` until the scheduler grants it.
pub struct Turn {
    sh: Arc<Shared>,
    client: usize,
    id: Option<u64>,
}

impl Future for Turn {
    type Output = ();
    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let mut g = this.sh.lock();
        let st = &mut *g;
        match this.id {
            None => {
                let id = st.next_id;
                st.next_id += 1;
                let delay = if st.knobs.delay_p > 0.0 && st.rng.gen_bool(st.knobs.delay_p) {
                    st.delays += 1;
                    st.rng.gen_range(1..=8)
                } else {
                    0
                };
                st.pending.insert(
                    id,
                    Pending {
                        client: this.client,
                        delay,
                    },
                );
                this.id = Some(id);
                Poll::Pending
            }
            Some(id) if st.granted == Some(id) => {
                st.granted = None;
                Poll::Ready(())
            }
            Some(_) => Poll::Pending,
        }
    }
}

/// Run `tasks` to completion under the seeded scheduler. Must be called inside a
/// current-thread tokio runtime with paused time (the limiter's retry back-off sleeps then
/// cost nothing and fire in a fixed order).
pub async fn drive(sh: &Arc<Shared>, tasks: Vec<(usize, Task)>) {
    let n = tasks.len();
    let ids: Vec<usize> = tasks.iter().map(|(id, _)| *id).collect();
    let mut tasks: Vec<Task> = tasks.into_iter().map(|(_, t)| t).collect();
    let mut done = vec![false; n];
    let mut runnable: Vec<usize> = (0..n).collect();
    std::future::poll_fn(move |cx| loop {
        for c in std::mem::take(&mut runnable) {
            if !done[c] && tasks[c].as_mut().poll(cx).is_ready() {
                done[c] = true;
            }
        }
        if done.iter().all(|d| *d) {
            return Poll::Ready(());
        }
        match sh.grant_next() {
            Some(client) => match ids.iter().position(|id| *id == client) {
                Some(i) => runnable.push(i),
                None => continue,
            },
            None => {
                // Every live task sleeps on a timer (a retry back-off): let the paused
                // runtime advance its clock, then poll them all again.
                runnable = (0..n).filter(|c| !done[*c]).collect();
                return Poll::Pending;
            }
        }
    })
    .await
}

/// A client clock: true simulated time plus a fixed skew.
#[derive(Debug)]
pub struct SkewClock {
    /// True time.
    pub base: Arc<AtomicI64>,
    /// This client's skew (ms, may be negative).
    pub skew: i64,
}

impl Clock for SkewClock {
    fn now_ms(&self) -> i64 {
        self.base.load(Ordering::SeqCst) + self.skew
    }
}

/// The store handle of one simulated client: every request waits for its turn.
pub struct SimStore {
    /// Client index.
    pub client: usize,
    /// The world.
    pub sh: Arc<Shared>,
}

/// Whether an update is a rollover fan-out write (it snapshots `wtc` from `tc`).
fn is_fanout(u: &Update) -> bool {
    u.actions
        .iter()
        .any(|a| matches!(a, Action::Set(n, SetValue::IfNotExists(_, _)) if n.ends_with("_wtc")))
}

impl SimStore {
    /// Send a write through the hang fault. Without a hang: the write's result, for the
    /// caller to record. With one: the write never reaches the store (`Lost`) or is applied
    /// and its answer never comes (`Applied`); either way the outcome the caller will see
    /// at its deadline is recorded now, and this waits out [`HANG`] (the caller's deadline
    /// drops it first). `Err` carries the hung outcome, already recorded.
    async fn hanging<T>(
        &self,
        keys: &[Key],
        before: &[Option<Arc<Item>>],
        t_call: i64,
        write: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<Result<T, StoreError>, StoreError> {
        let Some(hang) = self.sh.hang() else {
            return Ok(write.await);
        };
        let (kind, seen, answer) = match hang {
            Hang::Lost => {
                let e = StoreError::Unavailable("sim: hung before reaching the store".into());
                ("hung(LOST)", e.clone(), e)
            }
            Hang::Applied => {
                let hung = StoreError::Ambiguous("sim: applied, the answer hung".into());
                match write.await {
                    Ok(_) => ("hung(APPLIED)", hung.clone(), hung),
                    Err(e) => ("hung", e, hung),
                }
            }
        };
        self.sh.after_write(
            self.client,
            kind,
            keys,
            before.to_vec(),
            Some(&seen),
            t_call,
        );
        tokio::time::sleep(HANG).await;
        Err(answer)
    }
}

#[async_trait]
impl Store for SimStore {
    async fn get(&self, key: &Key, consistent: bool) -> Result<Option<Item>, StoreError> {
        self.sh.turn(self.client).await;
        if self.sh.hang().is_some() {
            self.sh.hung_read(self.client, std::slice::from_ref(key));
            tokio::time::sleep(HANG).await;
        }
        let r = self.sh.faulty.get(key, consistent).await;
        let kind = if consistent { "get" } else { "get~" };
        self.sh.after_read(
            self.client,
            kind,
            std::slice::from_ref(key),
            r.as_ref().err(),
        );
        r
    }

    async fn batch_get(
        &self,
        keys: &[Key],
        consistent: bool,
    ) -> Result<Vec<Option<Item>>, StoreError> {
        Ok(tollgate_store::owned_items(
            self.batch_get_shared(keys, consistent).await?,
        ))
    }

    async fn batch_get_shared(
        &self,
        keys: &[Key],
        consistent: bool,
    ) -> Result<Vec<Option<Arc<Item>>>, StoreError> {
        self.sh.turn(self.client).await;
        if self.sh.hang().is_some() {
            self.sh.hung_read(self.client, keys);
            tokio::time::sleep(HANG).await;
        }
        let r = self.sh.faulty.batch_get_shared(keys, consistent).await;
        let kind = if consistent {
            "batch_get"
        } else {
            "batch_get~"
        };
        self.sh
            .after_read(self.client, kind, keys, r.as_ref().err());
        r
    }

    async fn put(&self, req: PutRequest) -> Result<(), StoreError> {
        let t_call = self.sh.now();
        self.sh.turn(self.client).await;
        let keys = vec![req.key.clone()];
        let before = self.sh.images(&keys);
        let r = self
            .hanging(&keys, &before, t_call, self.sh.faulty.put(req))
            .await?;
        self.sh
            .after_write(self.client, "put", &keys, before, r.as_ref().err(), t_call);
        r
    }

    async fn update(&self, req: UpdateRequest) -> Result<Option<Item>, StoreError> {
        Ok(self.update_shared(req).await?.map(Arc::unwrap_or_clone))
    }

    async fn update_shared(&self, req: UpdateRequest) -> Result<Option<Arc<Item>>, StoreError> {
        let t_call = self.sh.now();
        self.sh.turn(self.client).await;
        let keys = vec![req.key.clone()];
        let before = self.sh.images(&keys);
        let fanout = is_fanout(&req.update);
        if fanout && self.sh.drop_fanout() {
            let e = StoreError::Unavailable(
                "sim: fan-out write lost before it reached the store".into(),
            );
            self.sh
                .after_write(self.client, "fanout(LOST)", &keys, before, Some(&e), t_call);
            return Err(e);
        }
        let r = self
            .hanging(&keys, &before, t_call, self.sh.faulty.update_shared(req))
            .await?;
        let kind = if fanout { "fanout" } else { "update" };
        self.sh
            .after_write(self.client, kind, &keys, before, r.as_ref().err(), t_call);
        r
    }

    async fn delete(&self, req: DeleteRequest) -> Result<Option<Item>, StoreError> {
        let t_call = self.sh.now();
        self.sh.turn(self.client).await;
        let keys = vec![req.key.clone()];
        let before = self.sh.images(&keys);
        let r = self
            .hanging(&keys, &before, t_call, self.sh.faulty.delete(req))
            .await?;
        self.sh.after_write(
            self.client,
            "delete",
            &keys,
            before,
            r.as_ref().err(),
            t_call,
        );
        r
    }

    async fn transact_write(
        &self,
        ops: Vec<TransactOp>,
        token: Option<String>,
    ) -> Result<(), StoreError> {
        let t_call = self.sh.now();
        self.sh.turn(self.client).await;
        let keys: Vec<Key> = ops
            .iter()
            .filter(|o| !matches!(o, TransactOp::Check { .. }))
            .map(|o| o.key().clone())
            .collect();
        let before = self.sh.images(&keys);
        let r = self
            .hanging(
                &keys,
                &before,
                t_call,
                self.sh.faulty.transact_write(ops, token),
            )
            .await?;
        self.sh.after_write(
            self.client,
            "transact",
            &keys,
            before,
            r.as_ref().err(),
            t_call,
        );
        r
    }

    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
        self.sh.turn(self.client).await;
        if self.sh.hang().is_some() {
            self.sh.hung_read(self.client, &[]);
            tokio::time::sleep(HANG).await;
        }
        let r = self.sh.faulty.query(q).await;
        self.sh
            .after_read(self.client, "query", &[], r.as_ref().err());
        r
    }

    fn backend(&self) -> &'static str {
        "sim"
    }
}

/// The feed through the scheduler: each read is a scheduling point with the read faults of
/// the run (throttles); what it returns is the store's log.
#[async_trait]
impl tollgate_store::ChangeFeed for SimStore {
    async fn read_feed(
        &self,
        cursor: &tollgate_store::FeedCursor,
        limit: usize,
    ) -> Result<tollgate_store::FeedBatch, StoreError> {
        self.sh.turn(self.client).await;
        let r = self.sh.faulty.read_feed(cursor, limit).await;
        self.sh
            .after_read(self.client, "read_feed", &[], r.as_ref().err());
        r
    }

    /// Trims reach the store (not a scheduling point: a pass trims only what it has read
    /// and counted, or — an absorbing aggregator — what it holds).
    async fn trim_feed(
        &self,
        cursor: &tollgate_store::FeedCursor,
        before_ms: i64,
    ) -> Result<(), StoreError> {
        self.sh.faulty.trim_feed(cursor, before_ms).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_word_is_fnv_of_the_bytes() {
        for (h, w) in [
            (FNV0, 0u64),
            (FNV0, 1),
            (7, u64::MAX),
            (0, 0x0123_4567_89ab_cdef),
            (FNV0, (-5i64) as u64),
        ] {
            assert_eq!(fnv_word(h, w), fnv(h, &w.to_le_bytes()));
        }
    }
}

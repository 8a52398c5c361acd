//! The ground-truth ledger: every client operation (acquire, lease commit, rollback), every
//! change of `tc` the store saw (from the images before and after each write), shard
//! creations and older-writer `rf` stamps — and the invariant checks over them.
//!
//! Invariants (each violation names one):
//!
//! - `rf-monotonic`: a write by a current limiter never lowers a bucket item's `rf`.
//! - `rf-pins`: a write that leaves a bucket item's `rf` as it was changes none of the
//!   attributes the rf lock pins (`ph`, `ttl`, `cascade`, every limit's `cp`, `ra`, `rp`,
//!   `rsched`, `tz` and `rc`) — the premise on which an rf-locked write leaves out what the
//!   item it is locked on already holds (rule `tollgate_core::writes::restates`).
//! - `consumed-once`: an operation that succeeded moved `tc` by exactly its amounts (an
//!   acquire by its amounts, a commit by its adjustments, a rollback by minus the debit); an
//!   operation that failed moved nothing — unless one of its writes was applied with its
//!   response lost, which is reported as a *residual* (the caller was told "error" but `tc`
//!   moved), not as a violation. Movements are counted per entity: a cascade acquire
//!   (ADR-146) that succeeded moved its amounts on the child *and* on the parent, and its
//!   lease's commit or rollback moves both; a failed one moved neither (the parent's refusal
//!   rolled the child back). Two cascade partial outcomes are residuals, not violations, when
//!   a write of the operation failed: a refused cascade acquire whose child rollback write
//!   failed after the child's debit (the child keeps a debit nobody was granted), and a
//!   cascade commit/rollback of which exactly one side applied in full while a write on the
//!   other side failed (that side stays open, as `Lease::commit` documents).
//! - `window-roll-charge`: a roll into a fanned-out window leaves `tk + (tc − wtc)` at most
//!   the shard's share (consumption since the fan-out snapshot is charged, ADR-140).
//! - `tc-total`: at the end, Σ `tc` over every shard of every (entity, resource, limit) equals
//!   the sum of every `tc` change the ledger saw (no write escaped it).
//! - `window-allowance`: for a duration-window quota, admissions are attributed to the window
//!   start `ws` on the shard item they landed on; starts are grouped into phases (a phase
//!   begins at the smallest start not yet grouped and holds every start less than one window
//!   length later — a shard can adopt at most one start per phase); admitted per phase ≤ C.
//! - `calendar-allowance`: for a calendar quota, admissions are attributed to the period of
//!   the item's `rf` after the write; admitted per period ≤ C + what operators added to it
//!   (ADR-149: each top-up's amount once per operation id, one C per reset).
//! - `rate-allowance`: for a dripping limit, at every admission, net admitted so far ≤ Σ over
//!   created shards of (share at creation + rate share × (true time + skew bound − the `rf`
//!   stamped at creation)) + what older writers' backward `rf` stamps re-credited.
//!
//! - `rate-envelope`: for a dripping limit, the token-bucket envelope over every interval that
//!   ends at an admission: what the entity consumed in `[a, b]` (admissions and positive
//!   adjustments, less refunds) is at most `capacity + rate × (b − a + 2 × (skew + δ))` (+ one
//!   token of rounding), whatever the shard count, where δ is the longest any write applied
//!   in the interval waited between being issued and being applied (a request decides with
//!   the clock reading it carries); backward `rf` stamps of older writers in the interval (or
//!   up to one full refill before it) are credited.
//! - `lease-net`: per lease and limit, what the lease consumed net of its adjustments and its
//!   rollback never goes below zero (a refund never returns more than the lease took).
//! - `multi-all-or-none` (ADR-148): a refused multi-resource acquire moved no `tc` once its
//!   refunds landed (checked by `consumed-once`; a refund write that failed leaves the
//!   landed debit, which is a residual: the caller was told the error).
//! - Soft limits (ADR-151): a limit that is soft at any time of the run (`Ledger::soft`) is
//!   exempt from the allowance checks and from "a limit reported as fitting covers the
//!   amount"; its consumption is still checked by `consumed-once` and `tc-total` (recorded
//!   exactly, conserved when enforcement resumes), and every enforced limit of the same
//!   requests keeps every check.
//! - Bypass (ADR-151): a write that leaves the item stamped `bypass` recorded its
//!   consumption without debiting; it is no admission for the allowance checks (but counts
//!   for `consumed-once` and `tc-total`). A bypass-shaped write that lands on an item without
//!   the stamp is an admission like any other — so a client that still believes the scope
//!   bypassed cannot admit for free once enforcement resumed (mutant `BypassStamp`).
//! - `honest-answer`: a refusal names at least one exceeded limit; an exceeded limit reports
//!   less available than requested, no retry-after exactly when the request is larger than
//!   the capacity, and a limit reported as not exceeded fits; an admission reports no limit
//!   exceeded.
//!
//! "Admitted" is what callers were told was granted: successful acquires, less refunds
//! (rollback, negative adjustment) that landed on the same shard in the same window/period
//! (refunds that land elsewhere cannot be re-spent and are not credited). Positive
//! adjustments are debt, which the limiter allows by design; they are not counted.

use std::collections::BTreeMap;
use std::sync::Arc;

use tollgate_core::value::{Item, Key, Value};
use tollgate_core::{Limit, Refill};

/// What a client operation was.
#[derive(Debug, Clone)]
pub enum OpKind {
    /// An acquire of named amounts (millitokens).
    Acquire {
        /// Entity.
        entity: String,
        /// Resource.
        resource: String,
        /// Named amounts (milli).
        amounts: Vec<(String, i64)>,
        /// The parent the acquire cascades to (ADR-146): a success charged the same
        /// amounts on the parent's bucket too; a failure charged neither.
        parent: Option<String>,
        /// A multi-resource acquire (ADR-148): `amounts` lists every resource's amounts
        /// (limit names are distinct across its resources); a success charged all of them,
        /// a failure none once its refunds landed.
        multi: bool,
    },
    /// A lease commit of adjustments (milli, positive = consumed more).
    Commit {
        /// The acquire operation that granted the lease.
        lease_of: usize,
        /// Adjustments.
        deltas: Vec<(String, i64)>,
    },
    /// A lease rollback (milli, the debits to refund).
    Rollback {
        /// The acquire operation that granted the lease.
        lease_of: usize,
        /// The debits refunded (positive numbers).
        debits: Vec<(String, i64)>,
    },
    /// The quiesce check's own acquires (amount 0).
    Check,
    /// An operator's top-up (ADR-149) of named amounts (milli), under operation id `op`: it
    /// raises the allowance of the period it lands in by its amounts, once, however often
    /// it is retried.
    TopUp {
        /// Entity.
        entity: String,
        /// Resource.
        resource: String,
        /// Named amounts (milli).
        amounts: Vec<(String, i64)>,
        /// The operation id (every retry resends it).
        op: String,
    },
    /// An operator's reset (ADR-149): the allowance of the period it lands in grows by at
    /// most one capacity.
    Reset {
        /// Entity.
        entity: String,
        /// Resource.
        resource: String,
        /// The operation id.
        op: String,
    },
}

/// One operation and its outcome.
#[derive(Debug, Clone)]
pub struct OpRec {
    /// Client index.
    pub client: usize,
    /// What it was.
    pub kind: OpKind,
    /// `Some(true)` succeeded, `Some(false)` failed, `None` still running.
    pub ok: Option<bool>,
    /// The error, if it failed.
    pub err: Option<String>,
    /// Simulated time when it started.
    pub t: i64,
    /// Simulated time when it ended (`t` until it does).
    pub t_end: i64,
    /// What the answer reported (acquires): admitted or refused, with its statuses.
    pub answer: Option<Answer>,
    /// How long the caller waited for the answer, and under which policy (acquires).
    pub waited: Option<Waited>,
}

/// How an acquire's caller waited, and how it was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waited {
    /// Tokio (virtual) time from the call to the answer (ms).
    pub ms: i64,
    /// The client's `on_unavailable` is `allow`.
    pub allow: bool,
    /// The answer.
    pub outcome: Outcome,
}

/// How an acquire was answered, as the fail-open rule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A lease from the store.
    Admitted,
    /// A degraded lease: the store was down and the policy allowed.
    Degraded,
    /// An outage error.
    Outage,
    /// A refusal or any other error.
    Other,
}

/// The longest an acquire may wait (ms of tokio time): a deadline of 1 s per store call,
/// with room for retry back-offs, and far below a hung request's answer.
pub const ANSWER_BOUND_MS: i64 = 30_000;

/// What one limit's status in an answer said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reported {
    /// Limit name.
    pub limit: String,
    /// Capacity (tokens).
    pub capacity: i64,
    /// Available (tokens).
    pub available: i64,
    /// Requested (tokens).
    pub requested: i64,
    /// Marked exceeded.
    pub exceeded: bool,
    /// Retry-after (ms).
    pub retry_after_ms: Option<i64>,
}

/// An acquire's answer as the caller saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// Admitted (a lease) or refused (`RateLimitExceeded`).
    pub admitted: bool,
    /// The statuses it reported.
    pub statuses: Vec<Reported>,
}

/// One change of a limit's `tc` on one shard item.
#[derive(Debug, Clone)]
pub struct TcEvent {
    /// The operation whose write it was.
    pub op: Option<usize>,
    /// Entity.
    pub entity: Name,
    /// Resource.
    pub resource: Name,
    /// Shard.
    pub shard: u32,
    /// Limit.
    pub limit: Name,
    /// Change of `tc` (milli).
    pub delta: i64,
    /// The limit's window start on the item after the write.
    pub window_start_ms: Option<i64>,
    /// The item's `rf` after the write.
    pub refilled_at_ms: i64,
    /// True time of the write.
    pub t: i64,
    /// Scheduler step.
    pub step: u64,
    /// The write's response was lost (the caller saw `Ambiguous`).
    pub lost: bool,
    /// The item after the write carries the `bypass` stamp (ADR-151): the consumption was
    /// recorded, not debited, and is exempt from the allowance checks.
    pub bypassed: bool,
}

/// ADR-151: whether a write that moved `limit`'s `tc` by `delta` recorded it without
/// debiting: consumption that left the item stamped `bypass` — written on a stamped item
/// (an enforced write requires the stamp absent and never sets it), or by the slow pass
/// that set the stamp because the configured mode says bypass (shaped for bypass) — or a
/// refund that left the balance where it was on a stamped item (a bypassed lease's; an
/// enforced lease's refund credits its balance and counts).
/// (`after`'s fields of the limit in `fa`, the image before's in `fb`.)
fn recorded_only(after: &Item, fa: &LimitFields, fb: Option<&LimitFields>, delta: i64) -> bool {
    let stamped = |i: &Item| i.contains_key("bypass");
    if !stamped(after) {
        return false;
    }
    if delta > 0 {
        return true;
    }
    fb.is_some_and(|b| b.tk == fa.tk)
}

/// A bucket item came into being.
#[derive(Debug, Clone)]
pub struct Creation {
    /// Entity.
    pub entity: Name,
    /// Resource.
    pub resource: Name,
    /// Shard.
    pub shard: u32,
    /// The shard count stamped at creation.
    pub shard_count: i64,
    /// The `rf` stamped at creation (the refill baseline, a client's clock reading).
    pub refilled_at_ms: i64,
    /// True time.
    pub t: i64,
    /// Scheduler step.
    pub step: u64,
}

/// An older writer's `rf` stamp.
#[derive(Debug, Clone)]
pub struct OldRf {
    /// Entity.
    pub entity: Name,
    /// Resource.
    pub resource: Name,
    /// Shard.
    pub shard: u32,
    /// `rf` before.
    pub before: i64,
    /// `rf` written.
    pub after: i64,
    /// Scheduler step.
    pub step: u64,
    /// True time.
    pub t: i64,
}

/// A write by a client operation that the store refused or failed (a lost response included:
/// the caller cannot tell whether it applied).
#[derive(Debug, Clone)]
pub struct FailedWrite {
    /// The operation.
    pub op: usize,
    /// Entity of the bucket written.
    pub entity: Name,
    /// Resource of the bucket written.
    pub resource: Name,
    /// Shard of the bucket written.
    pub shard: u32,
    /// Scheduler step.
    pub step: u64,
}

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The invariant's name.
    pub invariant: &'static str,
    /// What happened, with numbers.
    pub detail: String,
}

/// Everything the run saw.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Operations, indexed by id.
    pub ops: Vec<OpRec>,
    /// `tc` changes.
    pub consumed: Vec<TcEvent>,
    /// Shard creations.
    pub creations: Vec<Creation>,
    /// Older-writer stamps.
    pub old_rf: Vec<OldRf>,
    /// Bucket writes of client operations that failed (for cascade partial outcomes).
    pub failed_writes: Vec<FailedWrite>,
    /// Violations found.
    pub violations: Vec<Violation>,
    /// Documented residuals (not violations): lost responses whose write applied.
    pub residuals: Vec<String>,
    /// Per bucket write (entity, resource, step): how long it waited between being issued
    /// and being applied (ms) — the staleness of the clock reading it carries.
    pub latencies: Vec<(Name, Name, u64, i64)>,
    /// Limits soft at some time of the run (ADR-151): see the module docs.
    pub soft: std::collections::BTreeSet<String>,
    /// Overdraw per (`entity/resource`, limit), milli: of every applied write's
    /// consumption, the part that took the shard's balance below zero, from the write's own
    /// images (`tollgate_core::usage::overdraw_of`) — what the usage snapshots must count.
    pub overdraw: BTreeMap<(String, String), i64>,
    /// Every entity, resource and limit name the records carry, each allocated once.
    names: Names,
}

/// A bucket item's place: `(entity, resource, shard)` of its key (see [`parse_bucket`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// Entity.
    pub entity: Name,
    /// Resource.
    pub resource: Name,
    /// Shard.
    pub shard: u32,
}

/// An entity, resource or limit name in the ledger's records: shared, so that recording a
/// write copies no text (compared and ordered by its text, as a `String` is).
pub type Name = Arc<str>;

/// The names a run's records share (a run has a handful, so a linear search finds them).
#[derive(Debug, Default)]
struct Names(Vec<Name>);

impl Names {
    /// The shared copy of `s` (made on first sight).
    fn get(&mut self, s: &str) -> Name {
        if let Some(n) = self.0.iter().find(|n| ***n == *s) {
            return n.clone();
        }
        let n: Name = Arc::from(s);
        self.0.push(n.clone());
        n
    }
}

/// A bucket attribute name `b_{limit}_{field}`, built in one reused buffer instead of a
/// `format!` per lookup.
#[derive(Debug, Default)]
struct AttrBuf(String);

/// The numeric fields of one limit on a bucket item (`b_{limit}_{field}`; `None` when absent
/// or not a number, as [`n`] reads them) that the ledger's write checks use.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct LimitFields {
    tc: Option<i64>,
    tk: Option<i64>,
    ws: Option<i64>,
    wa: Option<i64>,
    wtc: Option<i64>,
    pe: Option<i64>,
    cp: Option<i64>,
    gc: Option<i64>,
}

impl LimitFields {
    /// Read `limit`'s fields from `item` in one pass: an item's attributes are sorted, so
    /// every `b_{limit}_…` name sits in one run from the first name at or after the prefix.
    /// A field is matched by its whole remaining name (`b_a_b_tc`, limit `a_b`'s `tc`, is
    /// no field of limit `a`: no field name holds a `_`), so each field is exactly what
    /// `n(item, "b_{limit}_{field}")` reads.
    fn of(item: &Item, limit: &str, attr: &mut AttrBuf) -> Self {
        let prefix = attr.of(limit, "");
        let mut f = Self::default();
        for (k, v) in item.range_from(prefix) {
            let Some(field) = k.strip_prefix(prefix) else {
                break;
            };
            let slot = match field {
                "tc" => &mut f.tc,
                "tk" => &mut f.tk,
                "ws" => &mut f.ws,
                "wa" => &mut f.wa,
                "wtc" => &mut f.wtc,
                "pe" => &mut f.pe,
                "cp" => &mut f.cp,
                "gc" => &mut f.gc,
                _ => continue,
            };
            *slot = v.as_n();
        }
        f
    }
}

impl AttrBuf {
    /// `b_{limit}_{field}`.
    fn of(&mut self, limit: &str, field: &str) -> &str {
        self.0.clear();
        self.0.push_str("b_");
        self.0.push_str(limit);
        self.0.push('_');
        self.0.push_str(field);
        &self.0
    }
}

/// `(entity, resource, shard)` of a bucket key `{ns}/BUCKET#{entity}#{resource}#{shard}`
/// (borrowed from the key).
pub fn parse_bucket(k: &Key) -> Option<(&str, &str, u32)> {
    const MARK: &str = "/BUCKET#";
    let pk: &str = &k.pk;
    // The first `/BUCKET#` (the one `split_once` finds), looked for only where a `/` is.
    let at = pk
        .match_indices('/')
        .map(|(i, _)| i)
        .find(|i| pk[*i..].starts_with(MARK))?;
    let rest = &pk[at + MARK.len()..];
    let mut parts = rest.rsplitn(3, '#');
    let shard = parts.next()?.parse().ok()?;
    let resource = parts.next()?;
    let entity = parts.next()?;
    Some((entity, resource, shard))
}

/// Whether `name` is an attribute the rf lock pins (invariant `rf-pins`): written only by
/// writes that move `rf` (see `tollgate_core::writes::restates`).
fn pinned(name: &str) -> bool {
    matches!(name, "ph" | "ttl" | "cascade")
        || name.strip_prefix("b_").is_some_and(|rest| {
            ["_cp", "_ra", "_rp", "_rsched", "_tz", "_rc"]
                .iter()
                .any(|f| rest.ends_with(f))
        })
}

/// The first pinned attribute whose value differs between `before` and `after` (present in
/// one and not the other counts).
fn pinned_change<'a>(before: &'a Item, after: &'a Item) -> Option<&'a str> {
    before
        .keys()
        .chain(after.keys())
        .map(|k| k.as_ref())
        .find(|k| pinned(k) && before.get(*k) != after.get(*k))
}

fn n(item: &Item, a: &str) -> Option<i64> {
    item.get(a).and_then(Value::as_n)
}

/// Limit names carried on a bucket item (`b_{name}_tc`), the write-capacity guard excluded.
pub fn limits_on(item: &Item) -> Vec<String> {
    limit_names(item).map(str::to_string).collect()
}

/// [`limits_on`] without copying the names (borrowed from the item, in its order).
pub fn limit_names(item: &Item) -> impl Iterator<Item = &str> {
    item.keys()
        .filter_map(|k| k.strip_prefix("b_")?.strip_suffix("_tc"))
        .filter(|n| *n != "wcu")
}

type Slot = (Name, Name, Name);

/// Where an acquire's debit landed: (shard, ws, rf).
type Landed = (u32, Option<i64>, i64);

/// `tc` moved per (entity, limit).
type Moves<'a> = BTreeMap<(&'a str, &'a str), i64>;

impl Ledger {
    /// Start an operation; returns its id.
    pub fn begin(&mut self, client: usize, kind: OpKind, t: i64) -> usize {
        self.ops.push(OpRec {
            client,
            kind,
            ok: None,
            err: None,
            t,
            t_end: t,
            answer: None,
            waited: None,
        });
        self.ops.len() - 1
    }

    /// Finish an operation.
    pub fn end(&mut self, op: usize, err: Option<String>, t: i64) {
        if let Some(o) = self.ops.get_mut(op) {
            o.ok = Some(err.is_none());
            o.err = err;
            o.t_end = t.max(o.t);
        }
    }

    /// The bucket `key` addresses, its names shared with the ledger's records (`None` for
    /// an item that is no bucket): parse a key once for the recorders.
    pub fn bucket_of(&mut self, key: &Key) -> Option<Bucket> {
        let (e, r, shard) = parse_bucket(key)?;
        Some(Bucket {
            entity: self.names.get(e),
            resource: self.names.get(r),
            shard,
        })
    }

    /// A write to bucket `b` issued `latency` ms before it was applied (at `step`).
    pub fn record_latency(&mut self, b: &Bucket, step: u64, latency: i64) {
        self.latencies
            .push((b.entity.clone(), b.resource.clone(), step, latency.max(0)));
    }

    /// Record what an acquire's answer reported.
    pub fn answer(&mut self, op: usize, answer: Answer) {
        if let Some(o) = self.ops.get_mut(op) {
            o.answer = Some(answer);
        }
    }

    /// A write to `bucket` by a current limiter: check `rf`, note creations and `tc`
    /// changes.
    #[allow(clippy::too_many_arguments)]
    pub fn record_write(
        &mut self,
        client: usize,
        op: Option<usize>,
        bucket: &Bucket,
        before: Option<&Item>,
        after: Option<&Item>,
        t: i64,
        step: u64,
        lost: bool,
    ) {
        let Bucket {
            entity,
            resource,
            shard,
        } = bucket;
        let shard = *shard;
        if before == after {
            return;
        }
        if let (Some(b), Some(a)) = (before, after) {
            if let (Some(rb), Some(ra)) = (n(b, "rf"), n(a, "rf")) {
                if ra < rb {
                    self.violations.push(Violation {
                        invariant: "rf-monotonic",
                        detail: format!(
                            "step {step}: client c{client} moved rf of {entity}/{resource}#{shard} back from {rb} to {ra} ({} ms)",
                            ra - rb
                        ),
                    });
                }
            }
        }
        if let (Some(b), Some(a)) = (before, after) {
            if n(b, "rf") == n(a, "rf") {
                if let Some(name) = pinned_change(b, a) {
                    self.violations.push(Violation {
                        invariant: "rf-pins",
                        detail: format!(
                            "step {step}: client c{client} changed {name} of {entity}/{resource}#{shard} ({:?} -> {:?}) without moving rf",
                            b.get(name),
                            a.get(name)
                        ),
                    });
                }
            }
        }
        let Some(a) = after else { return };
        if before.is_none() {
            self.creations.push(Creation {
                entity: entity.clone(),
                resource: resource.clone(),
                shard,
                shard_count: n(a, "shard_count").unwrap_or(1),
                refilled_at_ms: n(a, "rf").unwrap_or(t),
                t,
                step,
            });
        }
        let rf = n(a, "rf").unwrap_or(0);
        let mut attr = AttrBuf::default();
        // One pass per limit: the roll-charge check (it reports to `violations`) and the `tc`
        // change (to `consumed` and `overdraw`), each limit's fields read once per image.
        for l in limit_names(a) {
            let fa = LimitFields::of(a, l, &mut attr);
            let fb = before.map(|b| LimitFields::of(b, l, &mut attr));
            self.check_roll_charge(client, entity, resource, shard, l, before, a, &fa, fb, step);
            let tc_a = fa.tc.unwrap_or(0);
            let tc_b = fb.and_then(|f| f.tc).unwrap_or(0);
            if tc_a != tc_b {
                let od = tollgate_core::usage::overdraw_of(
                    tc_a - tc_b,
                    fa.tk.unwrap_or(0),
                    tollgate_core::usage::debited(before, a, l),
                );
                if od != 0 {
                    *self
                        .overdraw
                        .entry((format!("{entity}/{resource}"), l.to_string()))
                        .or_default() += od;
                }
                let window_start_ms = fa.ws;
                // A calendar quota's balance belongs to the period of the edge it
                // reflects (`pe`); `rf` stands in on unmarked items.
                let refilled_at_ms = fa.pe.unwrap_or(rf);
                let bypassed = recorded_only(a, &fa, fb.as_ref(), tc_a - tc_b);
                let limit = self.names.get(l);
                self.consumed.push(TcEvent {
                    op,
                    entity: entity.clone(),
                    resource: resource.clone(),
                    shard,
                    limit,
                    delta: tc_a - tc_b,
                    window_start_ms,
                    refilled_at_ms,
                    t,
                    step,
                    lost,
                    bypassed,
                });
            }
        }
    }

    /// `window-roll-charge` (ADR-140): a write that rolls a shard into a fanned-out window
    /// (`ws` unchanged, `wa` moves up to it) must leave `tk + (tc − wtc) ≤ C // gc`: what the
    /// shard can still spend plus what it consumed since the fan-out snapshot is at most its
    /// share. Every ADD path (debit, retry, adjust, rollback) keeps `tk + tc` constant, so this
    /// holds exactly when the roll charged `tc − wtc`.
    #[allow(clippy::too_many_arguments)]
    fn check_roll_charge(
        &mut self,
        client: usize,
        entity: &str,
        resource: &str,
        shard: u32,
        l: &str,
        before: Option<&Item>,
        a: &Item,
        fa: &LimitFields,
        fb: Option<LimitFields>,
        step: u64,
    ) {
        let (Some(b), Some(fb)) = (before, fb) else {
            return;
        };
        let (Some(ws_b), Some(ws_a), Some(wa_a), Some(wtc)) = (fb.ws, fa.ws, fa.wa, fa.wtc) else {
            return;
        };
        let pending = match fb.wa {
            Some(wa_b) => ws_b > wa_b,
            None => n(b, "rf").is_some_and(|rf| ws_b > rf),
        };
        if !(pending && ws_a == ws_b && wa_a == ws_a) {
            return;
        }
        let (Some(tk), Some(tc), Some(cp)) = (fa.tk, fa.tc, fa.cp) else {
            return;
        };
        let gc = fa
            .gc
            .filter(|x| *x >= 1)
            .or(n(a, "shard_count"))
            .unwrap_or(1)
            .max(1);
        let share = cp / gc;
        if tk + (tc - wtc) > share {
            self.violate(
                "window-roll-charge",
                format!(
                    "step {step}: c{client} rolled {entity}/{resource}#{shard} {l} into ws={ws_a}: tk {} + consumed since the fan-out snapshot {} > share {}",
                    fmt_milli(tk),
                    fmt_milli(tc - wtc),
                    fmt_milli(share)
                ),
            );
        }
    }

    /// A bucket write of operation `op` that returned an error (applied or not).
    pub fn record_failed_write(&mut self, op: Option<usize>, key: &Key, step: u64) {
        if op.is_none() {
            return;
        }
        if let Some(b) = self.bucket_of(key) {
            self.record_failed_write_at(op, &b, step);
        }
    }

    /// [`Ledger::record_failed_write`] on a parsed bucket key.
    pub fn record_failed_write_at(&mut self, op: Option<usize>, b: &Bucket, step: u64) {
        let Some(op) = op else { return };
        self.failed_writes.push(FailedWrite {
            op,
            entity: b.entity.clone(),
            resource: b.resource.clone(),
            shard: b.shard,
            step,
        });
    }

    /// Whether a refused multi-resource acquire's refund failed: a write of the operation
    /// failed on a bucket after the operation's debit landed on that same bucket.
    fn refund_failed(&self, id: usize) -> bool {
        self.consumed
            .iter()
            .filter(|e| e.op == Some(id) && e.delta > 0)
            .any(|d| {
                self.failed_writes.iter().any(|f| {
                    f.op == id
                        && f.entity == d.entity
                        && f.resource == d.resource
                        && f.shard == d.shard
                        && f.step > d.step
                })
            })
    }

    /// The entities an operation's writes land on: the acquire's entity, then its cascade
    /// parent (for a commit or rollback, those of the acquire that granted the lease).
    fn sides<'a>(&'a self, kind: &'a OpKind) -> Vec<&'a str> {
        let acq = match kind {
            OpKind::Commit { lease_of, .. } | OpKind::Rollback { lease_of, .. } => {
                self.ops.get(*lease_of).map(|o| &o.kind)
            }
            k => Some(k),
        };
        match acq {
            Some(OpKind::Acquire { entity, parent, .. }) => std::iter::once(entity.as_str())
                .chain(parent.as_deref())
                .collect(),
            _ => Vec::new(),
        }
    }

    /// A failed cascade operation whose per-side movements are an allowed partial outcome
    /// (see `consumed-once` in the module docs): its description, else `None`.
    fn cascade_partial(
        &self,
        id: usize,
        op: &OpRec,
        moved: &Moves<'_>,
        full: &Moves<'_>,
    ) -> Option<String> {
        let sides = self.sides(&op.kind);
        let &[child, parent] = sides.as_slice() else {
            return None;
        };
        let of = |m: &Moves<'_>, e: &str| -> BTreeMap<String, i64> {
            m.iter()
                .filter(|((en, _), _)| *en == e)
                .map(|((_, l), v)| (l.to_string(), *v))
                .collect()
        };
        let failed_on = |e: &str, shard: Option<u32>, after: u64| {
            self.failed_writes.iter().any(|f| {
                f.op == id
                    && *f.entity == *e
                    && shard.is_none_or(|s| s == f.shard)
                    && f.step > after
            })
        };
        let (mc, mp) = (of(moved, child), of(moved, parent));
        let (fc, fp) = (of(full, child), of(full, parent));
        if let OpKind::Acquire { .. } = op.kind {
            // The child's debit stands: the rollback after the parent's refusal failed (a
            // later failed write on the debited shard itself: the child's own fan-outs go
            // to its siblings).
            let (debit, shard) = self
                .consumed
                .iter()
                .filter(|e| e.op == Some(id) && *e.entity == *child && e.delta > 0)
                .map(|e| (e.step, e.shard))
                .max()?;
            let undo_failed = failed_on(child, Some(shard), debit);
            return (mp.is_empty() && !mc.is_empty() && mc == fc && undo_failed)
                .then(|| {
                    format!(
                        "the child {child}'s debit {mc:?} stands: the parent refused and the child's rollback write failed"
                    )
                });
        }
        if !mc.is_empty() && mc == fc && mp.is_empty() && failed_on(parent, None, 0) {
            return Some(format!(
                "only the child {child}'s side applied {mc:?}; the parent {parent}'s write failed (its side stays open)"
            ));
        }
        if !mp.is_empty() && mp == fp && mc.is_empty() && failed_on(child, None, 0) {
            return Some(format!(
                "only the parent {parent}'s side applied {mp:?}; the child {child}'s write failed (its side stays open)"
            ));
        }
        None
    }

    /// An older writer's raw write (exempt from `rf-monotonic`; its backward stamps are
    /// credited to dripping limits' allowance).
    pub fn record_old_writer(&mut self, key: &Key, before: &Item, after: &Item, step: u64, t: i64) {
        let Some((entity, resource, shard)) = parse_bucket(key) else {
            return;
        };
        if let (Some(b), Some(a)) = (n(before, "rf"), n(after, "rf")) {
            let (entity, resource) = (self.names.get(entity), self.names.get(resource));
            self.old_rf.push(OldRf {
                entity,
                resource,
                shard,
                before: b,
                after: a,
                step,
                t,
            });
        }
    }

    /// An acquire's wait and outcome.
    pub fn waited(&mut self, op: usize, w: Waited) {
        if let Some(o) = self.ops.get_mut(op) {
            o.waited = Some(w);
        }
    }

    /// Invariant `deadline`: every acquire is answered within [`ANSWER_BOUND_MS`] however
    /// long a store request hangs (rule "a hung store is an outage"), and the answer
    /// follows the caller's policy: an `allow` client never gets an outage error, a
    /// `block` client never a degraded lease (rule "only an outage fails open").
    fn check_deadline(&mut self) {
        let mut found = Vec::new();
        for (i, o) in self.ops.iter().enumerate() {
            let Some(w) = o.waited else { continue };
            if w.ms > ANSWER_BOUND_MS {
                found.push(format!(
                    "op {i} (client c{}): acquire answered after {} ms (> {ANSWER_BOUND_MS} ms): a hung store call was waited out",
                    o.client, w.ms
                ));
            }
            if w.allow && w.outcome == Outcome::Outage {
                found.push(format!(
                    "op {i} (client c{}): an allow client was answered with an outage error",
                    o.client
                ));
            }
            if !w.allow && w.outcome == Outcome::Degraded {
                found.push(format!(
                    "op {i} (client c{}): a block client was admitted without the store",
                    o.client
                ));
            }
        }
        for d in found {
            self.violate("deadline", d);
        }
    }

    /// ADR-151: a lease whose acquire landed on a bypassed item finishes bypassed — its
    /// adjustments and rollback record `tc` only, wherever the stamp is by then: mark them.
    fn mark_bypassed_leases(&mut self) {
        let leases: std::collections::BTreeSet<usize> = self
            .consumed
            .iter()
            .filter(|e| e.bypassed)
            .filter_map(|e| e.op)
            .filter(|o| {
                matches!(
                    self.ops.get(*o).map(|r| &r.kind),
                    Some(OpKind::Acquire { .. })
                )
            })
            .collect();
        for e in &mut self.consumed {
            let of = match e.op.and_then(|o| self.ops.get(o)).map(|r| &r.kind) {
                Some(OpKind::Commit { lease_of, .. } | OpKind::Rollback { lease_of, .. }) => {
                    Some(*lease_of)
                }
                _ => None,
            };
            if of.is_some_and(|l| leases.contains(&l)) {
                e.bypassed = true;
            }
        }
    }

    fn violate(&mut self, invariant: &'static str, detail: String) {
        self.violations.push(Violation { invariant, detail });
    }

    /// Run every end-of-run check. `limits` per resource; `items` = every stored item;
    /// `skew` = the clock-skew bound (ms).
    pub fn finish(&mut self, limits: &BTreeMap<String, Vec<Limit>>, items: &[Item], skew: i64) {
        self.mark_bypassed_leases();
        self.soft = limits
            .values()
            .flatten()
            .filter(|l| l.is_soft())
            .map(|l| l.name().to_string())
            .collect();
        self.check_consumed_once(limits);
        self.check_tc_total(items);
        self.check_lease_net();
        self.check_answers();
        self.check_deadline();
        let adm = self.admissions();
        for (res, ls) in limits {
            for l in ls.iter().filter(|l| !l.is_soft()) {
                match l.refill() {
                    Refill::Window { reset_after_s } => {
                        self.check_window(res, l, reset_after_s * 1000, &adm)
                    }
                    Refill::Calendar(_) => self.check_calendar(res, l, &adm, skew),
                    Refill::Drip { amount, period_ms } => {
                        self.check_rate(res, l, *amount, *period_ms, skew, &adm);
                        self.check_envelope(res, l, *amount, *period_ms, skew);
                    }
                }
            }
        }
    }

    fn check_consumed_once(&mut self, limits: &BTreeMap<String, Vec<Limit>>) {
        let mut by_op: BTreeMap<usize, (Moves<'_>, bool)> = BTreeMap::new();
        for e in &self.consumed {
            if let Some(op) = e.op {
                let slot = by_op.entry(op).or_default();
                *slot.0.entry((&*e.entity, &*e.limit)).or_default() += e.delta;
                slot.1 |= e.lost;
            } else {
                let d = format!(
                    "step {}: tc of {}/{}#{} {} moved by {} outside any client operation",
                    e.step, e.entity, e.resource, e.shard, e.limit, e.delta
                );
                self.violations.push(Violation {
                    invariant: "consumed-once",
                    detail: d,
                });
            }
        }
        let mut found = Vec::new();
        let mut residuals = Vec::new();
        for (id, op) in self.ops.iter().enumerate() {
            let (moved, lost): (Moves<'_>, bool) = match by_op.get(&id) {
                Some((m, lost)) => (
                    m.iter()
                        .filter(|(_, v)| **v != 0)
                        .map(|(k, v)| (*k, *v))
                        .collect(),
                    *lost,
                ),
                None => (Moves::new(), false),
            };
            // What the operation moves when it succeeds, on every side (child, then parent).
            let per_side: Vec<(&str, i64)> = match &op.kind {
                OpKind::Acquire { amounts, .. } => {
                    amounts.iter().map(|(k, v)| (k.as_str(), *v)).collect()
                }
                OpKind::Commit { deltas, .. } => {
                    deltas.iter().map(|(k, v)| (k.as_str(), *v)).collect()
                }
                OpKind::Rollback { debits, .. } => {
                    debits.iter().map(|(k, v)| (k.as_str(), -v)).collect()
                }
                OpKind::Check | OpKind::TopUp { .. } | OpKind::Reset { .. } => Vec::new(),
            };
            let mut full = Moves::new();
            for e in self.sides(&op.kind) {
                for (l, v) in &per_side {
                    *full.entry((e, *l)).or_default() += v;
                }
            }
            full.retain(|_, v| *v != 0);
            let expected = if op.ok == Some(true) {
                full.clone()
            } else {
                Moves::new()
            };
            if moved == expected {
                continue;
            }
            let show = |m: &Moves<'_>| -> BTreeMap<String, i64> {
                m.iter()
                    .map(|((e, l), v)| (format!("{e}:{l}"), *v))
                    .collect()
            };
            if op.ok != Some(true) && lost {
                residuals.push(format!(
                    "op {id} (c{} {}) failed with {} but its write applied: tc moved {:?} (lost response, caller told error)",
                    op.client,
                    kind_name(&op.kind),
                    op.err.as_deref().unwrap_or("?"),
                    show(&moved)
                ));
                continue;
            }
            let multi = matches!(op.kind, OpKind::Acquire { multi: true, .. });
            if op.ok == Some(true) && multi && lost {
                // A resource admitted degraded (its write timed out) whose write applied
                // after all: charged, though the caller was told "admitted without the store".
                residuals.push(format!(
                    "op {id} (c{} multi-acquire) partly degraded: tc moved {:?}, charged {:?} (a degraded resource's write applied after its deadline)",
                    op.client,
                    show(&moved),
                    show(&expected)
                ));
                continue;
            }
            if op.ok == Some(false) && multi && self.refund_failed(id) {
                residuals.push(format!(
                    "op {id} (c{} multi-acquire) failed with {}: a refund write failed, tc moved {:?} (the landed debit stands, caller told error)",
                    op.client,
                    op.err.as_deref().unwrap_or("?"),
                    show(&moved)
                ));
                continue;
            }
            if op.ok == Some(false) {
                if let Some(why) = self.cascade_partial(id, op, &moved, &full) {
                    residuals.push(format!(
                        "op {id} (c{} {}) failed with {}: {why} (cascade partial outcome: nothing granted beyond what both buckets covered)",
                        op.client,
                        kind_name(&op.kind),
                        op.err.as_deref().unwrap_or("?"),
                    ));
                    continue;
                }
            }
            found.push(format!(
                "op {id} (c{} {} {}): tc moved {:?}, expected {:?}{}",
                op.client,
                kind_name(&op.kind),
                if op.ok == Some(true) { "ok" } else { "failed" },
                show(&moved),
                show(&expected),
                op.err
                    .as_deref()
                    .map(|e| format!(" (error: {e})"))
                    .unwrap_or_default()
            ));
        }
        let _ = limits;
        for d in found {
            self.violate("consumed-once", d);
        }
        self.residuals.extend(residuals);
    }

    fn check_tc_total(&mut self, items: &[Item]) {
        let mut seen: BTreeMap<Slot, i64> = BTreeMap::new();
        for e in &self.consumed {
            *seen
                .entry((e.entity.clone(), e.resource.clone(), e.limit.clone()))
                .or_default() += e.delta;
        }
        let mut stored: BTreeMap<Slot, i64> = BTreeMap::new();
        let mut attr = AttrBuf::default();
        for i in items {
            let Some(k) = Key::of(i) else { continue };
            let Some((e, r, _)) = parse_bucket(&k) else {
                continue;
            };
            let (e, r) = (self.names.get(e), self.names.get(r));
            for l in limit_names(i) {
                let tc = n(i, attr.of(l, "tc")).unwrap_or(0);
                let l = self.names.get(l);
                *stored.entry((e.clone(), r.clone(), l)).or_default() += tc;
            }
        }
        let keys: std::collections::BTreeSet<&Slot> = seen.keys().chain(stored.keys()).collect();
        let mut out = Vec::new();
        for k in keys {
            let a = seen.get(k).copied().unwrap_or(0);
            let b = stored.get(k).copied().unwrap_or(0);
            if a != b {
                out.push(format!(
                    "{}/{} {}: Σ tc stored {} ≠ Σ tc changes seen {}",
                    k.0, k.1, k.2, b, a
                ));
            }
        }
        for d in out {
            self.violate("tc-total", d);
        }
    }

    /// Admission records of successful operations: `(slot, shard, ws, rf, t, step, amount)`;
    /// positive for acquires, negative for refunds credited to the acquire's shard and
    /// window/period (see the module docs).
    fn admissions(&self) -> Vec<Admission> {
        let mut out = Vec::new();
        // Where each acquire's debit landed, per entity (a cascade acquire debits the
        // child and the parent) and limit.
        // (An acquire may debit several shards: one landing per shard.)
        let mut landed: BTreeMap<(usize, Name, Name, u32), Landed> = BTreeMap::new();
        for e in &self.consumed {
            let Some(op) = e.op else { continue };
            let Some(rec) = self.ops.get(op) else {
                continue;
            };
            // ADR-151: what a bypassed item recorded took nothing from its balance (its
            // refunds give nothing back): no admission against the allowance.
            if e.bypassed {
                continue;
            }
            // A write whose response was lost still applied: its debit was admitted (the
            // tokens are gone) and its refund was credited, whatever the caller was told. So
            // was the applied side of a failed cascade commit or rollback (its refund is back
            // in the bucket and can be spent again).
            let refund = matches!(rec.kind, OpKind::Commit { .. } | OpKind::Rollback { .. });
            if rec.ok != Some(true) && !e.lost && !refund {
                continue;
            }
            match &rec.kind {
                OpKind::Acquire { .. } => {
                    landed.insert(
                        (op, e.entity.clone(), e.limit.clone(), e.shard),
                        (e.shard, e.window_start_ms, e.refilled_at_ms),
                    );
                    out.push(Admission {
                        slot: (e.entity.clone(), e.resource.clone(), e.limit.clone()),
                        shard: e.shard,
                        window_start_ms: e.window_start_ms,
                        refilled_at_ms: e.refilled_at_ms,
                        step: e.step,
                        t: e.t,
                        amount: e.delta,
                        refund_of: None,
                    });
                }
                OpKind::Commit { lease_of, .. } | OpKind::Rollback { lease_of, .. }
                    if e.delta < 0 =>
                {
                    if let Some(&(shard, ws, rf)) =
                        landed.get(&(*lease_of, e.entity.clone(), e.limit.clone(), e.shard))
                    {
                        if shard == e.shard {
                            out.push(Admission {
                                slot: (e.entity.clone(), e.resource.clone(), e.limit.clone()),
                                shard: e.shard,
                                window_start_ms: e.window_start_ms,
                                refilled_at_ms: e.refilled_at_ms,
                                step: e.step,
                                t: e.t,
                                amount: e.delta,
                                refund_of: Some((ws, rf)),
                            });
                        }
                    }
                }
                _ => {}
            }
        }
        out
    }

    fn check_window(&mut self, res: &str, l: &Limit, len: i64, adm: &[Admission]) {
        let cap = l.capacity_milli();
        let mut per: BTreeMap<(&str, i64), i64> = BTreeMap::new();
        let mut entities: BTreeMap<&str, Vec<&Admission>> = BTreeMap::new();
        for a in adm
            .iter()
            .filter(|a| *a.slot.1 == *res && *a.slot.2 == *l.name())
        {
            entities.entry(&*a.slot.0).or_default().push(a);
        }
        let mut out = Vec::new();
        for (ent, list) in entities {
            // Phases over the starts debited by acquires.
            let mut starts: Vec<i64> = list
                .iter()
                .filter(|a| a.refund_of.is_none())
                .filter_map(|a| a.window_start_ms)
                .collect();
            starts.sort_unstable();
            starts.dedup();
            let mut phases: Vec<i64> = Vec::new();
            for s in starts {
                if phases.last().is_none_or(|p| s >= p + len) {
                    phases.push(s);
                }
            }
            let phase_of = |ws: i64| -> Option<i64> {
                let i = phases.partition_point(|p| *p <= ws);
                i.checked_sub(1).map(|i| phases[i])
            };
            for a in &list {
                let ws = match a.refund_of {
                    // A refund counts only if its shard still holds the acquire's window.
                    Some((ws_acq, _)) if ws_acq == a.window_start_ms => a.window_start_ms,
                    Some(_) => None,
                    None => a.window_start_ms,
                };
                if let Some(p) = ws.and_then(phase_of) {
                    *per.entry((ent, p)).or_default() += a.amount;
                } else if a.refund_of.is_none() {
                    out.push(format!(
                        "step {}: {ent}/{res} {} admitted {} on shard {} with no window start",
                        a.step,
                        l.name(),
                        a.amount,
                        a.shard
                    ));
                }
            }
        }
        for ((ent, p), total) in per {
            if total > cap {
                out.push(format!(
                    "{ent}/{res} {}: the window phase starting at ws={p} admitted {} > capacity {} (tokens)",
                    l.name(),
                    fmt_milli(total),
                    fmt_milli(cap)
                ));
            }
        }
        for d in out {
            self.violate("window-allowance", d);
        }
    }

    /// ADR-149 credits of a calendar quota, per (entity, period): what each operator top-up
    /// added (counted once per operation id, whatever its outcome — a failed one may have
    /// landed) and one capacity per reset, credited to every period the operation could
    /// have landed in (its start less the skew bound to its end plus it).
    fn operator_credits(
        &self,
        res: &str,
        l: &Limit,
        skew: i64,
        period: &dyn Fn(i64) -> i64,
    ) -> BTreeMap<(&str, i64), i64> {
        let mut seen: std::collections::BTreeSet<&str> = Default::default();
        let mut out: BTreeMap<(&str, i64), i64> = BTreeMap::new();
        for o in &self.ops {
            let (ent, credit, op) = match &o.kind {
                OpKind::TopUp {
                    entity,
                    resource,
                    amounts,
                    op,
                } if resource == res => (
                    entity,
                    amounts
                        .iter()
                        .filter(|(n, _)| n == l.name())
                        .map(|(_, a)| *a)
                        .sum::<i64>(),
                    op,
                ),
                OpKind::Reset {
                    entity,
                    resource,
                    op,
                } if resource == res => (entity, l.capacity_milli(), op),
                _ => continue,
            };
            if !seen.insert(op.as_str()) {
                continue;
            }
            let mut periods = vec![period(o.t - skew)];
            let last = period(o.t_end + skew);
            if last != periods[0] {
                periods.push(last);
            }
            for p in periods {
                *out.entry((ent.as_str(), p)).or_default() += credit;
            }
        }
        out
    }

    fn check_calendar(&mut self, res: &str, l: &Limit, adm: &[Admission], skew: i64) {
        let Some(cal) = l.calendar() else { return };
        let cap = l.capacity_milli();
        let period = |rf: i64| cal.prev_edge(rf).unwrap_or(i64::MIN);
        let credits = self.operator_credits(res, l, skew, &period);
        let mut per: BTreeMap<(&str, i64), i64> = BTreeMap::new();
        for a in adm
            .iter()
            .filter(|a| *a.slot.1 == *res && *a.slot.2 == *l.name())
        {
            let p = match a.refund_of {
                Some((_, rf_acq)) if period(rf_acq) == period(a.refilled_at_ms) => {
                    period(a.refilled_at_ms)
                }
                Some(_) => continue,
                None => period(a.refilled_at_ms),
            };
            *per.entry((&*a.slot.0, p)).or_default() += a.amount;
        }
        let mut out = Vec::new();
        for ((ent, p), total) in per {
            let credit = credits.get(&(ent, p)).copied().unwrap_or(0);
            if total > cap + credit {
                out.push(format!(
                    "{ent}/{res} {}: the period starting at {p} admitted {} > capacity {} + operator credit {} (tokens)",
                    l.name(),
                    fmt_milli(total),
                    fmt_milli(cap),
                    fmt_milli(credit)
                ));
            }
        }
        for d in out {
            self.violate("calendar-allowance", d);
        }
    }

    /// `lease-net`: per lease (the acquire that granted it) and limit, the acquire's debit plus
    /// every adjustment and rollback the store applied for it never sums below zero.
    fn check_lease_net(&mut self) {
        let mut net: BTreeMap<(usize, &str, &str), i64> = BTreeMap::new();
        for e in &self.consumed {
            let Some(op) = e.op else { continue };
            let lease = match self.ops.get(op).map(|o| &o.kind) {
                Some(OpKind::Acquire { .. }) => op,
                Some(OpKind::Commit { lease_of, .. } | OpKind::Rollback { lease_of, .. }) => {
                    *lease_of
                }
                _ => continue,
            };
            *net.entry((lease, &*e.entity, &*e.limit)).or_default() += e.delta;
        }
        let mut out = Vec::new();
        for ((lease, ent, limit), v) in net {
            if v < 0 {
                out.push(format!(
                    "the lease of op {lease} ({ent} {limit}) consumed {} net: refunds returned more than it took",
                    fmt_milli(v)
                ));
            }
        }
        for d in out {
            self.violate("lease-net", d);
        }
    }

    /// `honest-answer`: every answer agrees with the statuses it reports.
    fn check_answers(&mut self) {
        let mut out = Vec::new();
        for (id, op) in self.ops.iter().enumerate() {
            let Some(a) = &op.answer else { continue };
            let tag = |why: &str, st: Option<&Reported>| {
                format!(
                    "op {id} (c{}) {}: {why}{}",
                    op.client,
                    if a.admitted { "admitted" } else { "refused" },
                    st.map(|s| format!(
                        " — {} capacity {} available {} requested {} exceeded {} retry_after {:?}",
                        s.limit, s.capacity, s.available, s.requested, s.exceeded, s.retry_after_ms
                    ))
                    .unwrap_or_default()
                )
            };
            if a.admitted {
                if let Some(s) = a.statuses.iter().find(|s| s.exceeded) {
                    out.push(tag("an admission reports an exceeded limit", Some(s)));
                }
                continue;
            }
            if !a.statuses.iter().any(|s| s.exceeded) {
                out.push(tag("a refusal names no exceeded limit", None));
            }
            for s in &a.statuses {
                if s.exceeded && s.available >= s.requested {
                    out.push(tag(
                        "refused while its status says the amount is available",
                        Some(s),
                    ));
                } else if !s.exceeded && s.available < s.requested && !self.soft.contains(&s.limit)
                {
                    out.push(tag(
                        "a limit reported as fitting does not cover the amount",
                        Some(s),
                    ));
                } else if s.exceeded && s.requested > s.capacity && s.retry_after_ms.is_some() {
                    out.push(tag(
                        "a retry-after for a request that can never fit",
                        Some(s),
                    ));
                } else if s.exceeded && s.requested <= s.capacity && s.retry_after_ms.is_none() {
                    out.push(tag(
                        "no retry-after for a request that fits the capacity",
                        Some(s),
                    ));
                }
            }
        }
        for d in out {
            self.violate("honest-answer", d);
        }
    }

    /// `rate-envelope` for one dripping limit (see the module docs). Every `tc` change the
    /// store applied counts, whatever the caller was told (a lost response still moved
    /// tokens): acquires' debits (the admissions), commits' adjustments, rollbacks.
    fn check_envelope(&mut self, res: &str, l: &Limit, ra: i64, rp: i64, skew: i64) {
        let cap = i128::from(l.capacity_milli());
        let full_ms = i128::from(l.capacity_milli()) * i128::from(rp) / i128::from(ra.max(1));
        let mut by_entity: BTreeMap<&str, Vec<&TcEvent>> = BTreeMap::new();
        // ADR-151: what a bypassed item recorded was not debited (see the module docs).
        for e in self
            .consumed
            .iter()
            .filter(|e| *e.resource == *res && *e.limit == *l.name() && !e.bypassed)
        {
            by_entity.entry(&*e.entity).or_default().push(e);
        }
        let mut out = Vec::new();
        for (ent, mut evs) in by_entity {
            evs.sort_by_key(|e| e.step);
            // The entity's writes in apply order with their latencies.
            let lat: Vec<(u64, i64)> = self
                .latencies
                .iter()
                .filter(|(e, r, _, _)| **e == *ent && **r == *res)
                .map(|(_, _, s, l)| (*s, *l))
                .collect();
            let s_max = self
                .creations
                .iter()
                .filter(|c| *c.entity == *ent && *c.resource == *res)
                .map(|c| c.shard_count)
                .max()
                .unwrap_or(1)
                .max(1);
            // Σ over shards of the per-shard rate `max(1, ra // S)`.
            let rate = i128::from(ra.max(s_max));
            // Backward stamps: (step, true time, ms re-credited).
            let stamps: Vec<(u64, i64, i64)> = self
                .old_rf
                .iter()
                .filter(|o| *o.entity == *ent && *o.resource == *res && o.after < o.before)
                .map(|o| (o.step, o.t, o.before - o.after))
                .collect();
            let is_admission = |e: &TcEvent| {
                e.delta > 0
                    && matches!(
                        e.op.and_then(|o| self.ops.get(o)).map(|o| &o.kind),
                        Some(OpKind::Acquire { .. })
                    )
            };
            'next: for j in 0..evs.len() {
                if !is_admission(evs[j]) {
                    continue;
                }
                let tj = evs[j].t;
                let mut sum: i128 = 0;
                let mut stale: i64 = 0;
                let mut li = lat.partition_point(|(s, _)| *s <= evs[j].step);
                // The backward stamps up to this admission: (true time, ms re-credited).
                let stamps_j: Vec<(i64, i64)> = stamps
                    .iter()
                    .filter(|(st, _, _)| *st <= evs[j].step)
                    .map(|(_, t, d)| (*t, *d))
                    .collect();
                for i in (0..=j).rev() {
                    // A request carries the clock reading it was built with: one applied
                    // late decides as of then (its trust check, its refill clamp).
                    while li > 0 && lat[li - 1].0 + 1 >= evs[i].step {
                        li -= 1;
                        stale = stale.max(lat[li].1);
                    }
                    sum += i128::from(evs[i].delta);
                    let ti = evs[i].t;
                    // A backward stamp re-credits refill at the next materialisation, which
                    // may come up to one full refill later.
                    let credit: i128 = if stamps_j.is_empty() {
                        0
                    } else {
                        stamps_j
                            .iter()
                            .filter(|(t, _)| i128::from(*t) + full_ms >= i128::from(ti))
                            .map(|(_, d)| i128::from(*d))
                            .sum::<i128>()
                            * rate
                            / i128::from(rp)
                    };
                    let span = i128::from(tj - ti + 2 * (skew + stale));
                    let refill = rate * span;
                    if over_envelope(sum, cap + 1000 + credit, refill, i128::from(rp)) {
                        let allow = cap + refill / i128::from(rp) + 1000 + credit;
                        out.push(format!(
                            "step {}: {ent}/{res} {}: consumed {} in [{ti}, {tj}] ({} ms) > capacity {} + refill over it {} (rate {}/{} ms, up to {s_max} shards)",
                            evs[j].step,
                            l.name(),
                            fmt_milli(i64::try_from(sum).unwrap_or(i64::MAX)),
                            tj - ti,
                            fmt_milli(l.capacity_milli()),
                            fmt_milli(i64::try_from(allow - cap).unwrap_or(i64::MAX)),
                            fmt_milli(i64::try_from(rate).unwrap_or(i64::MAX)),
                            rp
                        ));
                        break 'next;
                    }
                }
            }
        }
        for d in out {
            self.violate("rate-envelope", d);
        }
    }

    fn check_rate(&mut self, res: &str, l: &Limit, ra: i64, rp: i64, skew: i64, adm: &[Admission]) {
        let cap = l.capacity_milli();
        let mut out = Vec::new();
        let mut entities: BTreeMap<&str, Vec<&Admission>> = BTreeMap::new();
        for a in adm
            .iter()
            .filter(|a| *a.slot.1 == *res && *a.slot.2 == *l.name())
        {
            entities.entry(&*a.slot.0).or_default().push(a);
        }
        for (ent, mut list) in entities {
            list.sort_by_key(|a| a.step);
            let creations: Vec<&Creation> = self
                .creations
                .iter()
                .filter(|c| *c.entity == *ent && *c.resource == *res)
                .collect();
            let mut net = 0i64;
            for a in list {
                net += a.amount;
                if a.amount <= 0 {
                    continue;
                }
                // Allowance at this admission.
                let mut allow: i128 = 0;
                let mut s_at: BTreeMap<u32, i64> = BTreeMap::new();
                for c in creations.iter().filter(|c| c.step <= a.step) {
                    let s = c.shard_count.max(1);
                    s_at.insert(c.shard, s);
                    let rate = (ra / s).max(1);
                    // Refill is credited from the created rf up to a writer's reading,
                    // which is at most true time + skew.
                    let elapsed = i128::from((a.t + skew - c.refilled_at_ms).max(0));
                    allow +=
                        i128::from(cap / s) + i128::from(rate) * elapsed / i128::from(rp) + 1000;
                }
                for o in self.old_rf.iter().filter(|o| {
                    *o.entity == *ent
                        && *o.resource == *res
                        && o.step <= a.step
                        && o.after < o.before
                }) {
                    let s = s_at.get(&o.shard).copied().unwrap_or(1);
                    let rate = (ra / s).max(1);
                    allow +=
                        i128::from(rate) * i128::from(o.before - o.after) / i128::from(rp) + 1000;
                }
                if i128::from(net) > allow {
                    out.push(format!(
                        "step {}: {ent}/{res} {}: net admitted {} > allowance {} (capacity {}, {} shards created)",
                        a.step,
                        l.name(),
                        fmt_milli(net),
                        fmt_milli(i64::try_from(allow).unwrap_or(i64::MAX)),
                        fmt_milli(cap),
                        s_at.len()
                    ));
                    break;
                }
            }
        }
        for d in out {
            self.violate("rate-allowance", d);
        }
    }
}

/// `sum > base + refill / rp` (the `rate-envelope` test, `/` rounding toward zero), without
/// an i128 division when `refill / rp` rounds down (`refill ≥ 0`, `rp > 0`): then, for
/// integers, `x > ⌊refill / rp⌋ ⟺ x · rp > refill` with `x = sum − base`.
fn over_envelope(sum: i128, base: i128, refill: i128, rp: i128) -> bool {
    if refill >= 0 && rp > 0 {
        (sum - base) * rp > refill
    } else {
        sum > base + refill / rp
    }
}

/// One admission (or credited refund) of one limit.
#[derive(Debug, Clone)]
struct Admission {
    slot: Slot,
    shard: u32,
    window_start_ms: Option<i64>,
    refilled_at_ms: i64,
    step: u64,
    t: i64,
    amount: i64,
    /// For refunds: the (ws, rf) where the refunded acquire landed.
    refund_of: Option<(Option<i64>, i64)>,
}

fn kind_name(k: &OpKind) -> &'static str {
    match k {
        OpKind::Acquire { .. } => "acquire",
        OpKind::Commit { .. } => "commit",
        OpKind::Rollback { .. } => "rollback",
        OpKind::Check => "check",
        OpKind::TopUp { .. } => "top-up",
        OpKind::Reset { .. } => "reset",
    }
}

/// Millitokens as tokens with three decimals.
pub fn fmt_milli(m: i64) -> String {
    if m % 1000 == 0 {
        format!("{}", m / 1000)
    } else {
        format!("{:.3}", m as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_keys_parse() {
        let k = tollgate_core::keys::bucket("sim", "e0", "res", 7);
        assert_eq!(parse_bucket(&k), Some(("e0", "res", 7)));
        assert_eq!(parse_bucket(&Key::new("sim/SYSTEM#", "#CONFIG")), None);
        // The first `/BUCKET#` counts, wherever other slashes are.
        let k2 = Key::new("a/b/BUCKET#x/BUCKET#y#r#3", "#STATE");
        assert_eq!(parse_bucket(&k2), Some(("x/BUCKET#y", "r", 3)));
        assert_eq!(
            parse_bucket(&k2),
            k2.pk.split_once("/BUCKET#").and_then(|(_, rest)| {
                let mut p = rest.rsplitn(3, '#');
                let shard = p.next()?.parse().ok()?;
                let r = p.next()?;
                Some((p.next()?, r, shard))
            })
        );
        assert_eq!(parse_bucket(&Key::new("sim/BUCKET", "#STATE")), None);
        let mut l = Ledger::default();
        let b = l.bucket_of(&k).expect("a bucket key");
        assert_eq!((&*b.entity, &*b.resource, b.shard), ("e0", "res", 7));
        // One shared copy per name.
        let b2 = l.bucket_of(&k).expect("a bucket key");
        assert!(Arc::ptr_eq(&b.entity, &b2.entity));
        assert_eq!(l.bucket_of(&Key::new("sim/SYSTEM#", "#CONFIG")), None);
    }

    #[test]
    fn envelope_test_matches_the_division() {
        for sum in -40..40 {
            for base in -10..10 {
                for refill in -50..50 {
                    for rp in [1, 2, 3, 7, 10, 60_000] {
                        assert_eq!(
                            over_envelope(sum, base, refill, rp),
                            sum > base + refill / rp,
                            "sum {sum} base {base} refill {refill} rp {rp}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn limit_fields_read_what_n_reads() {
        let mut i = Item::new();
        for (k, v) in [
            ("b_a_tc", 1),
            ("b_a_tk", 2),
            ("b_a_b_tc", 3),
            ("b_a_b_ws", 4),
            ("b_a_wtc", 5),
            ("b_ab_tc", 6),
            ("b_a_cp", 7),
            ("rf", 8),
        ] {
            i.insert(k.into(), Value::N(v));
        }
        i.insert("b_a_ws".into(), Value::S("not a number".into()));
        let mut attr = AttrBuf::default();
        for l in ["a", "a_b", "ab", "none"] {
            let f = LimitFields::of(&i, l, &mut attr);
            let want = LimitFields {
                tc: n(&i, &format!("b_{l}_tc")),
                tk: n(&i, &format!("b_{l}_tk")),
                ws: n(&i, &format!("b_{l}_ws")),
                wa: n(&i, &format!("b_{l}_wa")),
                wtc: n(&i, &format!("b_{l}_wtc")),
                pe: n(&i, &format!("b_{l}_pe")),
                cp: n(&i, &format!("b_{l}_cp")),
                gc: n(&i, &format!("b_{l}_gc")),
            };
            assert_eq!(f, want, "limit {l}");
        }
        assert_eq!(LimitFields::of(&i, "a", &mut attr).tc, Some(1));
        assert_eq!(LimitFields::of(&i, "a_b", &mut attr).ws, Some(4));
    }

    /// Invariant `rf-pins`: a pinned attribute changed (or removed) without `rf` moving is a
    /// violation; the same change with `rf` moved, or an rf-less change of a balance, `fu`
    /// or `vu`, is not.
    #[test]
    fn rf_pins_catch_a_stamp_changed_without_rf() {
        let bucket = Bucket {
            entity: "e".into(),
            resource: "r".into(),
            shard: 0,
        };
        let mut before = Item::new();
        for (k, v) in [
            ("rf", 10),
            ("b_rps_tk", 5),
            ("b_rps_tc", 1),
            ("b_rps_cp", 9),
            ("b_rps_rc", 0),
            ("b_rps_fu", 12),
            ("b_x_bcp_tc", 0),
        ] {
            before.insert(k.into(), Value::N(v));
        }
        before.insert("ph".into(), Value::S("h1".into()));
        let write = |after: &Item| {
            let mut l = Ledger::default();
            l.record_write(0, None, &bucket, Some(&before), Some(after), 11, 1, false);
            l.violations
                .iter()
                .filter(|v| v.invariant == "rf-pins")
                .count()
        };
        let changed = |k: &str, v: Value| {
            let mut a = before.clone();
            a.insert(k.into(), v);
            a
        };
        // rf-less writes of what rf-less writers change: no violation.
        assert_eq!(write(&changed("b_rps_tk", Value::N(4))), 0);
        assert_eq!(write(&changed("b_rps_fu", Value::N(0))), 0);
        assert_eq!(write(&changed("vu", Value::N(0))), 0);
        assert_eq!(write(&changed("b_x_bcp_tc", Value::N(3))), 0);
        // A pinned attribute changed or added without rf moving: a violation each.
        assert_eq!(write(&changed("ph", Value::S("h2".into()))), 1);
        assert_eq!(write(&changed("b_rps_cp", Value::N(8))), 1);
        assert_eq!(write(&changed("b_rps_rc", Value::N(3))), 1);
        assert_eq!(write(&changed("ttl", Value::N(99))), 1);
        let mut removed = before.clone();
        removed.remove("ph");
        assert_eq!(write(&removed), 1);
        // The same change with rf moved forward is an rf-moving write: fine.
        let mut moved = changed("b_rps_cp", Value::N(8));
        moved.insert("rf".into(), Value::N(11));
        assert_eq!(write(&moved), 0);
    }

    #[test]
    fn attribute_names() {
        let mut a = AttrBuf::default();
        assert_eq!(a.of("rps", "tc"), "b_rps_tc");
        assert_eq!(a.of("session", "wtc"), "b_session_wtc");
    }
}

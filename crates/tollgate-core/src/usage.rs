//! Usage accounting from the change feed: what one applied write of a bucket item consumed,
//! and where that lands in the usage snapshots.
//!
//! Every acquire, adjustment and rollback ADDs its net consumption to the limit's `tc`
//! counter, so the consumption of one write is exactly `new tc − old tc` (a new bucket: its
//! whole `tc` — the original's first consumption, lost with its INSERT, is counted here). A
//! write that admits an acquire also ADDs 1 to the item's request counter `rq` (one per
//! acquire, whatever the number of limits it charges), and every write that moves `tc` or
//! `rq` SETs `wt`, the writer's clock: consumption is dated by the write itself, never by a
//! stale `rf` (rule "usage is dated by its write", [`usage_view`]).
//!
//! Window starts are UTC calendar hours, days and months ([`Window::start_ms`]).

use std::collections::BTreeMap;

use crate::bucket::attr as bucket_attr;
use crate::bucket::field;
use crate::expr::Update;
use crate::ids::WCU;
use crate::item::Names;
use crate::keys::{battr, STATE};
use crate::value::{Item, Key, Value};
use smallvec::SmallVec;
use std::sync::Arc;

/// Item attributes of usage accounting on a bucket item.
pub mod attr {
    /// Admitted acquires on this item (ADD 1 per admitted acquire).
    pub const RQ: &str = "rq";
    /// Write time (ms) of the last write that moved `tc` or `rq`.
    pub const WT: &str = "wt";
}

/// Count one admitted acquire on the item this update writes (date it with
/// [`stamp_write_time`]).
pub fn count_request(u: Update) -> Update {
    u.add(attr::RQ, 1)
}

/// Take back a counted acquire (a cascade whose parent refused: the child's debit is rolled
/// back and the acquire was not admitted).
pub fn uncount_request(u: Update) -> Update {
    u.add(attr::RQ, -1)
}

/// Date a consumption-moving write (an adjustment, a rollback, a refund) at `now_ms`.
pub fn stamp_write_time(u: Update, now_ms: i64) -> Update {
    u.set(attr::WT, now_ms)
}

/// Stamp a bucket item a create writes: one admitted acquire when it consumes (`admitted`),
/// none for an item created without a request (a Path-2 clone), dated `now_ms`.
pub fn stamp_created(item: &mut Item, admitted: bool, now_ms: i64) {
    item.insert(attr::RQ.into(), Value::N(i64::from(admitted)));
    item.insert(attr::WT.into(), Value::N(now_ms));
}

/// A usage snapshot period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Window {
    /// A UTC calendar hour.
    Hourly,
    /// A UTC calendar day.
    Daily,
    /// A UTC calendar month.
    Monthly,
}

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 86_400_000;

/// Days since 1970-01-01 → (year, month 1..=12, day 1..=31), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// (year, month, day) → days since 1970-01-01.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

impl Window {
    /// Every window, shortest first.
    pub const ALL: [Window; 3] = [Window::Hourly, Window::Daily, Window::Monthly];

    /// Its name (`hourly`, `daily`, `monthly`).
    pub fn name(self) -> &'static str {
        match self {
            Window::Hourly => "hourly",
            Window::Daily => "daily",
            Window::Monthly => "monthly",
        }
    }

    /// The window of that name.
    pub fn parse(s: &str) -> Option<Window> {
        Window::ALL.into_iter().find(|w| w.name() == s)
    }

    /// The start (ms) of the window holding `t_ms`.
    pub fn start_ms(self, t_ms: i64) -> i64 {
        match self {
            Window::Hourly => t_ms.div_euclid(HOUR_MS) * HOUR_MS,
            Window::Daily => t_ms.div_euclid(DAY_MS) * DAY_MS,
            Window::Monthly => {
                let (y, m, _) = civil_from_days(t_ms.div_euclid(DAY_MS));
                days_from_civil(y, m, 1) * DAY_MS
            }
        }
    }

    /// The end (ms, exclusive) of the window starting at `start_ms`.
    pub fn end_ms(self, start_ms: i64) -> i64 {
        match self {
            Window::Hourly => start_ms + HOUR_MS,
            Window::Daily => start_ms + DAY_MS,
            Window::Monthly => {
                let (y, m, _) = civil_from_days(start_ms.div_euclid(DAY_MS));
                let (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                days_from_civil(y, m, 1) * DAY_MS
            }
        }
    }
}

/// `t_ms` as UTC `YYYY-MM-DDTHH:MM:SSZ` (whole seconds).
pub fn iso_utc(t_ms: i64) -> String {
    let days = t_ms.div_euclid(DAY_MS);
    let (y, m, d) = civil_from_days(days);
    let s = t_ms.rem_euclid(DAY_MS) / 1000;
    if !(0..=9999).contains(&y) {
        // Outside four-digit years (never a usage window): the general formatting.
        return format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
            s / 3600,
            s / 60 % 60,
            s % 60
        );
    }
    // `YYYY-MM-DDTHH:MM:SSZ`, digit by digit (a pass formats one per snapshot it writes).
    let mut out = String::with_capacity(20);
    for (n, after) in [
        (y / 100, ""),
        (y % 100, "-"),
        (m, "-"),
        (d, "T"),
        (s / 3600, ":"),
        (s / 60 % 60, ":"),
        (s % 60, "Z"),
    ] {
        // Each part is two digits (0..=99).
        out.push(char::from(b'0' + (n / 10) as u8));
        out.push(char::from(b'0' + (n % 10) as u8));
        out.push_str(after);
    }
    debug_assert_eq!(out.len(), 20, "an ISO instant is 20 characters");
    out
}

/// An instant given as epoch milliseconds or an RFC 3339 timestamp
/// (`2025-09-04T15:00:00Z`); `None` when it is neither.
pub fn parse_instant(s: &str) -> Option<i64> {
    if let Ok(ms) = s.parse::<i64>() {
        return Some(ms);
    }
    s.parse::<jiff::Timestamp>()
        .ok()
        .map(|t| t.as_millisecond())
}

/// What one write of a bucket item consumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageDelta {
    /// The namespace of the item.
    pub ns: String,
    /// Entity.
    pub entity: String,
    /// Resource.
    pub resource: String,
    /// When (ms): the write's own `wt`, else the store's time of the write.
    pub at_ms: i64,
    /// Net consumption per limit, millitokens (zero deltas left out; never `wcu`).
    pub milli: BTreeMap<String, i64>,
    /// Overdraw per limit, millitokens: the part of the write's consumption that drove the
    /// shard's balance below zero ([`overdraw_of`]; zeros left out).
    pub overdraw: BTreeMap<String, i64>,
    /// Admitted acquires.
    pub requests: i64,
}

impl UsageDelta {
    /// Whether the write consumed nothing and counted no request.
    pub fn is_empty(&self) -> bool {
        self.requests == 0 && self.milli.is_empty()
    }
}

/// Rule "overdraw is consumption below zero" (ADR-151's `{limit}#od`): of what one applied
/// write consumed of a limit (`consumed`, its `tc` delta, milli), the part that took the
/// shard's balance below zero — `clamp(−new tk, 0, consumed)`. A write debits after it
/// refills or resets, so the consumption is the last move of the balance, ending at the
/// new `tk`: old 1000 → new −2000 after 3000 is 2000, old −2000 → new −3000 is 1000, a
/// quota reset to 500 that then spends 1000 is 500. A refund or a refill (`consumed ≤ 0`)
/// is never overdraw, and neither is a write that recorded consumption without debiting
/// the balance (`debited` false: a bypass pass, a bypassed lease's adjustment).
pub fn overdraw_of(consumed: i64, new_tk: i64, debited: bool) -> i64 {
    if !debited || consumed <= 0 {
        return 0;
    }
    (-new_tk).clamp(0, consumed)
}

/// Whether a write of a bucket item debited its balances, not only recorded consumption
/// (the precondition of [`overdraw_of`]): a bypassed item's writes never do, and a
/// `tc`-only write (a bypassed lease settling on an item since enforced) moves neither the
/// limit's `tk` nor `rf`. Every write that debits moves one of them: the fast path ADDs to
/// `tk`, the slow path SETs `rf`.
pub fn debited(old: Option<&Item>, new: &Item, limit: &str) -> bool {
    debited_at(old, new, &battr(limit, field::TK))
}

/// [`debited`], given the limit's balance attribute `tk`.
fn debited_at(old: Option<&Item>, new: &Item, tk: &str) -> bool {
    debited_from(
        new.get(bucket_attr::BYPASS).is_some(),
        old.map(|o| Balances::of(o, tk)),
        Balances::of(new, tk),
    )
}

/// A limit's balance and the item's refill time as one image holds them: what a debit
/// moves ([`debited`]).
#[derive(Clone, Copy, PartialEq)]
struct Balances<'a> {
    tk: Option<&'a Value>,
    rf: Option<&'a Value>,
}

impl<'a> Balances<'a> {
    fn of(item: &'a Item, tk: &str) -> Self {
        Balances {
            tk: item.get(tk),
            rf: item.get(bucket_attr::RF),
        }
    }
}

/// [`debited`] from the values it compares: the new image's bypass stamp, and the
/// balances before (`None`: the write created the item) and after.
fn debited_from(bypass: bool, before: Option<Balances<'_>>, after: Balances<'_>) -> bool {
    !bypass && before.is_none_or(|b| b != after)
}

/// The namespace of a bucket key (`{ns}/BUCKET#…`, `#STATE`), or `None` for other items.
pub fn bucket_ns(key: &Key) -> Option<&str> {
    if &*key.sk != STATE {
        return None;
    }
    // The first `/BUCKET#`, found by its `/` (a byte search) rather than a substring search.
    let pk = &*key.pk;
    let mut from = 0;
    while let Some(i) = pk[from..].find('/') {
        let at = from + i;
        if pk[at..].starts_with("/BUCKET#") {
            return Some(&pk[..at]);
        }
        from = at + 1;
    }
    None
}

/// [`usage_view`] (rule "usage is dated by its write"), owned: the names copied out of the
/// images.
pub fn usage_of(
    key: &Key,
    old: Option<&Item>,
    new: Option<&Item>,
    at_ms: i64,
) -> Option<UsageDelta> {
    usage_view(key, old, new, at_ms).map(|v| v.to_delta())
}

/// The usage of one write ([`usage_view`]), borrowed from the key and the new image: no
/// name is copied, so summing a pass's changes allocates only per snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageView<'a> {
    /// The namespace of the item.
    pub ns: &'a str,
    /// Entity.
    pub entity: &'a str,
    /// Resource.
    pub resource: &'a str,
    /// When (ms): the write's own `wt`, else the store's time of the write.
    pub at_ms: i64,
    /// Net consumption per limit, millitokens, in the image's attribute order (zero deltas
    /// left out; never `wcu`).
    pub milli: SmallVec<[(&'a str, i64); 2]>,
    /// Overdraw per limit, millitokens (zeros left out), in the same order.
    pub overdraw: SmallVec<[(&'a str, i64); 2]>,
    /// Admitted acquires.
    pub requests: i64,
}

impl UsageView<'_> {
    /// Whether the write consumed (some limit's consumption is positive): the pairs the
    /// background pass looks at.
    pub fn consumed(&self) -> bool {
        self.milli.iter().any(|(_, m)| *m > 0)
    }

    /// The owned [`UsageDelta`].
    pub fn to_delta(&self) -> UsageDelta {
        let by_limit = |v: &[(&str, i64)]| -> BTreeMap<String, i64> {
            v.iter().map(|(l, m)| (l.to_string(), *m)).collect()
        };
        UsageDelta {
            ns: self.ns.to_string(),
            entity: self.entity.to_string(),
            resource: self.resource.to_string(),
            at_ms: self.at_ms,
            milli: by_limit(&self.milli),
            overdraw: by_limit(&self.overdraw),
            requests: self.requests,
        }
    }
}

/// Rule "usage is dated by its write" (fixes the original's three snapshot defects): the
/// usage one applied write of a bucket item carries is, per limit other than `wcu`,
/// `new tc − old tc` — an absent old item or limit counts as 0, so a bucket's creation
/// counts its first consumption; a delete counts nothing — plus `new rq − old rq` admitted
/// acquires (one per acquire, not per limit), dated by the new image's `wt` (the writer's
/// clock at this write; `at_ms`, the store's time of the write, for a writer that does not
/// stamp it). Each limit's overdraw is [`overdraw_of`] its consumption. `None` for an item
/// that is not a bucket or a write that carries no usage. Borrowed from the key and the new
/// image ([`UsageView`]); [`usage_of`] is the owned form.
pub fn usage_view<'a>(
    key: &'a Key,
    old: Option<&Item>,
    new: Option<&'a Item>,
    at_ms: i64,
) -> Option<UsageView<'a>> {
    let ns = bucket_ns(key)?;
    let new = new?;
    view_of(ns, new, &ReadLayout::of(new), old, at_ms)
}

/// [`usage_view`], the new image's names classified once per shape: a new image that
/// remembers its shape ([`Item::shape`], as every bucket a decoder read does) is read at
/// the indices `layouts` kept for that shape instead of walking its names (the aggregator
/// sums every write of a bucket, each with the same names). The same answer either way.
pub fn usage_view_in<'a>(
    key: &'a Key,
    old: Option<&Item>,
    new: Option<&'a Item>,
    at_ms: i64,
    layouts: &mut ReadLayouts,
) -> Option<UsageView<'a>> {
    let ns = bucket_ns(key)?;
    let new = new?;
    match layouts.of(new) {
        Some(layout) => view_of(ns, new, layout, old, at_ms),
        None => view_of(ns, new, &ReadLayout::of(new), old, at_ms),
    }
}

/// The rule of [`usage_view`], reading the new image where `layout` (its names') says.
fn view_of<'a>(
    ns: &'a str,
    new: &'a Item,
    layout: &ReadLayout,
    old: Option<&Item>,
    at_ms: i64,
) -> Option<UsageView<'a>> {
    let value = |at: Option<usize>| at.map(|i| new.at(i).1);
    let entity = value(layout.entity).and_then(Value::as_s)?;
    let resource = value(layout.resource).and_then(Value::as_s)?;
    let rf = value(layout.rf);
    let rq = value(layout.rq);
    // The old image is only looked up by the names the new one holds (its counters and
    // `rq`, `rf`): every limit that counts has a `tc` in the new image. When both are known
    // to have the same names (an update in place, as nearly every write is), each is read
    // at the index it has in the new image instead of searched for in the old one.
    let same = old.is_some_and(|o| o.shares_shape(new));
    let old_get = |name: &str, at: Option<usize>| -> Option<&Value> {
        let o = old?;
        match at {
            Some(i) if same => {
                let (found, v) = o.at(i);
                debug_assert_eq!(found.as_str(), name, "a shared shape has the name there");
                Some(v)
            }
            _ => o.get(name),
        }
    };
    let old_rf = old_get(bucket_attr::RF, layout.rf);
    let mut milli = SmallVec::new();
    let mut overdraw = SmallVec::new();
    for c in &layout.limits {
        // Only a limit with a `tc` counts; `wcu` is the write guard, not usage.
        let Some(tc_at) = c.tc else {
            continue;
        };
        let (tc_name, tc) = new.at(tc_at);
        let tc_name = tc_name.as_str();
        // `b_{limit}_tc`: the limit is the name less both.
        let limit = tc_name
            .len()
            .checked_sub(3)
            .and_then(|end| tc_name.get(2..end))
            .unwrap_or("");
        if limit == WCU || limit.is_empty() {
            continue;
        }
        let tk = c.tk.map(|i| {
            let (name, v) = new.at(i);
            (i, name.as_str(), v)
        });
        let was_tc = old_get(tc_name, Some(tc_at)).and_then(Value::as_n);
        let d = tc.as_n().unwrap_or(0) - was_tc.unwrap_or(0);
        if d != 0 {
            milli.push((limit, d));
        }
        // Only consumption can overdraw.
        let od = if d > 0 {
            let before = old.map(|o| Balances {
                tk: match tk {
                    Some((tk_at, tk_name, _)) => old_get(tk_name, Some(tk_at)),
                    None => o.get(&*battr(limit, field::TK)),
                },
                rf: old_rf,
            });
            let after = Balances {
                tk: tk.map(|(_, _, v)| v),
                rf,
            };
            let debited = debited_from(layout.bypass, before, after);
            overdraw_of(d, after.tk.and_then(Value::as_n).unwrap_or(0), debited)
        } else {
            0
        };
        if od != 0 {
            overdraw.push((limit, od));
        }
    }
    let count = |rq: Option<&Value>| rq.and_then(Value::as_n).unwrap_or(0);
    let requests = count(rq) - count(old_get(attr::RQ, layout.rq));
    let at_ms = value(layout.wt).and_then(Value::as_n).unwrap_or(at_ms);
    let v = UsageView {
        ns,
        entity,
        resource,
        at_ms,
        milli,
        overdraw,
        requests,
    };
    (v.requests != 0 || !v.milli.is_empty()).then_some(v)
}

/// Where the usage rule ([`usage_view`]) finds what it reads in the new image of a write:
/// the indices of its names, a function of the names alone (so one layout serves every
/// item of the same shape).
#[derive(Debug, Clone, PartialEq, Eq)]
struct ReadLayout {
    entity: Option<usize>,
    resource: Option<usize>,
    rq: Option<usize>,
    wt: Option<usize>,
    rf: Option<usize>,
    bypass: bool,
    /// Per limit with a `tc` or a `tk`, in name order: their indices.
    limits: SmallVec<[CountersAt; 4]>,
}

/// A limit's `tc` and `tk` indices (at least one is present).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CountersAt {
    tc: Option<usize>,
    tk: Option<usize>,
}

impl ReadLayout {
    /// The rule's one reading of a bucket's names: six look-ups, and one walk over the names
    /// starting `b_` (adjacent in name order), each `b_{limit}_tc` or `b_{limit}_tk` a
    /// counter of `limit`.
    fn of(item: &Item) -> Self {
        let at = |name: &str| item.position(name).ok();
        let mut layout = ReadLayout {
            entity: at(bucket_attr::ENTITY),
            resource: at(bucket_attr::RESOURCE),
            rq: at(attr::RQ),
            wt: at(attr::WT),
            rf: at(bucket_attr::RF),
            bypass: item.contains_key(bucket_attr::BYPASS),
            limits: SmallVec::new(),
        };
        // The limits' names, in the order of `layout.limits`.
        let mut names: SmallVec<[&str; 4]> = SmallVec::new();
        // The names starting `b_` are the ones from `b_` on, up to the first that does not.
        let from = item.position("b_").unwrap_or_else(|i| i);
        for index in from..item.len() {
            let name = item.at(index).0.as_str();
            let Some(rest) = name.strip_prefix("b_") else {
                break;
            };
            let (limit, is_tc) = match (rest.strip_suffix("_tc"), rest.strip_suffix("_tk")) {
                (Some(l), _) => (l, true),
                (None, Some(l)) => (l, false),
                (None, None) => continue,
            };
            // A limit's attributes are adjacent in name order: the last entry, usually.
            let at = match names.last() {
                Some(l) if *l == limit => names.len() - 1,
                _ => match names.iter().position(|l| *l == limit) {
                    Some(at) => at,
                    None => {
                        names.push(limit);
                        layout.limits.push(CountersAt { tc: None, tk: None });
                        names.len() - 1
                    }
                },
            };
            let c = &mut layout.limits[at];
            if is_tc {
                c.tc = Some(index);
            } else {
                c.tk = Some(index);
            }
        }
        layout
    }
}

/// How many shapes' layouts [`ReadLayouts`] keeps (a process sees a few per limit set; past
/// this many it starts over).
pub const READ_LAYOUTS_KEPT: usize = 32;

/// The usage rule's layouts by item shape ([`usage_view_in`]), kept by a reader of many
/// changes: each shape's names are classified once.
#[derive(Debug, Default)]
pub struct ReadLayouts {
    /// Each kept shape (held, so its address names it) with its layout.
    kept: Vec<(Arc<Names>, ReadLayout)>,
}

impl ReadLayouts {
    /// The layout of `item`'s names when it remembers its shape (learnt from it the first
    /// time); `None` for an item that does not.
    fn of(&mut self, item: &Item) -> Option<&ReadLayout> {
        let shape = item.shape()?;
        match self.kept.iter().position(|(s, _)| Arc::ptr_eq(s, shape)) {
            Some(at) => {
                debug_assert_eq!(
                    self.kept[at].1,
                    ReadLayout::of(item),
                    "a shape's layout is its items'"
                );
                Some(&self.kept[at].1)
            }
            None => {
                if self.kept.len() >= READ_LAYOUTS_KEPT {
                    self.kept.clear();
                }
                self.kept.push((Arc::clone(shape), ReadLayout::of(item)));
                self.kept.last().map(|(_, layout)| layout)
            }
        }
    }

    /// How many shapes' layouts are kept.
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }
}

/// The partition of an entity's usage snapshots.
pub fn snapshot_pk(ns: &str, entity: &str) -> String {
    format!("{ns}/USAGE#{entity}")
}

/// The sort key of one snapshot: resource, window, start (zero-padded ms, so keys sort by
/// time within a window).
pub fn snapshot_sk(resource: &str, window: Window, start_ms: i64) -> String {
    format!("{resource}#{}#{start_ms:015}", window.name())
}

/// The key of the snapshot of (entity, resource, window, start).
pub fn snapshot_key(ns: &str, entity: &str, resource: &str, window: Window, start_ms: i64) -> Key {
    // `snapshot_pk` and `snapshot_sk`, formatted on the stack (the aggregator makes one per
    // window for every change it sums).
    Key {
        pk: crate::keys::shared_text(format_args!("{ns}/USAGE#{entity}")),
        sk: crate::keys::shared_text(format_args!("{resource}#{}#{start_ms:015}", window.name())),
    }
}

/// The snapshot attribute of limit `limit`'s consumption (millitokens).
pub fn snapshot_attr(limit: &str) -> String {
    crate::keys::joined(&["u_", limit])
}

/// The snapshot attribute of limit `limit`'s overdraw (millitokens; upstream's
/// `{limit}#od`, spelt without the `#`).
pub fn overdraw_attr(limit: &str) -> String {
    crate::keys::joined(&["od_", limit])
}

/// Snapshot attribute names.
pub mod snap {
    /// Admitted acquires.
    pub const REQUESTS: &str = "requests";
    /// Window name.
    pub const WINDOW: &str = "window";
    /// Window start (ms).
    pub const START: &str = "window_start";
    /// Window start, UTC text.
    pub const START_ISO: &str = "window_start_iso";
}

/// The update that adds `milli`, `overdraw` and `requests` to the snapshot of (entity, resource,
/// window, start): identity attributes SET (idempotent), counters ADDed, `ttl` = window end
/// + `retention_s`, and GSI2 keys for listing a resource's usage over all entities.
#[allow(clippy::too_many_arguments)]
pub fn snapshot_update(
    ns: &str,
    entity: &str,
    resource: &str,
    window: Window,
    start_ms: i64,
    milli: &BTreeMap<String, i64>,
    overdraw: &BTreeMap<String, i64>,
    requests: i64,
    retention_s: i64,
) -> Update {
    // Every string is built once, in the String the update keeps (no copy of a formatted
    // text): a pass writes one of these per snapshot item it touches.
    let mut u = Update::with_capacity(9 + milli.len() + overdraw.len())
        .set(bucket_attr::ENTITY, entity)
        .set(bucket_attr::RESOURCE, resource)
        .set(snap::WINDOW, window.name())
        .set(snap::START, start_ms)
        .set(snap::START_ISO, iso_utc(start_ms))
        .set(
            bucket_attr::TTL,
            window.end_ms(start_ms) / 1000 + retention_s,
        )
        .set("GSI2PK", crate::keys::gsi2_resource(ns, resource))
        .set("GSI2SK", usage_sort_key(window, start_ms, entity));
    for (l, d) in milli {
        u = u.add(snapshot_attr(l), *d);
    }
    for (l, d) in overdraw {
        u = u.add(overdraw_attr(l), *d);
    }
    if requests != 0 || milli.is_empty() {
        u = u.add(snap::REQUESTS, requests);
    }
    u
}

/// A snapshot's `GSI2SK`: `USAGE#{window}#{start_ms:015}#{entity}`, its digits written
/// here rather than by `format!` (a pass builds one for every snapshot item it writes).
fn usage_sort_key(window: Window, start_ms: i64, entity: &str) -> String {
    const WIDTH: usize = 15;
    if !(0..10i64.pow(WIDTH as u32)).contains(&start_ms) {
        return format!("USAGE#{}#{start_ms:015}#{entity}", window.name());
    }
    let mut digits = [b'0'; WIDTH];
    let mut v = start_ms;
    for d in digits.iter_mut().rev() {
        // In 0..10 by the range checked above.
        *d = b'0' + (v % 10) as u8;
        v /= 10;
    }
    debug_assert_eq!(v, 0, "the start fits in {WIDTH} digits");
    let digits = std::str::from_utf8(&digits).unwrap_or_default();
    crate::keys::joined(&["USAGE#", window.name(), "#", digits, "#", entity])
}

/// A usage snapshot as stored, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Entity.
    pub entity: String,
    /// Resource.
    pub resource: String,
    /// Window.
    pub window: Window,
    /// Window start (ms).
    pub start_ms: i64,
    /// Consumption per limit (millitokens).
    pub milli: BTreeMap<String, i64>,
    /// Overdraw per limit (millitokens): consumption that drove a balance below zero
    /// ([`overdraw_of`]); limits never overdrawn in the window are absent.
    pub overdraw: BTreeMap<String, i64>,
    /// Admitted acquires.
    pub requests: i64,
}

impl Snapshot {
    /// Decode a stored snapshot item; `None` for an item that is not one.
    pub fn decode(i: &Item) -> Option<Snapshot> {
        let s = |a: &str| i.get(a).and_then(Value::as_s).map(str::to_string);
        let counters = |prefix: &str| {
            i.iter()
                .filter_map(|(k, v)| Some((k.strip_prefix(prefix)?.to_string(), v.as_n()?)))
                .collect()
        };
        let (milli, overdraw) = (counters("u_"), counters("od_"));
        Some(Snapshot {
            entity: s(bucket_attr::ENTITY)?,
            resource: s(bucket_attr::RESOURCE)?,
            window: Window::parse(&s(snap::WINDOW)?)?,
            start_ms: i.get(snap::START).and_then(Value::as_n)?,
            milli,
            overdraw,
            requests: i.get(snap::REQUESTS).and_then(Value::as_n).unwrap_or(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn num(i: Option<&Item>, name: &str) -> i64 {
        i.and_then(|i| i.get(name))
            .and_then(Value::as_n)
            .unwrap_or(0)
    }

    /// The usage rule as it reads by look-ups of each attribute (the form `usage_view`
    /// replaced with one walk per image): the oracle of
    /// `one_walk_reads_what_the_lookups_read`.
    fn usage_by_lookups<'a>(
        key: &'a Key,
        old: Option<&Item>,
        new: Option<&'a Item>,
        at_ms: i64,
    ) -> Option<UsageView<'a>> {
        let ns = bucket_ns(key)?;
        let new = new?;
        let text = |a: &str| new.get(a).and_then(Value::as_s);
        let (entity, resource) = (text(bucket_attr::ENTITY)?, text(bucket_attr::RESOURCE)?);
        let mut milli = SmallVec::new();
        let mut overdraw = SmallVec::new();
        for (name, v) in new.iter().filter(|(n, _)| n.starts_with("b_")) {
            let Some(limit) = name.strip_prefix("b_").and_then(|r| r.strip_suffix("_tc")) else {
                continue;
            };
            if limit == WCU || limit.is_empty() {
                continue;
            }
            let d = v.as_n().unwrap_or(0) - num(old, name);
            if d != 0 {
                milli.push((limit, d));
            }
            let od = if d > 0 {
                let tk = format!("{}{}", &name[..name.len() - 2], field::TK);
                overdraw_of(d, num(Some(new), &tk), debited_at(old, new, &tk))
            } else {
                0
            };
            if od != 0 {
                overdraw.push((limit, od));
            }
        }
        let requests = num(Some(new), attr::RQ) - num(old, attr::RQ);
        let at_ms = new.get(attr::WT).and_then(Value::as_n).unwrap_or(at_ms);
        let v = UsageView {
            ns,
            entity,
            resource,
            at_ms,
            milli,
            overdraw,
            requests,
        };
        (v.requests != 0 || !v.milli.is_empty()).then_some(v)
    }

    /// `iso_utc` writes its digits itself; it spells every instant as `format!` does
    /// (before 1970, leap days, the ends of years and of the four-digit range).
    #[test]
    fn sort_key_digits_are_the_formatted_ones() {
        let starts = [
            i64::MIN,
            -1_000,
            -1,
            0,
            7,
            3_600_000,
            1_764_633_600_000,
            999_999_999_999_999,
            1_000_000_000_000_000,
            i64::MAX,
        ];
        for w in [Window::Hourly, Window::Daily, Window::Monthly] {
            for start in starts
                .into_iter()
                .chain((0..60).map(|i| 10i64.pow(i % 19) + i64::from(i)))
            {
                assert_eq!(
                    usage_sort_key(w, start, "user-1"),
                    format!("USAGE#{}#{start:015}#user-1", w.name()),
                    "{start}"
                );
            }
        }
        assert_eq!(crate::keys::joined(&[]), "");
        assert_eq!(snapshot_attr("tpm"), "u_tpm");
        assert_eq!(overdraw_attr("tpm"), "od_tpm");
        assert_eq!(
            crate::keys::gsi2_resource("ns", "gpt-4"),
            "ns/RESOURCE#gpt-4"
        );
    }

    #[test]
    fn iso_digits_are_the_formatted_ones() {
        let by_format = |t_ms: i64| {
            let (y, m, d) = civil_from_days(t_ms.div_euclid(DAY_MS));
            let s = t_ms.rem_euclid(DAY_MS) / 1000;
            format!(
                "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
                s / 3600,
                s / 60 % 60,
                s % 60
            )
        };
        let mut t = -62_167_219_200_000; // 0000-01-01T00:00:00Z
        while t < 253_402_300_800_000 {
            // 10000-01-01: outside, formatted the general way
            for probe in [t, t + 999, t - 1, t + 86_399_999] {
                assert_eq!(iso_utc(probe), by_format(probe), "{probe}");
            }
            t += 7_777_777_777;
        }
        assert_eq!(iso_utc(-1), "1969-12-31T23:59:59Z");
        assert_eq!(iso_utc(253_402_300_800_000), "10000-01-01T00:00:00Z");
    }

    /// `usage_view` reads each image in one walk; on items drawn from names that are limit
    /// attributes, look like them or sit beside them, with values of every type, it answers
    /// exactly what reading each attribute by look-up answers.
    #[test]
    fn one_walk_reads_what_the_lookups_read() {
        const NAMES: &[&str] = &[
            "entity_id",
            "resource",
            "rq",
            "wt",
            "rf",
            "bypass",
            "b",
            "b_",
            "b_tc",
            "b__tc",
            "b_tk",
            "b_rpm_tc",
            "b_rpm_tk",
            "b_rpm_cp",
            "b_rpm_tu",
            "b_tpm_tc",
            "b_tpm_tk",
            "b_x_tc",
            "b_x_tk",
            "b_x_t_tc",
            "b_x_tc_tc",
            "b_x_tc_tk",
            "b_wcu_tc",
            "b_wcu_tk",
            "ba_x_tc",
            "b`x_tc",
            "bz_tc",
            "c_y_tc",
            "a_q_tc",
        ];
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = move || crate::test_rng::step(&mut x);
        let k = key();
        let mut draw = |always: &[&str]| -> Item {
            let mut i = Item::new();
            for n in NAMES {
                let r = next();
                let must = always.contains(n);
                if !must && r % 3 == 0 {
                    continue;
                }
                // Few distinct numbers, so that old and new often agree (an unmoved `tk`
                // or `rf`) and balances are often below zero.
                let v = match (r >> 8) % 8 {
                    0 => Value::S("e1".into()),
                    1 => Value::Bool(true),
                    _ => Value::N(((r >> 16) % 5) as i64 * 1_000 - 2_000),
                };
                let v = match *n {
                    "entity_id" | "resource" if must => Value::S("e1".into()),
                    _ => v,
                };
                i.insert((*n).into(), v);
            }
            i
        };
        let mut counted = 0;
        for case in 0..4_000 {
            let new = draw(if case % 4 == 0 {
                &[]
            } else {
                &["entity_id", "resource"]
            });
            let old = (case % 5 != 0).then(|| draw(&[]));
            let walk = usage_view(&k, old.as_ref(), Some(&new), 9);
            let lookups = usage_by_lookups(&k, old.as_ref(), Some(&new), 9);
            assert_eq!(walk, lookups, "case {case}: old {old:?} new {new:?}");
            counted += usize::from(walk.is_some_and(|v| !v.overdraw.is_empty()));
        }
        assert!(counted > 100, "the draw reaches overdraw: {counted}");
        // The old image with the new one's names, both known to share them (the shape a
        // decoder records): read at the new image's indices, the same answer.
        let mut shared = 0;
        let mut layouts = ReadLayouts::default();
        let mut y: u64 = 0x9E37_79B9_7F4A_7C15;
        for case in 0..4_000 {
            let new = draw(&["entity_id", "resource"]);
            let mut old = Item::new();
            for (n, _) in new.iter() {
                let r = crate::test_rng::step(&mut y);
                let v = match (r >> 8) % 8 {
                    0 => Value::S("e1".into()),
                    1 => Value::Bool(true),
                    _ => Value::N(((r >> 16) % 5) as i64 * 1_000 - 2_000),
                };
                old.insert(n.clone(), v);
            }
            let names = std::sync::Arc::new(new.names());
            assert!(new.has_names(&names) && old.has_names(&names));
            assert!(old.shares_shape(&new));
            let walk = usage_view(&k, Some(&old), Some(&new), 9);
            let lookups = usage_by_lookups(&k, Some(&old), Some(&new), 9);
            assert_eq!(walk, lookups, "case {case}: old {old:?} new {new:?}");
            shared += usize::from(walk.is_some_and(|v| !v.milli.is_empty()));
            // By the layouts kept for the shapes seen so far: this shape's is learnt from
            // `new`, then read back for a write the other way round (`old` after `new`,
            // the same names), and for an item that remembers no shape.
            let learnt = usage_view_in(&k, Some(&old), Some(&new), 9, &mut layouts);
            assert_eq!(learnt, lookups, "case {case}: learnt from {new:?}");
            let mut plain = Item::new();
            for (n, v) in old.iter() {
                plain.insert(n.clone(), v.clone());
            }
            let back = usage_view_in(&k, Some(&new), Some(&old), 9, &mut layouts);
            let back_lookups = usage_by_lookups(&k, Some(&new), Some(&old), 9);
            assert_eq!(back, back_lookups, "case {case}: kept for {old:?}");
            assert!(plain.shape().is_none());
            let unshaped = usage_view_in(&k, Some(&new), Some(&plain), 9, &mut layouts);
            assert_eq!(unshaped, back_lookups, "case {case}: no shape");
            assert!(layouts.len() <= READ_LAYOUTS_KEPT);
        }
        assert!(shared > 100, "the shared draws count usage: {shared}");
    }

    /// The namespace is found by a byte search for `/` where it was a substring search for
    /// `/BUCKET#`: the same answer, namespaces with slashes and near-misses included.
    #[test]
    fn bucket_namespace_is_the_first_bucket_marker() {
        for pk in [
            "default/BUCKET#u#api#0",
            "a/b/BUCKET#u#api#0",
            "a/BUCKETS/BUCKET#u#r#1",
            "/BUCKET#u#r#0",
            "ns/BUCKET#",
            "ns/BUCKET",
            "ns/bucket#u",
            "ns//BUCKET#x/BUCKET#y",
            "no-slash",
            "",
            "ns/RESOURCE#api",
            "é/ü/BUCKET#ö",
        ] {
            let key = Key::new(pk, STATE);
            let oracle = pk.split_once("/BUCKET#").map(|(ns, _)| ns);
            assert_eq!(bucket_ns(&key), oracle, "{pk}");
        }
        assert_eq!(bucket_ns(&Key::new("ns/BUCKET#u#r#0", "#CONFIG")), None);
    }

    fn item(pairs: &[(&str, Value)]) -> Item {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), v.clone()))
            .collect()
    }

    fn bucket(tc: &[(&str, i64)], rq: i64, wt: Option<i64>) -> Item {
        let mut i = item(&[
            ("entity_id", Value::S("e1".into())),
            ("resource", Value::S("gpt".into())),
            ("rq", Value::N(rq)),
            ("b_wcu_tc", Value::N(7000)),
        ]);
        for (l, v) in tc {
            i.insert(format!("b_{l}_tc").into(), Value::N(*v));
        }
        if let Some(t) = wt {
            i.insert("wt".into(), Value::N(t));
        }
        i
    }

    fn key() -> Key {
        crate::keys::bucket("ns", "e1", "gpt", 2)
    }

    /// The first consumption of a new bucket (an insert) is counted, whole.
    #[test]
    fn first_consumption_counts() {
        let new = bucket(&[("rpm", 1000), ("tpm", 250_500)], 1, Some(5_000));
        let d = usage_of(&key(), None, Some(&new), 9_999).expect("usage");
        assert_eq!(d.ns, "ns");
        assert_eq!((d.entity.as_str(), d.resource.as_str()), ("e1", "gpt"));
        assert_eq!(
            d.milli,
            [("rpm".into(), 1000), ("tpm".into(), 250_500)].into()
        );
        assert_eq!(d.requests, 1, "one acquire, two limits: one request");
        assert_eq!(
            d.at_ms, 5_000,
            "dated by the write's wt, not the store time"
        );
    }

    /// Only `b_{limit}_tc` attributes are consumption: names that sort just before or after
    /// the limits' `b_` block (`b`, `ba…`, `b``…`, `c…`) are not read as limits, and the
    /// borrowed view says what the owned delta says.
    #[test]
    fn only_limit_attributes_count_and_the_view_matches_the_delta() {
        let mut new = bucket(&[("a", 5), ("zz", 7)], 2, Some(10));
        for n in [
            "b", "b_tc", "ba_x_tc", "b`x_tc", "bz_tc", "c_y_tc", "a_q_tc",
        ] {
            new.insert(n.into(), Value::N(1_000));
        }
        let k = key();
        let v = usage_view(&k, None, Some(&new), 0).expect("usage");
        assert_eq!(&v.milli[..], &[("a", 5), ("zz", 7)]);
        assert!(v.consumed());
        let d = usage_of(&key(), None, Some(&new), 0).expect("usage");
        assert_eq!(d, v.to_delta());
        assert_eq!(d.milli, [("a".into(), 5), ("zz".into(), 7)].into());
        assert_eq!((d.requests, d.at_ms), (2, 10));
    }

    /// A fast-path write leaves `rf` alone; its usage is dated by its `wt`, and `wcu` is not
    /// usage.
    #[test]
    fn deltas_are_exact_and_wcu_is_not_usage() {
        let old = bucket(&[("rpm", 3000), ("tpm", 1_000_000)], 3, Some(1_000));
        let mut new = bucket(&[("rpm", 4000), ("tpm", 1_000_001)], 4, Some(3_600_000));
        new.insert("b_wcu_tc".into(), Value::N(8000));
        new.insert("rf".into(), Value::N(1));
        let d = usage_of(&key(), Some(&old), Some(&new), 0).expect("usage");
        assert_eq!(d.milli, [("rpm".into(), 1000), ("tpm".into(), 1)].into());
        assert_eq!(d.requests, 1);
        assert_eq!(d.at_ms, 3_600_000);
    }

    /// A rollback or downward adjustment is negative usage, counting no request; a limit
    /// added to an existing item counts its whole `tc`.
    #[test]
    fn refunds_are_negative_and_new_limits_count_from_zero() {
        let old = bucket(&[("tpm", 5000)], 2, None);
        let new = bucket(&[("tpm", 3500), ("rpm", 1000)], 2, Some(42));
        let d = usage_of(&key(), Some(&old), Some(&new), 0).expect("usage");
        assert_eq!(
            d.milli,
            [("rpm".into(), 1000), ("tpm".into(), -1500)].into()
        );
        assert_eq!(d.requests, 0);
    }

    /// Writes that move no counter (a refill, a fan-out, a delete), other items, and
    /// writers without `wt` (dated by the store's time).
    #[test]
    fn what_is_not_usage() {
        let b = bucket(&[("tpm", 5000)], 2, Some(1));
        assert_eq!(usage_of(&key(), Some(&b), Some(&b), 0), None);
        assert_eq!(usage_of(&key(), Some(&b), None, 0), None);
        let other = Key::new("ns/ENTITY#e1", "#META");
        assert_eq!(usage_of(&other, None, Some(&b), 0), None);
        let mut legacy = bucket(&[("tpm", 6000)], 2, None);
        legacy.remove("wt");
        let old = bucket(&[("tpm", 5000)], 2, None);
        let d = usage_of(&key(), Some(&old), Some(&legacy), 77).expect("usage");
        assert_eq!(d.at_ms, 77);
    }

    fn with_tk(mut i: Item, limit: &str, tk: i64) -> Item {
        i.insert(format!("b_{limit}_tk").into(), Value::N(tk));
        i
    }

    /// The brief's and scenario 107's numbers: only the consumption below zero counts.
    #[test]
    fn overdraw_is_the_consumption_below_zero() {
        assert_eq!(overdraw_of(3000, -2000, true), 2000, "1000 → −2000");
        assert_eq!(overdraw_of(1000, -3000, true), 1000, "−2000 → −3000");
        assert_eq!(
            overdraw_of(3000, -3000, true),
            3000,
            "0 → −3000 (scenario 107)"
        );
        assert_eq!(overdraw_of(500, 200, true), 0, "stays above zero");
        assert_eq!(
            overdraw_of(-1000, -2000, true),
            0,
            "a refund repays, never negative"
        );
        assert_eq!(overdraw_of(0, -2000, true), 0, "a refill is no overdraw");
        assert_eq!(
            overdraw_of(5000, -3000, false),
            0,
            "a bypass pass debits nothing"
        );
    }

    /// From the images: a debit into debt, a refund of part of it, a bypass pass, and a
    /// `tc`-only write on an item in debt.
    #[test]
    fn overdraw_from_images() {
        let b = |tc: i64, tk: i64, rq: i64| with_tk(bucket(&[("rpm", tc)], rq, Some(1)), "rpm", tk);
        let into_debt = usage_of(&key(), Some(&b(0, 1000, 0)), Some(&b(3000, -2000, 1)), 0);
        let d = into_debt.expect("usage");
        assert_eq!(d.overdraw, [("rpm".into(), 2000)].into());
        let refund = usage_of(
            &key(),
            Some(&b(3000, -2000, 1)),
            Some(&b(2000, -1000, 1)),
            0,
        );
        assert_eq!(refund.expect("usage").overdraw, BTreeMap::new());
        let created = usage_of(&key(), None, Some(&b(3000, -3000, 1)), 0).expect("usage");
        assert_eq!(created.overdraw, [("rpm".into(), 3000)].into());
        let tc_only = usage_of(
            &key(),
            Some(&b(3000, -3000, 1)),
            Some(&b(5000, -3000, 1)),
            0,
        );
        let tc_only = tc_only.expect("usage");
        assert_eq!(tc_only.milli, [("rpm".into(), 2000)].into());
        assert!(
            tc_only.overdraw.is_empty(),
            "tk and rf unmoved: nothing debited"
        );
        let mut slow = b(5000, -3000, 2);
        slow.insert("rf".into(), Value::N(99));
        let d = usage_of(&key(), Some(&b(3000, -3000, 1)), Some(&slow), 0).expect("usage");
        assert_eq!(
            d.overdraw,
            [("rpm".into(), 2000)].into(),
            "refill == debit, rf moved"
        );
        let mut bypassed = b(5000, -3000, 2);
        bypassed.insert("bypass".into(), Value::Bool(true));
        bypassed.insert("rf".into(), Value::N(99));
        let d = usage_of(&key(), Some(&b(3000, -3000, 1)), Some(&bypassed), 0).expect("usage");
        assert!(d.overdraw.is_empty());
    }

    #[test]
    fn instants_parse_as_ms_or_rfc3339() {
        assert_eq!(parse_instant("1756998000000"), Some(1_756_998_000_000));
        assert_eq!(
            parse_instant("2025-09-04T15:00:00Z"),
            Some(1_756_998_000_000)
        );
        assert_eq!(
            parse_instant("2025-09-04T17:00:00+02:00"),
            Some(1_756_998_000_000)
        );
        assert_eq!(parse_instant("yesterday"), None);
    }

    #[test]
    fn windows_start_on_utc_calendar_boundaries() {
        // 2024-02-29T13:45:10.500Z
        let t = 1_709_214_310_500;
        assert_eq!(iso_utc(Window::Hourly.start_ms(t)), "2024-02-29T13:00:00Z");
        assert_eq!(iso_utc(Window::Daily.start_ms(t)), "2024-02-29T00:00:00Z");
        let m = Window::Monthly.start_ms(t);
        assert_eq!(iso_utc(m), "2024-02-01T00:00:00Z");
        assert_eq!(iso_utc(Window::Monthly.end_ms(m)), "2024-03-01T00:00:00Z");
        let dec = Window::Monthly.start_ms(1_703_980_800_000); // 2023-12-31
        assert_eq!(iso_utc(Window::Monthly.end_ms(dec)), "2024-01-01T00:00:00Z");
        assert_eq!(Window::Hourly.end_ms(0), 3_600_000);
        assert_eq!(Window::parse("daily"), Some(Window::Daily));
        assert_eq!(Window::parse("weekly"), None);
    }

    #[test]
    fn snapshot_keys_sort_by_time_and_decode() {
        let a = snapshot_sk("gpt", Window::Hourly, 3_600_000);
        let b = snapshot_sk("gpt", Window::Hourly, 36_000_000);
        assert!(a < b);
        let u = snapshot_update(
            "ns",
            "e1",
            "gpt",
            Window::Hourly,
            3_600_000,
            &[("tpm".into(), 1500)].into(),
            &[("tpm".into(), 500)].into(),
            1,
            86_400,
        );
        let targets: Vec<&str> = u.actions.iter().map(|a| a.target()).collect();
        for t in [
            "u_tpm",
            "od_tpm",
            "requests",
            "ttl",
            "GSI2PK",
            "GSI2SK",
            "window_start",
        ] {
            assert!(targets.contains(&t), "{t} in {targets:?}");
        }
        let stored = item(&[
            ("entity_id", Value::S("e1".into())),
            ("resource", Value::S("gpt".into())),
            ("window", Value::S("hourly".into())),
            ("window_start", Value::N(3_600_000)),
            ("u_tpm", Value::N(1500)),
            ("od_tpm", Value::N(500)),
            ("requests", Value::N(1)),
        ]);
        let s = Snapshot::decode(&stored).expect("decodes");
        assert_eq!(s.milli, [("tpm".into(), 1500)].into());
        assert_eq!(s.overdraw, [("tpm".into(), 500)].into());
        assert_eq!(s.requests, 1);
        assert_eq!(s.window, Window::Hourly);
        let k = snapshot_key("ns", "e1", "gpt", Window::Hourly, 3_600_000);
        assert_eq!(&*k.pk, "ns/USAGE#e1");
        assert_eq!(*k.pk, snapshot_pk("ns", "e1"));
        assert_eq!(&*k.sk, "gpt#hourly#000000003600000");
        assert_eq!(*k.sk, snapshot_sk("gpt", Window::Hourly, 3_600_000));
    }
}

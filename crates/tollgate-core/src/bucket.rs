//! The bucket item of one (entity, resource, shard), decoded: item-level attributes and the
//! per-limit states `b_{n}_*` (spec-shards-windows-quotas.md §1.1–1.3).

use std::sync::Arc;

use crate::error::RuleError;
use crate::ids::WCU;
use crate::keys::battr;
use smallvec::SmallVec;

use crate::value::{AttrName, Item, Key, Value};

/// The write-capacity guard: capacity 1000 tokens, refilled 1000 per second, never divided.
pub const WCU_CAPACITY: i64 = 1_000_000;
/// Millitokens of `wcu` one speculative write spends.
pub const WCU_COST: i64 = 1000;
/// `wcu` refill period in ms.
pub const WCU_PERIOD_MS: i64 = 1000;

/// The `wcu` guard's stored attribute names (`b_wcu_{field}`), spelled out once: every
/// bucket write names some of them.
pub mod wcu_attr {
    /// Balance.
    pub const TK: &str = "b_wcu_tk";
    /// Consumption counter.
    pub const TC: &str = "b_wcu_tc";
    /// Capacity.
    pub const CP: &str = "b_wcu_cp";
    /// Refill amount.
    pub const RA: &str = "b_wcu_ra";
    /// Refill period.
    pub const RP: &str = "b_wcu_rp";
    /// Carried refill remainder.
    pub const RC: &str = "b_wcu_rc";
}
/// Most shards an entity's resource may spread over.
pub const MAX_SHARD_COUNT: i64 = 32;

/// Item-level attribute names.
pub mod attr {
    /// Last refill stamp and optimistic lock (ms).
    pub const RF: &str = "rf";
    /// Valid-until: the fast path may not write at or after it (ms).
    pub const VU: &str = "vu";
    /// DynamoDB TTL (epoch seconds).
    pub const TTL: &str = "ttl";
    /// Shard count (shard 0 is the source of truth).
    pub const SHARD_COUNT: &str = "shard_count";
    /// Hash of the limit parameters the item was materialised with.
    pub const PH: &str = "ph";
    /// Entity id.
    pub const ENTITY: &str = "entity_id";
    /// Resource.
    pub const RESOURCE: &str = "resource";
    /// Shard index.
    pub const SHARD: &str = "shard";
    /// Present (true) while the (entity, resource) is disabled: every acquire is refused.
    pub const DISABLED: &str = "disabled";
    /// Present (true) while the (entity, resource) is bypassed (ADR-151): every acquire is
    /// admitted, recorded in `tc`, and debits no balance but `wcu`.
    pub const BYPASS: &str = "bypass";
    /// The effective cascade policy of the (entity, resource) when the item was last
    /// materialised (ADR-146): whether an acquire also debits the parent.
    pub const CASCADE: &str = "cascade";
    /// The id of the last reset / top-up that landed on the item (ADR-149).
    pub const OP: &str = "op";
}

/// The stored "no schedule" marker (BUCKET_SCHED_NONE).
pub const SCHED_NONE: &str = "-";

/// One limit's state on a bucket item. Millitokens and ms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LimitState {
    /// Balance on this shard (may be negative: debt).
    pub balance: i64,
    /// Capacity, undivided.
    pub capacity: i64,
    /// Refill amount per period, undivided (0 for quotas).
    pub refill_amount: i64,
    /// Refill period (ms).
    pub refill_period_ms: i64,
    /// Net consumption counter.
    pub consumed: i64,
    /// Carried refill remainder (see [`crate::refill`]).
    pub refill_carry: i64,
    /// Duration-window start.
    pub window_start_ms: Option<i64>,
    /// Duration-window length (s).
    pub window_s: Option<i64>,
    /// Window-applied marker.
    pub window_applied_ms: Option<i64>,
    /// `tc` snapshot taken by a rollover fan-out.
    pub window_consumed: Option<i64>,
    /// Grant count: the shard count this shard's quota grant was sized at.
    pub grant_count: Option<i64>,
    /// Calendar reset cron and zone, for quotas that reset on a calendar.
    pub calendar: Option<(String, String)>,
    /// Period-applied marker of a calendar quota: the reset edge this shard's balance
    /// reflects (the calendar counterpart of `wa`; `rf` stands in where it is absent).
    pub period_applied_ms: Option<i64>,
    /// The limit's time-of-day schedule, as stored (`b_{n}_sched`, ADR-135; decoded by
    /// [`crate::schedule::Schedule::decode`]). `"-"` reads as none.
    pub schedule: Option<String>,
    /// Base (unscheduled) capacity of a scheduled limit (`b_{n}_bcp`): `cp` holds the
    /// materialised value.
    pub base_capacity: Option<i64>,
    /// Base (unscheduled) drip amount of a scheduled limit (`b_{n}_bra`).
    pub base_refill_amount: Option<i64>,
    /// Dripping limits: the trust horizon `b_{n}_fu` — the instant the balance written at
    /// `rf` is full again; a balance-only debit of this limit is exact only before it
    /// (see `materialize::drip_full_at`). Absent: never trusted.
    pub full_at_ms: Option<i64>,
    /// Quotas: top-up above the grant in the current period (`b_{n}_tu`, ADR-149), in milli;
    /// raises the ceiling to `C // gc + tu` and is removed by the next reset.
    pub topped_up: Option<i64>,
}

/// A decoded bucket item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketImage {
    /// Item key (shared with the key the item was written under, when the caller gives it).
    pub key: Key,
    /// `rf`.
    pub refilled_at_ms: i64,
    /// `vu`.
    pub valid_until_ms: Option<i64>,
    /// `ttl` (epoch s).
    pub ttl: Option<i64>,
    /// `shard_count` (1 when absent).
    pub shard_count: i64,
    /// Parameter hash.
    pub params_hash: Option<AttrName>,
    /// User limits by name (complete states only).
    pub limits: LimitMap,
    /// The `wcu` guard.
    pub wcu: Option<LimitState>,
    /// The (entity, resource) is disabled.
    pub disabled: bool,
    /// The (entity, resource) is bypassed (ADR-151, `bypass` stamp).
    pub bypass: bool,
    /// The id of the last reset / top-up that landed on this shard (`op`, ADR-149).
    pub op: Option<String>,
    /// The cascade stamp (`cascade`, ADR-146): the policy the last stamping write
    /// resolved; `None` on an item no stamping write has touched.
    pub cascade: Option<bool>,
    /// The shape of the item this image was decoded from, when the decoder recorded it
    /// ([`BucketImage::decode_like`]): how the next version of the item is decoded. Not
    /// part of the image's value (equal images may carry different layouts).
    pub layout: LayoutRef,
}

mod layout;
mod limit_map;
pub use layout::{Layout, LayoutRef, Shapes, SHAPES_KEPT};
pub use limit_map::LimitMap;

/// The per-limit attribute schema: limit `n`'s field `f` is stored as `b_{n}_{f}`
/// ([`crate::keys::battr`]). Every encoder, decoder and condition names a field through
/// these.
pub mod field {
    /// This shard's balance (millitokens, signed: debt allowed).
    pub const TK: &str = "tk";
    /// Capacity, undivided (millitokens).
    pub const CP: &str = "cp";
    /// Refill amount per period, undivided (millitokens; 0 for quotas).
    pub const RA: &str = "ra";
    /// Refill period (ms).
    pub const RP: &str = "rp";
    /// Net consumption counter (millitokens, signed).
    pub const TC: &str = "tc";
    /// Drip remainder carried to the next refill (see `refill::refill`); written only by
    /// writes that move `rf`.
    pub const RC: &str = "rc";
    /// Duration-window start (epoch ms).
    pub const WS: &str = "ws";
    /// Duration-window length (s).
    pub const RSA: &str = "rsa";
    /// Window-applied marker: the `ws` whose allowance the balance reflects (epoch ms).
    pub const WA: &str = "wa";
    /// `tc` snapshot taken when a fan-out moved `ws` onto the shard (millitokens).
    pub const WTC: &str = "wtc";
    /// Grant count: the shard count a quota's current grant was sized at.
    pub const GC: &str = "gc";
    /// Per-limit calendar reset schedule override.
    pub const RSCHED: &str = "rsched";
    /// Per-limit time zone.
    pub const TZ: &str = "tz";
    /// The period edge a calendar quota's balance belongs to (epoch ms).
    pub const PE: &str = "pe";
    /// Per-limit time-of-day schedule override.
    pub const SCHED: &str = "sched";
    /// Base capacity before a schedule (millitokens).
    pub const BCP: &str = "bcp";
    /// Base refill amount before a schedule (millitokens).
    pub const BRA: &str = "bra";
    /// Trust horizon: when the balance written at `rf` is full again (epoch ms).
    pub const FU: &str = "fu";
    /// Top-up above the grant in the current period (millitokens).
    pub const TU: &str = "tu";
    /// Soft (non-enforcing) limit marker.
    pub const SOFT: &str = "soft";
}

/// Every per-limit field, in the order they are decoded.
pub const FIELDS: [&str; 19] = [
    field::TK,
    field::CP,
    field::RA,
    field::RP,
    field::TC,
    field::RC,
    field::WS,
    field::RSA,
    field::WA,
    field::WTC,
    field::GC,
    field::RSCHED,
    field::TZ,
    field::PE,
    field::SCHED,
    field::BCP,
    field::BRA,
    field::FU,
    field::TU,
];

/// One limit's stored fields while decoding: by index in `FIELDS`, the place of the
/// attribute in the item ([`Item::at`]), [`ABSENT`] when the item has none.
type LimitFields = [u32; FIELDS.len()];

/// A field the item does not hold.
const ABSENT: u32 = u32::MAX;

/// A name of at most 7 bytes as one integer (its bytes, then its length in the top byte):
/// equal names, equal integers, and no two names of 7 bytes or fewer share one. Decoding
/// compares a field name against every entry of [`FIELDS`]; as integers that is 19 compares
/// of a word instead of a `memcmp` call each (the largest cost of decoding an image).
const fn packed(name: &[u8]) -> Option<u64> {
    if name.len() > 7 {
        return None;
    }
    let mut x = (name.len() as u64) << 56;
    let mut i = 0;
    while i < name.len() {
        x |= (name[i] as u64) << (8 * i);
        i += 1;
    }
    Some(x)
}

/// [`FIELDS`], packed.
const PACKED_FIELDS: [u64; FIELDS.len()] = {
    let mut out = [0; FIELDS.len()];
    let mut i = 0;
    while i < FIELDS.len() {
        out[i] = match packed(FIELDS[i].as_bytes()) {
            Some(x) => x,
            None => panic!("a field name is longer than 7 bytes"),
        };
        i += 1;
    }
    out
};

/// The index in [`FIELDS`] of a field name.
fn field_index(name: &str) -> Option<usize> {
    let p = packed(name.as_bytes())?;
    PACKED_FIELDS.iter().position(|x| *x == p)
}

/// The index in [`FIELDS`] of a field name, at compile time.
const fn index_of(name: &str) -> usize {
    let p = match packed(name.as_bytes()) {
        Some(p) => p,
        None => panic!("not a field"),
    };
    let mut i = 0;
    while i < FIELDS.len() {
        if PACKED_FIELDS[i] == p {
            return i;
        }
        i += 1;
    }
    panic!("not a field")
}

/// Each field's index in [`FIELDS`], computed at compile time.
mod at {
    use super::{field, index_of};
    pub const TK: usize = index_of(field::TK);
    pub const CP: usize = index_of(field::CP);
    pub const RA: usize = index_of(field::RA);
    pub const RP: usize = index_of(field::RP);
    pub const TC: usize = index_of(field::TC);
    pub const RC: usize = index_of(field::RC);
    pub const WS: usize = index_of(field::WS);
    pub const RSA: usize = index_of(field::RSA);
    pub const WA: usize = index_of(field::WA);
    pub const WTC: usize = index_of(field::WTC);
    pub const GC: usize = index_of(field::GC);
    pub const RSCHED: usize = index_of(field::RSCHED);
    pub const TZ: usize = index_of(field::TZ);
    pub const PE: usize = index_of(field::PE);
    pub const SCHED: usize = index_of(field::SCHED);
    pub const BCP: usize = index_of(field::BCP);
    pub const BRA: usize = index_of(field::BRA);
    pub const FU: usize = index_of(field::FU);
    pub const TU: usize = index_of(field::TU);
}

/// The top-level attributes [`BucketImage::decode_keyed`] reads, taken in its one pass over
/// the item instead of a map look-up each.
#[derive(Default)]
struct TopLevel<'a> {
    rf: Option<&'a Value>,
    shard_count: Option<&'a Value>,
    vu: Option<&'a Value>,
    ttl: Option<&'a Value>,
    ph: Option<&'a Value>,
    op: Option<&'a Value>,
    cascade: Option<&'a Value>,
    disabled: bool,
    bypass: bool,
}

/// A top-level attribute decoding reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Top {
    Rf,
    ShardCount,
    Vu,
    Ttl,
    Ph,
    Op,
    Cascade,
    Disabled,
    Bypass,
}

/// What decoding does with one attribute, by its name alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class<'a> {
    /// Nothing (an attribute decoding does not read).
    Skip,
    /// A top-level attribute.
    Top(Top),
    /// Field `FIELDS[.1]` of limit `.0` (`b_{limit}_{field}`).
    Field(&'a str, usize),
}

/// The one rule for what an attribute name means to decoding.
fn classify(name: &str) -> Class<'_> {
    let Some(rest) = name.strip_prefix("b_") else {
        return match name {
            attr::RF => Class::Top(Top::Rf),
            attr::SHARD_COUNT => Class::Top(Top::ShardCount),
            attr::VU => Class::Top(Top::Vu),
            attr::TTL => Class::Top(Top::Ttl),
            attr::PH => Class::Top(Top::Ph),
            attr::OP => Class::Top(Top::Op),
            attr::CASCADE => Class::Top(Top::Cascade),
            attr::DISABLED => Class::Top(Top::Disabled),
            attr::BYPASS => Class::Top(Top::Bypass),
            _ => Class::Skip,
        };
    };
    let Some((n, f)) = rest.rsplit_once('_') else {
        return Class::Skip;
    };
    match field_index(f) {
        Some(fi) => Class::Field(n, fi),
        None => Class::Skip,
    }
}

impl<'a> TopLevel<'a> {
    /// Take `value` as top-level attribute `t`.
    fn set(&mut self, t: Top, value: &'a Value) {
        let slot = match t {
            Top::Rf => &mut self.rf,
            Top::ShardCount => &mut self.shard_count,
            Top::Vu => &mut self.vu,
            Top::Ttl => &mut self.ttl,
            Top::Ph => &mut self.ph,
            Top::Op => &mut self.op,
            Top::Cascade => &mut self.cascade,
            Top::Disabled => {
                self.disabled = true;
                return;
            }
            Top::Bypass => {
                self.bypass = true;
                return;
            }
        };
        *slot = Some(value);
    }
}

/// Each limit's fields, gathered from an item: limits in name order.
type Gathered<'a> = SmallVec<[(&'a str, LimitFields); 4]>;

/// One pass over the attributes: the top-level ones decoding reads, and `b_{limit}_{field}`
/// grouped by limit. Each limit's fields by their index in `FIELDS` (an attribute name
/// determines its limit and field, so a slot is filled at most once), limits sorted by name.
/// Held on the stack for the usual few limits (a user limit or three and `wcu`).
fn gather(item: &Item) -> (TopLevel<'_>, Gathered<'_>) {
    let mut top = TopLevel::default();
    let mut fields: Gathered<'_> = SmallVec::new();
    for (i, (a, v)) in item.iter().enumerate() {
        let (n, fi) = match classify(a) {
            Class::Skip => continue,
            Class::Top(t) => {
                top.set(t, v);
                continue;
            }
            Class::Field(n, fi) => (n, fi),
        };
        // A limit's attributes are mostly adjacent in name order: try the last one first.
        let at = match fields.last() {
            Some((x, _)) if *x == n => fields.len() - 1,
            _ => match fields.iter().position(|(x, _)| *x == n) {
                Some(at) => at,
                None => {
                    fields.push((n, [ABSENT; FIELDS.len()]));
                    fields.len() - 1
                }
            },
        };
        debug_assert_eq!(fields[at].1[fi], ABSENT, "one attribute per field");
        fields[at].1[fi] = u32::try_from(i).unwrap_or(ABSENT);
    }
    fields.sort_unstable_by(|a, b| a.0.cmp(b.0));
    (top, fields)
}

/// A number attribute's value, `None` when absent; another type is corrupt.
fn num_of(v: Option<&Value>, key: &Key, name: &str) -> Result<Option<i64>, RuleError> {
    match v {
        None => Ok(None),
        Some(Value::N(n)) => Ok(Some(*n)),
        Some(v) => Err(corrupt(
            key,
            name,
            format!("expected a number, found {}", v.type_name()),
        )),
    }
}

/// A string attribute's value, `None` when absent; another type is corrupt.
fn string_of<'a>(
    v: Option<&'a Value>,
    key: &Key,
    name: &str,
) -> Result<Option<&'a str>, RuleError> {
    match v {
        None => Ok(None),
        Some(Value::S(s)) => Ok(Some(s.as_str())),
        Some(v) => Err(corrupt(
            key,
            name,
            format!("expected a string, found {}", v.type_name()),
        )),
    }
}

/// `key` as errors name it: its display form, empty for an item without key attributes.
fn key_text(key: &Key) -> String {
    if key.pk.is_empty() && key.sk.is_empty() {
        String::new()
    } else {
        key.to_string()
    }
}

fn corrupt(key: &Key, attribute: &str, reason: impl Into<String>) -> RuleError {
    RuleError::Corrupt {
        key: key_text(key),
        attribute: attribute.into(),
        reason: reason.into(),
    }
}

impl BucketImage {
    /// The key as error messages name it (its display form; empty for an item stored
    /// without key attributes).
    pub fn key_text(&self) -> String {
        key_text(&self.key)
    }

    /// Decode a stored bucket item. A wrong type or a missing half of a pair is an error
    /// naming the attribute.
    pub fn decode(item: &Item) -> Result<Self, RuleError> {
        Self::decode_keyed(item, Key::of(item).unwrap_or_else(|| Key::new("", "")))
    }

    /// [`BucketImage::decode`] of the item stored under `key`: the image shares the key
    /// the caller already holds instead of building it again from the item.
    pub fn decode_keyed(item: &Item, key: Key) -> Result<Self, RuleError> {
        debug_assert!(
            item.get(crate::value::PK)
                .is_none_or(|pk| pk.as_s() == Some(&*key.pk)),
            "the item is the one stored under the key"
        );
        let (top, fields) = gather(item);
        Self::assemble(item, top, fields, key, LayoutRef::default())
    }

    /// [`BucketImage::decode_keyed`] of an item written over the one `like` was decoded
    /// from (the same bucket's next version, as a write returns it): when the item has the
    /// shape `like` recorded ([`Layout`]), every attribute is taken by its place, with no
    /// name read; otherwise it is decoded in full, and — when there is a `like`: the bucket
    /// was seen before and will likely be seen again — its shape is recorded for the next
    /// version. The image is the same either way.
    pub fn decode_like(
        item: &Item,
        key: Key,
        like: Option<&BucketImage>,
    ) -> Result<Self, RuleError> {
        match like {
            Some(like) => Self::decode_shaped(item, key, Some(like), None),
            None => Self::decode_keyed(item, key),
        }
    }

    /// [`BucketImage::decode_like`], and when `like` is absent or of another shape, decoded
    /// by a layout `shapes` recorded for the item's shape (another bucket of the same
    /// resource, decoded earlier); a shape neither knows is decoded in full and recorded in
    /// `shapes`. The image is the same either way.
    pub fn decode_known(
        item: &Item,
        key: Key,
        like: Option<&BucketImage>,
        shapes: &Shapes,
    ) -> Result<Self, RuleError> {
        Self::decode_shaped(item, key, like, Some(shapes))
    }

    /// Decode by the layout of `like`, else by one `shapes` kept, else in full, recording
    /// the layout built (in `shapes` when given).
    fn decode_shaped(
        item: &Item,
        key: Key,
        like: Option<&BucketImage>,
        shapes: Option<&Shapes>,
    ) -> Result<Self, RuleError> {
        if let Some(layout) = like.and_then(|l| l.layout.0.as_ref()) {
            if let Some((top, fields)) = layout.gather(item) {
                let shared = LayoutRef(Some(Arc::clone(layout)));
                return Self::assemble(item, top, fields, key, shared);
            }
        }
        if let Some(layout) = shapes.and_then(|s| s.find(item)) {
            let (top, fields) = layout.gather_fitted(item);
            let shared = LayoutRef(Some(Arc::clone(&layout)));
            return Self::assemble(item, top, fields, key, shared);
        }
        let (top, fields) = gather(item);
        let shape = Layout::of_gathered(item, &fields).map(Arc::new);
        if let (Some(s), Some(shapes)) = (&shape, shapes) {
            shapes.record(Arc::clone(s));
        }
        Self::assemble(item, top, fields, key, LayoutRef(shape))
    }

    /// The image from what [`gather`] (or [`Layout::gather`]) took from the item: every
    /// field read with its type checked, pairs checked complete.
    fn assemble(
        item: &Item,
        top: TopLevel<'_>,
        fields: Gathered<'_>,
        key: Key,
        layout: LayoutRef,
    ) -> Result<Self, RuleError> {
        let k = &key;
        let rf = num_of(top.rf, k, attr::RF)?.ok_or_else(|| corrupt(k, attr::RF, "missing"))?;
        let shard_count = num_of(top.shard_count, k, attr::SHARD_COUNT)?.unwrap_or(1);
        if !(1..=MAX_SHARD_COUNT).contains(&shard_count) {
            return Err(corrupt(
                k,
                attr::SHARD_COUNT,
                format!("out of range: {shard_count}"),
            ));
        }
        let mut limits = LimitMap::with_capacity(fields.len());
        let mut wcu = None;
        for (n, fs) in fields {
            // A field's value, read as `num_of` / `string_of` read a top-level attribute.
            let g = |i: usize| match fs[i] {
                ABSENT => Ok(None),
                at => {
                    let (a, v) = item.at(at as usize);
                    num_of(Some(v), k, a)
                }
            };
            let gs = |i: usize| match fs[i] {
                ABSENT => Ok(None),
                at => {
                    let (a, v) = item.at(at as usize);
                    string_of(Some(v), k, a).map(|x| x.map(str::to_string))
                }
            };
            let (tk, cp) = match (g(at::TK)?, g(at::CP)?) {
                (Some(tk), Some(cp)) => (tk, cp),
                (None, None) => continue,
                (Some(_), None) => {
                    return Err(corrupt(k, &battr(n, field::CP), "missing (tk present)"))
                }
                (None, Some(_)) => {
                    return Err(corrupt(k, &battr(n, field::TK), "missing (cp present)"))
                }
            };
            let ws = g(at::WS)?;
            let rsa = g(at::RSA)?;
            if ws.is_some() && rsa.is_none() {
                return Err(corrupt(k, &battr(n, field::RSA), "missing (ws present)"));
            }
            let rsched = match (gs(at::RSCHED)?, gs(at::TZ)?) {
                (Some(c), tz) => Some((c, tz.unwrap_or_else(|| "UTC".into()))),
                (None, _) => None,
            };
            let st = LimitState {
                balance: tk,
                capacity: cp,
                refill_amount: g(at::RA)?.unwrap_or(0),
                refill_period_ms: g(at::RP)?.unwrap_or(0),
                consumed: g(at::TC)?.unwrap_or(0),
                refill_carry: g(at::RC)?.unwrap_or(0),
                window_start_ms: ws,
                window_s: rsa,
                window_applied_ms: g(at::WA)?,
                window_consumed: g(at::WTC)?,
                grant_count: g(at::GC)?,
                calendar: rsched,
                period_applied_ms: g(at::PE)?,
                schedule: gs(at::SCHED)?.filter(|x| x != SCHED_NONE),
                base_capacity: g(at::BCP)?,
                base_refill_amount: g(at::BRA)?,
                full_at_ms: g(at::FU)?,
                topped_up: g(at::TU)?,
            };
            if n == WCU {
                wcu = Some(st);
            } else {
                limits.insert(AttrName::from(n), st);
            }
        }
        let vu = num_of(top.vu, k, attr::VU)?;
        let ttl = num_of(top.ttl, k, attr::TTL)?;
        let ph = string_of(top.ph, k, attr::PH)?.map(AttrName::from);
        let disabled = top.disabled;
        let bypass = top.bypass;
        let op = string_of(top.op, k, attr::OP)?.map(str::to_string);
        let cascade = match top.cascade {
            None => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(v) => {
                return Err(corrupt(
                    k,
                    attr::CASCADE,
                    format!("expected a bool, found {}", v.type_name()),
                ))
            }
        };
        Ok(BucketImage {
            key,
            refilled_at_ms: rf,
            valid_until_ms: vu,
            ttl,
            shard_count,
            params_hash: ph,
            limits,
            wcu,
            disabled,
            bypass,
            op,
            cascade,
            layout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wcu_names_are_its_battrs() {
        use crate::ids::WCU;
        use crate::keys::battr;
        for (n, f) in [
            (wcu_attr::TK, field::TK),
            (wcu_attr::TC, field::TC),
            (wcu_attr::CP, field::CP),
            (wcu_attr::RA, field::RA),
            (wcu_attr::RP, field::RP),
            (wcu_attr::RC, field::RC),
        ] {
            assert_eq!(n, battr(WCU, f));
        }
    }
    use crate::value::Key;

    fn item(pairs: &[(&str, Value)]) -> Item {
        let mut i: Item = pairs
            .iter()
            .map(|(k, v)| ((*k).into(), v.clone()))
            .collect();
        Key::new("ns/BUCKET#e#r#0", "#STATE").stamp(&mut i);
        i
    }

    #[test]
    fn every_field_name_finds_its_index_and_nothing_else_does() {
        for (i, f) in FIELDS.iter().enumerate() {
            assert_eq!(field_index(f), Some(i), "{f}");
        }
        assert_eq!(at::TK, 0);
        assert_eq!(at::TU, FIELDS.len() - 1);
        for other in [
            "",
            "t",
            "tkk",
            "tk\0",
            "\0tk",
            "TK",
            "rschedx",
            "rsched\0\0",
            "bx",
        ] {
            assert_eq!(field_index(other), None, "{other:?}");
        }
    }

    #[test]
    fn top_level_attributes_of_the_wrong_type_are_corrupt() {
        for (name, v) in [
            (attr::RF, Value::S("x".into())),
            (attr::SHARD_COUNT, Value::S("x".into())),
            (attr::VU, Value::Bool(true)),
            (attr::PH, Value::N(1)),
            (attr::CASCADE, Value::N(1)),
        ] {
            let mut i = item(&[
                ("rf", Value::N(5)),
                ("b_rpm_tk", Value::N(1)),
                ("b_rpm_cp", Value::N(2)),
            ]);
            i.insert(name.into(), v);
            match BucketImage::decode(&i) {
                Err(RuleError::Corrupt { attribute, .. }) => assert_eq!(attribute, name),
                other => panic!("{name}: {other:?}"),
            }
        }
        let mut i = item(&[
            ("rf", Value::N(5)),
            ("disabled", Value::Bool(true)),
            ("op", Value::S("o".into())),
        ]);
        i.insert(attr::BYPASS.into(), Value::N(1));
        let b = BucketImage::decode(&i).unwrap();
        assert!(b.disabled && b.bypass);
        assert_eq!(b.op.as_deref(), Some("o"));
    }

    #[test]
    fn decodes_limits_with_underscores_and_wcu() {
        let i = item(&[
            ("rf", Value::N(5)),
            ("b_gpt_tpm_tk", Value::N(7)),
            ("b_gpt_tpm_cp", Value::N(9)),
            ("b_wcu_tk", Value::N(1)),
            ("b_wcu_cp", Value::N(2)),
            ("b_old_bx", Value::N(3)),
        ]);
        let b = BucketImage::decode(&i).unwrap();
        assert_eq!(b.limits["gpt_tpm"].balance, 7);
        assert_eq!(b.wcu.unwrap().capacity, 2);
        assert_eq!(b.shard_count, 1);
    }

    #[test]
    fn corrupt_attributes_are_named() {
        let e = BucketImage::decode(&item(&[
            ("rf", Value::N(5)),
            ("b_session_tk", Value::N(1)),
            ("b_session_cp", Value::N(1)),
            ("b_session_ws", Value::S("1.5".into())),
            ("b_session_rsa", Value::N(1)),
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("b_session_ws"), "{e}");
        let e = BucketImage::decode(&item(&[("rf", Value::N(5)), ("b_rpm_tk", Value::N(1))]))
            .unwrap_err();
        assert!(e.to_string().contains("b_rpm_cp"), "{e}");
        let e = BucketImage::decode(&item(&[("rf", Value::S("x".into()))])).unwrap_err();
        assert!(e.to_string().contains("rf"), "{e}");
        let e = BucketImage::decode(&item(&[
            ("rf", Value::N(1)),
            ("b_s_tk", Value::N(1)),
            ("b_s_cp", Value::N(1)),
            ("b_s_ws", Value::N(1)),
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("b_s_rsa"), "{e}");
    }
}

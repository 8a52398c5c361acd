//! The signed payload: a lease's whole state as a serialisable document, and back.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tollgate_core::bucket::{BucketImage, LimitState};
use tollgate_core::expr::Condition;
use tollgate_core::value::Key;
use tollgate_core::writes::{params_hash, TtlWrite};
use tollgate_core::{LimitSpec, LimitStatus};

use crate::error::{Error, Result};
use crate::lease::{Lease, Part, State};
use crate::limiter::Inner;
use crate::request::Request;

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Body {
    pub(super) id: String,
    pub(super) ver: u64,
    pub(super) iat: i64,
    pub(super) exp: i64,
    pub(super) ns: String,
    pub(super) lease: Doc,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Doc {
    pub(super) entity: String,
    pub(super) resource: String,
    /// `None`: a degraded lease (granted without the store; writes nothing).
    pub(super) req: Option<ReqDoc>,
    pub(super) parts: Vec<PartDoc>,
    pub(super) pending: BTreeMap<String, i64>,
    pub(super) statuses: Vec<LimitStatus>,
    pub(super) parent: Option<Box<Doc>>,
    pub(super) closed: bool,
    /// The (entity, resource)'s shard count as the exporting limiter knew it: the resuming
    /// limiter plans refunds and usage with it, as the granting one would (a count seen is
    /// never too high: counts only grow).
    pub(super) shard_count: Option<i64>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct ReqDoc {
    pub(super) amounts: Vec<(String, i64)>,
    pub(super) limits: Vec<LimitSpec>,
    pub(super) ph: String,
    /// `Some(t)`: the slow path sets `ttl = t`; `None`: it removes it.
    pub(super) ttl: Option<i64>,
    pub(super) cascade: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct PartDoc {
    pub(super) shard: u32,
    pub(super) key: Key,
    pub(super) held: BTreeMap<String, i64>,
    pub(super) pins: BTreeMap<String, Condition>,
    pub(super) image: Option<ImageDoc>,
    /// ADR-151: debited while bypassed (its adjustments are recorded in `tc` only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) bypassed: bool,
}

/// A [`BucketImage`], compact: absent attributes are left out (a token travels in a URL
/// path). Its `key` is the part's.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct ImageDoc {
    pub(super) rf: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) vu: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) ttl: Option<i64>,
    pub(super) sc: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) ph: Option<String>,
    pub(super) l: BTreeMap<String, StateDoc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) w: Option<StateDoc>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) d: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) bp: bool,
}

/// A [`LimitState`], compact (names as in the item, `b_{limit}_{name}`).
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct StateDoc {
    pub(super) tk: i64,
    pub(super) cp: i64,
    pub(super) ra: i64,
    pub(super) rp: i64,
    pub(super) tc: i64,
    pub(super) rc: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) ws: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) rsa: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) wa: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) wtc: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) gc: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) rsched: Option<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) pe: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) sched: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) bcp: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) bra: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) fu: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) tu: Option<i64>,
}

impl From<&LimitState> for StateDoc {
    fn from(s: &LimitState) -> Self {
        // Destructured whole: a field added to `LimitState` must be added here too.
        let LimitState {
            balance: tk,
            capacity: cp,
            refill_amount: ra,
            refill_period_ms: rp,
            consumed: tc,
            refill_carry: rc,
            window_start_ms: ws,
            window_s: rsa,
            window_applied_ms: wa,
            window_consumed: wtc,
            grant_count: gc,
            calendar: rsched,
            period_applied_ms: pe,
            schedule: sched,
            base_capacity: bcp,
            base_refill_amount: bra,
            full_at_ms: fu,
            topped_up: tu,
        } = s.clone();
        StateDoc {
            tk,
            cp,
            ra,
            rp,
            tc,
            rc,
            ws,
            rsa,
            wa,
            wtc,
            gc,
            rsched,
            pe,
            sched,
            bcp,
            bra,
            fu,
            tu,
        }
    }
}

impl From<StateDoc> for LimitState {
    fn from(s: StateDoc) -> Self {
        let StateDoc {
            tk,
            cp,
            ra,
            rp,
            tc,
            rc,
            ws,
            rsa,
            wa,
            wtc,
            gc,
            rsched,
            pe,
            sched,
            bcp,
            bra,
            fu,
            tu,
        } = s;
        LimitState {
            balance: tk,
            capacity: cp,
            refill_amount: ra,
            refill_period_ms: rp,
            consumed: tc,
            refill_carry: rc,
            window_start_ms: ws,
            window_s: rsa,
            window_applied_ms: wa,
            window_consumed: wtc,
            grant_count: gc,
            calendar: rsched,
            period_applied_ms: pe,
            schedule: sched,
            base_capacity: bcp,
            base_refill_amount: bra,
            full_at_ms: fu,
            topped_up: tu,
        }
    }
}

impl From<&BucketImage> for ImageDoc {
    fn from(i: &BucketImage) -> Self {
        let BucketImage {
            key: _,
            refilled_at_ms: rf,
            valid_until_ms: vu,
            ttl,
            shard_count,
            params_hash: ph,
            limits,
            wcu,
            disabled,
            bypass,
            op: _,
            cascade: _,
            layout: _,
        } = i;
        ImageDoc {
            rf: *rf,
            vu: *vu,
            ttl: *ttl,
            sc: *shard_count,
            ph: ph.as_ref().map(|p| p.to_string()),
            l: limits
                .iter()
                .map(|(n, s)| (n.to_string(), s.into()))
                .collect(),
            w: wcu.as_ref().map(StateDoc::from),
            d: *disabled,
            bp: *bypass,
        }
    }
}

impl ImageDoc {
    fn image(self, key: &Key) -> BucketImage {
        BucketImage {
            key: key.clone(),
            refilled_at_ms: self.rf,
            valid_until_ms: self.vu,
            ttl: self.ttl,
            shard_count: self.sc,
            params_hash: self.ph.map(Into::into),
            limits: self
                .l
                .into_iter()
                .map(|(n, s)| (n.into(), s.into()))
                .collect(),
            wcu: self.w.map(LimitState::from),
            disabled: self.d,
            bypass: self.bp,
            op: None,
            cascade: None,
            layout: Default::default(),
        }
    }
}

pub(super) fn doc_of(inner: &Inner, l: &Lease) -> Doc {
    let seen = l
        .parts
        .iter()
        .filter_map(|p| p.image.as_ref().map(|i| i.shard_count));
    let shard_count = inner
        .shards()
        .count(&l.entity, &l.resource)
        .into_iter()
        .chain(seen)
        .max();
    Doc {
        entity: l.entity.to_string(),
        resource: l.resource.to_string(),
        req: l.req.as_ref().map(|r| ReqDoc {
            amounts: r.amounts.to_vec(),
            limits: r.limits.iter().map(LimitSpec::from).collect(),
            ph: r.params_hash.to_string(),
            ttl: match r.ttl {
                TtlWrite::Set(t) => Some(t),
                TtlWrite::Remove => None,
            },
            cascade: r.cascade,
        }),
        parts: l
            .parts
            .iter()
            .map(|p| PartDoc {
                shard: p.shard,
                key: p.key.clone(),
                held: p.held.clone(),
                pins: p.pins.clone(),
                image: p.image.as_deref().map(ImageDoc::from),
                bypassed: p.bypassed,
            })
            .collect(),
        pending: l.pending.clone(),
        statuses: l.statuses.clone(),
        parent: l.parent.as_deref().map(|p| Box::new(doc_of(inner, p))),
        closed: l.state == State::Closed,
        shard_count,
    }
}

pub(super) fn invalid(reason: impl Into<String>) -> Error {
    Error::InvalidLease(reason.into())
}

pub(super) fn lease_of(inner: &Arc<Inner>, d: Doc, depth: u32) -> Result<Lease> {
    let req = match d.req {
        None => None,
        Some(r) => {
            let limits = r
                .limits
                .iter()
                .map(LimitSpec::to_limit)
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| invalid(format!("a limit does not decode: {e}")))?;
            // The parameter hash is the limits' own: a limit that did not survive the
            // round trip exactly would change what the lease writes.
            // The mode, when one was set, follows the limits' hash (`bypass::policy_hash`).
            let (hash, mode) = match r.ph.split_once('/') {
                Some((h, m)) => (h, Some(m)),
                None => (r.ph.as_str(), None),
            };
            let mode: Option<tollgate_core::bypass::Enforcement> = mode
                .map(str::parse)
                .transpose()
                .map_err(|e: String| invalid(format!("its parameter hash names no mode: {e}")))?;
            if params_hash(&limits) != hash {
                return Err(invalid("its limits do not match their parameter hash"));
            }
            Some(Request {
                entity: d.entity.as_str().into(),
                resource: d.resource.as_str().into(),
                amounts: r.amounts.into(),
                limits: limits.into(),
                params_hash: r.ph.into(),
                ttl: r.ttl.map_or(TtlWrite::Remove, TtlWrite::Set),
                cascade: r.cascade,
                bypass: d.parts.iter().any(|p| p.bypassed),
                mode,
                // Never confirmed: a stamp it questions is re-read first.
                mode_confirmed: false,
            })
        }
    };
    if req.is_some() == d.parts.is_empty() {
        return Err(invalid("a granted lease holds shards, a degraded one none"));
    }
    if let Some(s) = d.shard_count {
        if !(1..=tollgate_core::bucket::MAX_SHARD_COUNT).contains(&s) {
            return Err(invalid(format!("shard count {s}")));
        }
        inner.shards().raise(&d.entity, &d.resource, s);
    }
    let parent = match d.parent {
        None => None,
        // A parent lease never has a parent of its own (ADR-146, C4).
        Some(_) if depth > 0 => return Err(invalid("a cascade parent with a parent")),
        Some(p) => Some(Box::new(lease_of(inner, *p, depth + 1)?)),
    };
    Ok(Lease {
        lim: req.as_ref().map(|_| inner.clone()),
        req,
        entity: d.entity.into(),
        resource: d.resource.into(),
        parts: d
            .parts
            .into_iter()
            .map(|p| Part {
                shard: p.shard,
                image: p.image.map(|i| Arc::new(i.image(&p.key))),
                key: p.key,
                held: p.held,
                pins: p.pins,
                bypassed: p.bypassed,
            })
            .collect(),
        pending: d.pending,
        statuses: d.statuses,
        parent,
        state: if d.closed { State::Closed } else { State::Open },
        shared: None,
    })
}

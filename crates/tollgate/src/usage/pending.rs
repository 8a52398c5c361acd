//! The usage a pass has summed but not yet committed: per snapshot item, every change's
//! consumption, overdraw and requests, and the store operations that add it.

use std::collections::{BTreeMap, BTreeSet};

use tollgate_core::expr::{Condition, ReturnValues};
use tollgate_core::usage::{snapshot_key, snapshot_update, usage_of, UsageDelta, Window};
use tollgate_core::value::Key;
use tollgate_store::{Change, TransactOp, UpdateRequest};

/// The usage summed for one snapshot item.
pub(super) struct Sum {
    entity: String,
    resource: String,
    window: Window,
    start_ms: i64,
    milli: BTreeMap<String, i64>,
    overdraw: BTreeMap<String, i64>,
    requests: i64,
}

/// Usage summed per snapshot item, and the (entity, resource) pairs that consumed.
#[derive(Default)]
pub(super) struct Pending {
    /// Per snapshot item, in key order (the order its transactions are cut in).
    pub snaps: BTreeMap<Key, Sum>,
    /// The (entity, resource) pairs that consumed.
    pub touched: BTreeSet<(String, String)>,
}

/// The usage of change `c` in namespace `ns`: `None` for a change that is not a bucket
/// write of `ns` (the aggregator's own snapshot and checkpoint writes among them).
pub(super) fn usage(ns: &str, c: &Change) -> Option<UsageDelta> {
    usage_of(&c.key, c.old.as_deref(), c.new.as_deref(), c.at_ms).filter(|d| d.ns == ns)
}

/// The attribute on a snapshot item naming the last claimed pass of consumer `consumer`
/// that added to it (see `commit`).
pub(super) fn pass_attr(consumer: &str) -> String {
    format!("pass_{consumer}")
}

impl Pending {
    /// Add one change's usage to every window's snapshot.
    pub fn add(&mut self, windows: &[Window], d: UsageDelta) {
        for w in windows {
            let start = w.start_ms(d.at_ms);
            let k = snapshot_key(&d.ns, &d.entity, &d.resource, *w, start);
            let e = self.snaps.entry(k).or_insert_with(|| Sum {
                entity: d.entity.clone(),
                resource: d.resource.clone(),
                window: *w,
                start_ms: start,
                milli: BTreeMap::new(),
                overdraw: BTreeMap::new(),
                requests: 0,
            });
            for (l, m) in &d.milli {
                *e.milli.entry(l.clone()).or_default() += m;
            }
            for (l, m) in &d.overdraw {
                *e.overdraw.entry(l.clone()).or_default() += m;
            }
            e.requests += d.requests;
        }
        if d.milli.values().any(|m| *m > 0) {
            self.touched.insert((d.entity, d.resource));
        }
    }

    /// The update adding item `k`'s sum. With `once = Some((attr, pass))` it applies at most
    /// once for that pass: conditioned on `attr` being absent or below `pass`, and setting
    /// it to `pass` (the `UsageCheckpoint` mutant drops the condition).
    pub fn op(
        &self,
        ns: &str,
        k: &Key,
        retention_s: i64,
        once: Option<(&str, i64)>,
    ) -> Option<TransactOp> {
        let x = self.snaps.get(k)?;
        let mut update = snapshot_update(
            ns,
            &x.entity,
            &x.resource,
            x.window,
            x.start_ms,
            &x.milli,
            &x.overdraw,
            x.requests,
            retention_s,
        );
        let mut condition = None;
        if let Some((attr, pass)) = once {
            update = update.set(attr.to_string(), pass);
            if !tollgate_core::mutants::off(tollgate_core::mutants::Mutant::UsageCheckpoint) {
                condition = Some(
                    Condition::not_exists(attr.to_string())
                        .or(Condition::lt(attr.to_string(), pass)),
                );
            }
        }
        Some(TransactOp::Update(UpdateRequest {
            key: k.clone(),
            update,
            condition,
            returns: ReturnValues::None,
        }))
    }
}

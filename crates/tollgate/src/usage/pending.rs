//! The usage a pass has summed but not yet committed: per snapshot item, every change's
//! consumption, overdraw and requests, and the store operations that add it.

use std::collections::{BTreeMap, BTreeSet};

use smallvec::SmallVec;
use tollgate_core::expr::{Condition, Name, ReturnValues};
use tollgate_core::usage::{
    snapshot_key, snapshot_update, usage_view_in, ReadLayouts, UsageView, Window,
};
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

/// Usage summed per snapshot item, and the (entity, resource) pairs that consumed: what a
/// pass commits ([`Summing::finish`]).
#[derive(Default)]
pub(super) struct Pending {
    /// Per snapshot item, in key order (the order its transactions are cut in).
    pub snaps: BTreeMap<Key, Sum>,
    /// The (entity, resource) pairs that consumed.
    pub touched: BTreeSet<(String, String)>,
}

/// The usage of change `c` in namespace `ns`, borrowed from it: `None` for a change that
/// is not a bucket write of `ns` (the aggregator's own snapshot and checkpoint writes
/// among them).
/// `layouts`: the rule's reading of each bucket shape seen so far.
pub(super) fn usage<'c>(
    ns: &str,
    c: &'c Change,
    layouts: &mut ReadLayouts,
) -> Option<UsageView<'c>> {
    usage_view_in(&c.key, c.old.as_deref(), c.new.as_deref(), c.at_ms, layouts)
        .filter(|d| d.ns == ns)
}

/// The attribute on a snapshot item naming the last claimed pass of consumer `consumer`
/// that added to it (see `commit`).
pub(super) fn pass_attr(consumer: &str) -> String {
    format!("pass_{consumer}")
}

/// The name an (entity, resource) pair is found by while a pass sums, written into `buf`:
/// the entity's length, `:`, the entity, the resource (so no two pairs share one).
pub(super) fn pair_name<'b>(buf: &'b mut String, entity: &str, resource: &str) -> &'b str {
    buf.clear();
    // The length's decimal digits, written here rather than through `fmt` (every change
    // of a pass names its pair twice).
    let mut digits = [0u8; 20];
    let len = tollgate_core::keys::decimal_digits(entity.len() as u64, &mut digits);
    buf.extend(len.iter().map(|d| char::from(*d)));
    buf.push(':');
    buf.push_str(entity);
    buf.push_str(resource);
    buf
}

/// One (entity, resource) pair of a pass: the snapshot items its changes are summed into.
struct Pair {
    entity: String,
    resource: String,
    /// (window, window start, index into `Summing::sums`): one per window in force.
    slots: SmallVec<[(Window, i64, usize); 2]>,
    consumed: bool,
}

/// Usage being summed over a pass's changes. Every change is found its sums by its pair's
/// name ([`pair_name`], one hash look-up) and its window starts: no snapshot key is
/// formatted and no name copied except the first time a pair or a snapshot item appears.
#[derive(Default)]
pub(super) struct Summing {
    sums: Vec<(Key, Sum)>,
    pairs: Vec<Pair>,
    by_name: crate::caches::Map<Box<str>, usize>,
    name: String,
    /// The usage rule's layouts of the bucket shapes summed so far.
    pub layouts: ReadLayouts,
}

/// Add `m` to `limit`'s entry (a name is copied only for a limit new to the sum).
fn add_to(sums: &mut BTreeMap<String, i64>, limit: &str, m: i64) {
    match sums.get_mut(limit) {
        Some(v) => *v += m,
        None => {
            sums.insert(limit.to_string(), m);
        }
    }
}

impl Summing {
    /// Add one change's usage to every window's snapshot.
    pub fn add(&mut self, windows: &[Window], d: &UsageView<'_>) {
        let name = pair_name(&mut self.name, d.entity, d.resource);
        let pair = match self.by_name.get(name) {
            Some(&i) => i,
            None => {
                self.by_name.insert(name.into(), self.pairs.len());
                self.pairs.push(Pair {
                    entity: d.entity.to_string(),
                    resource: d.resource.to_string(),
                    slots: SmallVec::new(),
                    consumed: false,
                });
                self.pairs.len() - 1
            }
        };
        for w in windows {
            let start = w.start_ms(d.at_ms);
            let p = &mut self.pairs[pair];
            let slot = match p.slots.iter().find(|s| s.0 == *w && s.1 == start) {
                Some(s) => s.2,
                None => {
                    let k = snapshot_key(d.ns, &p.entity, &p.resource, *w, start);
                    self.sums.push((
                        k,
                        Sum {
                            entity: p.entity.clone(),
                            resource: p.resource.clone(),
                            window: *w,
                            start_ms: start,
                            milli: BTreeMap::new(),
                            overdraw: BTreeMap::new(),
                            requests: 0,
                        },
                    ));
                    p.slots.push((*w, start, self.sums.len() - 1));
                    self.sums.len() - 1
                }
            };
            let e = &mut self.sums[slot].1;
            for (l, m) in &d.milli {
                add_to(&mut e.milli, l, *m);
            }
            for (l, m) in &d.overdraw {
                add_to(&mut e.overdraw, l, *m);
            }
            e.requests += d.requests;
        }
        if d.consumed() {
            self.pairs[pair].consumed = true;
        }
    }

    /// What was summed, by snapshot key, with the pairs that consumed.
    pub fn finish(self) -> Pending {
        let n = self.sums.len();
        let snaps: BTreeMap<Key, Sum> = self.sums.into_iter().collect();
        debug_assert_eq!(snaps.len(), n, "each snapshot item is summed in one slot");
        Pending {
            snaps,
            touched: self
                .pairs
                .into_iter()
                .filter(|p| p.consumed)
                .map(|p| (p.entity, p.resource))
                .collect(),
        }
    }
}

impl Pending {
    /// The update adding item `k`'s sum. With `once = Some((attr, pass))` it applies at most
    /// once for that pass: conditioned on `attr` being absent or below `pass`, and setting
    /// it to `pass` (the `UsageCheckpoint` mutant drops the condition).
    pub fn op(
        &self,
        ns: &str,
        k: &Key,
        retention_s: i64,
        once: Option<(&Name, i64)>,
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
            // The name is shared by every op of the pass: a clone copies no text.
            update = update.set(attr, pass);
            if !tollgate_core::mutants::off(tollgate_core::mutants::Mutant::UsageCheckpoint) {
                condition = Some(Condition::not_exists(attr).or(Condition::lt(attr, pass)));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The pair's name writes the entity's length itself: as `format!` spells it, at every
    /// digit count, and no two pairs share a name.
    #[test]
    fn pair_names_spell_the_length_and_tell_pairs_apart() {
        let mut buf = String::new();
        for len in [0usize, 1, 9, 10, 99, 100, 1234, 10_000] {
            let entity = "e".repeat(len);
            assert_eq!(
                pair_name(&mut buf, &entity, "api"),
                format!("{len}:{entity}api")
            );
        }
        let a = pair_name(&mut buf, "ab", "c").to_string();
        let b = pair_name(&mut buf, "a", "bc").to_string();
        assert_ne!(a, b);
        assert_eq!(pair_name(&mut buf, "ü", "r"), "2:ür");
    }
}

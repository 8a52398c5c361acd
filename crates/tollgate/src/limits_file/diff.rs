//! What `limits plan` shows and `limits apply` writes: the difference between the levels a
//! file declares and the levels the store holds now.

use std::collections::BTreeMap;

use tollgate_core::keys;
use tollgate_core::value::Key;
use tollgate_core::Limit;

use super::model::{scope_key, ScopeKey};
use crate::config::{self, OnUnavailable, Scope};
use crate::doctor::scan_all;
use crate::error::{Error, Result};
use crate::limiter::Limiter;
use crate::Repair;

/// One stored level: its limits (sorted by name), the system's `on_unavailable`, the
/// level's cascade flag (ADR-146; resource and entity levels only).
#[derive(Debug, Clone, PartialEq)]
pub struct Level {
    /// Where it is stored.
    pub scope: Scope,
    /// Its limits.
    pub limits: Vec<Limit>,
    /// System level only.
    pub on_unavailable: Option<OnUnavailable>,
    /// Resource and entity levels only.
    pub cascade: Option<bool>,
    /// The level's merge flags (ADR-143; resource and entity levels only).
    pub merge: tollgate_core::merge::Merge,
}

impl Level {
    /// Declares nothing: no limits, no policy, no cascade flag (the same as absent).
    pub fn is_empty(&self) -> bool {
        self.limits.is_empty()
            && self.on_unavailable.is_none()
            && self.cascade.is_none()
            && self.merge.is_empty()
    }

    fn sorted(mut self) -> Self {
        self.limits.sort_by(|a, b| a.name().cmp(b.name()));
        self
    }
}

/// Every level stored in a namespace, by scope.
pub type StoredLevels = BTreeMap<ScopeKey, Level>;

/// How a level changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    /// Not stored; the file declares it.
    Create,
    /// Stored and declared, differently.
    Update,
    /// Stored; the file does not declare it.
    Delete,
}

/// How one limit of a level changes.
#[derive(Debug, Clone, PartialEq)]
pub enum LimitChange {
    /// New in the file.
    Added(Limit),
    /// Stored, not in the file.
    Removed(Limit),
    /// Both, different.
    Changed {
        /// Stored.
        before: Limit,
        /// In the file.
        after: Limit,
    },
}

/// One level to write.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The level.
    pub scope: Scope,
    /// What happens to the level.
    pub kind: ChangeKind,
    /// The level as stored (`None` for a create).
    pub before: Option<Level>,
    /// The level as declared (`None` for a delete).
    pub after: Option<Level>,
    /// Its limits that change, by name.
    pub limits: Vec<LimitChange>,
}

impl Change {
    /// The level's scope.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }
}

/// Rule "plan against what is stored now": the changes that turn `stored` into `declared`,
/// in scope order (system, resources, entities). Empty levels on either side count as
/// absent; a level equal on both sides is not listed.
pub fn plan(declared: &BTreeMap<ScopeKey, Level>, stored: &StoredLevels) -> Vec<Change> {
    let mut keys: Vec<&ScopeKey> = declared.keys().chain(stored.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut out = Vec::new();
    for k in keys {
        let want = declared
            .get(k)
            .filter(|l| !l.is_empty())
            .cloned()
            .map(Level::sorted);
        let have = stored
            .get(k)
            .filter(|l| !l.is_empty())
            .cloned()
            .map(Level::sorted);
        let (kind, scope) = match (&want, &have) {
            (None, None) => continue,
            (Some(w), Some(h)) if w == h => continue,
            (Some(w), Some(_)) => (ChangeKind::Update, w.scope.clone()),
            (Some(w), None) => (ChangeKind::Create, w.scope.clone()),
            (None, Some(h)) => (ChangeKind::Delete, h.scope.clone()),
        };
        let empty: Vec<Limit> = Vec::new();
        let wl = want.as_ref().map(|l| &l.limits).unwrap_or(&empty);
        let hl = have.as_ref().map(|l| &l.limits).unwrap_or(&empty);
        let mut limits = Vec::new();
        for h in hl {
            match wl.iter().find(|w| w.name() == h.name()) {
                None => limits.push(LimitChange::Removed(h.clone())),
                Some(w) if w != h => limits.push(LimitChange::Changed {
                    before: h.clone(),
                    after: w.clone(),
                }),
                Some(_) => {}
            }
        }
        for w in wl {
            if !hl.iter().any(|h| h.name() == w.name()) {
                limits.push(LimitChange::Added(w.clone()));
            }
        }
        out.push(Change {
            scope,
            kind,
            before: have,
            after: want,
            limits,
        });
    }
    out
}

/// The scope of a config item's key in namespace `ns`, if it is one.
fn scope_of(ns: &str, key: &Key) -> Option<Scope> {
    if *key == keys::system_config(ns) {
        return Some(Scope::System);
    }
    if let Some(r) = key.pk.strip_prefix(&format!("{ns}/RESOURCE#")) {
        return (&*key.sk == "#CONFIG").then(|| Scope::Resource(r.to_string()));
    }
    let e = key.pk.strip_prefix(&format!("{ns}/ENTITY#"))?;
    let r = key.sk.strip_prefix("#CONFIG#")?;
    Some(Scope::Entity(
        e.to_string(),
        (r != keys::DEFAULT_RESOURCE).then(|| r.to_string()),
    ))
}

impl Limiter {
    /// Every level stored in this limiter's namespace, read now (strongly consistent
    /// scans of the system, resource and entity partitions; on DynamoDB a table scan).
    /// A config item tollgate cannot read is `Error::Corrupt` naming it (`tollgate doctor`
    /// lists it, `limits set` / `limits delete` repair it).
    pub async fn stored_levels(&self) -> Result<StoredLevels> {
        let ns = self.inner().ns();
        let store = self.inner().store().as_ref();
        let mut out = StoredLevels::new();
        for part in ["SYSTEM#", "RESOURCE#", "ENTITY#"] {
            for s in scan_all(store, &format!("{ns}/{part}")).await? {
                let item = match s {
                    Ok(i) => i,
                    Err(u) => {
                        if scope_of(ns, &u.key).is_some() {
                            return Err(Error::Corrupt(format!("{}: {}", u.key, u.reason)));
                        }
                        continue;
                    }
                };
                let Some(key) = Key::of(&item) else { continue };
                let Some(scope) = scope_of(ns, &key) else {
                    continue;
                };
                let (limits, on_unavailable) = config::decode(&item)?;
                let cascade = config::decode_cascade(&item)?;
                let merge = config::decode_merge(&item)?;
                let level = Level {
                    scope: scope.clone(),
                    limits,
                    on_unavailable,
                    cascade,
                    merge,
                };
                out.insert(scope_key(&scope), level.sorted());
            }
        }
        Ok(out)
    }

    /// Write one planned change through the limiter's own administrative calls
    /// (`set_limits`, `delete_limits`, `set_cascade`), so whatever records those records
    /// this. The level's limits and policy are one item put (atomic per level); a cascade
    /// flag that changes is a second write to the same item. Returns the corrupt items
    /// replaced on the way.
    pub async fn apply_change(&self, change: &Change) -> Result<Vec<Repair>> {
        let mut repairs = Vec::new();
        let before_cascade = change.before.as_ref().and_then(|l| l.cascade);
        match &change.after {
            Some(after) => {
                let same_limits = change.before.as_ref().is_some_and(|b| {
                    b.limits == after.limits
                        && b.on_unavailable == after.on_unavailable
                        && b.merge == after.merge
                });
                if !same_limits {
                    repairs.extend(
                        self.set_merged_limits(
                            &after.scope,
                            &after.limits,
                            &after.merge,
                            after.on_unavailable,
                        )
                        .await?,
                    );
                }
                if after.scope != Scope::System && after.cascade != before_cascade {
                    self.set_cascade(&after.scope, after.cascade).await?;
                }
            }
            None => {
                let Some(before) = &change.before else {
                    return Ok(repairs);
                };
                if before_cascade.is_some() {
                    self.set_cascade(&before.scope, None).await?;
                }
                repairs.extend(self.delete_limits_with_repairs(&before.scope).await?.1);
            }
        }
        Ok(repairs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lvl(scope: Scope, limits: Vec<Limit>) -> Level {
        Level {
            scope,
            limits,
            on_unavailable: None,
            cascade: None,
            merge: Default::default(),
        }
    }

    #[test]
    fn plan_lists_creates_updates_and_deletes_in_scope_order() {
        let rpm = Limit::per_minute("rpm", 60).unwrap();
        let rpm2 = Limit::per_minute("rpm", 120).unwrap();
        let tpm = Limit::per_minute("tpm", 1000).unwrap();
        let r = Scope::Resource("gpt-4".into());
        let e = Scope::Entity("u".into(), None);
        let s = Scope::Resource("old".into());
        let declared: BTreeMap<_, _> = [
            (
                scope_key(&r),
                lvl(r.clone(), vec![rpm2.clone(), tpm.clone()]),
            ),
            (scope_key(&e), lvl(e.clone(), vec![rpm.clone()])),
        ]
        .into_iter()
        .collect();
        let stored: StoredLevels = [
            (scope_key(&r), lvl(r.clone(), vec![rpm.clone()])),
            (scope_key(&s), lvl(s.clone(), vec![rpm.clone()])),
        ]
        .into_iter()
        .collect();
        let p = plan(&declared, &stored);
        let kinds: Vec<(Scope, ChangeKind)> =
            p.iter().map(|c| (c.scope().clone(), c.kind)).collect();
        assert_eq!(
            kinds,
            vec![
                (r.clone(), ChangeKind::Update),
                (s.clone(), ChangeKind::Delete),
                (e.clone(), ChangeKind::Create),
            ]
        );
        assert_eq!(
            p[0].limits,
            vec![
                LimitChange::Changed {
                    before: rpm.clone(),
                    after: rpm2
                },
                LimitChange::Added(tpm)
            ]
        );
        assert!(plan(&declared, &declared).is_empty());
    }

    #[test]
    fn keys_of_levels() {
        let ns = "default";
        assert_eq!(scope_of(ns, &keys::system_config(ns)), Some(Scope::System));
        assert_eq!(
            scope_of(ns, &keys::resource_config(ns, "m")),
            Some(Scope::Resource("m".into()))
        );
        assert_eq!(
            scope_of(ns, &keys::entity_config(ns, "u", keys::DEFAULT_RESOURCE)),
            Some(Scope::Entity("u".into(), None))
        );
        assert_eq!(
            scope_of(ns, &keys::entity_config(ns, "u", "m")),
            Some(Scope::Entity("u".into(), Some("m".into())))
        );
        assert_eq!(scope_of(ns, &keys::entity_meta(ns, "u")), None);
    }
}

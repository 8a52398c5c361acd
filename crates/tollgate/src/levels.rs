//! Limit and cascade administration at a scope: set (with merge flags), read, delete, set
//! the cascade policy, and resolve what applies to an (entity, resource).

use tollgate_core::ids::{validate_entity_id, validate_limit_name};
use tollgate_core::merge::Merge;
use tollgate_core::value::{Item, Value};
use tollgate_core::{Limit, RuleError};

use crate::audit::{Action, ConfigWrite};
use crate::config::{self, OnUnavailable, Scope};
use crate::doctor::{self, Repair};
use crate::error::{Error, Result};
use crate::limiter::Limiter;

/// The repairs a change of a config level made when it replaced a corrupt item: the item,
/// and what of its non-limit attributes ([`kept_policy`]) was lost with it — the corrupt
/// attribute itself, or both when the store could not decode the item at all.
fn policy_repairs(
    done: &str,
    ns: &str,
    key: &tollgate_core::value::Key,
    read: std::result::Result<Option<Item>, doctor::CorruptItem>,
    old: Option<Item>,
) -> Vec<Repair> {
    const CASCADE_LOST: &str = " (its cascade policy could not be read and was not kept)";
    let (corrupt, lost) = match read {
        Err(c) => (c, format!("{CASCADE_LOST}, nor its mode")),
        Ok(_) => {
            let Some(c) = old.and_then(|old| doctor::check_item(ns, key, &old)) else {
                return Vec::new();
            };
            let lost = match c.attribute.as_deref() {
                Some(config::CASCADE) => CASCADE_LOST,
                Some(config::ENFORCEMENT) => " (its mode could not be read and was not kept)",
                _ => "",
            };
            (c, lost.to_string())
        }
    };
    vec![Repair::logged(corrupt, format!("{done}{lost}"))]
}

/// The attributes of a config level that are not limits and outlive a change of its
/// limits: its cascade policy and its mode, each where it is set and decodes.
fn kept_policy(old: &Item) -> Item {
    let mut kept = Item::new();
    if let Some(c) = config::decode_cascade(old).ok().flatten() {
        kept.insert(config::CASCADE.into(), Value::Bool(c));
    }
    if let Some(m) = config::decode_enforcement(old).ok().flatten() {
        kept.insert(config::ENFORCEMENT.into(), Value::S(m.as_str().into()));
    }
    kept
}

impl Limiter {
    /// The implementation of [`crate::Admin::set_merged_limits`].
    pub(crate) async fn set_merged_limits(
        &self,
        scope: &Scope,
        limits: &[Limit],
        merge: &Merge,
        on_unavailable: Option<OnUnavailable>,
    ) -> Result<Vec<Repair>> {
        scope.validate()?;
        merge.validate(*scope == Scope::System)?;
        let mut names = std::collections::BTreeSet::new();
        for l in limits {
            validate_limit_name(l.name())?;
            if !names.insert(l.name()) {
                return Err(Error::Invalid(RuleError::InvalidLimit {
                    name: l.name().into(),
                    reason: "named twice".into(),
                }));
            }
        }
        if on_unavailable.is_some() && *scope != Scope::System {
            return Err(Error::Invalid(RuleError::InvalidLimit {
                name: "on_unavailable".into(),
                reason: "on_unavailable is stored at the system level only".into(),
            }));
        }
        let ns = self.inner().ns();
        let key = scope.key(ns);
        let read = doctor::read_for_repair(self.inner().store().as_ref(), ns, &key).await?;
        let first = match &read {
            Ok(old) => Ok(old.clone()),
            Err(c) => Err(c.to_string()),
        };
        let (old, _) = self
            .audited_config_change(scope, Action::LimitsSet, first, |old| {
                let mut item = config::encode(limits, on_unavailable);
                config::encode_merge(&mut item, merge);
                // The level's cascade policy (ADR-146) and mode (ADR-151) are not limits:
                // replacing limits keeps them.
                if let Some(o) = old {
                    item.extend(kept_policy(o));
                }
                Some(ConfigWrite::Put(item))
            })
            .await?;
        let repairs = policy_repairs("replaced by the new limits", ns, &key, read, old);
        self.forget_cached();
        Ok(repairs)
    }

    /// The config item stored at a scope, read consistently (`None`: the level has none).
    pub(crate) async fn config_item(&self, scope: &Scope) -> Result<Option<Item>> {
        scope.validate()?;
        Ok(self
            .inner()
            .store()
            .get(&scope.key(self.inner().ns()), true)
            .await?)
    }

    /// Limits stored at a scope (empty if none).
    pub async fn get_limits(&self, scope: &Scope) -> Result<(Vec<Limit>, Option<OnUnavailable>)> {
        match self.config_item(scope).await? {
            Some(i) => config::decode(&i),
            None => Ok((Vec::new(), None)),
        }
    }

    /// The merge flags stored at a scope (none if the level has no item).
    pub async fn get_merge(&self, scope: &Scope) -> Result<Merge> {
        match self.config_item(scope).await? {
            Some(i) => config::decode_merge(&i),
            None => Ok(Merge::default()),
        }
    }

    /// The implementation of [`crate::Admin::delete_limits`].
    pub(crate) async fn delete_limits(&self, scope: &Scope) -> Result<bool> {
        Ok(self.delete_limits_with_repairs(scope).await?.0)
    }

    /// The implementation of [`crate::Admin::delete_limits_with_repairs`].
    pub(crate) async fn delete_limits_with_repairs(
        &self,
        scope: &Scope,
    ) -> Result<(bool, Vec<Repair>)> {
        scope.validate()?;
        let ns = self.inner().ns();
        let key = scope.key(ns);
        let read = doctor::read_for_repair(self.inner().store().as_ref(), ns, &key).await?;
        let first = match &read {
            Ok(old) => Ok(old.clone()),
            Err(c) => Err(c.to_string()),
        };
        let undecodable = read.is_err();
        let (old, record) = self
            .audited_config_change(scope, Action::LimitsDelete, first, |old| {
                // The level's cascade policy and mode, if set, stay (the item keeps only
                // them).
                match old.map(kept_policy) {
                    None if !undecodable => None,
                    Some(kept) if !kept.is_empty() => Some(ConfigWrite::Put(kept)),
                    _ => Some(ConfigWrite::Delete),
                }
            })
            .await?;
        let repairs = policy_repairs("deleted", ns, &key, read, old);
        self.forget_cached();
        Ok((record.is_some(), repairs))
    }

    /// The implementation of [`crate::Admin::set_cascade`].
    pub(crate) async fn set_cascade(&self, scope: &Scope, cascade: Option<bool>) -> Result<()> {
        scope.validate()?;
        if *scope == Scope::System {
            return Err(Error::Invalid(RuleError::InvalidLimit {
                name: config::CASCADE.into(),
                reason: "cascade is set on resource and entity scopes only".into(),
            }));
        }
        let key = scope.key(self.inner().ns());
        let first = self.inner().store().get(&key, true).await?;
        self.audited_config_change(scope, Action::CascadeSet, Ok(first), |old| {
            let mut item = old.cloned().unwrap_or_default();
            item.remove("PK");
            item.remove("SK");
            match cascade {
                Some(c) => item.insert(config::CASCADE.into(), Value::Bool(c)),
                None => item.remove(config::CASCADE),
            };
            Some(ConfigWrite::Put(item))
        })
        .await?;
        self.inner().config().clear();
        self.inner().rejections().clear();
        self.inner().images().clear();
        Ok(())
    }

    /// Resolve the limits that apply to (entity, resource).
    pub async fn resolve_limits(&self, entity: &str, resource: &str) -> Result<Vec<Limit>> {
        validate_entity_id(entity)?;
        tollgate_core::ids::validate_resource(resource)?;
        let now = self.now_ms();
        Ok(self
            .inner()
            .config()
            .resolve(
                self.inner().store().as_ref(),
                self.inner().ns(),
                entity,
                resource,
                now,
            )
            .await?
            .limits
            .to_vec())
    }
}

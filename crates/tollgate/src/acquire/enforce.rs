//! Modes at every config level (ADR-151): enforce, disabled, bypass. The pair's level
//! (entity + resource) is stored and stamped on every shard in one transaction; the broader
//! levels (entity default, resource, system) are stored only, and reach each bucket on its
//! next slow pass (`tollgate_core::bypass::flip`), as a limit change does.
//!
//! Rule "a scope's mode is its most specific level's" (`tollgate_core::bypass::scope_mode`):
//! an (entity, resource) is in the mode of the first level, in the order entity + resource,
//! entity default, resource, system, that sets one; enforced when none does.

use super::*;
use crate::audit::{Action, ConfigWrite, Target, AUDIT_ID};
use crate::config::{self, Scope};
use tollgate_core::value::Value;

/// How a pair's change is written in its audit record.
#[derive(Clone, Copy)]
enum Spelling {
    /// `{"disabled": bool, "shards": n}` (`set_disabled`).
    Disabled,
    /// `{"enforcement": mode, "shards": n}`.
    Mode,
}

impl Spelling {
    fn image(self, mode: Enforcement, shards: i64) -> serde_json::Value {
        match self {
            Spelling::Disabled => {
                serde_json::json!({ "disabled": mode == Enforcement::Disabled, "shards": shards })
            }
            Spelling::Mode => serde_json::json!({ "enforcement": mode.as_str(), "shards": shards }),
        }
    }
}

impl Limiter {
    /// The implementation of [`crate::Admin::set_disabled`].
    pub(crate) async fn set_disabled(
        &self,
        entity: &str,
        resource: &str,
        disabled: bool,
    ) -> Result<usize> {
        let (mode, action) = if disabled {
            (Some(Enforcement::Disabled), Action::Disable)
        } else {
            (None, Action::Enable)
        };
        self.set_pair_mode(entity, resource, mode, action, Spelling::Disabled)
            .await
    }

    /// The implementation of [`crate::Admin::set_enforcement`].
    pub(crate) async fn set_enforcement(
        &self,
        entity: &str,
        resource: &str,
        mode: Enforcement,
    ) -> Result<usize> {
        self.set_pair_mode(
            entity,
            resource,
            Some(mode),
            Action::Enforcement,
            Spelling::Mode,
        )
        .await
    }

    /// The implementation of [`crate::Admin::set_scope_enforcement`].
    pub(crate) async fn set_scope_enforcement(
        &self,
        scope: &Scope,
        mode: Option<Enforcement>,
    ) -> Result<usize> {
        scope.validate()?;
        if let Scope::Entity(e, Some(r)) = scope {
            return self
                .set_pair_mode(e, r, mode, Action::Enforcement, Spelling::Mode)
                .await;
        }
        let key = scope.key(self.inner().ns());
        let first = self.inner().store().get(&key, true).await?;
        self.audited_config_change(scope, Action::Enforcement, Ok(first), |old| {
            let stored = old.and_then(|o| config::decode_enforcement(o).ok().flatten());
            if stored == mode && (old.is_some() || mode.is_none()) {
                return None;
            }
            let mut item = old.cloned().unwrap_or_default();
            item.remove("PK");
            item.remove("SK");
            match mode {
                Some(m) => item.insert(config::ENFORCEMENT.into(), Value::S(m.as_str().into())),
                None => item.remove(config::ENFORCEMENT),
            };
            Some(ConfigWrite::Put(item))
        })
        .await?;
        self.forget_cached();
        Ok(0)
    }

    /// The mode stored at a config level (`None`: the level sets none).
    pub async fn scope_enforcement(&self, scope: &Scope) -> Result<Option<Enforcement>> {
        match self.config_item(scope).await? {
            Some(i) => config::decode_enforcement(&i),
            None => Ok(None),
        }
    }

    /// The mode an (entity, resource) is in by the config, read consistently: the most
    /// specific level that sets one, enforce when none does.
    pub async fn effective_enforcement(&self, entity: &str, resource: &str) -> Result<Enforcement> {
        validate_entity_id(entity)?;
        validate_resource(resource)?;
        let ns = self.inner().ns();
        let levels = [
            keys::entity_config(ns, entity, resource),
            keys::entity_config(ns, entity, keys::DEFAULT_RESOURCE),
            keys::resource_config(ns, resource),
            keys::system_config(ns),
        ];
        self.modes_of(&levels).await
    }

    /// The mode the config levels `keys` (most specific first) give, read consistently.
    async fn modes_of(&self, keys: &[Key]) -> Result<Enforcement> {
        let items = self.inner().store().batch_get_shared(keys, true).await?;
        let mut modes = Vec::with_capacity(items.len());
        for i in &items {
            modes.push(match i {
                Some(i) => config::decode_enforcement(i)?,
                None => None,
            });
        }
        Ok(tollgate_core::bypass::scope_mode(&modes).unwrap_or_default())
    }

    /// The pair's level: store `mode` (or clear it) and stamp every shard with the mode
    /// that is then in force, in one transaction with the audit record.
    async fn set_pair_mode(
        &self,
        entity: &str,
        resource: &str,
        mode: Option<Enforcement>,
        action: Action,
        spelling: Spelling,
    ) -> Result<usize> {
        validate_entity_id(entity)?;
        validate_resource(resource)?;
        let inner = &self.inner();
        let ns = inner.ns();
        let k0 = keys::bucket(ns, entity, resource, 0);
        let mut read = inner.store().get(&k0, true).await?;
        if read.is_none() && mode == Some(Enforcement::Bypass) {
            self.create_bypassed(entity, resource).await?;
            read = inner.store().get(&k0, true).await?;
        }
        let (s, was) = match read {
            Some(i) => {
                let img = BucketImage::decode(&i)?;
                (img.shard_count, Enforcement::of(&img))
            }
            None => (0, Enforcement::Enforce),
        };
        let cfg_key = keys::entity_config(ns, entity, resource);
        let in_force = match mode {
            Some(m) => m,
            None => {
                self.modes_of(&[
                    keys::entity_config(ns, entity, keys::DEFAULT_RESOURCE),
                    keys::resource_config(ns, resource),
                    keys::system_config(ns),
                ])
                .await?
            }
        };
        let cfg_exists = mode.is_some() || inner.store().get(&cfg_key, true).await?.is_some();
        let target = Target::Entity {
            entity: entity.into(),
            resource: Some(resource.into()),
        };
        let mut shards: Vec<u32> = (0..s.max(0) as u32).collect();
        for _ in 0..5 {
            let record = self.audit_record(
                action,
                &target,
                spelling.image(was, s),
                spelling.image(in_force, shards.len() as i64),
            );
            let mut ops: Vec<TransactOp> = shards
                .iter()
                .map(|shard| {
                    TransactOp::Update(UpdateRequest {
                        key: keys::bucket(ns, entity, resource, *shard),
                        update: in_force.stamp_update(),
                        condition: Some(Condition::exists("PK")),
                        returns: ReturnValues::None,
                    })
                })
                .collect();
            if cfg_exists {
                let stored = match mode {
                    Some(m) => Update::new().set(config::ENFORCEMENT, m.as_str()),
                    None => Update::new().remove(config::ENFORCEMENT),
                };
                ops.push(TransactOp::Update(UpdateRequest {
                    key: cfg_key.clone(),
                    update: stored.set(AUDIT_ID, record.id.as_str()),
                    condition: None,
                    returns: ReturnValues::None,
                }));
            }
            if ops.is_empty() {
                return Ok(0);
            }
            match self.audited(ops, record).await {
                Ok(_) => {
                    self.forget_cached();
                    return Ok(shards.len());
                }
                Err(StoreError::TransactionCanceled { reasons }) => {
                    let gone: Vec<usize> = reasons
                        .iter()
                        .enumerate()
                        .filter(|(_, r)| matches!(r, CancelReason::ConditionFailed { old: None }))
                        .map(|(i, _)| i)
                        .collect();
                    if gone.is_empty() || gone.iter().any(|i| *i >= shards.len()) {
                        return Err(StoreError::TransactionCanceled { reasons }.into());
                    }
                    // A shard deleted meanwhile is left out.
                    shards = shards
                        .into_iter()
                        .enumerate()
                        .filter(|(i, _)| !gone.contains(i))
                        .map(|(_, s)| s)
                        .collect();
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Contended {
            entity: entity.into(),
            resource: resource.into(),
        })
    }

    /// Create shard 0 of a pair about to be bypassed (funded, no window opened, no request
    /// counted), so that its first request is bypassed in every process.
    async fn create_bypassed(&self, entity: &str, resource: &str) -> Result<()> {
        let inner = &self.inner();
        let now = inner.clock().now_ms();
        let res = inner
            .config()
            .resolve(inner.store().as_ref(), inner.ns(), entity, resource, now)
            .await?;
        let req = Request {
            cascade: res.cascade,
            bypass: true,
            ..inner.request_hashed(
                entity,
                resource,
                Vec::new(),
                res.limits,
                Some(res.params_hash),
                res.source,
                now,
            )?
        };
        inner.slow(&req, 0, None).await?;
        Ok(())
    }
}

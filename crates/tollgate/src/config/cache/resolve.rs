//! Resolving (entity, resource) through the cache: one batch read of the levels not cached
//! (with the META and the namespace's registry record), stale-while-error, the merge of the
//! levels and the cascade policy.

use tollgate_core::keys;
use tollgate_core::merge::{self, Level, Merge};
use tollgate_core::value::{Key, Value};
use tollgate_store::{Store, StoreError};

use super::{ConfigCache, Entry, Resolved, Whole, WHOLE_CAP};
use crate::config::{decode, decode_cascade, decode_enforcement, decode_merge, Source};
use crate::error::{Error, Result};

impl ConfigCache {
    /// Resolve limits for (entity, resource), with the entity's parent and cascade policy:
    /// one eventually consistent batch read of the levels (and the entity's META) not cached.
    pub async fn resolve(
        &self,
        store: &dyn Store,
        ns: &str,
        entity: &str,
        resource: &str,
        now: i64,
    ) -> Result<Resolved> {
        self.resolve_with(store, ns, entity, resource, now, false)
            .await
    }

    /// Rule C3 (ADR-146): resolve (entity, resource) again from the store, every level and
    /// the META read consistently whatever the cache holds; the cache is refreshed with the
    /// answer, which is marked [`Resolved::confirmed`]. Used once when a bucket's cascade
    /// stamp disagrees with the cached policy. Never served stale: an outage is an error.
    pub async fn resolve_confirmed(
        &self,
        store: &dyn Store,
        ns: &str,
        entity: &str,
        resource: &str,
        now: i64,
    ) -> Result<Resolved> {
        self.resolve_with(store, ns, entity, resource, now, true)
            .await
    }

    async fn resolve_with(
        &self,
        store: &dyn Store,
        ns: &str,
        entity: &str,
        resource: &str,
        now: i64,
        confirm: bool,
    ) -> Result<Resolved> {
        if !confirm {
            let g = self.wholes();
            if let Some(w) = g.get(entity, resource, 0) {
                if w.expires_at > now && w.ns == ns {
                    return Ok(w.resolved.clone());
                }
            }
        }
        let levels = [
            (keys::entity_config(ns, entity, resource), Source::Entity),
            (
                keys::entity_config(ns, entity, keys::DEFAULT_RESOURCE),
                Source::EntityDefault,
            ),
            (keys::resource_config(ns, resource), Source::Resource),
            (keys::system_config(ns), Source::System),
        ];
        let meta = keys::entity_meta(ns, entity);
        // The namespace's registry record rides in the same batch read: a soft-deleted
        // namespace refuses acquires without a request of its own.
        let registry = keys::namespace_reverse(ns);
        let wanted: Vec<&Key> = levels
            .iter()
            .map(|(k, _)| k)
            .chain([&meta, &registry])
            .collect();
        // Fresh entries, and the expired ones still within the stale bound.
        let (mut found, stale): (Vec<Option<Entry>>, Vec<Option<Entry>>) = {
            let g = self.lock();
            wanted
                .iter()
                .map(|k| match g.get(*k) {
                    _ if confirm => (None, None),
                    Some(e) if e.expires_at > now => (Some(e.clone()), None),
                    Some(e) if now - e.expires_at <= self.stale_max_ms => (None, Some(e.clone())),
                    _ => (None, None),
                })
                .unzip()
        };
        let missing: Vec<Key> = wanted
            .iter()
            .zip(&found)
            .filter(|(_, f)| f.is_none())
            .map(|(k, _)| (*k).clone())
            .collect();
        let mut unreachable = None;
        let read = if missing.is_empty() {
            None
        } else {
            match store
                .batch_get(&missing, confirm)
                .await
                .map_err(Error::from)
            {
                Ok(items) => Some(items),
                Err(e) => {
                    let covered = found
                        .iter()
                        .zip(&stale)
                        .all(|(f, s)| f.is_some() || s.is_some());
                    if !(e.is_outage() && covered) {
                        return Err(e);
                    }
                    tracing::warn!(error = %e, entity, resource, "store unavailable: serving cached limits past their TTL (stale-while-error)");
                    if let Error::Unavailable(StoreError::Unavailable(m)) = &e {
                        unreachable = Some(m.clone());
                    }
                    for (f, s) in found.iter_mut().zip(stale) {
                        if f.is_none() {
                            *f = s;
                        }
                    }
                    None
                }
            }
        };
        if let Some(items) = read {
            let mut g = self.lock();
            for (k, item) in missing.iter().zip(items) {
                let empty = Entry {
                    expires_at: now + self.ttl_ms,
                    limits: Vec::new(),
                    on_unavailable: None,
                    cascade: None,
                    parent_id: None,
                    merge: Merge::default(),
                    enforcement: None,
                    ns_closed: None,
                };
                let e = match item {
                    Some(i) if *k == registry => Entry {
                        ns_closed: i
                            .get("status")
                            .and_then(Value::as_s)
                            .filter(|s| *s != "active")
                            .map(str::to_string),
                        ..empty
                    },
                    Some(i) if *k == meta => Entry {
                        cascade: decode_cascade(&i)?,
                        parent_id: i.get("parent_id").and_then(Value::as_s).map(str::to_string),
                        ..empty
                    },
                    Some(i) => {
                        let (limits, on) = decode(&i)?;
                        Entry {
                            limits,
                            on_unavailable: on,
                            cascade: decode_cascade(&i)?,
                            merge: decode_merge(&i)?,
                            enforcement: decode_enforcement(&i)?,
                            ..empty
                        }
                    }
                    None if *k == registry && self.registered => Entry {
                        ns_closed: Some("purged".into()),
                        ..empty
                    },
                    None => empty,
                };
                if *k == levels[3].0 {
                    *self.last_policy.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some((e.on_unavailable, now));
                }
                if self.ttl_ms > 0 || self.stale_max_ms > 0 {
                    g.insert(k.clone(), e.clone());
                }
                if let Some(pos) = wanted.iter().position(|w| *w == k) {
                    found[pos] = Some(e);
                }
            }
        }
        debug_assert!(found.iter().all(Option::is_some), "every level resolved");
        if let Some(status) = found[5].as_ref().and_then(|e| e.ns_closed.clone()) {
            return Err(Error::NamespaceDeleted {
                namespace: ns.into(),
                status,
            });
        }
        let on_unavailable = found[3].as_ref().and_then(|e| e.on_unavailable);
        let meta = found[4].take();
        let parent_id = meta.as_ref().and_then(|e| e.parent_id.clone());
        let walk = [0, 1, 2].map(|i| found[i].as_ref().and_then(|e| e.cascade));
        let cascade = tollgate_core::cascade::effective_policy(
            walk,
            meta.as_ref().and_then(|e| e.cascade),
            parent_id.as_deref(),
        );
        // The earliest expiry of the levels used: the whole resolution is valid until then.
        // Served stale, it is not kept.
        let expires_at = found
            .iter()
            .flatten()
            .map(|e| e.expires_at)
            .chain(meta.as_ref().map(|e| e.expires_at))
            .min()
            .unwrap_or(now);
        let fresh = unreachable.is_none() && expires_at > now && self.ttl_ms > 0;
        // ADR-143: the levels merged (by default the first that defines limits wins whole).
        let merged = merge::merge_levels(&[0, 1, 2, 3].map(|i| {
            found[i].as_ref().map(|e| Level {
                limits: &e.limits,
                merge: &e.merge,
            })
        }))
        .map_err(|e| Error::LimitsConflict {
            entity: entity.into(),
            resource: resource.into(),
            reason: e.to_string(),
        })?;
        let source = merged
            .source
            .and_then(|i| levels.get(i))
            .map_or(Source::System, |(_, s)| *s);
        let limits = merged.limits;
        let mode = tollgate_core::bypass::scope_mode(
            &[0, 1, 2, 3].map(|i| found[i].as_ref().and_then(|e| e.enforcement)),
        );
        let hash =
            tollgate_core::bypass::policy_hash(&tollgate_core::writes::params_hash(&limits), mode);
        let (params_hash, limits, resource_name) = {
            let mut shared = self.shared();
            let (h, l) = shared.policy(hash, limits);
            (h, l, shared.resource(resource))
        };
        let resolved = Resolved {
            entity: entity.into(),
            resource: resource_name,
            params_hash,
            mode,
            limits,
            source,
            on_unavailable,
            parent_id,
            cascade,
            unreachable,
            // A cache that keeps nothing serves no stale policy: every resolution is fresh.
            confirmed: confirm || self.ttl_ms == 0,
        };
        if fresh {
            let mut g = self.wholes();
            if g.len() >= WHOLE_CAP {
                g.clear();
            }
            g.insert(
                entity,
                resource,
                0,
                Whole {
                    ns: ns.into(),
                    expires_at,
                    resolved: resolved.clone(),
                },
            );
        }
        Ok(resolved)
    }
}

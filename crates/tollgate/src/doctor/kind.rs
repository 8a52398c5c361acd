//! [`ItemKind`]: what a stored item is, by its key.

use serde::Serialize;
use tollgate_core::keys::{self, DEFAULT_RESOURCE, META};
use tollgate_core::value::Key;

/// What a stored item is, by its key (the layout of `tollgate_core::keys`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ItemKind {
    /// The system-wide limits.
    SystemLimits,
    /// A resource's limits.
    ResourceLimits {
        /// The resource.
        resource: String,
    },
    /// An entity's META item (name, parent, cascade policy, metadata).
    Entity {
        /// The entity.
        entity: String,
    },
    /// An entity's limits: for one resource, or its default for all (`resource: None`).
    EntityLimits {
        /// The entity.
        entity: String,
        /// The resource (`None`: the entity's default).
        resource: Option<String>,
    },
    /// One shard's bucket item of an (entity, resource).
    Bucket {
        /// The entity.
        entity: String,
        /// The resource.
        resource: String,
        /// The shard.
        shard: u32,
    },
    /// A record of the audit log (see `crate::audit`).
    AuditRecord {
        /// Its partition after `{ns}/AUDIT#`: `SYSTEM`, `RESOURCE#{r}` or `ENTITY#{e}`.
        target: String,
        /// Its id (a ULID).
        id: String,
    },
    /// A key of no layout tollgate knows (not checked).
    Other,
}

impl ItemKind {
    /// The kind of the item at `key` in namespace `ns`.
    pub fn of(ns: &str, key: &Key) -> ItemKind {
        Self::parse(ns, key).unwrap_or(ItemKind::Other)
    }

    fn parse(ns: &str, key: &Key) -> Option<ItemKind> {
        let rest = key.pk.strip_prefix(ns)?.strip_prefix('/')?;
        let sk: &str = &key.sk;
        // Each candidate is rebuilt with the key functions and compared, so a key only
        // resembling the layout is `Other`.
        let kind = if rest == "SYSTEM#" {
            ItemKind::SystemLimits
        } else if let Some(resource) = rest.strip_prefix("RESOURCE#") {
            ItemKind::ResourceLimits {
                resource: resource.into(),
            }
        } else if let Some(entity) = rest.strip_prefix("ENTITY#") {
            match sk.strip_prefix("#CONFIG#") {
                _ if sk == META => ItemKind::Entity {
                    entity: entity.into(),
                },
                Some(r) => ItemKind::EntityLimits {
                    entity: entity.into(),
                    resource: (r != DEFAULT_RESOURCE).then(|| r.into()),
                },
                None => return None,
            }
        } else if let (Some(target), Some(id)) = (
            rest.strip_prefix("AUDIT#"),
            sk.strip_prefix(keys::AUDIT_SK_PREFIX),
        ) {
            ItemKind::AuditRecord {
                target: target.into(),
                id: id.into(),
            }
        } else if let Some(b) = rest.strip_prefix("BUCKET#") {
            let (er, shard) = b.rsplit_once('#')?;
            let (entity, resource) = er.split_once('#')?;
            ItemKind::Bucket {
                entity: entity.into(),
                resource: resource.into(),
                shard: shard.parse().ok()?,
            }
        } else {
            return None;
        };
        (kind.key(ns).as_ref() == Some(key)).then_some(kind)
    }

    /// The key of an item of this kind (`None` for [`ItemKind::Other`]).
    pub fn key(&self, ns: &str) -> Option<Key> {
        Some(match self {
            ItemKind::SystemLimits => keys::system_config(ns),
            ItemKind::ResourceLimits { resource } => keys::resource_config(ns, resource),
            ItemKind::Entity { entity } => keys::entity_meta(ns, entity),
            ItemKind::EntityLimits { entity, resource } => {
                keys::entity_config(ns, entity, resource.as_deref().unwrap_or(DEFAULT_RESOURCE))
            }
            ItemKind::Bucket {
                entity,
                resource,
                shard,
            } => keys::bucket(ns, entity, resource, *shard),
            ItemKind::AuditRecord { target, id } => {
                keys::audit_record(format!("{ns}/AUDIT#{target}"), id)
            }
            ItemKind::Other => return None,
        })
    }
}

impl std::fmt::Display for ItemKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ItemKind::SystemLimits => write!(f, "the system limits"),
            ItemKind::ResourceLimits { resource } => write!(f, "the limits of resource {resource}"),
            ItemKind::Entity { entity } => write!(f, "entity {entity}"),
            ItemKind::EntityLimits {
                entity,
                resource: Some(r),
            } => write!(f, "the limits of entity {entity} for resource {r}"),
            ItemKind::EntityLimits {
                entity,
                resource: None,
            } => write!(f, "the default limits of entity {entity}"),
            ItemKind::Bucket {
                entity,
                resource,
                shard,
            } => write!(f, "the bucket of {entity} / {resource}, shard {shard}"),
            ItemKind::AuditRecord { target, id } => write!(f, "audit record {id} of {target}"),
            ItemKind::Other => write!(f, "an item of unknown layout"),
        }
    }
}

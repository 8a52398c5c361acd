//! Stored limits at four levels and their resolution (entity+resource → entity default →
//! resource → system; the first level that defines limits wins whole), with a TTL cache.
//!
//! Rule "stale-while-error": a cached entry past its TTL is refreshed from the store; when
//! that read fails with an outage ([`Error::is_outage`]) and every level needed has an
//! entry at most `stale_max` (default 24 h) past its TTL, those entries are served stale,
//! so an entity keeps its limits and the system's `on_unavailable` keeps deciding through
//! a long outage. The system level's last-read policy is also kept on its own
//! ([`ConfigCache::last_policy`]) for requests the cache cannot resolve at all (an entity
//! first seen during the outage). A misconfiguration or corrupt item is never served
//! around: only an outage is.
//!
//! Split by what each part holds: the levels and policies (here), the config item's
//! encoding (`codec`), and the cache with its resolution (`cache`, `cache::resolve`).
//!
//! [`Error::is_outage`]: crate::Error::is_outage

mod cache;
mod codec;

use tollgate_core::keys;
use tollgate_core::value::Key;

use crate::error::Result;

pub use cache::{ConfigCache, Resolved};
pub use codec::{
    decode, decode_cascade, decode_enforcement, decode_merge, encode, encode_merge, CASCADE,
    ENFORCEMENT, EXCLUDE, INHERIT, PATCH,
};

/// Where limits are stored.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// System defaults for every entity and resource.
    System,
    /// Defaults of one resource.
    Resource(String),
    /// One entity: for one resource, or for all its resources (`None`).
    Entity(String, Option<String>),
}

impl Scope {
    /// The config item's key.
    pub fn key(&self, ns: &str) -> Key {
        match self {
            Scope::System => keys::system_config(ns),
            Scope::Resource(r) => keys::resource_config(ns, r),
            Scope::Entity(e, r) => {
                keys::entity_config(ns, e, r.as_deref().unwrap_or(keys::DEFAULT_RESOURCE))
            }
        }
    }

    /// Validate the ids in the scope.
    pub fn validate(&self) -> Result<()> {
        match self {
            Scope::System => Ok(()),
            Scope::Resource(r) => Ok(tollgate_core::ids::validate_resource(r)?),
            Scope::Entity(e, r) => {
                tollgate_core::ids::validate_entity_id(e)?;
                if let Some(r) = r {
                    tollgate_core::ids::validate_resource(r)?;
                }
                Ok(())
            }
        }
    }
}

/// The level resolved limits came from. Entity-level limits make buckets that never expire;
/// the others make buckets with a TTL (ADR-119/136).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Passed with the call.
    Override,
    /// Entity + resource.
    Entity,
    /// Entity default.
    EntityDefault,
    /// Resource default.
    Resource,
    /// System default.
    System,
}

/// What the store should do when it cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnUnavailable {
    /// Fail closed: return [`Error::Unavailable`].
    ///
    /// [`Error::Unavailable`]: crate::Error::Unavailable
    #[default]
    Block,
    /// Fail open: admit with a degraded lease that writes nothing.
    Allow,
}

impl std::str::FromStr for OnUnavailable {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "block" => Ok(OnUnavailable::Block),
            "allow" => Ok(OnUnavailable::Allow),
            _ => Err(format!("on_unavailable is 'block' or 'allow', not {s:?}")),
        }
    }
}

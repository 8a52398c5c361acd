//! `check_availability`: what an entity may spend now, with no write.

use serde::Serialize;
use tollgate_core::bucket::BucketImage;
use tollgate_core::ids::{validate_entity_id, validate_resource};
use tollgate_core::value::Key;
use tollgate_core::LimitStatus;

use crate::acquire::Amounts;
use crate::error::{Error, Exceeded, Result};
use crate::limiter::Limiter;

/// The answer of [`Limiter::check_availability`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Availability {
    /// Entity.
    pub entity: String,
    /// Resource.
    pub resource: String,
    /// Every limit of the resource, entity-wide.
    pub limits: Vec<LimitStatus>,
    /// Whether the amounts asked about would be admitted now.
    pub allowed: bool,
    /// When they would be, if not now (`None`: never, or already allowed).
    pub retry_after_ms: Option<i64>,
    /// The one reset instant: of the limit that decides the retry, or the earliest reset
    /// among the quotas.
    pub resets_at_ms: Option<i64>,
    /// With cascade (ADR-146): the parent's availability for the same resource. `allowed`
    /// above is false when either entity's limits refuse; each side's statuses name their
    /// own entity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<Box<Availability>>,
}

impl Limiter {
    /// Per-limit availability for (entity, resource), optionally for given amounts, without
    /// writing: one batch read of the entity's shards (plus the config, when not cached).
    pub async fn check_availability(
        &self,
        entity: &str,
        resource: &str,
        amounts: impl Into<Amounts>,
    ) -> Result<Availability> {
        validate_entity_id(entity)?;
        validate_resource(resource)?;
        let asked = amounts.into().into_millitokens()?;
        let (mut own, parent) = self
            .availability_of(entity, resource, asked.clone(), false)
            .await?;
        if let Some(p) = parent {
            let (theirs, _) = self.availability_of(&p, resource, asked, true).await?;
            if !theirs.allowed {
                own.retry_after_ms = match (own.allowed, own.retry_after_ms, theirs.retry_after_ms)
                {
                    (false, None, _) | (_, _, None) => None,
                    (true, _, Some(t)) => Some(t),
                    (false, Some(a), Some(t)) => Some(a.max(t)),
                };
                if own.allowed || theirs.retry_after_ms >= own.retry_after_ms {
                    own.resets_at_ms = theirs.resets_at_ms;
                }
                own.allowed = false;
            }
            own.parent = Some(Box::new(theirs));
        }
        Ok(own)
    }

    /// One entity's availability, and its parent when its policy cascades. `parent_side`:
    /// the amounts are the child's, restricted to the limits this (parent) entity has.
    async fn availability_of(
        &self,
        entity: &str,
        resource: &str,
        asked: Vec<(String, i64)>,
        parent_side: bool,
    ) -> Result<(Availability, Option<String>)> {
        let inner = &self.inner();
        let now = inner.clock().now_ms();
        let res = inner
            .config()
            .resolve(inner.store().as_ref(), inner.ns(), entity, resource, now)
            .await?;
        let asked: Vec<(String, i64)> = if parent_side {
            asked
                .into_iter()
                .filter(|(n, _)| res.limits.iter().any(|l| l.name() == n))
                .collect()
        } else {
            asked
        };
        let parent = res
            .parent_id
            .clone()
            .filter(|_| res.cascade && !parent_side);
        // Every limit, with the asked amounts (0 where none was asked).
        let all: Vec<(String, i64)> = res
            .limits
            .iter()
            .map(|l| {
                let a = asked
                    .iter()
                    .find(|(n, _)| n == l.name())
                    .map(|(_, a)| *a)
                    .unwrap_or(0);
                (l.name().to_string(), a)
            })
            .collect();
        let req = inner.request(entity, resource, asked.clone(), res.limits, res.source, now)?;
        let s = inner.shards().count(entity, resource).unwrap_or(1);
        let mut images = read_shards(inner, &req, s).await?;
        let stored_s = images
            .first()
            .and_then(|i| i.as_ref())
            .map(|i| i.shard_count)
            .unwrap_or(1);
        if stored_s > s {
            inner.shards().raise(entity, resource, stored_s);
            images = read_shards(inner, &req, stored_s).await?;
        }
        let s = s.max(stored_s);
        let full = crate::request::Request {
            amounts: all.into(),
            ..req
        };
        let refs: Vec<Option<&BucketImage>> = images.iter().map(|i| i.as_ref()).collect();
        let limits = inner.statuses(&full, &refs, s, now, Some(&asked));
        let allowed = !limits.iter().any(|v| v.exceeded);
        let (retry_after_ms, resets_at_ms) = if allowed {
            let earliest = limits
                .iter()
                .filter(|v| v.kind == "quota")
                .filter_map(|v| v.resets_at_ms)
                .min();
            (None, earliest)
        } else {
            let ex = Exceeded::new(entity, resource, limits.clone());
            (ex.retry_after_ms, ex.resets_at_ms)
        };
        Ok((
            Availability {
                entity: entity.into(),
                resource: resource.into(),
                limits,
                allowed,
                retry_after_ms,
                resets_at_ms,
                parent: None,
            },
            parent,
        ))
    }
}

async fn read_shards(
    inner: &crate::limiter::Inner,
    req: &crate::request::Request,
    s: i64,
) -> Result<Vec<Option<BucketImage>>> {
    let keys: Vec<Key> = (0..s as u32).map(|i| inner.bucket_key(req, i)).collect();
    let items = inner.store().batch_get_shared(&keys, false).await?;
    items
        .iter()
        .map(|i| {
            i.as_deref()
                .map(BucketImage::decode)
                .transpose()
                .map_err(Error::from)
        })
        .collect()
}

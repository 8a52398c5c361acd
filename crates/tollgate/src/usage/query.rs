//! [`Limiter::usage`]: the paginated query of usage snapshots ([`UsageQuery`],
//! [`UsagePage`]).

use tollgate_core::ids::{validate_entity_id, validate_resource};
use tollgate_core::usage::{snapshot_pk, Snapshot, Window};
use tollgate_store::Query;

use crate::error::{Error, Result};
use crate::limiter::Limiter;

/// A usage query: an entity's snapshots (optionally of one resource), or a resource's over
/// every entity; one window or all; a time range of window starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageQuery {
    /// The entity.
    pub entity: Option<String>,
    /// The resource.
    pub resource: Option<String>,
    /// One window (all when `None`).
    pub window: Option<Window>,
    /// Window starts at or after this (ms).
    pub from_ms: Option<i64>,
    /// Window starts before this (ms).
    pub to_ms: Option<i64>,
    /// Most snapshots in a page (default 100, at most 1000).
    pub limit: Option<usize>,
    /// Continue after this page token.
    pub after: Option<String>,
}

/// One page of snapshots.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsagePage {
    /// The snapshots, oldest window first.
    pub snapshots: Vec<Snapshot>,
    /// The token of the next page, when there is one.
    pub next: Option<String>,
}

fn page_token(s: &Snapshot) -> String {
    format!(
        "{}|{}|{}|{}",
        s.start_ms,
        s.window.name(),
        s.entity,
        s.resource
    )
}

impl Limiter {
    /// Usage snapshots matching `q`, oldest window first, paginated.
    pub async fn usage(&self, q: &UsageQuery) -> Result<UsagePage> {
        let invalid = Error::InvalidUsage;
        if let Some(e) = &q.entity {
            validate_entity_id(e)?;
        }
        if let Some(r) = &q.resource {
            validate_resource(r)?;
        }
        let limit = q.limit.unwrap_or(100);
        if !(1..=1000).contains(&limit) {
            return Err(invalid(format!("limit must be 1 to 1000, not {limit}")));
        }
        let ns = self.inner().ns();
        let items = match (&q.entity, &q.resource) {
            (Some(e), r) => {
                let prefix = r.as_ref().map(|r| format!("{r}#"));
                self.inner()
                    .store()
                    .query(Query {
                        consistent: true,
                        ..Query::table(snapshot_pk(ns, e), prefix.as_deref())
                    })
                    .await?
            }
            (None, Some(r)) => {
                self.inner()
                    .store()
                    .query(Query::index(
                        "GSI2",
                        tollgate_core::keys::gsi2_resource(ns, r),
                        Some("USAGE#"),
                    ))
                    .await?
            }
            (None, None) => {
                return Err(invalid(
                    "a usage query names an entity or a resource".into(),
                ))
            }
        };
        let mut snaps: Vec<Snapshot> = items
            .iter()
            .filter_map(Snapshot::decode)
            .filter(|s| q.window.is_none_or(|w| s.window == w))
            .filter(|s| q.from_ms.is_none_or(|f| s.start_ms >= f))
            .filter(|s| q.to_ms.is_none_or(|t| s.start_ms < t))
            .collect();
        snaps.sort_by(|a, b| {
            (a.start_ms, a.window, &a.entity, &a.resource).cmp(&(
                b.start_ms,
                b.window,
                &b.entity,
                &b.resource,
            ))
        });
        if let Some(after) = &q.after {
            let pos = snaps.iter().position(|s| page_token(s) == *after);
            match pos {
                Some(i) => {
                    snaps.drain(..=i);
                }
                None => return Err(invalid(format!("unknown page token {after:?}"))),
            }
        }
        let next = (snaps.len() > limit).then(|| page_token(&snaps[limit - 1]));
        snaps.truncate(limit);
        Ok(UsagePage {
            snapshots: snaps,
            next,
        })
    }
}

//! An audited change of a config item ([`Limiter::audited_config_change`]): the write and
//! its record, conditioned on the item's `audit_id` and retried over the item that won;
//! and the JSON image a record keeps of a config item.

use serde_json::{json, Value as Json};
use tollgate_core::value::{Item, Value};
use tollgate_core::LimitSpec;
use tollgate_store::{DeleteRequest, PutRequest, StoreError, TransactOp};

use crate::config;
use crate::error::{Error, Result};
use crate::limiter::Limiter;

use super::{moved, target_of, unchanged, Action, AuditRecord, AUDIT_ID};

/// How often a change whose "before" moved under it is retried.
const ATTEMPTS: u32 = 5;

/// The JSON image of a config item: its limits, `on_unavailable` and cascade policy
/// (`null` when absent; `{"corrupt": …}` when it cannot be decoded).
pub(crate) fn config_image(item: Option<&Item>) -> Json {
    let Some(item) = item else {
        return Json::Null;
    };
    let merge = match config::decode_merge(item) {
        Ok(m) => m,
        Err(e) => return json!({ "corrupt": e.to_string() }),
    };
    let mode = match config::decode_enforcement(item) {
        Ok(m) => m,
        Err(e) => return json!({ "corrupt": e.to_string() }),
    };
    match (config::decode(item), config::decode_cascade(item)) {
        (Ok((limits, on)), Ok(cascade)) => {
            let mut image = json!({
                "limits": limits.iter().map(LimitSpec::from).collect::<Vec<_>>(),
                "on_unavailable": on,
                "cascade": cascade,
            });
            // The mode (ADR-151), only where a level sets one.
            if let (Some(o), Some(m)) = (image.as_object_mut(), mode) {
                o.insert("enforcement".into(), json!(m.as_str()));
            }
            // The merge flags (ADR-143), only where a level sets them.
            if let (Some(o), Ok(Json::Object(m))) = (
                image.as_object_mut(),
                serde_json::to_value(tollgate_core::merge::MergeSpec::from(&merge)),
            ) {
                o.extend(m);
            }
            image
        }
        (Err(e), _) | (_, Err(e)) => json!({ "corrupt": e.to_string() }),
    }
}

impl Limiter {
    /// A change of the config item at `scope`: `change` maps the item as it is (`None`:
    /// absent) to the write that replaces it (`None`: nothing to do), stamped with the
    /// record's id and conditioned on the item being unchanged; retried over the item as it
    /// became when another change landed first. `first` is the item as read, or the
    /// store's message when it cannot decode it (then the write is unconditional and
    /// `change` sees `None`). Returns the item the change replaced and the record (`None`
    /// when nothing was written).
    pub(crate) async fn audited_config_change(
        &self,
        scope: &config::Scope,
        action: Action,
        first: std::result::Result<Option<Item>, String>,
        change: impl Fn(Option<&Item>) -> Option<ConfigWrite>,
    ) -> Result<(Option<Item>, Option<AuditRecord>)> {
        let key = scope.key(self.inner().ns());
        let target = target_of(scope);
        let (mut old, undecodable) = match first {
            Ok(o) => (o, None),
            Err(m) => (None, Some(m)),
        };
        let mut purged = false;
        for _ in 0..ATTEMPTS {
            let Some(w) = change(old.as_ref()) else {
                return Ok((old, None));
            };
            let after = match &w {
                ConfigWrite::Put(i) => config_image(Some(i)),
                ConfigWrite::Delete => Json::Null,
            };
            let (before, condition) = match &undecodable {
                Some(m) => (json!({ "corrupt": m }), None),
                None => (config_image(old.as_ref()), Some(unchanged(old.as_ref()))),
            };
            let record = self.audit_record(action, &target, before, after);
            let op = match w {
                ConfigWrite::Put(mut item) => {
                    item.insert(AUDIT_ID.into(), Value::S(record.id.clone()));
                    TransactOp::Put(PutRequest {
                        key: key.clone(),
                        item,
                        condition,
                    })
                }
                ConfigWrite::Delete => TransactOp::Delete(DeleteRequest {
                    key: key.clone(),
                    condition,
                }),
            };
            match self.audited(vec![op], record.clone()).await {
                Ok(r) => return Ok((old, Some(r))),
                // The store cannot write over the item in a transaction without decoding
                // it: purge it, and write again over nothing (the record with the write).
                Err(StoreError::Corrupt(_)) if undecodable.is_some() && !purged => {
                    self.inner().store().purge(&key).await?;
                    purged = true;
                }
                Err(e) => match moved(&e, 0) {
                    Some(now) if undecodable.is_none() => old = now,
                    _ => return Err(e.into()),
                },
            }
        }
        Err(Error::Contended {
            entity: target.entity().unwrap_or("-").into(),
            resource: target.resource().unwrap_or("-").into(),
        })
    }
}

/// What a config change writes.
pub(crate) enum ConfigWrite {
    /// Replace the item with this one.
    Put(Item),
    /// Delete it.
    Delete,
}

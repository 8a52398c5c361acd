//! [`crate::Admin::purge_namespace`]: deleting a soft-deleted namespace's items, page by page,
//! then its reverse record.

use serde_json::json;
use tollgate_core::expr::Condition;
use tollgate_core::ids::validate_entity_id;
use tollgate_core::keys;
use tollgate_core::value::Value;
use tollgate_store::{PutRequest, TransactOp};

use crate::audit::{Action, Target};
use crate::error::Result;
use crate::limiter::Limiter;

use super::{canceled, state, Namespace, NamespaceStatus, STATUS};

/// Items deleted per page of a purge.
const PURGE_PAGE: usize = 25;

impl Limiter {
    /// The implementation of [`crate::Admin::purge_namespace`].
    pub(crate) async fn purge_namespace(&self, id: &str) -> Result<usize> {
        validate_entity_id(id)?;
        let Some(before) = self.reverse(id).await? else {
            return Ok(0);
        };
        if before.status == NamespaceStatus::Active {
            return Err(state(id, "it is active: delete it first"));
        }
        if before.status == NamespaceStatus::Deleted {
            let after = Namespace {
                status: NamespaceStatus::Purging,
                ..before.clone()
            };
            let ops = vec![TransactOp::Put(PutRequest {
                key: keys::namespace_reverse(id),
                item: after.item(),
                condition: Some(Condition::eq(STATUS, Value::S("deleted".into()))),
            })];
            let record = self.audit_record(
                Action::NamespacePurge,
                &Target::Namespace(before.name.clone()),
                before.image(),
                json!({ "status": "purging", "namespace_id": id }),
            );
            match self.audited(ops, record).await {
                Ok(_) => {}
                Err(e) if canceled(&e) => {
                    return Err(state(id, "it changed while being purged: try again"))
                }
                Err(e) => return Err(e.into()),
            }
        }
        let prefix = format!("{id}/");
        let mut deleted = 0usize;
        let mut after = None;
        loop {
            let page = self
                .inner()
                .store()
                .scan(&prefix, after.clone(), PURGE_PAGE)
                .await?;
            for entry in &page.items {
                let key = match entry {
                    Ok(item) => tollgate_core::value::Key::of(item),
                    Err(u) => Some(u.key.clone()),
                };
                if let Some(k) = key {
                    debug_assert!(k.pk.starts_with(&prefix), "a purge stays in its namespace");
                    self.inner().store().purge(&k).await?;
                    deleted += 1;
                }
            }
            match page.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        self.inner()
            .store()
            .purge(&keys::namespace_reverse(id))
            .await?;
        if id == self.inner().ns() {
            self.forget_cached();
        }
        tracing::info!(id, name = %before.name, deleted, "namespace purged");
        Ok(deleted)
    }
}

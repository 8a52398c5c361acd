//! A namespace's lifecycle in the registry: [`crate::Admin::register_namespace`],
//! [`crate::Admin::delete_namespace`] and [`crate::Admin::recover_namespace`], each one transaction
//! with its audit record.

use base64::Engine;
use rand::RngCore;
use tollgate_core::expr::Condition;
use tollgate_core::ids::validate_entity_id;
use tollgate_core::keys;
use tollgate_core::value::Value;
use tollgate_store::{DeleteRequest, PutRequest, TransactOp};

use crate::audit::{Action, Target};
use crate::error::{Error, Result};
use crate::limiter::Limiter;

use super::{
    canceled, state, validate_name, Namespace, NamespaceStatus, DEFAULT_NAMESPACE, ID, STATUS,
};

/// A fresh namespace id: 8 random bytes in URL-safe base64 (11 characters), redrawn while
/// it does not start with a letter or digit (a key prefix must).
fn fresh_id() -> String {
    let mut rng = rand::thread_rng();
    loop {
        let mut b = [0u8; 8];
        rng.fill_bytes(&mut b);
        let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        if id.starts_with(|c: char| c.is_ascii_alphanumeric()) {
            debug_assert_eq!(id.len(), 11);
            return id;
        }
    }
}

impl Limiter {
    /// The implementation of [`crate::Admin::register_namespace`].
    pub(crate) async fn register_namespace(&self, name: &str) -> Result<Namespace> {
        validate_name(name)?;
        for _ in 0..3 {
            if let Some(n) = self.get_namespace(name).await? {
                return Ok(n);
            }
            let id = if name == DEFAULT_NAMESPACE {
                DEFAULT_NAMESPACE.to_string()
            } else {
                fresh_id()
            };
            if name == DEFAULT_NAMESPACE {
                if let Some(old) = self.reverse(&id).await? {
                    // `default` was deleted: its id is fixed, so it comes back by recovery.
                    return Err(state(
                        name,
                        format!("it is {}: recover id {id}", old.status.as_str()),
                    ));
                }
            }
            let ns = Namespace {
                name: name.into(),
                id: id.clone(),
                status: NamespaceStatus::Active,
                created_at_ms: self.now_ms(),
                deleted_at_ms: None,
            };
            let ops = vec![
                TransactOp::Put(PutRequest {
                    key: keys::namespace_forward(name),
                    item: ns.item(),
                    condition: Some(Condition::not_exists("PK")),
                }),
                TransactOp::Put(PutRequest {
                    key: keys::namespace_reverse(&id),
                    item: ns.item(),
                    condition: Some(Condition::not_exists("PK")),
                }),
            ];
            let record = self.audit_record(
                Action::NamespaceRegister,
                &Target::Namespace(name.into()),
                serde_json::Value::Null,
                ns.image(),
            );
            match self.audited(ops, record).await {
                Ok(_) => {
                    tracing::info!(name, id = %id, "namespace registered");
                    return Ok(ns);
                }
                // Registered concurrently (or an id drawn twice): read what won.
                Err(e) if canceled(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Contended {
            entity: name.into(),
            resource: "-".into(),
        })
    }

    /// The implementation of [`crate::Admin::delete_namespace`].
    pub(crate) async fn delete_namespace(&self, name: &str) -> Result<Option<Namespace>> {
        let Some(before) = self.get_namespace(name).await? else {
            return Ok(None);
        };
        let after = Namespace {
            status: NamespaceStatus::Deleted,
            deleted_at_ms: Some(self.now_ms()),
            ..before.clone()
        };
        let ops = vec![
            TransactOp::Delete(DeleteRequest {
                key: keys::namespace_forward(name),
                condition: Some(Condition::eq(ID, Value::S(before.id.clone()))),
            }),
            TransactOp::Put(PutRequest {
                key: keys::namespace_reverse(&before.id),
                item: after.item(),
                condition: Some(Condition::eq(STATUS, Value::S("active".into()))),
            }),
        ];
        let record = self.audit_record(
            Action::NamespaceDelete,
            &Target::Namespace(name.into()),
            before.image(),
            after.image(),
        );
        match self.audited(ops, record).await {
            Ok(_) => {}
            Err(e) if canceled(&e) => {
                return Err(state(name, "it changed while being deleted: try again"))
            }
            Err(e) => return Err(e.into()),
        }
        if before.id == self.inner().ns() {
            self.forget_cached();
        }
        tracing::info!(name, id = %before.id, "namespace soft-deleted");
        Ok(Some(after))
    }

    /// The implementation of [`crate::Admin::recover_namespace`].
    pub(crate) async fn recover_namespace(&self, id: &str) -> Result<Namespace> {
        validate_entity_id(id)?;
        let Some(before) = self.reverse(id).await? else {
            return Err(Error::NamespaceNotFound(id.into()));
        };
        match before.status {
            NamespaceStatus::Deleted => {}
            s => return Err(state(id, format!("it is {}, not deleted", s.as_str()))),
        }
        if self.get_namespace(&before.name).await?.is_some() {
            return Err(state(
                id,
                format!("its name {:?} was registered again", before.name),
            ));
        }
        let after = Namespace {
            status: NamespaceStatus::Active,
            deleted_at_ms: None,
            ..before.clone()
        };
        let ops = vec![
            TransactOp::Put(PutRequest {
                key: keys::namespace_forward(&before.name),
                item: after.item(),
                condition: Some(Condition::not_exists("PK")),
            }),
            TransactOp::Put(PutRequest {
                key: keys::namespace_reverse(id),
                item: after.item(),
                condition: Some(Condition::eq(STATUS, Value::S("deleted".into()))),
            }),
        ];
        let record = self.audit_record(
            Action::NamespaceRecover,
            &Target::Namespace(before.name.clone()),
            before.image(),
            after.image(),
        );
        match self.audited(ops, record).await {
            Ok(_) => {}
            Err(e) if canceled(&e) => {
                return Err(state(
                    id,
                    format!(
                        "its name {:?} was registered again, or it changed meanwhile",
                        before.name
                    ),
                ))
            }
            Err(e) => return Err(e.into()),
        }
        if id == self.inner().ns() {
            self.forget_cached();
        }
        tracing::info!(id, name = %after.name, "namespace recovered");
        Ok(after)
    }
}

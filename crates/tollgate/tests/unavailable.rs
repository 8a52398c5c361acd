//! `on_unavailable`: fail closed (block) or open (allow) when the store cannot be reached.

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use common::*;
use tollgate::{AcquireOptions, Error, Limit, Limiter, OnUnavailable, Scope};
use tollgate_core::value::{Item, Key};
use tollgate_store::*;

/// A store that is down.
struct Down;

#[async_trait]
impl Store for Down {
    async fn get(&self, _: &Key, _: bool) -> Result<Option<Item>, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn batch_get(&self, _: &[Key], _: bool) -> Result<Vec<Option<Item>>, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn put(&self, _: PutRequest) -> Result<(), StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn update(&self, _: UpdateRequest) -> Result<Option<Item>, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn delete(&self, _: DeleteRequest) -> Result<Option<Item>, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn transact_write(
        &self,
        _: Vec<TransactOp>,
        _: Option<String>,
    ) -> Result<(), StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    async fn query(&self, _: Query) -> Result<Vec<Item>, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
    fn backend(&self) -> &'static str {
        "down"
    }
}

#[tokio::test]
async fn block_fails_closed_and_allow_fails_open() {
    let lim = Limiter::builder(Arc::new(Down)).build().unwrap();
    let e = lim.acquire("e", "api", &[("rpm", 1)]).await.unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)), "{e}");
    let o = AcquireOptions {
        limits: None,
        on_unavailable: Some(OnUnavailable::Allow),
    };
    let mut l = lim
        .acquire_with("e", "api", &[("rpm", 1)], o)
        .await
        .unwrap();
    assert!(l.is_degraded());
    l.adjust("rpm", 5).unwrap();
    l.commit().await.unwrap();
    assert_eq!(lim.stats().degraded, 1);
    let lim = Limiter::builder(Arc::new(Down))
        .on_unavailable(OnUnavailable::Allow)
        .build()
        .unwrap();
    assert!(lim
        .acquire("e", "api", &[("rpm", 1)])
        .await
        .unwrap()
        .is_degraded());
    // Bad input is still bad input when the store is down.
    assert!(matches!(
        lim.acquire("e", "api", &[("rpm", -1)]).await,
        Err(Error::Invalid(_))
    ));
}

/// The system config's on_unavailable is remembered by the config cache and applies when
/// the bucket write fails.
#[tokio::test]
async fn stored_policy_applies() {
    let h = harness(T0);
    h.lim
        .admin()
        .set_system_limits(
            &[Limit::per_minute("rpm", 5).unwrap()],
            Some(OnUnavailable::Allow),
        )
        .await
        .unwrap();
    let (_, on) = h.lim.get_limits(&Scope::System).await.unwrap();
    assert_eq!(on, Some(OnUnavailable::Allow));
    assert!(!h
        .lim
        .acquire("e", "api", &[("rpm", 1)])
        .await
        .unwrap()
        .is_degraded());
}

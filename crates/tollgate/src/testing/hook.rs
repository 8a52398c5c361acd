//! A store that runs a staged action once, right before the first matching write — to
//! stage "another writer got there between our read and our write".

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tollgate_core::value::{Item, Key};
use tollgate_store::{
    DeleteRequest, PutRequest, Query, Store, StoreError, TransactOp, UpdateRequest,
};

use super::TestStore;

type Action = Box<dyn FnOnce(&dyn TestStore) + Send>;

/// Which write an action waits for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum On {
    /// An update (of the given key), alone or inside a transaction.
    Update,
    /// A put (of the given key), alone or inside a transaction.
    Put,
    /// Any transaction.
    Transact,
}

/// The staging store.
pub struct Hook {
    inner: Arc<dyn TestStore>,
    staged: Mutex<Vec<(On, Option<Key>, Action)>>,
}

impl Hook {
    /// Wrap a store.
    pub fn new(inner: Arc<dyn TestStore>) -> Self {
        Hook {
            inner,
            staged: Mutex::new(Vec::new()),
        }
    }

    /// Run `f` right before the first `on` write (to `key`, if given).
    pub fn stage(&self, on: On, key: Option<Key>, f: impl FnOnce(&dyn TestStore) + Send + 'static) {
        self.lock().push((on, key, Box::new(f)));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(On, Option<Key>, Action)>> {
        self.staged.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fire(&self, on: On, key: Option<&Key>) {
        let f = {
            let mut g = self.lock();
            g.iter()
                .position(|(o, k, _)| *o == on && (k.is_none() || k.as_ref() == key))
                .map(|pos| g.remove(pos).2)
        };
        if let Some(f) = f {
            f(self.inner.as_ref());
        }
    }
}

#[async_trait]
impl Store for Hook {
    async fn get(&self, k: &Key, c: bool) -> Result<Option<Item>, StoreError> {
        self.inner.get(k, c).await
    }
    async fn batch_get(&self, k: &[Key], c: bool) -> Result<Vec<Option<Item>>, StoreError> {
        self.inner.batch_get(k, c).await
    }
    async fn put(&self, r: PutRequest) -> Result<(), StoreError> {
        self.fire(On::Put, Some(&r.key));
        self.inner.put(r).await
    }
    async fn update(&self, r: UpdateRequest) -> Result<Option<Item>, StoreError> {
        self.fire(On::Update, Some(&r.key));
        self.inner.update(r).await
    }
    async fn delete(&self, r: DeleteRequest) -> Result<Option<Item>, StoreError> {
        self.inner.delete(r).await
    }
    async fn transact_write(
        &self,
        o: Vec<TransactOp>,
        t: Option<String>,
    ) -> Result<(), StoreError> {
        self.fire(On::Transact, None);
        for op in &o {
            match op {
                TransactOp::Update(u) => self.fire(On::Update, Some(&u.key)),
                TransactOp::Put(p) => self.fire(On::Put, Some(&p.key)),
                _ => {}
            }
        }
        self.inner.transact_write(o, t).await
    }
    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
        self.inner.query(q).await
    }
    fn backend(&self) -> &'static str {
        "hook"
    }
}

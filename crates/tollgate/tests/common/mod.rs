//! Shared harness: a limiter over a counting MemoryStore with a manual clock and pinned draws.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use tollgate::{Limiter, ManualClock, Options, PinnedRng};
use tollgate_core::keys;
use tollgate_core::value::{Item, Key, Value};
use tollgate_store::{Counting, MemoryStore, StoreStats};

pub const T0: i64 = 1_757_000_000_000;
pub const W: i64 = 18_000_000;

pub struct H {
    pub store: Arc<Counting<MemoryStore>>,
    pub clock: Arc<ManualClock>,
    pub rng: Arc<PinnedRng>,
    pub lim: Limiter,
    /// A second client on the same store with the fast path off (its caches persist).
    pub slow_lim: Limiter,
}

pub fn opts() -> Options {
    Options {
        config_cache_ttl: Duration::from_secs(60),
        ..Options::default()
    }
}

pub fn harness(t0: i64) -> H {
    harness_with(t0, opts())
}

pub fn harness_with(t0: i64, o: Options) -> H {
    let store = Arc::new(Counting::new(MemoryStore::new()));
    let clock = Arc::new(ManualClock::new(t0));
    let rng = Arc::new(PinnedRng::new(0));
    let lim = Limiter::builder(store.clone())
        .clock(clock.clone())
        .rng(rng.clone())
        .options(o.clone())
        .build()
        .unwrap();
    let slow_lim = Limiter::builder(store.clone())
        .clock(clock.clone())
        .rng(rng.clone())
        .options(Options {
            speculative: false,
            ..o
        })
        .build()
        .unwrap();
    H {
        store,
        clock,
        rng,
        lim,
        slow_lim,
    }
}

impl H {
    pub fn key(&self, e: &str, r: &str, shard: u32) -> Key {
        keys::bucket("default", e, r, shard)
    }
    pub fn item(&self, e: &str, r: &str, shard: u32) -> Item {
        self.store
            .inner()
            .raw_get(&self.key(e, r, shard))
            .expect("bucket item exists")
    }
    pub fn n(&self, e: &str, r: &str, shard: u32, attr: &str) -> Option<i64> {
        self.item(e, r, shard).get(attr).and_then(Value::as_n)
    }
    pub fn set_n(&self, e: &str, r: &str, shard: u32, attr: &str, v: i64) {
        let k = self.key(e, r, shard);
        let mut i = self.store.inner().raw_get(&k).unwrap();
        i.insert(attr.into(), Value::N(v));
        self.store.inner().raw_put(&k, i);
    }
    pub fn remove(&self, e: &str, r: &str, shard: u32, attr: &str) {
        let k = self.key(e, r, shard);
        let mut i = self.store.inner().raw_get(&k).unwrap();
        i.remove(attr);
        self.store.inner().raw_put(&k, i);
    }
    pub fn stats(&self) -> StoreStats {
        self.store.stats()
    }
    pub fn at(&self, t: i64) {
        self.clock.set(t);
    }
}

/// A store that runs a staged action once, right before the first matching write — to
/// stage "another writer got there between our read and our write".
pub mod hook {
    use std::sync::{Arc, Mutex};

    use async_trait::async_trait;
    use tollgate_core::value::{Item, Key};
    use tollgate_store::*;

    type Action = Box<dyn FnOnce(&MemoryStore) + Send>;

    #[derive(Clone, Copy, PartialEq, Eq)]
    pub enum On {
        Update,
        Put,
        Transact,
    }

    pub struct Hook {
        pub inner: Arc<Counting<MemoryStore>>,
        staged: Mutex<Vec<(On, Option<Key>, Action)>>,
    }

    impl Hook {
        pub fn new(inner: Arc<Counting<MemoryStore>>) -> Self {
            Hook {
                inner,
                staged: Mutex::new(Vec::new()),
            }
        }
        pub fn stage(
            &self,
            on: On,
            key: Option<Key>,
            f: impl FnOnce(&MemoryStore) + Send + 'static,
        ) {
            self.staged.lock().unwrap().push((on, key, Box::new(f)));
        }
        fn fire(&self, on: On, key: Option<&Key>) {
            let mut g = self.staged.lock().unwrap();
            if let Some(pos) = g
                .iter()
                .position(|(o, k, _)| *o == on && (k.is_none() || k.as_ref() == key))
            {
                let (_, _, f) = g.remove(pos);
                drop(g);
                f(self.inner.inner());
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
            self.inner.transact_write(o, t).await
        }
        async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
            self.inner.query(q).await
        }
        fn backend(&self) -> &'static str {
            "hook"
        }
    }
}

impl H {
    /// A second limiter on the same store and clock with the fast path off ("slow
    /// acquire") and the same pinned draws.
    pub fn slow(&self) -> Limiter {
        self.slow_lim.clone()
    }
    /// A limiter whose store runs staged actions (see [`hook::Hook`]).
    pub fn hooked(&self, speculative: bool) -> (Limiter, Arc<hook::Hook>) {
        let hk = Arc::new(hook::Hook::new(self.store.clone()));
        let mut o = opts();
        o.speculative = speculative;
        let lim = Limiter::builder(hk.clone())
            .clock(self.clock.clone())
            .rng(self.rng.clone())
            .options(o)
            .build()
            .unwrap();
        (lim, hk)
    }
    /// Σ max(0, tk) over shards 0..s, in tokens.
    pub fn spendable(&self, e: &str, r: &str, limit: &str, s: u32) -> i64 {
        (0..s)
            .filter_map(|i| self.store.inner().raw_get(&self.key(e, r, i)))
            .filter_map(|it| it.get(&format!("b_{limit}_tk")).and_then(Value::as_n))
            .map(|tk| tk.max(0))
            .sum::<i64>()
            / 1000
    }
    pub fn tks(&self, e: &str, r: &str, limit: &str, s: u32) -> Vec<i64> {
        (0..s)
            .map(|i| {
                self.n(e, r, i, &format!("b_{limit}_tk"))
                    .unwrap_or(i64::MIN)
            })
            .collect()
    }
}

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
        .options(o)
        .build()
        .unwrap();
    H {
        store,
        clock,
        rng,
        lim,
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

//! Test support (feature `testing`): raw item access over any backend, a harness with a
//! manual clock and pinned shard draws, a store that stages "another writer got there
//! first", and the limiter behaviour scenarios that every backend runs
//! ([`scenario_tests!`](crate::scenario_tests)).

pub mod hook;
pub mod intercept;
pub mod outage;
pub mod scenarios;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::keys;
use tollgate_core::value::{Item, Key, Value};
use tollgate_store::{
    ChangeFeed, Counting, FaultConfig, FaultyStore, MemoryStore, Store, StoreStats,
};

use crate::{Limiter, ManualClock, Options, PinnedRng};

/// A store whose items tests may read and write directly, bypassing conditions, to stage
/// exact item states.
pub trait TestStore: Store {
    /// The item now (strongly consistent).
    fn raw_get(&self, key: &Key) -> Option<Item>;
    /// Write an item whole.
    fn raw_put(&self, key: &Key, item: Item);
    /// Delete an item.
    fn raw_delete(&self, key: &Key);
    /// A second, independent client of the same stored data — what another process would
    /// open: a second connection to the same SQLite file, a second DynamoDB client of the
    /// same table. `None` where the backend has no such thing (memory: share the store).
    fn twin(&self) -> Option<StoreFuture> {
        None
    }

    /// Store `item` at `key` in a form this backend cannot decode: attribute `attribute`
    /// holding a number with a fraction (SQLite: JSON `1.5`; DynamoDB: `N "1.5"`), outside
    /// the item model. `false` on a backend that cannot hold such an item (MemoryStore
    /// keeps typed items), which then skips the scenarios that need one.
    fn raw_put_undecodable(&self, key: &Key, item: Item, attribute: &str) -> bool {
        let _ = (key, item, attribute);
        false
    }

    /// The store's change feed, for the usage scenarios; `None` skips them.
    fn change_feed(self: Arc<Self>) -> Option<Arc<dyn ChangeFeed>> {
        None
    }
}

impl TestStore for MemoryStore {
    fn raw_get(&self, key: &Key) -> Option<Item> {
        MemoryStore::raw_get(self, key)
    }
    fn raw_put(&self, key: &Key, item: Item) {
        MemoryStore::raw_put(self, key, item)
    }
    fn raw_delete(&self, key: &Key) {
        MemoryStore::raw_delete(self, key)
    }
    fn change_feed(self: Arc<Self>) -> Option<Arc<dyn ChangeFeed>> {
        Some(self)
    }
}

/// The memory store behind a fault wrapper: raw access goes to the store itself.
impl TestStore for FaultyStore<MemoryStore> {
    fn raw_get(&self, key: &Key) -> Option<Item> {
        self.inner().raw_get(key)
    }
    fn raw_put(&self, key: &Key, item: Item) {
        self.inner().raw_put(key, item)
    }
    fn raw_delete(&self, key: &Key) {
        self.inner().raw_delete(key)
    }
    fn change_feed(self: Arc<Self>) -> Option<Arc<dyn ChangeFeed>> {
        Some(self)
    }
}

/// A future that yields a fresh, empty test store.
pub type StoreFuture = Pin<Box<dyn Future<Output = Arc<dyn TestStore>> + Send>>;

/// A backend the scenarios run on: each call gives a fresh, empty store.
#[derive(Clone)]
pub struct Backend {
    make: Arc<dyn Fn() -> StoreFuture + Send + Sync>,
}

impl Backend {
    /// A backend from a factory.
    pub fn new(make: impl Fn() -> StoreFuture + Send + Sync + 'static) -> Self {
        Backend {
            make: Arc::new(make),
        }
    }

    /// The reference backend.
    pub fn memory() -> Self {
        Backend::new(|| {
            Box::pin(async { Arc::new(MemoryStore::with_change_feed()) as Arc<dyn TestStore> })
        })
    }

    /// The reference backend behind the fault wrapper, configured to delay about a third
    /// of the requests by up to 300 µs and inject nothing else: every scenario's answer must
    /// be the same when requests take time and interleave for real.
    pub fn delayed() -> Self {
        Backend::new(|| {
            Box::pin(async {
                let mut faults = FaultConfig::none();
                faults.delay = 0.3;
                faults.max_delay = Duration::from_micros(300);
                Arc::new(FaultyStore::new(
                    MemoryStore::with_change_feed(),
                    11,
                    faults,
                )) as Arc<dyn TestStore>
            })
        })
    }

    /// A fresh store.
    pub async fn store(&self) -> Arc<dyn TestStore> {
        (self.make)().await
    }

    /// A harness at `t0` with default options (config cache 60 s).
    pub async fn harness(&self, t0: i64) -> H {
        self.harness_with(t0, opts()).await
    }

    /// A harness at `t0` with these options.
    pub async fn harness_with(&self, t0: i64, o: Options) -> H {
        H::new(self.store().await, t0, o)
    }
}

/// Test constant: the scenarios' first instant.
pub const T0: i64 = 1_757_000_000_000;
/// Test constant: a five-hour window in ms.
pub const W: i64 = 18_000_000;

/// Default options of the harness.
pub fn opts() -> Options {
    Options {
        config_cache_ttl: Duration::from_secs(60),
        ..Options::default()
    }
}

/// The harness: a limiter (and a second, slow-path-only client) over a counting store,
/// a manual clock and pinned draws.
pub struct H {
    /// The store, counted.
    pub store: Arc<Counting<Arc<dyn TestStore>>>,
    /// Raw access to the same store.
    pub raw: Arc<dyn TestStore>,
    /// The clock.
    pub clock: Arc<ManualClock>,
    /// The shard draws.
    pub rng: Arc<PinnedRng>,
    /// The client under test.
    pub lim: Limiter,
    /// A second client on the same store with the fast path off (its caches persist).
    pub slow_lim: Limiter,
    opts: Options,
}

impl H {
    /// A harness over `raw`.
    pub fn new(raw: Arc<dyn TestStore>, t0: i64, o: Options) -> Self {
        let store = Arc::new(Counting::new(raw.clone()));
        let clock = Arc::new(ManualClock::new(t0));
        let rng = Arc::new(PinnedRng::new(0));
        let build = |o: Options| {
            Limiter::builder(store.clone())
                .clock(clock.clone())
                .rng(rng.clone())
                .options(o)
                .build()
                .expect("limiter")
        };
        let lim = build(o.clone());
        let slow_lim = build(Options {
            speculative: false,
            ..o.clone()
        });
        H {
            store,
            raw,
            clock,
            rng,
            lim,
            slow_lim,
            opts: o,
        }
    }
    /// A bucket key.
    pub fn key(&self, e: &str, r: &str, shard: u32) -> Key {
        keys::bucket(&self.opts.namespace, e, r, shard)
    }
    /// A bucket item (panics if absent).
    pub fn item(&self, e: &str, r: &str, shard: u32) -> Item {
        self.raw
            .raw_get(&self.key(e, r, shard))
            .expect("bucket item exists")
    }
    /// A number attribute of a bucket item.
    pub fn n(&self, e: &str, r: &str, shard: u32, attr: &str) -> Option<i64> {
        self.item(e, r, shard).get(attr).and_then(Value::as_n)
    }
    /// Set a number attribute.
    pub fn set_n(&self, e: &str, r: &str, shard: u32, attr: &str, v: i64) {
        let k = self.key(e, r, shard);
        let mut i = self.raw.raw_get(&k).expect("bucket item exists");
        i.insert(attr.into(), Value::N(v));
        self.raw.raw_put(&k, i);
    }
    /// Remove an attribute.
    pub fn remove(&self, e: &str, r: &str, shard: u32, attr: &str) {
        let k = self.key(e, r, shard);
        let mut i = self.raw.raw_get(&k).expect("bucket item exists");
        i.remove(attr);
        self.raw.raw_put(&k, i);
    }
    /// Store request counts so far.
    pub fn stats(&self) -> StoreStats {
        self.store.stats()
    }
    /// Set the clock.
    pub fn at(&self, t: i64) {
        self.clock.set(t);
    }
    /// The slow-path-only client.
    pub fn slow(&self) -> Limiter {
        self.slow_lim.clone()
    }
    /// A client whose store runs staged actions (see [`hook::Hook`]).
    pub fn hooked(&self, speculative: bool) -> (Limiter, Arc<hook::Hook>) {
        let hk = Arc::new(hook::Hook::new(self.raw.clone()));
        let lim = Limiter::builder(hk.clone())
            .clock(self.clock.clone())
            .rng(self.rng.clone())
            .options(Options {
                speculative,
                ..self.opts.clone()
            })
            .build()
            .expect("limiter");
        (lim, hk)
    }
    /// Σ max(0, tk) over shards 0..s, in tokens.
    pub fn spendable(&self, e: &str, r: &str, limit: &str, s: u32) -> i64 {
        (0..s)
            .filter_map(|i| self.raw.raw_get(&self.key(e, r, i)))
            .filter_map(|it| {
                it.get(format!("b_{limit}_tk").as_str())
                    .and_then(Value::as_n)
            })
            .map(|tk| tk.max(0))
            .sum::<i64>()
            / 1000
    }
    /// Balances of shards 0..s (i64::MIN where absent).
    pub fn tks(&self, e: &str, r: &str, limit: &str, s: u32) -> Vec<i64> {
        (0..s)
            .map(|i| {
                self.raw
                    .raw_get(&self.key(e, r, i))
                    .and_then(|it| {
                        it.get(format!("b_{limit}_tk").as_str())
                            .and_then(Value::as_n)
                    })
                    .unwrap_or(i64::MIN)
            })
            .collect()
    }
}

//! Shared harness of the memory-only tests: the `testing` feature's, on MemoryStore.
#![allow(dead_code)]

#[allow(unused_imports)]
pub use tollgate::testing::{opts, H, T0, W};

pub fn harness(t0: i64) -> H {
    harness_with(t0, opts())
}

pub fn harness_with(t0: i64, o: tollgate::Options) -> H {
    H::new(
        std::sync::Arc::new(tollgate_store::MemoryStore::new()),
        t0,
        o,
    )
}

//! Issue 17: the future of an acquire stays small.
//!
//! A server boxes each request's future, and every level of an async call moves its
//! callee's future into its own: a future's size is copied, into memory not yet in the
//! cache, several times per request. Rare paths (creating a bucket, a lost lock, a throttle,
//! a cascade's parent, an undo) are boxed where they are awaited, so that their futures do
//! not size every acquire's. A size is deterministic for a given build, so it may be
//! asserted; the bound leaves room for the compiler's layout, not for the largest rare path
//! held in place again (the slow path's recovery from a lost lock: 4,480 bytes then).

use std::sync::Arc;

use tollgate::{AcquireOptions, Limiter};
use tollgate_store::MemoryStore;

/// The most bytes an acquire's future may take: 2,904 in debug and release builds on
/// 2026-12-06, against 6,432 before the rare paths were boxed.
const MAX_ACQUIRE_FUTURE_BYTES: usize = 3_584;

#[test]
fn an_acquire_future_leaves_its_rare_paths_boxed() {
    let lim = Limiter::new(Arc::new(MemoryStore::new())).expect("limiter");
    let amounts = vec![("rpm", 1i64)];
    let fut = lim.acquire_with("user-1", "api", &amounts, AcquireOptions::default());
    let bytes = std::mem::size_of_val(&fut);
    drop(fut);
    assert!(
        bytes <= MAX_ACQUIRE_FUTURE_BYTES,
        "an acquire's future takes {bytes} bytes (at most {MAX_ACQUIRE_FUTURE_BYTES}): a rare \
         path's future is held in place; box it where it is awaited"
    );
}

//! Leases between an acquire and its commit or rollback, on any server sharing the store.
//!
//! **A lease is its token.** The acquire answers `lease_id` = the lease's signed,
//! self-contained token (`tollgate::LeaseToken`: the lease's whole state, HMAC-SHA256
//! under [`crate::ServerConfig::lease_key`]). Any server over the same store with the same
//! key can adjust, commit or roll it back: it verifies the token and rebuilds the lease
//! from it (no store request). Every adjust answers the token of the lease's next version;
//! **always pass the latest token**. A lease closes once, wherever it is closed: its first
//! commit or rollback records the closure in the store (one conditional put) before it
//! writes, and every later close, on any server, is `409 lease_closed`. The failure
//! directions and costs are the library's (`tollgate`'s `lease_token` module; repeated in
//! `docs/http-api.md`).
//!
//! This table is each server's cache of the leases it granted or was shown, and the home of
//! the expiry rule. An entry lives until the lease's expiry
//! ([`crate::ServerConfig::lease_ttl`], 300 s by default, counted from the acquire, by the
//! limiter's clock); the sweeper takes expired entries every
//! [`crate::ServerConfig::sweep_interval`].
//!
//! - A token this table does not hold is verified and **adopted** (held until its expiry).
//! - A token older than the version held here is `409 lease_stale`; a newer one replaces
//!   the copy held here (unless that copy already began to close).
//! - **Expiry rule.** A lease that expires while still open is *committed*: the acquire's
//!   debit stands and the adjustments this server saw are written. When several servers
//!   hold copies, the first to commit wins and the others find it closed (logged at debug):
//!   adjustments sent only to a server that loses that race are not charged. A commit that
//!   fails at expiry (store down) is logged and dropped: the debit still stands. A closed
//!   lease stays in the table until its expiry as a tombstone (a repeated commit here is
//!   `409 lease_closed` with no store request); after its expiry its token is refused
//!   (`404 lease_not_found`). The same rule applies to every open lease at graceful
//!   shutdown.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tollgate::Lease;

/// One held lease.
#[derive(Debug)]
pub struct Held {
    /// The lease.
    pub lease: Lease,
    /// When the sweeper takes it (epoch ms, the limiter's clock).
    pub expires_at_ms: i64,
}

/// A shared handle to one held lease (locked while an adjust, commit or rollback runs).
pub type Slot = Arc<tokio::sync::Mutex<Held>>;

/// The lease table, by lease id (32 hex digits: the id inside the token).
#[derive(Debug, Default)]
pub struct LeaseTable {
    map: Mutex<HashMap<String, Slot>>,
}

impl LeaseTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many leases (open or tombstoned) are held.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no lease is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether another lease would exceed `max`.
    pub fn is_full(&self, max: usize) -> bool {
        self.len() >= max
    }

    /// Hold `lease` under `id` until `expires_at_ms`.
    pub fn insert(&self, id: String, lease: Lease, expires_at_ms: i64) {
        let slot = Arc::new(tokio::sync::Mutex::new(Held {
            lease,
            expires_at_ms,
        }));
        self.lock().insert(id, slot);
    }

    /// Hold `lease` under `id` unless a lease is held there already; the slot held.
    pub fn adopt(&self, id: &str, lease: Lease, expires_at_ms: i64) -> Slot {
        self.lock()
            .entry(id.to_string())
            .or_insert_with(|| {
                Arc::new(tokio::sync::Mutex::new(Held {
                    lease,
                    expires_at_ms,
                }))
            })
            .clone()
    }

    /// The lease under `id`, unless unknown or swept.
    pub fn get(&self, id: &str) -> Option<Slot> {
        self.lock().get(id).cloned()
    }

    /// Remove and return every lease whose expiry is at or before `now_ms` (all of them
    /// with `None`).
    pub fn take_expired(&self, now_ms: Option<i64>) -> Vec<(String, Slot)> {
        let mut map = self.lock();
        let ids: Vec<String> = map
            .iter()
            .filter(|(_, s)| match (now_ms, s.try_lock()) {
                (None, _) => true,
                (Some(now), Ok(h)) => h.expires_at_ms <= now,
                // Busy: an adjust or commit is running; look again next sweep.
                (Some(_), Err(_)) => false,
            })
            .map(|(k, _)| k.clone())
            .collect();
        ids.into_iter()
            .filter_map(|k| map.remove(&k).map(|s| (k, s)))
            .collect()
    }
}

/// Apply the expiry rule to leases taken from the table: commit the open ones.
/// Returns how many were committed here.
pub async fn expire(taken: Vec<(String, Slot)>) -> usize {
    let mut committed = 0;
    for (id, slot) in taken {
        let mut h = slot.lock().await;
        if h.lease.is_closed() {
            continue;
        }
        match h.lease.commit().await {
            Ok(()) => committed += 1,
            Err(tollgate::Error::LeaseClosed) => {
                tracing::debug!(lease = %id, "expired lease was closed on another server")
            }
            Err(e) => {
                tracing::warn!(lease = %id, error = %e, "expired lease: commit of its adjustments failed; the acquire's debit stands")
            }
        }
    }
    committed
}

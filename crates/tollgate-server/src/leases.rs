//! Leases held by the server between an acquire and its commit or rollback.
//!
//! Each acquire gets a random 128-bit id. The lease lives in a map until it expires
//! ([`crate::ServerConfig::lease_ttl`], 300 s by default, counted from the acquire); a
//! sweeper removes expired entries every [`crate::ServerConfig::sweep_interval`].
//!
//! **Expiry rule.** A lease that expires while still open is *committed*: the acquire's
//! debit stands and any adjustments recorded with `/adjust` are written (they report usage
//! that happened). A commit that fails at expiry (store down) is logged and dropped: the
//! debit still stands. A lease that was committed or rolled back stays in the map until its
//! expiry as a closed tombstone, so a repeated commit answers `409 lease_closed`; after
//! that the id is unknown (`404 lease_not_found`). The same rule applies to every open
//! lease at graceful shutdown.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate::Lease;

/// One held lease.
#[derive(Debug)]
pub struct Held {
    /// The lease.
    pub lease: Lease,
    /// When the sweeper takes it.
    pub expires_at: Instant,
}

/// A shared handle to one held lease (locked while an adjust, commit or rollback runs).
pub type Slot = Arc<tokio::sync::Mutex<Held>>;

/// The lease table.
#[derive(Debug, Default)]
pub struct LeaseTable {
    map: Mutex<HashMap<String, Slot>>,
}

/// Why a lease could not be stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableFull;

impl LeaseTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh random id (32 hex digits).
    pub fn new_id() -> String {
        format!("{:032x}", rand::random::<u128>())
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

    /// Hold `lease` under `id` for `ttl`.
    pub fn insert(&self, id: String, lease: Lease, ttl: Duration) -> Instant {
        let expires_at = Instant::now() + ttl;
        let slot = Arc::new(tokio::sync::Mutex::new(Held { lease, expires_at }));
        self.lock().insert(id, slot);
        expires_at
    }

    /// The lease under `id`, unless unknown or expired.
    pub fn get(&self, id: &str) -> Option<Slot> {
        self.lock().get(id).cloned()
    }

    /// Remove and return every lease whose expiry is at or before `now` (all of them with
    /// `now = None`).
    pub fn take_expired(&self, now: Option<Instant>) -> Vec<(String, Slot)> {
        let mut map = self.lock();
        let ids: Vec<String> = map
            .iter()
            .filter(|(_, s)| match (now, s.try_lock()) {
                (None, _) => true,
                (Some(now), Ok(h)) => h.expires_at <= now,
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
/// Returns how many were committed.
pub async fn expire(taken: Vec<(String, Slot)>) -> usize {
    let mut committed = 0;
    for (id, slot) in taken {
        let mut h = slot.lock().await;
        if h.lease.is_closed() {
            continue;
        }
        match h.lease.commit().await {
            Ok(()) => committed += 1,
            Err(e) => {
                tracing::warn!(lease = %id, error = %e, "expired lease: commit of its adjustments failed; the acquire's debit stands")
            }
        }
    }
    committed
}

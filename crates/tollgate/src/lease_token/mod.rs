//! Lease tokens: leases that any limiter sharing the store can finish, and that close once.
//!
//! Rule "a shared lease is its token". [`Limiter::lease_token`] exports a lease's whole
//! state — the request it was granted for (limits, amounts, parameter hash, TTL, cascade
//! policy), every shard it holds tokens on (what it holds there, the refund pins, the image
//! the debit returned), the pending adjustments, the statuses and a cascade parent's lease —
//! with a random id, a version and an expiry, signed with HMAC-SHA256 under a [`LeaseKey`]
//! that every process of the fleet shares. [`Limiter::resume_lease`] rebuilds the lease on
//! any limiter over the same store and namespace; its adjust, commit and rollback then write
//! exactly what they would have written where it was granted. Exporting and resuming write
//! nothing, so a warm admitted acquire stays one store write, lease or not.
//!
//! - Text: `v1.<payload>.<mac>`, both base64url without padding (URL-safe: a path segment
//!   as it is). The payload is JSON: **signed, not encrypted** — whoever holds a token can
//!   read the limits and balances in it, and nobody without the key can alter it.
//! - Every [`Lease::adjust`] of a shared lease bumps its version; the token of the new
//!   version is the one to pass on. A holder that knows a later version may refuse an
//!   older token (the HTTP server answers `409 lease_stale`).
//! - A token past its expiry is refused ([`Error::LeaseExpired`]); one that does not parse
//!   or verify — altered, truncated, signed under another key, for another namespace — is
//!   [`Error::InvalidLease`].
//!
//! Rule "a shared lease closes once". The first commit or rollback of a shared lease, on
//! any limiter, first writes the lease's closure record (key
//! [`tollgate_core::keys::lease_closure`]) with a put conditioned on its absence (a record
//! whose `ttl` has passed counts as absent, as an expired bucket does), then writes what
//! the close writes for any lease. A second close, wherever it runs, finds the record:
//! [`Error::LeaseClosed`], nothing written. The record names the copy that wrote it (a
//! random nonce), so a put resent after an ambiguous outcome recognises its own record.
//!
//! - Failure direction. When the record is written and the close's own writes then fail,
//!   only the copy that wrote it can finish: called again, it writes what is still open
//!   (as any lease does); every other copy answers [`Error::LeaseClosed`]. If it never
//!   succeeds, what failed is lost conservatively — a commit's adjustments are not
//!   charged (the acquire's debit stands), a rollback's refund is not given — and nothing
//!   is ever charged or refunded twice.
//! - Late closes. A shared lease may be closed until [`LATE_CLOSE_MS`] after its expiry (a
//!   sweeper committing expired leases); later, its close is refused with
//!   [`Error::LeaseExpired`] and nothing is written (the debit stands), because its record
//!   only outlives the expiry by [`CLOSURE_MARGIN_S`].
//! - Cost. One conditional put per close of a shared lease. The record carries `ttl` =
//!   expiry + [`CLOSURE_MARGIN_S`] (epoch seconds): DynamoDB's TTL deletes it at no request
//!   cost. Stores without a native TTL (memory, SQLite) do not: the limiter that wrote a
//!   record remembers it and [`crate::Admin::purge_lease_closures`] deletes it once its `ttl`
//!   has passed (one delete per record; the HTTP server's sweeper calls it). A process that
//!   stops before then leaves those records (about 300 bytes each in SQLite) in the store.
//! - Leases never exported keep their cost: no record, no extra request.

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tollgate_core::bucket::attr;
use tollgate_core::expr::Condition;
use tollgate_core::keys;
use tollgate_store::{DeleteRequest, StoreError};

use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::limiter::Limiter;

mod closure;
mod payload;

pub(crate) use crate::lease::{Claim, Shared};
use payload::{doc_of, invalid, lease_of, Body};

/// The version tag every token starts with.
pub const TOKEN_VERSION: &str = "v1";
/// The fewest bytes a [`LeaseKey`] may have.
pub const MIN_KEY_BYTES: usize = 32;
/// The longest token text accepted (longer is [`Error::InvalidLease`] before any decoding).
pub const MAX_TOKEN_BYTES: usize = 64 * 1024;
/// How long after its expiry a shared lease may still be closed (ms).
pub const LATE_CLOSE_MS: i64 = 60_000;
/// How long a closure record outlives its lease's expiry (s): longer than
/// [`LATE_CLOSE_MS`] by a margin for clock differences between processes.
pub const CLOSURE_MARGIN_S: i64 = 600;

type HmacSha256 = Hmac<Sha256>;

/// The key lease tokens are signed with: the same bytes on every process that should
/// finish each other's leases. Its `Debug` shows nothing of it.
#[derive(Clone)]
pub struct LeaseKey(HmacSha256);

/// A lease key too short to sign with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a lease key needs at least {MIN_KEY_BYTES} bytes; this one has {len}")]
pub struct LeaseKeyError {
    /// The length given.
    pub len: usize,
}

impl LeaseKey {
    /// A key from secret bytes (at least [`MIN_KEY_BYTES`]).
    pub fn from_bytes(secret: &[u8]) -> std::result::Result<Self, LeaseKeyError> {
        if secret.len() < MIN_KEY_BYTES {
            return Err(LeaseKeyError { len: secret.len() });
        }
        HmacSha256::new_from_slice(secret)
            .map(LeaseKey)
            .map_err(|_| LeaseKeyError { len: secret.len() })
    }

    /// A random key (tokens then verify only in this process).
    pub fn random() -> Self {
        let bytes: [u8; 32] = rand::random();
        // 32 bytes is a valid HMAC key length.
        match Self::from_bytes(&bytes) {
            Ok(k) => k,
            Err(_) => unreachable!("32 random bytes make a lease key"),
        }
    }

    fn mac(&self, text: &[u8]) -> Vec<u8> {
        let mut m = self.0.clone();
        m.update(text);
        m.finalize().into_bytes().to_vec()
    }

    fn verify(&self, text: &[u8], mac: &[u8]) -> bool {
        let mut m = self.0.clone();
        m.update(text);
        m.verify_slice(mac).is_ok()
    }
}

impl std::fmt::Debug for LeaseKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseKey(..)")
    }
}

/// A lease token whose signature verified (not yet resumed).
#[derive(Debug)]
pub struct LeaseToken {
    body: Body,
}

impl LeaseToken {
    /// Parse `text` and check its signature under `key`. Never panics on any input:
    /// anything that is not a token this key signed is [`Error::InvalidLease`] (expiry is
    /// checked when it is resumed).
    pub fn verify(text: &str, key: &LeaseKey) -> Result<Self> {
        if text.len() > MAX_TOKEN_BYTES {
            return Err(invalid(format!(
                "{} bytes, longer than any lease token ({MAX_TOKEN_BYTES})",
                text.len()
            )));
        }
        let shape = || {
            invalid(format!(
                "not a lease token (expected {TOKEN_VERSION}.<payload>.<signature>)"
            ))
        };
        let (signed, mac) = text.rsplit_once('.').ok_or_else(shape)?;
        let (version, payload) = signed.split_once('.').ok_or_else(shape)?;
        if version != TOKEN_VERSION {
            return Err(shape());
        }
        let mac = B64.decode(mac).map_err(|_| shape())?;
        if !key.verify(signed.as_bytes(), &mac) {
            return Err(invalid(
                "its signature does not verify: it was altered, or signed under another lease key",
            ));
        }
        let json = B64
            .decode(payload)
            .map_err(|e| invalid(format!("payload: {e}")))?;
        let body: Body =
            serde_json::from_slice(&json).map_err(|e| invalid(format!("payload: {e}")))?;
        if body.id.len() != 32 || !body.id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid("its id is not 32 hex digits"));
        }
        Ok(LeaseToken { body })
    }

    /// The lease's id (32 hex digits), the same in every version of its token.
    pub fn id(&self) -> &str {
        &self.body.id
    }

    /// The version: 0 when exported, one more per adjustment.
    pub fn version(&self) -> u64 {
        self.body.ver
    }

    /// When the lease expires (epoch ms).
    pub fn expires_at_ms(&self) -> i64 {
        self.body.exp
    }

    /// The namespace it was granted in.
    pub fn namespace(&self) -> &str {
        &self.body.ns
    }

    /// The entity.
    pub fn entity(&self) -> &str {
        &self.body.lease.entity
    }

    /// The resource.
    pub fn resource(&self) -> &str {
        &self.body.lease.resource
    }
}

impl Limiter {
    /// The token of `lease`: its whole state, signed under `key` (see the module rules).
    /// The first call shares the lease — it fixes its id and its expiry, now + `ttl` — and
    /// from then on its close is recorded in the store (one more write). Later calls, after
    /// an adjustment, give the token of the current version, same id and expiry (`ttl` is
    /// then ignored). Writes nothing. A closed lease has no token ([`Error::LeaseClosed`]).
    pub fn lease_token(&self, lease: &mut Lease, key: &LeaseKey, ttl: Duration) -> Result<String> {
        if lease.is_closed() {
            return Err(Error::LeaseClosed);
        }
        let inner = lease.lim.as_ref().unwrap_or(self.inner());
        if lease.shared.is_none() {
            let now = inner.clock().now_ms();
            let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
            lease.shared = Some(Shared {
                id: format!("{:032x}", rand::random::<u128>()),
                version: 0,
                issued_at_ms: now,
                expires_at_ms: now.saturating_add(ttl_ms),
                claim: Claim::None,
            });
        }
        let Some(sh) = lease.shared.as_ref() else {
            unreachable!("shared just above")
        };
        let body = Body {
            id: sh.id.clone(),
            ver: sh.version,
            iat: sh.issued_at_ms,
            exp: sh.expires_at_ms,
            ns: inner.ns().to_string(),
            lease: doc_of(inner, lease),
        };
        let json = serde_json::to_vec(&body)
            .map_err(|e| invalid(format!("the lease could not be encoded: {e}")))?;
        let signed = format!("{TOKEN_VERSION}.{}", B64.encode(json));
        let mac = B64.encode(key.mac(signed.as_bytes()));
        Ok(format!("{signed}.{mac}"))
    }

    /// The lease a token carries, on this limiter (see the module rules): writes nothing.
    /// [`Error::InvalidLease`] for anything `key` did not sign (or a token of another
    /// namespace), [`Error::LeaseExpired`] past its expiry.
    pub fn resume_lease(&self, token: &str, key: &LeaseKey) -> Result<Lease> {
        self.resume_verified(LeaseToken::verify(token, key)?)
    }

    /// [`Limiter::resume_lease`] of a token already verified.
    pub fn resume_verified(&self, token: LeaseToken) -> Result<Lease> {
        let b = token.body;
        if b.ns != self.inner().ns() {
            return Err(invalid(format!(
                "it was granted in namespace {:?}, this limiter serves {:?}",
                b.ns,
                self.inner().ns()
            )));
        }
        if self.now_ms() >= b.exp {
            return Err(Error::LeaseExpired);
        }
        let mut lease = lease_of(self.inner(), b.lease, 0)?;
        lease.shared = Some(Shared {
            id: b.id,
            version: b.ver,
            issued_at_ms: b.iat,
            expires_at_ms: b.exp,
            claim: Claim::None,
        });
        Ok(lease)
    }

    /// The implementation of [`crate::Admin::purge_lease_closures`].
    pub(crate) async fn purge_lease_closures(&self) -> Result<usize> {
        let inner = &self.inner();
        let now_s = inner.clock().now_ms().div_euclid(1000);
        let due = inner.closures().take_due(now_s);
        let mut deleted = 0;
        for (i, (ttl_s, id)) in due.iter().enumerate() {
            let r = inner
                .store()
                .delete(DeleteRequest {
                    key: keys::lease_closure(inner.ns(), id),
                    condition: Some(Condition::le(attr::TTL, now_s)),
                })
                .await;
            match r {
                Ok(Some(_)) => deleted += 1,
                Ok(None) | Err(StoreError::ConditionFailed { .. }) => {}
                Err(e) => {
                    for (t, id) in &due[i..] {
                        inner.closures().remember(*t, id.clone());
                    }
                    debug_assert!(*ttl_s <= now_s, "only due records are taken");
                    return Err(e.into());
                }
            }
        }
        Ok(deleted)
    }

    /// How many closure records this limiter still has to delete (see
    /// [`crate::Admin::purge_lease_closures`]).
    pub fn lease_closures_pending(&self) -> usize {
        self.inner().closures().len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tollgate_store::{Counting, MemoryStore, Store};

    use super::closure::closure_ttl_s;
    use super::*;
    use crate::ManualClock;

    fn limiter(store: Arc<dyn Store>) -> Limiter {
        Limiter::builder(store)
            .clock(Arc::new(ManualClock::new(1_757_000_000_000)))
            .build()
            .unwrap()
    }

    /// A degraded lease (granted without the store) travels too, and its close writes
    /// nothing — not even a closure record.
    #[tokio::test]
    async fn a_degraded_lease_resumes_degraded_and_writes_nothing() {
        let store = Arc::new(Counting::new(MemoryStore::new()));
        let lim = limiter(store.clone());
        let key = LeaseKey::random();
        let mut l = Lease::degraded("e", "r");
        let t = lim
            .lease_token(&mut l, &key, Duration::from_secs(60))
            .unwrap();
        let mut r = lim.resume_lease(&t, &key).unwrap();
        assert!(r.is_degraded());
        assert_eq!((r.entity(), r.resource()), ("e", "r"));
        r.adjust("anything", 5).unwrap();
        r.commit().await.unwrap();
        assert_eq!(store.stats().total(), 0);
        assert!(matches!(
            lim.lease_token(&mut r, &key, Duration::from_secs(60)),
            Err(Error::LeaseClosed)
        ));
    }

    #[test]
    fn keys_show_nothing_and_need_32_bytes() {
        let k = LeaseKey::from_bytes(b"0123456789abcdef0123456789abcdef").unwrap();
        assert_eq!(format!("{k:?}"), "LeaseKey(..)");
        assert_eq!(
            LeaseKey::from_bytes(b"short").unwrap_err(),
            LeaseKeyError { len: 5 }
        );
    }

    #[test]
    fn closure_records_outlive_the_late_close_window() {
        let exp_ms = 1_757_000_300_000;
        let ttl_s = closure_ttl_s(exp_ms);
        assert_eq!(ttl_s, 1_757_000_300 + 1 + CLOSURE_MARGIN_S);
        assert!(ttl_s * 1000 > exp_ms + LATE_CLOSE_MS + 500_000);
    }
}

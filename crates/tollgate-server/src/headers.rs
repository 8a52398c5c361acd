//! `Retry-After` and the IETF `RateLimit-Policy` / `RateLimit` headers
//! (draft-ietf-httpapi-ratelimit-headers): one policy item per limit the request named.
//!
//! ```text
//! RateLimit-Policy: "rpm";q=60;w=60, "tpm";q=200000;w=120
//! RateLimit: "rpm";r=0;t=12, "tpm";r=199500;t=1
//! ```
//!
//! - `q`: the limit's capacity in tokens;
//! - `w`: the window in seconds: for a rate limit the time an empty bucket takes to refill
//!   to capacity, for a calendar quota the length of the current reset period, for a
//!   duration quota its `reset_after`;
//! - `r`: tokens remaining after this request (never negative);
//! - `t`: seconds (rounded up) until the limit can admit the request again when it refused
//!   it, otherwise until it resets (a quota's window end or calendar edge, a rate limit's
//!   "full again" instant); 0 when nothing is pending.

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use tollgate::{Limit, LimitStatus};
use tollgate_core::Refill;

/// `RateLimit-Policy`.
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Whole seconds, rounded up, at least 1: the `Retry-After` value of a wait of `ms`.
pub fn retry_after_secs(ms: i64) -> i64 {
    (ms.max(0).saturating_add(999) / 1000).max(1)
}

fn ceil_secs(ms: i64) -> i64 {
    ms.max(0).saturating_add(999) / 1000
}

/// The policy window of `limit` in seconds (see the module docs), `None` if unknown.
pub fn window_secs(limit: &Limit, now_ms: i64) -> Option<i64> {
    match limit.refill() {
        Refill::Drip { amount, period_ms } => {
            if *amount <= 0 {
                return None;
            }
            let ms = (limit.capacity_milli() as i128 * *period_ms as i128) / *amount as i128;
            i64::try_from(ms).ok().map(|ms| ceil_secs(ms).max(1))
        }
        Refill::Calendar(c) => {
            let next = c.next_edge(now_ms)?;
            let after = c.next_edge(next)?;
            Some(ceil_secs(after - next).max(1))
        }
        Refill::Window { reset_after_s } => Some(*reset_after_s),
    }
}

/// Seconds until `status`'s limit admits again (refused) or resets (admitted).
pub fn reset_secs(status: &LimitStatus, now_ms: i64) -> i64 {
    if status.exceeded {
        if let Some(ms) = status.retry_after_ms {
            return ceil_secs(ms);
        }
    }
    status
        .resets_at_ms
        .map(|at| ceil_secs(at.saturating_sub(now_ms)))
        .unwrap_or(0)
}

/// Add `RateLimit-Policy` and `RateLimit` for `statuses` (`limits` supplies the windows;
/// a limit missing there is rendered without `w`).
pub fn add_ratelimit_headers(
    headers: &mut HeaderMap,
    statuses: &[LimitStatus],
    limits: &[Limit],
    now_ms: i64,
) {
    if statuses.is_empty() {
        return;
    }
    // Each value written into one buffer on the stack (a handful of limits fit), its
    // numbers without `core::fmt`.
    let mut policy = Text::new();
    let mut state = Text::new();
    let mut digits = itoa::Buffer::new();
    for (i, s) in statuses.iter().enumerate() {
        if i > 0 {
            policy.extend_from_slice(b", ");
            state.extend_from_slice(b", ");
        }
        // Limit names are letters, digits and `_ . -`: safe inside an sf-string.
        let name = s.limit.as_bytes();
        policy.push(b'"');
        policy.extend_from_slice(name);
        policy.extend_from_slice(b"\";q=");
        policy.extend_from_slice(digits.format(s.capacity.max(0)).as_bytes());
        if let Some(w) = limits
            .iter()
            .find(|l| l.name() == s.limit)
            .and_then(|l| window_secs(l, now_ms))
        {
            policy.extend_from_slice(b";w=");
            policy.extend_from_slice(digits.format(w).as_bytes());
        }
        state.push(b'"');
        state.extend_from_slice(name);
        state.extend_from_slice(b"\";r=");
        state.extend_from_slice(digits.format(s.available.max(0)).as_bytes());
        state.extend_from_slice(b";t=");
        state.extend_from_slice(digits.format(reset_secs(s, now_ms)).as_bytes());
    }
    if let Ok(v) = HeaderValue::from_bytes(&policy) {
        headers.insert(RATELIMIT_POLICY.clone(), v);
    }
    if let Ok(v) = HeaderValue::from_bytes(&state) {
        headers.insert(RATELIMIT.clone(), v);
    }
}

/// A header value being written.
type Text = smallvec::SmallVec<[u8; 128]>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn retry_after_rounds_up_and_is_at_least_one() {
        assert_eq!(retry_after_secs(0), 1);
        assert_eq!(retry_after_secs(1), 1);
        assert_eq!(retry_after_secs(1000), 1);
        assert_eq!(retry_after_secs(1001), 2);
        assert_eq!(retry_after_secs(11_999), 12);
    }

    /// The values are the ones `format!` wrote before they were written by hand.
    #[test]
    fn header_values_as_formatted() {
        let rpm = Limit::per_minute("rpm", 60).unwrap();
        let tpm = Limit::rate("tpm", 200_000, 100_000, Duration::from_secs(60)).unwrap();
        let limits = [rpm, tpm];
        let status = |limit: &str, capacity, available, exceeded, retry, resets| LimitStatus {
            limit: limit.into(),
            kind: "rate".into(),
            capacity,
            available,
            requested: 1,
            exceeded,
            retry_after_ms: retry,
            resets_at_ms: resets,
        };
        let now = 1_000_000;
        for statuses in [
            vec![status("rpm", 60, 0, true, Some(11_001), Some(now + 60_000))],
            vec![
                status("rpm", 60, 59, false, None, Some(now + 1_000)),
                status("tpm", 200_000, 199_500, false, None, None),
                status("gone", -3, -7, false, None, Some(now - 5)),
            ],
            vec![status(
                "tpm",
                i64::MAX,
                i64::MAX,
                true,
                None,
                Some(i64::MAX),
            )],
        ] {
            let mut h = HeaderMap::new();
            add_ratelimit_headers(&mut h, &statuses, &limits, now);
            let mut policy = Vec::new();
            let mut state = Vec::new();
            for s in &statuses {
                let mut p = format!("\"{}\";q={}", s.limit, s.capacity.max(0));
                if let Some(w) = limits
                    .iter()
                    .find(|l| l.name() == s.limit)
                    .and_then(|l| window_secs(l, now))
                {
                    p.push_str(&format!(";w={w}"));
                }
                policy.push(p);
                state.push(format!(
                    "\"{}\";r={};t={}",
                    s.limit,
                    s.available.max(0),
                    reset_secs(s, now)
                ));
            }
            assert_eq!(h[&RATELIMIT_POLICY], policy.join(", ").as_str());
            assert_eq!(h[&RATELIMIT], state.join(", ").as_str());
        }
        let mut h = HeaderMap::new();
        add_ratelimit_headers(&mut h, &[], &limits, now);
        assert!(h.is_empty());
    }

    #[test]
    fn windows() {
        let rpm = Limit::per_minute("rpm", 60).unwrap();
        assert_eq!(window_secs(&rpm, 0), Some(60));
        let tpm = Limit::rate("tpm", 200_000, 100_000, Duration::from_secs(60)).unwrap();
        assert_eq!(window_secs(&tpm, 0), Some(120));
        let s = Limit::quota_after("s", 10, Duration::from_secs(18_000)).unwrap();
        assert_eq!(window_secs(&s, 0), Some(18_000));
        let d = Limit::quota_calendar("rpd", 10, "0 0 * * *", "UTC").unwrap();
        assert_eq!(window_secs(&d, 0), Some(86_400));
    }
}

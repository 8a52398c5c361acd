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
    use std::fmt::Write as _;
    // Both values written straight into one buffer each (writing to a String cannot fail).
    let mut policy = String::with_capacity(32 * statuses.len());
    let mut state = String::with_capacity(32 * statuses.len());
    for (i, s) in statuses.iter().enumerate() {
        if i > 0 {
            policy.push_str(", ");
            state.push_str(", ");
        }
        // Limit names are letters, digits and `_ . -`: safe inside an sf-string.
        let _ = write!(policy, "\"{}\";q={}", s.limit, s.capacity.max(0));
        if let Some(w) = limits
            .iter()
            .find(|l| l.name() == s.limit)
            .and_then(|l| window_secs(l, now_ms))
        {
            let _ = write!(policy, ";w={w}");
        }
        let _ = write!(
            state,
            "\"{}\";r={};t={}",
            s.limit,
            s.available.max(0),
            reset_secs(s, now_ms)
        );
    }
    if let Ok(v) = HeaderValue::from_str(&policy) {
        headers.insert(RATELIMIT_POLICY.clone(), v);
    }
    if let Ok(v) = HeaderValue::from_str(&state) {
        headers.insert(RATELIMIT.clone(), v);
    }
}

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

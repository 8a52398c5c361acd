//! Building the answer: per-descriptor statuses, Envoy's `RateLimit` unit, headers.

use axum::http::{header, HeaderMap, HeaderValue as HttpValue};
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tollgate::{Limit, LimitStatus};
use tollgate_core::Refill;

use super::rls::rate_limit_response::{rate_limit::Unit, Code, DescriptorStatus, RateLimit};
use crate::headers::{add_ratelimit_headers, retry_after_secs, window_secs};

const UNITS: [(i64, Unit); 5] = [
    (1_000, Unit::Second),
    (60_000, Unit::Minute),
    (3_600_000, Unit::Hour),
    (86_400_000, Unit::Day),
    (604_800_000, Unit::Week),
];

/// Envoy's `requests_per_unit` / `unit` of a limit: a rate limit's refill per period when
/// the period is one of Envoy's units (else per the smallest unit it is a whole number
/// in), a quota's capacity per its window when the window is one; otherwise the capacity
/// with `UNKNOWN`.
pub(crate) fn current_limit(l: &Limit, now_ms: i64) -> RateLimit {
    let cap = u32::try_from(l.capacity_milli() / 1000).unwrap_or(u32::MAX);
    let (per, unit) = match l.refill() {
        Refill::Drip { amount, period_ms } => {
            let exact = UNITS
                .iter()
                .find(|(ms, _)| ms == period_ms && amount % 1000 == 0)
                .map(|(_, u)| (amount / 1000, *u));
            exact
                .or_else(|| {
                    UNITS.iter().find_map(|(ms, u)| {
                        let n = *amount as i128 * *ms as i128;
                        let d = *period_ms as i128 * 1000;
                        (n % d == 0 && n / d > 0).then(|| ((n / d) as i64, *u))
                    })
                })
                .map(|(n, u)| (u32::try_from(n).unwrap_or(u32::MAX), u))
                .unwrap_or((cap, Unit::Unknown))
        }
        _ => {
            let w = window_secs(l, now_ms).unwrap_or(0) * 1000;
            let u = UNITS
                .iter()
                .find(|(ms, _)| *ms == w)
                .map(|(_, u)| *u)
                .unwrap_or(Unit::Unknown);
            (cap, u)
        }
    };
    RateLimit {
        name: l.name().to_string(),
        requests_per_unit: per,
        unit: unit as i32,
    }
}

/// ms until the limit admits again (refused) or resets (admitted); `None` when nothing is
/// pending or it never will.
fn until_reset_ms(s: &LimitStatus, now_ms: i64) -> Option<i64> {
    if s.exceeded {
        return s.retry_after_ms;
    }
    s.resets_at_ms.map(|at| (at - now_ms).max(0))
}

fn pb_duration(ms: i64) -> PbDuration {
    PbDuration {
        seconds: ms / 1000,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

/// The status of one descriptor from its limit's status.
pub(crate) fn descriptor_status(
    s: Option<&LimitStatus>,
    limit: Option<&Limit>,
    now_ms: i64,
) -> DescriptorStatus {
    let Some(s) = s else {
        return DescriptorStatus {
            code: Code::Ok as i32,
            current_limit: limit.map(|l| current_limit(l, now_ms)),
            ..Default::default()
        };
    };
    DescriptorStatus {
        code: if s.exceeded {
            Code::OverLimit as i32
        } else {
            Code::Ok as i32
        },
        current_limit: limit.map(|l| current_limit(l, now_ms)),
        limit_remaining: u32::try_from(s.available.max(0)).unwrap_or(u32::MAX),
        duration_until_reset: until_reset_ms(s, now_ms).map(pb_duration),
        ..Default::default()
    }
}

/// `RateLimit-Policy`, `RateLimit` and, with a wait, `Retry-After`, as Envoy header values.
pub(crate) fn headers(
    statuses: &[LimitStatus],
    limits: &[Limit],
    retry_after_ms: Option<i64>,
    now_ms: i64,
) -> Vec<HeaderValue> {
    let mut h = HeaderMap::new();
    add_ratelimit_headers(&mut h, statuses, limits, now_ms);
    if let Some(ms) = retry_after_ms {
        h.insert(header::RETRY_AFTER, HttpValue::from(retry_after_secs(ms)));
    }
    h.iter()
        .filter_map(|(k, v)| {
            Some(HeaderValue {
                key: k.as_str().to_string(),
                value: v.to_str().ok()?.to_string(),
                raw_value: Vec::new(),
            })
        })
        .collect()
}

/// One header value.
pub(crate) fn header(key: &str, value: impl Into<String>) -> HeaderValue {
    HeaderValue {
        key: key.to_string(),
        value: value.into(),
        raw_value: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn units() {
        let rpm = Limit::per_minute("rpm", 60).unwrap();
        let r = current_limit(&rpm, 0);
        assert_eq!((r.requests_per_unit, r.unit), (60, Unit::Minute as i32));
        let odd = Limit::rate("x", 10, 30, Duration::from_secs(120)).unwrap();
        let r = current_limit(&odd, 0);
        assert_eq!((r.requests_per_unit, r.unit), (15, Unit::Minute as i32));
        let day = Limit::quota_after("d", 500, Duration::from_secs(86_400)).unwrap();
        let r = current_limit(&day, 0);
        assert_eq!((r.requests_per_unit, r.unit), (500, Unit::Day as i32));
        let five_h = Limit::quota_after("s", 10, Duration::from_secs(18_000)).unwrap();
        assert_eq!(current_limit(&five_h, 0).unit, Unit::Unknown as i32);
    }

    #[test]
    fn durations_keep_milliseconds() {
        let d = pb_duration(12_345);
        assert_eq!((d.seconds, d.nanos), (12, 345_000_000));
    }
}

//! Calendar resets: a cron expression evaluated in an IANA time zone (DST-correct).

use std::str::FromStr;

use croner::Cron;
use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};

use crate::error::RuleError;

/// A calendar reset schedule: the quota resets at every instant the cron expression matches
/// in the time zone.
#[derive(Debug, Clone)]
pub struct CalendarReset {
    expr: String,
    tz_name: String,
    cron: Cron,
    tz: TimeZone,
    /// The period last asked about: a pure cache of what `cron` answers (never consulted
    /// for an instant outside it), so that the many questions asked within one period do
    /// not each walk the cron pattern.
    memo: Memo,
}

/// Two consecutive edges `[prev, next)` and, once asked, the period bound computed there.
#[derive(Debug, Default)]
struct Memo(std::sync::Mutex<Option<Period>>);

#[derive(Debug, Clone, Copy)]
struct Period {
    prev: i64,
    next: i64,
    period_ms: Option<i64>,
}

impl Clone for Memo {
    fn clone(&self) -> Self {
        Memo(std::sync::Mutex::new(self.get()))
    }
}

impl Memo {
    fn get(&self) -> Option<Period> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn set(&self, p: Period) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
    }
    /// The memo when `now_ms` falls in its period.
    fn at(&self, now_ms: i64) -> Option<Period> {
        self.get().filter(|p| p.prev <= now_ms && now_ms < p.next)
    }
}

impl PartialEq for CalendarReset {
    fn eq(&self, o: &Self) -> bool {
        self.expr == o.expr && self.tz_name == o.tz_name
    }
}
impl Eq for CalendarReset {}

/// Schedules parsed and checked so far, by (expression, zone): parsing a cron expression,
/// finding its zone and checking that it ever fires cost about 280,000 instructions, paid
/// again for every limit a configuration decodes (each cache miss of the limiter's config
/// cache, every simulated seed). A schedule is a pure function of the two strings, so a
/// parsed one is handed out again as a clone (its period memo starts empty). Bounded: past
/// [`PARSED_CAP`] entries it starts over.
static PARSED: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<(String, String), CalendarReset>>,
> = std::sync::LazyLock::new(Default::default);

/// Most schedules [`PARSED`] keeps.
const PARSED_CAP: usize = 256;

impl CalendarReset {
    /// Parse a cron expression (5 fields, or 6 with seconds) and an IANA zone name.
    pub fn new(expr: &str, tz: &str) -> Result<Self, RuleError> {
        let parsed = || PARSED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = parsed().get(&(expr.to_string(), tz.to_string())) {
            return Ok(CalendarReset {
                memo: Memo::default(),
                ..c.clone()
            });
        }
        let c = Self::parse(expr, tz)?;
        let mut cache = parsed();
        if cache.len() >= PARSED_CAP {
            cache.clear();
        }
        cache.insert((expr.to_string(), tz.to_string()), c.clone());
        Ok(c)
    }

    /// [`CalendarReset::new`] without the cache.
    fn parse(expr: &str, tz: &str) -> Result<Self, RuleError> {
        let bad = |reason: String| RuleError::InvalidLimit {
            name: String::new(),
            reason,
        };
        let cron = Cron::from_str(expr).map_err(|e| bad(format!("cron {expr:?}: {e}")))?;
        let zone = TimeZone::get(tz).map_err(|e| bad(format!("time zone {tz:?}: {e}")))?;
        let c = CalendarReset {
            expr: expr.to_string(),
            tz_name: tz.to_string(),
            cron,
            tz: zone,
            memo: Memo::default(),
        };
        // A schedule that never fires is not a reset.
        if c.next_edge(0).is_none() {
            return Err(bad(format!("cron {expr:?} never matches")));
        }
        Ok(c)
    }

    /// The cron expression.
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// The time zone name.
    pub fn tz(&self) -> &str {
        &self.tz_name
    }

    fn zoned(&self, ms: i64) -> Option<Zoned> {
        Some(
            Timestamp::from_millisecond(ms)
                .ok()?
                .to_zoned(self.tz.clone()),
        )
    }

    /// The latest reset edge at or before `now_ms`, or `None` if there is none.
    pub fn prev_edge(&self, now_ms: i64) -> Option<i64> {
        if let Some(p) = self.memo.at(now_ms) {
            return Some(p.prev);
        }
        let prev = self.walk_prev(now_ms)?;
        self.remember(prev, now_ms);
        Some(prev)
    }

    /// The first reset edge strictly after `now_ms`.
    pub fn next_edge(&self, now_ms: i64) -> Option<i64> {
        if let Some(p) = self.memo.at(now_ms) {
            return Some(p.next);
        }
        let next = self.walk_next(now_ms)?;
        if let Some(prev) = self.walk_prev(now_ms) {
            self.memo.set(Period {
                prev,
                next,
                period_ms: None,
            });
        }
        Some(next)
    }

    /// Memoise the period `[prev, next)` that contains `now_ms`.
    fn remember(&self, prev: i64, now_ms: i64) {
        if let Some(next) = self.walk_next(now_ms) {
            debug_assert!(
                prev <= now_ms && now_ms < next,
                "consecutive edges around now"
            );
            self.memo.set(Period {
                prev,
                next,
                period_ms: None,
            });
        }
    }

    fn walk_prev(&self, now_ms: i64) -> Option<i64> {
        let z = self.zoned(now_ms)?;
        let p = self.cron.find_previous_occurrence(&z, true).ok()?;
        Some(p.timestamp().as_millisecond())
    }

    fn walk_next(&self, now_ms: i64) -> Option<i64> {
        let z = self.zoned(now_ms)?;
        let n = self.cron.find_next_occurrence(&z, false).ok()?;
        Some(n.timestamp().as_millisecond())
    }

    /// An upper bound of one period, in ms (for TTL horizons): the longest of the next
    /// three gaps between edges. The same for every instant of one period (it starts from
    /// the period's next edge), so it is memoised with it.
    pub fn period_ms(&self, now_ms: i64) -> i64 {
        if let Some(p) = self.memo.at(now_ms) {
            if let Some(ms) = p.period_ms {
                return ms;
            }
        }
        let mut t = now_ms;
        let mut longest = 0;
        for _ in 0..3 {
            // The walk itself: the edges past this period are not memoised.
            let Some(n) = self.walk_next(t) else { break };
            if t != now_ms {
                longest = longest.max(n - t);
            }
            t = n;
        }
        let ms = longest.max(1000);
        // Memoise it with this period (learning the period when it is not known yet).
        if self.memo.at(now_ms).is_none() {
            self.prev_edge(now_ms);
        }
        if let Some(p) = self.memo.at(now_ms) {
            self.memo.set(Period {
                period_ms: Some(ms),
                ..p
            });
        }
        ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(s: &str) -> i64 {
        s.parse::<Timestamp>().unwrap().as_millisecond()
    }

    /// A schedule handed out again from the parse cache answers exactly as a fresh parse
    /// does; a bad expression or zone is refused every time.
    #[test]
    fn a_cached_schedule_is_the_parsed_one() {
        let now = ms("2026-03-29T00:30:00Z");
        for (expr, tz) in [
            ("0 0 * * *", "Europe/Berlin"),
            ("0 9 * * MON", "America/New_York"),
        ] {
            let fresh = CalendarReset::parse(expr, tz).unwrap();
            for _ in 0..3 {
                let c = CalendarReset::new(expr, tz).unwrap();
                assert_eq!((c.expr(), c.tz()), (expr, tz));
                assert_eq!(c.next_edge(now), fresh.next_edge(now));
                assert_eq!(c.prev_edge(now), fresh.prev_edge(now));
            }
        }
        for _ in 0..2 {
            assert!(CalendarReset::new("not a cron", "UTC").is_err());
            assert!(CalendarReset::new("0 0 * * *", "Nowhere/Else").is_err());
            assert!(
                CalendarReset::new("0 0 30 2 *", "UTC").is_err(),
                "never fires"
            );
        }
    }

    #[test]
    fn daily_utc_edges() {
        let c = CalendarReset::new("0 0 * * *", "UTC").unwrap();
        let now = ms("2026-11-30T15:04:05.123Z");
        assert_eq!(c.prev_edge(now), Some(ms("2026-11-30T00:00:00Z")));
        assert_eq!(c.next_edge(now), Some(ms("2026-12-01T00:00:00Z")));
        // An edge at exactly now has passed (inclusive), and the next one is a day later.
        let m = ms("2026-12-01T00:00:00Z");
        assert_eq!(c.prev_edge(m), Some(m));
        assert_eq!(c.next_edge(m), Some(ms("2026-12-02T00:00:00Z")));
        assert_eq!(c.period_ms(now), 86_400_000);
    }

    #[test]
    fn midnight_in_berlin_across_spring_forward() {
        // 2026-03-29: clocks go 02:00 → 03:00 in Europe/Berlin; that day has 23 hours.
        let c = CalendarReset::new("0 0 * * *", "Europe/Berlin").unwrap();
        let noon = ms("2026-03-29T10:00:00Z");
        let prev = c.prev_edge(noon).unwrap();
        let next = c.next_edge(noon).unwrap();
        assert_eq!(prev, ms("2026-03-28T23:00:00Z")); // midnight CET (+01:00)
        assert_eq!(next, ms("2026-03-29T22:00:00Z")); // midnight CEST (+02:00)
        assert_eq!(next - prev, 23 * 3_600_000);
    }

    #[test]
    fn fall_back_day_has_25_hours() {
        let c = CalendarReset::new("0 0 * * *", "America/New_York").unwrap();
        let noon = ms("2026-11-01T17:00:00Z");
        let prev = c.prev_edge(noon).unwrap();
        let next = c.next_edge(noon).unwrap();
        assert_eq!(prev, ms("2026-11-01T04:00:00Z"));
        assert_eq!(next, ms("2026-11-02T05:00:00Z"));
        assert_eq!(next - prev, 25 * 3_600_000);
    }

    #[test]
    fn rejects_bad_input() {
        assert!(CalendarReset::new("not cron", "UTC").is_err());
        assert!(CalendarReset::new("0 0 * * *", "Mars/Olympus").is_err());
    }

    /// The memo answers exactly what the walks answer, at every instant around edges and
    /// across periods, asked in any order.
    #[test]
    fn the_memo_answers_what_the_walk_answers() {
        let c = CalendarReset::new("0 0 * * *", "Europe/Berlin").unwrap();
        let t0 = ms("2026-03-28T00:00:00Z");
        let mut instants: Vec<i64> = (0..200).map(|i| t0 + i * 997_001).collect();
        instants.extend([t0 + 82_800_000 - 1, t0 + 82_800_000, t0 + 82_800_000 + 1]);
        instants.reverse();
        instants.extend((0..50).map(|i| t0 + i * 3_600_000));
        for t in instants {
            let fresh = CalendarReset::new("0 0 * * *", "Europe/Berlin").unwrap();
            assert_eq!(c.prev_edge(t), fresh.walk_prev(t), "prev at {t}");
            assert_eq!(c.next_edge(t), fresh.walk_next(t), "next at {t}");
            assert_eq!(c.period_ms(t), fresh.period_ms(t), "period at {t}");
            assert_eq!(c.next_edge(t), fresh.walk_next(t), "next again at {t}");
        }
    }
}

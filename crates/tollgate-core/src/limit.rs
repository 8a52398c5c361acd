//! Limits: rate limits that drip and quotas that reset (calendar or duration window).
//!
//! All amounts are integer millitokens inside; constructors take whole tokens.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::calendar::CalendarReset;
use crate::error::RuleError;
use crate::ids::validate_limit_name;
use crate::schedule::Schedule;

/// Millitokens per token.
pub const MILLI: i64 = 1000;

/// The largest amount, in tokens, any limit or request may name (keeps milli math in i64).
pub const MAX_TOKENS: i64 = 1_000_000_000_000;

/// How a limit gets its allowance back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refill {
    /// Drips `amount` millitokens every `period_ms`, continuously (lazy refill).
    Drip {
        /// Millitokens per period (> 0).
        amount: i64,
        /// Period in ms (> 0).
        period_ms: i64,
    },
    /// Resets to full at every edge of a calendar schedule (boxed: the parsed cron is large).
    Calendar(Box<CalendarReset>),
    /// Resets `reset_after_s` seconds after the first admitted use (idle-restarting window).
    Window {
        /// Window length in seconds (> 0).
        reset_after_s: i64,
    },
}

/// The stored attribute names of a limit's fields (`b_{name}_{field}`, by position in
/// [`crate::bucket::FIELDS`]), each built the first time a write names it and shared by
/// every write after and by every clone of the limit.
#[derive(Default)]
struct Attrs([std::sync::OnceLock<Arc<str>>; crate::bucket::FIELDS.len()]);

/// One limit of a resource.
#[derive(Clone)]
pub struct Limit {
    /// Shared with every evaluation and status made of the limit ([`Limit::shared_name`]).
    name: Arc<str>,
    attrs: Arc<Attrs>,
    capacity: i64,
    refill: Refill,
    schedule: Option<Schedule>,
    /// ADR-151: a soft limit records consumption and never refuses.
    soft: bool,
}

/// Limits are equal when they limit alike (the attribute names built for writes are
/// derived from the name).
impl PartialEq for Limit {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.capacity == other.capacity
            && self.refill == other.refill
            && self.schedule == other.schedule
            && self.soft == other.soft
    }
}

impl Eq for Limit {}

impl std::fmt::Debug for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limit")
            .field("name", &self.name)
            .field("capacity", &self.capacity)
            .field("refill", &self.refill)
            .field("schedule", &self.schedule)
            .field("soft", &self.soft)
            .finish()
    }
}

/// A limit's effective (entity-wide, undivided) parameters at one instant: after its
/// schedule is applied, before the per-shard division.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Effective {
    /// Capacity (millitokens).
    pub capacity: i64,
    /// Drip amount per period (millitokens; 0 for quotas).
    pub refill_amount: i64,
}

fn tokens_to_milli(name: &str, what: &str, tokens: i64) -> Result<i64, RuleError> {
    if tokens <= 0 || tokens > MAX_TOKENS {
        return Err(RuleError::InvalidLimit {
            name: name.into(),
            reason: format!("{what} must be between 1 and {MAX_TOKENS} tokens, not {tokens}"),
        });
    }
    Ok(tokens * MILLI)
}

impl Limit {
    /// A rate limit: `capacity` tokens of burst, refilled by `refill_amount` tokens per
    /// `period`.
    pub fn rate(
        name: &str,
        capacity: i64,
        refill_amount: i64,
        period: Duration,
    ) -> Result<Self, RuleError> {
        validate_limit_name(name)?;
        let period_ms = i64::try_from(period.as_millis()).unwrap_or(i64::MAX);
        if period_ms <= 0 || period_ms > 366 * 86_400_000 {
            return Err(RuleError::InvalidLimit {
                name: name.into(),
                reason: "the refill period must be between 1 ms and 366 days".into(),
            });
        }
        Ok(Limit {
            name: name.into(),
            attrs: Arc::default(),
            capacity: tokens_to_milli(name, "capacity", capacity)?,
            refill: Refill::Drip {
                amount: tokens_to_milli(name, "refill amount", refill_amount)?,
                period_ms,
            },
            schedule: None,
            soft: false,
        })
    }

    /// `rate` tokens per second (capacity = rate).
    pub fn per_second(name: &str, rate: i64) -> Result<Self, RuleError> {
        Self::rate(name, rate, rate, Duration::from_secs(1))
    }
    /// `rate` tokens per minute (capacity = rate).
    pub fn per_minute(name: &str, rate: i64) -> Result<Self, RuleError> {
        Self::rate(name, rate, rate, Duration::from_secs(60))
    }
    /// `rate` tokens per hour (capacity = rate).
    pub fn per_hour(name: &str, rate: i64) -> Result<Self, RuleError> {
        Self::rate(name, rate, rate, Duration::from_secs(3600))
    }
    /// `rate` tokens per day (capacity = rate).
    pub fn per_day(name: &str, rate: i64) -> Result<Self, RuleError> {
        Self::rate(name, rate, rate, Duration::from_secs(86_400))
    }

    /// A quota of `capacity` tokens that resets to full at every edge of `cron` in `tz`.
    pub fn quota_calendar(
        name: &str,
        capacity: i64,
        cron: &str,
        tz: &str,
    ) -> Result<Self, RuleError> {
        validate_limit_name(name)?;
        let cal = CalendarReset::new(cron, tz).map_err(|e| match e {
            RuleError::InvalidLimit { reason, .. } => RuleError::InvalidLimit {
                name: name.into(),
                reason,
            },
            e => e,
        })?;
        Ok(Limit {
            name: name.into(),
            attrs: Arc::default(),
            capacity: tokens_to_milli(name, "capacity", capacity)?,
            refill: Refill::Calendar(Box::new(cal)),
            schedule: None,
            soft: false,
        })
    }

    /// A quota of `capacity` tokens per window that opens at the first admitted use and
    /// ends `reset_after` later (a session cap). Whole seconds, at least 1 s.
    pub fn quota_after(
        name: &str,
        capacity: i64,
        reset_after: Duration,
    ) -> Result<Self, RuleError> {
        validate_limit_name(name)?;
        let s = i64::try_from(reset_after.as_secs()).unwrap_or(i64::MAX);
        if s <= 0 || s > 366 * 86_400 || reset_after.subsec_nanos() != 0 {
            return Err(RuleError::InvalidLimit {
                name: name.into(),
                reason: "reset_after must be whole seconds between 1 s and 366 days".into(),
            });
        }
        Ok(Limit {
            name: name.into(),
            attrs: Arc::default(),
            capacity: tokens_to_milli(name, "capacity", capacity)?,
            refill: Refill::Window { reset_after_s: s },
            schedule: None,
            soft: false,
        })
    }

    /// Build from stored millitoken parameters (config items, bucket items). Enforces the
    /// rule that a limit either drips or resets, never both and never neither.
    pub fn from_parts(
        name: &str,
        capacity_milli: i64,
        refill_amount_milli: i64,
        refill_period_ms: i64,
        calendar: Option<(&str, &str)>,
        reset_after_s: Option<i64>,
    ) -> Result<Self, RuleError> {
        validate_limit_name(name)?;
        let bad = |reason: &str| RuleError::InvalidLimit {
            name: name.into(),
            reason: reason.into(),
        };
        if capacity_milli <= 0 || capacity_milli > MAX_TOKENS * MILLI {
            return Err(bad("capacity out of range"));
        }
        let refill = match (refill_amount_milli > 0, calendar, reset_after_s) {
            (true, None, None) => {
                if refill_period_ms <= 0 || refill_amount_milli > MAX_TOKENS * MILLI {
                    return Err(bad("refill amount or period out of range"));
                }
                Refill::Drip {
                    amount: refill_amount_milli,
                    period_ms: refill_period_ms,
                }
            }
            (false, Some((c, tz)), None) => Refill::Calendar(Box::new(
                CalendarReset::new(c, tz).map_err(|e| bad(&e.to_string()))?,
            )),
            (false, None, Some(s)) if s > 0 => Refill::Window { reset_after_s: s },
            (false, None, None) => return Err(bad("a limit must refill or reset")),
            (true, _, _) => return Err(bad("a limit cannot both refill and reset")),
            (false, Some(_), Some(_)) => {
                return Err(bad("reset_after and a calendar reset are exclusive"))
            }
            (false, None, Some(_)) => return Err(bad("reset_after must be positive")),
        };
        Ok(Limit {
            name: name.into(),
            attrs: Arc::default(),
            capacity: capacity_milli,
            refill,
            schedule: None,
            soft: false,
        })
    }

    /// Attach a time-of-day schedule (ADR-135) that replaces the capacity (and, for a
    /// dripping limit, the rate) while one of its entries applies. A quota's entries may not
    /// set a rate (ADR-137: a quota never drips).
    pub fn with_schedule(mut self, schedule: Schedule) -> Result<Self, RuleError> {
        if self.is_quota() && schedule.entries().iter().any(|e| e.rate_milli().is_some()) {
            return Err(RuleError::InvalidLimit {
                name: self.name.to_string(),
                reason: "a quota's schedule sets a capacity only, never a rate".into(),
            });
        }
        self.schedule = Some(schedule);
        Ok(self)
    }

    /// Make the limit soft (ADR-151, shadow mode): its consumption is recorded — the balance
    /// may go negative — and it never refuses a request. `false` enforces it again.
    pub fn with_soft(mut self, soft: bool) -> Self {
        self.soft = soft;
        self
    }

    /// Whether the limit is soft (ADR-151): recorded, never refusing.
    pub fn is_soft(&self) -> bool {
        self.soft
    }

    /// The time-of-day schedule, if any.
    pub fn schedule(&self) -> Option<&Schedule> {
        self.schedule.as_ref()
    }

    /// Rule "effective parameters" (ADR-135, §4.1): the capacity and drip amount at `now` —
    /// the schedule's entry in force, else the base values. The per-shard division
    /// (`C // S`, `ra // S`) is applied to these, never before.
    pub fn effective(&self, now_ms: i64) -> Effective {
        let base = Effective {
            capacity: self.capacity,
            refill_amount: self.ra(),
        };
        match self.schedule.as_ref().and_then(|s| s.active(now_ms)) {
            None => base,
            Some(e) => Effective {
                capacity: e.capacity_milli(),
                refill_amount: if self.is_quota() {
                    0
                } else {
                    e.rate_milli().unwrap_or(base.refill_amount)
                },
            },
        }
    }

    /// The next instant after `now_ms` at which the effective parameters may change (the
    /// schedule's next boundary), `None` when unscheduled or never.
    pub fn next_boundary(&self, now_ms: i64) -> Option<i64> {
        self.schedule.as_ref().and_then(|s| s.next_boundary(now_ms))
    }

    /// The limit's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The name, shared with the limit (copying it copies no text).
    pub fn shared_name(&self) -> crate::expr::Name {
        crate::expr::Name::Shared(Arc::clone(&self.name))
    }
    /// The stored attribute name of this limit's `field` (one of [`crate::bucket::field`]),
    /// shared: `b_{name}_{field}`.
    pub fn attr(&self, field: &'static str) -> crate::expr::Name {
        match crate::bucket::FIELDS.iter().position(|f| *f == field) {
            Some(i) => crate::expr::Name::Shared(Arc::clone(
                self.attrs.0[i].get_or_init(|| Arc::from(crate::keys::battr(&self.name, field))),
            )),
            None => crate::expr::Name::Owned(crate::keys::battr(&self.name, field)),
        }
    }
    /// Capacity in millitokens (entity-wide, never divided by shards).
    pub fn capacity_milli(&self) -> i64 {
        self.capacity
    }
    /// How it refills.
    pub fn refill(&self) -> &Refill {
        &self.refill
    }
    /// Whether this is a quota (resets rather than drips).
    pub fn is_quota(&self) -> bool {
        !matches!(self.refill, Refill::Drip { .. })
    }
    /// Stored `ra` (0 for quotas).
    pub fn ra(&self) -> i64 {
        match self.refill {
            Refill::Drip { amount, .. } => amount,
            _ => 0,
        }
    }
    /// Stored `rp` (the window length in ms for windows, 0 for calendars).
    pub fn rp(&self) -> i64 {
        match &self.refill {
            Refill::Drip { period_ms, .. } => *period_ms,
            Refill::Window { reset_after_s } => reset_after_s * 1000,
            Refill::Calendar(_) => 0,
        }
    }
    /// The window length in seconds, for duration quotas.
    pub fn rsa(&self) -> Option<i64> {
        match self.refill {
            Refill::Window { reset_after_s } => Some(reset_after_s),
            _ => None,
        }
    }
    /// The calendar schedule, for calendar quotas.
    pub fn calendar(&self) -> Option<&CalendarReset> {
        match &self.refill {
            Refill::Calendar(c) => Some(c),
            _ => None,
        }
    }
    /// A compact description for tools and errors.
    pub fn describe(&self) -> String {
        let d = self.describe_scheduled();
        if self.soft {
            format!("{d} (soft: recorded, never refuses)")
        } else {
            d
        }
    }

    fn describe_scheduled(&self) -> String {
        match &self.schedule {
            None => self.describe_base(),
            Some(s) => format!(
                "{}; scheduled in {}: {}",
                self.describe_base(),
                s.tz(),
                s.entry_texts().join("; ")
            ),
        }
    }

    fn describe_base(&self) -> String {
        let cap = self.capacity / MILLI;
        match &self.refill {
            Refill::Drip { amount, period_ms } => {
                format!(
                    "{}: {cap} burst, {} per {} ms",
                    self.name,
                    amount / MILLI,
                    period_ms
                )
            }
            Refill::Calendar(c) => {
                format!(
                    "{}: {cap} per period, resets at '{}' {}",
                    self.name,
                    c.expr(),
                    c.tz()
                )
            }
            Refill::Window { reset_after_s } => {
                format!(
                    "{}: {cap} per window of {reset_after_s} s after first use",
                    self.name
                )
            }
        }
    }
}

/// Name a schedule error after the limit it belongs to.
pub fn name_error(name: &str, e: RuleError) -> RuleError {
    match e {
        RuleError::InvalidLimit { reason, .. } => RuleError::InvalidLimit {
            name: name.into(),
            reason,
        },
        e => e,
    }
}

/// A serialisable description of a limit (config items, HTTP and CLI).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitSpec {
    /// Name.
    pub name: String,
    /// Capacity in tokens.
    pub capacity: i64,
    /// Refill amount in tokens per period (rate limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refill_amount: Option<i64>,
    /// Refill period in ms (rate limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refill_period_ms: Option<i64>,
    /// Calendar reset cron (quotas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_cron: Option<String>,
    /// Calendar reset time zone (default UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_tz: Option<String>,
    /// Duration window length in seconds (quotas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_after_s: Option<i64>,
    /// Time-of-day schedule entries, `DAYS HH:MM-HH:MM CAPACITY[/RATE]` (ADR-135; see
    /// [`crate::schedule`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Vec<String>>,
    /// The schedule's time zone (default UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_tz: Option<String>,
    /// ADR-151: a soft limit records consumption and never refuses (shadow mode).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub soft: bool,
}

impl LimitSpec {
    /// Validate into a [`Limit`].
    pub fn to_limit(&self) -> Result<Limit, RuleError> {
        let l = self.base_limit()?.with_soft(self.soft);
        match &self.schedule {
            None => Ok(l),
            Some(entries) => {
                let tz = self.schedule_tz.as_deref().unwrap_or("UTC");
                let s = Schedule::new(entries, tz).map_err(|e| name_error(&self.name, e))?;
                l.with_schedule(s)
            }
        }
    }

    fn base_limit(&self) -> Result<Limit, RuleError> {
        match (
            self.refill_amount,
            self.reset_cron.as_deref(),
            self.reset_after_s,
        ) {
            (Some(a), None, None) => {
                let p = self.refill_period_ms.unwrap_or(60_000);
                if p <= 0 {
                    return Err(RuleError::InvalidLimit {
                        name: self.name.clone(),
                        reason: "refill_period_ms must be positive".into(),
                    });
                }
                Limit::rate(
                    &self.name,
                    self.capacity,
                    a,
                    Duration::from_millis(p as u64),
                )
            }
            (None, Some(c), None) => Limit::quota_calendar(
                &self.name,
                self.capacity,
                c,
                self.reset_tz.as_deref().unwrap_or("UTC"),
            ),
            (None, None, Some(s)) if s > 0 => {
                Limit::quota_after(&self.name, self.capacity, Duration::from_secs(s as u64))
            }
            (None, None, None) => Err(RuleError::InvalidLimit {
                name: self.name.clone(),
                reason:
                    "a limit must refill (refill_amount) or reset (reset_cron or reset_after_s)"
                        .into(),
            }),
            _ => Err(RuleError::InvalidLimit {
                name: self.name.clone(),
                reason: "choose exactly one of refill_amount, reset_cron, reset_after_s (positive)"
                    .into(),
            }),
        }
    }
}

impl From<&Limit> for LimitSpec {
    fn from(l: &Limit) -> Self {
        let mut s = LimitSpec {
            name: l.name.to_string(),
            capacity: l.capacity / MILLI,
            refill_amount: None,
            refill_period_ms: None,
            reset_cron: None,
            reset_tz: None,
            reset_after_s: None,
            schedule: l.schedule.as_ref().map(Schedule::entry_texts),
            schedule_tz: l.schedule.as_ref().map(|s| s.tz().to_string()),
            soft: l.soft,
        };
        match &l.refill {
            Refill::Drip { amount, period_ms } => {
                s.refill_amount = Some(amount / MILLI);
                s.refill_period_ms = Some(*period_ms);
            }
            Refill::Calendar(c) => {
                s.reset_cron = Some(c.expr().into());
                s.reset_tz = Some(c.tz().into());
            }
            Refill::Window { reset_after_s } => s.reset_after_s = Some(*reset_after_s),
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors() {
        let l = Limit::per_minute("rpm", 100).unwrap();
        assert_eq!(l.capacity_milli(), 100_000);
        assert_eq!(l.ra(), 100_000);
        assert_eq!(l.rp(), 60_000);
        assert!(!l.is_quota());
        let q = Limit::quota_after("session", 10, Duration::from_secs(5 * 3600)).unwrap();
        assert_eq!(q.rsa(), Some(18_000));
        assert_eq!(q.ra(), 0);
        assert!(q.is_quota());
    }

    /// Scenario 84: ra = 0 without a reset, ra > 0 with a reset, and reset_after with a
    /// cron reset are all refused.
    #[test]
    fn refill_xor_reset() {
        assert!(Limit::from_parts("q", 1000, 0, 0, None, None).is_err());
        assert!(Limit::from_parts("q", 1000, 5, 1000, Some(("0 0 * * *", "UTC")), None).is_err());
        assert!(Limit::from_parts("q", 1000, 0, 0, Some(("0 0 * * *", "UTC")), Some(60)).is_err());
        assert!(Limit::from_parts("q", 1000, 0, 0, Some(("0 0 * * *", "UTC")), None).is_ok());
        assert!(Limit::from_parts("q", 1000, 0, 0, None, Some(60)).is_ok());
    }

    #[test]
    fn bad_numbers_and_names() {
        assert!(Limit::per_minute("rpm", 0).is_err());
        assert!(Limit::per_minute("rpm", -5).is_err());
        assert!(Limit::per_minute("rpm", MAX_TOKENS + 1).is_err());
        assert!(Limit::per_minute("wcu", 5).is_err());
        assert!(Limit::rate("r", 5, 5, Duration::from_millis(0)).is_err());
        assert!(Limit::quota_after("s", 5, Duration::from_millis(1500)).is_err());
    }

    /// ADR-135: the schedule is applied to the base values (first match, else the base);
    /// a quota's schedule may not set a rate; the spec form round-trips.
    #[test]
    fn effective_parameters_and_schedule_validation() {
        use crate::schedule::Schedule;
        let l = Limit::per_minute("rpm", 100)
            .unwrap()
            .with_schedule(
                Schedule::new(&["* 22:00-06:00 10", "sat 06:00-22:00 50/20"], "UTC").unwrap(),
            )
            .unwrap();
        let at = |s: &str| s.parse::<jiff::Timestamp>().unwrap().as_millisecond();
        // 2026-11-30 is a Monday; 2026-11-28 a Saturday.
        let e = |s: &str| {
            let p = l.effective(at(s));
            (p.capacity, p.refill_amount)
        };
        assert_eq!(e("2026-11-30T12:00:00Z"), (100_000, 100_000));
        assert_eq!(
            e("2026-11-30T23:00:00Z"),
            (10_000, 100_000),
            "no rate: base rate"
        );
        assert_eq!(e("2026-11-28T12:00:00Z"), (50_000, 20_000));
        assert_eq!(
            l.next_boundary(at("2026-11-30T12:00:00Z")),
            Some(at("2026-11-30T22:00:00Z"))
        );
        assert_eq!(LimitSpec::from(&l).to_limit().unwrap(), l);
        let q = Limit::quota_calendar("rpd", 1000, "0 0 * * *", "UTC").unwrap();
        let rated = Schedule::new(&["sat,sun 00:00-24:00 500/5"], "UTC").unwrap();
        let err = q.clone().with_schedule(rated).unwrap_err().to_string();
        assert!(err.contains("rpd") && err.contains("rate"), "{err}");
        let q = q
            .with_schedule(Schedule::new(&["sat,sun 00:00-24:00 500"], "UTC").unwrap())
            .unwrap();
        assert_eq!(q.effective(at("2026-11-28T12:00:00Z")).capacity, 500_000);
        assert_eq!(q.effective(at("2026-11-28T12:00:00Z")).refill_amount, 0);
        let spec = LimitSpec {
            schedule: Some(vec!["* 25:00-06:00 10".into()]),
            ..LimitSpec::from(&l)
        };
        let err = spec.to_limit().unwrap_err().to_string();
        assert!(err.contains("rpm") && err.contains("25:00"), "{err}");
    }

    #[test]
    fn spec_round_trip() {
        for l in [
            Limit::per_minute("rpm", 100).unwrap(),
            Limit::quota_calendar("rpd", 1000, "0 0 * * *", "Europe/Berlin").unwrap(),
            Limit::quota_after("session", 10, Duration::from_secs(18_000)).unwrap(),
        ] {
            assert_eq!(LimitSpec::from(&l).to_limit().unwrap(), l);
        }
    }
}

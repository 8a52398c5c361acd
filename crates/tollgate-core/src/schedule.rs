//! Scheduled limits (ADR-135): a time-of-day schedule that changes a limit's effective
//! capacity (and drip rate) at wall-clock boundaries in an IANA time zone.
//!
//! # What a schedule looks like
//!
//! A schedule is an ordered list of entries and one time zone. Each entry is
//!
//! ```text
//! DAYS HH:MM-HH:MM CAPACITY[/RATE]
//! ```
//!
//! - `DAYS`: `*` (every day), a day (`mon`), a list (`sat,sun`) or ranges (`mon-fri`,
//!   `fri-mon` wraps past Sunday). Days are those on which the window *starts*.
//! - `HH:MM-HH:MM`: a half-open window of local wall-clock time, `[start, end)`. `24:00` is
//!   allowed as an end. An end before the start wraps past midnight (`22:00-06:00` runs
//!   from 22:00 on each listed day to 06:00 the next morning). A start equal to the end is
//!   refused (use `00:00-24:00` for a whole day).
//! - `CAPACITY[/RATE]`: whole tokens. The capacity replaces the limit's capacity while the
//!   entry applies; the rate (tokens per the limit's own refill period) replaces its drip
//!   amount, and without one the limit keeps its base rate. A quota takes no rate.
//!
//! Entries are level-triggered: the first entry whose window contains `now` applies; when
//! none does, the limit's base parameters apply. An instant exactly at a window's start is
//! inside it, exactly at its end is outside (half-open).
//!
//! Wall-clock semantics across DST: the entry is matched against the local time at `now`,
//! so on a spring-forward day a window starting inside the skipped hour begins at the
//! transition, and on a fall-back day the repeated hour is matched twice.
//!
//! # Storage
//!
//! [`Schedule::encode`] renders `1|<zone>|<entry>;<entry>…` — a one-digit version, the zone,
//! and the canonical entries. The same text is stored on config items (`l_{n}_sched` /
//! `w_{n}_sched`) and denormalised onto bucket items (`b_{n}_sched`); [`Schedule::decode`]
//! refuses an unknown version or anything that does not parse.

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

use crate::error::RuleError;
use crate::limit::{MAX_TOKENS, MILLI};

/// The stored encoding's version digit.
pub const ENCODING_VERSION: char = '1';

/// The most entries one schedule may hold.
pub const MAX_ENTRIES: usize = 32;

const DAY_NAMES: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
const ALL_DAYS: u8 = 0b111_1111;
const DAY_MIN: u16 = 1440;

/// One entry: the days its window starts on, the window, and the parameters it sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Bit `i` set = the window starts on weekday `i` (Monday = 0).
    days: u8,
    /// Start, minutes after local midnight, `0..1440`.
    start: u16,
    /// End, minutes after local midnight, `1..=1440`; `end <= start` wraps past midnight.
    end: u16,
    /// Capacity while the entry applies (millitokens).
    capacity: i64,
    /// Drip amount per period while the entry applies (millitokens); `None` = base rate.
    rate: Option<i64>,
}

impl Entry {
    /// Capacity while the entry applies (millitokens).
    pub fn capacity_milli(&self) -> i64 {
        self.capacity
    }
    /// Drip amount while the entry applies (millitokens), when it sets one.
    pub fn rate_milli(&self) -> Option<i64> {
        self.rate
    }

    fn wraps(&self) -> bool {
        self.end <= self.start
    }

    fn on(&self, weekday: usize) -> bool {
        self.days & (1 << weekday) != 0
    }

    /// Whether local time (`weekday`, time of day in ms) falls inside the window.
    fn contains(&self, weekday: usize, tod_ms: i64) -> bool {
        let start = self.start as i64 * 60_000;
        let end = self.end as i64 * 60_000;
        if !self.wraps() {
            self.on(weekday) && start <= tod_ms && tod_ms < end
        } else {
            (self.on(weekday) && tod_ms >= start) || (self.on((weekday + 6) % 7) && tod_ms < end)
        }
    }

    fn render(&self) -> String {
        let days = if self.days == ALL_DAYS {
            "*".to_string()
        } else {
            (0..7)
                .filter(|d| self.on(*d))
                .map(|d| DAY_NAMES[d])
                .collect::<Vec<_>>()
                .join(",")
        };
        let hm = |m: u16| format!("{:02}:{:02}", m / 60, m % 60);
        let params = match self.rate {
            Some(r) => format!("{}/{}", self.capacity / MILLI, r / MILLI),
            None => format!("{}", self.capacity / MILLI),
        };
        format!("{days} {}-{} {params}", hm(self.start), hm(self.end))
    }
}

/// A time-of-day schedule (ADR-135). See the module documentation for the format.
#[derive(Debug, Clone)]
pub struct Schedule {
    tz_name: String,
    tz: TimeZone,
    entries: Vec<Entry>,
}

impl PartialEq for Schedule {
    fn eq(&self, o: &Self) -> bool {
        self.tz_name == o.tz_name && self.entries == o.entries
    }
}
impl Eq for Schedule {}

fn bad(reason: impl Into<String>) -> RuleError {
    RuleError::InvalidLimit {
        name: String::new(),
        reason: reason.into(),
    }
}

fn parse_day(s: &str) -> Result<usize, RuleError> {
    DAY_NAMES
        .iter()
        .position(|d| d.eq_ignore_ascii_case(s))
        .ok_or_else(|| bad(format!("schedule: unknown day {s:?} (mon … sun)")))
}

fn parse_days(s: &str) -> Result<u8, RuleError> {
    if s == "*" {
        return Ok(ALL_DAYS);
    }
    let mut days = 0u8;
    for part in s.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (mut d, b) = (parse_day(a)?, parse_day(b)?);
                loop {
                    days |= 1 << d;
                    if d == b {
                        break;
                    }
                    d = (d + 1) % 7;
                }
            }
            None => days |= 1 << parse_day(part)?,
        }
    }
    Ok(days)
}

fn parse_hm(s: &str, end: bool) -> Result<u16, RuleError> {
    let err = || bad(format!("schedule: time {s:?} is not HH:MM"));
    let (h, m) = s.split_once(':').ok_or_else(err)?;
    if h.len() != 2 || m.len() != 2 {
        return Err(err());
    }
    let h: u16 = h.parse().map_err(|_| err())?;
    let m: u16 = m.parse().map_err(|_| err())?;
    let v = h * 60 + m;
    if m > 59 || v > DAY_MIN || (v == DAY_MIN && !end) {
        return Err(err());
    }
    Ok(v)
}

fn parse_tokens(s: &str, what: &str) -> Result<i64, RuleError> {
    let t: i64 = s
        .parse()
        .map_err(|_| bad(format!("schedule: {what} {s:?} is not a whole number")))?;
    if t <= 0 || t > MAX_TOKENS {
        return Err(bad(format!(
            "schedule: {what} must be between 1 and {MAX_TOKENS} tokens, not {t}"
        )));
    }
    Ok(t * MILLI)
}

fn parse_entry(s: &str) -> Result<Entry, RuleError> {
    let parts: Vec<&str> = s.split_whitespace().collect();
    let [days, window, params] = parts.as_slice() else {
        return Err(bad(format!(
            "schedule: entry {s:?} is not \"DAYS HH:MM-HH:MM CAPACITY[/RATE]\""
        )));
    };
    let (a, b) = window
        .split_once('-')
        .ok_or_else(|| bad(format!("schedule: window {window:?} is not HH:MM-HH:MM")))?;
    let (start, end) = (parse_hm(a, false)?, parse_hm(b, true)?);
    if start == end || (start == 0 && end == 0) {
        return Err(bad(format!("schedule: window {window:?} is empty")));
    }
    let (cap, rate) = match params.split_once('/') {
        Some((c, r)) => (parse_tokens(c, "capacity")?, Some(parse_tokens(r, "rate")?)),
        None => (parse_tokens(params, "capacity")?, None),
    };
    Ok(Entry {
        days: parse_days(days)?,
        start,
        end: if end == 0 { DAY_MIN } else { end },
        capacity: cap,
        rate,
    })
}

impl Schedule {
    /// Parse entries (in order; the first that applies wins) evaluated in the IANA zone `tz`.
    /// Refuses an empty list, more than [`MAX_ENTRIES`], an unknown zone, and any entry that
    /// does not parse or has an empty window.
    pub fn new<S: AsRef<str>>(entries: &[S], tz: &str) -> Result<Self, RuleError> {
        if entries.is_empty() || entries.len() > MAX_ENTRIES {
            return Err(bad(format!(
                "schedule: between 1 and {MAX_ENTRIES} entries, not {}",
                entries.len()
            )));
        }
        let zone =
            TimeZone::get(tz).map_err(|e| bad(format!("schedule: time zone {tz:?}: {e}")))?;
        let entries = entries
            .iter()
            .map(|e| parse_entry(e.as_ref().trim()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Schedule {
            tz_name: tz.to_string(),
            tz: zone,
            entries,
        })
    }

    /// The time zone name.
    pub fn tz(&self) -> &str {
        &self.tz_name
    }

    /// The entries, in order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The entries in canonical text (what [`Schedule::new`] accepts).
    pub fn entry_texts(&self) -> Vec<String> {
        self.entries.iter().map(Entry::render).collect()
    }

    /// The stored encoding: `1|<zone>|<entry>;<entry>…` (issue #515: versioned).
    pub fn encode(&self) -> String {
        format!(
            "{ENCODING_VERSION}|{}|{}",
            self.tz_name,
            self.entry_texts().join(";")
        )
    }

    /// Decode a stored schedule. An unknown version or anything unparseable is an error.
    pub fn decode(s: &str) -> Result<Self, RuleError> {
        let mut parts = s.splitn(3, '|');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(v), Some(tz), Some(entries)) if v.len() == 1 => {
                if !v.starts_with(ENCODING_VERSION) {
                    return Err(bad(format!("schedule: unknown encoding version {v:?}")));
                }
                let list: Vec<&str> = entries.split(';').collect();
                Schedule::new(&list, tz)
            }
            _ => Err(bad("schedule: not a versioned encoding (1|zone|entries)")),
        }
    }

    /// The entry in force at `now_ms` (the first that contains the local time), or `None`
    /// when the base parameters apply.
    pub fn active(&self, now_ms: i64) -> Option<&Entry> {
        let ts = Timestamp::from_millisecond(now_ms).ok()?;
        let dt = self.tz.to_datetime(ts);
        let weekday = dt.weekday().to_monday_zero_offset() as usize;
        let t = dt.time();
        let tod_ms = (t.hour() as i64 * 60 + t.minute() as i64) * 60_000
            + t.second() as i64 * 1000
            + t.subsec_nanosecond() as i64 / 1_000_000;
        self.entries.iter().find(|e| e.contains(weekday, tod_ms))
    }

    /// Rule "next schedule boundary" (ADR-135, feeds `vu`): the first instant strictly
    /// after `now_ms` at which the entry in force differs from the one at `now_ms`, or
    /// `None` when it never changes. Candidates are every entry's start and end on the days
    /// around `now` (both instants of a wall-clock time a DST fold repeats) and the zone's
    /// transitions (a window starting in a skipped hour begins at the transition); the
    /// first candidate whose entry differs is the boundary. The weekly cycle makes an
    /// eight-day horizon enough.
    pub fn next_boundary(&self, now_ms: i64) -> Option<i64> {
        let ts = Timestamp::from_millisecond(now_ms).ok()?;
        let today = self.tz.to_datetime(ts).date();
        let horizon = now_ms.saturating_add(9 * 86_400_000);
        let mut cands: Vec<i64> = Vec::new();
        for offset in -1..=9i64 {
            let Ok(day) = today.checked_add(offset.days()) else {
                continue;
            };
            for e in &self.entries {
                for m in [e.start, e.end] {
                    cands.extend(self.instants(day, m));
                }
            }
        }
        let horizon_ts = Timestamp::from_millisecond(horizon).ok()?;
        for tr in self.tz.following(ts) {
            if tr.timestamp() > horizon_ts {
                break;
            }
            cands.push(tr.timestamp().as_millisecond());
        }
        cands.retain(|c| *c > now_ms && *c <= horizon);
        cands.sort_unstable();
        cands.dedup();
        let params = |t: i64| self.active(t).map(|e| (e.capacity, e.rate));
        let here = params(now_ms);
        cands.into_iter().find(|c| params(*c) != here)
    }

    /// Every instant at which local `day` + `minute` occurs (0, 1 or 2 of them).
    fn instants(&self, day: Date, minute: u16) -> Vec<i64> {
        let dt: DateTime = if minute >= DAY_MIN {
            match day.checked_add(1.days()) {
                Ok(d) => d.to_datetime(Time::midnight()),
                Err(_) => return Vec::new(),
            }
        } else {
            match Time::new((minute / 60) as i8, (minute % 60) as i8, 0, 0) {
                Ok(t) => day.to_datetime(t),
                Err(_) => return Vec::new(),
            }
        };
        let amb = self.tz.to_ambiguous_timestamp(dt);
        [amb.earlier(), amb.later()]
            .into_iter()
            .filter_map(|t| t.ok().map(|t| t.as_millisecond()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(s: &str) -> i64 {
        s.parse::<Timestamp>().unwrap().as_millisecond()
    }

    fn day_night() -> Schedule {
        Schedule::new(&["* 22:00-06:00 10/10"], "UTC").unwrap()
    }

    #[test]
    fn active_entry_is_half_open() {
        let s = day_night();
        assert_eq!(s.active(ms("2026-11-30T21:59:59.999Z")), None);
        // Exactly at the boundary is the new regime.
        assert_eq!(
            s.active(ms("2026-11-30T22:00:00Z"))
                .map(|e| e.capacity_milli()),
            Some(10_000)
        );
        assert!(s.active(ms("2026-12-01T05:59:59.999Z")).is_some());
        assert_eq!(s.active(ms("2026-12-01T06:00:00Z")), None);
    }

    #[test]
    fn next_boundary_day_and_night() {
        let s = day_night();
        let noon = ms("2026-11-30T12:00:00Z");
        assert_eq!(s.next_boundary(noon), Some(ms("2026-11-30T22:00:00Z")));
        // At the boundary itself the next one is the end of the night, not the same instant.
        let b = ms("2026-11-30T22:00:00Z");
        assert_eq!(s.next_boundary(b), Some(ms("2026-12-01T06:00:00Z")));
        assert_eq!(s.next_boundary(b - 1), Some(b));
    }

    #[test]
    fn first_match_wins_and_weekdays() {
        // Weekends 50 all day; weekdays 100 in office hours; otherwise the base.
        let s = Schedule::new(
            &["sat,sun 00:00-24:00 50", "mon-fri 08:00-18:00 100/20"],
            "UTC",
        )
        .unwrap();
        // 2026-11-28 is a Saturday.
        let sat = ms("2026-11-28T09:00:00Z");
        assert_eq!(s.active(sat).map(|e| e.capacity_milli()), Some(50_000));
        assert_eq!(s.next_boundary(sat), Some(ms("2026-11-30T00:00:00Z")));
        let mon = ms("2026-11-30T00:00:00Z");
        assert_eq!(s.active(mon), None);
        assert_eq!(s.next_boundary(mon), Some(ms("2026-11-30T08:00:00Z")));
        let e = s.active(ms("2026-11-30T08:00:00Z")).unwrap();
        assert_eq!(
            (e.capacity_milli(), e.rate_milli()),
            (100_000, Some(20_000))
        );
        // Adjacent windows with equal entries: Sat 00:00-24:00 then Sun 00:00-24:00 is one
        // regime, so Saturday 24:00 is no boundary.
        assert_eq!(
            s.next_boundary(ms("2026-11-28T23:00:00Z")),
            Some(ms("2026-11-30T00:00:00Z"))
        );
    }

    #[test]
    fn always_on_schedule_has_no_boundary() {
        let s = Schedule::new(&["* 00:00-24:00 5"], "UTC").unwrap();
        assert_eq!(s.next_boundary(ms("2026-11-30T12:00:00Z")), None);
    }

    /// DST in Europe/Berlin: 08:00 local is 07:00Z in winter and 06:00Z in summer; on the
    /// spring-forward day the night entry (22:00-06:00) still ends at 06:00 local = 04:00Z.
    #[test]
    fn berlin_dst_boundaries() {
        let s = Schedule::new(&["* 22:00-06:00 10"], "Europe/Berlin").unwrap();
        // Saturday 2026-03-28 noon CET: night starts 22:00 CET = 21:00Z.
        assert_eq!(
            s.next_boundary(ms("2026-03-28T11:00:00Z")),
            Some(ms("2026-03-28T21:00:00Z"))
        );
        // The night spans the 02:00 → 03:00 jump; it ends 06:00 CEST = 04:00Z: 7 h long.
        assert_eq!(
            s.next_boundary(ms("2026-03-28T21:00:00Z")),
            Some(ms("2026-03-29T04:00:00Z"))
        );
        // Fall back (2026-10-25, 03:00 CEST → 02:00 CET): the night ends 06:00 CET = 05:00Z.
        assert_eq!(
            s.next_boundary(ms("2026-10-24T21:00:00Z")),
            Some(ms("2026-10-25T05:00:00Z"))
        );
    }

    /// Oracle: across both Berlin DST days, the computed boundary equals a minute-by-minute
    /// scan for the first change of the entry in force, including windows that start in
    /// the skipped hour or end in the repeated one.
    #[test]
    fn boundary_matches_a_minute_scan_across_dst() {
        let s = Schedule::new(
            &[
                "* 02:30-02:45 7",
                "* 01:00-02:15 8",
                "mon-fri 08:00-18:00 9",
            ],
            "Europe/Berlin",
        )
        .unwrap();
        for start in ["2026-03-28T12:00:00Z", "2026-10-24T12:00:00Z"] {
            let mut t = ms(start);
            for _ in 0..12 {
                let here = s.active(t).map(|e| e.capacity_milli());
                let mut scan = t + 60_000;
                while s.active(scan).map(|e| e.capacity_milli()) == here {
                    scan += 60_000;
                }
                let b = s.next_boundary(t).unwrap();
                assert_eq!(b, scan, "from {t}");
                t = b;
            }
        }
    }

    #[test]
    fn encoding_round_trips_and_refuses_garbage() {
        let s = Schedule::new(
            &["mon-fri 08:00-20:00 100/100", "fri-mon 22:00-06:00 10"],
            "Europe/Berlin",
        )
        .unwrap();
        let enc = s.encode();
        assert_eq!(
            enc,
            "1|Europe/Berlin|mon,tue,wed,thu,fri 08:00-20:00 100/100;mon,fri,sat,sun 22:00-06:00 10"
        );
        assert_eq!(Schedule::decode(&enc).unwrap(), s);
        for bad in [
            "",
            "-",
            "2|UTC|* 00:00-01:00 5",
            "1|Mars/Olympus|* 00:00-01:00 5",
            "1|UTC|* 00:00-01:00",
            "1|UTC|",
        ] {
            assert!(Schedule::decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn refuses_entries_that_cannot_be_evaluated() {
        for e in [
            "* 08:00-08:00 5",
            "* 24:00-08:00 5",
            "* 8:00-09:00 5",
            "* 08:60-09:00 5",
            "xyz 08:00-09:00 5",
            "* 08:00-09:00 0",
            "* 08:00-09:00 5/0",
            "* 08:00-09:00 1.5",
            "* 08:00 5",
        ] {
            assert!(Schedule::new(&[e], "UTC").is_err(), "{e:?}");
        }
        assert!(Schedule::new::<&str>(&[], "UTC").is_err());
    }
}

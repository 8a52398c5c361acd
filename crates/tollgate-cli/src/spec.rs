//! The command line's limit syntax, amounts and durations.
//!
//! ```text
//! NAME:rate=AMOUNT/PERIOD[,burst=TOKENS]          a rate limit (token bucket)
//! NAME:quota=TOKENS,cron="EXPR"[,tz=ZONE]         a quota reset on a calendar (default tz UTC)
//! NAME:quota=TOKENS,after=DURATION                a quota whose window opens at first use
//! …,soft                                          any of them soft (ADR-151, shadow mode):
//!                                                 consumption recorded, never refused
//!
//! Any of them may add ,schedule="ENTRY[;ENTRY…]" (ADR-135, time-of-day capacities; each
//! ENTRY is `DAYS HH:MM-HH:MM CAPACITY[/RATE]`), evaluated in tz=ZONE (default UTC; a
//! cron quota's zone is the schedule's too).
//!
//! PERIOD    s | sec | second | min | minute | h | hour | d | day, or a DURATION
//! DURATION  whole numbers with units ms, s, m, h, d: 500ms, 90s, 5h, 1h30m
//! ```
//!
//! Examples: `rpm:rate=60/min`, `tpm:rate=100000/min,burst=200000`,
//! `rpd:quota=1000,cron="0 0 * * *",tz=Europe/Berlin`, `session:quota=10,after=5h`.
//! `burst` is the bucket's capacity (default: the refill amount).

use std::time::Duration;

use tollgate::Limit;
use tollgate_core::Refill;

/// Parse a duration such as `500ms`, `90s`, `5h`, `1h30m`, `2d`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    let mut total_ms: u64 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.chars().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return Err(format!("bad duration {s:?}: expected a number at {rest:?}"));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("bad duration {s:?}: number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest.chars().take_while(|c| c.is_ascii_alphabetic()).count();
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let ms_per: u64 = match unit {
            "ms" => 1,
            "s" | "sec" => 1000,
            "m" | "min" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => {
                return Err(format!(
                    "bad duration {s:?}: a unit is needed (ms, s, m, h, d)"
                ))
            }
            u => {
                return Err(format!(
                    "bad duration {s:?}: unknown unit {u:?} (ms, s, m, h, d)"
                ))
            }
        };
        total_ms = n
            .checked_mul(ms_per)
            .and_then(|v| total_ms.checked_add(v))
            .ok_or_else(|| format!("bad duration {s:?}: too long"))?;
    }
    Ok(Duration::from_millis(total_ms))
}

/// Parse a size in bytes: `65536`, `64KiB`, `1MiB` (also `K`/`KB`/`M`/`MB`, all binary).
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let digits = t.chars().take_while(|c| c.is_ascii_digit()).count();
    let (n, unit) = t.split_at(digits);
    let n: usize = n
        .parse()
        .map_err(|_| format!("bad size {s:?}: expected a number of bytes, e.g. 65536 or 64KiB"))?;
    let per: usize = match unit.trim() {
        "" | "B" => 1,
        "K" | "KB" | "KiB" => 1024,
        "M" | "MB" | "MiB" => 1024 * 1024,
        u => return Err(format!("bad size {s:?}: unknown unit {u:?} (B, KiB, MiB)")),
    };
    n.checked_mul(per)
        .filter(|&b| b > 0)
        .ok_or_else(|| format!("bad size {s:?}: must be positive and fit in memory"))
}

/// A duration for people: `850ms`, `29.9s`, `4m 30s`, `1h 5m 7s`, `2d 1h 3m` — at most three
/// units, rounded **up** (a "retry in" is never early).
pub fn human_ms(ms: i64) -> String {
    if ms <= 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    if ms < 60_000 {
        // Tenths of a second, rounded up.
        let tenths = (ms + 99) / 100;
        return if tenths % 10 == 0 {
            format!("{}s", tenths / 10)
        } else {
            format!("{}.{}s", tenths / 10, tenths % 10)
        };
    }
    let secs = (ms + 999) / 1000;
    let units: [(&str, i64); 4] = [("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)];
    let first = units.iter().position(|(_, per)| secs >= *per).unwrap_or(3);
    // Three units from the first; the last shown unit is rounded up.
    let last = (first + 2).min(3);
    let per_last = units[last].1;
    let mut left = (secs + per_last - 1) / per_last * per_last;
    let mut parts = Vec::new();
    for (u, per) in &units[first..=last] {
        let n = left / per;
        left %= per;
        if n > 0 {
            parts.push(format!("{n}{u}"));
        }
    }
    parts.join(" ")
}

/// Format milliseconds as the shortest duration this syntax reads back (`1h30m`, `500ms`).
pub fn format_duration_ms(ms: i64) -> String {
    if ms <= 0 {
        return "0s".into();
    }
    let mut out = String::new();
    let mut left = ms;
    for (unit, per) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
        ("ms", 1),
    ] {
        if left >= per {
            out.push_str(&format!("{}{unit}", left / per));
            left %= per;
        }
    }
    out
}

fn parse_period(p: &str) -> Result<Duration, String> {
    match p {
        "s" | "sec" | "second" => Ok(Duration::from_secs(1)),
        "min" | "minute" => Ok(Duration::from_secs(60)),
        "h" | "hour" => Ok(Duration::from_secs(3600)),
        "d" | "day" => Ok(Duration::from_secs(86_400)),
        other => parse_duration(other),
    }
}

fn format_period(ms: i64) -> String {
    match ms {
        1000 => "s".into(),
        60_000 => "min".into(),
        3_600_000 => "h".into(),
        86_400_000 => "d".into(),
        ms => format_duration_ms(ms),
    }
}

/// Split `k=v,k="v, with commas",…` on commas outside double quotes.
fn split_params(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in s.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            ',' if !quoted => parts.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    if quoted {
        return Err("unterminated double quote".into());
    }
    parts.push(cur);
    parts
        .into_iter()
        .map(|p| {
            // A bare `soft` is `soft=true`.
            if p.trim() == "soft" {
                return Ok(("soft".to_string(), "true".to_string()));
            }
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| format!("expected KEY=VALUE, got {p:?}"))?;
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            Ok((k.trim().to_string(), v.to_string()))
        })
        .collect()
}

fn tokens(key: &str, v: &str) -> Result<i64, String> {
    v.parse::<i64>()
        .map_err(|_| format!("{key}={v:?}: expected a whole number of tokens"))
}

/// Parse one limit (see the module docs).
pub fn parse_limit(s: &str) -> Result<Limit, String> {
    let (name, params) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: expected NAME:rate=… or NAME:quota=…"))?;
    let params = split_params(params)?;
    let mut rate = None;
    let mut burst = None;
    let mut quota = None;
    let mut cron = None;
    let mut tz = None;
    let mut after = None;
    let mut soft = None;
    let mut schedule = None;
    for (k, v) in params {
        let slot = match k.as_str() {
            "rate" => &mut rate,
            "burst" => &mut burst,
            "quota" => &mut quota,
            "cron" => &mut cron,
            "tz" => &mut tz,
            "after" => &mut after,
            "soft" => &mut soft,
            "schedule" => &mut schedule,
            other => {
                return Err(format!(
                    "unknown key {other:?} (rate, burst, quota, cron, tz, after, schedule, soft)"
                ))
            }
        };
        if slot.replace(v).is_some() {
            return Err(format!("{k} given twice"));
        }
    }
    let soft = match soft.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(v) => return Err(format!("soft={v:?}: expected true or false")),
    };
    let l = parse_base(
        name,
        rate,
        burst,
        quota,
        cron,
        tz.clone(),
        after,
        schedule.is_some(),
    )?;
    let l = match schedule {
        None => l,
        Some(sch) => {
            // ADR-135: the schedule's entries, in its zone (a cron quota's zone too).
            let entries: Vec<&str> = sch.split(';').map(str::trim).collect();
            let zone = tz.as_deref().unwrap_or("UTC");
            let sched = tollgate_core::schedule::Schedule::new(&entries, zone)
                .map_err(|e| format!("limit {name:?}: {e}"))?;
            l.with_schedule(sched).map_err(|e| e.to_string())?
        }
    };
    Ok(l.with_soft(soft))
}

#[allow(clippy::too_many_arguments)]
fn parse_base(
    name: &str,
    rate: Option<String>,
    burst: Option<String>,
    quota: Option<String>,
    cron: Option<String>,
    tz: Option<String>,
    after: Option<String>,
    scheduled: bool,
) -> Result<Limit, String> {
    let err = |e: tollgate_core::RuleError| e.to_string();
    let s = name;
    match (rate, quota) {
        (Some(r), None) => {
            if cron.is_some() || (tz.is_some() && !scheduled) || after.is_some() {
                return Err("a rate limit takes only rate= and burst= (and schedule=, tz=)".into());
            }
            let (amount, period) = r
                .split_once('/')
                .ok_or_else(|| format!("rate={r:?}: expected AMOUNT/PERIOD, e.g. 60/min"))?;
            let amount = tokens("rate", amount)?;
            let period = parse_period(period)?;
            let capacity = match burst {
                Some(b) => tokens("burst", &b)?,
                None => amount,
            };
            Limit::rate(name, capacity, amount, period).map_err(err)
        }
        (None, Some(q)) => {
            if burst.is_some() {
                return Err("burst= belongs to rate limits".into());
            }
            let q = tokens("quota", &q)?;
            match (cron, after) {
                (Some(c), None) => {
                    let tz = tz.as_deref().unwrap_or("UTC");
                    Limit::quota_calendar(name, q, &c, tz).map_err(|e| match e {
                        tollgate_core::RuleError::InvalidLimit { reason, .. } => format!(
                            "limit {name:?}: {}",
                            tollgate_server::cron::limit_reason(&reason, &c, tz)
                        ),
                        e => e.to_string(),
                    })
                }
                (None, Some(a)) => {
                    if tz.is_some() && !scheduled {
                        return Err("tz= belongs to cron quotas and schedules".into());
                    }
                    Limit::quota_after(name, q, parse_duration(&a)?).map_err(err)
                }
                _ => Err("a quota takes exactly one of cron=\"…\" or after=DURATION".into()),
            }
        }
        _ => Err(format!(
            "{s:?}: give exactly one of rate=AMOUNT/PERIOD or quota=TOKENS"
        )),
    }
}

/// Format a limit in the syntax [`parse_limit`] reads.
pub fn format_limit(l: &Limit) -> String {
    let mut out = format_base(l);
    if let Some(sch) = l.schedule() {
        out.push_str(&format!(",schedule=\"{}\"", sch.entry_texts().join(";")));
        if l.calendar().is_none() {
            out.push_str(&format!(",tz={}", sch.tz()));
        }
    }
    if l.is_soft() {
        out.push_str(",soft");
    }
    out
}

fn format_base(l: &Limit) -> String {
    let cap = l.capacity_milli() / tollgate_core::MILLI;
    match l.refill() {
        Refill::Drip { amount, period_ms } => {
            let a = amount / tollgate_core::MILLI;
            let mut s = format!("{}:rate={a}/{}", l.name(), format_period(*period_ms));
            if cap != a {
                s.push_str(&format!(",burst={cap}"));
            }
            s
        }
        Refill::Calendar(c) => format!(
            "{}:quota={cap},cron=\"{}\",tz={}",
            l.name(),
            c.expr(),
            c.tz()
        ),
        Refill::Window { reset_after_s } => format!(
            "{}:quota={cap},after={}",
            l.name(),
            format_duration_ms(reset_after_s * 1000)
        ),
    }
}

/// Parse a schedule patch `NAME=ENTRY[;ENTRY...][@ZONE]` (ADR-143 `patch_limits`); the
/// entries are checked when the patch is stored.
pub fn parse_patch(s: &str) -> Result<(String, tollgate::PatchSpec), String> {
    let (name, rest) = s
        .split_once('=')
        .ok_or_else(|| format!("a patch is NAME=ENTRY[;ENTRY...][@ZONE], not {s:?}"))?;
    let name = name.trim();
    tollgate_core::ids::validate_limit_name(name).map_err(|e| e.to_string())?;
    let (entries, tz) = match rest.rsplit_once('@') {
        Some((e, z)) => (e, Some(z.trim().to_string())),
        None => (rest, None),
    };
    let schedule: Vec<String> = entries
        .split(';')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_string)
        .collect();
    if schedule.is_empty() {
        return Err(format!("patch {name:?} has no schedule entry"));
    }
    Ok((
        name.to_string(),
        tollgate::PatchSpec {
            schedule,
            schedule_tz: tz,
        },
    ))
}

/// Parse `NAME=TOKENS`.
pub fn parse_amount(s: &str) -> Result<(String, i64), String> {
    let (n, a) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=TOKENS, e.g. rpm=1"))?;
    let a = a
        .trim()
        .parse::<i64>()
        .map_err(|_| format!("{s:?}: {a:?} is not a whole number of tokens"))?;
    Ok((n.trim().to_string(), a))
}

/// Parse `RESOURCE:NAME=TOKENS[,NAME=TOKENS…]` (one more resource of a multi-resource
/// acquire).
pub fn parse_also(s: &str) -> Result<(String, Vec<(String, i64)>), String> {
    let (r, amounts) = s.split_once(':').ok_or_else(|| {
        format!("{s:?}: expected RESOURCE:NAME=TOKENS[,NAME=TOKENS], e.g. tools:rpm=1")
    })?;
    let amounts = amounts
        .split(',')
        .map(parse_amount)
        .collect::<Result<Vec<_>, _>>()?;
    Ok((r.trim().to_string(), amounts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for s in [
            "rpm:rate=60/min",
            "tpm:rate=100000/min,burst=200000",
            "rpd:quota=1000,cron=\"0 0 * * *\",tz=Europe/Berlin",
            "session:quota=10,after=5h",
            "x:rate=5/10s",
            "rpm:rate=60/min,schedule=\"mon,tue,wed,thu,fri 09:00-17:00 120/120;sat,sun 00:00-24:00 10\",tz=Europe/Berlin",
            "rpd:quota=1000,cron=\"0 0 * * *\",tz=Europe/Berlin,schedule=\"* 22:00-06:00 200\"",
            "y:quota=3,after=1h30m",
            "rpm:rate=60/min,soft",
            "session:quota=10,after=5h,soft",
        ] {
            let l = parse_limit(s).unwrap();
            assert_eq!(format_limit(&l), s);
            assert_eq!(parse_limit(&format_limit(&l)).unwrap(), l);
        }
    }

    #[test]
    fn refusals() {
        for s in [
            "rpm",
            "rpm:rate=60",
            "rpm:rate=x/min",
            "rpm:rate=60/fortnight",
            "rpm:rate=60/min,quota=5",
            "q:quota=5",
            "q:quota=5,after=5h,cron=\"0 0 * * *\"",
            "q:quota=5,after=5",
            "rpm:rate=-1/min",
            "rpm:rate=60/min,burst=1,burst=2",
            "q:quota=5,cron=\"0 0 * * *",
            "wcu:rate=1/s",
            "rpm:rate=60/min,soft=maybe",
            "rpm:rate=60/min,soft,soft",
            "rpm:rate=60/min,tz=UTC",
            "rpm:rate=60/min,schedule=\"bogus\"",
            "rpm:rate=60/min,schedule=\"* 09:00-17:00 10\",tz=Mars/Olympus",
            "rpd:quota=10,after=5h,schedule=\"* 09:00-09:00 10\"",
        ] {
            assert!(parse_limit(s).is_err(), "{s}");
        }
    }

    #[test]
    fn soft_flag() {
        let l = parse_limit("rpm:soft,rate=60/min").unwrap();
        assert!(l.is_soft());
        assert!(!parse_limit("rpm:rate=60/min,soft=false").unwrap().is_soft());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5y").is_err());
        assert_eq!(format_duration_ms(5_400_000), "1h30m");
        assert_eq!(parse_amount("rpm=1").unwrap(), ("rpm".into(), 1));
        assert!(parse_amount("rpm").is_err());
        assert!(parse_amount("rpm=1.5").is_err());
        assert_eq!(
            parse_also("tools:rpm=1,tpm=20").unwrap(),
            ("tools".into(), vec![("rpm".into(), 1), ("tpm".into(), 20)])
        );
        assert!(parse_also("tools").is_err());
        assert!(parse_also("tools:rpm").is_err());
    }

    #[test]
    fn human_durations() {
        for (ms, want) in [
            (0, "0s"),
            (850, "850ms"),
            (1000, "1s"),
            (29_830, "29.9s"),
            (59_999, "60s"),
            (60_000, "1m"),
            (270_000, "4m 30s"),
            (3_907_000, "1h 5m 7s"),
            (3_600_500, "1h 1s"),
            // The issue's "resets in 2649374.5 s".
            (2_649_374_500, "30d 15h 57m"),
            (176_580_000, "2d 1h 3m"),
        ] {
            assert_eq!(human_ms(ms), want, "{ms}");
        }
        assert_eq!(parse_bytes("64KiB").unwrap(), 65_536);
        assert_eq!(parse_bytes("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_bytes("100").unwrap(), 100);
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("1GB").is_err());
    }

    #[test]
    fn calendar_errors_name_the_field_or_zone() {
        let e = parse_limit("rpd:quota=5,cron=\"0 25 * * *\"").unwrap_err();
        assert!(e.contains("the hour field has 25, outside 0-23"), "{e}");
        assert!(!e.contains("Component error"), "{e}");
        let e = parse_limit("rpd:quota=5,cron=\"0 0 * * *\",tz=Mars/Base").unwrap_err();
        assert!(
            e.contains("time zone \"Mars/Base\" is not a known IANA zone name"),
            "{e}"
        );
    }
}

//! Cron expressions explained: which field of a calendar quota's `reset_cron` is wrong, in
//! words a user can act on (the parser's own message names no field).

/// The fields of a 5-field expression, with their ranges.
const FIELDS5: [(&str, u32, u32); 5] = [
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 7),
];

const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// The expected shape, for messages.
pub const SHAPE: &str =
    "5 fields: minute hour day-of-month month day-of-week, e.g. \"0 0 * * *\" (daily at midnight)";

fn value(field: &str, v: &str, lo: u32, hi: u32) -> Result<(), String> {
    let up = v.to_ascii_uppercase();
    let named = match field {
        "month" => MONTHS.contains(&up.as_str()),
        "day-of-week" => DAYS.contains(&up.as_str()),
        _ => false,
    };
    if named {
        return Ok(());
    }
    match v.parse::<u32>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(()),
        Ok(n) => Err(format!("the {field} field has {n}, outside {lo}-{hi}")),
        Err(_) => Err(format!(
            "the {field} field has {v:?}, which is not a number{}",
            match field {
                "month" => " or a month name (JAN-DEC)",
                "day-of-week" => " or a day name (SUN-SAT)",
                _ => "",
            }
        )),
    }
}

fn item(field: &str, it: &str, lo: u32, hi: u32) -> Result<(), String> {
    // Extensions (L, W, #, ?) are left to the parser; names (JUL, WED) are not extensions.
    let up = it.to_ascii_uppercase();
    let is_name = it.split(['-', '/', ',']).all(|p| {
        MONTHS.contains(&p.to_ascii_uppercase().as_str())
            || DAYS.contains(&p.to_ascii_uppercase().as_str())
            || p.chars().all(|c| c.is_ascii_digit() || c == '*')
    });
    if !is_name && up.contains(['L', 'W', '#', '?']) {
        return Ok(());
    }
    let (base, step) = match it.split_once('/') {
        Some((b, s)) => (b, Some(s)),
        None => (it, None),
    };
    if let Some(s) = step {
        match s.parse::<u32>() {
            Ok(n) if n > 0 => {}
            _ => {
                return Err(format!(
                    "the {field} field has step {s:?}; a step is a positive whole number (*/15)"
                ))
            }
        }
    }
    if base == "*" {
        return Ok(());
    }
    if base.is_empty() {
        return Err(format!("the {field} field has an empty item in {it:?}"));
    }
    match base.split_once('-') {
        Some((a, b)) => {
            value(field, a, lo, hi)?;
            value(field, b, lo, hi)
        }
        None => value(field, base, lo, hi),
    }
}

/// Why `expr` is not a valid cron expression, naming the field, when a field is plainly
/// wrong (count, range, step, name); `None` when no field is (the parser may still refuse
/// it, e.g. a date that never occurs).
pub fn explain(expr: &str) -> Option<String> {
    let parts: Vec<&str> = expr.split_whitespace().collect();
    let fields: Vec<(&str, u32, u32)> = match parts.len() {
        5 => FIELDS5.to_vec(),
        6 => std::iter::once(("second", 0, 59)).chain(FIELDS5).collect(),
        n => {
            return Some(format!(
                "it has {n} field(s); a cron expression has {SHAPE}"
            ))
        }
    };
    for (p, (field, lo, hi)) in parts.iter().zip(fields) {
        for it in p.split(',') {
            if let Err(e) = item(field, it, lo, hi) {
                return Some(e);
            }
        }
    }
    None
}

/// A message for a cron expression the parser refused: [`explain`]'s reason, or the
/// expected shape.
pub fn message(expr: &str) -> String {
    match explain(expr) {
        Some(why) => format!("cron expression {expr:?} is not valid: {why}"),
        None => format!("cron expression {expr:?} is not valid or never matches; expected {SHAPE}"),
    }
}

/// A message for a time zone that is not known.
pub fn zone_message(tz: &str) -> String {
    format!(
        "time zone {tz:?} is not a known IANA zone name (e.g. UTC, Europe/Berlin, America/New_York)"
    )
}

/// Our words for a refused calendar limit: the limiter's reason starts with `cron` or
/// `time zone` for those parts; other reasons are kept.
pub fn limit_reason(reason: &str, cron: &str, tz: &str) -> String {
    if reason.starts_with("cron ") {
        message(cron)
    } else if reason.starts_with("time zone ") {
        zone_message(tz)
    } else {
        reason.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_field() {
        for (expr, want) in [
            ("0 25 * * *", "the hour field has 25, outside 0-23"),
            ("60 0 * * *", "the minute field has 60, outside 0-59"),
            ("0 0 0 * *", "the day-of-month field has 0, outside 1-31"),
            ("0 0 * 13 *", "the month field has 13, outside 1-12"),
            ("0 0 * * 8", "the day-of-week field has 8, outside 0-7"),
            ("0 0 * * FOO", "not a number or a day name"),
            ("0 0 * *", "it has 4 field(s)"),
            ("*/0 * * * *", "step \"0\""),
            ("0 1-30 * * *", "the hour field has 30"),
            ("0 0,,1 * * *", "empty item"),
        ] {
            let e = explain(expr).unwrap_or_default();
            assert!(e.contains(want), "{expr}: {e}");
        }
        for ok in [
            "0 0 * * *",
            "*/15 9-17 * * MON-FRI",
            "0 0 1 JAN *",
            "0 0 1 jul wed",
            "0 0 L * *",
            "0 0 * * 5#3",
            "0 0 0 * * *",
        ] {
            assert_eq!(explain(ok), None, "{ok}");
        }
    }
}

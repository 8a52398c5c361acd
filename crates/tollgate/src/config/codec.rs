//! The config item's encoding: limits under `l_` / `w_`, the system's `on_unavailable`, the
//! cascade flag, the mode and the merge flags, each decoded back or reported corrupt.

use std::collections::BTreeMap;

use tollgate_core::bucket::SCHED_NONE;
use tollgate_core::bypass::Enforcement;
use tollgate_core::error::RuleError;
use tollgate_core::merge::Merge;
use tollgate_core::schedule::Schedule;
use tollgate_core::value::{Item, Key, Value};
use tollgate_core::Limit;

use super::OnUnavailable;
use crate::error::{Error, Result};

const ON_UNAVAILABLE: &str = "on_unavailable";

/// Encode limits into a config item. Windowed quotas go under `w_` (ADR-142), the rest
/// under `l_`.
pub fn encode(limits: &[Limit], on_unavailable: Option<OnUnavailable>) -> Item {
    let mut i = Item::new();
    for l in limits {
        let p = if l.rsa().is_some() { "w" } else { "l" };
        let n = l.name();
        i.insert(format!("{p}_{n}_cp").into(), Value::N(l.capacity_milli()));
        i.insert(format!("{p}_{n}_ra").into(), Value::N(l.ra()));
        i.insert(format!("{p}_{n}_rp").into(), Value::N(l.rp()));
        if let Some(rsa) = l.rsa() {
            i.insert(format!("{p}_{n}_rsa").into(), Value::N(rsa));
        }
        if let Some(c) = l.calendar() {
            i.insert(format!("{p}_{n}_rsched").into(), Value::S(c.expr().into()));
            i.insert(format!("{p}_{n}_tz").into(), Value::S(c.tz().into()));
        }
        if let Some(s) = l.schedule() {
            i.insert(format!("{p}_{n}_sched").into(), Value::S(s.encode()));
        }
        if l.is_soft() {
            // ADR-151: absent means enforced (every item written before soft limits).
            i.insert(format!("{p}_{n}_soft").into(), Value::N(1));
        }
    }
    if let Some(o) = on_unavailable {
        let v = match o {
            OnUnavailable::Block => "block",
            OnUnavailable::Allow => "allow",
        };
        i.insert(ON_UNAVAILABLE.into(), Value::S(v.into()));
    }
    i
}

fn corrupt(key: &str, attribute: &str, reason: &str) -> Error {
    Error::from(RuleError::Corrupt {
        key: key.into(),
        attribute: attribute.into(),
        reason: reason.into(),
    })
}

/// Decode a config item's limits. The same name under both prefixes, a `w_` limit without
/// `rsa`, or a wrong type is corrupt (naming the attribute).
pub fn decode(item: &Item) -> Result<(Vec<Limit>, Option<OnUnavailable>)> {
    let key = Key::of(item).map(|k| k.to_string()).unwrap_or_default();
    let mut by_name: BTreeMap<(String, char), ()> = BTreeMap::new();
    for a in item.keys() {
        for p in ['l', 'w'] {
            if let Some(rest) = a.strip_prefix(&format!("{p}_")) {
                if let Some(n) = rest.strip_suffix("_cp") {
                    by_name.insert((n.to_string(), p), ());
                }
            }
        }
    }
    let mut out = Vec::new();
    for (n, p) in by_name.keys() {
        if *p == 'l' && by_name.contains_key(&(n.clone(), 'w')) {
            return Err(corrupt(
                &key,
                &format!("w_{n}_cp"),
                "limit stored under both l_ and w_",
            ));
        }
        let num = |f: &str| -> Result<Option<i64>> {
            let a = format!("{p}_{n}_{f}");
            match item.get(a.as_str()) {
                None => Ok(None),
                Some(Value::N(v)) => Ok(Some(*v)),
                Some(_) => Err(corrupt(&key, &a, "expected a number")),
            }
        };
        let text = |f: &str| -> Result<Option<String>> {
            let a = format!("{p}_{n}_{f}");
            match item.get(a.as_str()) {
                None => Ok(None),
                Some(Value::S(v)) => Ok(Some(v.clone())),
                Some(_) => Err(corrupt(&key, &a, "expected a string")),
            }
        };
        let cp = num("cp")?.unwrap_or(0);
        let ra = num("ra")?.unwrap_or(0);
        let rp = num("rp")?.unwrap_or(0);
        let rsa = num("rsa")?;
        if *p == 'w' && rsa.is_none() {
            return Err(corrupt(&key, &format!("w_{n}_rsa"), "missing"));
        }
        let cron = text("rsched")?;
        let tz = text("tz")?.unwrap_or_else(|| "UTC".into());
        let cal = cron.as_deref().map(|c| (c, tz.as_str()));
        let l = Limit::from_parts(n, cp, ra, rp, cal, rsa)
            .map_err(|e| corrupt(&key, &format!("{p}_{n}_cp"), &e.to_string()))?;
        // ADR-135: a stored schedule must decode and fit the limit, or the item is corrupt
        // naming the attribute.
        let l = match text("sched")?.filter(|s| s != SCHED_NONE) {
            None => l,
            Some(raw) => {
                let a = format!("{p}_{n}_sched");
                let sched =
                    Schedule::decode(&raw).map_err(|e| corrupt(&key, &a, &e.to_string()))?;
                l.with_schedule(sched)
                    .map_err(|e| corrupt(&key, &a, &e.to_string()))?
            }
        };
        let soft = match num("soft")? {
            None | Some(0) => false,
            Some(1) => true,
            Some(_) => return Err(corrupt(&key, &format!("{p}_{n}_soft"), "expected 0 or 1")),
        };
        out.push(l.with_soft(soft));
    }
    let on = match item.get(ON_UNAVAILABLE) {
        None => None,
        Some(Value::S(s)) => Some(
            s.parse()
                .map_err(|e: String| corrupt(&key, ON_UNAVAILABLE, &e))?,
        ),
        Some(_) => return Err(corrupt(&key, ON_UNAVAILABLE, "expected a string")),
    };
    Ok((out, on))
}

/// The stored cascade flag of a config or META item: `Some` when explicit, `None` when
/// unset; anything but a BOOL is corrupt (naming the attribute).
pub fn decode_cascade(item: &Item) -> Result<Option<bool>> {
    match item.get(CASCADE) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => {
            let key = Key::of(item).map(|k| k.to_string()).unwrap_or_default();
            Err(corrupt(&key, CASCADE, "expected a boolean"))
        }
    }
}

/// The stored mode of a config level (rule "a scope's mode is its most specific
/// level's", `tollgate_core::bypass::scope_mode`): `Some` when the level sets one, `None`
/// when it does not; anything but one of the three names is corrupt (naming the attribute).
pub fn decode_enforcement(item: &Item) -> Result<Option<Enforcement>> {
    match item.get(ENFORCEMENT) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::S(s)) => s.parse().map(Some).map_err(|m: String| {
            let key = Key::of(item).map(|k| k.to_string()).unwrap_or_default();
            corrupt(&key, ENFORCEMENT, &m)
        }),
        Some(_) => {
            let key = Key::of(item).map(|k| k.to_string()).unwrap_or_default();
            Err(corrupt(&key, ENFORCEMENT, "expected a string"))
        }
    }
}

/// The config item attribute holding a level's mode: `enforce`, `disabled` or `bypass`
/// (ADR-151; absent: the level sets none).
pub const ENFORCEMENT: &str = "enforcement";

/// The config item attribute holding the tri-state cascade policy (ADR-146).
pub const CASCADE: &str = "cascade";

/// Config item attribute: merge the limits of the levels beneath (ADR-143).
pub const INHERIT: &str = "inherit_limits";
/// Config item attribute: inherited limit names to drop (a string set, ADR-143).
pub const EXCLUDE: &str = "exclude_limits";
/// Config item attribute: the names whose inherited schedule is patched (a string set,
/// ADR-143); each patch's schedule is stored under `p_{name}_sched`.
pub const PATCH: &str = "patch_limits";

/// Add a level's merge flags to its config item (nothing for the default "replace").
pub fn encode_merge(item: &mut Item, m: &Merge) {
    if m.inherit {
        item.insert(INHERIT.into(), Value::Bool(true));
    }
    if !m.exclude.is_empty() {
        item.insert(EXCLUDE.into(), Value::Ss(Box::new(m.exclude.clone())));
    }
    if !m.patch.is_empty() {
        item.insert(
            PATCH.into(),
            Value::Ss(Box::new(m.patch.keys().cloned().collect())),
        );
        for (n, s) in &m.patch {
            item.insert(format!("p_{n}_sched").into(), Value::S(s.encode()));
        }
    }
}

/// A config item's merge flags; a wrong type, or a patched name without a decodable
/// `p_{name}_sched`, is corrupt (naming the attribute).
pub fn decode_merge(item: &Item) -> Result<Merge> {
    let key = Key::of(item).map(|k| k.to_string()).unwrap_or_default();
    let set = |a: &str| -> Result<std::collections::BTreeSet<String>> {
        match item.get(a) {
            None | Some(Value::Null) => Ok(Default::default()),
            Some(Value::Ss(s)) => Ok((**s).clone()),
            Some(_) => Err(corrupt(&key, a, "expected a string set")),
        }
    };
    let inherit = match item.get(INHERIT) {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(corrupt(&key, INHERIT, "expected a boolean")),
    };
    let exclude = set(EXCLUDE)?;
    let mut patch = BTreeMap::new();
    for n in set(PATCH)? {
        let a = format!("p_{n}_sched");
        let raw = match item.get(a.as_str()) {
            Some(Value::S(v)) => v,
            None => return Err(corrupt(&key, &a, "missing")),
            Some(_) => return Err(corrupt(&key, &a, "expected a string")),
        };
        let s = Schedule::decode(raw).map_err(|e| corrupt(&key, &a, &e.to_string()))?;
        patch.insert(n, s);
    }
    Ok(Merge {
        inherit,
        exclude,
        patch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// ADR-135: a schedule round-trips through a config item; a stored schedule that cannot
    /// be evaluated, or that sets a rate on a quota, is corrupt naming the attribute.
    #[test]
    fn schedule_round_trip_and_corruption() {
        use tollgate_core::schedule::Schedule;
        let night = || Schedule::new(&["* 22:00-06:00 10/10"], "Europe/Berlin").unwrap();
        let limits = vec![
            Limit::per_minute("rpm", 100)
                .unwrap()
                .with_schedule(night())
                .unwrap(),
            Limit::quota_after("session", 10, Duration::from_secs(18_000))
                .unwrap()
                .with_schedule(Schedule::new(&["sat,sun 00:00-24:00 5"], "UTC").unwrap())
                .unwrap(),
        ];
        let item = encode(&limits, None);
        assert_eq!(
            item.get("l_rpm_sched"),
            Some(&Value::S("1|Europe/Berlin|* 22:00-06:00 10/10".into()))
        );
        assert!(item.contains_key("w_session_sched"));
        let (mut back, _) = decode(&item).unwrap();
        back.sort_by(|a, b| a.name().cmp(b.name()));
        assert_eq!(back, limits);
        for (attr, bad) in [
            ("l_rpm_sched", Value::S("1|UTC|* 25:00-06:00 10".into())),
            ("l_rpm_sched", Value::S("9|UTC|* 22:00-06:00 10".into())),
            ("l_rpm_sched", Value::N(3)),
            (
                "w_session_sched",
                Value::S("1|UTC|* 22:00-06:00 5/5".into()),
            ),
        ] {
            let mut i = item.clone();
            i.insert(attr.into(), bad);
            let e = decode(&i).unwrap_err().to_string();
            assert!(e.contains(attr), "{e}");
        }
        // The "no schedule" marker reads as none.
        let mut i = item.clone();
        i.insert("l_rpm_sched".into(), Value::S("-".into()));
        let (back, _) = decode(&i).unwrap();
        assert!(back
            .iter()
            .any(|l| l.name() == "rpm" && l.schedule().is_none()));
    }

    #[test]
    fn round_trip_and_corruption() {
        let limits = vec![
            Limit::per_minute("rpm", 100).unwrap(),
            Limit::quota_calendar("rpd", 1000, "0 0 * * *", "Europe/Berlin").unwrap(),
            Limit::quota_after("session", 10, Duration::from_secs(18_000)).unwrap(),
        ];
        let mut item = encode(&limits, Some(OnUnavailable::Allow));
        assert!(item.contains_key("w_session_rsa"));
        let (mut back, on) = decode(&item).unwrap();
        back.sort_by(|a, b| a.name().cmp(b.name()));
        let mut want = limits.clone();
        want.sort_by(|a, b| a.name().cmp(b.name()));
        assert_eq!(back, want);
        assert_eq!(on, Some(OnUnavailable::Allow));
        item.insert("l_session_cp".into(), Value::N(5));
        let e = decode(&item).unwrap_err().to_string();
        assert!(e.contains("w_session_cp"), "{e}");
        let mut item = encode(&limits, None);
        item.remove("w_session_rsa");
        assert!(decode(&item)
            .unwrap_err()
            .to_string()
            .contains("w_session_rsa"));
        let mut item = encode(&limits, None);
        item.insert("l_rpm_ra".into(), Value::S("x".into()));
        assert!(decode(&item).unwrap_err().to_string().contains("l_rpm_ra"));
    }
}

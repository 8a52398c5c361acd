//! The file's schema (serde) and its validation into [`LimitsFile`].

use std::collections::BTreeMap;
use std::ops::Range;

use serde::Deserialize;
use tollgate_core::merge::Merge;

use super::descriptors::{EnvoySettings, RawEnvoy};
use super::diff::Level;
use crate::config::{OnUnavailable, Scope};
use levels::{check_scope, level_of, limits_of, merge_of};

mod levels;

/// A limits file that did not parse or validate: where, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}:{line}: {field}: {reason}")]
pub struct LimitsFileError {
    /// The file's name (or `<text>`).
    pub origin: String,
    /// 1-based line of the offending value (0 when the document as a whole is wrong).
    pub line: usize,
    /// The dotted path of the field (`resources.gpt-4.limits.rpm.capacity`).
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

/// A validated limits file: the levels it declares and the Envoy settings.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitsFile {
    /// Every level the file declares, by scope.
    pub levels: BTreeMap<ScopeKey, Level>,
    /// The Envoy rate limit service settings and descriptor rules.
    pub envoy: EnvoySettings,
}

/// A [`Scope`] that orders: system, then resources, then entities.
pub type ScopeKey = (u8, String, String);

pub(crate) fn scope_key(s: &Scope) -> ScopeKey {
    match s {
        Scope::System => (0, String::new(), String::new()),
        Scope::Resource(r) => (1, r.clone(), String::new()),
        Scope::Entity(e, r) => (2, e.clone(), r.clone().unwrap_or_default()),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    system: Option<toml::Spanned<RawSystem>>,
    #[serde(default)]
    resources: BTreeMap<String, toml::Spanned<RawLevel>>,
    #[serde(default)]
    entities: BTreeMap<String, toml::Spanned<RawEntity>>,
    #[serde(default)]
    envoy: Option<RawEnvoy>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSystem {
    #[serde(default)]
    on_unavailable: Option<OnUnavailable>,
    #[serde(default)]
    limits: BTreeMap<String, toml::Spanned<RawLimit>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLevel {
    #[serde(default)]
    cascade: Option<bool>,
    #[serde(default)]
    inherit_limits: bool,
    #[serde(default)]
    exclude_limits: std::collections::BTreeSet<String>,
    #[serde(default)]
    patch_limits: BTreeMap<String, tollgate_core::merge::PatchSpec>,
    #[serde(default)]
    limits: BTreeMap<String, toml::Spanned<RawLimit>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntity {
    #[serde(default)]
    cascade: Option<bool>,
    #[serde(default)]
    inherit_limits: bool,
    #[serde(default)]
    exclude_limits: std::collections::BTreeSet<String>,
    #[serde(default)]
    patch_limits: BTreeMap<String, tollgate_core::merge::PatchSpec>,
    #[serde(default)]
    limits: Option<BTreeMap<String, toml::Spanned<RawLimit>>>,
    #[serde(default)]
    resources: BTreeMap<String, toml::Spanned<RawLevel>>,
}

/// One limit: the fields of [`LimitSpec`](tollgate_core::LimitSpec) without the name (the
/// table key is the name).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    capacity: i64,
    #[serde(default)]
    refill_amount: Option<i64>,
    #[serde(default)]
    refill_period_ms: Option<i64>,
    #[serde(default)]
    reset_cron: Option<String>,
    #[serde(default)]
    reset_tz: Option<String>,
    #[serde(default)]
    reset_after_s: Option<i64>,
    #[serde(default)]
    schedule: Option<Vec<String>>,
    #[serde(default)]
    schedule_tz: Option<String>,
    /// ADR-151: record consumption, never refuse (shadow mode).
    #[serde(default)]
    soft: bool,
}

/// The 1-based line of byte offset `at` in `text`.
pub(crate) fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

pub(crate) struct Ctx<'a> {
    pub origin: &'a str,
    pub text: &'a str,
}

impl Ctx<'_> {
    pub(crate) fn err(
        &self,
        span: Range<usize>,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> LimitsFileError {
        LimitsFileError {
            origin: self.origin.to_string(),
            line: line_of(self.text, span.start),
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Parse and validate a limits file (`origin` names it in errors).
pub fn parse(origin: &str, text: &str) -> Result<LimitsFile, LimitsFileError> {
    let cx = Ctx { origin, text };
    let raw: RawFile = toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| line_of(text, s.start)).unwrap_or(0);
        LimitsFileError {
            origin: origin.to_string(),
            line,
            field: field_of(&e, text),
            reason: e.message().trim().to_string(),
        }
    })?;
    let mut levels = BTreeMap::new();
    if let Some(sys) = &raw.system {
        let sys = sys.get_ref();
        let limits = limits_of(&cx, "system", &sys.limits)?;
        levels.insert(
            scope_key(&Scope::System),
            Level {
                scope: Scope::System,
                limits,
                on_unavailable: sys.on_unavailable,
                cascade: None,
                merge: Merge::default(),
            },
        );
    }
    for (r, lvl) in &raw.resources {
        let level = level_of(
            &cx,
            lvl,
            &format!("resources.{r}"),
            Scope::Resource(r.clone()),
        )?;
        levels.insert(scope_key(&level.scope), level);
    }
    for (e, ent) in &raw.entities {
        let path = format!("entities.{e}");
        let span = ent.span();
        let ent = ent.get_ref();
        let default_scope = Scope::Entity(e.clone(), None);
        check_scope(&cx, span.clone(), &path, &default_scope)?;
        if ent.limits.is_some() || ent.cascade.is_some() || ent.inherit_limits {
            let limits = match &ent.limits {
                Some(l) => limits_of(&cx, &path, l)?,
                None => Vec::new(),
            };
            let merge = merge_of(
                &cx,
                span.clone(),
                &path,
                ent.inherit_limits,
                &ent.exclude_limits,
                &ent.patch_limits,
            )?;
            levels.insert(
                scope_key(&default_scope),
                Level {
                    scope: default_scope,
                    limits,
                    on_unavailable: None,
                    cascade: ent.cascade,
                    merge,
                },
            );
        } else if ent.resources.is_empty() {
            return Err(cx.err(
                span,
                path,
                "an entity needs limits, cascade or resources (an empty entity declares nothing)",
            ));
        }
        for (r, lvl) in &ent.resources {
            let scope = Scope::Entity(e.clone(), Some(r.clone()));
            let level = level_of(&cx, lvl, &format!("{path}.resources.{r}"), scope)?;
            levels.insert(scope_key(&level.scope), level);
        }
    }
    let envoy = match &raw.envoy {
        Some(e) => e.validate(&cx)?,
        None => EnvoySettings::default(),
    };
    Ok(LimitsFile { levels, envoy })
}

/// The dotted key path at a toml error's span: the last `key =` or `[table]` header at or
/// before the error's line (toml's own message names the field for unknown keys).
fn field_of(e: &toml::de::Error, text: &str) -> String {
    let Some(span) = e.span() else {
        return "(document)".into();
    };
    // Byte offsets from the parser; `get` keeps a span that is not on a char boundary from
    // panicking (the document is named instead).
    let start = span.start.min(text.len());
    let (Some(before), Some(after)) = (text.get(..start), text.get(start..)) else {
        return "(document)".into();
    };
    let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    let line_end = after.find('\n').map(|i| start + i).unwrap_or(text.len());
    let line = text.get(line_start..line_end).unwrap_or("").trim();
    let mut table = String::new();
    for l in text.get(..line_start).unwrap_or("").lines() {
        let l = l.trim();
        if let Some(h) = l.strip_prefix("[[").and_then(|h| h.strip_suffix("]]")) {
            table = h.trim().to_string();
        } else if let Some(h) = l.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            table = h.trim().to_string();
        }
    }
    if let Some(h) = line
        .strip_prefix('[')
        .map(|h| h.trim_start_matches('[').trim_end_matches(']'))
    {
        return h.trim().to_string();
    }
    let key = line.split('=').next().unwrap_or("").trim();
    match (table.is_empty(), key.is_empty()) {
        (true, _) => key.to_string(),
        (false, true) => table,
        (false, false) => format!("{table}.{key}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[system]
on_unavailable = "allow"
limits.rpm = { capacity = 100, refill_amount = 100 }

[resources.gpt-4]
cascade = true
[resources.gpt-4.limits]
rpm = { capacity = 60, refill_amount = 60, refill_period_ms = 60000 }
rpd = { capacity = 1000, reset_cron = "0 0 * * *", reset_tz = "Europe/Berlin" }

[entities.user-1.limits]
session = { capacity = 10, reset_after_s = 18000 }

[entities.user-1.resources.gpt-4.limits]
rpm = { capacity = 5, refill_amount = 5 }
"#;

    #[test]
    fn levels_of_a_good_file() {
        let f = parse("t.toml", GOOD).unwrap();
        let scopes: Vec<Scope> = f.levels.values().map(|l| l.scope.clone()).collect();
        assert_eq!(
            scopes,
            vec![
                Scope::System,
                Scope::Resource("gpt-4".into()),
                Scope::Entity("user-1".into(), None),
                Scope::Entity("user-1".into(), Some("gpt-4".into())),
            ]
        );
        let sys = &f.levels[&scope_key(&Scope::System)];
        assert_eq!(sys.on_unavailable, Some(OnUnavailable::Allow));
        assert_eq!(sys.limits[0].capacity_milli(), 100_000);
        let r = &f.levels[&scope_key(&Scope::Resource("gpt-4".into()))];
        assert_eq!(r.cascade, Some(true));
        assert_eq!(r.limits.len(), 2);
    }

    #[test]
    fn the_example_file_loads() {
        let text = include_str!("../../../../../examples/limits.toml");
        let f = parse("examples/limits.toml", text).unwrap();
        assert_eq!(f.levels.len(), 4);
        assert_eq!(f.envoy.rules.len(), 3);
        assert!(f.envoy.rules[1].report_usage);
        let search = &f.levels[&scope_key(&Scope::Resource("search".into()))];
        assert!(search.limits.iter().any(|l| l.schedule().is_some()));
    }

    #[test]
    fn every_truncation_of_the_example_is_an_error_or_a_file_never_a_panic() {
        let text = include_str!("../../../../../examples/limits.toml");
        for (i, _) in text.char_indices() {
            if let Err(e) = parse("cut.toml", &text[..i]) {
                assert!(e.line <= text[..i].lines().count() + 1, "{e}");
            }
        }
    }

    /// ADR-143 merge flags on resource and entity levels; refused on the system level (an
    /// unknown field there) and without `inherit_limits`.
    #[test]
    fn merge_flags_in_a_file() {
        let text = "[resources.gpt-4]\ninherit_limits = true\nexclude_limits = [\"tpm\"]\n\
                    [resources.gpt-4.patch_limits.rpm]\nschedule = [\"* 22:00-06:00 500/500\"]\n\
                    [resources.gpt-4.limits]\nrpm = { capacity = 50, refill_amount = 50 }\n\
                    [entities.u1]\ninherit_limits = true\n";
        let f = parse("m.toml", text).unwrap();
        let r = &f.levels[&scope_key(&Scope::Resource("gpt-4".into()))];
        assert!(r.merge.inherit);
        assert!(r.merge.exclude.contains("tpm"));
        assert_eq!(r.merge.patch["rpm"].tz(), "UTC");
        let e = &f.levels[&scope_key(&Scope::Entity("u1".into(), None))];
        assert!(e.merge.inherit && e.limits.is_empty());
        let e = parse("s.toml", "[system]\ninherit_limits = true\n").unwrap_err();
        assert_eq!(e.line, 2, "{e}");
        let e = parse("x.toml", "[resources.r]\nexclude_limits = [\"tpm\"]\n").unwrap_err();
        assert!(e.reason.contains("inherit_limits"), "{e}");
    }

    #[test]
    fn an_unknown_field_names_its_line_and_field() {
        let text = "[resources.gpt-4.limits]\nrpm = { capacity = 60, refill_amount = 60 }\ntpm = { capasity = 5 }\n";
        let e = parse("f.toml", text).unwrap_err();
        assert_eq!(e.line, 3, "{e}");
        assert_eq!(e.field, "resources.gpt-4.limits.tpm", "{e}");
        assert!(e.reason.contains("capasity"), "{e}");
    }

    #[test]
    fn an_invalid_limit_names_its_line_and_field() {
        let text = "[resources.gpt-4.limits]\nrpm = { capacity = 60, refill_amount = 60 }\n\ntpm = { capacity = -5, refill_amount = 1 }\n";
        let e = parse("f.toml", text).unwrap_err();
        assert_eq!(e.line, 4, "{e}");
        assert_eq!(e.field, "resources.gpt-4.limits.tpm");
        assert!(e.reason.contains("-5"), "{e}");
    }

    #[test]
    fn a_wrong_type_names_its_line() {
        let text = "[system]\non_unavailable = \"sometimes\"\n";
        let e = parse("f.toml", text).unwrap_err();
        assert_eq!(e.line, 2, "{e}");
        assert_eq!(e.field, "system.on_unavailable");
    }

    #[test]
    fn a_bad_resource_name_is_refused() {
        let text = "[resources.\"a#b\".limits]\nrpm = { capacity = 1, refill_amount = 1 }\n";
        let e = parse("f.toml", text).unwrap_err();
        assert_eq!(e.line, 1, "{e}");
        assert_eq!(e.field, "resources.a#b");
    }
}

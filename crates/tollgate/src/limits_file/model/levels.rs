//! A level's tables validated: its limits, its merge flags (ADR-143) and its scope.

use std::collections::BTreeMap;
use std::ops::Range;

use tollgate_core::merge::Merge;
use tollgate_core::{Limit, LimitSpec};

use super::{Ctx, LimitsFileError, RawLevel, RawLimit};
use crate::config::Scope;
use crate::limits_file::diff::Level;

/// A level's merge flags (ADR-143), checked as `limits set` checks them.
pub(super) fn merge_of(
    cx: &Ctx<'_>,
    span: Range<usize>,
    path: &str,
    inherit: bool,
    exclude: &std::collections::BTreeSet<String>,
    patch: &BTreeMap<String, tollgate_core::merge::PatchSpec>,
) -> Result<Merge, LimitsFileError> {
    let spec = tollgate_core::merge::MergeSpec {
        inherit_limits: inherit,
        exclude_limits: exclude.clone(),
        patch_limits: patch.clone(),
    };
    let m = spec
        .to_merge()
        .map_err(|e| cx.err(span.clone(), path, e.to_string()))?;
    m.validate(false)
        .map_err(|e| cx.err(span, path, e.to_string()))?;
    Ok(m)
}

pub(super) fn limits_of(
    cx: &Ctx<'_>,
    path: &str,
    raw: &BTreeMap<String, toml::Spanned<RawLimit>>,
) -> Result<Vec<Limit>, LimitsFileError> {
    let mut out = Vec::with_capacity(raw.len());
    for (name, l) in raw {
        let span = l.span();
        let l = l.get_ref();
        let spec = LimitSpec {
            name: name.clone(),
            capacity: l.capacity,
            refill_amount: l.refill_amount,
            refill_period_ms: l.refill_period_ms,
            reset_cron: l.reset_cron.clone(),
            reset_tz: l.reset_tz.clone(),
            reset_after_s: l.reset_after_s,
            schedule: l.schedule.clone(),
            schedule_tz: l.schedule_tz.clone(),
            soft: l.soft,
        };
        let limit = spec
            .to_limit()
            .map_err(|e| cx.err(span, format!("{path}.limits.{name}"), e.to_string()))?;
        out.push(limit);
    }
    Ok(out)
}

pub(super) fn check_scope(
    cx: &Ctx<'_>,
    span: Range<usize>,
    path: &str,
    s: &Scope,
) -> Result<(), LimitsFileError> {
    s.validate()
        .map_err(|e| cx.err(span, path.to_string(), e.to_string()))
}

/// A `[resources.R]` or `[entities.E.resources.R]` table as the level of `scope`.
pub(super) fn level_of(
    cx: &Ctx<'_>,
    lvl: &toml::Spanned<RawLevel>,
    path: &str,
    scope: Scope,
) -> Result<Level, LimitsFileError> {
    check_scope(cx, lvl.span(), path, &scope)?;
    let l = lvl.get_ref();
    let limits = limits_of(cx, path, &l.limits)?;
    let merge = merge_of(
        cx,
        lvl.span(),
        path,
        l.inherit_limits,
        &l.exclude_limits,
        &l.patch_limits,
    )?;
    Ok(Level {
        scope,
        limits,
        on_unavailable: None,
        cascade: l.cascade,
        merge,
    })
}

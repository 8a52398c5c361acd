//! Merging limits through the levels (ADR-143; spec-shards-windows-quotas.md §4.17).
//!
//! The levels of one (entity, resource), most specific first, are: entity × resource,
//! entity default, resource, system. By default the first level that defines limits wins
//! whole. A level that sets `inherit_limits` also takes, **by name**, the limits of the
//! next level beneath it that takes part (and so on while that one inherits too): a name
//! defined above wins wholesale, `exclude_limits` drops inherited names, and
//! `patch_limits` replaces only the schedule of an inherited limit. The system level is
//! the root and cannot inherit.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::RuleError;
use crate::schedule::Schedule;
use crate::Limit;

/// A level's merge flags (ADR-143). The default — no flags — is "this level replaces
/// every level beneath it".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Merge {
    /// Take the limits of the levels beneath by name (`inherit_limits`).
    pub inherit: bool,
    /// Inherited names to drop (`exclude_limits`).
    pub exclude: BTreeSet<String>,
    /// A schedule replacing the one of an inherited limit, by name (`patch_limits`).
    pub patch: BTreeMap<String, Schedule>,
}

impl Merge {
    /// No flags set.
    pub fn is_empty(&self) -> bool {
        !self.inherit && self.exclude.is_empty() && self.patch.is_empty()
    }

    /// Rule "the system level is the root" (ADR-143): merge flags there are refused, and
    /// `exclude_limits` / `patch_limits` without `inherit_limits` would say nothing, so
    /// they are refused too rather than silently ignored.
    pub fn validate(&self, system: bool) -> Result<(), RuleError> {
        if system && !self.is_empty() {
            return Err(RuleError::InvalidLimit {
                name: "inherit_limits".into(),
                reason: "the system level is the root of the merge and cannot inherit, \
                         exclude or patch limits"
                    .into(),
            });
        }
        if !self.inherit && !self.is_empty() {
            return Err(RuleError::InvalidLimit {
                name: "exclude_limits".into(),
                reason: "exclude_limits and patch_limits apply to inherited limits: set \
                         inherit_limits too"
                    .into(),
            });
        }
        for n in self.exclude.iter().chain(self.patch.keys()) {
            crate::ids::validate_limit_name(n)?;
        }
        Ok(())
    }
}

/// A patch of an inherited limit's schedule, as the HTTP API and the CLI spell it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchSpec {
    /// Schedule entries, `DAYS HH:MM-HH:MM CAPACITY[/RATE]` (ADR-135).
    pub schedule: Vec<String>,
    /// Their time zone (default UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_tz: Option<String>,
}

/// A level's merge flags as the HTTP API and the CLI spell them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MergeSpec {
    /// Take limits from the levels beneath by name.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inherit_limits: bool,
    /// Inherited names to drop.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub exclude_limits: BTreeSet<String>,
    /// Schedules replacing those of inherited limits, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub patch_limits: BTreeMap<String, PatchSpec>,
}

impl MergeSpec {
    /// Validate into a [`Merge`] (schedules parsed; see [`Merge::validate`] for the
    /// level-dependent checks).
    pub fn to_merge(&self) -> Result<Merge, RuleError> {
        let mut patch = BTreeMap::new();
        for (n, p) in &self.patch_limits {
            let tz = p.schedule_tz.as_deref().unwrap_or("UTC");
            let s = Schedule::new(&p.schedule, tz).map_err(|e| crate::limit::name_error(n, e))?;
            patch.insert(n.clone(), s);
        }
        Ok(Merge {
            inherit: self.inherit_limits,
            exclude: self.exclude_limits.clone(),
            patch,
        })
    }
}

impl From<&Merge> for MergeSpec {
    fn from(m: &Merge) -> Self {
        MergeSpec {
            inherit_limits: m.inherit,
            exclude_limits: m.exclude.clone(),
            patch_limits: m
                .patch
                .iter()
                .map(|(n, s)| {
                    (
                        n.clone(),
                        PatchSpec {
                            schedule: s.entry_texts(),
                            schedule_tz: Some(s.tz().to_string()),
                        },
                    )
                })
                .collect(),
        }
    }
}

/// One level as stored: its own limits and its merge flags.
#[derive(Debug, Clone, Copy)]
pub struct Level<'a> {
    /// The level's own limits.
    pub limits: &'a [Limit],
    /// Its merge flags.
    pub merge: &'a Merge,
}

impl Level<'_> {
    /// A level takes part in a resolution when it defines limits or inherits them.
    fn takes_part(&self) -> bool {
        !self.limits.is_empty() || self.merge.inherit
    }
}

/// A merge that cannot be made (the spec's RateLimiterUnavailable for it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    /// Merged limits carry schedules in different time zones.
    #[error(
        "merged limits have schedules in different time zones: {first_limit:?} in {first_tz}, \
         {second_limit:?} in {second_tz}"
    )]
    TimeZones {
        /// A limit with a schedule.
        first_limit: String,
        /// Its time zone.
        first_tz: String,
        /// A limit whose schedule is in another zone.
        second_limit: String,
        /// That zone.
        second_tz: String,
    },
    /// A patched schedule does not fit the inherited limit (a rate on a quota).
    #[error("patch_limits for {limit:?}: {reason}")]
    Patch {
        /// The limit patched.
        limit: String,
        /// Why it does not fit.
        reason: String,
    },
}

/// What [`merge_levels`] resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Merged {
    /// The effective limits, the most specific level's first.
    pub limits: Vec<Limit>,
    /// The index of the most specific level that took part (it decides the TTL,
    /// ADR-144); `None` when no level defines limits.
    pub source: Option<usize>,
    /// The indexes of every level whose limits are in the set (ADR-144: a change at one
    /// of these reaches the buckets of this resolution).
    pub contributors: Vec<usize>,
}

/// Rule "merge limits through the hierarchy" (ADR-143, §4.17): take the first level that
/// takes part; while it has `inherit_limits`, merge the next level beneath that takes
/// part. A name defined above wins wholesale; names excluded by an inheriting level above
/// are dropped; a patch by an inheriting level above replaces only the schedule of the
/// inherited limit (the most specific patch wins). Merged schedules must share one time
/// zone ([`MergeError::TimeZones`]). Without any flag this is the default rule: the first
/// level that defines limits wins whole.
pub fn merge_levels(levels: &[Option<Level<'_>>]) -> Result<Merged, MergeError> {
    let mut limits: Vec<Limit> = Vec::new();
    let mut contributors = Vec::new();
    let mut source = None;
    let mut names: BTreeSet<String> = BTreeSet::new();
    let mut excluded: BTreeSet<String> = BTreeSet::new();
    let mut patches: BTreeMap<String, Schedule> = BTreeMap::new();
    for (i, level) in levels.iter().enumerate() {
        let Some(level) = level.filter(Level::takes_part) else {
            continue;
        };
        if source.is_none() {
            source = Some(i);
        }
        let mut added = false;
        for l in level.limits {
            if names.contains(l.name()) || excluded.contains(l.name()) {
                continue;
            }
            let l = match patches.get(l.name()) {
                Some(s) => l
                    .clone()
                    .with_schedule(s.clone())
                    .map_err(|e| MergeError::Patch {
                        limit: l.name().into(),
                        reason: e.to_string(),
                    })?,
                None => l.clone(),
            };
            names.insert(l.name().to_string());
            limits.push(l);
            added = true;
        }
        if added {
            contributors.push(i);
        }
        if !level.merge.inherit {
            break;
        }
        excluded.extend(level.merge.exclude.iter().cloned());
        for (n, s) in &level.merge.patch {
            patches.entry(n.clone()).or_insert_with(|| s.clone());
        }
    }
    if contributors.len() > 1 {
        let mut first: Option<(&str, &str)> = None;
        for l in &limits {
            let Some(s) = l.schedule() else { continue };
            match first {
                None => first = Some((l.name(), s.tz())),
                Some((n, tz)) if tz != s.tz() => {
                    return Err(MergeError::TimeZones {
                        first_limit: n.into(),
                        first_tz: tz.into(),
                        second_limit: l.name().into(),
                        second_tz: s.tz().into(),
                    })
                }
                Some(_) => {}
            }
        }
    }
    debug_assert!(
        names.len() == limits.len(),
        "a merged set names each limit once"
    );
    Ok(Merged {
        limits,
        source,
        contributors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rpm(n: i64) -> Limit {
        Limit::per_minute("rpm", n).unwrap()
    }
    fn tpm(n: i64) -> Limit {
        Limit::per_minute("tpm", n).unwrap()
    }
    fn caps(m: &Merged) -> Vec<(String, i64)> {
        let mut v: Vec<_> = m
            .limits
            .iter()
            .map(|l| (l.name().to_string(), l.capacity_milli() / 1000))
            .collect();
        v.sort();
        v
    }
    fn night(tz: &str) -> Schedule {
        Schedule::new(&["* 22:00-06:00 500/500"], tz).unwrap()
    }

    /// Scenario 112: system {rpm 100, tpm 10000}; a resource level inheriting with
    /// {rpm 50} → {rpm 50, tpm 10000}; excluding tpm → {rpm 50}; patching tpm's schedule
    /// → tpm keeps 10000 and takes the schedule.
    #[test]
    fn s112_inherit_exclude_patch() {
        let system = [rpm(100), tpm(10_000)];
        let none = Merge::default();
        let own = [rpm(50)];
        let inherit = Merge {
            inherit: true,
            ..Merge::default()
        };
        let sys = Some(Level {
            limits: &system,
            merge: &none,
        });
        let res = |m: &Merge| {
            merge_levels(&[
                None,
                None,
                Some(Level {
                    limits: &own,
                    merge: m,
                }),
                sys,
            ])
            .unwrap()
        };
        let m = res(&inherit);
        assert_eq!(caps(&m), [("rpm".into(), 50), ("tpm".into(), 10_000)]);
        assert_eq!((m.source, m.contributors.clone()), (Some(2), vec![2, 3]));
        let mut ex = inherit.clone();
        ex.exclude.insert("tpm".into());
        let m = res(&ex);
        assert_eq!(caps(&m), [("rpm".into(), 50)]);
        assert_eq!(m.contributors, [2]);
        let mut p = inherit.clone();
        p.patch.insert("tpm".into(), night("UTC"));
        let m = res(&p);
        assert_eq!(caps(&m), [("rpm".into(), 50), ("tpm".into(), 10_000)]);
        let t = m.limits.iter().find(|l| l.name() == "tpm").unwrap();
        assert_eq!(t.schedule(), Some(&night("UTC")));
        // A patch never touches a limit the patching level defines itself.
        let mut p = inherit.clone();
        p.patch.insert("rpm".into(), night("UTC"));
        let m = res(&p);
        assert!(m.limits.iter().all(|l| l.schedule().is_none()));
        // Without the flag the resource level replaces the system level whole.
        assert_eq!(caps(&res(&none)), [("rpm".into(), 50)]);
    }

    /// Scenario 113: merge flags at the system level are refused.
    #[test]
    fn s113_system_cannot_inherit() {
        let m = Merge {
            inherit: true,
            ..Merge::default()
        };
        assert!(m.validate(true).is_err());
        assert!(m.validate(false).is_ok());
        let mut only_exclude = Merge::default();
        only_exclude.exclude.insert("tpm".into());
        assert!(only_exclude.validate(false).is_err());
    }

    /// Scenario 114: merged schedules in different time zones are refused.
    #[test]
    fn s114_time_zones_conflict() {
        let none = Merge::default();
        let inherit = Merge {
            inherit: true,
            ..Merge::default()
        };
        let own = [rpm(50).with_schedule(night("Europe/Berlin")).unwrap()];
        let system = [tpm(10_000).with_schedule(night("UTC")).unwrap()];
        let e = merge_levels(&[
            Some(Level {
                limits: &own,
                merge: &inherit,
            }),
            None,
            None,
            Some(Level {
                limits: &system,
                merge: &none,
            }),
        ])
        .unwrap_err();
        assert!(matches!(e, MergeError::TimeZones { .. }), "{e}");
        assert!(e.to_string().contains("Europe/Berlin"), "{e}");
        // One level alone keeps whatever zones it has (no merge happened).
        let own2 = [
            rpm(50).with_schedule(night("Europe/Berlin")).unwrap(),
            tpm(1).with_schedule(night("UTC")).unwrap(),
        ];
        assert!(merge_levels(&[Some(Level {
            limits: &own2,
            merge: &none
        })])
        .is_ok());
    }

    /// Inheriting through a chain: entity inherits from the resource level, which inherits
    /// from the system; the entity's exclude reaches the system's limits too.
    #[test]
    fn chains_and_skipped_levels() {
        let none = Merge::default();
        let inherit = Merge {
            inherit: true,
            ..Merge::default()
        };
        let mut inherit_ex = inherit.clone();
        inherit_ex.exclude.insert("tpm".into());
        let day = [Limit::per_day("rpd", 1000).unwrap()];
        let r = [rpm(50)];
        let s = [rpm(100), tpm(10_000)];
        let levels = |top: &'_ Merge| -> Merged {
            merge_levels(&[
                Some(Level {
                    limits: &day,
                    merge: top,
                }),
                None,
                Some(Level {
                    limits: &r,
                    merge: &inherit,
                }),
                Some(Level {
                    limits: &s,
                    merge: &none,
                }),
            ])
            .unwrap()
        };
        let m = levels(&inherit);
        assert_eq!(
            caps(&m),
            [
                ("rpd".into(), 1000),
                ("rpm".into(), 50),
                ("tpm".into(), 10_000)
            ]
        );
        assert_eq!(m.contributors, [0, 2, 3]);
        let m = levels(&inherit_ex);
        assert_eq!(caps(&m), [("rpd".into(), 1000), ("rpm".into(), 50)]);
        // Nothing defined anywhere.
        let m = merge_levels(&[None, None, None, None]).unwrap();
        assert_eq!((m.limits.len(), m.source), (0, None));
    }

    /// A patch setting a rate on an inherited quota does not fit: a typed error.
    #[test]
    fn a_patch_that_does_not_fit() {
        let none = Merge::default();
        let mut p = Merge {
            inherit: true,
            ..Merge::default()
        };
        p.patch.insert("rpd".into(), night("UTC"));
        let q = [Limit::quota_calendar("rpd", 1000, "0 0 * * *", "UTC").unwrap()];
        let e = merge_levels(&[
            Some(Level {
                limits: &[],
                merge: &p,
            }),
            Some(Level {
                limits: &q,
                merge: &none,
            }),
        ])
        .unwrap_err();
        assert!(matches!(e, MergeError::Patch { .. }), "{e}");
    }
}

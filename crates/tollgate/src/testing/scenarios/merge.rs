//! Merged limits (ADR-143/144; spec-shards-windows-quotas.md §4.17, §5.15 scenarios
//! 112–114 and 116): a level with `inherit_limits` takes the limits of the levels beneath
//! it by name; a change at a level reaches exactly the buckets whose merged set holds it.
#![allow(missing_docs)]

use crate::testing::*;
use crate::{Error, Limit, Merge, Scope};
use tollgate_core::schedule::Schedule;

const R: &str = "llm";

fn rpm(n: i64) -> Limit {
    Limit::per_minute("rpm", n).unwrap()
}

fn tpm(n: i64) -> Limit {
    Limit::per_minute("tpm", n).unwrap()
}

fn inherit() -> Merge {
    Merge {
        inherit: true,
        ..Merge::default()
    }
}

fn night(tz: &str) -> Schedule {
    Schedule::new(&["* 22:00-06:00 500/500"], tz).unwrap()
}

/// (name, capacity in tokens) of the limits resolved for (e, R), sorted.
async fn caps(h: &H, e: &str) -> Vec<(String, i64)> {
    let mut v: Vec<_> = h
        .lim
        .resolve_limits(e, R)
        .await
        .unwrap()
        .iter()
        .map(|l| (l.name().to_string(), l.capacity_milli() / 1000))
        .collect();
    v.sort();
    v
}

async fn system(h: &H, limits: &[Limit]) {
    h.lim
        .admin()
        .set_limits(&Scope::System, limits)
        .await
        .unwrap();
}

async fn resource(h: &H, limits: &[Limit], m: &Merge) {
    h.lim
        .admin()
        .set_merged_limits(&Scope::Resource(R.into()), limits, m)
        .await
        .unwrap();
}

/// Scenario 112: system {rpm 100, tpm 10000}; the resource level inherits with {rpm 50} →
/// {rpm 50, tpm 10000}, enforced as such; excluding tpm → {rpm 50}; patching only tpm's
/// schedule → tpm keeps 10000 with the patched schedule. Without the flag the resource
/// level still replaces the system level whole (the default is unchanged).
pub async fn s112_inherit_exclude_patch(b: &Backend) {
    let h = b.harness(T0).await;
    system(&h, &[rpm(100), tpm(10_000)]).await;
    resource(&h, &[rpm(50)], &Merge::default()).await;
    assert_eq!(caps(&h, "e").await, [("rpm".into(), 50)]);
    resource(&h, &[rpm(50)], &inherit()).await;
    assert_eq!(
        caps(&h, "e").await,
        [("rpm".into(), 50), ("tpm".into(), 10_000)]
    );
    // Enforced: the bucket holds both, tpm at the system's capacity.
    h.lim
        .acquire("e", R, &[("rpm", 1), ("tpm", 9_000)])
        .await
        .unwrap();
    assert_eq!(h.n("e", R, 0, "b_rpm_cp"), Some(50_000));
    assert_eq!(h.n("e", R, 0, "b_tpm_cp"), Some(10_000_000));
    assert_eq!(h.n("e", R, 0, "b_tpm_tk"), Some(1_000_000));
    let x = h.lim.acquire("e", R, &[("tpm", 1_001)]).await.unwrap_err();
    assert!(matches!(x, Error::RateLimitExceeded(_)), "{x}");
    // The flags are stored and read back.
    let mut ex = inherit();
    ex.exclude.insert("tpm".into());
    resource(&h, &[rpm(50)], &ex).await;
    assert_eq!(
        h.lim.get_merge(&Scope::Resource(R.into())).await.unwrap(),
        ex
    );
    assert_eq!(caps(&h, "e").await, [("rpm".into(), 50)]);
    let x = h.lim.acquire("e", R, &[("tpm", 1)]).await.unwrap_err();
    assert!(matches!(x, Error::UnknownLimit { .. }), "{x}");
    let mut p = inherit();
    p.patch.insert("tpm".into(), night("UTC"));
    resource(&h, &[rpm(50)], &p).await;
    let limits = h.lim.resolve_limits("e", R).await.unwrap();
    let t = limits.iter().find(|l| l.name() == "tpm").unwrap();
    assert_eq!(t.capacity_milli(), 10_000_000);
    assert_eq!(t.schedule(), Some(&night("UTC")));
    // The system level itself is untouched by the patch.
    let (sys, _) = h.lim.get_limits(&Scope::System).await.unwrap();
    assert!(sys.iter().all(|l| l.schedule().is_none()));
}

/// Scenario 113: merge flags on the system config are refused (nothing written); so are
/// exclusions or patches without `inherit_limits`.
pub async fn s113_system_cannot_inherit(b: &Backend) {
    let h = b.harness(T0).await;
    let e = h
        .lim
        .admin()
        .set_merged_limits(&Scope::System, &[rpm(100)], &inherit())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Invalid(_)), "{e}");
    assert!(e.to_string().contains("system level"), "{e}");
    assert!(h.lim.get_limits(&Scope::System).await.unwrap().0.is_empty());
    let mut only_exclude = Merge::default();
    only_exclude.exclude.insert("tpm".into());
    let e = h
        .lim
        .admin()
        .set_merged_limits(&Scope::Resource(R.into()), &[rpm(1)], &only_exclude)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("inherit_limits"), "{e}");
}

/// Scenario 114: merged schedules in different time zones → the typed conflict (the
/// spec's RateLimiterUnavailable), on resolution and on acquire; nothing is written.
pub async fn s114_time_zones_conflict(b: &Backend) {
    let h = b.harness(T0).await;
    system(&h, &[tpm(10_000).with_schedule(night("UTC")).unwrap()]).await;
    resource(
        &h,
        &[rpm(50).with_schedule(night("Europe/Berlin")).unwrap()],
        &inherit(),
    )
    .await;
    let e = h.lim.resolve_limits("e", R).await.unwrap_err();
    assert!(matches!(e, Error::LimitsConflict { .. }), "{e}");
    assert!(e.to_string().contains("Europe/Berlin"), "{e}");
    let e = h.lim.acquire("e", R, &[("rpm", 1)]).await.unwrap_err();
    assert!(matches!(e, Error::LimitsConflict { .. }), "{e}");
    assert!(h.raw.raw_get(&h.key("e", R, 0)).is_none(), "no bucket made");
    // The same zones merge.
    resource(
        &h,
        &[rpm(50).with_schedule(night("UTC")).unwrap()],
        &inherit(),
    )
    .await;
    h.lim.acquire("e", R, &[("rpm", 1)]).await.unwrap();
}

/// Scenario 116 (ADR-144): a system-level change reaches the buckets of an entity whose
/// config inherits it (stored `cp` updated on its next acquire), and not those of an
/// entity whose own config does not inherit. The merged bucket is entity-sourced: no TTL.
pub async fn s116_change_reaches_merged_buckets_only(b: &Backend) {
    let h = b.harness(T0).await;
    system(&h, &[rpm(100), tpm(10_000)]).await;
    for (e, m) in [("merged", inherit()), ("own", Merge::default())] {
        h.lim
            .admin()
            .set_merged_limits(&Scope::Entity(e.into(), Some(R.into())), &[rpm(5)], &m)
            .await
            .unwrap();
        h.lim.acquire(e, R, &[("rpm", 1)]).await.unwrap();
    }
    assert_eq!(h.n("merged", R, 0, "b_tpm_cp"), Some(10_000_000));
    assert_eq!(h.n("merged", R, 0, "ttl"), None, "entity-sourced: no TTL");
    assert_eq!(h.n("own", R, 0, "b_tpm_cp"), None);
    system(&h, &[rpm(100), tpm(20_000)]).await;
    h.at(T0 + 1_000);
    for e in ["merged", "own"] {
        h.lim.acquire(e, R, &[("rpm", 1)]).await.unwrap();
    }
    assert_eq!(h.n("merged", R, 0, "b_tpm_cp"), Some(20_000_000));
    assert_eq!(h.n("merged", R, 0, "b_rpm_cp"), Some(5_000));
    assert_eq!(h.n("own", R, 0, "b_tpm_cp"), None);
    assert_eq!(h.n("own", R, 0, "b_rpm_cp"), Some(5_000));
    // A second client whose cache predates the change follows it within its TTL.
    let slow = h.slow();
    slow.acquire("merged", R, &[("tpm", 20_000)]).await.ok();
    system(&h, &[rpm(100), tpm(30_000)]).await;
    h.at(T0 + 61_000);
    slow.acquire("merged", R, &[("rpm", 1)]).await.unwrap();
    assert_eq!(h.n("merged", R, 0, "b_tpm_cp"), Some(30_000_000));
}

//! Mutation switches for the deterministic simulator (`tollgate-sim --mutant NAME`).
//!
//! Each [`Mutant`] names one guard of the sharding and window rules. A rule site reads
//! `if !mutants::off(Mutant::X) { guard } else { the unguarded variant }`. Without the cargo
//! feature `mutants`, [`off`] is a `const fn` returning `false`, so release builds compile the
//! guards only and pay nothing. With the feature (the simulator enables it), one process-global
//! setting disables the chosen guards, so the simulator can show that its invariants catch the
//! bug each guard prevents.

/// A guard the simulator can disable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mutant {
    /// ADR-139/140 ended-window floor of the fan-out condition (falls back to `ws < new`).
    WindowFloor,
    /// ADR-140 roll predicate on `wa` (falls back to `ws > rf` only).
    WaMarker,
    /// ADR-140 roll target charging `tc − wtc` (falls back to the plain share).
    WtcCharge,
    /// ADR-140 monotonic `rf` (falls back to the writer's own `now`).
    MonotonicRf,
    /// ADR-139 strongly consistent read of shard 0 when seeding a window on a new shard.
    ConsistentSiblingRead,
    /// ADR-145 grant move (a quota on a new shard is funded by a sibling, not minted).
    GrantMove,
    /// The `rf = expected` lock of the slow path's normal write.
    RfLock,
    /// The dripping trust horizon: `vu` never past the instant a dripping balance is full
    /// again, required by balance-only writes, and kept by refunds and rf-locked writes
    /// (falls back to the original's "no `vu` or `vu` later" with `vu` from boundaries only).
    TrustHorizon,
    /// A lease refuses a refund beyond what it consumed (falls back to accepting any).
    LeaseNet,
    /// A request or a lease's usage that one shard cannot cover is charged across the
    /// entity's shards (falls back to one shard: refusals while the entity could pay, debt
    /// stranded on one shard).
    EntityDebit,
    /// A new dripping shard is funded by splitting its covering sibling (falls back to a
    /// fresh share: a doubling mints).
    DripSplit,
    /// A store call is abandoned at its deadline (`tollgate_store::Deadline`; falls back to
    /// waiting for the answer however long it takes).
    StoreDeadline,
    /// ADR-148: a refused multi-resource acquire refunds every resource it already debited
    /// (falls back to leaving the first landed resource charged).
    MultiRefund,
    /// ADR-151: only the soft limit itself skips its balance check (falls back to one soft
    /// limit exempting every limit of the request).
    SoftScope,
    /// ADR-149 "an operation lands once": a retried reset / top-up that reads its own `op`
    /// back writes nothing (falls back to applying it again).
    OpOnce,
    /// The feed aggregator moves its checkpoint only from the one it read (falls back to an
    /// unconditional write: two aggregators that read one batch both count it).
    UsageCheckpoint,
    /// ADR-151: a write shaped for a bypassed scope requires the item's `bypass` stamp
    /// (falls back to no stamp condition: a client whose cache still says "bypassed" admits
    /// without debiting after enforcement resumed).
    BypassStamp,
    /// An absorbing aggregator commits the sums of a failed commit again from memory
    /// (rule "held usage is committed from memory, never re-read"; falls back to what a
    /// re-reading pass does: forget them and read again from the checkpoint — where the
    /// feed no longer has them).
    HeldCommit,
}

impl Mutant {
    /// Every mutant, in declaration order.
    pub const ALL: [Mutant; 18] = [
        Mutant::WindowFloor,
        Mutant::WaMarker,
        Mutant::WtcCharge,
        Mutant::MonotonicRf,
        Mutant::ConsistentSiblingRead,
        Mutant::GrantMove,
        Mutant::RfLock,
        Mutant::TrustHorizon,
        Mutant::LeaseNet,
        Mutant::EntityDebit,
        Mutant::DripSplit,
        Mutant::StoreDeadline,
        Mutant::MultiRefund,
        Mutant::SoftScope,
        Mutant::OpOnce,
        Mutant::UsageCheckpoint,
        Mutant::BypassStamp,
        Mutant::HeldCommit,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Mutant::WindowFloor => "WindowFloor",
            Mutant::WaMarker => "WaMarker",
            Mutant::WtcCharge => "WtcCharge",
            Mutant::MonotonicRf => "MonotonicRf",
            Mutant::ConsistentSiblingRead => "ConsistentSiblingRead",
            Mutant::GrantMove => "GrantMove",
            Mutant::RfLock => "RfLock",
            Mutant::TrustHorizon => "TrustHorizon",
            Mutant::LeaseNet => "LeaseNet",
            Mutant::EntityDebit => "EntityDebit",
            Mutant::DripSplit => "DripSplit",
            Mutant::StoreDeadline => "StoreDeadline",
            Mutant::MultiRefund => "MultiRefund",
            Mutant::SoftScope => "SoftScope",
            Mutant::OpOnce => "OpOnce",
            Mutant::UsageCheckpoint => "UsageCheckpoint",
            Mutant::BypassStamp => "BypassStamp",
            Mutant::HeldCommit => "HeldCommit",
        }
    }

    /// Parse a name (case-insensitive; `-` and `_` ignored).
    pub fn parse(s: &str) -> Option<Mutant> {
        let norm = |x: &str| {
            x.chars()
                .filter(|c| *c != '-' && *c != '_')
                .collect::<String>()
                .to_ascii_lowercase()
        };
        let want = norm(s);
        Mutant::ALL.into_iter().find(|m| norm(m.name()) == want)
    }

    #[cfg(feature = "mutants")]
    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

#[cfg(feature = "mutants")]
static DISABLED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Disable exactly the guards in `ms` (an empty slice restores every guard). Process-global.
#[cfg(feature = "mutants")]
pub fn set(ms: &[Mutant]) {
    let bits = ms.iter().fold(0, |a, m| a | m.bit());
    DISABLED.store(bits, std::sync::atomic::Ordering::SeqCst);
}

/// Whether the guard `m` is disabled.
#[cfg(feature = "mutants")]
pub fn off(m: Mutant) -> bool {
    DISABLED.load(std::sync::atomic::Ordering::Relaxed) & m.bit() != 0
}

/// Whether the guard `m` is disabled: never, in builds without the `mutants` feature.
#[cfg(not(feature = "mutants"))]
#[inline(always)]
pub const fn off(_m: Mutant) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for m in Mutant::ALL {
            assert_eq!(Mutant::parse(m.name()), Some(m));
        }
        assert_eq!(Mutant::parse("wtc-charge"), Some(Mutant::WtcCharge));
        assert_eq!(Mutant::parse("nope"), None);
    }
}

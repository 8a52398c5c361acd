//! Bypassed scopes, ADR-151: the rules of a write on an (entity, resource) whose bucket
//! items carry the `bypass` stamp.
//!
//! Rule "a bypassed scope records, never debits": every acquire is admitted; its amounts
//! are added to `tc` (and the request to `rq`, dated by `wt`) but to no balance; the write
//! capacity meter `wcu` is still charged and still guards the item. A bypass pass never
//! opens or rolls a window and never resets a quota: the balances stay as they were (a
//! dripping limit still refills), so when enforcement resumes each balance is exactly its
//! value before the bypass plus its refill, and the first enforced pass applies whatever
//! reset or window is due then.
//!
//! Rule "the stamp decides, the cache guesses": a write is shaped for bypass or for
//! enforcement from what the writer last saw, and conditioned on the item carrying the
//! stamp it was shaped for ([`stamp`]). A bypass-shaped write that meets an item without
//! the stamp fails and is retried enforced — that condition is what keeps a client whose
//! cache still says "bypassed" from admitting for free after enforcement resumed
//! (mutant `BypassStamp`). An enforce-shaped write that meets a stamped item fails too and
//! is retried bypass-shaped, so no balance is debited while the scope is bypassed.

use crate::bucket::{attr, field, BucketImage, LimitState, WCU_COST};
use crate::expr::{Condition, Update};
use crate::keys::battr;
use crate::materialize::{Evaluated, Transition};
use crate::mutants::{self, Mutant};
use crate::value::{Item, Value};
use crate::writes::{Amounts, FastFailure};

/// How an (entity, resource) treats its limits: the item-level stamps `disabled` and
/// `bypass` (at most one is present).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Enforcement {
    /// Limits refuse what they cannot cover (no stamp).
    #[default]
    Enforce,
    /// Every acquire is refused (`disabled`).
    Disabled,
    /// Every acquire is admitted and recorded, nothing debited but `wcu` (`bypass`).
    Bypass,
}

impl Enforcement {
    /// The mode a decoded item is in.
    pub fn of(img: &BucketImage) -> Self {
        if img.disabled {
            Enforcement::Disabled
        } else if img.bypass {
            Enforcement::Bypass
        } else {
            Enforcement::Enforce
        }
    }

    /// The stored (and listed) name.
    pub fn as_str(self) -> &'static str {
        match self {
            Enforcement::Enforce => "enforce",
            Enforcement::Disabled => "disabled",
            Enforcement::Bypass => "bypass",
        }
    }

    /// The write that puts an item in this mode (the other stamp removed).
    pub fn stamp_update(self) -> Update {
        match self {
            // `vu = 0`: the first enforced write materialises (opens, rolls, resets what a
            // bypass held back) instead of debiting a balance only.
            Enforcement::Enforce => Update::new()
                .remove(attr::DISABLED)
                .remove(attr::BYPASS)
                .set(attr::VU, VALID_UNTIL),
            Enforcement::Disabled => Update::new().set(attr::DISABLED, true).remove(attr::BYPASS),
            Enforcement::Bypass => Update::new().remove(attr::DISABLED).set(attr::BYPASS, true),
        }
    }
}

impl std::str::FromStr for Enforcement {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "enforce" => Ok(Enforcement::Enforce),
            "disabled" => Ok(Enforcement::Disabled),
            "bypass" => Ok(Enforcement::Bypass),
            _ => Err(format!(
                "enforcement is 'enforce', 'disabled' or 'bypass', not {s:?}"
            )),
        }
    }
}

impl std::fmt::Display for Enforcement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Rule "a scope's mode is its most specific level's": the mode an (entity, resource) is
/// in is the first level, in the order entity + resource, entity default, resource,
/// system, whose config sets one (`levels` in that order); `None` when none does (the
/// pair is then enforced).
pub fn scope_mode(levels: &[Option<Enforcement>]) -> Option<Enforcement> {
    levels.iter().flatten().next().copied()
}

/// The parameter hash an item carries under `mode`: the limits' hash, with the mode
/// appended when a level sets one. A change of mode then changes the hash, so the fast
/// path's `ph` term sends each bucket's next write to the slow path, where
/// [`flip`] brings its stamp in line; with no mode set the hash is the limits' alone
/// (every item written before modes were stored keeps its hash).
pub fn policy_hash(params_hash: &str, mode: Option<Enforcement>) -> String {
    match mode {
        None => params_hash.to_string(),
        Some(m) => format!("{params_hash}/{m}"),
    }
}

/// Rule "a scope's mode reaches its buckets on their slow pass": the bypass stamp an
/// rf-locked write sets on `img` so that it follows the configured `mode` (no level
/// setting one: enforce) — `Some(true)` to stamp it, `Some(false)` to lift it, `None` when
/// the item already agrees (or the mode is `disabled`, which refuses before any write).
/// The write that flips is conditioned on the stamp it found ([`stamp`]) and planned in
/// the new shape.
pub fn flip(img: &BucketImage, mode: Option<Enforcement>) -> Option<bool> {
    match mode.unwrap_or_default() {
        Enforcement::Bypass if !img.bypass => Some(true),
        Enforcement::Enforce if img.bypass => Some(false),
        _ => None,
    }
}

/// The `vu` every bypass pass stamps: 0, "forced slow path" — nothing a bypass writes is
/// trusted by a balance-only enforced write, so the first enforced write after the bypass
/// is an rf-locked one that applies what is due.
pub const VALID_UNTIL: i64 = 0;

/// The condition that the item carries the stamp a write was shaped for: `bypass` present
/// for a bypass-shaped write, absent for an enforced one.
pub fn stamp(bypassed: bool) -> Condition {
    if bypassed {
        if mutants::off(Mutant::BypassStamp) {
            // Mutant: a bypass-shaped write lands whatever the item says.
            return Condition::exists("PK");
        }
        Condition::exists(attr::BYPASS)
    } else {
        Condition::not_exists(attr::BYPASS)
    }
}

/// Whether a write shaped for `bypassed` failed because the item carries the other stamp
/// (classified right after "missing" and "disabled", spec §4.3).
pub fn mismatch(img: &BucketImage, bypassed: bool) -> bool {
    img.bypass != bypassed
}

/// The speculative write of a bypassed scope (§4.3, bypass shape): ADD each amount to `tc`
/// only and one write to `wcu`, count the request. Condition: the item exists, carries the
/// `bypass` stamp ([`stamp`]), is not disabled or expired, holds the caller's parameters
/// (`ph`, so every named limit is on it) and has one `wcu` token. No balance, `vu` or trust
/// term: nothing but `tc` and `wcu` moves.
pub fn fast_write(amounts: &Amounts, ph: &str, now_ms: i64) -> (Update, Condition) {
    let mut u = Update::new();
    for (n, amt) in amounts {
        if *amt != 0 {
            u = u.add(battr(n, field::TC), *amt);
        }
    }
    u = u
        .add(crate::bucket::wcu_attr::TK, -WCU_COST)
        .add(crate::bucket::wcu_attr::TC, WCU_COST);
    u = crate::usage::stamp_write_time(crate::usage::count_request(u), now_ms);
    let c = Condition::exists("PK")
        .and(stamp(true))
        .and(Condition::ge(crate::bucket::wcu_attr::TK, WCU_COST))
        .and(Condition::not_exists(attr::TTL).or(Condition::gt(attr::TTL, now_ms / 1000)))
        .and(Condition::not_exists(attr::DISABLED))
        .and(Condition::eq(attr::PH, ph));
    (u, c)
}

/// Why a bypass-shaped write failed on the item it returned (the §4.3 order): disabled,
/// the stamp gone (retry enforced), expired, parameters changed, else `wcu` short.
pub fn classify(img: &BucketImage, ph: &str, now_ms: i64) -> FastFailure {
    if img.disabled {
        FastFailure::Disabled
    } else if mismatch(img, true) {
        FastFailure::StampMismatch
    } else if img.ttl.is_some_and(|t| t <= now_ms / 1000) {
        FastFailure::Expired
    } else if img.params_hash.as_deref() != Some(ph) {
        FastFailure::ParamsChanged
    } else {
        FastFailure::WcuExhausted
    }
}

/// Rule "bypass never opens, rolls or resets": `e` as a bypass pass materialises it from
/// `state` (read at `rf`). A calendar reset, a window open or roll that [`crate::materialize::evaluate`]
/// found due is not applied: the balance, window start, marks and grant stay as read (an
/// unmarked calendar quota is marked with the edge its balance reflects, `rf`, so moving `rf`
/// does not skip the reset). A window seeded without a sibling to join opens nothing: the
/// slot is funded, and the first enforced pass opens its window. Refills and seeds are
/// otherwise kept.
pub fn hold(mut e: Evaluated, state: Option<&LimitState>, rf: i64) -> Evaluated {
    match (e.transition, state) {
        (Transition::Seed, _) if e.opened => {
            e.opened = false;
            e.window_start_ms = None;
            e.window_applied_ms = None;
        }
        (Transition::CalendarReset, Some(st)) => {
            e.balance = st.balance;
            e.grant_count = None;
            e.period_applied_ms = Some(st.period_applied_ms.unwrap_or(rf));
            e.topped_up = st.topped_up;
            e.transition = Transition::Kept;
        }
        (Transition::WindowOpen | Transition::WindowRoll, Some(st)) => {
            e.balance = st.balance;
            e.grant_count = None;
            e.opened = false;
            e.window_start_ms = st.window_start_ms;
            e.window_applied_ms = st.window_applied_ms;
            e.topped_up = st.topped_up;
            e.transition = Transition::Kept;
        }
        _ => {}
    }
    e
}

/// A shard created while its scope is bypassed: stamped `bypass`, every balance funded as
/// the create evaluated it (the amounts recorded in `tc` only, as [`crate::writes::create_item`]
/// wrote them).
pub fn stamp_created(item: &mut Item, evals: &[Evaluated]) {
    item.insert(attr::BYPASS.into(), Value::Bool(true));
    for e in evals {
        item.insert(battr(&e.name, field::TK).into(), Value::N(e.balance));
    }
}

/// The names of `amounts`: under bypass each is charged to `tc` only
/// ([`crate::writes::Charging::tc_only`]).
pub fn tc_only(amounts: &Amounts) -> Vec<String> {
    amounts.iter().map(|(n, _)| n.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Limit;
    use crate::materialize::evaluate;
    use std::time::Duration;

    /// Scenario 108's write: tc +5000, wcu −1000, no balance term, the stamp required.
    #[test]
    fn the_bypass_shape_moves_tc_and_wcu_only() {
        let (u, c) = fast_write(&[("rpm".into(), 5000)], "ph", 1_000);
        let text = format!("{u:?} {c:?}");
        assert!(!text.contains("b_rpm_tk"), "{text}");
        assert!(text.contains("b_rpm_tc"), "{text}");
        assert!(text.contains("b_wcu_tk"), "{text}");
        assert!(text.contains("bypass"), "{text}");
    }

    /// Scenario 109's rule: a window seeded under bypass writes no start; a due open or
    /// reset on a stored limit keeps the balance read.
    #[test]
    fn bypass_opens_no_window_and_resets_nothing() {
        let session = Limit::quota_after("session", 10, Duration::from_secs(3600)).unwrap();
        let seeded = hold(evaluate(&session, None, 0, 1, 1_000, None), None, 0);
        assert_eq!(
            (
                seeded.window_start_ms,
                seeded.window_applied_ms,
                seeded.opened
            ),
            (None, None, false)
        );
        assert_eq!(seeded.balance, 10_000, "the slot is still funded");
        let st = LimitState {
            balance: 4_000,
            capacity: 10_000,
            window_s: Some(3600),
            ..LimitState::default()
        };
        let due = evaluate(&session, Some(&st), 500, 1, 1_000, None);
        assert_eq!(due.transition, Transition::WindowOpen);
        let held = hold(due, Some(&st), 500);
        assert_eq!(held.transition, Transition::Kept);
        assert_eq!(
            (held.balance, held.window_start_ms, held.opened),
            (4_000, None, false)
        );
    }

    /// The most specific level that sets a mode decides; none set leaves the stamps alone.
    #[test]
    fn the_most_specific_level_decides() {
        use Enforcement::*;
        assert_eq!(
            scope_mode(&[None, None, Some(Bypass), Some(Disabled)]),
            Some(Bypass)
        );
        assert_eq!(
            scope_mode(&[Some(Enforce), None, Some(Bypass), None]),
            Some(Enforce)
        );
        assert_eq!(scope_mode(&[None, None, None, None]), None);
    }

    /// A mode changes the hash; no mode keeps the limits' hash unchanged.
    #[test]
    fn a_mode_changes_the_policy_hash() {
        assert_eq!(policy_hash("abc", None), "abc");
        assert_ne!(
            policy_hash("abc", Some(Enforcement::Bypass)),
            policy_hash("abc", Some(Enforcement::Enforce))
        );
    }

    /// The slow pass flips the stamp only towards the configured mode.
    #[test]
    fn a_flip_follows_the_configured_mode() {
        let mut img = BucketImage {
            key: crate::value::Key::new("k", ""),
            refilled_at_ms: 0,
            valid_until_ms: None,
            ttl: None,
            shard_count: 1,
            params_hash: None,
            limits: Default::default(),
            wcu: None,
            disabled: false,
            bypass: false,
            op: None,
            cascade: None,
            layout: Default::default(),
        };
        assert_eq!(flip(&img, Some(Enforcement::Bypass)), Some(true));
        assert_eq!(flip(&img, Some(Enforcement::Enforce)), None);
        assert_eq!(flip(&img, None), None);
        img.bypass = true;
        assert_eq!(flip(&img, Some(Enforcement::Enforce)), Some(false));
        assert_eq!(flip(&img, Some(Enforcement::Disabled)), None);
        assert_eq!(flip(&img, None), Some(false), "no mode stored: enforced");
    }
}

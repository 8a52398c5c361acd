//! Cascade rules that need no store (ADR-146): whether a child entity spends from its
//! parent. The limiter's cascade executes the two acquires.

/// Rule ADR-146 / C3, the effective cascade policy of (entity, resource): the first
/// explicit flag along the ADR-125 walk `[entity×resource config, entity _default_ config,
/// resource config]`, else the entity META's `cascade`, else off. An entity without a parent
/// never cascades, whatever the flags say.
pub fn effective_policy(walk: [Option<bool>; 3], meta: Option<bool>, parent: Option<&str>) -> bool {
    if parent.is_none() {
        return false;
    }
    walk.into_iter().flatten().next().or(meta).unwrap_or(false)
}

/// Rule C3 (ADR-146), "a disagreeing stamp is a question, a fresh read the answer": once
/// the child's write has returned its bucket item, whether the acquire re-reads its config
/// (consistently, bypassing the cache) before it decides the parent write. It does when the
/// item's cascade `stamp` disagrees with the `policy` the acquire planned with and that
/// policy is not itself the answer of such a re-read (`confirmed`): at most one re-read per
/// cached resolution of (entity, resource) in a process, never a loop. An item without a
/// stamp questions nothing. The stamp never decides by itself: it may be older than the
/// cache (config changes do not restamp buckets), so only the re-read's policy does.
pub fn stamp_questions_policy(policy: bool, stamp: Option<bool>, confirmed: bool) -> bool {
    !confirmed && stamp.is_some_and(|s| s != policy)
}

/// What the parent write of a cascade acquire becomes once a re-read answered (rule C3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParentCorrection {
    /// The re-read agrees with the plan: write (or skip) the parent as planned.
    AsPlanned,
    /// The plan left the parent out but the entity cascades: add the parent write.
    Add,
    /// The plan charged the parent but the entity no longer cascades: leave it out.
    Drop,
}

/// Rule C3 (ADR-146): the parent write after a re-read, from whether the acquire `planned`
/// one and whether the re-read policy cascades. The child is written first and the parent
/// only after this is decided, so a dropped parent write never needs a refund.
pub fn correct_parent(planned: bool, reread: bool) -> ParentCorrection {
    match (planned, reread) {
        (false, true) => ParentCorrection::Add,
        (true, false) => ParentCorrection::Drop,
        _ => ParentCorrection::AsPlanned,
    }
}

#[cfg(test)]
mod tests {
    use super::{correct_parent, effective_policy, stamp_questions_policy, ParentCorrection};

    /// C3: only a disagreeing stamp on an unconfirmed policy asks for a re-read.
    #[test]
    fn a_disagreeing_stamp_asks_once() {
        assert!(stamp_questions_policy(false, Some(true), false));
        assert!(stamp_questions_policy(true, Some(false), false));
        assert!(!stamp_questions_policy(true, Some(true), false));
        assert!(!stamp_questions_policy(false, None, false));
        // Already the answer of a re-read: the stamp is the stale one.
        assert!(!stamp_questions_policy(false, Some(true), true));
        assert_eq!(correct_parent(false, true), ParentCorrection::Add);
        assert_eq!(correct_parent(true, false), ParentCorrection::Drop);
        assert_eq!(correct_parent(true, true), ParentCorrection::AsPlanned);
        assert_eq!(correct_parent(false, false), ParentCorrection::AsPlanned);
    }

    /// C3: the first explicit flag along the walk wins over META; no parent, no cascade.
    #[test]
    fn the_first_explicit_flag_wins() {
        assert!(effective_policy(
            [None, Some(true), Some(false)],
            Some(false),
            Some("p")
        ));
        assert!(!effective_policy(
            [Some(false), Some(true), None],
            Some(true),
            Some("p")
        ));
        assert!(effective_policy([None, None, None], Some(true), Some("p")));
        assert!(!effective_policy([None, None, None], None, Some("p")));
        assert!(!effective_policy(
            [Some(true), None, None],
            Some(true),
            None
        ));
    }
}

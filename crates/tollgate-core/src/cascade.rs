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

#[cfg(test)]
mod tests {
    use super::effective_policy;

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

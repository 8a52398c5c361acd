//! Multi-resource acquire (ADR-148): the rules that do not need the store — how many
//! resources one call may name, and which failure the call reports when several resources
//! fail at once.

use crate::error::RuleError;

/// Most resources one multi-resource acquire may name (ADR-148).
pub const MAX_RESOURCES: usize = 16;

/// Rule "a multi-resource acquire names 1 to 16 distinct resources" (ADR-148): refused
/// before anything is read or written.
pub fn validate_resource_set(resources: &[&str]) -> Result<(), RuleError> {
    if resources.is_empty() {
        return Err(RuleError::InvalidResourceSet {
            count: 0,
            reason: "name at least one resource".into(),
        });
    }
    if resources.len() > MAX_RESOURCES {
        return Err(RuleError::InvalidResourceSet {
            count: resources.len(),
            reason: format!("at most {MAX_RESOURCES} resources per acquire"),
        });
    }
    for (i, r) in resources.iter().enumerate() {
        if resources[..i].contains(r) {
            return Err(RuleError::InvalidResourceSet {
                count: resources.len(),
                reason: format!("resource {r:?} named twice"),
            });
        }
    }
    Ok(())
}

/// How one resource of a multi-resource acquire ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// Admitted (its debit is refunded if another resource fails).
    Admitted,
    /// The store could not decide: unavailable, contended.
    Transient,
    /// A limit refused it (`RateLimitExceeded`).
    Exceeded,
    /// An administrator disabled the resource for the entity (`ResourceDisabled`).
    Disabled,
    /// The request itself is wrong for this resource: unknown limit, no limits, bad data.
    Invalid,
}

/// Rule "the decisive failure of a multi-resource acquire" (ADR-148): the index of the
/// resource whose failure the call reports, `None` when every resource was admitted.
/// A request that is wrong outranks everything (it fails whatever the balances);
/// `ResourceDisabled` outranks `RateLimitExceeded` (an operator's decision outranks a
/// balance); a refusal outranks a transient failure (retrying cannot help while a limit
/// refuses). Among equals, the first in the caller's order.
pub fn decisive(outcomes: &[Outcome]) -> Option<usize> {
    let worst = outcomes.iter().copied().max()?;
    if worst == Outcome::Admitted {
        return None;
    }
    outcomes.iter().position(|o| *o == worst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_resources_pass_seventeen_are_refused() {
        let names: Vec<String> = (0..17).map(|i| format!("r{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        assert!(validate_resource_set(&refs[..16]).is_ok());
        let e = validate_resource_set(&refs).unwrap_err();
        assert!(matches!(e, RuleError::InvalidResourceSet { count: 17, .. }));
        assert!(validate_resource_set(&[]).is_err());
        assert!(validate_resource_set(&["a", "b", "a"]).is_err());
    }

    #[test]
    fn disabled_outranks_exceeded_whatever_the_order() {
        use Outcome::*;
        assert_eq!(decisive(&[Admitted, Admitted]), None);
        assert_eq!(decisive(&[]), None);
        assert_eq!(decisive(&[Disabled, Exceeded]), Some(0));
        assert_eq!(decisive(&[Exceeded, Disabled]), Some(1));
        assert_eq!(decisive(&[Admitted, Exceeded, Exceeded]), Some(1));
        assert_eq!(decisive(&[Transient, Exceeded]), Some(1));
        assert_eq!(decisive(&[Disabled, Invalid]), Some(1));
    }
}

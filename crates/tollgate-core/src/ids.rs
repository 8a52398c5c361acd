//! Naming rules for entity ids, resources and limit names.

use crate::error::{cut, RuleError};

/// The reserved limit name of the write-capacity guard.
pub const WCU: &str = "wcu";

/// Entity ids (and parent ids): 1–256 chars, starts alphanumeric, then alphanumerics and
/// `_ . - : @`.
pub fn validate_entity_id(id: &str) -> Result<(), RuleError> {
    let bad = |reason| {
        Err(RuleError::InvalidIdentifier {
            value: cut(id),
            reason,
        })
    };
    if id.is_empty() || id.len() > 256 {
        return bad("must be 1 to 256 characters");
    }
    if !id.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return bad("must start with a letter or digit");
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "_.-:@".contains(c))
    {
        return bad("may hold only letters, digits and _ . - : @");
    }
    Ok(())
}

fn validate_name(n: &str, extra: &str, what: &'static str) -> Result<(), RuleError> {
    let bad = |reason| {
        Err(RuleError::InvalidName {
            value: cut(n),
            reason,
        })
    };
    if n.is_empty() || n.len() > 64 {
        return bad(what);
    }
    if !n.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return bad("must start with a letter");
    }
    if !n
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c) || extra.contains(c))
    {
        return bad("may hold only letters, digits and _ . - (and / in resources)");
    }
    Ok(())
}

/// Limit names: 1–64 chars, starts with a letter, then alphanumerics and `_ . -`; `wcu` is
/// reserved.
pub fn validate_limit_name(n: &str) -> Result<(), RuleError> {
    validate_name(n, "", "limit names are 1 to 64 characters")?;
    if n == WCU {
        return Err(RuleError::InvalidName {
            value: n.into(),
            reason: "'wcu' is a reserved limit name",
        });
    }
    Ok(())
}

/// Resource names: like limit names, and `/` is allowed (provider/model paths).
pub fn validate_resource(n: &str) -> Result<(), RuleError> {
    validate_name(n, "/", "resource names are 1 to 64 characters")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        assert!(validate_entity_id("user-1@acme.com").is_ok());
        assert!(validate_entity_id("a:b_c").is_ok());
        assert!(validate_entity_id("").is_err());
        assert!(validate_entity_id("-x").is_err());
        assert!(validate_entity_id("a#b").is_err());
        assert!(validate_entity_id("a b").is_err());
        assert!(validate_entity_id(&"a".repeat(257)).is_err());
        assert!(validate_entity_id(&"a".repeat(256)).is_ok());
    }

    #[test]
    fn names() {
        assert!(validate_limit_name("rpm").is_ok());
        assert!(validate_limit_name("gpt-4.o_tpm").is_ok());
        assert!(validate_limit_name("wcu").is_err());
        assert!(validate_limit_name("1rpm").is_err());
        assert!(validate_limit_name("a/b").is_err());
        assert!(validate_resource("openai/gpt-4").is_ok());
        assert!(validate_resource("_default_").is_err());
        assert!(validate_resource(&"r".repeat(65)).is_err());
    }
}

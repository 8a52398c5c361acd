//! [`Amounts`]: what one call spends or asks for — whole tokens per limit name.

use tollgate_core::ids::validate_limit_name;
use tollgate_core::limit::{MAX_TOKENS, MILLI};
use tollgate_core::RuleError;

use crate::error::{Error, Result};

/// Tokens per limit name, in whole tokens, for an acquire, a top-up or an availability
/// question. Built from a slice or array of pairs (`&[("rpm", 1), ("tpm", 500)]`, what
/// most callers write) or with [`Amounts::of`] and [`Amounts::and`]:
///
/// ```
/// use tollgate::Amounts;
/// let a = Amounts::of("rpm", 1).and("tpm", 500);
/// assert_eq!(a.get("tpm"), Some(500));
/// assert_eq!(Amounts::from(&[("rpm", 1), ("tpm", 500)]), a);
/// ```
///
/// Nothing is checked until the amounts are used: a negative or too large amount, a
/// malformed name or a name given twice is then a typed [`Error::Invalid`] and nothing is
/// read or written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Amounts {
    tokens: Vec<(String, i64)>,
}

impl Amounts {
    /// No amounts (an availability question about every limit; a zero acquire).
    pub fn new() -> Self {
        Self::default()
    }

    /// `tokens` of `limit`.
    pub fn of(limit: &str, tokens: i64) -> Self {
        Self::new().and(limit, tokens)
    }

    /// These amounts and `tokens` of `limit`.
    pub fn and(mut self, limit: &str, tokens: i64) -> Self {
        self.tokens.push((limit.to_string(), tokens));
        self
    }

    /// The tokens asked of `limit`, if it is named.
    pub fn get(&self, limit: &str) -> Option<i64> {
        self.tokens
            .iter()
            .find(|(n, _)| n == limit)
            .map(|(_, t)| *t)
    }

    /// The named amounts, in the order given.
    pub fn iter(&self) -> impl Iterator<Item = (&str, i64)> {
        self.tokens.iter().map(|(n, t)| (n.as_str(), *t))
    }

    /// Whether no limit is named.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Validate names and amounts and convert tokens to millitokens, reusing this value's
    /// memory: negative, huge or duplicate amounts and malformed names are refused before
    /// anything is read.
    pub(crate) fn into_millitokens(self) -> Result<Vec<(String, i64)>> {
        let mut out = self.tokens;
        for i in 0..out.len() {
            let (n, a) = &out[i];
            validate_limit_name(n)?;
            let refuse = |reason| {
                Err(Error::Invalid(RuleError::InvalidAmount {
                    limit: n.clone(),
                    reason,
                }))
            };
            if *a < 0 {
                return refuse("amounts must not be negative (use a lease adjustment to refund)");
            }
            if *a > MAX_TOKENS {
                return refuse("amount too large");
            }
            if out[..i].iter().any(|(x, _)| x == n) {
                return refuse("named twice");
            }
            out[i].1 *= MILLI;
        }
        Ok(out)
    }
}

impl From<&[(&str, i64)]> for Amounts {
    fn from(pairs: &[(&str, i64)]) -> Self {
        Amounts {
            tokens: pairs.iter().map(|(n, t)| (n.to_string(), *t)).collect(),
        }
    }
}

impl<const N: usize> From<&[(&str, i64); N]> for Amounts {
    fn from(pairs: &[(&str, i64); N]) -> Self {
        Self::from(&pairs[..])
    }
}

impl<const N: usize> From<[(&str, i64); N]> for Amounts {
    fn from(pairs: [(&str, i64); N]) -> Self {
        Self::from(&pairs[..])
    }
}

impl From<&Vec<(&str, i64)>> for Amounts {
    fn from(pairs: &Vec<(&str, i64)>) -> Self {
        Self::from(&pairs[..])
    }
}

impl From<Vec<(String, i64)>> for Amounts {
    fn from(tokens: Vec<(String, i64)>) -> Self {
        Amounts { tokens }
    }
}

impl From<&Amounts> for Amounts {
    fn from(a: &Amounts) -> Self {
        a.clone()
    }
}

impl FromIterator<(String, i64)> for Amounts {
    fn from_iter<I: IntoIterator<Item = (String, i64)>>(iter: I) -> Self {
        Amounts {
            tokens: iter.into_iter().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_either_way_the_same_and_validated_on_use() {
        let a = Amounts::of("rpm", 1).and("tpm", 500);
        assert_eq!(a, Amounts::from(&[("rpm", 1), ("tpm", 500)]));
        assert_eq!(
            a.clone().into_millitokens().ok(),
            Some(vec![("rpm".into(), 1_000), ("tpm".into(), 500_000)])
        );
        for bad in [
            Amounts::of("rpm", -1),
            Amounts::of("rpm", MAX_TOKENS + 1),
            Amounts::of("rpm", 1).and("rpm", 2),
            Amounts::of("no spaces", 1),
        ] {
            assert!(matches!(bad.into_millitokens(), Err(Error::Invalid(_))));
        }
        assert_eq!(Amounts::new().into_millitokens().ok(), Some(vec![]));
    }
}

//! The Envoy descriptor mapping: which entity, resource and limit a rate limit descriptor
//! charges, and how much.

use std::collections::BTreeMap;

use tollgate_core::limit::MAX_TOKENS;

mod section;

pub(crate) use section::RawEnvoy;

/// Where a descriptor rule takes a name from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// This literal.
    Value(String),
    /// The value of the descriptor entry with this key.
    Entry(String),
    /// The request's domain.
    Domain,
}

impl Source {
    fn entry_key(&self) -> Option<&str> {
        match self {
            Source::Entry(k) => Some(k),
            _ => None,
        }
    }

    fn pick<'a>(&'a self, domain: &'a str, entries: &'a [(String, String)]) -> Option<&'a str> {
        match self {
            Source::Value(v) => Some(v),
            Source::Domain => Some(domain),
            Source::Entry(k) => entries
                .iter()
                .find(|(ek, _)| ek == k)
                .map(|(_, v)| v.as_str()),
        }
    }
}

/// One `[[envoy.descriptors]]` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorRule {
    /// Only requests of this domain (any domain when `None`).
    pub domain: Option<String>,
    /// Entries the descriptor must carry with exactly these values.
    pub when: BTreeMap<String, String>,
    /// The entity charged.
    pub entity: Source,
    /// The resource charged.
    pub resource: Source,
    /// The limit charged.
    pub limit: Source,
    /// The request phase keeps the lease open and hands its token to the gateway, so the
    /// usage report after the response adjusts it to the real count.
    pub report_usage: bool,
}

/// The `[envoy]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoySettings {
    /// The rules, tried in order; the first that matches a descriptor maps it.
    pub rules: Vec<DescriptorRule>,
    /// The descriptor entry that marks a usage report and carries the lease token(s).
    pub lease_entry: String,
    /// The request header the request phase asks Envoy to add, holding the lease token(s).
    pub lease_header: String,
    /// The response header added when the answer was given without the store
    /// (`on_unavailable = allow`).
    pub degraded_header: String,
}

/// Default of [`EnvoySettings::lease_entry`].
pub const LEASE_ENTRY: &str = "tollgate_lease";
/// Default of [`EnvoySettings::lease_header`].
pub const LEASE_HEADER: &str = "x-tollgate-lease";
/// Default of [`EnvoySettings::degraded_header`].
pub const DEGRADED_HEADER: &str = "x-tollgate-degraded";

impl Default for EnvoySettings {
    fn default() -> Self {
        EnvoySettings {
            rules: Vec::new(),
            lease_entry: LEASE_ENTRY.into(),
            lease_header: LEASE_HEADER.into(),
            degraded_header: DEGRADED_HEADER.into(),
        }
    }
}

/// What one descriptor charges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// Entity id.
    pub entity: String,
    /// Resource.
    pub resource: String,
    /// Limit name.
    pub limit: String,
    /// Tokens (`hits_addend`).
    pub amount: i64,
    /// The lease token(s) of a usage report (the value of the lease entry), `None` for a
    /// request-phase descriptor.
    pub report: Option<String>,
    /// The matched rule asks for a usage report.
    pub report_usage: bool,
}

/// A descriptor the mapping refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DescriptorError {
    /// The request has no domain.
    #[error("the request's domain is empty")]
    EmptyDomain,
    /// The request has no descriptors.
    #[error("the request has no descriptors")]
    NoDescriptors,
    /// A descriptor without entries.
    #[error("descriptor {index} has no entries")]
    EmptyDescriptor {
        /// 0-based index.
        index: usize,
    },
    /// An entry with an empty key or value.
    #[error("descriptor {index}: entry {key:?} has an empty key or value")]
    EmptyEntry {
        /// 0-based index.
        index: usize,
        /// The key.
        key: String,
    },
    /// No rule maps the descriptor.
    #[error(
        "descriptor {index} ({entries}) of domain {domain:?} matches no [[envoy.descriptors]] rule"
    )]
    Unmapped {
        /// 0-based index.
        index: usize,
        /// The domain.
        domain: String,
        /// The entries as `key=value`.
        entries: String,
    },
    /// Negative hits (`is_negative_hits`) are not a charge.
    #[error("descriptor {index}: negative hits are refused (report real usage through the lease entry instead)")]
    NegativeHits {
        /// 0-based index.
        index: usize,
    },
    /// More than the largest amount.
    #[error("descriptor {index}: hits_addend {hits} is larger than {MAX_TOKENS}")]
    TooLarge {
        /// 0-based index.
        index: usize,
        /// The amount.
        hits: u64,
    },
}

impl DescriptorRule {
    fn matches(&self, domain: &str, entries: &[(String, String)], lease_entry: &str) -> bool {
        if self.domain.as_deref().is_some_and(|d| d != domain) {
            return false;
        }
        let has = |k: &str| entries.iter().any(|(ek, _)| ek == k);
        self.when
            .iter()
            .all(|(k, v)| entries.iter().any(|(ek, ev)| ek == k && ev == v))
            && [&self.entity, &self.resource, &self.limit]
                .iter()
                .filter_map(|s| s.entry_key())
                .all(|k| k != lease_entry && has(k))
    }
}

/// Rule "descriptor mapping": the first rule whose domain and `when` entries match and
/// whose named entries the descriptor carries maps it to (entity, resource, limit); the
/// amount is `hits` (the descriptor's `hits_addend`, else the request's, 0 there meaning
/// 1). A descriptor carrying the lease entry is a usage report. Refused: an empty domain,
/// empty entries, no matching rule, negative hits, more than `MAX_TOKENS`.
pub fn resolve(
    settings: &EnvoySettings,
    domain: &str,
    index: usize,
    entries: &[(String, String)],
    hits: u64,
    negative: bool,
) -> Result<Charge, DescriptorError> {
    if domain.is_empty() {
        return Err(DescriptorError::EmptyDomain);
    }
    if entries.is_empty() {
        return Err(DescriptorError::EmptyDescriptor { index });
    }
    let report = entries
        .iter()
        .find(|(k, _)| *k == settings.lease_entry)
        .map(|(_, v)| v.clone());
    if let Some((k, _)) = entries
        .iter()
        .find(|(k, v)| k.is_empty() || (v.is_empty() && *k != settings.lease_entry))
    {
        return Err(DescriptorError::EmptyEntry {
            index,
            key: k.clone(),
        });
    }
    if negative {
        return Err(DescriptorError::NegativeHits { index });
    }
    if hits > MAX_TOKENS as u64 {
        return Err(DescriptorError::TooLarge { index, hits });
    }
    let unmapped = || DescriptorError::Unmapped {
        index,
        domain: domain.to_string(),
        entries: entries
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", "),
    };
    let rule = settings
        .rules
        .iter()
        .find(|r| r.matches(domain, entries, &settings.lease_entry))
        .ok_or_else(unmapped)?;
    let (Some(entity), Some(resource), Some(limit)) = (
        rule.entity.pick(domain, entries),
        rule.resource.pick(domain, entries),
        rule.limit.pick(domain, entries),
    ) else {
        return Err(unmapped());
    };
    debug_assert!(hits <= MAX_TOKENS as u64, "amount checked above");
    Ok(Charge {
        entity: entity.to_string(),
        resource: resource.to_string(),
        limit: limit.to_string(),
        amount: hits as i64,
        report,
        report_usage: rule.report_usage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> EnvoySettings {
        EnvoySettings {
            rules: vec![
                DescriptorRule {
                    domain: Some("llm".into()),
                    when: BTreeMap::new(),
                    entity: Source::Entry("user_id".into()),
                    resource: Source::Entry("model".into()),
                    limit: Source::Value("tpm".into()),
                    report_usage: true,
                },
                DescriptorRule {
                    domain: None,
                    when: BTreeMap::new(),
                    entity: Source::Entry("user_id".into()),
                    resource: Source::Domain,
                    limit: Source::Value("rpm".into()),
                    report_usage: false,
                },
            ],
            ..EnvoySettings::default()
        }
    }

    fn e(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn first_matching_rule_maps() {
        let s = settings();
        let c = resolve(
            &s,
            "llm",
            0,
            &e(&[("user_id", "u1"), ("model", "gpt-4")]),
            7,
            false,
        )
        .unwrap();
        assert_eq!(
            (
                c.entity.as_str(),
                c.resource.as_str(),
                c.limit.as_str(),
                c.amount
            ),
            ("u1", "gpt-4", "tpm", 7)
        );
        assert!(c.report.is_none() && c.report_usage);
        let c = resolve(&s, "api", 0, &e(&[("user_id", "u1")]), 1, false).unwrap();
        assert_eq!((c.resource.as_str(), c.limit.as_str()), ("api", "rpm"));
        let c = resolve(
            &s,
            "llm",
            0,
            &e(&[("user_id", "u1"), ("model", "m"), (LEASE_ENTRY, "tok")]),
            300,
            false,
        )
        .unwrap();
        assert_eq!(c.report.as_deref(), Some("tok"));
    }

    #[test]
    fn refusals() {
        let s = settings();
        let ok = e(&[("user_id", "u1")]);
        assert_eq!(
            resolve(&s, "", 0, &ok, 1, false),
            Err(DescriptorError::EmptyDomain)
        );
        assert_eq!(
            resolve(&s, "d", 2, &[], 1, false),
            Err(DescriptorError::EmptyDescriptor { index: 2 })
        );
        assert!(matches!(
            resolve(&s, "d", 0, &e(&[("team", "x")]), 1, false),
            Err(DescriptorError::Unmapped { .. })
        ));
        assert_eq!(
            resolve(&s, "d", 0, &ok, 1, true),
            Err(DescriptorError::NegativeHits { index: 0 })
        );
        assert_eq!(
            resolve(&s, "d", 0, &ok, MAX_TOKENS as u64 + 1, false),
            Err(DescriptorError::TooLarge {
                index: 0,
                hits: MAX_TOKENS as u64 + 1
            })
        );
        assert!(matches!(
            resolve(&s, "d", 0, &e(&[("user_id", "")]), 1, false),
            Err(DescriptorError::EmptyEntry { .. })
        ));
    }
}

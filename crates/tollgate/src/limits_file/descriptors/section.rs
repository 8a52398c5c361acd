//! The file's `[envoy]` section: its schema (serde) and its validation into
//! [`EnvoySettings`].

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{DescriptorRule, EnvoySettings, Source, DEGRADED_HEADER, LEASE_ENTRY, LEASE_HEADER};
use crate::limits_file::model::{Ctx, LimitsFileError};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEnvoy {
    #[serde(default)]
    lease_entry: Option<String>,
    #[serde(default)]
    lease_header: Option<String>,
    #[serde(default)]
    degraded_header: Option<String>,
    #[serde(default)]
    descriptors: Vec<toml::Spanned<RawRule>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    #[serde(default)]
    domain: Option<String>,
    #[serde(default)]
    when: BTreeMap<String, String>,
    entity: RawSource,
    resource: RawSource,
    limit: RawSource,
    #[serde(default)]
    report_usage: bool,
}

/// A literal string, `{ entry = "KEY" }` or `{ domain = true }`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawSource {
    Value(String),
    Table {
        #[serde(default)]
        entry: Option<String>,
        #[serde(default)]
        domain: Option<bool>,
    },
}

impl RawSource {
    fn source(&self) -> Result<Source, String> {
        match self {
            RawSource::Value(v) if v.is_empty() => Err("an empty name".into()),
            RawSource::Value(v) => Ok(Source::Value(v.clone())),
            RawSource::Table {
                entry: Some(e),
                domain: None,
            } if !e.is_empty() => Ok(Source::Entry(e.clone())),
            RawSource::Table {
                entry: None,
                domain: Some(true),
            } => Ok(Source::Domain),
            RawSource::Table { .. } => {
                Err("give a name, { entry = \"KEY\" } or { domain = true }".into())
            }
        }
    }
}

fn header_name(
    cx: &Ctx<'_>,
    field: &str,
    v: &Option<String>,
    default: &str,
) -> Result<String, LimitsFileError> {
    let h = v.clone().unwrap_or_else(|| default.to_string());
    let ok = !h.is_empty()
        && h.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if !ok {
        return Err(LimitsFileError {
            origin: cx.origin.to_string(),
            line: 0,
            field: format!("envoy.{field}"),
            reason: format!("{h:?} is not a lower-case header name"),
        });
    }
    Ok(h)
}

impl RawEnvoy {
    pub(crate) fn validate(&self, cx: &Ctx<'_>) -> Result<EnvoySettings, LimitsFileError> {
        let mut rules = Vec::with_capacity(self.descriptors.len());
        for (i, r) in self.descriptors.iter().enumerate() {
            let span = r.span();
            let r = r.get_ref();
            let field = |f: &str| format!("envoy.descriptors[{i}].{f}");
            let src =
                |f: &str, s: &RawSource| s.source().map_err(|e| cx.err(span.clone(), field(f), e));
            if r.domain.as_deref() == Some("") {
                return Err(cx.err(span, field("domain"), "an empty domain matches nothing"));
            }
            rules.push(DescriptorRule {
                domain: r.domain.clone(),
                when: r.when.clone(),
                entity: src("entity", &r.entity)?,
                resource: src("resource", &r.resource)?,
                limit: src("limit", &r.limit)?,
                report_usage: r.report_usage,
            });
        }
        let lease_entry = self
            .lease_entry
            .clone()
            .unwrap_or_else(|| LEASE_ENTRY.to_string());
        if lease_entry.is_empty() {
            return Err(LimitsFileError {
                origin: cx.origin.to_string(),
                line: 0,
                field: "envoy.lease_entry".into(),
                reason: "an empty key".into(),
            });
        }
        Ok(EnvoySettings {
            rules,
            lease_entry,
            lease_header: header_name(cx, "lease_header", &self.lease_header, LEASE_HEADER)?,
            degraded_header: header_name(
                cx,
                "degraded_header",
                &self.degraded_header,
                DEGRADED_HEADER,
            )?,
        })
    }
}

//! `tollgate audit list|purge`, and the options every store-opening command takes for the
//! audit log: the principal its changes are recorded for, and the records' retention.

use std::time::Duration;

use clap::{Args, Subcommand};
use tollgate::{AuditPage, AuditQuery, LimiterBuilder};

use crate::fail::Failure;
use crate::store::Access;
use crate::{print_json, spec, StoreArgs};

/// Who the command's changes are recorded for, and for how long.
#[derive(Debug, Clone, Args)]
pub(crate) struct AuditArgs {
    /// The principal administrative changes are recorded for (default: the OS user, from
    /// $USER or $LOGNAME).
    #[arg(long, env = "TOLLGATE_PRINCIPAL")]
    pub(crate) principal: Option<String>,
    /// How long audit records are kept (e.g. 90d, 12h).
    #[arg(long, env = "TOLLGATE_AUDIT_RETENTION", default_value = "90d", value_parser = spec::parse_duration)]
    pub(crate) audit_retention: Duration,
}

/// The principal when none is given and the environment names no user.
const NO_USER: &str = "unknown";

impl AuditArgs {
    /// The principal: `--principal`, else the OS user.
    pub(crate) fn principal(&self) -> String {
        self.principal
            .clone()
            .or_else(|| std::env::var("USER").ok().filter(|u| !u.is_empty()))
            .or_else(|| std::env::var("LOGNAME").ok().filter(|u| !u.is_empty()))
            .unwrap_or_else(|| NO_USER.into())
    }

    /// The builder with the principal and the retention set.
    pub(crate) fn apply(&self, b: LimiterBuilder) -> LimiterBuilder {
        b.principal(&self.principal())
            .audit_retention(self.audit_retention)
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum AuditCmd {
    /// List audit records, newest first (read-only).
    List {
        /// Only this entity's records.
        #[arg(long, value_name = "E")]
        entity: Option<String>,
        /// Only records concerning this resource.
        #[arg(long, value_name = "R")]
        resource: Option<String>,
        /// At most this many (1 to 1000).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Start after this record (the `next_cursor` of the previous page).
        #[arg(long)]
        cursor: Option<String>,
        /// List the namespace registry's records (register, delete, recover, purge)
        /// instead of the namespace's.
        #[arg(long)]
        namespaces: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Delete the records past their retention (DynamoDB's TTL does this by itself).
    Purge {
        #[command(flatten)]
        store: StoreArgs,
    },
}

pub(crate) async fn run(cmd: AuditCmd, json: bool) -> Result<(), Failure> {
    match cmd {
        AuditCmd::List {
            entity,
            resource,
            limit,
            cursor,
            namespaces,
            store,
        } => {
            if !(1..=tollgate_core::audit::MAX_PAGE).contains(&limit) {
                return Err(Failure::BadInput(format!(
                    "--limit is 1 to 1000, not {limit}"
                )));
            }
            let limiter = store.limiter(Access::ReadOnly).await?;
            let page = limiter
                .audit_log(&AuditQuery {
                    entity,
                    resource,
                    limit,
                    cursor,
                    registry: namespaces,
                })
                .await?;
            if json {
                print_json(&serde_json::to_value(&page).unwrap_or_default());
            } else {
                print!("{}", render(&page));
            }
            Ok(())
        }
        AuditCmd::Purge { store } => {
            let limiter = store.limiter(Access::Existing).await?;
            let n = limiter.admin().purge_audit().await?;
            if json {
                print_json(&serde_json::json!({ "purged": n }));
            } else {
                println!("purged {n} audit record(s) past their retention");
            }
            Ok(())
        }
    }
}

/// A record's target as the CLI spells scopes (`system`, `resource:R`, `entity:E`,
/// `entity:E/resource:R`).
fn target(r: &tollgate::AuditRecord) -> String {
    if let Some(n) = &r.namespace {
        return format!("namespace:{n}");
    }
    match (&r.entity, &r.resource) {
        (Some(e), Some(res)) => format!("entity:{e}/resource:{res}"),
        (Some(e), None) => format!("entity:{e}"),
        (None, Some(res)) => format!("resource:{res}"),
        (None, None) => "system".into(),
    }
}

fn when(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms)
        .map(|t| format!("{t:.3}"))
        .unwrap_or_else(|_| format!("{ms} ms"))
}

/// The page as text: one header line per record, its images below.
fn render(page: &AuditPage) -> String {
    if page.records.is_empty() {
        return "no audit records\n".into();
    }
    let mut out = String::new();
    for r in &page.records {
        out.push_str(&format!(
            "{}  {}  {:<16} {:<18} {}\n",
            r.id,
            when(r.at_ms),
            r.principal,
            r.action.as_str(),
            target(r)
        ));
        out.push_str(&format!(
            "    before: {}\n    after:  {}\n",
            r.before, r.after
        ));
    }
    if let Some(c) = &page.next_cursor {
        out.push_str(&format!("more: --cursor {c}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate::Action;

    #[test]
    fn renders_one_block_per_record() {
        let page = AuditPage {
            records: vec![tollgate::AuditRecord {
                id: "01KBDW0Q6N4J6Y3SXQ9V7T2C1M".into(),
                at_ms: 1_764_592_800_123,
                principal: "ops".into(),
                action: Action::LimitsSet,
                level: "entity",
                entity: Some("u1".into()),
                resource: Some("gpt-4".into()),
                namespace: None,
                before: serde_json::Value::Null,
                after: serde_json::json!({"limits": []}),
                expires_at_s: 1,
            }],
            next_cursor: Some("01KBDW0Q6N4J6Y3SXQ9V7T2C1M".into()),
        };
        assert_eq!(
            render(&page),
            "01KBDW0Q6N4J6Y3SXQ9V7T2C1M  2025-12-01T12:40:00.123Z  ops              \
             limits.set         entity:u1/resource:gpt-4\n    before: null\n    \
             after:  {\"limits\":[]}\nmore: --cursor 01KBDW0Q6N4J6Y3SXQ9V7T2C1M\n"
        );
    }
}

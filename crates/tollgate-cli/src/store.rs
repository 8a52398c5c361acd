//! `--store memory | sqlite:PATH | dynamodb:TABLE`, and how each command opens it.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use tollgate_sqlite::SqliteStore;
use tollgate_store::{ChangeFeed, MemoryStore, Store};

use crate::fail::Failure;

/// Where the limiter keeps its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSpec {
    /// In memory (lost at exit).
    Memory,
    /// An embedded SQLite file.
    Sqlite(String),
    /// A DynamoDB table.
    DynamoDb(String),
}

impl FromStr for StoreSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "memory" {
            return Ok(StoreSpec::Memory);
        }
        if let Some(p) = s.strip_prefix("sqlite:") {
            if p.is_empty() {
                return Err("sqlite: needs a path, e.g. sqlite:./tollgate.db".into());
            }
            return Ok(StoreSpec::Sqlite(p.into()));
        }
        if let Some(t) = s.strip_prefix("dynamodb:") {
            if t.is_empty() {
                return Err("dynamodb: needs a table name, e.g. dynamodb:tollgate".into());
            }
            validate_table_name(t)?;
            return Ok(StoreSpec::DynamoDb(t.into()));
        }
        Err(format!(
            "{s:?}: expected memory, sqlite:PATH or dynamodb:TABLE"
        ))
    }
}

impl std::fmt::Display for StoreSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreSpec::Memory => write!(f, "memory"),
            StoreSpec::Sqlite(p) => write!(f, "sqlite:{p}"),
            StoreSpec::DynamoDb(t) => write!(f, "dynamodb:{t}"),
        }
    }
}

/// Check a DynamoDB table name: 3 to 255 characters of letters, digits, `_`, `-` and `.`.
pub fn validate_table_name(t: &str) -> Result<(), String> {
    let len = t.chars().count();
    if !(3..=255).contains(&len) {
        return Err(format!(
            "table name {t:?} has {len} character(s); DynamoDB takes 3 to 255"
        ));
    }
    if let Some(c) = t
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(format!(
            "table name {t:?} contains {c:?}; DynamoDB takes letters, digits, '_', '-' and '.'"
        ));
    }
    Ok(())
}

/// How a command may open its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Create the store when it does not exist (`serve`, `limits set`, `entity create`).
    Create,
    /// Write to an existing store; a missing one is "no such store" (`acquire`, deletes).
    Existing,
    /// Only read, from an existing store opened read-only (`check`, `limits get`,
    /// `entity get`).
    ReadOnly,
}

/// Open the store.
pub async fn open(
    spec: &StoreSpec,
    endpoint: Option<&str>,
    access: Access,
    deadline: std::time::Duration,
) -> Result<Arc<dyn Store>, Failure> {
    open_probed(spec, endpoint, access, deadline)
        .await
        .map(|(s, _)| s)
}

/// [`open`], with a handle to the SQLite store when it is one (as [`open_feed_probed`]).
pub async fn open_probed(
    spec: &StoreSpec,
    endpoint: Option<&str>,
    access: Access,
    deadline: std::time::Duration,
) -> Result<(Arc<dyn Store>, Option<SqliteStore>), Failure> {
    if let StoreSpec::Memory = spec {
        // Nobody reads its feed: a memory store keeps none (its writes copy nothing).
        return Ok((Arc::new(MemoryStore::new()), None));
    }
    open_feed_probed(spec, endpoint, access, deadline)
        .await
        .map(|(s, probe)| (s as Arc<dyn Store>, probe))
}

/// Open the store with its change feed (every backend has one), with a handle to the
/// SQLite store when it is one (for its group-commit counters at `/metrics`).
pub async fn open_feed_probed(
    spec: &StoreSpec,
    endpoint: Option<&str>,
    access: Access,
    deadline: std::time::Duration,
) -> Result<(Arc<dyn ChangeFeed>, Option<SqliteStore>), Failure> {
    match spec {
        StoreSpec::Memory => Ok((Arc::new(MemoryStore::with_change_feed()), None)),
        StoreSpec::Sqlite(p) => {
            let missing = !Path::new(p).exists();
            if access != Access::Create && missing {
                return Err(Failure::NoSuchStore(format!(
                    "no such store: {spec} (there is no file {p:?}; `tollgate limits set` or `tollgate serve` creates one)"
                )));
            }
            if deadline.is_zero() {
                return Err(Failure::BadInput("--store-timeout must be above 0".into()));
            }
            // The open, too, waits for another process's lock at most the store timeout.
            let config = tollgate_sqlite::SqliteConfig::default()
                .with_deadline(deadline)
                .with_busy_timeout(deadline);
            let r = match access {
                Access::ReadOnly => SqliteStore::open_read_only_with(p, &config),
                Access::Create | Access::Existing => SqliteStore::open_with(p, &config),
            };
            r.map(|s| (Arc::new(s.clone()) as Arc<dyn ChangeFeed>, Some(s)))
                .map_err(|e| Failure::Unavailable(format!("cannot open {spec}: {e}")))
        }
        StoreSpec::DynamoDb(t) => Ok((open_dynamodb(t, endpoint, deadline).await?, None)),
    }
}

/// Find AWS credentials (and a region, without an endpoint) before using DynamoDB, so a
/// machine without them gets one clear sentence instead of a request timing out against
/// the instance metadata service.
#[cfg(feature = "dynamodb")]
async fn check_aws(what: &str, endpoint: Option<&str>) -> Result<(), Failure> {
    use aws_credential_types::provider::ProvideCredentials;
    let conf = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .load()
        .await;
    if endpoint.is_none() && conf.region().is_none() {
        return Err(Failure::Credentials(format!(
            "no AWS region for {what}: set AWS_REGION (or a region in the AWS_PROFILE's config), or give --endpoint"
        )));
    }
    let none = || {
        Failure::Credentials(format!(
            "no AWS credentials for {what}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE \
             (~/.aws/credentials), or run with an instance or container role \
             (looked in the environment, the profile files, web identity, the container and the instance metadata)"
        ))
    };
    let Some(provider) = conf.credentials_provider() else {
        return Err(none());
    };
    match tokio::time::timeout(
        std::time::Duration::from_secs(10),
        provider.provide_credentials(),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "credential chain");
            Err(none())
        }
        Err(_) => Err(none()),
    }
}

#[cfg(feature = "dynamodb")]
async fn open_dynamodb(
    table: &str,
    endpoint: Option<&str>,
    deadline: std::time::Duration,
) -> Result<Arc<dyn ChangeFeed>, Failure> {
    use tollgate_dynamodb::DynamoDbError;
    check_aws(&format!("dynamodb:{table}"), endpoint).await?;
    let mut b = tollgate_dynamodb::DynamoDbStore::builder(table).deadline(deadline);
    if let Some(e) = endpoint {
        b = b.endpoint(e);
    }
    let store = b.build().await.map_err(|e| match e {
        DynamoDbError::Config(m) => Failure::BadInput(format!("dynamodb:{table}: {m}")),
        e => Failure::Unavailable(format!("cannot open dynamodb:{table}: {e}")),
    })?;
    // DynamoDB never creates a table on use: check the one named exists with tollgate's
    // layout, and say which one is missing and how to make it. An outage is left to the
    // command's own request (and the `on_unavailable` policy).
    match store.check_table().await {
        Ok(_) => {}
        Err(DynamoDbError::TableMissing { .. }) => {
            return Err(Failure::NoSuchStore(format!(
                "no such store: dynamodb:{table} (the table does not exist; `tollgate table create --table {table}` creates it)"
            )))
        }
        Err(e) if e.is_unavailable() => {
            tracing::warn!(error = %e, table, "dynamodb: the table could not be checked (unreachable)");
        }
        Err(e) => return Err(Failure::NoSuchStore(format!("dynamodb:{table}: {e}"))),
    }
    Ok(Arc::new(store))
}

#[cfg(not(feature = "dynamodb"))]
async fn open_dynamodb(
    _table: &str,
    _endpoint: Option<&str>,
    _deadline: std::time::Duration,
) -> Result<Arc<dyn ChangeFeed>, Failure> {
    Err(Failure::BadInput(
        "this tollgate was built without the `dynamodb` feature".into(),
    ))
}

/// `tollgate table create`.
#[cfg(feature = "dynamodb")]
pub async fn create_table(table: &str, endpoint: Option<&str>) -> Result<(), Failure> {
    const TABLE_CREATE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);
    validate_table_name(table).map_err(Failure::BadInput)?;
    check_aws(&format!("table {table}"), endpoint).await?;
    // An administrative call, not an acquire path: a patient deadline (a table's creation,
    // or a DynamoDB Local's first requests, take seconds).
    let mut b = tollgate_dynamodb::DynamoDbStore::builder(table).deadline(TABLE_CREATE_DEADLINE);
    if let Some(e) = endpoint {
        b = b.endpoint(e);
    }
    let store = b
        .build()
        .await
        .map_err(|e| Failure::BadInput(e.to_string()))?;
    store
        .create_table()
        .await
        .map_err(|e| Failure::Unavailable(format!("create table {table}: {e}")))
}

/// `tollgate table create` (not built in).
#[cfg(not(feature = "dynamodb"))]
pub async fn create_table(table: &str, _endpoint: Option<&str>) -> Result<(), Failure> {
    validate_table_name(table).map_err(Failure::BadInput)?;
    Err(Failure::BadInput(
        "this tollgate was built without the `dynamodb` feature".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        assert!(validate_table_name("tollgate").is_ok());
        assert!(validate_table_name("a.b-c_1").is_ok());
        let e = validate_table_name("bad name!").unwrap_err();
        assert!(e.contains("' '"), "{e}");
        assert!(validate_table_name("ab").unwrap_err().contains("3 to 255"));
        assert!("dynamodb:bad name!".parse::<StoreSpec>().is_err());
    }
}

//! `--store memory | sqlite:PATH | dynamodb:TABLE`.

use std::str::FromStr;
use std::sync::Arc;

use tollgate_store::{MemoryStore, Store};

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

/// Open the store.
pub async fn open(spec: &StoreSpec, endpoint: Option<&str>) -> Result<Arc<dyn Store>, Failure> {
    match spec {
        StoreSpec::Memory => Ok(Arc::new(MemoryStore::new())),
        StoreSpec::Sqlite(p) => tollgate_sqlite::SqliteStore::open(p)
            .map(|s| Arc::new(s) as Arc<dyn Store>)
            .map_err(|e| Failure::Unavailable(format!("cannot open {spec}: {e}"))),
        StoreSpec::DynamoDb(t) => open_dynamodb(t, endpoint).await,
    }
}

#[cfg(feature = "dynamodb")]
async fn open_dynamodb(table: &str, endpoint: Option<&str>) -> Result<Arc<dyn Store>, Failure> {
    tollgate_dynamodb::DynamoDbStore::connect(table, endpoint)
        .await
        .map(|s| Arc::new(s) as Arc<dyn Store>)
        .map_err(|e| Failure::Unavailable(format!("cannot open dynamodb:{table}: {e}")))
}

#[cfg(not(feature = "dynamodb"))]
async fn open_dynamodb(_table: &str, _endpoint: Option<&str>) -> Result<Arc<dyn Store>, Failure> {
    Err(Failure::BadInput(
        "this tollgate was built without the `dynamodb` feature".into(),
    ))
}

/// `tollgate table create`.
#[cfg(feature = "dynamodb")]
pub async fn create_table(table: &str, endpoint: Option<&str>) -> Result<(), Failure> {
    let store = tollgate_dynamodb::DynamoDbStore::connect(table, endpoint)
        .await
        .map_err(|e| Failure::BadInput(e.to_string()))?;
    store
        .create_table()
        .await
        .map_err(|e| Failure::Unavailable(format!("create table {table}: {e}")))
}

/// `tollgate table create` (not built in).
#[cfg(not(feature = "dynamodb"))]
pub async fn create_table(_table: &str, _endpoint: Option<&str>) -> Result<(), Failure> {
    Err(Failure::BadInput(
        "this tollgate was built without the `dynamodb` feature".into(),
    ))
}

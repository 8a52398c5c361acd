//! Creating, checking (and, for tests, deleting) tollgate's single table.
//!
//! Layout (spec §2): string keys `PK` / `SK`, on-demand billing, four global secondary
//! indexes `GSI1`..`GSI4` keyed on `GSI{n}PK` / `GSI{n}SK` (`GSI1`, `GSI2` project every
//! attribute; `GSI3`, `GSI4` only the keys), and TTL on the attribute `ttl`.

use std::time::{Duration, Instant};

use aws_sdk_dynamodb::operation::create_table::CreateTableError;
use aws_sdk_dynamodb::operation::delete_table::DeleteTableError;
use aws_sdk_dynamodb::operation::describe_table::DescribeTableError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, IndexStatus, KeySchemaElement, KeyType,
    Projection, ProjectionType, ScalarAttributeType, StreamSpecification, StreamViewType,
    TableDescription, TableStatus, TimeToLiveSpecification,
};
use aws_sdk_dynamodb::Client;
use tollgate_store::StoreError;

use crate::error::{chain, map_sdk, DynamoDbError, Effect};

/// The attribute DynamoDB's TTL reads (epoch seconds).
pub const TTL_ATTRIBUTE: &str = "ttl";
/// The global secondary indexes and whether each projects every attribute.
pub const INDEXES: [(&str, bool); 4] = [
    ("GSI1", true),
    ("GSI2", true),
    ("GSI3", false),
    ("GSI4", false),
];
/// How long [`create_table`] waits for `ACTIVE`.
pub const ACTIVE_TIMEOUT: Duration = Duration::from_secs(300);

fn api(op: &'static str) -> impl Fn(StoreError) -> DynamoDbError {
    move |source| DynamoDbError::Api { op, source }
}

fn build(e: impl std::fmt::Display) -> DynamoDbError {
    DynamoDbError::Config(format!("request could not be built: {e}"))
}

fn key(name: &str, kt: KeyType) -> Result<KeySchemaElement, DynamoDbError> {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(kt)
        .build()
        .map_err(build)
}

fn string_attr(name: &str) -> Result<AttributeDefinition, DynamoDbError> {
    AttributeDefinition::builder()
        .attribute_name(name)
        .attribute_type(ScalarAttributeType::S)
        .build()
        .map_err(build)
}

/// Create `table` with tollgate's layout if it does not exist, enable TTL on `ttl`, and
/// wait until the table and its indexes are `ACTIVE`. Idempotent: an existing table is only
/// waited for (its layout is not checked). DynamoDB Local may refuse `UpdateTimeToLive`;
/// that, like any TTL failure, is logged as a warning and not an error.
pub async fn create_table(client: &Client, table: &str) -> Result<(), DynamoDbError> {
    let mut defs = vec![string_attr("PK")?, string_attr("SK")?];
    let mut gsis = Vec::new();
    for (ix, all) in INDEXES {
        let (pk, sk) = (format!("{ix}PK"), format!("{ix}SK"));
        defs.push(string_attr(&pk)?);
        defs.push(string_attr(&sk)?);
        let projection = Projection::builder()
            .projection_type(if all {
                ProjectionType::All
            } else {
                ProjectionType::KeysOnly
            })
            .build();
        gsis.push(
            GlobalSecondaryIndex::builder()
                .index_name(ix)
                .key_schema(key(&pk, KeyType::Hash)?)
                .key_schema(key(&sk, KeyType::Range)?)
                .projection(projection)
                .build()
                .map_err(build)?,
        );
    }
    let res = client
        .create_table()
        .table_name(table)
        .set_attribute_definitions(Some(defs))
        .key_schema(key("PK", KeyType::Hash)?)
        .key_schema(key("SK", KeyType::Range)?)
        .set_global_secondary_indexes(Some(gsis))
        .billing_mode(BillingMode::PayPerRequest)
        .stream_specification(stream_spec()?)
        .send()
        .await;
    match res {
        Ok(_) => tracing::info!(table, "created table"),
        Err(e) => match e.as_service_error() {
            Some(CreateTableError::ResourceInUseException(_)) => {
                tracing::info!(table, "table exists")
            }
            _ => return Err(api("CreateTable")(map_sdk(e, Effect::Write, table))),
        },
    }
    wait_active(client, table, ACTIVE_TIMEOUT).await?;
    enable_stream(client, table).await?;
    enable_ttl(client, table).await;
    Ok(())
}

/// The change feed's stream: new and old images of every write.
fn stream_spec() -> Result<StreamSpecification, DynamoDbError> {
    StreamSpecification::builder()
        .stream_enabled(true)
        .stream_view_type(StreamViewType::NewAndOldImages)
        .build()
        .map_err(build)
}

/// Give an existing table (created before the change feed) its stream, and wait for it.
async fn enable_stream(client: &Client, table: &str) -> Result<(), DynamoDbError> {
    let d = client
        .describe_table()
        .table_name(table)
        .send()
        .await
        .map_err(|e| api("DescribeTable")(map_sdk(e, Effect::Read, table)))?;
    let spec = d.table().and_then(|t| t.stream_specification());
    match spec {
        Some(s) if s.stream_enabled() => {
            if s.stream_view_type() != Some(&StreamViewType::NewAndOldImages) {
                tracing::warn!(
                    table,
                    view = ?s.stream_view_type(),
                    "the table's stream does not carry new and old images; the change feed needs NEW_AND_OLD_IMAGES"
                );
            }
            Ok(())
        }
        _ => {
            client
                .update_table()
                .table_name(table)
                .stream_specification(stream_spec()?)
                .send()
                .await
                .map_err(|e| api("UpdateTable")(map_sdk(e, Effect::Write, table)))?;
            tracing::info!(table, "stream enabled (NEW_AND_OLD_IMAGES)");
            wait_active(client, table, ACTIVE_TIMEOUT).await
        }
    }
}

async fn enable_ttl(client: &Client, table: &str) {
    let spec = match TimeToLiveSpecification::builder()
        .enabled(true)
        .attribute_name(TTL_ATTRIBUTE)
        .build()
    {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(table, error = %e, "TTL not enabled");
            return;
        }
    };
    match client
        .update_time_to_live()
        .table_name(table)
        .time_to_live_specification(spec)
        .send()
        .await
    {
        Ok(_) => tracing::info!(table, attribute = TTL_ATTRIBUTE, "TTL enabled"),
        Err(e) => {
            let msg = chain(&e);
            if msg.contains("already enabled") {
                tracing::debug!(table, "TTL already enabled");
            } else {
                tracing::warn!(table, error = %msg, "TTL not enabled (DynamoDB Local may not support UpdateTimeToLive)");
            }
        }
    }
}

/// Poll `DescribeTable` until the table and every index are `ACTIVE`.
pub async fn wait_active(
    client: &Client,
    table: &str,
    timeout: Duration,
) -> Result<(), DynamoDbError> {
    let start = Instant::now();
    let mut delay = Duration::from_millis(50);
    loop {
        let status = match client.describe_table().table_name(table).send().await {
            Ok(out) => {
                let t = out.table();
                let table_active = t.and_then(|t| t.table_status()) == Some(&TableStatus::Active);
                let indexes_active = t
                    .map(|t| t.global_secondary_indexes())
                    .unwrap_or_default()
                    .iter()
                    .all(|g| g.index_status() == Some(&IndexStatus::Active));
                if table_active && indexes_active {
                    return Ok(());
                }
                t.and_then(|t| t.table_status())
                    .map(|s| s.as_str().to_string())
                    .unwrap_or_else(|| "unknown".into())
            }
            Err(e) => match e.as_service_error() {
                // Eventually consistent control plane: a fresh table may not be visible yet.
                Some(DescribeTableError::ResourceNotFoundException(_)) => "NOT_FOUND".into(),
                _ => return Err(api("DescribeTable")(map_sdk(e, Effect::Read, table))),
            },
        };
        if start.elapsed() >= timeout {
            return Err(DynamoDbError::NotActive {
                table: table.to_string(),
                secs: timeout.as_secs(),
                status,
            });
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

/// Delete `table` (tests and tear-down). A missing table is not an error.
pub async fn delete_table(client: &Client, table: &str) -> Result<(), DynamoDbError> {
    match client.delete_table().table_name(table).send().await {
        Ok(_) => Ok(()),
        Err(e) => match e.as_service_error() {
            Some(DeleteTableError::ResourceNotFoundException(_)) => Ok(()),
            _ => Err(api("DeleteTable")(map_sdk(e, Effect::Write, table))),
        },
    }
}

/// What [`check_table`] found on a table that has tollgate's layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCheck {
    /// The table.
    pub table: String,
    /// Its status (`ACTIVE` or `UPDATING`).
    pub status: String,
    /// The global secondary indexes found, by name, sorted.
    pub indexes: Vec<String>,
    /// The item count DynamoDB reports (refreshed about every six hours), if any.
    pub item_count: Option<i64>,
    /// Things that work but are worth knowing (an index still backfilling, an index that
    /// projects more than it needs).
    pub warnings: Vec<String>,
}

/// Check, with one `DescribeTable`, that `table` exists, can serve requests, and has
/// tollgate's layout: string keys `PK` (hash) and `SK` (range), and the four indexes
/// [`INDEXES`] keyed on string `GSI{n}PK` / `GSI{n}SK`, `GSI1` and `GSI2` projecting every
/// attribute (the store returns whole items from them).
///
/// Errors, each naming the table: [`DynamoDbError::TableMissing`],
/// [`DynamoDbError::TableNotReady`] (being created or deleted, archived, its key
/// inaccessible), [`DynamoDbError::TableMismatch`] listing every difference, and
/// [`DynamoDbError::Api`] when DynamoDB cannot be asked (an outage, or access denied —
/// [`DynamoDbError::is_unavailable`] tells which).
pub async fn check_table(client: &Client, table: &str) -> Result<TableCheck, DynamoDbError> {
    let out = match client.describe_table().table_name(table).send().await {
        Ok(out) => out,
        Err(e) => {
            return Err(match e.as_service_error() {
                Some(DescribeTableError::ResourceNotFoundException(_)) => {
                    DynamoDbError::TableMissing {
                        table: table.to_string(),
                    }
                }
                _ => api("DescribeTable")(map_sdk(e, Effect::Read, table)),
            })
        }
    };
    let Some(t) = out.table() else {
        return Err(DynamoDbError::Api {
            op: "DescribeTable",
            source: StoreError::Unavailable(format!(
                "table {table}: DescribeTable returned no table description"
            )),
        });
    };
    let status = t
        .table_status()
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|| "UNKNOWN".into());
    if !matches!(
        t.table_status(),
        Some(TableStatus::Active | TableStatus::Updating)
    ) {
        return Err(DynamoDbError::TableNotReady {
            table: table.to_string(),
            status,
        });
    }
    let (problems, warnings) = layout_differences(t);
    if !problems.is_empty() {
        return Err(DynamoDbError::TableMismatch {
            table: table.to_string(),
            problems,
        });
    }
    let mut indexes: Vec<String> = t
        .global_secondary_indexes()
        .iter()
        .filter_map(|g| g.index_name().map(str::to_string))
        .collect();
    indexes.sort();
    Ok(TableCheck {
        table: table.to_string(),
        status,
        indexes,
        item_count: t.item_count(),
        warnings,
    })
}

/// The differences between a table and tollgate's layout: (problems, warnings).
fn layout_differences(t: &TableDescription) -> (Vec<String>, Vec<String>) {
    let (mut problems, mut warnings) = (Vec::new(), Vec::new());
    keys(t, &mut problems, "the table", t.key_schema(), "PK", "SK");
    for (ix, all) in INDEXES {
        let Some(g) = t
            .global_secondary_indexes()
            .iter()
            .find(|g| g.index_name() == Some(ix))
        else {
            problems.push(format!("global secondary index {ix} is missing"));
            continue;
        };
        keys(
            t,
            &mut problems,
            &format!("index {ix}"),
            g.key_schema(),
            &format!("{ix}PK"),
            &format!("{ix}SK"),
        );
        let projection = g.projection().and_then(|p| p.projection_type());
        match (all, projection) {
            (true, Some(ProjectionType::All)) | (false, Some(ProjectionType::KeysOnly)) => {}
            (true, p) => problems.push(format!(
                "index {ix} projects {} (want ALL: the store reads whole items from it)",
                p.map_or("nothing", |p| p.as_str())
            )),
            (false, Some(p)) => warnings.push(format!(
                "index {ix} projects {} (KEYS_ONLY is enough)",
                p.as_str()
            )),
            (false, None) => problems.push(format!("index {ix} has no projection")),
        }
        if let Some(s) = g.index_status().filter(|s| **s != IndexStatus::Active) {
            warnings.push(format!(
                "index {ix} is {} (queries on it may be incomplete until ACTIVE)",
                s.as_str()
            ));
        }
    }
    (problems, warnings)
}

/// One key schema (the table's or an index's) against (`hash`, `range`), both strings.
fn keys(
    t: &TableDescription,
    problems: &mut Vec<String>,
    what: &str,
    schema: &[KeySchemaElement],
    hash: &str,
    range: &str,
) {
    let attr_type = |name: &str| {
        t.attribute_definitions()
            .iter()
            .find(|d| d.attribute_name() == name)
            .map(|d| d.attribute_type().clone())
    };
    for (want, kt) in [(hash, KeyType::Hash), (range, KeyType::Range)] {
        let role = if kt == KeyType::Hash {
            "partition"
        } else {
            "sort"
        };
        match schema.iter().find(|k| k.key_type() == &kt) {
            None => problems.push(format!("{what} has no {role} key (want {want})")),
            Some(k) if k.attribute_name() != want => problems.push(format!(
                "{what} {role} key is {} (want {want})",
                k.attribute_name()
            )),
            Some(_) => match attr_type(want) {
                Some(ScalarAttributeType::S) => {}
                Some(other) => problems.push(format!(
                    "{what} {role} key {want} is of type {} (want S, a string)",
                    other.as_str()
                )),
                None => problems.push(format!("{what} {role} key {want} has no type")),
            },
        }
    }
}

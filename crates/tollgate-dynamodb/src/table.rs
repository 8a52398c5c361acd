//! Creating (and, for tests, deleting) tollgate's single table.
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
    Projection, ProjectionType, ScalarAttributeType, TableStatus, TimeToLiveSpecification,
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
        .send()
        .await;
    match res {
        Ok(_) => tracing::info!(table, "created table"),
        Err(e) => match e.as_service_error() {
            Some(CreateTableError::ResourceInUseException(_)) => {
                tracing::info!(table, "table exists")
            }
            _ => return Err(api("CreateTable")(map_sdk(e, Effect::Write))),
        },
    }
    wait_active(client, table, ACTIVE_TIMEOUT).await?;
    enable_ttl(client, table).await;
    Ok(())
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
                _ => return Err(api("DescribeTable")(map_sdk(e, Effect::Read))),
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
            _ => Err(api("DeleteTable")(map_sdk(e, Effect::Write))),
        },
    }
}

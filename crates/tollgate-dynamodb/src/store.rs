//! [`DynamoDbStore`]: the [`Store`] contract over one DynamoDB table.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::config::{Credentials, Region};
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    self as ddb, CancellationReason, KeysAndAttributes, ReturnValue,
    ReturnValuesOnConditionCheckFailure, TransactWriteItem,
};
use aws_sdk_dynamodb::Client;
use tollgate_core::expr::{Action, Condition, ReturnValues};
use tollgate_core::value::{Item, Key, PK};
use tollgate_store::eval::{eval_condition, validate_update};
use tollgate_store::{
    validate_transaction, CancelReason, DeleteRequest, PutRequest, Query, Store, StoreError,
    TransactOp, UpdateRequest,
};

use crate::codec::{item_from_av, item_to_av, key_from_av, key_to_av, AvMap};
use crate::error::{map_sdk, DynamoDbError, Effect};
use crate::render::{self, Placeholders};

/// Most keys in one `BatchGetItem` request.
pub const BATCH_GET_CHUNK: usize = 100;
/// How many times `batch_get` resends `UnprocessedKeys` before giving up with `Throttled`.
const UNPROCESSED_ATTEMPTS: u32 = 8;

/// A [`Store`] over one DynamoDB table (see the crate docs for the retry policy).
#[derive(Debug, Clone)]
pub struct DynamoDbStore {
    table: String,
    /// Reads and transactions: the SDK's standard retries.
    client: Client,
    /// Single-item writes: no SDK retries (an `ADD` resent after a lost response would
    /// apply twice).
    write_client: Client,
}

/// Builds a [`DynamoDbStore`] from the standard AWS configuration chain (environment,
/// profile, IMDS …) plus explicit overrides.
#[derive(Debug, Clone)]
pub struct DynamoDbStoreBuilder {
    table: String,
    endpoint: Option<String>,
    region: Option<String>,
    credentials: Option<(String, String)>,
    timeouts: Option<TimeoutConfig>,
}

impl DynamoDbStoreBuilder {
    /// Talk to this endpoint (DynamoDB Local, a VPC endpoint) instead of the regional one.
    pub fn endpoint(mut self, url: impl Into<String>) -> Self {
        self.endpoint = Some(url.into());
        self
    }

    /// Use this region instead of the configured one. With an explicit endpoint and no
    /// region configured anywhere, `us-east-1` is used (emulators ignore it).
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// Use static credentials (for emulators; real deployments use the provider chain).
    pub fn static_credentials(
        mut self,
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
    ) -> Self {
        self.credentials = Some((access_key_id.into(), secret_access_key.into()));
        self
    }

    /// Timeouts of every request (connect, per attempt, per operation). A timed-out write
    /// is reported as [`StoreError::Ambiguous`].
    pub fn timeouts(mut self, t: TimeoutConfig) -> Self {
        self.timeouts = Some(t);
        self
    }

    /// Load the AWS configuration and build the store. Does not touch the table.
    pub async fn build(self) -> Result<DynamoDbStore, DynamoDbError> {
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(e) = &self.endpoint {
            loader = loader.endpoint_url(e.clone());
        }
        if let Some(r) = &self.region {
            loader = loader.region(Region::new(r.clone()));
        }
        if let Some((id, secret)) = &self.credentials {
            loader = loader.credentials_provider(Credentials::new(
                id.clone(),
                secret.clone(),
                None,
                None,
                "tollgate-static",
            ));
        }
        if let Some(t) = &self.timeouts {
            loader = loader.timeout_config(t.clone());
        }
        let mut sdk = loader.load().await;
        if sdk.region().is_none() && self.endpoint.is_some() {
            sdk = sdk
                .into_builder()
                .region(Region::from_static("us-east-1"))
                .build();
        }
        DynamoDbStore::from_sdk_config(&sdk, self.table)
    }
}

impl DynamoDbStore {
    /// A builder for `table`.
    pub fn builder(table: impl Into<String>) -> DynamoDbStoreBuilder {
        DynamoDbStoreBuilder {
            table: table.into(),
            endpoint: None,
            region: None,
            credentials: None,
            timeouts: None,
        }
    }

    /// A store over `table` from the standard AWS configuration, optionally at `endpoint`.
    pub async fn connect(
        table: impl Into<String>,
        endpoint: Option<&str>,
    ) -> Result<Self, DynamoDbError> {
        let mut b = Self::builder(table);
        if let Some(e) = endpoint {
            b = b.endpoint(e);
        }
        b.build().await
    }

    /// A store over `table` from an already loaded AWS configuration.
    pub fn from_sdk_config(
        sdk: &SdkConfig,
        table: impl Into<String>,
    ) -> Result<Self, DynamoDbError> {
        let table = table.into();
        if table.len() < 3 || table.len() > 255 {
            return Err(DynamoDbError::Config(format!(
                "table name must be 3 to 255 characters: {table:?}"
            )));
        }
        let conf = aws_sdk_dynamodb::config::Builder::from(sdk).build();
        let write_conf = aws_sdk_dynamodb::config::Builder::from(sdk)
            .retry_config(RetryConfig::disabled())
            .build();
        Ok(DynamoDbStore {
            table,
            client: Client::from_conf(conf),
            write_client: Client::from_conf(write_conf),
        })
    }

    /// The table this store uses.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The SDK client (standard retries), for admin work such as [`crate::create_table`].
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Create this store's table if it does not exist (see [`crate::create_table`]).
    pub async fn create_table(&self) -> Result<(), DynamoDbError> {
        crate::table::create_table(&self.client, &self.table).await
    }
}

/// `ConditionFailed` from the old item DynamoDB returned (`None` if the item was absent).
fn condition_failed(old: Option<&AvMap>) -> StoreError {
    match old.filter(|m| !m.is_empty()).map(item_from_av).transpose() {
        Ok(old) => StoreError::ConditionFailed {
            old: old.map(Box::new),
        },
        Err(e) => e,
    }
}

fn build_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Validation(format!("request could not be built: {e}"))
}

/// Render an optional condition into `p`.
fn cond(p: &mut Placeholders, c: Option<&Condition>) -> Result<Option<String>, StoreError> {
    c.map(|c| render::condition(p, c)).transpose()
}

fn stamped(key: &Key, item: &Item) -> Result<AvMap, StoreError> {
    let mut item = item.clone();
    key.stamp(&mut item);
    item_to_av(&item)
}

/// One transaction operation as the SDK wants it.
fn transact_item(table: &str, op: &TransactOp) -> Result<TransactWriteItem, StoreError> {
    let mut p = Placeholders::new();
    let all_old = ReturnValuesOnConditionCheckFailure::AllOld;
    let b = TransactWriteItem::builder();
    Ok(match op {
        TransactOp::Put(r) => {
            let c = cond(&mut p, r.condition.as_ref())?;
            b.put(
                ddb::Put::builder()
                    .table_name(table)
                    .set_item(Some(stamped(&r.key, &r.item)?))
                    .set_condition_expression(c)
                    .set_expression_attribute_names(p.names_opt())
                    .set_expression_attribute_values(p.values_opt())
                    .return_values_on_condition_check_failure(all_old)
                    .build()
                    .map_err(build_err)?,
            )
            .build()
        }
        TransactOp::Update(r) => {
            let c = cond(&mut p, r.condition.as_ref())?;
            let u = render::update(&mut p, &r.update)?;
            // DynamoDB's transactional Update requires an update expression, and the keys
            // cannot be SET, so "create the bare item if absent" has no rendering here.
            let u = u.ok_or_else(|| {
                StoreError::Validation(format!(
                    "an update in a transaction needs at least one action ({})",
                    r.key
                ))
            })?;
            b.update(
                ddb::Update::builder()
                    .table_name(table)
                    .set_key(Some(key_to_av(&r.key)))
                    .update_expression(u)
                    .set_condition_expression(c)
                    .set_expression_attribute_names(p.names_opt())
                    .set_expression_attribute_values(p.values_opt())
                    .return_values_on_condition_check_failure(all_old)
                    .build()
                    .map_err(build_err)?,
            )
            .build()
        }
        TransactOp::Delete(r) => {
            let c = cond(&mut p, r.condition.as_ref())?;
            b.delete(
                ddb::Delete::builder()
                    .table_name(table)
                    .set_key(Some(key_to_av(&r.key)))
                    .set_condition_expression(c)
                    .set_expression_attribute_names(p.names_opt())
                    .set_expression_attribute_values(p.values_opt())
                    .return_values_on_condition_check_failure(all_old)
                    .build()
                    .map_err(build_err)?,
            )
            .build()
        }
        TransactOp::Check { key, condition } => {
            let c = render::condition(&mut p, condition)?;
            b.condition_check(
                ddb::ConditionCheck::builder()
                    .table_name(table)
                    .set_key(Some(key_to_av(key)))
                    .condition_expression(c)
                    .set_expression_attribute_names(p.names_opt())
                    .set_expression_attribute_values(p.values_opt())
                    .return_values_on_condition_check_failure(all_old)
                    .build()
                    .map_err(build_err)?,
            )
            .build()
        }
    })
}

/// Longest `ClientRequestToken` DynamoDB accepts.
pub const MAX_TOKEN_LEN: usize = 36;

/// The `ClientRequestToken` for a caller's token. DynamoDB takes 1 to 36 characters; a
/// longer token (or one with characters outside printable ASCII) is replaced by a
/// deterministic 32-hex-digit digest of it (two FNV-1a 64-bit hashes), so the same token
/// always maps to the same request token, in every process and version.
pub fn request_token(token: String) -> String {
    let ok = |t: &str| {
        !t.is_empty() && t.len() <= MAX_TOKEN_LEN && t.bytes().all(|b| (0x21..=0x7e).contains(&b))
    };
    if ok(&token) {
        return token;
    }
    let fnv = |seed: u64| {
        token.bytes().fold(seed, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    format!(
        "{:016x}{:016x}",
        fnv(0xcbf2_9ce4_8422_2325),
        fnv(0x6c62_272e_07bb_0142)
    )
}

/// One cancellation reason of a cancelled transaction.
fn cancel_reason(r: &CancellationReason) -> CancelReason {
    let msg = || r.message().unwrap_or_default().to_string();
    match r.code().unwrap_or("None") {
        "None" => CancelReason::None,
        "ConditionalCheckFailed" => {
            match r
                .item()
                .filter(|m| !m.is_empty())
                .map(item_from_av)
                .transpose()
            {
                Ok(old) => CancelReason::ConditionFailed { old },
                Err(e) => CancelReason::Validation(format!("old item unreadable: {e}")),
            }
        }
        "TransactionConflict" => CancelReason::TransactionConflict,
        "ThrottlingError" | "ProvisionedThroughputExceeded" => CancelReason::Throttled,
        "ValidationError" => CancelReason::Validation(msg()),
        other => CancelReason::Validation(format!("{other}: {}", msg())),
    }
}

#[async_trait]
impl Store for DynamoDbStore {
    async fn get(&self, key: &Key, consistent: bool) -> Result<Option<Item>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key_to_av(key)))
            .consistent_read(consistent)
            .send()
            .await
            .map_err(|e| map_sdk(e, Effect::Read))?;
        out.item().map(item_from_av).transpose()
    }

    async fn batch_get(
        &self,
        keys: &[Key],
        consistent: bool,
    ) -> Result<Vec<Option<Item>>, StoreError> {
        let mut found: HashMap<Key, Item> = HashMap::new();
        // DynamoDB refuses duplicate keys in one request; refuse them across chunks too.
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = keys.iter().find(|k| !seen.insert(*k)) {
            return Err(StoreError::Validation(format!(
                "provided list of item keys contains duplicates: {dup}"
            )));
        }
        for chunk in keys.chunks(BATCH_GET_CHUNK) {
            let mut pending: Vec<AvMap> = chunk.iter().map(key_to_av).collect();
            let mut attempt = 0u32;
            while !pending.is_empty() {
                if attempt > 0 {
                    if attempt >= UNPROCESSED_ATTEMPTS {
                        return Err(StoreError::Throttled(format!(
                            "BatchGetItem left {} keys unprocessed after {attempt} attempts",
                            pending.len()
                        )));
                    }
                    let ms = (10u64 << attempt.min(7)).min(1000);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                attempt += 1;
                let ka = KeysAndAttributes::builder()
                    .set_keys(Some(std::mem::take(&mut pending)))
                    .consistent_read(consistent)
                    .build()
                    .map_err(build_err)?;
                let out = self
                    .client
                    .batch_get_item()
                    .request_items(&self.table, ka)
                    .send()
                    .await
                    .map_err(|e| map_sdk(e, Effect::Read))?;
                for m in out
                    .responses()
                    .and_then(|r| r.get(&self.table))
                    .into_iter()
                    .flatten()
                {
                    let key = key_from_av(m).ok_or_else(|| {
                        StoreError::Corrupt("batch_get returned an item without PK/SK".into())
                    })?;
                    found.insert(key, item_from_av(m)?);
                }
                if let Some(u) = out.unprocessed_keys().and_then(|u| u.get(&self.table)) {
                    pending = u.keys().to_vec();
                }
            }
        }
        Ok(keys.iter().map(|k| found.get(k).cloned()).collect())
    }

    async fn put(&self, req: PutRequest) -> Result<(), StoreError> {
        let mut p = Placeholders::new();
        let c = cond(&mut p, req.condition.as_ref())?;
        let res = self
            .write_client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(stamped(&req.key, &req.item)?))
            .set_condition_expression(c)
            .set_expression_attribute_names(p.names_opt())
            .set_expression_attribute_values(p.values_opt())
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match res {
            Ok(_) => Ok(()),
            Err(e) => match e.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(c)) => {
                    Err(condition_failed(c.item()))
                }
                _ => Err(map_sdk(e, Effect::Write)),
            },
        }
    }

    async fn update(&self, req: UpdateRequest) -> Result<Option<Item>, StoreError> {
        validate_update(&req.update)?;
        // An update of only REMOVE actions must not create an absent item (the contract,
        // and DynamoDB's service; DynamoDB Local creates the bare key item). Send it with
        // `attribute_exists(PK)` added, and read a failure on an absent item whose own
        // condition holds there as "nothing to do".
        let only_removes = !req.update.actions.is_empty()
            && req
                .update
                .actions
                .iter()
                .all(|a| matches!(a, Action::Remove(_)));
        let sent_condition = match (&req.condition, only_removes) {
            (Some(c), true) => Some(c.clone().and(Condition::exists(PK))),
            (None, true) => Some(Condition::exists(PK)),
            (c, false) => c.clone(),
        };
        let mut p = Placeholders::new();
        let c = cond(&mut p, sent_condition.as_ref())?;
        let u = render::update(&mut p, &req.update)?;
        let rv = match req.returns {
            ReturnValues::None => ReturnValue::None,
            ReturnValues::AllNew => ReturnValue::AllNew,
            ReturnValues::AllOld => ReturnValue::AllOld,
            ReturnValues::UpdatedNew => ReturnValue::UpdatedNew,
        };
        let res = self
            .write_client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key_to_av(&req.key)))
            .set_update_expression(u)
            .set_condition_expression(c)
            .set_expression_attribute_names(p.names_opt())
            .set_expression_attribute_values(p.values_opt())
            .return_values(rv)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        let out = match res {
            Ok(o) => o,
            Err(e) => {
                return match e.as_service_error() {
                    Some(UpdateItemError::ConditionalCheckFailedException(c)) => {
                        match condition_failed(c.item()) {
                            StoreError::ConditionFailed { old: None }
                                if only_removes
                                    && req
                                        .condition
                                        .as_ref()
                                        .is_none_or(|c| eval_condition(None, c)) =>
                            {
                                Ok(None)
                            }
                            other => Err(other),
                        }
                    }
                    _ => Err(map_sdk(e, Effect::Write)),
                }
            }
        };
        let attrs = out.attributes().map(item_from_av).transpose()?;
        Ok(match req.returns {
            ReturnValues::None => None,
            ReturnValues::AllOld | ReturnValues::UpdatedNew => attrs.filter(|i| !i.is_empty()),
            ReturnValues::AllNew => Some(attrs.unwrap_or_default()),
        })
    }

    async fn delete(&self, req: DeleteRequest) -> Result<Option<Item>, StoreError> {
        let mut p = Placeholders::new();
        let c = cond(&mut p, req.condition.as_ref())?;
        let res = self
            .write_client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(key_to_av(&req.key)))
            .set_condition_expression(c)
            .set_expression_attribute_names(p.names_opt())
            .set_expression_attribute_values(p.values_opt())
            .return_values(ReturnValue::AllOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match res {
            Ok(o) => Ok(o
                .attributes()
                .filter(|m| !m.is_empty())
                .map(item_from_av)
                .transpose()?),
            Err(e) => Err(match e.as_service_error() {
                Some(DeleteItemError::ConditionalCheckFailedException(c)) => {
                    condition_failed(c.item())
                }
                _ => map_sdk(e, Effect::Write),
            }),
        }
    }

    async fn transact_write(
        &self,
        ops: Vec<TransactOp>,
        token: Option<String>,
    ) -> Result<(), StoreError> {
        validate_transaction(&ops)?;
        let items = ops
            .iter()
            .map(|op| transact_item(&self.table, op))
            .collect::<Result<Vec<_>, _>>()?;
        // Standard SDK retries are safe here: the SDK fills in a ClientRequestToken when we
        // give none, once per call, and every retry of the call resends the same token.
        let res = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .set_client_request_token(token.map(request_token))
            .send()
            .await;
        match res {
            Ok(_) => Ok(()),
            Err(e) => Err(match e.as_service_error() {
                Some(TransactWriteItemsError::TransactionCanceledException(c)) => {
                    let mut reasons: Vec<CancelReason> =
                        c.cancellation_reasons().iter().map(cancel_reason).collect();
                    if reasons.len() != ops.len() {
                        tracing::warn!(
                            got = reasons.len(),
                            want = ops.len(),
                            "TransactWriteItems cancelled with a reason list of the wrong length"
                        );
                        reasons.resize(ops.len(), CancelReason::None);
                    }
                    StoreError::TransactionCanceled { reasons }
                }
                _ => map_sdk(e, Effect::Write),
            }),
        }
    }

    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
        let (pk_attr, sk_attr) = match &q.index {
            None => ("PK".to_string(), "SK".to_string()),
            Some(ix) => (format!("{ix}PK"), format!("{ix}SK")),
        };
        let mut p = Placeholders::new();
        let pk = p.name(&pk_attr);
        let pkv = p.value(&pk_attr, &q.pk.clone().into())?;
        let mut kce = format!("{pk} = {pkv}");
        if let Some(prefix) = &q.sk_prefix {
            let sk = p.name(&sk_attr);
            let skv = p.value(&sk_attr, &prefix.clone().into())?;
            kce.push_str(&format!(" AND begins_with({sk}, {skv})"));
        }
        let mut out = Vec::new();
        let mut start: Option<AvMap> = None;
        loop {
            let page = self
                .client
                .query()
                .table_name(&self.table)
                .set_index_name(q.index.clone())
                .key_condition_expression(&kce)
                .set_expression_attribute_names(p.names_opt())
                .set_expression_attribute_values(p.values_opt())
                .consistent_read(q.consistent && q.index.is_none())
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| map_sdk(e, Effect::Read))?;
            for m in page.items() {
                out.push(item_from_av(m)?);
            }
            match page.last_evaluated_key() {
                Some(k) if !k.is_empty() => start = Some(k.clone()),
                _ => break,
            }
        }
        Ok(out)
    }

    fn backend(&self) -> &'static str {
        "dynamodb"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_tokens_pass_through_and_long_ones_are_digested() {
        assert_eq!(request_token("abc-123".into()), "abc-123");
        let long = "x".repeat(80);
        let d = request_token(long.clone());
        assert_eq!(d.len(), 32);
        assert_eq!(d, request_token(long));
        assert_ne!(d, request_token("y".repeat(80)));
        assert_eq!(request_token("with space".into()).len(), 32);
        assert_eq!(request_token(String::new()).len(), 32);
    }
}

//! [`DynamoDbStore`]: the [`Store`] contract over one DynamoDB table.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::config::{Credentials, Region, SharedCredentialsProvider};
use aws_sdk_dynamodb::error::SdkError;
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
use tollgate_core::value::{Item, Key, PK, SK};
use tollgate_store::eval::{eval_condition, validate_update};
use tollgate_store::{
    validate_transaction, CancelReason, DeleteRequest, PutRequest, Query, ScanPage, Scanned, Store,
    StoreError, TransactOp, Undecodable, UpdateRequest,
};

use crate::codec::{
    from_av_owned, item_from_av, item_from_av_owned, item_into_av, key_from_av, key_into_av,
    key_to_av, AvMap,
};
use crate::error::{map_sdk, DynamoDbError, Effect};
use crate::json::{push_item, push_key, push_str, JsonAliases};
use crate::render::{write_condition, write_update, AliasTable, Aliases};
use crate::settings::{self, Role, DEFAULT_DEADLINE};
use crate::shape::{Shape, Shapes};
use crate::table::{self, TableCheck};
use crate::wire::{Op, Wire};

/// Most keys in one `BatchGetItem` request.
pub const BATCH_GET_CHUNK: usize = 100;
/// How many times `batch_get` resends `UnprocessedKeys` before giving up with `Throttled`.
const UNPROCESSED_ATTEMPTS: u32 = 8;
/// Typical length of a rendered condition (the speculative write's is about 200 bytes).
const CONDITION_CAPACITY: usize = 256;
/// Typical length of a rendered update expression.
const UPDATE_CAPACITY: usize = 128;

/// A [`Store`] over one DynamoDB table (see the crate docs for the retry policy, and
/// [`crate::settings`] for the deadline).
#[derive(Debug, Clone)]
pub struct DynamoDbStore {
    table: String,
    deadline: Duration,
    /// Reads and transactions: retried within the deadline.
    client: Client,
    /// Single-item writes: one attempt (an `ADD` resent after a lost response would apply
    /// twice).
    write_client: Client,
    /// DynamoDB Streams: the change feed.
    streams: aws_sdk_dynamodbstreams::Client,
    /// The table's latest stream ARN, once read.
    stream_arn: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    /// Single-item writes as signed HTTP requests (see [`crate::wire`]); `None` when the
    /// configuration needs the SDK for them (`write_client` then sends them).
    wire: Option<std::sync::Arc<Wire>>,
    /// The expressions `wire` sends, rendered once per shape ([`crate::shape`]).
    shapes: std::sync::Arc<Shapes>,
}

/// Builds a [`DynamoDbStore`] from the standard AWS configuration chain (environment,
/// profile, IMDS …) plus explicit overrides.
#[derive(Clone)]
pub struct DynamoDbStoreBuilder {
    table: String,
    endpoint: Option<String>,
    region: Option<String>,
    credentials: Option<(String, String)>,
    timeouts: Option<TimeoutConfig>,
    deadline: Duration,
    sdk: Option<SdkConfig>,
}

impl std::fmt::Debug for DynamoDbStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoDbStoreBuilder")
            .field("table", &self.table)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            // Never the secret.
            .field("credentials", &self.credentials.as_ref().map(|(id, _)| id))
            .field("timeouts", &self.timeouts)
            .field("deadline", &self.deadline)
            .field("sdk", &self.sdk)
            .finish()
    }
}

impl DynamoDbStoreBuilder {
    /// Talk to this endpoint (DynamoDB Local, a VPC endpoint) instead of the regional one.
    /// An endpoint on loopback (`localhost`, `127.0.0.1`, `[::1]`) is taken for an emulator:
    /// credentials and region then come from the environment or the profile only (no
    /// instance-metadata lookups), and the region defaults to `us-east-1`.
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

    /// The deadline of every request (default [`DEFAULT_DEADLINE`], 1 s): the SDK's
    /// operation timeout, with attempt, connect timeouts and retries fitted inside it (see
    /// [`crate::settings`]). A request that cannot finish in time is reported as
    /// [`StoreError::Unavailable`] (reads, and writes never sent) or
    /// [`StoreError::Ambiguous`] (writes that may have been applied).
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Explicit timeouts (connect, per attempt, per operation); the ones set win over those
    /// derived from [`deadline`](Self::deadline). A timed-out write is reported as
    /// [`StoreError::Ambiguous`].
    pub fn timeouts(mut self, t: TimeoutConfig) -> Self {
        self.timeouts = Some(t);
        self
    }

    /// Start from this loaded AWS configuration instead of loading the standard chain; the
    /// builder's endpoint, region and credentials still apply on top of it, and its deadline
    /// and [`timeouts`](Self::timeouts) replace the configuration's own timeouts.
    pub fn sdk_config(mut self, sdk: SdkConfig) -> Self {
        self.sdk = Some(sdk);
        self
    }

    /// Load the AWS configuration, check that credentials can be found, and build the
    /// store. Does not touch the table (see [`DynamoDbStore::check_table`]).
    ///
    /// Errors: [`DynamoDbError::Config`] for an unusable table name or deadline or no
    /// region, [`DynamoDbError::NoCredentials`] when no provider finds credentials.
    pub async fn build(self) -> Result<DynamoDbStore, DynamoDbError> {
        validate(&self.table, self.deadline)?;
        let emulator = self.endpoint.as_deref().is_some_and(settings::is_loopback);
        let static_creds = self.credentials.as_ref().map(|(id, secret)| {
            Credentials::new(id.clone(), secret.clone(), None, None, "tollgate-static")
        });
        let mut sdk = match self.sdk {
            Some(sdk) => {
                let mut b = sdk.into_builder();
                if let Some(e) = &self.endpoint {
                    b.set_endpoint_url(Some(e.clone()));
                }
                if let Some(r) = &self.region {
                    b.set_region(Some(Region::new(r.clone())));
                }
                if let Some(c) = static_creds {
                    b.set_credentials_provider(Some(SharedCredentialsProvider::new(c)));
                }
                b.build()
            }
            None => {
                let mut loader = aws_config::defaults(BehaviorVersion::latest());
                if let Some(e) = &self.endpoint {
                    loader = loader.endpoint_url(e.clone());
                }
                match (&self.region, emulator) {
                    (Some(r), _) => loader = loader.region(Region::new(r.clone())),
                    (None, true) => loader = loader.region(settings::emulator_region()),
                    (None, false) => {}
                }
                match (static_creds, emulator) {
                    (Some(c), _) => loader = loader.credentials_provider(c),
                    (None, true) => {
                        loader = loader.credentials_provider(settings::emulator_credentials())
                    }
                    (None, false) => {}
                }
                loader.load().await
            }
        };
        if sdk.region().is_none() {
            if sdk.endpoint_url().is_none() {
                return Err(DynamoDbError::Config(
                    "no AWS region configured: set AWS_REGION (or a region in the profile)".into(),
                ));
            }
            sdk = sdk
                .into_builder()
                .region(Region::from_static("us-east-1"))
                .build();
        }
        settings::check_credentials(&sdk).await?;
        Ok(DynamoDbStore::assemble(
            &sdk,
            self.table,
            self.deadline,
            self.timeouts.as_ref(),
        ))
    }
}

/// A usable table name and deadline.
fn validate(table: &str, deadline: Duration) -> Result<(), DynamoDbError> {
    if table.len() < 3 || table.len() > 255 {
        return Err(DynamoDbError::Config(format!(
            "table name must be 3 to 255 characters: {table:?}"
        )));
    }
    if deadline.is_zero() {
        return Err(DynamoDbError::Config(
            "the deadline must be positive".into(),
        ));
    }
    Ok(())
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
            deadline: DEFAULT_DEADLINE,
            sdk: None,
        }
    }

    /// A store over `table` from the standard AWS configuration, optionally at `endpoint`,
    /// with the default deadline.
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

    /// A store over `table` from an already loaded AWS configuration, with the default
    /// deadline (the configuration's own operation timeouts, if set, win; its connect
    /// timeout is kept within half the deadline). Credentials are not checked here; missing
    /// ones make every request fail with a [`StoreError::Validation`] that says so. Use
    /// [`DynamoDbStoreBuilder::sdk_config`] for a different deadline or the check.
    pub fn from_sdk_config(
        sdk: &SdkConfig,
        table: impl Into<String>,
    ) -> Result<Self, DynamoDbError> {
        let table = table.into();
        validate(&table, DEFAULT_DEADLINE)?;
        // aws-config always sets a 3.1 s connect timeout; keep it inside the deadline.
        let overrides = sdk.timeout_config().map(|t| {
            let mut b = t.to_builder();
            if t.connect_timeout()
                .is_some_and(|c| c > DEFAULT_DEADLINE / 2)
            {
                b.set_connect_timeout(Some(DEFAULT_DEADLINE / 2));
            }
            b.build()
        });
        Ok(Self::assemble(
            sdk,
            table,
            DEFAULT_DEADLINE,
            overrides.as_ref(),
        ))
    }

    fn assemble(
        sdk: &SdkConfig,
        table: String,
        deadline: Duration,
        overrides: Option<&TimeoutConfig>,
    ) -> Self {
        let conf = settings::client_config(sdk, deadline, Role::Read, overrides);
        let write_conf = settings::client_config(sdk, deadline, Role::Write, overrides);
        let wire = match Wire::new(sdk, &settings::timeouts(deadline, Role::Write, overrides)) {
            Ok(w) => Some(std::sync::Arc::new(w)),
            Err(why) => {
                tracing::debug!(table = %table, %why, "single-item writes go through the AWS SDK");
                None
            }
        };
        DynamoDbStore {
            wire,
            shapes: Default::default(),
            table,
            deadline,
            client: Client::from_conf(conf),
            write_client: Client::from_conf(write_conf),
            streams: aws_sdk_dynamodbstreams::Client::new(sdk),
            stream_arn: Default::default(),
        }
    }

    /// The table this store uses.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The deadline of every request.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Whether single-item writes (`put`, `update`, `delete`) are sent as signed HTTP
    /// requests by this crate (its `wire` module) rather than through the SDK's write
    /// client: true unless the AWS configuration brings its own HTTP client or
    /// requires account-ID endpoints.
    pub fn direct_writes(&self) -> bool {
        self.wire.is_some()
    }

    /// The SDK client (retries within the deadline), for admin work such as
    /// [`crate::create_table`].
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Create this store's table if it does not exist (see [`crate::create_table`]).
    pub async fn create_table(&self) -> Result<(), DynamoDbError> {
        crate::table::create_table(&self.client, &self.table).await
    }

    /// The table's stream ARN (one `DescribeTable`, then remembered). A table without a
    /// stream is a [`StoreError::Validation`] saying how to enable it.
    async fn stream_arn(&self) -> Result<String, StoreError> {
        if let Some(a) = self
            .stream_arn
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Ok(a);
        }
        let d = self
            .client
            .describe_table()
            .table_name(&self.table)
            .send()
            .await
            .map_err(|e| map_sdk(e, Effect::Read, &self.table))?;
        let arn = d
            .table()
            .and_then(|t| t.latest_stream_arn())
            .map(str::to_string)
            .ok_or_else(|| {
                StoreError::Validation(format!(
                    "table {} has no stream: `tollgate table create --store dynamodb:{}` enables one",
                    self.table, self.table
                ))
            })?;
        *self.stream_arn.lock().unwrap_or_else(|e| e.into_inner()) = Some(arn.clone());
        Ok(arn)
    }

    /// `UpdateItem` through the SDK's write client: the image returned (`None` when none),
    /// a failed condition as `ConditionFailed` with the old item.
    async fn update_sdk(
        &self,
        req: &UpdateRequest,
        only_removes: bool,
    ) -> Result<Option<Item>, StoreError> {
        let mut a = Aliases::new();
        let c = render_condition(&mut a, req.condition.as_ref(), only_removes)?;
        let u = render_update(&mut a, &req.update)?;
        let (names, values) = a.into_maps();
        let rv = match req.returns {
            ReturnValues::None => ReturnValue::None,
            ReturnValues::AllNew => ReturnValue::AllNew,
            ReturnValues::AllOld => ReturnValue::AllOld,
            ReturnValues::UpdatedNew => ReturnValue::UpdatedNew,
        };
        let res = self
            .write_client
            .update_item()
            .table_name(self.table.clone())
            .set_key(Some(key_to_av(&req.key)))
            .set_update_expression(u)
            .set_condition_expression(c)
            .set_expression_attribute_names(names)
            .set_expression_attribute_values(values)
            .return_values(rv)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match res {
            Ok(o) => Ok(o.attributes.map(item_from_av_owned).transpose()?),
            Err(SdkError::ServiceError(se))
                if matches!(
                    se.err(),
                    UpdateItemError::ConditionalCheckFailedException(_)
                ) =>
            {
                Err(condition_failed(match se.into_err() {
                    UpdateItemError::ConditionalCheckFailedException(c) => c.item,
                    _ => None,
                }))
            }
            Err(e) => Err(map_sdk(e, Effect::Write, &self.table)),
        }
    }

    /// A request body opened with `{"TableName":…,` and room for `capacity` bytes.
    fn body_start(&self, capacity: usize) -> Vec<u8> {
        let mut body = Vec::with_capacity(capacity);
        body.extend_from_slice(b"{\"TableName\":");
        push_str(&mut body, &self.table);
        body.push(b',');
        body
    }

    /// Check, with one `DescribeTable`, that the table exists, is usable and has tollgate's
    /// layout (see [`crate::check_table`]). For a server's start: a missing table is
    /// [`DynamoDbError::TableMissing`], a different layout [`DynamoDbError::TableMismatch`],
    /// each naming the table.
    pub async fn check_table(&self) -> Result<TableCheck, DynamoDbError> {
        table::check_table(&self.client, &self.table).await
    }
}

/// `ConditionFailed` from the old item DynamoDB returned (`None` if the item was absent).
fn condition_failed(old: Option<AvMap>) -> StoreError {
    match old
        .filter(|m| !m.is_empty())
        .map(item_from_av_owned)
        .transpose()
    {
        Ok(old) => StoreError::ConditionFailed {
            old: old.map(Box::new),
        },
        Err(e) => e,
    }
}

/// Typical size of a single-item write's request body (an acquire's is about 1 KB).
const BODY_CAPACITY: usize = 1024;
/// The end of a conditional write's body: the old item comes back with a failed condition.
const ALL_OLD_ON_FAILURE: &[u8] = b",\"ReturnValuesOnConditionCheckFailure\":\"ALL_OLD\"}";

/// Append the update and condition expressions that are there, and the alias maps.
fn push_expressions(body: &mut Vec<u8>, u: Option<&str>, c: Option<&str>, a: JsonAliases) {
    push_expression_text(body, u, c);
    a.finish(body);
}

/// Append the update and condition expressions that are there.
pub(crate) fn push_expression_text(body: &mut Vec<u8>, u: Option<&str>, c: Option<&str>) {
    if let Some(u) = u {
        body.extend_from_slice(b",\"UpdateExpression\":");
        push_str(body, u);
    }
    if let Some(c) = c {
        body.extend_from_slice(b",\"ConditionExpression\":");
        push_str(body, c);
    }
}

fn build_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Validation(format!("request could not be built: {e}"))
}

/// Render an optional condition, with `attribute_exists(PK)` added when `require_item`.
pub(crate) fn render_condition<A: AliasTable>(
    a: &mut A,
    c: Option<&Condition>,
    require_item: bool,
) -> Result<Option<String>, StoreError> {
    if c.is_none() && !require_item {
        return Ok(None);
    }
    let mut out = String::with_capacity(CONDITION_CAPACITY);
    if let Some(c) = c {
        if require_item {
            out.push('(');
        }
        write_condition(a, &mut out, c)?;
        if require_item {
            out.push_str(") AND ");
        }
    }
    if require_item {
        out.push_str("attribute_exists(");
        a.push_name(&mut out, PK);
        out.push(')');
    }
    Ok(Some(out))
}

/// Render an update expression (`None` for an empty update).
pub(crate) fn render_update<A: AliasTable>(
    a: &mut A,
    u: &tollgate_core::expr::Update,
) -> Result<Option<String>, StoreError> {
    let mut out = String::with_capacity(UPDATE_CAPACITY);
    Ok(write_update(a, &mut out, u)?.then_some(out))
}

/// An item with its key stamped on, as the SDK wants it.
fn stamped(key: Key, item: Item) -> Result<AvMap, StoreError> {
    let mut m = item_into_av(item)?;
    m.insert(PK.to_string(), ddb::AttributeValue::S(key.pk.to_string()));
    m.insert(SK.to_string(), ddb::AttributeValue::S(key.sk.to_string()));
    Ok(m)
}

/// One transaction operation as the SDK wants it.
fn transact_item(table: &str, op: TransactOp) -> Result<TransactWriteItem, StoreError> {
    let mut a = Aliases::new();
    let all_old = ReturnValuesOnConditionCheckFailure::AllOld;
    let b = TransactWriteItem::builder();
    Ok(match op {
        TransactOp::Put(r) => {
            let c = render_condition(&mut a, r.condition.as_ref(), false)?;
            let (names, values) = a.into_maps();
            b.put(
                ddb::Put::builder()
                    .table_name(table)
                    .set_item(Some(stamped(r.key, r.item)?))
                    .set_condition_expression(c)
                    .set_expression_attribute_names(names)
                    .set_expression_attribute_values(values)
                    .return_values_on_condition_check_failure(all_old)
                    .build()
                    .map_err(build_err)?,
            )
            .build()
        }
        TransactOp::Update(r) => {
            let c = render_condition(&mut a, r.condition.as_ref(), false)?;
            // DynamoDB's transactional Update requires an update expression, and the keys
            // cannot be SET, so "create the bare item if absent" has no rendering here.
            let u = render_update(&mut a, &r.update)?.ok_or_else(|| {
                StoreError::Validation(format!(
                    "an update in a transaction needs at least one action ({})",
                    r.key
                ))
            })?;
            let (names, values) = a.into_maps();
            b.update(
                ddb::Update::builder()
                    .table_name(table)
                    .set_key(Some(key_into_av(r.key)))
                    .update_expression(u)
                    .set_condition_expression(c)
                    .set_expression_attribute_names(names)
                    .set_expression_attribute_values(values)
                    .return_values_on_condition_check_failure(all_old)
                    .build()
                    .map_err(build_err)?,
            )
            .build()
        }
        TransactOp::Delete(r) => {
            let c = render_condition(&mut a, r.condition.as_ref(), false)?;
            let (names, values) = a.into_maps();
            b.delete(
                ddb::Delete::builder()
                    .table_name(table)
                    .set_key(Some(key_into_av(r.key)))
                    .set_condition_expression(c)
                    .set_expression_attribute_names(names)
                    .set_expression_attribute_values(values)
                    .return_values_on_condition_check_failure(all_old)
                    .build()
                    .map_err(build_err)?,
            )
            .build()
        }
        TransactOp::Check { key, condition } => {
            let c = render_condition(&mut a, Some(&condition), false)?;
            let (names, values) = a.into_maps();
            b.condition_check(
                ddb::ConditionCheck::builder()
                    .table_name(table)
                    .set_key(Some(key_into_av(key)))
                    .set_condition_expression(c)
                    .set_expression_attribute_names(names)
                    .set_expression_attribute_values(values)
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
            .table_name(self.table.clone())
            .set_key(Some(key_to_av(key)))
            .consistent_read(consistent)
            .send()
            .await
            .map_err(|e| map_sdk(e, Effect::Read, &self.table))?;
        out.item
            .map(item_from_av_owned)
            .transpose()
            .map_err(naming(key))
    }

    async fn batch_get(
        &self,
        keys: &[Key],
        consistent: bool,
    ) -> Result<Vec<Option<Item>>, StoreError> {
        let started = Instant::now();
        let mut found: HashMap<Key, Item> = HashMap::with_capacity(keys.len());
        // DynamoDB refuses duplicate keys in one request; refuse them across chunks too.
        let mut seen = std::collections::HashSet::with_capacity(keys.len());
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
                    let pause = Duration::from_millis((10u64 << attempt.min(7)).min(1000));
                    // Resending stops at the attempt limit or the deadline, whichever first.
                    if attempt >= UNPROCESSED_ATTEMPTS || started.elapsed() + pause > self.deadline
                    {
                        return Err(StoreError::Throttled(format!(
                            "table {}: BatchGetItem left {} keys unprocessed after {attempt} \
                             attempts in {} ms",
                            self.table,
                            pending.len(),
                            started.elapsed().as_millis()
                        )));
                    }
                    tokio::time::sleep(pause).await;
                }
                attempt += 1;
                let ka = KeysAndAttributes::builder()
                    .set_keys(Some(std::mem::take(&mut pending)))
                    .consistent_read(consistent)
                    .build()
                    .map_err(build_err)?;
                let mut out = self
                    .client
                    .batch_get_item()
                    .request_items(self.table.clone(), ka)
                    .send()
                    .await
                    .map_err(|e| map_sdk(e, Effect::Read, &self.table))?;
                let items = out
                    .responses
                    .as_mut()
                    .and_then(|r| r.remove(&self.table))
                    .unwrap_or_default();
                for m in items {
                    let key = key_from_av(&m).ok_or_else(|| {
                        StoreError::Corrupt("batch_get returned an item without PK/SK".into())
                    })?;
                    let item = item_from_av_owned(m).map_err(naming(&key))?;
                    found.insert(key, item);
                }
                if let Some(u) = out
                    .unprocessed_keys
                    .as_mut()
                    .and_then(|u| u.remove(&self.table))
                {
                    pending = u.keys;
                }
            }
        }
        Ok(keys.iter().map(|k| found.remove(k)).collect())
    }

    async fn put(&self, req: PutRequest) -> Result<(), StoreError> {
        if let Some(w) = &self.wire {
            let mut a = JsonAliases::new();
            let c = render_condition(&mut a, req.condition.as_ref(), false)?;
            let mut body = self.body_start(BODY_CAPACITY);
            push_item(&mut body, &req.key, &req.item)?;
            push_expressions(&mut body, None, c.as_deref(), a);
            body.extend_from_slice(ALL_OLD_ON_FAILURE);
            return w.send(Op::Put, body, &self.table).await.map(drop);
        }
        let mut a = Aliases::new();
        let c = render_condition(&mut a, req.condition.as_ref(), false)?;
        let (names, values) = a.into_maps();
        let res = self
            .write_client
            .put_item()
            .table_name(self.table.clone())
            .set_item(Some(stamped(req.key, req.item)?))
            .set_condition_expression(c)
            .set_expression_attribute_names(names)
            .set_expression_attribute_values(values)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match res {
            Ok(_) => Ok(()),
            Err(SdkError::ServiceError(se))
                if matches!(se.err(), PutItemError::ConditionalCheckFailedException(_)) =>
            {
                Err(condition_failed(match se.into_err() {
                    PutItemError::ConditionalCheckFailedException(c) => c.item,
                    _ => None,
                }))
            }
            Err(e) => Err(map_sdk(e, Effect::Write, &self.table)),
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
        let res = match &self.wire {
            Some(w) => {
                let shape = Shape::of(req.condition.as_ref(), only_removes, &req.update);
                let text = match self.shapes.get(&shape) {
                    Some(text) => {
                        // The whole test suite checks every reuse against the renderer.
                        debug_assert_eq!(
                            shape.text().ok().as_deref(),
                            Some(&*text),
                            "a shape's kept text is what the renderer writes for this write"
                        );
                        text
                    }
                    None => {
                        let text: std::sync::Arc<[u8]> = shape.text()?.into();
                        self.shapes.insert(&shape, text.clone());
                        text
                    }
                };
                let mut body = self.body_start(BODY_CAPACITY);
                push_key(&mut body, &req.key);
                body.extend_from_slice(&text);
                shape.push_values(&mut body)?;
                body.extend_from_slice(match req.returns {
                    ReturnValues::None => b",\"ReturnValues\":\"NONE\"",
                    ReturnValues::AllNew => b",\"ReturnValues\":\"ALL_NEW\"",
                    ReturnValues::AllOld => b",\"ReturnValues\":\"ALL_OLD\"",
                    ReturnValues::UpdatedNew => b",\"ReturnValues\":\"UPDATED_NEW\"",
                });
                body.extend_from_slice(ALL_OLD_ON_FAILURE);
                w.send(Op::Update, body, &self.table).await
            }
            None => self.update_sdk(&req, only_removes).await,
        };
        let attrs = match res {
            Ok(a) => a,
            Err(StoreError::ConditionFailed { old: None })
                if only_removes
                    && req
                        .condition
                        .as_ref()
                        .is_none_or(|c| eval_condition(None, c)) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        Ok(match req.returns {
            ReturnValues::None => None,
            ReturnValues::AllOld | ReturnValues::UpdatedNew => attrs.filter(|i| !i.is_empty()),
            ReturnValues::AllNew => Some(attrs.unwrap_or_default()),
        })
    }

    async fn delete(&self, req: DeleteRequest) -> Result<Option<Item>, StoreError> {
        if let Some(w) = &self.wire {
            let mut a = JsonAliases::new();
            let c = render_condition(&mut a, req.condition.as_ref(), false)?;
            let mut body = self.body_start(BODY_CAPACITY);
            push_key(&mut body, &req.key);
            push_expressions(&mut body, None, c.as_deref(), a);
            body.extend_from_slice(b",\"ReturnValues\":\"ALL_OLD\"");
            body.extend_from_slice(ALL_OLD_ON_FAILURE);
            return Ok(w
                .send(Op::Delete, body, &self.table)
                .await?
                .filter(|i| !i.is_empty()));
        }
        let mut a = Aliases::new();
        let c = render_condition(&mut a, req.condition.as_ref(), false)?;
        let (names, values) = a.into_maps();
        let res = self
            .write_client
            .delete_item()
            .table_name(self.table.clone())
            .set_key(Some(key_into_av(req.key)))
            .set_condition_expression(c)
            .set_expression_attribute_names(names)
            .set_expression_attribute_values(values)
            .return_values(ReturnValue::AllOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match res {
            Ok(o) => Ok(o
                .attributes
                .filter(|m| !m.is_empty())
                .map(item_from_av_owned)
                .transpose()?),
            Err(SdkError::ServiceError(se))
                if matches!(
                    se.err(),
                    DeleteItemError::ConditionalCheckFailedException(_)
                ) =>
            {
                Err(condition_failed(match se.into_err() {
                    DeleteItemError::ConditionalCheckFailedException(c) => c.item,
                    _ => None,
                }))
            }
            Err(e) => Err(map_sdk(e, Effect::Write, &self.table)),
        }
    }
    async fn transact_write(
        &self,
        ops: Vec<TransactOp>,
        token: Option<String>,
    ) -> Result<(), StoreError> {
        validate_transaction(&ops)?;
        let n = ops.len();
        let items = ops
            .into_iter()
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
                    if reasons.len() != n {
                        tracing::warn!(
                            got = reasons.len(),
                            want = n,
                            "TransactWriteItems cancelled with a reason list of the wrong length"
                        );
                        reasons.resize(n, CancelReason::None);
                    }
                    StoreError::TransactionCanceled { reasons }
                }
                _ => map_sdk(e, Effect::Write, &self.table),
            }),
        }
    }

    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
        let (pk_attr, sk_attr) = match &q.index {
            None => ("PK".to_string(), "SK".to_string()),
            Some(ix) => (format!("{ix}PK"), format!("{ix}SK")),
        };
        let mut a = Aliases::new();
        let mut kce = String::with_capacity(64);
        a.push_name(&mut kce, &pk_attr);
        kce.push_str(" = ");
        a.push_value(&mut kce, &pk_attr, &q.pk.clone().into())?;
        if let Some(prefix) = &q.sk_prefix {
            kce.push_str(" AND begins_with(");
            a.push_name(&mut kce, &sk_attr);
            kce.push_str(", ");
            a.push_value(&mut kce, &sk_attr, &prefix.clone().into())?;
            kce.push(')');
        }
        let (names, values) = a.into_maps();
        let mut out = Vec::new();
        let mut start: Option<AvMap> = None;
        loop {
            let page = self
                .client
                .query()
                .table_name(self.table.clone())
                .set_index_name(q.index.clone())
                .key_condition_expression(kce.clone())
                .set_expression_attribute_names(names.clone())
                .set_expression_attribute_values(values.clone())
                .consistent_read(q.consistent && q.index.is_none())
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| map_sdk(e, Effect::Read, &self.table))?;
            out.reserve(page.items.as_ref().map_or(0, Vec::len));
            for m in page.items.into_iter().flatten() {
                // The key only to name an item that does not decode.
                let key = key_from_av(&m);
                out.push(item_from_av_owned(m).map_err(|e| match &key {
                    Some(k) => naming(k)(e),
                    None => e,
                })?);
            }
            match page.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => break,
            }
        }
        Ok(out)
    }

    fn backend(&self) -> &'static str {
        "dynamodb"
    }

    /// A `Scan` of the whole table filtered on `begins_with(PK, prefix)`, strongly
    /// consistent; `limit` is DynamoDB's (items read before the filter), so a page may hold
    /// fewer entries, even none, with more to come.
    async fn scan(
        &self,
        pk_prefix: &str,
        after: Option<Key>,
        limit: usize,
    ) -> Result<ScanPage, StoreError> {
        let mut a = Aliases::new();
        let mut filter = String::with_capacity(32);
        filter.push_str("begins_with(");
        a.push_name(&mut filter, PK);
        filter.push_str(", ");
        a.push_value(&mut filter, PK, &pk_prefix.into())?;
        filter.push(')');
        let (names, values) = a.into_maps();
        let out = self
            .client
            .scan()
            .table_name(self.table.clone())
            .filter_expression(filter)
            .set_expression_attribute_names(names)
            .set_expression_attribute_values(values)
            .consistent_read(true)
            .limit(i32::try_from(limit.max(1)).unwrap_or(i32::MAX))
            .set_exclusive_start_key(after.map(key_into_av))
            .send()
            .await
            .map_err(|e| map_sdk(e, Effect::Read, &self.table))?;
        Ok(ScanPage {
            items: out.items.into_iter().flatten().map(scanned).collect(),
            next: out
                .last_evaluated_key
                .filter(|k| !k.is_empty())
                .and_then(|k| key_from_av(&k)),
        })
    }

    /// `DeleteItem` returning nothing, so an item that does not decode is deleted too.
    async fn purge(&self, key: &Key) -> Result<(), StoreError> {
        self.write_client
            .delete_item()
            .table_name(self.table.clone())
            .set_key(Some(key_to_av(key)))
            .return_values(ReturnValue::None)
            .send()
            .await
            .map(drop)
            .map_err(|e| map_sdk(e, Effect::Write, &self.table))
    }
}

/// Prefix a decoding failure with the item's key.
fn naming(key: &Key) -> impl FnOnce(StoreError) -> StoreError + '_ {
    move |e| match e {
        StoreError::Corrupt(m) => StoreError::Corrupt(format!("item {key}: {m}")),
        e => e,
    }
}

/// One scanned item, decoded attribute by attribute so a failure names its attribute.
fn scanned(m: AvMap) -> Scanned {
    let key = key_from_av(&m).unwrap_or_else(|| Key::new("", ""));
    let mut item = Item::new();
    for (name, v) in m {
        match from_av_owned(&name, v) {
            Ok(v) => {
                item.insert(name.into(), v);
            }
            Err(e) => {
                let msg = match e {
                    StoreError::Corrupt(m) => m,
                    other => other.to_string(),
                };
                // The codec says "attribute PATH: why"; keep the path (it may be nested).
                let (attribute, reason) = match msg
                    .strip_prefix("attribute ")
                    .and_then(|r| r.split_once(": "))
                {
                    Some((path, why)) => (path.to_string(), why.to_string()),
                    None => (name, msg),
                };
                return Err(Undecodable {
                    key,
                    attribute: Some(attribute),
                    reason,
                });
            }
        }
    }
    Ok(item)
}

/// The change feed: the table's DynamoDB stream (see `feed.rs`).
#[async_trait]
impl tollgate_store::ChangeFeed for DynamoDbStore {
    async fn read_feed(
        &self,
        cursor: &tollgate_store::FeedCursor,
        limit: usize,
    ) -> Result<tollgate_store::FeedBatch, StoreError> {
        let arn = self.stream_arn().await?;
        crate::feed::read(&self.streams, &arn, &self.table, cursor, limit).await
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

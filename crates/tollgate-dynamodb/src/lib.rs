//! tollgate's DynamoDB backend: [`DynamoDbStore`] implements [`tollgate_store::Store`] over
//! one table, with the official `aws-sdk-dynamodb`; the hot single-item writes are sent as
//! signed HTTP requests over the SDK's HTTP connector, without its per-call orchestrator
//! (see the crate README's "Client CPU").
//!
//! * Typed [`Condition`](tollgate_core::expr::Condition)s and
//!   [`Update`](tollgate_core::expr::Update)s are rendered into expression strings
//!   ([`render`]); every attribute name is an `ExpressionAttributeNames` alias (limit names may
//!   hold `-` and `.`) and every literal an `ExpressionAttributeValues` placeholder. The
//!   direct writes render once per shape of write and reuse the text with new literals
//!   (`src/shape.rs`).
//! * Values map to `AttributeValue`s in [`codec`]: numbers are `i64` decimal strings, and a
//!   stored number that is not an `i64` is [`StoreError::Corrupt`](tollgate_store::StoreError)
//!   naming the attribute.
//! * Every conditional write asks for `ReturnValuesOnConditionCheckFailure = ALL_OLD`, so
//!   `ConditionFailed { old }` and `CancelReason::ConditionFailed { old }` carry the item as
//!   it was (`None` when absent).
//! * SDK failures map onto [`StoreError`](tollgate_store::StoreError) by two questions: is
//!   it an outage or a misconfiguration (a missing table, denied access, no credentials are
//!   `Validation`, naming the table, and never fail open), and could the request have been
//!   applied? (see [`error`]).
//! * Every request has a deadline (default 1 s, [`DynamoDbStoreBuilder::deadline`]), the
//!   SDK's own operation and attempt timeouts with retries fitted inside (see [`settings`]).
//! * [`create_table`] creates the table, its four indexes and TTL, for `tollgate table create`;
//!   [`check_table`] verifies an existing one, for a server's start.
//!
//! # Non-idempotent writes and retries
//!
//! `UpdateItem … ADD` is atomic but not idempotent, and the SDK's default ("standard") retry
//! mode resends a request whose response was lost or timed out. A debit whose first attempt
//! was applied would then be charged twice, and a refund paid twice. So:
//!
//! * **Single-item writes (`put`, `update`, `delete`) are sent once.** They go as signed
//!   HTTP requests of this crate (`wire`: one attempt within the write deadline), or, when
//!   the AWS configuration brings its own HTTP client, through an SDK client with
//!   `RetryConfig::disabled()`. A timeout, a connection dropped after sending, a 5xx or an
//!   unreadable response is reported as `StoreError::Ambiguous`: the limiter must decide
//!   (for example by re-reading with `consistent = true`) instead of blindly resending.
//!   A connection refused before anything was sent is `Unavailable`.
//! * **Errors that prove nothing was applied** (`Throttled`, `TransactionConflict`; DynamoDB
//!   reports them before applying anything) are returned at once, not retried here:
//!   `StoreError::is_retryable` tells the caller it may resend, and the caller owns the
//!   back-off and its deadline (an acquire has a latency budget the store cannot see).
//! * **Transactions keep the SDK's standard retries.** `TransactWriteItems` is idempotent under
//!   a `ClientRequestToken` for 10 minutes: the caller's token is passed through, and without
//!   one the SDK generates a token once per call, before its retry loop, so every retry of
//!   that call carries the same token. A resend after a lost response returns success
//!   without applying twice. (A resend while the first is still running gets
//!   `TransactionInProgressException`, reported as `Ambiguous`.)
//! * **Reads** (`get`, `batch_get`, `query`) keep the standard retries (3 attempts within the
//!   deadline); a read that still fails is `Unavailable`, never `Ambiguous`. `batch_get` also
//!   resends `UnprocessedKeys` with a short exponential back-off (8 attempts, and never past
//!   the deadline), then reports `Throttled`.
//!
//! # Semantics worth knowing
//!
//! * `GSI3` and `GSI4` project only keys (spec §2): a query on them returns `PK`, `SK` and
//!   the index keys, not whole items.
//! * DynamoDB allows one `+`/`-` per `SET` value; nested arithmetic is a `Validation` error.
//! * A transactional update needs at least one action (DynamoDB requires an update
//!   expression); an empty one is a `Validation` error.
//! * DynamoDB takes `ClientRequestToken`s of at most 36 characters: a longer caller token is
//!   replaced by a stable 32-hex-digit digest ([`request_token`]).
//! * `batch_get` accepts any number of keys (sent in chunks of 100) and returns results in
//!   request order; a key given twice is a `Validation` error, as in DynamoDB.
//! * An update made only of `REMOVE` actions never creates an absent item: it is sent with
//!   `attribute_exists(PK)` added, and a failure on an absent item whose own condition holds
//!   there is reported as success with nothing returned (the service behaves so; DynamoDB
//!   Local would create the bare key item). Inside a transaction no such rewrite is possible.
//! * Eventually consistent reads are whatever DynamoDB returns; index queries are never
//!   strongly consistent (DynamoDB does not offer it).

pub mod codec;
pub mod error;
mod feed;
mod json;
pub mod render;
mod scan;
pub mod settings;
mod shape;
mod sigv4;
mod store;
mod table;
mod wire;

pub use error::{DynamoDbError, CREDENTIALS_HINT};
pub use settings::DEFAULT_DEADLINE;
pub use store::{
    request_token, DynamoDbStore, DynamoDbStoreBuilder, BATCH_GET_CHUNK, MAX_TOKEN_LEN,
};
pub use table::{
    check_table, create_table, delete_table, wait_active, TableCheck, ACTIVE_TIMEOUT, INDEXES,
    TTL_ATTRIBUTE,
};

/// Re-exported so callers can build timeouts without depending on the SDK directly.
pub use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
/// Re-exported for callers of [`create_table`].
pub use aws_sdk_dynamodb::Client;

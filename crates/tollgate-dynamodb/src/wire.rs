//! The single-item writes of the hot path (`UpdateItem`, `PutItem`, `DeleteItem`) sent as
//! signed HTTP requests of DynamoDB's JSON protocol, without the SDK's generic orchestrator.
//!
//! Profiled per acquire, the SDK's orchestrator (config layers, interceptors, the
//! user-agent string, endpoint resolution, identity resolution, signing-key derivation,
//! response classification) and its `AttributeValue` maps cost more than the request itself
//! needs. This module keeps the SDK's own parts where they are the work: the HTTP connector
//! of `aws-smithy-http-client` (hyper, rustls, connection pool, connect timeout) built as
//! the SDK builds its default one, `aws-sigv4`'s key derivation and signature (the key kept
//! for the day, [`crate::sigv4`]), the configuration's credentials provider (its answer
//! cached until shortly before it expires), and the SDK's endpoint resolver (asked once, at
//! build). What it drops is the per-call machinery around them. Bodies and returned images
//! are DynamoDB's JSON, written and read by [`crate::json`].
//!
//! Semantics are the write client's (see [`crate::settings`]): one attempt, the attempt and
//! operation timeouts of [`Role::Write`](crate::settings) as one bound on the whole call,
//! and failures classified as [`crate::error`] classifies the SDK's:
//!
//! | failure | error |
//! |---|---|
//! | credentials missing or misconfigured | `Validation` |
//! | credentials provider failed, or the bound passed while it ran | `Unavailable` (nothing sent) |
//! | connection refused or not made in time (connector says so) | `Unavailable` (nothing sent) |
//! | the bound passed after sending, I/O after connecting, unreadable response | `Ambiguous` |
//! | a service error | by its code and status, as the SDK path maps it |
//!
//! The store uses this path when the AWS configuration has no HTTP client of its own (a
//! custom client can only be driven by the SDK) and no account-ID endpoint is required;
//! otherwise every call goes through the SDK.

use std::future::Future;
use std::time::{Duration, SystemTime};

use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;
use aws_sdk_dynamodb::config::endpoint::{DefaultResolver, Params, ResolveEndpoint};
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_smithy_http_client::proxy::ProxyConfig;
use aws_smithy_http_client::tls;
use aws_smithy_http_client::Connector;
use aws_smithy_runtime_api::client::behavior_version::BehaviorVersion;
use aws_smithy_runtime_api::client::http::{HttpConnector, HttpConnectorSettings};
use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::byte_stream::ByteStream;
use aws_types::endpoint_config::AccountIdEndpointMode;
use aws_types::SdkConfig;
use tollgate_core::value::Item;
use tollgate_store::StoreError;

use crate::error::{chain, credentials_error, failed_before_sending, from_code, Effect};
use crate::json::{header_code, ErrorBody, Output};
use crate::sigv4::Signer;

/// DynamoDB's JSON protocol version, in `Content-Type`.
const CONTENT_TYPE: &str = "application/x-amz-json-1.0";
/// The signing name of DynamoDB.
const SERVICE: &str = "dynamodb";
/// Sent as `User-Agent`.
const USER_AGENT: &str = concat!("tollgate-dynamodb/", env!("CARGO_PKG_VERSION"));
/// Credentials expiring within this are refreshed before use (the SDK's lazy cache's
/// default buffer).
const REFRESH_BUFFER: Duration = Duration::from_secs(10);

/// A DynamoDB operation this module sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// `UpdateItem`.
    Update,
    /// `PutItem`.
    Put,
    /// `DeleteItem`.
    Delete,
}

impl Op {
    /// The `X-Amz-Target` header.
    fn target(self) -> &'static str {
        match self {
            Op::Update => "DynamoDB_20120810.UpdateItem",
            Op::Put => "DynamoDB_20120810.PutItem",
            Op::Delete => "DynamoDB_20120810.DeleteItem",
        }
    }
}

/// What a call returned: the image DynamoDB sent back (`None` when it sent none or `{}`).
pub(crate) type Returned = Option<Item>;

/// The credentials of the configuration, cached until they are about to expire.
#[derive(Debug)]
struct CachedCredentials {
    provider: Option<SharedCredentialsProvider>,
    /// The identity in use and when it expires.
    current: std::sync::RwLock<Option<Credentials>>,
    /// Held while the provider is asked, so that one task refreshes and the others wait.
    refreshing: tokio::sync::Mutex<()>,
}

/// Why a call could not get credentials.
enum NoIdentity {
    /// The provider reported this.
    Failed(aws_credential_types::provider::error::CredentialsError),
    /// No provider is configured.
    NoProvider,
}

impl CachedCredentials {
    fn fresh(&self) -> Option<Credentials> {
        let now = SystemTime::now();
        let g = self.current.read().unwrap_or_else(|e| e.into_inner());
        match &*g {
            Some(c) if c.expiry().is_none_or(|e| e > now + REFRESH_BUFFER) => Some(c.clone()),
            _ => None,
        }
    }

    async fn get(&self) -> Result<Credentials, NoIdentity> {
        if let Some(id) = self.fresh() {
            return Ok(id);
        }
        let provider = self.provider.as_ref().ok_or(NoIdentity::NoProvider)?;
        let _g = self.refreshing.lock().await;
        if let Some(id) = self.fresh() {
            return Ok(id);
        }
        let creds = provider
            .provide_credentials()
            .await
            .map_err(NoIdentity::Failed)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(creds.clone());
        Ok(creds)
    }
}

/// The signed-HTTP client of the single-item writes (see the module docs).
#[derive(Debug)]
pub(crate) struct Wire {
    connector: Connector,
    /// The endpoint, path `/` (text: what the connector's request keeps beside the parsed
    /// URI).
    uri: String,
    /// The `Host` header: the endpoint's authority without a default port.
    host: String,
    signer: Signer,
    credentials: CachedCredentials,
    /// The bound on a whole call: the least of the attempt and operation timeouts.
    bound: Option<Duration>,
    /// The orders returned images listed their names in ([`crate::scan::Listings`]).
    listings: crate::scan::Listings,
}

impl Wire {
    /// The client for `sdk`'s region, endpoint and credentials with the write timeouts `t`,
    /// or `None` (with the reason) when this configuration must go through the SDK.
    pub(crate) fn new(sdk: &SdkConfig, t: &TimeoutConfig) -> Result<Wire, String> {
        if sdk.http_client().is_some() {
            return Err("the AWS configuration brings its own HTTP client".into());
        }
        if matches!(
            sdk.account_id_endpoint_mode(),
            Some(AccountIdEndpointMode::Required)
        ) {
            return Err("account-ID endpoints are required".into());
        }
        let region = sdk
            .region()
            .ok_or_else(|| "no region".to_string())?
            .to_string();
        let params = Params::builder()
            .region(region.clone())
            .use_fips(sdk.use_fips().unwrap_or(false))
            .use_dual_stack(sdk.use_dual_stack().unwrap_or(false))
            .set_endpoint(sdk.endpoint_url().map(str::to_string))
            .account_id_endpoint_mode("disabled")
            .build()
            .map_err(|e| e.to_string())?;
        // The default resolver answers at once (its future is ready when made).
        let resolver = DefaultResolver::new();
        let mut fut = std::pin::pin!(resolver.resolve_endpoint(&params));
        let endpoint = match fut
            .as_mut()
            .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
        {
            std::task::Poll::Ready(r) => r.map_err(|e| chain(e.as_ref()))?,
            std::task::Poll::Pending => return Err("endpoint resolution did not complete".into()),
        };
        if endpoint.headers().next().is_some() {
            return Err("the endpoint needs headers of its own".into());
        }
        let mut uri: http::Uri = endpoint.url().parse().map_err(|e| format!("{e}"))?;
        if uri.path() != "/" || uri.query().is_some() {
            let mut parts = uri.into_parts();
            let auth = parts.authority.clone();
            parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
            uri = http::Uri::from_parts(parts).map_err(|e| format!("{e}"))?;
            debug_assert_eq!(uri.authority(), auth.as_ref());
        }
        let authority = uri.authority().ok_or("the endpoint has no host")?;
        let default_port = match uri.scheme_str() {
            Some("https") => 443,
            _ => 80,
        };
        let host = match authority.port_u16() {
            Some(p) if p != default_port => authority.as_str().to_string(),
            _ => authority.host().to_string(),
        };
        let mut settings = HttpConnectorSettings::builder();
        settings
            .set_connect_timeout(t.connect_timeout())
            .set_read_timeout(t.read_timeout());
        let settings = settings.build();
        // As the SDK builds its default HTTPS client: rustls on aws-lc, the configuration's
        // sleep (for the connect timeout), and proxies from the environment (`HTTPS_PROXY`,
        // `NO_PROXY` …) from behavior version 2025-08-07 on.
        let mut builder = Connector::builder().tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::AwsLc,
        ));
        builder.set_connector_settings(Some(settings));
        builder.set_sleep_impl(sdk.sleep_impl());
        #[allow(deprecated)]
        let proxies_from_env = sdk
            .behavior_version()
            .is_none_or(|v| v.is_at_least(BehaviorVersion::v2025_08_07()));
        builder.set_proxy_config(Some(if proxies_from_env {
            ProxyConfig::from_env()
        } else {
            ProxyConfig::disabled()
        }));
        let connector = builder.build();
        let bound = match (t.operation_attempt_timeout(), t.operation_timeout()) {
            (Some(a), Some(o)) => Some(a.min(o)),
            (a, o) => a.or(o),
        };
        // The `Host` header's value must be one (checked here once; each request then
        // copies the checked text).
        http::HeaderValue::from_str(&host).map_err(|e| e.to_string())?;
        Ok(Wire {
            connector,
            uri: uri.to_string(),
            host,
            signer: Signer::new(region, SERVICE),
            credentials: CachedCredentials {
                provider: sdk.credentials_provider(),
                current: Default::default(),
                refreshing: Default::default(),
            },
            bound,
            listings: Default::default(),
        })
    }

    /// Send `body` as operation `op` on `table`, once, within the bound. `Ok(image)` on
    /// success; a failed condition is `ConditionFailed` with the old item; every other
    /// failure as the module docs say.
    pub(crate) async fn send(
        &self,
        op: Op,
        body: Vec<u8>,
        table: &str,
    ) -> Result<Returned, StoreError> {
        // Whether the request left: a bound passed before that is "not sent".
        let sent = std::sync::atomic::AtomicBool::new(false);
        let call = self.call(op, body, table, &sent);
        let res = match self.bound {
            Some(b) => match tokio::time::timeout(b, call).await {
                Ok(r) => r,
                Err(_) => {
                    let ms = b.as_millis();
                    return Err(if sent.load(std::sync::atomic::Ordering::Relaxed) {
                        StoreError::Ambiguous(format!(
                            "table {table}: deadline passed: no answer in {ms} ms"
                        ))
                    } else {
                        StoreError::Unavailable(format!(
                            "table {table}: not sent: AWS credentials not loaded in {ms} ms"
                        ))
                    });
                }
            },
            None => call.await,
        };
        res
    }

    async fn call(
        &self,
        op: Op,
        body: Vec<u8>,
        table: &str,
        sent: &std::sync::atomic::AtomicBool,
    ) -> Result<Returned, StoreError> {
        let creds = match self.credentials.get().await {
            Ok(id) => id,
            Err(NoIdentity::Failed(e)) => return Err(credentials_error(&e, &chain(&e), table)),
            Err(NoIdentity::NoProvider) => {
                let e = aws_credential_types::provider::error::CredentialsError::not_loaded(
                    "no credentials provider is configured",
                );
                return Err(credentials_error(&e, &chain(&e), table));
            }
        };
        let request = self.signed(op, body, &creds).map_err(|m| {
            StoreError::Validation(format!("table {table}: request not built: {m}"))
        })?;
        sent.store(true, std::sync::atomic::Ordering::Relaxed);
        let response = match self.connector.call(request).await {
            Ok(r) => r,
            Err(e) => {
                let msg = chain(&e);
                return Err(if e.is_user() || failed_before_sending(&e) {
                    StoreError::Unavailable(format!("table {table}: not sent: {msg}"))
                } else {
                    StoreError::Ambiguous(format!("table {table}: dispatch failed: {msg}"))
                });
            }
        };
        let status = response.status().as_u16();
        let header_code = response
            .headers()
            .get("x-amzn-errortype")
            .map(|h| header_code(h).to_string());
        let bytes = ByteStream::new(response.into_body())
            .collect()
            .await
            .map_err(|e| {
                StoreError::Ambiguous(format!("table {table}: unreadable response: {}", chain(&e)))
            })?
            .into_bytes();
        // The body checked as UTF-8 once, then read as text: `serde_json` reading bytes
        // checks every string it meets again (~90 strings an image, ~70 instructions each).
        // Text that is not UTF-8 is no JSON, as reading it as bytes would have said.
        let text = std::str::from_utf8(&bytes);
        if (200..300).contains(&status) {
            let text = text.map_err(|e| {
                StoreError::Ambiguous(format!(
                    "table {table}: unreadable response (HTTP {status}): not UTF-8: {e}"
                ))
            })?;
            // A hot-path image is scanned (`scan.rs`); any other body is read by serde.
            if let Some(image) = crate::scan::image(text, &self.listings) {
                return Ok(image);
            }
            let out: Output<'_> = serde_json::from_str(text).map_err(|e| {
                StoreError::Ambiguous(format!(
                    "table {table}: unreadable response (HTTP {status}): {e}"
                ))
            })?;
            return match out.image {
                Some(i) if !i.is_empty() => i.into_item().map(Some),
                _ => Ok(None),
            };
        }
        let parsed: Option<ErrorBody<'_>> = text.ok().and_then(|t| serde_json::from_str(t).ok());
        let code = header_code
            .as_deref()
            .filter(|c| !c.is_empty())
            .or_else(|| parsed.as_ref().and_then(ErrorBody::code))
            .unwrap_or("Unknown")
            .to_string();
        if code == "ConditionalCheckFailedException" {
            let old = match parsed.and_then(|p| p.item) {
                Some(i) if !i.is_empty() => Some(Box::new(i.into_item()?)),
                _ => None,
            };
            return Err(StoreError::ConditionFailed { old });
        }
        let msg = parsed.as_ref().map_or("", ErrorBody::message);
        Err(from_code(&code, msg, Some(status), Effect::Write, table))
    }

    /// The request of `op` with `body`, signed with `creds` now, built as the connector takes
    /// it (an `http::Request` would be converted: its headers copied into a new map and its
    /// URI formatted again, on every call).
    fn signed(&self, op: Op, body: Vec<u8>, creds: &Credentials) -> Result<HttpRequest, String> {
        use http::header::{self, HeaderName};
        let target = op.target();
        let sig = self.signer.sign(
            creds,
            SystemTime::now(),
            CONTENT_TYPE,
            &self.host,
            target,
            &body,
        );
        let content_length = itoa::Buffer::new().format(body.len()).to_owned();
        let mut req = HttpRequest::new(SdkBody::from(body));
        req.set_method("POST").map_err(|e| e.to_string())?;
        req.set_uri(self.uri.clone()).map_err(|e| e.to_string())?;
        let h = req.headers_mut();
        // Constant values are taken as they are; every other value is checked (a value
        // from the configuration or the credentials that is no header value is an error).
        h.insert(header::CONTENT_TYPE, CONTENT_TYPE);
        h.insert(HeaderName::from_static("x-amz-target"), target);
        h.insert(header::USER_AGENT, USER_AGENT);
        let mut checked = |name: HeaderName, value: String| {
            h.try_insert(name, value)
                .map(drop)
                .map_err(|e| e.to_string())
        };
        checked(header::HOST, self.host.clone())?;
        checked(HeaderName::from_static("x-amz-date"), sig.amz_date)?;
        checked(header::AUTHORIZATION, sig.authorization)?;
        checked(header::CONTENT_LENGTH, content_length)?;
        if let Some(t) = creds.session_token() {
            checked(
                HeaderName::from_static("x-amz-security-token"),
                t.to_owned(),
            )?;
        }
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_credential_types::provider::SharedCredentialsProvider;
    use aws_types::region::Region;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tollgate_core::value::Value;

    /// A server on loopback that answers one request with `status`, `headers` and `body`,
    /// then closes the connection.
    async fn answer_once(status: &str, headers: &str, body: &[u8]) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        let mut response = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/x-amz-json-1.0\r\n{headers}\
             content-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        response.extend_from_slice(body);
        tokio::spawn(async move {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            // The request: its head, then as many body bytes as it says.
            let mut got = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                let Ok(n) = s.read(&mut chunk).await else {
                    return;
                };
                if n == 0 {
                    return;
                }
                got.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&got);
                if let Some(end) = text.find("\r\n\r\n") {
                    let len = text[..end]
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if got.len() >= end + 4 + len {
                        break;
                    }
                }
            }
            let _ = s.write_all(&response).await;
            let _ = s.shutdown().await;
        });
        format!("http://{addr}")
    }

    fn wire(endpoint: &str) -> Wire {
        let sdk = SdkConfig::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::from_static("us-east-1"))
            .endpoint_url(endpoint)
            .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
                "test", "test", None, None, "test",
            )))
            .build();
        let t = TimeoutConfig::builder()
            .operation_timeout(Duration::from_secs(5))
            .build();
        Wire::new(&sdk, &t).expect("a wire client")
    }

    async fn send(status: &str, headers: &str, body: &[u8]) -> Result<Returned, StoreError> {
        let endpoint = answer_once(status, headers, body).await;
        wire(&endpoint).send(Op::Update, b"{}".to_vec(), "t").await
    }

    /// A returned image is read as text once checked as UTF-8: its strings (escaped or
    /// not, ASCII or not) come out as DynamoDB sent them.
    #[tokio::test]
    async fn a_returned_image_is_read_from_the_checked_text() {
        let body = r#"{"Attributes":{"n":{"N":"7"},"s":{"S":"é \"q\""},"a":{"S":"plain"}}}"#;
        let item = send("200 OK", "", body.as_bytes())
            .await
            .expect("a success")
            .expect("an image");
        assert_eq!(item.get("n"), Some(&Value::N(7)));
        assert_eq!(item.get("s"), Some(&Value::S("é \"q\"".into())));
        assert_eq!(item.get("a"), Some(&Value::S("plain".into())));
        assert_eq!(item.len(), 3);
    }

    /// A success whose body is not UTF-8 is unreadable: the write may have been applied,
    /// so the outcome is unknown.
    #[tokio::test]
    async fn a_success_that_is_not_utf8_is_ambiguous() {
        let body = b"{\"Attributes\":{\"s\":{\"S\":\"\xff\"}}}";
        match send("200 OK", "", body).await {
            Err(StoreError::Ambiguous(m)) => assert!(m.contains("not UTF-8"), "{m}"),
            other => panic!("expected Ambiguous, got {other:?}"),
        }
    }

    /// A failed condition returns its old item; an error body that is not UTF-8 still
    /// gives its code from the header.
    #[tokio::test]
    async fn errors_keep_their_code_and_old_item() {
        let body = br#"{"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException","message":"no","Item":{"n":{"N":"3"}}}"#;
        match send("400 Bad Request", "", body).await {
            Err(StoreError::ConditionFailed { old: Some(old) }) => {
                assert_eq!(old.get("n"), Some(&Value::N(3)));
            }
            other => panic!("expected ConditionFailed, got {other:?}"),
        }
        let headers = "x-amzn-errortype: ConditionalCheckFailedException:http://internal\r\n";
        match send("400 Bad Request", headers, b"\xff\xfe").await {
            Err(StoreError::ConditionFailed { old: None }) => {}
            other => panic!("expected ConditionFailed without an item, got {other:?}"),
        }
    }
}

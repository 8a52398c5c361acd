//! The SDK settings of the hot path: one deadline per request turned into the SDK's own
//! timeouts and retries, stalled-stream protection, and the credential and region chains.
//!
//! | | reads and transactions | single-item writes |
//! |---|---|---|
//! | operation timeout (all attempts and back-offs) | deadline | deadline |
//! | attempt timeout | deadline / 2 | deadline |
//! | connect timeout | deadline / 2 | deadline / 2 |
//! | attempts | 3 (standard retries) | 1 (an `ADD` must not be resent) |
//! | back-off | at most 50 ms at first, doubling, jittered, at most deadline / 4 | — |
//!
//! So a hung DynamoDB answers every call within the deadline: a read retries once or twice
//! and then reports `Unavailable`, a write reports `Ambiguous` (it may have been applied),
//! and a connection that cannot be opened in half the deadline is `Unavailable` for both
//! (nothing was sent). Explicit [`TimeoutConfig`] values given to the builder win over the
//! derived ones.
//!
//! Stalled-stream protection is off: it watches body throughput with a grace period of
//! seconds, so with a deadline of about a second it could never fire first, and it wraps
//! every request and response body (a measurable share of the client's CPU per call).

use std::net::IpAddr;
use std::time::Duration;

use aws_config::environment::{
    EnvironmentVariableCredentialsProvider, EnvironmentVariableRegionProvider,
};
use aws_config::meta::credentials::CredentialsProviderChain;
use aws_config::meta::region::RegionProviderChain;
use aws_config::profile::{ProfileFileCredentialsProvider, ProfileFileRegionProvider};
use aws_config::SdkConfig;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::ProvideCredentials;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::config::{Region, StalledStreamProtectionConfig};

use crate::error::{chain, DynamoDbError};

/// The default deadline of one store request: suits an acquire path.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(1);
/// Attempts of a read or a transaction within its deadline.
pub const READ_ATTEMPTS: u32 = 3;
/// How long building a store waits for the credentials provider to answer.
pub const CREDENTIALS_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// Which client a configuration is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Reads and transactions: retried within the deadline.
    Read,
    /// Single-item writes: one attempt.
    Write,
}

/// The timeouts of one client: `overrides` (set fields) win over the ones derived from
/// `deadline`.
pub(crate) fn timeouts(
    deadline: Duration,
    role: Role,
    overrides: Option<&TimeoutConfig>,
) -> TimeoutConfig {
    let attempt = match role {
        Role::Read => deadline / 2,
        Role::Write => deadline,
    };
    let derived = TimeoutConfig::builder()
        .connect_timeout(deadline / 2)
        .operation_attempt_timeout(attempt)
        .operation_timeout(deadline)
        .build();
    let mut t = overrides
        .cloned()
        .unwrap_or_else(|| TimeoutConfig::builder().build());
    t.take_defaults_from(&derived);
    debug_assert!(t.operation_timeout().is_some() || overrides.is_some());
    t
}

/// The retries of one client.
pub(crate) fn retries(deadline: Duration, role: Role) -> RetryConfig {
    match role {
        Role::Write => RetryConfig::disabled(),
        Role::Read => RetryConfig::standard()
            .with_max_attempts(READ_ATTEMPTS)
            .with_initial_backoff((deadline / 20).min(Duration::from_millis(50)))
            .with_max_backoff(deadline / 4),
    }
}

/// The DynamoDB client configuration of one role over a loaded AWS configuration.
pub(crate) fn client_config(
    sdk: &SdkConfig,
    deadline: Duration,
    role: Role,
    overrides: Option<&TimeoutConfig>,
) -> aws_sdk_dynamodb::Config {
    aws_sdk_dynamodb::config::Builder::from(sdk)
        .timeout_config(timeouts(deadline, role, overrides))
        .retry_config(retries(deadline, role))
        .stalled_stream_protection(StalledStreamProtectionConfig::disabled())
        .build()
}

/// Whether an endpoint URL points at this machine (an emulator such as DynamoDB Local).
pub fn is_loopback(endpoint: &str) -> bool {
    let Ok(uri) = endpoint.parse::<http::Uri>() else {
        return false;
    };
    let Some(host) = uri.host() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Credentials for an emulator on loopback: the environment, then the profile. No instance
/// metadata, container or web-identity lookups: an emulator never needs a role, and off
/// EC2 the metadata lookups cost seconds and log warnings before failing.
pub(crate) fn emulator_credentials() -> CredentialsProviderChain {
    CredentialsProviderChain::first_try(
        "Environment",
        EnvironmentVariableCredentialsProvider::new(),
    )
    .or_else("Profile", ProfileFileCredentialsProvider::builder().build())
}

/// The region for an emulator on loopback: the environment, the profile, else `us-east-1`
/// (emulators ignore it), without instance metadata lookups.
pub(crate) fn emulator_region() -> RegionProviderChain {
    RegionProviderChain::first_try(EnvironmentVariableRegionProvider::new())
        .or_else(ProfileFileRegionProvider::new())
        .or_else(Region::from_static("us-east-1"))
}

/// Ask the configured credentials provider once, so that missing credentials are a clear
/// error at start rather than a failure of the first request. Credentials that are absent or
/// misconfigured are [`DynamoDbError::NoCredentials`]; a provider that fails or does not
/// answer in time (STS or the metadata service down) is only logged: requests will report
/// it as unavailable and it may recover.
pub(crate) async fn check_credentials(sdk: &SdkConfig) -> Result<(), DynamoDbError> {
    let Some(provider) = sdk.credentials_provider() else {
        return Err(DynamoDbError::NoCredentials(
            "no credentials provider is configured".into(),
        ));
    };
    match tokio::time::timeout(CREDENTIALS_CHECK_TIMEOUT, provider.provide_credentials()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(
            e @ (CredentialsError::CredentialsNotLoaded(_)
            | CredentialsError::InvalidConfiguration(_)),
        )) => Err(DynamoDbError::NoCredentials(chain(&e))),
        Ok(Err(e)) => {
            tracing::warn!(error = %chain(&e), "AWS credentials provider failed; requests will report the store unavailable until it recovers");
            Ok(())
        }
        Err(_) => {
            tracing::warn!(
                secs = CREDENTIALS_CHECK_TIMEOUT.as_secs(),
                "AWS credentials provider did not answer in time; requests will report the store unavailable until it does"
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_timeouts_leave_room_for_a_retry() {
        let d = Duration::from_millis(800);
        let t = timeouts(d, Role::Read, None);
        assert_eq!(t.operation_timeout(), Some(d));
        assert_eq!(
            t.operation_attempt_timeout(),
            Some(Duration::from_millis(400))
        );
        assert_eq!(t.connect_timeout(), Some(Duration::from_millis(400)));
        let w = timeouts(d, Role::Write, None);
        assert_eq!(w.operation_attempt_timeout(), Some(d));
        assert_eq!(w.operation_timeout(), Some(d));
    }

    #[test]
    fn explicit_timeouts_win() {
        let o = TimeoutConfig::builder()
            .operation_attempt_timeout(Duration::from_millis(100))
            .build();
        let t = timeouts(Duration::from_secs(1), Role::Write, Some(&o));
        assert_eq!(
            t.operation_attempt_timeout(),
            Some(Duration::from_millis(100))
        );
        assert_eq!(t.operation_timeout(), Some(Duration::from_secs(1)));
    }

    #[test]
    fn retries_fit_the_deadline() {
        let d = Duration::from_secs(1);
        let r = retries(d, Role::Read);
        assert_eq!(r.max_attempts(), READ_ATTEMPTS);
        assert_eq!(r.initial_backoff(), Duration::from_millis(50));
        assert_eq!(r.max_backoff(), Duration::from_millis(250));
        // Two back-offs at most, each capped: well inside the deadline.
        assert!(r.max_backoff() * (READ_ATTEMPTS - 1) < d);
        assert_eq!(retries(d, Role::Write).max_attempts(), 1);
        let short = retries(Duration::from_millis(200), Role::Read);
        assert_eq!(short.initial_backoff(), Duration::from_millis(10));
    }

    #[test]
    fn loopback_endpoints() {
        for e in [
            "http://127.0.0.1:8000",
            "http://localhost:8000",
            "http://LOCALHOST",
            "http://[::1]:8000/",
            "https://127.0.0.2",
        ] {
            assert!(is_loopback(e), "{e}");
        }
        for e in [
            "https://dynamodb.us-east-1.amazonaws.com",
            "https://vpce-1a2b.dynamodb.us-east-1.vpce.amazonaws.com",
            "http://10.0.0.1:8000",
            "not a url",
            "",
        ] {
            assert!(!is_loopback(e), "{e}");
        }
    }
}

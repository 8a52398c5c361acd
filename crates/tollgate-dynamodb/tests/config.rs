//! Building a store: missing credentials and a missing region are clear errors at build
//! time, and, when they slip through (a store made from a caller's `SdkConfig`), every call
//! says so instead of reporting an outage. Needs no server: these fail before anything is
//! sent (the endpoint is a closed port, which would make an outage look different).

use std::time::Duration;

use aws_config::{BehaviorVersion, SdkConfig};
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::future::ProvideCredentials as ProvideFuture;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sdk_dynamodb::config::Region;
use tollgate_core::expr::{ReturnValues, Update};
use tollgate_core::value::Key;
use tollgate_dynamodb::{DynamoDbError, DynamoDbStore, DEFAULT_DEADLINE};
use tollgate_store::{Store, StoreError, UpdateRequest};

/// Port 9 (discard) is closed on a test machine.
const CLOSED: &str = "http://127.0.0.1:9";

/// A credentials provider that never finds any.
#[derive(Debug)]
struct NoCredentials;

impl ProvideCredentials for NoCredentials {
    fn provide_credentials<'a>(&'a self) -> ProvideFuture<'a>
    where
        Self: 'a,
    {
        ProvideFuture::ready(Err(CredentialsError::not_loaded(
            "no providers in chain provided credentials",
        )))
    }
}

fn sdk_without_credentials(region: Option<&'static str>) -> SdkConfig {
    let mut b = SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(CLOSED)
        .credentials_provider(SharedCredentialsProvider::new(NoCredentials));
    if let Some(r) = region {
        b = b.region(Region::from_static(r));
    }
    b.build()
}

#[tokio::test]
async fn missing_credentials_fail_the_build_with_what_to_set() {
    let r = DynamoDbStore::builder("tollgate-nocreds")
        .sdk_config(sdk_without_credentials(Some("us-east-1")))
        .build()
        .await;
    match r {
        Err(e @ DynamoDbError::NoCredentials(_)) => {
            let m = e.to_string();
            assert!(m.starts_with("no AWS credentials found"), "{m}");
            assert!(
                m.contains("AWS_ACCESS_KEY_ID") && m.contains("AWS_PROFILE"),
                "{m}"
            );
            assert!(!e.is_unavailable());
        }
        other => panic!("expected NoCredentials, got {other:?}"),
    }
}

#[tokio::test]
async fn missing_credentials_at_call_time_are_validation_not_an_outage() {
    let table = "tollgate-nocreds";
    let s = DynamoDbStore::from_sdk_config(&sdk_without_credentials(Some("us-east-1")), table)
        .expect("builds without checking");
    assert_eq!(s.deadline(), DEFAULT_DEADLINE);
    let read = s.get(&Key::new("p", "s"), true).await;
    let write = s
        .update(UpdateRequest {
            key: Key::new("p", "s"),
            update: Update::new().add("n", 1),
            condition: None,
            returns: ReturnValues::None,
        })
        .await;
    for r in [read.map(|_| ()), write.map(|_| ())] {
        match r {
            Err(StoreError::Validation(m)) => {
                assert!(m.contains("no AWS credentials found"), "{m}");
                assert!(m.contains(table), "{m}");
            }
            other => panic!("expected Validation, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_missing_region_is_a_build_error() {
    // No region and no endpoint override: nothing to talk to.
    let sdk = SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .credentials_provider(SharedCredentialsProvider::new(
            aws_sdk_dynamodb::config::Credentials::new("test", "test", None, None, "test"),
        ))
        .build();
    match DynamoDbStore::builder("tollgate-noregion")
        .sdk_config(sdk)
        .build()
        .await
    {
        Err(DynamoDbError::Config(m)) => assert!(m.contains("AWS_REGION"), "{m}"),
        other => panic!("expected Config, got {other:?}"),
    }
}

#[tokio::test]
async fn bad_table_names_and_deadlines_are_refused() {
    let creds = || {
        DynamoDbStore::builder("x")
            .endpoint(CLOSED)
            .static_credentials("test", "test")
    };
    assert!(matches!(
        creds().build().await,
        Err(DynamoDbError::Config(_))
    ));
    assert!(matches!(
        DynamoDbStore::builder("tollgate-ok")
            .endpoint(CLOSED)
            .static_credentials("test", "test")
            .deadline(Duration::ZERO)
            .build()
            .await,
        Err(DynamoDbError::Config(_))
    ));
    let s = DynamoDbStore::builder("tollgate-ok")
        .endpoint(CLOSED)
        .static_credentials("test", "test")
        .deadline(Duration::from_millis(250))
        .build()
        .await
        .expect("builds");
    assert_eq!(s.deadline(), Duration::from_millis(250));
    // A closed port, by contrast, is an outage.
    let r = s.get(&Key::new("p", "s"), true).await;
    assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
}

#[test]
fn the_builder_never_prints_the_secret() {
    let b = DynamoDbStore::builder("tollgate-x").static_credentials("AKIDEXAMPLE", "s3cr3t-value");
    let d = format!("{b:?}");
    assert!(d.contains("AKIDEXAMPLE"), "{d}");
    assert!(!d.contains("s3cr3t-value"), "{d}");
}

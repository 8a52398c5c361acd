//! DynamoDB-specific behaviour on DynamoDB Local: rendering with awkward names, return
//! values, cancellation reasons, idempotent transactions, batch reads, pagination, indexes,
//! corrupt items, error mapping and concurrent conditional writes.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, ProjectionType,
    ScalarAttributeType,
};
use tollgate_core::expr::{CmpOp, Condition, Operand, ReturnValues, SetValue, Update};
use tollgate_core::value::{Item, Key, Value};
use tollgate_dynamodb::{DynamoDbError, DynamoDbStore};
use tollgate_store::{
    CancelReason, DeleteRequest, PutRequest, Query, Store, StoreError, TransactOp, UpdateRequest,
};

macro_rules! endpoint_or_skip {
    ($name:expr) => {
        match common::endpoint($name) {
            Some(e) => e,
            None => return,
        }
    };
}

fn item(pairs: &[(&str, Value)]) -> Item {
    pairs
        .iter()
        .map(|(k, v)| ((*k).into(), v.clone()))
        .collect()
}

async fn drop_table(s: &DynamoDbStore) {
    let _ = tollgate_dynamodb::delete_table(s.client(), s.table()).await;
}

#[tokio::test]
async fn create_table_is_idempotent_and_has_the_layout() {
    let ep = endpoint_or_skip!("create_table_is_idempotent_and_has_the_layout");
    let s = common::fresh_store(&ep, "layout").await;
    s.create_table().await.expect("second create is a no-op");
    let d = s
        .client()
        .describe_table()
        .table_name(s.table())
        .send()
        .await
        .expect("describe");
    let t = d.table().expect("table");
    let mut got: Vec<(String, ProjectionType)> = t
        .global_secondary_indexes()
        .iter()
        .map(|g| {
            (
                g.index_name().unwrap_or_default().to_string(),
                g.projection()
                    .and_then(|p| p.projection_type())
                    .cloned()
                    .expect("projection"),
            )
        })
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        got,
        vec![
            ("GSI1".to_string(), ProjectionType::All),
            ("GSI2".to_string(), ProjectionType::All),
            ("GSI3".to_string(), ProjectionType::KeysOnly),
            ("GSI4".to_string(), ProjectionType::KeysOnly),
        ]
    );
    drop_table(&s).await;
}

#[tokio::test]
async fn names_with_dashes_and_dots_round_trip() {
    let ep = endpoint_or_skip!("names_with_dashes_and_dots_round_trip");
    let s = common::fresh_store(&ep, "names").await;
    let k = Key::new("ns/BUCKET#e#gpt-4.1#0", "#STATE");
    let tk = "b_gpt-4.1_tk";
    let out = s
        .update(UpdateRequest {
            key: k.clone(),
            update: Update::new()
                .add(tk, 5000)
                .set("b_gpt-4.1_cp", 9000)
                .set_expr(
                    "b_x.y_tc",
                    SetValue::Plus(
                        Box::new(SetValue::IfNotExists("b_x.y_tc".into(), Value::N(10))),
                        Box::new(SetValue::Value(Value::N(1))),
                    ),
                ),
            condition: Some(Condition::not_exists(tk).or(Condition::ge(tk, 0))),
            returns: ReturnValues::AllNew,
        })
        .await
        .expect("update")
        .expect("AllNew");
    assert_eq!(out.get(tk), Some(&Value::N(5000)));
    assert_eq!(out.get("b_x.y_tc"), Some(&Value::N(11)));
    // Attribute-to-attribute comparison through aliases.
    let cmp = Condition::Cmp("b_gpt-4.1_cp".into(), CmpOp::Gt, Operand::Attr(tk.into()));
    let out = s
        .update(UpdateRequest {
            key: k.clone(),
            update: Update::new().add(tk, -1000).remove("b_x.y_tc"),
            condition: Some(cmp),
            returns: ReturnValues::UpdatedNew,
        })
        .await
        .expect("update")
        .expect("UpdatedNew");
    assert_eq!(out, item(&[(tk, Value::N(4000))]));
    let got = s.get(&k, true).await.expect("get").expect("exists");
    assert!(!got.contains_key("b_x.y_tc"));
    drop_table(&s).await;
}

#[tokio::test]
async fn condition_failures_carry_the_old_item() {
    let ep = endpoint_or_skip!("condition_failures_carry_the_old_item");
    let s = common::fresh_store(&ep, "cond").await;
    let k = Key::new("p", "s");
    // Absent item: old is None.
    let r = s
        .update(UpdateRequest {
            key: k.clone(),
            update: Update::new().add("n", 1),
            condition: Some(Condition::exists("PK")),
            returns: ReturnValues::None,
        })
        .await;
    assert_eq!(r, Err(StoreError::ConditionFailed { old: None }));
    let r = s
        .delete(DeleteRequest {
            key: k.clone(),
            condition: Some(Condition::exists("PK")),
        })
        .await;
    assert_eq!(r, Err(StoreError::ConditionFailed { old: None }));
    // Present item: old is the whole item.
    s.put(PutRequest {
        key: k.clone(),
        item: item(&[
            ("n", Value::N(3)),
            (
                "tags",
                Value::Ss(Box::new(BTreeSet::from(["a".to_string()]))),
            ),
        ]),
        condition: None,
    })
    .await
    .expect("put");
    let r = s
        .update(UpdateRequest {
            key: k.clone(),
            update: Update::new().add("n", -5),
            condition: Some(Condition::ge("n", 5)),
            returns: ReturnValues::AllNew,
        })
        .await;
    let Err(StoreError::ConditionFailed { old: Some(old) }) = r else {
        panic!("expected ConditionFailed with old item, got {r:?}");
    };
    assert_eq!(old.get("n"), Some(&Value::N(3)));
    assert_eq!(old.get("PK"), Some(&Value::S("p".into())));
    // AllOld of an update and the old item of a delete.
    let prev = s
        .update(UpdateRequest {
            key: k.clone(),
            update: Update::new().set("n", 4),
            condition: None,
            returns: ReturnValues::AllOld,
        })
        .await
        .expect("update");
    assert_eq!(prev.and_then(|p| p.get("n").cloned()), Some(Value::N(3)));
    let gone = s
        .delete(DeleteRequest {
            key: k.clone(),
            condition: None,
        })
        .await
        .expect("delete");
    assert_eq!(gone.and_then(|p| p.get("n").cloned()), Some(Value::N(4)));
    let none = s
        .delete(DeleteRequest {
            key: k,
            condition: None,
        })
        .await
        .expect("delete absent");
    assert_eq!(none, None);
    drop_table(&s).await;
}

#[tokio::test]
async fn transaction_reasons_and_tokens() {
    let ep = endpoint_or_skip!("transaction_reasons_and_tokens");
    let s = common::fresh_store(&ep, "tx").await;
    let (a, b, c) = (Key::new("a", "s"), Key::new("b", "s"), Key::new("c", "s"));
    s.put(PutRequest {
        key: a.clone(),
        item: item(&[("n", Value::N(1))]),
        condition: None,
    })
    .await
    .expect("put");
    let r = s
        .transact_write(
            vec![
                TransactOp::Update(UpdateRequest {
                    key: a.clone(),
                    update: Update::new().add("n", 1),
                    condition: None,
                    returns: ReturnValues::None,
                }),
                TransactOp::Check {
                    key: a.clone().with_sk_suffix(),
                    condition: Condition::exists("PK"),
                },
                TransactOp::Update(UpdateRequest {
                    key: b.clone(),
                    update: Update::new().add("n", 1),
                    condition: Some(Condition::exists("PK")),
                    returns: ReturnValues::None,
                }),
            ],
            None,
        )
        .await;
    assert_eq!(
        r,
        Err(StoreError::TransactionCanceled {
            reasons: vec![
                CancelReason::None,
                CancelReason::ConditionFailed { old: None },
                CancelReason::ConditionFailed { old: None },
            ]
        })
    );
    // A failed condition on an existing item returns it.
    let r = s
        .transact_write(
            vec![
                TransactOp::Check {
                    key: a.clone(),
                    condition: Condition::ge("n", 10),
                },
                TransactOp::Put(PutRequest {
                    key: c.clone(),
                    item: Item::new(),
                    condition: None,
                }),
            ],
            None,
        )
        .await;
    let Err(StoreError::TransactionCanceled { reasons }) = r else {
        panic!("expected cancellation, got {r:?}");
    };
    match &reasons[0] {
        CancelReason::ConditionFailed { old: Some(old) } => {
            assert_eq!(old.get("n"), Some(&Value::N(1)))
        }
        other => panic!("expected ConditionFailed with old, got {other:?}"),
    }
    assert_eq!(reasons[1], CancelReason::None);
    // The same token twice applies once.
    let ops = || {
        vec![
            TransactOp::Update(UpdateRequest {
                key: a.clone(),
                update: Update::new().add("n", 5),
                condition: None,
                returns: ReturnValues::None,
            }),
            TransactOp::Update(UpdateRequest {
                key: b.clone(),
                update: Update::new().add("n", 5),
                condition: None,
                returns: ReturnValues::None,
            }),
        ]
    };
    // Tokens live server-wide for 10 minutes: a fixed token reused against another table
    // would be an IdempotentParameterMismatch, so make it unique per run.
    let token = Some(common::table_name("token"));
    s.transact_write(ops(), token.clone()).await.expect("first");
    s.transact_write(ops(), token).await.expect("replay");
    let got = s.get(&a, true).await.expect("get").expect("a");
    assert_eq!(got.get("n"), Some(&Value::N(6)));
    // A type error inside a transaction is a validation reason.
    s.put(PutRequest {
        key: c.clone(),
        item: item(&[("s", Value::S("x".into()))]),
        condition: None,
    })
    .await
    .expect("put");
    let r = s
        .transact_write(
            vec![TransactOp::Update(UpdateRequest {
                key: c.clone(),
                update: Update::new().add("s", 1),
                condition: None,
                returns: ReturnValues::None,
            })],
            None,
        )
        .await;
    assert!(
        matches!(
            &r,
            Err(StoreError::TransactionCanceled { reasons })
                if matches!(reasons.as_slice(), [CancelReason::Validation(_)])
        ) || matches!(r, Err(StoreError::Validation(_))),
        "got {r:?}"
    );
    drop_table(&s).await;
}

trait SkSuffix {
    fn with_sk_suffix(self) -> Key;
}
impl SkSuffix for Key {
    fn with_sk_suffix(self) -> Key {
        Key::new(self.pk, format!("{}#missing", self.sk))
    }
}

#[tokio::test]
async fn batch_get_chunks_and_keeps_request_order() {
    let ep = endpoint_or_skip!("batch_get_chunks_and_keeps_request_order");
    let s = common::fresh_store(&ep, "batch").await;
    let seeded: Vec<i64> = (0..250).filter(|i| i % 3 != 0).collect();
    for chunk in seeded.chunks(100) {
        let ops: Vec<TransactOp> = chunk
            .iter()
            .map(|&i| {
                TransactOp::Put(PutRequest {
                    key: Key::new(format!("k{i}"), "s"),
                    item: item(&[("i", Value::N(i))]),
                    condition: None,
                })
            })
            .collect();
        s.transact_write(ops, None).await.expect("seed");
    }
    let keys: Vec<Key> = (0..250)
        .rev()
        .map(|i| Key::new(format!("k{i}"), "s"))
        .collect();
    let got = s.batch_get(&keys, true).await.expect("batch_get");
    assert_eq!(got.len(), keys.len());
    for (k, g) in keys.iter().zip(&got) {
        let i: i64 = k.pk[1..].parse().expect("index");
        if i % 3 == 0 {
            assert!(g.is_none(), "{k} should be absent");
        } else {
            assert_eq!(g.as_ref().and_then(|g| g.get("i")), Some(&Value::N(i)));
        }
    }
    // A key twice, even in different chunks of 100, is refused like DynamoDB refuses it.
    let mut dup = keys.clone();
    dup.push(keys[0].clone());
    assert!(matches!(
        s.batch_get(&dup, true).await,
        Err(StoreError::Validation(_))
    ));
    drop_table(&s).await;
}

#[tokio::test]
async fn query_paginates_and_uses_indexes() {
    let ep = endpoint_or_skip!("query_paginates_and_uses_indexes");
    let s = common::fresh_store(&ep, "query").await;
    // 24 items of ~100 KB: more than two 1 MB pages.
    let blob = "x".repeat(100_000);
    for i in 0..24 {
        s.put(PutRequest {
            key: Key::new("ns/ENTITY#e", format!("#USAGE#r#{i:03}")),
            item: item(&[
                ("blob", Value::S(blob.clone())),
                ("GSI1PK", Value::S("ns/PARENT#p".into())),
                ("GSI1SK", Value::S(format!("CHILD#{i:03}"))),
                ("GSI3PK", Value::S("ns/ENTITY_CONFIG#r".into())),
                ("GSI3SK", Value::S(format!("e{i:03}"))),
            ]),
            condition: None,
        })
        .await
        .expect("put");
    }
    s.put(PutRequest {
        key: Key::new("ns/ENTITY#e", "#META"),
        item: Item::new(),
        condition: None,
    })
    .await
    .expect("put meta");
    let mut q = Query::table("ns/ENTITY#e", Some("#USAGE#"));
    q.consistent = true;
    let all = s.query(q).await.expect("query");
    assert_eq!(all.len(), 24);
    let sks: Vec<String> = all
        .iter()
        .filter_map(|i| i.get("SK").and_then(|v| v.as_s()).map(str::to_string))
        .collect();
    let mut sorted = sks.clone();
    sorted.sort();
    assert_eq!(sks, sorted);
    let every = s
        .query(Query::table("ns/ENTITY#e", None))
        .await
        .expect("query");
    assert_eq!(every.len(), 25);
    let children = s
        .query(Query::index("GSI1", "ns/PARENT#p", Some("CHILD#01")))
        .await
        .expect("gsi1");
    assert_eq!(children.len(), 10);
    assert!(children.iter().all(|c| c.contains_key("blob")));
    let keys_only = s
        .query(Query::index("GSI3", "ns/ENTITY_CONFIG#r", None))
        .await
        .expect("gsi3");
    assert_eq!(keys_only.len(), 24);
    assert!(keys_only
        .iter()
        .all(|c| !c.contains_key("blob") && c.contains_key("PK")));
    drop_table(&s).await;
}

#[tokio::test]
async fn a_bad_stored_number_is_corrupt() {
    let ep = endpoint_or_skip!("a_bad_stored_number_is_corrupt");
    let s = common::fresh_store(&ep, "corrupt").await;
    s.client()
        .put_item()
        .table_name(s.table())
        .set_item(Some(HashMap::from([
            ("PK".to_string(), AttributeValue::S("p".into())),
            ("SK".to_string(), AttributeValue::S("s".into())),
            ("b_rpm_tk".to_string(), AttributeValue::N("1.5".into())),
        ])))
        .send()
        .await
        .expect("raw put");
    match s.get(&Key::new("p", "s"), true).await {
        Err(StoreError::Corrupt(m)) => assert!(m.contains("b_rpm_tk"), "{m}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    drop_table(&s).await;
}

/// `Validation` whose message names `table` (and contains every one of `words`).
fn assert_validation_naming<T: std::fmt::Debug>(
    r: Result<T, StoreError>,
    table: &str,
    words: &[&str],
) {
    match r {
        Err(StoreError::Validation(m)) => {
            assert!(m.contains(table), "message does not name {table}: {m}");
            for w in words {
                assert!(m.contains(w), "message lacks {w:?}: {m}");
            }
        }
        other => panic!("expected Validation naming {table}, got {other:?}"),
    }
}

#[tokio::test]
async fn a_missing_table_is_a_validation_error_naming_it() {
    let ep = endpoint_or_skip!("a_missing_table_is_a_validation_error_naming_it");
    let table = common::table_name("missing");
    let s = common::store_for(&ep, &table).await;
    let k = Key::new("p", "s");
    // A misconfiguration, not an outage: never Unavailable (which may fail open).
    assert_validation_naming(s.get(&k, true).await, &table, &["not found"]);
    assert_validation_naming(
        s.put(PutRequest {
            key: k.clone(),
            item: Item::new(),
            condition: None,
        })
        .await,
        &table,
        &["not found"],
    );
    assert_validation_naming(
        s.update(UpdateRequest {
            key: k.clone(),
            update: Update::new().add("n", 1),
            condition: None,
            returns: ReturnValues::None,
        })
        .await,
        &table,
        &["not found"],
    );
    assert_validation_naming(
        s.batch_get(std::slice::from_ref(&k), true).await,
        &table,
        &[],
    );
    assert_validation_naming(s.query(Query::table("p", None)).await, &table, &[]);
    // The start-up check says so in its own words.
    match s.check_table().await {
        Err(e @ DynamoDbError::TableMissing { .. }) => {
            assert!(!e.is_unavailable());
            let m = e.to_string();
            assert!(m.contains(&table) && m.contains("does not exist"), "{m}");
        }
        other => panic!("expected TableMissing, got {other:?}"),
    }
}

#[tokio::test]
async fn a_closed_port_is_unavailable_even_for_a_write() {
    let _ep = endpoint_or_skip!("a_closed_port_is_unavailable_even_for_a_write");
    // Port 9 (discard) is closed on a test machine: the connection is refused before
    // anything is sent, so even a write is Unavailable, not Ambiguous.
    let closed = common::store_for("http://127.0.0.1:9", "tollgate-closed").await;
    let r = closed
        .update(UpdateRequest {
            key: Key::new("p", "s"),
            update: Update::new().add("n", 1),
            condition: None,
            returns: ReturnValues::None,
        })
        .await;
    assert!(matches!(r, Err(StoreError::Unavailable(_))), "got {r:?}");
    let r = closed.get(&Key::new("p", "s"), true).await;
    assert!(matches!(r, Err(StoreError::Unavailable(_))), "got {r:?}");
    match closed.check_table().await {
        Err(e @ DynamoDbError::Api { .. }) => assert!(e.is_unavailable(), "{e}"),
        other => panic!("expected an unavailable DescribeTable, got {other:?}"),
    }
}

#[tokio::test]
async fn check_table_accepts_the_layout_create_table_makes() {
    let ep = endpoint_or_skip!("check_table_accepts_the_layout_create_table_makes");
    let s = common::fresh_store(&ep, "check").await;
    let c = s.check_table().await.expect("layout accepted");
    assert_eq!(c.table, s.table());
    assert_eq!(c.status, "ACTIVE");
    assert_eq!(c.indexes, ["GSI1", "GSI2", "GSI3", "GSI4"]);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    drop_table(&s).await;
}

/// Create `table` with the given string or number keys and no indexes, through the raw
/// client (tollgate's `create_table` only makes its own layout).
async fn raw_table(s: &DynamoDbStore, keys: &[(&str, KeyType, ScalarAttributeType)]) {
    let mut b = s
        .client()
        .create_table()
        .table_name(s.table())
        .billing_mode(BillingMode::PayPerRequest);
    for (name, kt, ty) in keys {
        b = b
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(*name)
                    .attribute_type(ty.clone())
                    .build()
                    .expect("definition"),
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name(*name)
                    .key_type(kt.clone())
                    .build()
                    .expect("key"),
            );
    }
    b.send().await.expect("raw create_table");
    tollgate_dynamodb::wait_active(s.client(), s.table(), std::time::Duration::from_secs(30))
        .await
        .expect("active");
}

#[tokio::test]
async fn a_table_of_another_layout_is_refused_with_every_difference() {
    let ep = endpoint_or_skip!("a_table_of_another_layout_is_refused_with_every_difference");
    // Keyed on `id` alone: nothing of tollgate's layout.
    let table = common::table_name("wrongkeys");
    let s = common::store_for(&ep, &table).await;
    raw_table(&s, &[("id", KeyType::Hash, ScalarAttributeType::S)]).await;
    match s.check_table().await {
        Err(e @ DynamoDbError::TableMismatch { .. }) => {
            assert!(!e.is_unavailable());
            let DynamoDbError::TableMismatch {
                table: ref t,
                ref problems,
            } = e
            else {
                unreachable!()
            };
            assert_eq!(t, &table);
            assert!(
                problems.contains(&"the table partition key is id (want PK)".to_string()),
                "{problems:?}"
            );
            assert!(
                problems.contains(&"the table has no sort key (want SK)".to_string()),
                "{problems:?}"
            );
            for ix in ["GSI1", "GSI2", "GSI3", "GSI4"] {
                assert!(
                    problems.contains(&format!("global secondary index {ix} is missing")),
                    "{problems:?}"
                );
            }
            assert_eq!(problems.len(), 6, "{problems:?}");
            assert!(e.to_string().contains(&table), "{e}");
        }
        other => panic!("expected TableMismatch, got {other:?}"),
    }
    // Data-plane calls on it are honest too: the key does not match the schema.
    assert_validation_naming(s.get(&Key::new("p", "s"), true).await, &table, &["key"]);
    drop_table(&s).await;

    // Right names, wrong type: PK a number.
    let table = common::table_name("numkey");
    let s = common::store_for(&ep, &table).await;
    raw_table(
        &s,
        &[
            ("PK", KeyType::Hash, ScalarAttributeType::N),
            ("SK", KeyType::Range, ScalarAttributeType::S),
        ],
    )
    .await;
    match s.check_table().await {
        Err(DynamoDbError::TableMismatch { problems, .. }) => {
            assert_eq!(
                problems[0],
                "the table partition key PK is of type N (want S, a string)"
            );
            assert_eq!(problems.len(), 5, "{problems:?}");
        }
        other => panic!("expected TableMismatch, got {other:?}"),
    }
    drop_table(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_conditional_debits_never_over_admit() {
    let ep = endpoint_or_skip!("concurrent_conditional_debits_never_over_admit");
    let s = Arc::new(common::fresh_store(&ep, "conc").await);
    let k = Key::new("ns/BUCKET#e#r#0", "#STATE");
    s.put(PutRequest {
        key: k.clone(),
        item: item(&[("b_rpm_tk", Value::N(100))]),
        condition: None,
    })
    .await
    .expect("seed");
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (s, k) = (s.clone(), k.clone());
        tasks.push(tokio::spawn(async move {
            let mut ok = 0;
            for _ in 0..15 {
                match s
                    .update(UpdateRequest {
                        key: k.clone(),
                        update: Update::new().add("b_rpm_tk", -1),
                        condition: Some(Condition::ge("b_rpm_tk", 1)),
                        returns: ReturnValues::None,
                    })
                    .await
                {
                    Ok(_) => ok += 1,
                    Err(StoreError::ConditionFailed { .. }) => {}
                    Err(e) => panic!("unexpected {e:?}"),
                }
            }
            ok
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.expect("task");
    }
    assert_eq!(admitted, 100);
    let left = s.get(&k, true).await.expect("get").expect("item");
    assert_eq!(left.get("b_rpm_tk"), Some(&Value::N(0)));
    drop_table(&s).await;
}

/// A store whose single-item writes go through the SDK: an AWS configuration with its own
/// HTTP client (the SDK's default one, built explicitly) keeps them there.
async fn sdk_path_store(endpoint: &str, table: &str) -> DynamoDbStore {
    use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(
            aws_smithy_http_client::Builder::new()
                .tls_provider(Provider::Rustls(CryptoMode::AwsLc))
                .build_https(),
        )
        .region(aws_config::Region::new("us-east-1"))
        .load()
        .await;
    let mut b = DynamoDbStore::builder(table)
        .endpoint(endpoint)
        .deadline(common::TEST_DEADLINE)
        .sdk_config(sdk);
    if std::env::var("AWS_ACCESS_KEY_ID").is_err() {
        b = b.static_credentials("test", "test");
    }
    b.build().await.expect("store builds")
}

/// Every single-item write gives the same answer and leaves the same item whether this
/// crate sends it (signed HTTP) or the SDK does: return values, failed conditions with the
/// old item, REMOVE-only updates of an absent item, awkward names and strings, refusals.
#[tokio::test]
async fn direct_and_sdk_writes_agree() {
    let ep = endpoint_or_skip!("direct_and_sdk_writes_agree");
    let direct = common::fresh_store(&ep, "direct").await;
    let sdk = sdk_path_store(&ep, &common::table_name("viasdk")).await;
    sdk.create_table().await.expect("table created");
    assert!(direct.direct_writes());
    assert!(!sdk.direct_writes());
    let k = Key::new("p\"1 é", "s/1\\x");
    let awkward = "b_gpt-4.1_tk";
    let full = item(&[
        ("n", Value::N(3)),
        (awkward, Value::N(-7)),
        ("s", Value::S("quote \" backslash \\ tab \t é ☃".into())),
        ("b", Value::Bool(false)),
        (
            "tags",
            Value::Ss(Box::new(BTreeSet::from([
                "a".to_string(),
                "b c".to_string(),
            ]))),
        ),
        (
            "m",
            Value::M(Box::new(std::collections::BTreeMap::from([
                ("k.1".to_string(), Value::N(1)),
                (
                    "l".to_string(),
                    Value::L(Box::new(vec![Value::Null, Value::S("x".into())])),
                ),
            ]))),
        ),
        ("z", Value::Null),
    ]);
    #[derive(Debug, PartialEq)]
    enum Out {
        Unit(Result<(), StoreError>),
        Item(Result<Option<Item>, StoreError>),
    }
    // Validation messages name the table, which differs: compare their kind only.
    fn norm(o: Out) -> Out {
        let v = |e: StoreError| match e {
            StoreError::Validation(_) => StoreError::Validation(String::new()),
            e => e,
        };
        match o {
            Out::Unit(r) => Out::Unit(r.map_err(v)),
            Out::Item(r) => Out::Item(r.map_err(v)),
        }
    }
    let mut answers: Vec<Vec<Out>> = Vec::new();
    for s in [&direct, &sdk] {
        let update = |update: Update, condition: Option<Condition>, returns: ReturnValues| {
            s.update(UpdateRequest {
                key: k.clone(),
                update,
                condition,
                returns,
            })
        };
        let outs = vec![
            Out::Item(
                update(
                    Update::new().add("n", 1),
                    Some(Condition::exists("PK")),
                    ReturnValues::AllNew,
                )
                .await,
            ),
            Out::Item(update(Update::new().remove("gone"), None, ReturnValues::AllNew).await),
            Out::Unit(
                s.put(PutRequest {
                    key: k.clone(),
                    item: full.clone(),
                    condition: Some(Condition::not_exists("PK")),
                })
                .await,
            ),
            Out::Unit(
                s.put(PutRequest {
                    key: k.clone(),
                    item: full.clone(),
                    condition: Some(Condition::not_exists("PK")),
                })
                .await,
            ),
            Out::Item(
                update(
                    Update::new().add(awkward, 2).set("s", "new \"s\""),
                    Some(Condition::ge("n", 3)),
                    ReturnValues::AllNew,
                )
                .await,
            ),
            Out::Item(
                update(
                    Update::new().add("n", -5),
                    Some(Condition::ge("n", 5)),
                    ReturnValues::AllNew,
                )
                .await,
            ),
            Out::Item(update(Update::new().set("n", 4), None, ReturnValues::UpdatedNew).await),
            Out::Item(update(Update::new().remove("z"), None, ReturnValues::AllOld).await),
            Out::Item(update(Update::new().add("n", 1), None, ReturnValues::None).await),
            Out::Unit(
                s.put(PutRequest {
                    key: Key::new("p", "empty-set"),
                    item: item(&[("e", Value::Ss(Box::default()))]),
                    condition: None,
                })
                .await,
            ),
            Out::Item(
                s.delete(DeleteRequest {
                    key: k.clone(),
                    condition: Some(Condition::cmp("n", CmpOp::Eq, 99)),
                })
                .await,
            ),
            Out::Item(s.get(&k, true).await),
            Out::Item(
                s.delete(DeleteRequest {
                    key: k.clone(),
                    condition: None,
                })
                .await,
            ),
            Out::Item(
                s.delete(DeleteRequest {
                    key: k.clone(),
                    condition: None,
                })
                .await,
            ),
        ];
        answers.push(outs.into_iter().map(norm).collect());
    }
    let [d, v] = [&answers[0], &answers[1]];
    assert_eq!(d.len(), v.len());
    for (i, (d, v)) in d.iter().zip(v).enumerate() {
        assert_eq!(d, v, "step {i}: direct vs SDK");
    }
    let steps = &answers[0];
    // The answers are the ones the contract asks for, not only equal.
    assert!(matches!(
        steps[0],
        Out::Item(Err(StoreError::ConditionFailed { old: None }))
    ));
    assert_eq!(steps[1], Out::Item(Ok(None)));
    assert!(
        matches!(&steps[3], Out::Unit(Err(StoreError::ConditionFailed { old: Some(o) })) if o.get("s") == full.get("s"))
    );
    assert!(matches!(
        &steps[9],
        Out::Unit(Err(StoreError::Validation(_)))
    ));
    assert!(matches!(&steps[12], Out::Item(Ok(Some(o))) if o.get(awkward) == Some(&Value::N(-5))));
    assert_eq!(steps[13], Out::Item(Ok(None)));
    drop_table(&direct).await;
    drop_table(&sdk).await;
}

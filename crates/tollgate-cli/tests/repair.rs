//! Corrupt items, as a user meets them (docs/repair.md): acquire and reads fail with exit 4
//! naming the item and the attribute; `tollgate doctor` lists them (exit 5) with the command
//! that repairs each; `limits set`, `limits delete` and `entity delete` replace or delete them
//! with a warning line on stderr (`warnings` with `--json`); `doctor --repair` deletes a
//! corrupt bucket's items. On SQLite, and on DynamoDB Local when it is there.

mod common;

use std::process::{Command, Output};

use common::{code, stderr, stdout, tollgate, BIN};
use serde_json::Value;

/// Run with the given store arguments appended.
fn run(store: &[&str], args: &[&str]) -> Output {
    let all: Vec<&str> = args.iter().chain(store).copied().collect();
    tollgate(&all)
}

fn json_of(o: &Output) -> Value {
    serde_json::from_str(&stdout(o)).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

/// (capacity, available) of `limit` in an acquire's `--json` answer.
fn status(v: &Value, limit: &str) -> (i64, i64) {
    let s = v["statuses"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["limit"] == limit))
        .unwrap_or_else(|| panic!("no {limit} in {v}"));
    (
        s["capacity"].as_i64().unwrap(),
        s["available"].as_i64().unwrap(),
    )
}

const CFG: (&str, &str) = ("default/ENTITY#u1", "#CONFIG#llm");
const BUCKET: (&str, &str) = ("default/BUCKET#u1#llm#0", "#STATE");
const META: (&str, &str) = ("default/ENTITY#u1", "#META");

/// The walk every backend makes: `corrupt(pk, sk, attribute)` turns the attribute into a
/// string in the store (where a boolean or a number belongs).
fn walk(store: &[&str], corrupt: &dyn Fn((&str, &str), &str)) {
    let o = run(store, &["entity", "create", "u1"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(
        store,
        &[
            "limits",
            "set",
            "--entity",
            "u1",
            "--for-resource",
            "llm",
            "rpm:rate=5/min",
            "tk:rate=1000/min",
        ],
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stderr(&o), "", "no warning over a sound item");
    let o = run(store, &["acquire", "u1", "llm", "rpm=1", "tk=10"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(store, &["doctor"]);
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).ends_with("namespace default: 3 item(s) scanned, no corrupt items\n"),
        "{}",
        stdout(&o)
    );

    corrupt(CFG, "cascade");
    corrupt(BUCKET, "b_tk_tk");
    let o = run(store, &["acquire", "u1", "llm", "rpm=1"]);
    assert_eq!(code(&o), 4, "{}{}", stdout(&o), stderr(&o));
    assert_eq!(
        stderr(&o),
        "tollgate: corrupt stored data: corrupt item default/ENTITY#u1|#CONFIG#llm: attribute \
         cascade: expected a boolean\n"
    );
    let o = run(store, &["--json", "check", "u1", "llm"]);
    assert_eq!(code(&o), 4, "{}", stdout(&o));
    assert_eq!(json_of(&o)["error"], "corrupt_data");

    let o = run(store, &["doctor"]);
    assert_eq!(code(&o), 5, "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    for want in [
        "namespace default: 3 item(s) scanned, 2 corrupt\n",
        "default/BUCKET#u1#llm#0 / #STATE: attribute \"b_tk_tk\": expected a number, found S\n  \
         the bucket of u1 / llm, shard 0\n  repair: `tollgate doctor --repair` deletes the \
         buckets of u1 / llm",
        "default/ENTITY#u1 / #CONFIG#llm: attribute \"cascade\": expected a boolean\n  the \
         limits of entity u1 for resource llm\n  repair: `tollgate limits set --entity u1 \
         --for-resource llm LIMIT...` replaces it",
    ] {
        assert!(out.contains(want), "{want:?} not in\n{out}");
    }
    assert!(
        stderr(&o).starts_with("tollgate: 2 corrupt item(s) remain in "),
        "{}",
        stderr(&o)
    );
    let o = run(store, &["--json", "doctor"]);
    assert_eq!(code(&o), 5);
    let v = json_of(&o);
    assert_eq!(v["remaining"], 2);
    let mut attrs: Vec<&str> = v["corrupt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["attribute"].as_str().unwrap())
        .collect();
    attrs.sort();
    assert_eq!(attrs, ["b_tk_tk", "cascade"]);

    // `limits set` replaces the corrupt config item, with one warning line (no log line
    // beside it, at the default log level).
    let all: Vec<&str> = [
        "limits",
        "set",
        "--entity",
        "u1",
        "--for-resource",
        "llm",
        "rpm:rate=7/min",
        "tk:rate=2000/min",
    ]
    .iter()
    .chain(store)
    .copied()
    .collect();
    let o = Command::new(BIN)
        .args(&all)
        .env_remove("RUST_LOG")
        .env_remove("TOLLGATE_STORE")
        .output()
        .unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(
        stderr(&o),
        "tollgate: warning: corrupt item default/ENTITY#u1 / #CONFIG#llm: attribute \
         \"cascade\": expected a boolean: replaced by the new limits (its cascade policy could \
         not be read and was not kept)\n"
    );
    assert!(stdout(&o).contains("rpm:rate=7/min"), "{}", stdout(&o));

    // The bucket still refuses; the doctor repairs it; the acquire then starts full on the
    // new limits.
    let o = run(store, &["acquire", "u1", "llm", "rpm=1"]);
    assert_eq!(code(&o), 4);
    assert!(stderr(&o).contains("attribute b_tk_tk"), "{}", stderr(&o));
    let o = run(store, &["doctor", "--repair"]);
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains(
            "  repaired: deleted with every bucket item of u1 / llm (1 in all): the next \
             acquire creates them afresh, at full capacity\n"
        ),
        "{}",
        stdout(&o)
    );
    let o = run(store, &["doctor"]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    let o = run(store, &["--json", "acquire", "u1", "llm", "rpm=1", "tk=10"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v = json_of(&o);
    assert_eq!(status(&v, "rpm"), (7, 6));
    assert_eq!(status(&v, "tk"), (2000, 1990));

    // `entity delete` over a corrupt META and bucket: all of it goes, each corrupt item named.
    corrupt(META, "cascade");
    corrupt(BUCKET, "b_rpm_tk");
    let o = run(store, &["entity", "get", "u1"]);
    assert_eq!(code(&o), 4);
    assert!(
        stderr(&o).contains("default/ENTITY#u1|#META: attribute cascade"),
        "{}",
        stderr(&o)
    );
    let o = run(store, &["--json", "entity", "delete", "u1"]);
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    let v = json_of(&o);
    assert_eq!(v["deleted_items"], 3, "{v}");
    let mut msgs: Vec<&str> = v["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["message"].as_str().unwrap())
        .collect();
    msgs.sort();
    assert_eq!(
        msgs,
        [
            "default/BUCKET#u1#llm#0 / #STATE: attribute \"b_rpm_tk\": expected a number, \
             found S: deleted with entity u1",
            "default/ENTITY#u1 / #META: attribute \"cascade\": expected a boolean: deleted \
             with entity u1",
        ]
    );
    let o = run(store, &["entity", "get", "u1"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    let o = run(store, &["--json", "doctor"]);
    assert_eq!(code(&o), 0);
    let v = json_of(&o);
    assert_eq!(
        (v["scanned"].as_i64(), v["remaining"].as_i64()),
        (Some(0), Some(0))
    );
}

fn sqlite_set(db: &std::path::Path, (pk, sk): (&str, &str), attr: &str, json: &str) {
    let conn = rusqlite::Connection::open(db).unwrap();
    let n = conn
        .execute(
            "UPDATE items SET item = json_set(item, '$.' || ?1, json(?2)) WHERE pk = ?3 AND sk = ?4",
            rusqlite::params![attr, json, pk, sk],
        )
        .unwrap();
    assert_eq!(n, 1, "{pk} {sk}");
}

#[test]
fn sqlite_doctor_and_repairs() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let st = format!("sqlite:{}", db.display());
    walk(&["--store", &st], &|key, attr| {
        sqlite_set(&db, key, attr, r#"{"s":"x"}"#)
    });
}

/// Items SQLite cannot decode at all (a number with a fraction where the item model has
/// integers): named the same way, and replaced or deleted without being read.
#[test]
fn sqlite_items_that_do_not_decode() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let st = format!("sqlite:{}", db.display());
    let store = ["--store", st.as_str()];
    for args in [
        &["limits", "set", "--resource", "llm", "rpm:rate=10/min"][..],
        &["entity", "create", "u1"],
        &["acquire", "u1", "llm", "rpm=1"],
    ] {
        let o = run(&store, args);
        assert_eq!(code(&o), 0, "{args:?}: {}", stderr(&o));
    }
    sqlite_set(
        &db,
        ("default/RESOURCE#llm", "#CONFIG"),
        "l_rpm_ra",
        r#"{"n":1.5}"#,
    );
    sqlite_set(&db, META, "created_at", r#"{"n":2.5}"#);
    let o = run(&store, &["limits", "get", "--resource", "llm"]);
    assert_eq!(code(&o), 4);
    assert!(
        stderr(&o).contains("item default/RESOURCE#llm|#CONFIG: attribute l_rpm_ra: undecodable"),
        "{}",
        stderr(&o)
    );
    let o = run(&store, &["doctor"]);
    assert_eq!(code(&o), 5);
    for want in [
        "default/RESOURCE#llm / #CONFIG: attribute \"l_rpm_ra\": undecodable value: invalid type: floating point `1.5`, expected i64\n",
        "default/ENTITY#u1 / #META: attribute \"created_at\": undecodable value: invalid type: floating point `2.5`, expected i64\n",
    ] {
        assert!(stdout(&o).contains(want), "{want:?} not in\n{}", stdout(&o));
    }
    let o = run(&store, &["limits", "delete", "--resource", "llm"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stderr(&o).starts_with(
            "tollgate: warning: corrupt item default/RESOURCE#llm / #CONFIG: attribute \"l_rpm_ra\""
        ),
        "{}",
        stderr(&o)
    );
    assert_eq!(stdout(&o), "deleted the limits of resource:llm\n");
    let o = run(&store, &["entity", "delete", "u1"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).contains("deleted entity u1 (2 item(s))"),
        "{}",
        stdout(&o)
    );
    assert!(
        stderr(&o).contains("attribute \"created_at\""),
        "{}",
        stderr(&o)
    );
    let o = run(&store, &["doctor"]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    assert!(stdout(&o).contains("0 item(s) scanned"), "{}", stdout(&o));
}

/// The same walk on DynamoDB Local (`TOLLGATE_DYNAMODB_ENDPOINT`), the items corrupted
/// through the store itself.
#[cfg(feature = "dynamodb")]
#[test]
fn dynamodb_doctor_and_repairs() {
    use tollgate_core::value::{Key, Value as V};
    use tollgate_store::{PutRequest, Store};
    let Ok(ep) = std::env::var("TOLLGATE_DYNAMODB_ENDPOINT") else {
        eprintln!("dynamodb_doctor_and_repairs: TOLLGATE_DYNAMODB_ENDPOINT is not set; skipped");
        return;
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() % 1_000_000)
        .unwrap_or(0);
    let table = format!("cli-repair-{}-{nanos}", std::process::id());
    let o = tollgate(&["table", "create", "--table", &table, "--endpoint", &ep]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut b = tollgate_dynamodb::DynamoDbStore::builder(table.as_str()).endpoint(ep.as_str());
    if std::env::var("AWS_ACCESS_KEY_ID").is_err() {
        b = b.static_credentials("test", "test");
    }
    let ddb = rt.block_on(b.build()).unwrap();
    let st = format!("dynamodb:{table}");
    walk(&["--store", &st, "--endpoint", &ep], &|(pk, sk), attr| {
        rt.block_on(async {
            let key = Key::new(pk, sk);
            let mut item = ddb.get(&key, true).await.unwrap().expect("item exists");
            item.insert(attr.into(), V::S("x".into()));
            ddb.put(PutRequest {
                key,
                item,
                condition: None,
            })
            .await
            .unwrap();
        })
    });
}

//! Limits as a reviewed file, with the real binary: `limits plan` shows the exact diff
//! against what the store holds, `apply` then `plan` shows nothing, a bad file is refused
//! naming its line and field; `serve --limits FILE --grpc ADDR` applies it, follows it on
//! SIGHUP and when it changes, keeps the last good limits when it breaks, and answers
//! Envoy's rate limit service with the file's descriptor mapping. On SQLite, and on
//! DynamoDB Local when `TOLLGATE_DYNAMODB_ENDPOINT` is set.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{code, stderr, stdout, tollgate, Opts, ServerProc};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

const V1: &str = r#"
[system]
on_unavailable = "block"
[system.limits]
rpm = { capacity = 100, refill_amount = 100 }

[resources.gpt-4.limits]
rpm = { capacity = 60, refill_amount = 60 }
tpm = { capacity = 100000, refill_amount = 100000 }

[entities.team-a.resources.gpt-4]
cascade = true
[entities.team-a.resources.gpt-4.limits]
rpm = { capacity = 600, refill_amount = 600 }
"#;

const V2: &str = r#"
[system]
on_unavailable = "block"
[system.limits]
rpm = { capacity = 200, refill_amount = 200 }

[resources.gpt-4.limits]
rpm = { capacity = 120, refill_amount = 120 }
rpd = { capacity = 1000, reset_cron = "0 0 * * *" }

[entities.team-a.resources.gpt-4.limits]
rpm = { capacity = 600, refill_amount = 600 }

[entities.team-b.limits]
session = { capacity = 10, reset_after_s = 18000 }
"#;

fn write(p: &Path, text: &str) {
    // Replace the file whole (as an editor or a deploy does), so a reader never sees half.
    let tmp = p.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, p).unwrap();
}

fn run(args: &[&str], store: &[&str]) -> std::process::Output {
    let mut a: Vec<&str> = args.to_vec();
    a.extend_from_slice(store);
    tollgate(&a)
}

fn plan_apply_walk(store: &[&str], dir: &Path) {
    let f = dir.join("limits.toml");
    let fs = f.to_str().unwrap();
    write(&f, V1);
    let o = run(&["limits", "apply", "-f", fs], store);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "system create\n  ~ on_unavailable: (unset) -> block\n  + rpm:rate=100/min\n\
         resource:gpt-4 create\n  + rpm:rate=60/min\n  + tpm:rate=100000/min\n\
         entity:team-a/resource:gpt-4 create\n  ~ cascade: (unset) -> true\n  + rpm:rate=600/min\n\
         applied 3 level(s)\n"
    );
    let o = run(&["limits", "plan", "-f", fs], store);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        format!("no changes: the store holds what {fs} declares\n")
    );
    // A level set by hand is not in the file: plan reads the store now, and would delete it.
    let o = run(
        &["limits", "set", "--resource", "old", "rpm:rate=1/s"],
        store,
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(&["limits", "plan", "-f", fs], store);
    assert_eq!(
        stdout(&o),
        "resource:old delete\n  - rpm:rate=1/s\n1 level(s) to change: 0 create, 0 update, 1 delete\n"
    );
    write(&f, V2);
    let o = run(&["limits", "plan", "-f", fs], store);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "system update\n  ~ rpm:rate=100/min -> rpm:rate=200/min\n\
         resource:gpt-4 update\n  ~ rpm:rate=60/min -> rpm:rate=120/min\n  - tpm:rate=100000/min\n  + rpd:quota=1000,cron=\"0 0 * * *\",tz=UTC\n\
         resource:old delete\n  - rpm:rate=1/s\n\
         entity:team-a/resource:gpt-4 update\n  ~ cascade: true -> (unset)\n\
         entity:team-b create\n  + session:quota=10,after=5h\n\
         5 level(s) to change: 1 create, 3 update, 1 delete\n"
    );
    // plan wrote nothing.
    let o = run(&["limits", "get", "--resource", "gpt-4"], store);
    assert!(stdout(&o).contains("rpm:rate=60/min"), "{}", stdout(&o));
    let o = run(&["--json", "limits", "plan", "-f", fs], store);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["changes"].as_array().unwrap().len(), 5);
    assert_eq!(v["changes"][2]["change"], "delete");
    let o = run(&["limits", "apply", "-f", fs], store);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).ends_with("applied 5 level(s)\n"),
        "{}",
        stdout(&o)
    );
    let o = run(&["limits", "plan", "-f", fs], store);
    assert!(stdout(&o).starts_with("no changes"), "{}", stdout(&o));
    let o = run(&["limits", "get", "--resource", "old"], store);
    assert_eq!(stdout(&o), "resource:old: no limits stored\n");
    let o = run(&["limits", "get", "--entity", "team-b"], store);
    assert!(
        stdout(&o).contains("session:quota=10,after=5h"),
        "{}",
        stdout(&o)
    );

    // A bad file: refused with its line and field, nothing applied.
    write(
        &f,
        "[resources.gpt-4.limits]\nrpm = { capacity = 1, refill_amount = 1 }\ntpm = { capacity = 5, refil_amount = 5 }\n",
    );
    for verb in ["plan", "apply"] {
        let o = run(&["limits", verb, "-f", fs], store);
        assert_eq!(code(&o), 2, "{verb}: {}", stdout(&o));
        let e = stderr(&o);
        assert!(
            e.contains(&format!(
                "{fs}:3: resources.gpt-4.limits.tpm: unknown field `refil_amount`"
            )),
            "{verb}: {e}"
        );
    }
    write(
        &f,
        "[resources.gpt-4.limits]\nrpm = { capacity = 1, refill_amount = 1 }\n\n[entities.u1.limits]\nx = { capacity = 0, refill_amount = 1 }\n",
    );
    let o = run(&["limits", "apply", "-f", fs], store);
    assert_eq!(code(&o), 2);
    assert!(
        stderr(&o).contains(&format!(
            "{fs}:5: entities.u1.limits.x: invalid limit \"x\": capacity must be between 1"
        )),
        "{}",
        stderr(&o)
    );
    let o = run(&["limits", "get", "--resource", "gpt-4"], store);
    assert!(stdout(&o).contains("rpm:rate=120/min"), "{}", stdout(&o));
}

#[test]
fn plan_apply_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("t.db").display());
    // Before the store exists: planned against an empty one, and not created.
    let f = dir.path().join("first.toml");
    write(&f, V1);
    let o = run(
        &["limits", "plan", "-f", f.to_str().unwrap()],
        &["--store", &db],
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).ends_with("3 level(s) to change: 3 create, 0 update, 0 delete\n"),
        "{}",
        stdout(&o)
    );
    assert!(
        stderr(&o).contains("planned against an empty store"),
        "{}",
        stderr(&o)
    );
    assert!(!dir.path().join("t.db").exists());
    plan_apply_walk(&["--store", &db], dir.path());
}

const SERVED: &str = r#"
[resources.gpt-4.limits]
rpm = { capacity = CAP, refill_amount = CAP }
tpd = { capacity = 1000, reset_after_s = 86400 }

[[envoy.descriptors]]
domain = "ai-gateway"
when = { kind = "tokens" }
entity = { entry = "user_id" }
resource = { entry = "model" }
limit = "tpd"
report_usage = true

[[envoy.descriptors]]
domain = "ai-gateway"
entity = { entry = "user_id" }
resource = { entry = "model" }
limit = "rpm"
"#;

fn served(cap: u32) -> String {
    SERVED.replace("CAP", &cap.to_string())
}

type Client = RateLimitServiceClient<tonic::transport::Channel>;

async fn ask(c: &mut Client, user: &str) -> RateLimitResponse {
    let r = RateLimitRequest {
        domain: "ai-gateway".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![
                Entry {
                    key: "user_id".into(),
                    value: user.into(),
                },
                Entry {
                    key: "model".into(),
                    value: "gpt-4".into(),
                },
            ],
            ..Default::default()
        }],
        hits_addend: 1,
    };
    c.should_rate_limit(r).await.unwrap().into_inner()
}

/// A token descriptor: an estimate (request phase) or, with `lease`, the usage report.
async fn tokens(c: &mut Client, user: &str, hits: u64, lease: Option<&str>) -> RateLimitResponse {
    let mut entries = vec![
        Entry {
            key: "kind".into(),
            value: "tokens".into(),
        },
        Entry {
            key: "user_id".into(),
            value: user.into(),
        },
        Entry {
            key: "model".into(),
            value: "gpt-4".into(),
        },
    ];
    if let Some(l) = lease {
        entries.push(Entry {
            key: "tollgate_lease".into(),
            value: l.into(),
        });
    }
    let r = RateLimitRequest {
        domain: "ai-gateway".into(),
        descriptors: vec![RateLimitDescriptor {
            entries,
            hits_addend: Some(envoy_types::pb::google::protobuf::UInt64Value { value: hits }),
            ..Default::default()
        }],
        hits_addend: 0,
    };
    c.should_rate_limit(r).await.unwrap().into_inner()
}

fn cap_of(r: &RateLimitResponse) -> u32 {
    r.statuses[0]
        .current_limit
        .as_ref()
        .unwrap()
        .requests_per_unit
}

/// Poll the service until `want` holds (10 s at most), a fresh entity each time.
async fn eventually(c: &mut Client, user: &str, want: u32) -> RateLimitResponse {
    let deadline = Instant::now() + Duration::from_secs(10);
    for n in 0.. {
        let r = ask(c, &format!("{user}-{n}")).await;
        // A request in flight across the reload may be charged under the old limits while
        // its answer names the new ones: wait for one wholly under the new.
        if cap_of(&r) == want && r.statuses[0].limit_remaining == want - 1 {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "capacity stayed {} (want {want})",
            cap_of(&r)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    unreachable!("the loop returns or panics")
}

fn serve_walk(store: &[&str], dir: &Path) {
    let f = dir.join("limits.toml");
    let fs = f.to_str().unwrap();
    let log = dir.join("serve.log");
    // A bad file at start: the server refuses to start, naming line and field.
    write(
        &f,
        "[resources.gpt-4.limits]\nrpm = { capacity = \"two\" }\n",
    );
    let mut args = vec![
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--grpc",
        "127.0.0.1:0",
        "--limits",
        fs,
    ];
    args.extend_from_slice(store);
    let o = tollgate(&args);
    assert_eq!(code(&o), 2, "{}", stdout(&o));
    assert!(
        stderr(&o).contains(&format!("{fs}:2: resources.gpt-4.limits.rpm")),
        "{}",
        stderr(&o)
    );

    write(&f, &served(2));
    let mut sargs = vec![
        "--grpc",
        "127.0.0.1:0",
        "--limits",
        fs,
        "--limits-poll",
        "200ms",
        "--principal",
        "deploy-bot",
    ];
    sargs.extend_from_slice(store);
    let s = ServerProc::start_args(
        &sargs,
        Opts {
            rust_log: Some("info"),
            stderr_to: Some(&log),
            ..Default::default()
        },
    );
    let grpc = s
        .grpc
        .clone()
        .expect("the gRPC address on the listening line");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = RateLimitServiceClient::connect(grpc).await.unwrap();
        let a = ask(&mut c, "u1").await;
        assert_eq!(
            (a.overall_code, cap_of(&a), a.statuses[0].limit_remaining),
            (Code::Ok as i32, 2, 1)
        );
        let a = ask(&mut c, "u1").await;
        assert_eq!(
            (a.overall_code, a.statuses[0].limit_remaining),
            (Code::Ok as i32, 0)
        );
        let o = ask(&mut c, "u1").await;
        assert_eq!(o.overall_code, Code::OverLimit as i32);
        // Token accounting: an estimate of 100, then the usage report of 730.
        let a = tokens(&mut c, "acct", 100, None).await;
        assert_eq!(a.statuses[0].limit_remaining, 900);
        let lease = a.request_headers_to_add[0].value.clone();
        let r = tokens(&mut c, "acct", 730, Some(&lease)).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        let a = tokens(&mut c, "acct", 0, None).await;
        assert_eq!(a.statuses[0].limit_remaining, 270, "1000 - 730");
        // SIGHUP: the new file is applied.
        write(&f, &served(5));
        s.signal("HUP");
        let r = eventually(&mut c, "u2", 5).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        // A broken file: refused (logged with line and field); the limits in force stay.
        write(&f, &format!("{}\nbogus = 1\n", served(9)));
        s.signal("HUP");
        let deadline = Instant::now() + Duration::from_secs(10);
        let text = loop {
            let t = std::fs::read_to_string(&log).unwrap_or_default();
            if t.contains("limits file refused") {
                break t;
            }
            assert!(Instant::now() < deadline, "no refusal logged: {t}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            text.contains(&format!(
                "{fs}:20: envoy.descriptors.bogus: unknown field `bogus`"
            )),
            "{text}"
        );
        let r = ask(&mut c, "u3").await;
        assert_eq!((cap_of(&r), r.statuses[0].limit_remaining), (5, 4));
        // A change without a signal: picked up by the modification-time poll.
        write(&f, &served(7));
        let r = eventually(&mut c, "u4", 7).await;
        assert_eq!(r.statuses[0].limit_remaining, 6);
    });
    let o = run(&["limits", "get", "--resource", "gpt-4"], store);
    assert!(stdout(&o).contains("rpm:rate=7/min"), "{}", stdout(&o));
    // The report's charge is in the store: read by another process.
    let o = run(&["--json", "check", "acct", "gpt-4"], store);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let tpd = v["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["limit"] == "tpd")
        .unwrap();
    assert_eq!(tpd["available"], 270, "{v}");
    // What the server applied from the file is recorded for its --principal.
    let o = run(&["--json", "audit", "list", "--resource", "gpt-4"], store);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let sets: Vec<&serde_json::Value> = v["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["action"] == "limits.set")
        .collect();
    let caps: Vec<(&str, i64)> = sets
        .iter()
        .map(|r| {
            let rpm = &r["after"]["limits"][0];
            (
                r["principal"].as_str().unwrap_or(""),
                rpm["capacity"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    // Newest first: the poll (7), SIGHUP (5), the start (2); the refused file wrote nothing.
    assert_eq!(
        caps,
        [("deploy-bot", 7), ("deploy-bot", 5), ("deploy-bot", 2)],
        "{v}"
    );
    s.stop();
}

#[test]
fn serve_follows_the_file_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("t.db").display());
    serve_walk(&["--store", &db], dir.path());
}

#[cfg(feature = "dynamodb")]
fn dynamodb_table(prefix: &str) -> Option<(String, String)> {
    let Ok(ep) = std::env::var("TOLLGATE_DYNAMODB_ENDPOINT") else {
        eprintln!("{prefix}: TOLLGATE_DYNAMODB_ENDPOINT is not set; skipped");
        return None;
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() % 1_000_000)
        .unwrap_or(0);
    let table = format!("{prefix}-{}-{nanos}", std::process::id());
    let o = tollgate(&["table", "create", "--table", &table, "--endpoint", &ep]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    Some((format!("dynamodb:{table}"), ep))
}

#[cfg(feature = "dynamodb")]
#[test]
fn plan_apply_on_dynamodb() {
    let Some((st, ep)) = dynamodb_table("limits-plan") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    plan_apply_walk(&["--store", &st, "--endpoint", &ep], dir.path());
}

#[cfg(feature = "dynamodb")]
#[test]
fn serve_follows_the_file_on_dynamodb() {
    let Some((st, ep)) = dynamodb_table("limits-serve") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    serve_walk(&["--store", &st, "--endpoint", &ep], dir.path());
}

//! The command line: exit codes, --json output, limits syntax, demo.

mod common;

use common::{code, stderr, stdout, tollgate};
use serde_json::Value;

fn store(dir: &tempfile::TempDir) -> String {
    format!("sqlite:{}", dir.path().join("cli.db").display())
}

#[test]
fn limits_acquire_until_rejected_with_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let st = store(&dir);
    let o = tollgate(&[
        "limits",
        "set",
        "--resource",
        "gpt-4",
        "rpm:rate=2/min",
        "tpm:rate=100000/min,burst=200000",
        "--store",
        &st,
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).contains("tpm:rate=100000/min,burst=200000"),
        "{}",
        stdout(&o)
    );

    let o = tollgate(&[
        "limits",
        "get",
        "--resource",
        "gpt-4",
        "--store",
        &st,
        "--json",
    ]);
    assert_eq!(code(&o), 0);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["syntax"][0], "rpm:rate=2/min");
    assert_eq!(v["limits"][1]["capacity"], 200000);

    for _ in 0..2 {
        let o = tollgate(&[
            "acquire", "user-1", "gpt-4", "rpm=1", "tpm=500", "--store", &st,
        ]);
        assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
        assert!(stdout(&o).starts_with("admitted"), "{}", stdout(&o));
    }
    let o = tollgate(&["acquire", "user-1", "gpt-4", "rpm=1", "--store", &st]);
    assert_eq!(code(&o), 3, "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("EXCEEDED"), "{}", stdout(&o));

    let o = tollgate(&[
        "--json", "acquire", "user-1", "gpt-4", "rpm=1", "--store", &st,
    ]);
    assert_eq!(code(&o), 3);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["admitted"], false);
    assert_eq!(v["error"], "rate_limit_exceeded");
    assert!(v["retry_after_ms"].as_i64().unwrap() > 0);

    let o = tollgate(&["check", "user-1", "gpt-4", "--store", &st, "--json"]);
    assert_eq!(code(&o), 0);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["limits"][0]["available"], 0);
    // 1000 tokens spent, some dripped back since (100000/min).
    let tpm = v["limits"][1]["available"].as_i64().unwrap();
    assert!((199_000..200_000).contains(&tpm), "{tpm}");
    let o = tollgate(&["check", "user-1", "gpt-4", "rpm=1", "--store", &st]);
    assert_eq!(code(&o), 0);
    assert!(stdout(&o).contains("would be rejected"), "{}", stdout(&o));

    // Entity-level limits for one resource win over the resource's.
    let o = tollgate(&[
        "limits",
        "set",
        "--entity",
        "user-1",
        "--for-resource",
        "gpt-4",
        "rpd:quota=1000,cron=\"0 0 * * *\",tz=Europe/Berlin",
        "session:quota=10,after=5h",
        "--store",
        &st,
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = tollgate(&[
        "acquire",
        "user-1",
        "gpt-4",
        "rpd=1",
        "session=1",
        "--store",
        &st,
        "--json",
    ]);
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    let o = tollgate(&[
        "limits",
        "delete",
        "--entity",
        "user-1",
        "--for-resource",
        "gpt-4",
        "--store",
        &st,
    ]);
    assert_eq!(code(&o), 0);
    let o = tollgate(&["limits", "get", "--system", "--store", &st]);
    assert_eq!(code(&o), 0);
    assert!(stdout(&o).contains("no limits"), "{}", stdout(&o));
}

#[test]
fn bad_input_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let st = store(&dir);
    assert_eq!(
        code(&tollgate(&[
            "limits",
            "set",
            "--resource",
            "r",
            "rpm:rate=1/min",
            "--store",
            &st
        ])),
        0
    );
    for args in [
        vec!["acquire", "u", "r", "rpm=abc", "--store", &st],
        vec!["acquire", "u", "r", "rpm", "--store", &st],
        vec!["acquire", "u", "r", "--store", &st],
        vec!["acquire", "bad id", "r", "rpm=1", "--store", &st],
        vec!["acquire", "u", "r", "rpm=-1", "--store", &st],
        vec![
            "acquire",
            "u",
            "r",
            "rpm=99999999999999999999",
            "--store",
            &st,
        ],
        vec!["acquire", "u", "r", "nope=1", "--store", &st],
        vec!["acquire", "u", "unconfigured", "rpm=1", "--store", &st],
        vec![
            "limits",
            "set",
            "--resource",
            "r",
            "rpm:rate=60",
            "--store",
            &st,
        ],
        vec![
            "limits",
            "set",
            "--resource",
            "r",
            "rpm:quota=5",
            "--store",
            &st,
        ],
        vec![
            "limits",
            "set",
            "--system",
            "--resource",
            "r",
            "rpm:rate=1/s",
            "--store",
            &st,
        ],
        vec!["limits", "set", "rpm:rate=1/s", "--store", &st],
        vec![
            "limits",
            "get",
            "--resource",
            "r",
            "--for-resource",
            "x",
            "--store",
            &st,
        ],
        vec![
            "limits",
            "set",
            "--resource",
            "r",
            "rpm:rate=1/s",
            "--on-unavailable",
            "allow",
            "--store",
            &st,
        ],
        vec!["serve", "--store", "postgres:x"],
        vec!["no-such-command"],
    ] {
        let o = tollgate(&args);
        assert_eq!(code(&o), 2, "{args:?}: {}{}", stdout(&o), stderr(&o));
    }
    let o = tollgate(&["--json", "acquire", "u", "r", "nope=1", "--store", &st]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["error"], "unknown_limit");
}

#[test]
fn unavailable_store_exits_4_and_entities() {
    let o = tollgate(&[
        "acquire",
        "u",
        "r",
        "rpm=1",
        "--store",
        "sqlite:/nonexistent-dir/x/y.db",
    ]);
    assert_eq!(code(&o), 4, "{}", stderr(&o));
    let dir = tempfile::tempdir().unwrap();
    let st = store(&dir);
    let o = tollgate(&[
        "entity",
        "create",
        "acme",
        "--name",
        "Acme Inc",
        "--meta",
        "tier=gold",
        "--store",
        &st,
        "--json",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["metadata"]["tier"], "gold");
    assert_eq!(
        code(&tollgate(&["entity", "create", "acme", "--store", &st])),
        1
    );
    let o = tollgate(&["entity", "get", "acme", "--store", &st]);
    assert_eq!(code(&o), 0);
    assert!(stdout(&o).contains("Acme Inc"));
    assert_eq!(
        code(&tollgate(&["entity", "delete", "acme", "--store", &st])),
        0
    );
    let o = tollgate(&["entity", "get", "acme", "--store", &st, "--json"]);
    assert_eq!(code(&o), 1);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["error"], "entity_not_found");
}

#[test]
fn help_documents_the_limit_syntax() {
    let o = tollgate(&["limits", "set", "--help"]);
    assert_eq!(code(&o), 0);
    let t = stdout(&o);
    assert!(t.contains("NAME:rate=AMOUNT/PERIOD"), "{t}");
    assert!(t.contains("after=DURATION"), "{t}");
    assert_eq!(code(&tollgate(&["--version"])), 0);
}

#[test]
fn demo_runs_and_exits_0() {
    let o = tollgate(&["demo"]);
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    let t = stdout(&o);
    assert!(t.contains("429"), "{t}");
    assert!(t.contains("Retry-After"), "{t}");
    let o = tollgate(&["demo", "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["rejected_at"], 6);
}

#[test]
fn bench_http_refuses_non_loopback() {
    let o = tollgate(&[
        "bench-http",
        "--url",
        "http://10.0.0.1:8080",
        "--requests",
        "1",
    ]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
}

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

    // A lease never returns more than it consumed: exit 2, and the acquire's 10 stands.
    let o = tollgate(&[
        "--json", "acquire", "user-1", "gpt-4", "tpm=10", "--adjust", "tpm=-11", "--store", &st,
    ]);
    assert_eq!(code(&o), 2, "{}{}", stdout(&o), stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["error"], "invalid_adjustment");
    let o = tollgate(&[
        "acquire", "user-1", "gpt-4", "tpm=10", "--adjust", "tpm=-10", "--store", &st,
    ]);
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));

    let o = tollgate(&["check", "user-1", "gpt-4", "--store", &st, "--json"]);
    assert_eq!(code(&o), 0);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["limits"][0]["available"], 0);
    // 1010 tokens spent, some dripped back since (100000/min).
    let tpm = v["limits"][1]["available"].as_i64().unwrap();
    assert!((198_990..=200_000).contains(&tpm), "{tpm}");
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

#[test]
fn read_only_commands_never_create_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("typo.db");
    let st = format!("sqlite:{}", path.display());
    for args in [
        vec!["check", "user-1", "gpt-4", "--store", &st],
        vec!["limits", "get", "--system", "--store", &st],
        vec!["entity", "get", "acme", "--store", &st],
        vec!["acquire", "user-1", "gpt-4", "rpm=1", "--store", &st],
        vec!["limits", "delete", "--system", "--store", &st],
        vec!["entity", "delete", "acme", "--store", &st],
    ] {
        let o = tollgate(&args);
        assert_eq!(code(&o), 4, "{args:?}: {}{}", stdout(&o), stderr(&o));
        assert!(
            stderr(&o).contains(&format!("no such store: {st}")),
            "{args:?}: {}",
            stderr(&o)
        );
        assert!(!path.exists(), "{args:?} created {}", path.display());
    }
    let o = tollgate(&["--json", "limits", "get", "--system", "--store", &st]);
    assert_eq!(code(&o), 4);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["error"], "no_such_store");
    assert!(!path.exists());
    // A command that sets something creates it; then the readers work.
    let o = tollgate(&[
        "limits",
        "set",
        "--system",
        "rpm:rate=5/min",
        "--store",
        &st,
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(path.exists());
    let o = tollgate(&["limits", "get", "--system", "--store", &st]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("rpm:rate=5/min"), "{}", stdout(&o));
    let o = tollgate(&["check", "user-1", "gpt-4", "--store", &st]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    // A file that is not a tollgate store is refused by the readers, and left alone.
    let junk = dir.path().join("junk.db");
    std::fs::write(&junk, b"not sqlite at all").unwrap();
    let o = tollgate(&[
        "check",
        "u",
        "r",
        "--store",
        &format!("sqlite:{}", junk.display()),
    ]);
    assert_eq!(code(&o), 4, "{}", stderr(&o));
    assert_eq!(std::fs::read(&junk).unwrap(), b"not sqlite at all");
}

/// The time words after "in" parse as units: `29.9s`, `4m 30s`, `23h 59m 12s`.
fn human_units(after: &str) -> bool {
    let words: Vec<&str> = after
        .split_whitespace()
        .take_while(|w| {
            w.trim_end_matches(['d', 'h', 'm', 's'])
                .chars()
                .all(|c| c.is_ascii_digit() || c == '.')
        })
        .collect();
    !words.is_empty()
        && words.iter().all(|w| {
            let num = w
                .trim_end_matches("ms")
                .trim_end_matches(['d', 'h', 'm', 's']);
            !num.is_empty()
                && (w.ends_with('s') || w.ends_with('m') || w.ends_with('h') || w.ends_with('d'))
        })
}

#[test]
fn durations_read_as_time_and_rate_limits_say_full_again() {
    let dir = tempfile::tempdir().unwrap();
    let st = store(&dir);
    let o = tollgate(&[
        "limits",
        "set",
        "--resource",
        "gpt-4",
        "rpm:rate=2/min",
        "rpd:quota=100,cron=\"0 0 * * *\"",
        "--store",
        &st,
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = tollgate(&["acquire", "u", "gpt-4", "rpm=1", "rpd=1", "--store", &st]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    let rpm = out
        .lines()
        .find(|l| l.trim_start().starts_with("rpm"))
        .unwrap();
    let rpd = out
        .lines()
        .find(|l| l.trim_start().starts_with("rpd"))
        .unwrap();
    let (_, after) = rpm
        .split_once("full again in ")
        .unwrap_or_else(|| panic!("{rpm}"));
    assert!(human_units(after) && !after.contains(" s"), "{rpm}");
    assert!(!rpm.contains("resets in"), "{rpm}");
    let (_, after) = rpd
        .split_once("resets in ")
        .unwrap_or_else(|| panic!("{rpd}"));
    assert!(human_units(after), "{rpd}");
    assert!(
        after.contains('h') || after.contains('m'),
        "a day's quota resets in hours: {rpd}"
    );
    // Rejected: "retry in" also reads as time.
    tollgate(&["acquire", "u", "gpt-4", "rpm=1", "--store", &st]);
    let o = tollgate(&["acquire", "u", "gpt-4", "rpm=1", "--store", &st]);
    assert_eq!(code(&o), 3);
    let t = stdout(&o);
    let (_, after) = t.split_once("retry in ").unwrap_or_else(|| panic!("{t}"));
    assert!(human_units(after), "{t}");
}

#[test]
fn errors_in_our_words_naming_the_input() {
    let dir = tempfile::tempdir().unwrap();
    let st = store(&dir);
    let o = tollgate(&[
        "limits",
        "set",
        "--resource",
        "r",
        "rpd:quota=5,cron=\"0 25 * * *\"",
        "--store",
        &st,
    ]);
    assert_eq!(code(&o), 2);
    let e = stderr(&o);
    assert!(e.contains("\"0 25 * * *\""), "{e}");
    assert!(e.contains("the hour field has 25, outside 0-23"), "{e}");
    assert!(!e.contains("Component error"), "{e}");
    let o = tollgate(&[
        "limits",
        "set",
        "--resource",
        "r",
        "rpd:quota=5,cron=\"0 0 * * *\",tz=Europe/Berln",
        "--store",
        &st,
    ]);
    assert_eq!(code(&o), 2);
    assert!(
        stderr(&o).contains("time zone \"Europe/Berln\" is not a known IANA zone name"),
        "{}",
        stderr(&o)
    );
    // A table name DynamoDB would refuse is bad input (2), named, before any request.
    let o = tollgate(&["table", "create", "--table", "bad name!"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("table name \"bad name!\" contains ' '"),
        "{}",
        stderr(&o)
    );
    let o = tollgate(&["check", "u", "r", "--store", "dynamodb:x"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("table name \"x\" has 1 character(s)"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn json_usage_errors_are_json() {
    for args in [
        vec!["--json", "acquire", "u"],
        vec!["--json", "no-such-command"],
        vec!["acquire", "u", "r", "rpm=abc", "--json"],
        vec!["--json", "limits", "set", "--resource", "r", "rpm:rate=60"],
        vec!["--json", "serve", "--lease-ttl", "5"],
    ] {
        let o = tollgate(&args);
        assert_eq!(code(&o), 2, "{args:?}");
        let v: Value = serde_json::from_str(&stdout(&o))
            .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {}", stdout(&o)));
        assert_eq!(v["error"], "invalid_input", "{args:?}");
        assert!(
            v["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{args:?}"
        );
    }
    // Help is still help.
    let o = tollgate(&["--json", "--help"]);
    assert_eq!(code(&o), 0);
    assert!(stdout(&o).contains("EXIT CODES"));
}

#[test]
fn scope_is_spelled_as_in_the_http_api() {
    let dir = tempfile::tempdir().unwrap();
    let st = store(&dir);
    for (args, want) in [
        (vec!["--system"], "system"),
        (vec!["--resource", "gpt-4"], "resource:gpt-4"),
        (vec!["--entity", "user-1"], "entity:user-1"),
        (
            vec!["--entity", "user-1", "--for-resource", "openai/gpt-4"],
            "entity:user-1/resource:openai/gpt-4",
        ),
    ] {
        let mut a = vec!["--json", "limits", "set"];
        a.extend(&args);
        a.extend(["rpm:rate=1/min", "--store", &st]);
        let o = tollgate(&a);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert_eq!(v["scope"], want);
        let mut a = vec!["limits", "get"];
        a.extend(&args);
        a.extend(["--store", &st]);
        let o = tollgate(&a);
        assert!(
            stdout(&o).starts_with(&format!("{want}: 1 limit(s) stored")),
            "{}",
            stdout(&o)
        );
    }
}

#[cfg(feature = "dynamodb")]
#[test]
fn missing_aws_credentials_are_named() {
    let home = tempfile::tempdir().unwrap();
    let o = std::process::Command::new(common::BIN)
        .args(["check", "u", "r", "--store", "dynamodb:tollgate"])
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .unwrap();
    assert_eq!(code(&o), 4, "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("no AWS credentials for dynamodb:tollgate"),
        "{e}"
    );
    assert!(e.contains("AWS_ACCESS_KEY_ID"), "{e}");
    assert!(
        !e.contains("dispatch failure") && !e.contains("WARN"),
        "{e}"
    );
    let o = std::process::Command::new(common::BIN)
        .args(["--json", "table", "create", "--table", "tollgate"])
        .env_clear()
        .env("HOME", home.path())
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .unwrap();
    assert_eq!(code(&o), 4, "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["error"], "no_credentials");
    assert!(
        v["message"].as_str().unwrap().contains("no AWS region"),
        "{v}"
    );
}

/// With DynamoDB Local (`TOLLGATE_DYNAMODB_ENDPOINT`, as `scripts/test-all` sets it): a
/// missing table is "no such store", and the CLI works end to end on a created one.
#[cfg(feature = "dynamodb")]
#[test]
fn dynamodb_missing_table_and_end_to_end() {
    let Ok(ep) = std::env::var("TOLLGATE_DYNAMODB_ENDPOINT") else {
        eprintln!(
            "dynamodb_missing_table_and_end_to_end: TOLLGATE_DYNAMODB_ENDPOINT is not set; skipped"
        );
        return;
    };
    let table = format!("cli-{}-{}", std::process::id(), now_suffix());
    let st = format!("dynamodb:{table}");
    let o = tollgate(&["check", "u", "r", "--store", &st, "--endpoint", &ep]);
    assert_eq!(code(&o), 4, "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("no such store: {st} (the table does not exist")),
        "{}",
        stderr(&o)
    );
    // `serve` refuses to start on it (it never says "listening"), exit 4 naming the table.
    let o = tollgate(&[
        "serve",
        "--store",
        &st,
        "--endpoint",
        &ep,
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(code(&o), 4, "{}{}", stdout(&o), stderr(&o));
    assert!(!stdout(&o).contains("listening"), "{}", stdout(&o));
    assert!(stderr(&o).contains(&table), "{}", stderr(&o));
    let o = tollgate(&["table", "create", "--table", &table, "--endpoint", &ep]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = tollgate(&[
        "limits",
        "set",
        "--resource",
        "r",
        "rpm:rate=2/min",
        "--store",
        &st,
        "--endpoint",
        &ep,
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    for want in [0, 0, 3] {
        let o = tollgate(&[
            "acquire",
            "u",
            "r",
            "rpm=1",
            "--store",
            &st,
            "--endpoint",
            &ep,
        ]);
        assert_eq!(code(&o), want, "{}{}", stdout(&o), stderr(&o));
    }
    let o = tollgate(&[
        "--json",
        "check",
        "u",
        "r",
        "--store",
        &st,
        "--endpoint",
        &ep,
    ]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["limits"][0]["available"], 0);
}

#[cfg(feature = "dynamodb")]
fn now_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() % 1_000_000)
        .unwrap_or(0)
}

/// Merged limits from the command line (ADR-143): the resource level inherits the system's
/// tpm, excludes it, patches its schedule; `limits get` shows the flags; the system level
/// refuses them (exit 2).
#[test]
fn limits_set_inherit_exclude_patch() {
    let dir = tempfile::tempdir().unwrap();
    let st = store(&dir);
    let run = |args: &[&str]| {
        let mut a = args.to_vec();
        a.extend(["--store", &st]);
        tollgate(&a)
    };
    let o = run(&[
        "limits",
        "set",
        "--system",
        "rpm:rate=100/min",
        "tpm:rate=10000/day",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(&[
        "limits",
        "set",
        "--resource",
        "gpt-4",
        "--inherit",
        "rpm:rate=50/min",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("inherit_limits"), "{}", stdout(&o));
    // rpm 50 (own) and tpm 10000 (inherited): 10000 tpm admitted, 1 more refused.
    let o = run(&["acquire", "u1", "gpt-4", "rpm=1", "tpm=10000"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(&["acquire", "u1", "gpt-4", "tpm=1"]);
    assert_eq!(code(&o), 3, "{}", stdout(&o));
    let o = run(&[
        "limits",
        "set",
        "--resource",
        "gpt-4",
        "--inherit",
        "--exclude",
        "tpm",
        "rpm:rate=50/min",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(&["acquire", "u2", "gpt-4", "tpm=1"]);
    assert_eq!(code(&o), 2, "tpm excluded: unknown limit: {}", stderr(&o));
    let o = run(&[
        "limits",
        "set",
        "--resource",
        "gpt-4",
        "--inherit",
        "--patch",
        "tpm=* 22:00-06:00 500/500@UTC",
        "rpm:rate=50/min",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(&["limits", "get", "--resource", "gpt-4", "--json"]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["inherit_limits"], true, "{v}");
    assert_eq!(
        v["patch_limits"]["tpm"]["schedule"][0], "* 22:00-06:00 500/500",
        "{v}"
    );
    // Refused: flags on the system level; --exclude without --inherit.
    let o = run(&["limits", "set", "--system", "--inherit", "rpm:rate=1/min"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("system level"), "{}", stderr(&o));
    let o = run(&[
        "limits",
        "set",
        "--resource",
        "x",
        "--exclude",
        "tpm",
        "rpm:rate=1/min",
    ]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
}

/// `-N NAME`: a registered namespace has its own limits and buckets; an unregistered name
/// is refused; after `namespace delete` it cannot be opened (its name is free), and `recover`
/// brings it back.
#[test]
fn namespaces_keep_apart_and_soft_delete_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let st = store(&dir);
    let run = |args: &[&str]| {
        let mut a = args.to_vec();
        a.extend(["--store", &st]);
        tollgate(&a)
    };
    let o = run(&["namespace", "register", "acme", "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let id = v["namespaces"][0]["id"].as_str().unwrap().to_string();
    let o = run(&["limits", "get", "-N", "nobody", "--system"]);
    assert_ne!(code(&o), 0);
    assert!(stderr(&o).contains("nobody"), "{}", stderr(&o));
    let o = run(&["limits", "set", "-N", "acme", "--system", "rpm:rate=2/min"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    for _ in 0..2 {
        let o = run(&["acquire", "-N", "acme", "u1", "llm", "rpm=1"]);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    }
    let o = run(&["acquire", "-N", "acme", "u1", "llm", "rpm=1"]);
    assert_eq!(code(&o), 3);
    // The default namespace has no limits at all.
    let o = run(&["acquire", "u1", "llm", "rpm=1"]);
    assert_eq!(code(&o), 2, "no limits configured: {}", stderr(&o));
    let o = run(&["namespace", "list"]);
    assert!(
        stdout(&o).contains(&format!("acme  id {id}  active")),
        "{}",
        stdout(&o)
    );
    let o = run(&["namespace", "delete", "acme"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(&["acquire", "-N", "acme", "u1", "llm", "rpm=1"]);
    assert_ne!(code(&o), 0, "a deleted namespace cannot be opened");
    let o = run(&["namespace", "list", "--all", "--json"]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["namespaces"][0]["status"], "deleted", "{v}");
    let o = run(&["namespace", "recover", &id]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(&["acquire", "-N", "acme", "u1", "llm", "rpm=1"]);
    assert_eq!(code(&o), 3, "the data stayed: still exhausted");
}

/// `limits enforce` (ADR-151, a mode at any level): a resource in shadow mode admits a
/// drained entity, one entity enforced at its pair's level is refused (exit 3), a disabled
/// resource refuses, `clear` enforces again, `limits get` shows the level's mode, and a
/// bad mode is a usage error (exit 2).
#[test]
fn limits_enforce_at_a_level() {
    let dir = tempfile::tempdir().unwrap();
    let st = store(&dir);
    let run = |args: &[&str]| {
        let mut a = args.to_vec();
        a.extend(["--store", st.as_str()]);
        tollgate(&a)
    };
    assert_eq!(
        code(&run(&[
            "limits",
            "set",
            "--resource",
            "gpt-4",
            "rpm:rate=2/min"
        ])),
        0
    );
    for e in ["acme", "beta"] {
        assert_eq!(code(&run(&["acquire", e, "gpt-4", "rpm=2"])), 0);
        assert_eq!(code(&run(&["acquire", e, "gpt-4", "rpm=1"])), 3);
    }
    let o = run(&[
        "limits",
        "enforce",
        "--resource",
        "gpt-4",
        "--mode",
        "bypass",
        "--json",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["mode"], "bypass", "{v}");
    let o = run(&["limits", "get", "--resource", "gpt-4"]);
    assert!(stdout(&o).contains("mode: bypass"), "{}", stdout(&o));
    let o = run(&["limits", "get", "--resource", "gpt-4", "--json"]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["enforcement"], "bypass", "{v}");
    for e in ["acme", "beta"] {
        assert_eq!(
            code(&run(&["acquire", e, "gpt-4", "rpm=1"])),
            0,
            "{e} bypassed"
        );
    }
    let o = run(&[
        "limits",
        "enforce",
        "--entity",
        "acme",
        "--for-resource",
        "gpt-4",
        "--mode",
        "enforce",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(
        code(&run(&["acquire", "acme", "gpt-4", "rpm=1"])),
        3,
        "acme excepted"
    );
    assert_eq!(code(&run(&["acquire", "beta", "gpt-4", "rpm=1"])), 0);
    assert_eq!(
        code(&run(&[
            "limits",
            "enforce",
            "--resource",
            "gpt-4",
            "--mode",
            "disabled"
        ])),
        0
    );
    let o = run(&["acquire", "beta", "gpt-4", "rpm=1"]);
    assert!(stderr(&o).contains("disabled"), "{}", stderr(&o));
    assert_ne!(code(&o), 0);
    assert_eq!(
        code(&run(&[
            "limits",
            "enforce",
            "--resource",
            "gpt-4",
            "--mode",
            "clear"
        ])),
        0
    );
    // beta's balance was never debited while bypassed: still drained.
    assert_eq!(code(&run(&["acquire", "beta", "gpt-4", "rpm=1"])), 3);
    assert_eq!(
        code(&run(&[
            "limits",
            "enforce",
            "--resource",
            "gpt-4",
            "--mode",
            "maybe"
        ])),
        2
    );
}

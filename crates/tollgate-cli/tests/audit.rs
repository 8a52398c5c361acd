//! The audit log from the command line: every command that changes stored configuration
//! writes one record with the principal (`--principal`, else `$USER`), read back with
//! `tollgate audit list`; the commands are enumerated from the binary's own help, so a new
//! command must be classified here (administrative ones get a case).

mod common;

use std::collections::BTreeSet;
use std::process::{Command, Output};

use common::{code, stderr, stdout, tollgate, BIN};
use serde_json::Value;

/// Commands that change stored configuration (`doctor` with `--repair`): each has a case
/// below.
const ADMIN: [&str; 15] = [
    "limits set",
    "limits delete",
    "limits apply",
    "entity create",
    "entity delete",
    "entity move",
    "entity reset",
    "entity top-up",
    "entity enforce",
    "limits enforce",
    "doctor",
    "namespace register",
    "namespace delete",
    "namespace recover",
    "namespace purge",
];
/// Commands that do not change stored configuration (or run something that does, through
/// the audited paths: `serve`, `demo`), and `audit purge` (retention).
const OTHER: [&str; 17] = [
    "serve",
    "acquire",
    "check",
    "limits get",
    "limits plan",
    "aggregate",
    "usage list",
    "usage summary",
    "table create",
    "entity get",
    "audit list",
    "audit purge",
    "demo",
    "bench-http",
    "help",
    "namespace list",
    "namespace show",
];

/// The subcommands a help text lists under `Commands:`.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Every leaf command of the binary, as `"limits set"`.
fn leaves(prefix: &[String]) -> Vec<String> {
    let mut args: Vec<&str> = prefix.iter().map(String::as_str).collect();
    args.push("--help");
    let o = tollgate(&args);
    let subs = subcommands(&stdout(&o));
    if subs.is_empty() || prefix.last().is_some_and(|l| l == "help") {
        return vec![prefix.join(" ")];
    }
    let mut out = Vec::new();
    for s in subs {
        if s == "help" && !prefix.is_empty() {
            continue;
        }
        let mut p = prefix.to_vec();
        p.push(s);
        out.extend(leaves(&p));
    }
    out
}

fn as_user(user: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "error")
        .env("USER", user)
        .env_remove("TOLLGATE_STORE")
        .env_remove("TOLLGATE_PRINCIPAL")
        .output()
        .expect("run tollgate")
}

fn newest(st: &str, n: usize) -> Vec<Value> {
    let o = tollgate(&["audit", "list", "--json", "--limit", "1000", "--store", st]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let rs = v["records"].as_array().cloned().unwrap_or_default();
    assert_eq!(rs.len(), n, "{v}");
    rs
}

fn rpm(image: &Value) -> Option<i64> {
    image["limits"]
        .as_array()?
        .iter()
        .find(|l| l["name"] == "rpm")?["capacity"]
        .as_i64()
}

#[test]
fn every_admin_command_writes_one_record_with_its_principal() {
    let found: BTreeSet<String> = leaves(&[]).into_iter().collect();
    let known: BTreeSet<String> = ADMIN.iter().chain(&OTHER).map(|s| s.to_string()).collect();
    assert_eq!(
        found, known,
        "a command is neither an audited administrative command nor classified as other"
    );

    let dir = tempfile::tempdir().unwrap();
    let st = format!("sqlite:{}", dir.path().join("a.db").display());
    // (args, principal, action, target level, rpm before, rpm after)
    type Case<'a> = (
        Vec<&'a str>,
        &'a str,
        &'a str,
        &'a str,
        Option<i64>,
        Option<i64>,
    );
    let cases: Vec<Case> = vec![
        (
            vec!["limits", "set", "--system", "rpm:rate=10/min"],
            "bob",
            "limits.set",
            "system",
            None,
            Some(10),
        ),
        (
            vec![
                "limits",
                "set",
                "--resource",
                "gpt-4",
                "rpm:rate=20/min",
                "--principal",
                "alice",
            ],
            "alice",
            "limits.set",
            "resource",
            None,
            Some(20),
        ),
        (
            vec![
                "entity",
                "create",
                "u1",
                "--name",
                "User one",
                "--parent",
                "team",
                "--principal",
                "alice",
            ],
            "alice",
            "entity.create",
            "entity",
            None,
            None,
        ),
        (
            vec![
                "limits",
                "set",
                "--entity",
                "u1",
                "--for-resource",
                "gpt-4",
                "rpm:rate=5/min",
            ],
            "bob",
            "limits.set",
            "entity",
            None,
            Some(5),
        ),
        (
            vec![
                "limits",
                "set",
                "--entity",
                "u1",
                "--for-resource",
                "gpt-4",
                "rpm:rate=6/min",
            ],
            "bob",
            "limits.set",
            "entity",
            Some(5),
            Some(6),
        ),
        (
            vec!["entity", "move", "u1", "--root", "--principal", "erin"],
            "erin",
            "entity.move",
            "entity",
            None,
            None,
        ),
        (
            vec![
                "entity",
                "top-up",
                "u1",
                "gpt-4",
                "rpm=2",
                "--principal",
                "dave",
            ],
            "dave",
            "bucket.top_up",
            "entity",
            None,
            None,
        ),
        (
            vec!["entity", "reset", "u1", "gpt-4", "--op", "support-42"],
            "bob",
            "bucket.reset",
            "entity",
            None,
            None,
        ),
        (
            vec![
                "entity",
                "enforce",
                "u1",
                "gpt-4",
                "--mode",
                "bypass",
                "--principal",
                "frank",
            ],
            "frank",
            "resource.enforcement",
            "entity",
            None,
            None,
        ),
        (
            vec![
                "limits",
                "enforce",
                "--resource",
                "gpt-4",
                "--mode",
                "bypass",
                "--principal",
                "gina",
            ],
            "gina",
            "resource.enforcement",
            "resource",
            Some(20),
            Some(20),
        ),
        (
            vec![
                "limits",
                "delete",
                "--entity",
                "u1",
                "--for-resource",
                "gpt-4",
                "--principal",
                "carol",
            ],
            "carol",
            "limits.delete",
            "entity",
            Some(6),
            None,
        ),
        (
            vec!["limits", "delete", "--resource", "gpt-4"],
            "bob",
            "limits.delete",
            "resource",
            Some(20),
            None,
        ),
        (
            vec!["entity", "delete", "u1", "--principal", "alice"],
            "alice",
            "entity.delete",
            "entity",
            None,
            None,
        ),
    ];
    let mut covered = BTreeSet::new();
    for (i, (args, principal, action, level, before, after)) in cases.iter().enumerate() {
        covered.insert(format!("{} {}", args[0], args[1]));
        let mut full = args.clone();
        full.extend(["--store", &st]);
        let o = as_user("bob", &full);
        assert_eq!(code(&o), 0, "{args:?}: {}{}", stdout(&o), stderr(&o));
        let rs = newest(&st, i + 1);
        let r = &rs[0];
        assert_eq!(r["action"], *action, "{args:?}: {r}");
        assert_eq!(r["principal"], *principal, "{args:?}: {r}");
        assert_eq!(r["level"], *level, "{args:?}: {r}");
        assert_eq!(rpm(&r["before"]), *before, "{args:?}: {r}");
        assert_eq!(rpm(&r["after"]), *after, "{args:?}: {r}");
    }
    let rs = newest(&st, cases.len());
    assert_eq!(rs[0]["before"]["entity"]["name"], "User one", "{}", rs[0]);
    assert_eq!(rs[10]["after"]["name"], "User one");

    // `doctor --repair` over a corrupt bucket: one record, before its deletes.
    let o = as_user(
        "bob",
        &[
            "limits",
            "set",
            "--resource",
            "llm",
            "rpm:rate=9/min",
            "--store",
            &st,
        ],
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = tollgate(&["acquire", "u9", "llm", "rpm=1", "--store", &st]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let db = dir.path().join("a.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    let n = conn
        .execute(
            "UPDATE items SET item = json_set(item, '$.b_rpm_tk', json('{\"s\":\"x\"}')) WHERE pk = ?1",
            rusqlite::params!["default/BUCKET#u9#llm#0"],
        )
        .unwrap();
    assert_eq!(n, 1);
    drop(conn);
    let o = as_user(
        "bob",
        &["doctor", "--repair", "--principal", "medic", "--store", &st],
    );
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    covered.insert("doctor".to_string());
    let rs = newest(&st, cases.len() + 2);
    assert_eq!(rs[0]["action"], "buckets.repair", "{}", rs[0]);
    assert_eq!(rs[0]["principal"], "medic");
    assert_eq!(rs[0]["resource"], "llm");
    assert_eq!(rs[0]["before"]["items"], 1);
    // `limits apply` of a file that matches the store but for one level: one record.
    let file = dir.path().join("limits.toml");
    std::fs::write(
        &file,
        "[system.limits]\nrpm = { capacity = 10, refill_amount = 10 }\n\
         [resources.llm.limits]\nrpm = { capacity = 9, refill_amount = 9 }\n\
         [resources.gpt-4.limits]\nrpm = { capacity = 30, refill_amount = 30 }\n",
    )
    .unwrap();
    let f = file.display().to_string();
    let o = as_user(
        "bob",
        &[
            "limits",
            "apply",
            "-f",
            &f,
            "--principal",
            "gitops",
            "--store",
            &st,
        ],
    );
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    covered.insert("limits apply".to_string());
    let rs = newest(&st, cases.len() + 3);
    assert_eq!(rs[0]["action"], "limits.set", "{}", rs[0]);
    assert_eq!(rs[0]["principal"], "gitops");
    assert_eq!(rs[0]["level"], "resource");
    assert_eq!(rpm(&rs[0]["before"]), None);
    assert_eq!(rpm(&rs[0]["after"]), Some(30));
    covered.extend(namespace_commands(&st));
    let admin: BTreeSet<String> = ADMIN.iter().map(|s| s.to_string()).collect();
    assert_eq!(covered, admin, "every administrative command has a case");
    let base = cases.len() + 3;

    // A refused change writes nothing.
    let o = as_user("bob", &["entity", "create", "dup", "--store", &st]);
    assert_eq!(code(&o), 0);
    let o = as_user("bob", &["entity", "create", "dup", "--store", &st]);
    assert_eq!(code(&o), 1, "exists");
    let o = as_user(
        "bob",
        &[
            "limits",
            "set",
            "--system",
            "--principal",
            "",
            "rpm:rate=1/min",
            "--store",
            &st,
        ],
    );
    assert_eq!(
        code(&o),
        2,
        "an empty principal is bad input: {}",
        stderr(&o)
    );
    newest(&st, base + 1);

    // Text: one block per record; filters; pages.
    let o = tollgate(&["audit", "list", "--entity", "u1", "--store", &st]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let text = stdout(&o);
    let heads: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with(' '))
        .map(|l| l.split_whitespace().nth(3).unwrap_or("?"))
        .collect();
    assert_eq!(
        heads,
        [
            "entity.delete",
            "limits.delete",
            "resource.enforcement",
            "bucket.reset",
            "bucket.top_up",
            "entity.move",
            "limits.set",
            "limits.set",
            "entity.create"
        ],
        "{text}"
    );
    assert!(
        text.contains("alice") && text.contains("entity:u1/resource:gpt-4"),
        "{text}"
    );
    let o = tollgate(&["audit", "list", "--limit", "3", "--json", "--store", &st]);
    let p: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(p["records"].as_array().map(Vec::len), Some(3));
    let c = p["next_cursor"].as_str().unwrap();
    let o = tollgate(&[
        "audit", "list", "--limit", "1000", "--cursor", c, "--json", "--store", &st,
    ]);
    let p2: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(p2["records"].as_array().map(Vec::len), Some(base + 1 - 3));
    let o = tollgate(&["audit", "list", "--limit", "0", "--store", &st]);
    assert_eq!(code(&o), 2);
    let o = tollgate(&["audit", "list", "--cursor", "zzz", "--store", &st]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let o = tollgate(&["audit", "purge", "--json", "--store", &st]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(
        serde_json::from_str::<Value>(&stdout(&o)).unwrap()["purged"],
        0
    );
}

/// The registry's commands: register, delete, recover, delete, purge `acme`, each one
/// record in the registry's log (`audit list --namespaces`) with its principal; the
/// namespace's own log is untouched. Returns the commands covered.
fn namespace_commands(st: &str) -> Vec<String> {
    let before = tollgate(&["audit", "list", "--json", "--limit", "1000", "--store", st]);
    let o = as_user(
        "carol",
        &["namespace", "register", "acme", "--json", "--store", st],
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let id = v["namespaces"][0]["id"].as_str().unwrap().to_string();
    let steps: Vec<Vec<&str>> = vec![
        vec!["namespace", "delete", "acme"],
        vec!["namespace", "recover", &id],
        vec!["namespace", "delete", "acme", "--principal", "dave"],
        vec!["namespace", "purge", &id, "-y"],
    ];
    for a in &steps {
        let mut full = a.clone();
        full.extend(["--store", st]);
        let o = as_user("carol", &full);
        assert_eq!(code(&o), 0, "{a:?}: {}{}", stdout(&o), stderr(&o));
    }
    let o = tollgate(&[
        "audit",
        "list",
        "--namespaces",
        "--json",
        "--limit",
        "1000",
        "--store",
        st,
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let got: Vec<(String, String)> = v["records"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .map(|r| {
            assert_eq!(r["namespace"], "acme", "{r}");
            (
                r["action"].as_str().unwrap().to_string(),
                r["principal"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = [
        ("namespace.register", "carol"),
        ("namespace.delete", "carol"),
        ("namespace.recover", "carol"),
        ("namespace.delete", "dave"),
        ("namespace.purge", "carol"),
    ]
    .iter()
    .map(|(a, p)| (a.to_string(), p.to_string()))
    .collect();
    assert_eq!(got, want);
    let after = tollgate(&["audit", "list", "--json", "--limit", "1000", "--store", st]);
    assert_eq!(
        stdout(&before),
        stdout(&after),
        "the namespace's log is untouched"
    );
    // A purge without --yes is refused (exit 2) and writes nothing.
    let o = as_user("carol", &["namespace", "purge", &id, "--store", st]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    [
        "namespace register",
        "namespace delete",
        "namespace recover",
        "namespace purge",
    ]
    .map(str::to_string)
    .to_vec()
}

/// A record past its retention is never listed, and `audit purge` deletes it.
#[test]
fn retention_hides_and_purge_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let st = format!("sqlite:{}", dir.path().join("r.db").display());
    let o = tollgate(&[
        "limits",
        "set",
        "--system",
        "rpm:rate=1/min",
        "--audit-retention",
        "4s",
        "--store",
        &st,
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = tollgate(&[
        "limits",
        "set",
        "--resource",
        "r",
        "rpm:rate=1/min",
        "--store",
        &st,
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    // Listed within the first record's retention: 4 s, less up to one for its expiry's
    // whole seconds (with 1 s, a record written late in a second could expire before a
    // loaded machine ran the next two commands).
    newest(&st, 2);
    std::thread::sleep(std::time::Duration::from_millis(5_100));
    let rs = newest(&st, 1);
    assert_eq!(rs[0]["level"], "resource");
    let o = tollgate(&["audit", "purge", "--json", "--store", &st]);
    assert_eq!(
        serde_json::from_str::<Value>(&stdout(&o)).unwrap()["purged"],
        1
    );
}

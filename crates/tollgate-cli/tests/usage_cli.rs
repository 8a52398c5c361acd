//! `tollgate aggregate` and `tollgate usage` as a user runs them, on a SQLite file.

mod common;

use common::{code, stderr, stdout, tollgate};
use serde_json::Value;

/// Run `tollgate` with `args`, which must succeed; its stdout.
fn ok(args: &[&str]) -> String {
    let o = tollgate(args);
    assert_eq!(code(&o), 0, "{args:?}: {}{}", stdout(&o), stderr(&o));
    stdout(&o)
}

#[test]
fn aggregate_then_usage_list_and_summary() {
    let dir = tempfile::tempdir().unwrap();
    let st = format!("sqlite:{}", dir.path().join("u.db").display());
    ok(&[
        "limits",
        "set",
        "--resource",
        "gpt",
        "rpm:rate=100/min",
        "tpm:rate=100000/min",
        "--store",
        &st,
    ]);
    ok(&["acquire", "u1", "gpt", "rpm=1", "tpm=500", "--store", &st]);
    ok(&[
        "acquire", "u1", "gpt", "rpm=1", "tpm=300", "--adjust", "tpm=-100", "--store", &st,
    ]);
    ok(&["acquire", "u2", "gpt", "rpm=1", "tpm=42", "--store", &st]);
    let v: Value =
        serde_json::from_str(&ok(&["--json", "aggregate", "--once", "--store", &st])).unwrap();
    assert_eq!(v["usage_changes"], 4, "{v}");
    assert_eq!(v["commits"], 1, "{v}");
    // Run again: nothing is counted twice.
    let v: Value =
        serde_json::from_str(&ok(&["--json", "aggregate", "--once", "--store", &st])).unwrap();
    assert_eq!(v["usage_changes"], 0, "{v}");

    let v: Value = serde_json::from_str(&ok(&[
        "--json", "usage", "list", "--entity", "u1", "--window", "daily", "--store", &st,
    ]))
    .unwrap();
    let s = &v["snapshots"][0];
    assert_eq!(s["requests"], 2, "{v}");
    assert_eq!(s["consumed_milli"]["tpm"], 700_000);
    assert_eq!(s["consumed_milli"]["rpm"], 2000);

    let text = ok(&[
        "usage",
        "list",
        "--resource",
        "gpt",
        "--window",
        "daily",
        "--store",
        &st,
    ]);
    assert!(
        text.contains("u1 / gpt  requests=2  rpm=2 tpm=700"),
        "{text}"
    );
    assert!(
        text.contains("u2 / gpt  requests=1  rpm=1 tpm=42"),
        "{text}"
    );

    let text = ok(&[
        "usage", "summary", "--entity", "u1", "--limit", "tpm", "--plot", "--store", &st,
    ]);
    assert!(
        text.contains("2 request(s)") && text.contains("tpm: 700"),
        "{text}"
    );
    assert!(text.contains("tpm per window"), "{text}");
    assert!(
        text.chars().any(|c| ('\u{2801}'..='\u{28FF}').contains(&c)),
        "{text}"
    );

    // Bad input: exit 2.
    let o = tollgate(&["usage", "list", "--store", &st]);
    assert_eq!(code(&o), 2, "{}{}", stdout(&o), stderr(&o));
    let o = tollgate(&[
        "usage", "list", "--entity", "u1", "--window", "weekly", "--store", &st,
    ]);
    assert_eq!(code(&o), 2);
    let o = tollgate(&[
        "usage", "summary", "--entity", "u1", "--limit", "nope", "--store", &st,
    ]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
}

/// `--feed-retention` bounds what an embedded store's feed keeps: with `0s` the changes an
/// aggregator counted leave the file at once; by default (24 h) they stay for other
/// consumers. The usage counted is the same either way.
#[test]
fn feed_retention_trims_counted_changes_from_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, extra: &[&str]| -> (i64, Value) {
        let path = dir.path().join(name);
        let st = format!("sqlite:{}", path.display());
        ok(&[
            "limits",
            "set",
            "--resource",
            "gpt",
            "rpm:rate=100/min",
            "--store",
            &st,
        ]);
        for e in ["u1", "u2", "u1"] {
            ok(&["acquire", e, "gpt", "rpm=1", "--store", &st]);
        }
        let mut args = vec!["--json", "aggregate", "--once", "--store", &st];
        args.extend_from_slice(extra);
        let v: Value = serde_json::from_str(&ok(&args)).unwrap();
        assert_eq!(v["usage_changes"], 3, "{v}");
        let usage: Value = serde_json::from_str(&ok(&[
            "--json", "usage", "list", "--entity", "u1", "--window", "daily", "--store", &st,
        ]))
        .unwrap();
        let raw = rusqlite::Connection::open(&path).unwrap();
        let kept: i64 = raw
            .query_row("SELECT count(*) FROM changes", [], |r| r.get(0))
            .unwrap();
        (kept, usage["snapshots"][0]["requests"].clone())
    };
    let (kept_default, requests_default) = run("default.db", &[]);
    let (kept_zero, requests_zero) = run("zero.db", &["--feed-retention", "0s"]);
    assert_eq!(requests_default, 2);
    assert_eq!(requests_zero, 2);
    // Kept by default: at least the acquires' writes (3 buckets written, limits, ...).
    assert!(kept_default >= 3, "default retention kept {kept_default}");
    // Trimmed through the cursor: only what the pass itself wrote after it remains.
    assert!(
        kept_zero < kept_default,
        "0s retention kept {kept_zero} of {kept_default} changes"
    );
}

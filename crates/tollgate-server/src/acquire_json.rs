//! The body of an admitted acquire (`POST /v1/acquire`, `200`), written directly:
//! `{"lease_id":…,"lease_expires_at_ms":…,"statuses":[…],"degraded":…}`, byte for byte what
//! serde_json writes for the same fields (test `written_as_serde_json_writes_it`).
//!
//! Every admitted acquire answers with it. Through serde_json every key and string value
//! went through its escaping loop and every field through a trait call (about 3,100
//! instructions for one limit, callgrind); here the keys are constants, and a string value
//! that needs no escape is copied as it is.

use tollgate_core::LimitStatus;

/// Append the body of an admitted acquire to `out`.
pub(crate) fn write_acquire_ok(
    out: &mut Vec<u8>,
    lease_id: Option<&str>,
    lease_expires_at_ms: Option<i64>,
    statuses: &[LimitStatus],
    degraded: bool,
) {
    out.extend_from_slice(b"{\"lease_id\":");
    match lease_id {
        Some(id) => string(out, id),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"lease_expires_at_ms\":");
    opt_int(out, lease_expires_at_ms);
    out.extend_from_slice(b",\"statuses\":[");
    for (i, s) in statuses.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        status(out, s);
    }
    out.extend_from_slice(b"],\"degraded\":");
    boolean(out, degraded);
    out.push(b'}');
}

/// One status, its fields in `LimitStatus`'s order (its derived `Serialize`).
fn status(out: &mut Vec<u8>, s: &LimitStatus) {
    out.extend_from_slice(b"{\"limit\":");
    string(out, &s.limit);
    out.extend_from_slice(b",\"kind\":");
    string(out, &s.kind);
    out.extend_from_slice(b",\"capacity\":");
    int(out, s.capacity);
    out.extend_from_slice(b",\"available\":");
    int(out, s.available);
    out.extend_from_slice(b",\"requested\":");
    int(out, s.requested);
    out.extend_from_slice(b",\"exceeded\":");
    boolean(out, s.exceeded);
    out.extend_from_slice(b",\"retry_after_ms\":");
    opt_int(out, s.retry_after_ms);
    out.extend_from_slice(b",\"resets_at_ms\":");
    opt_int(out, s.resets_at_ms);
    out.push(b'}');
}

/// A JSON string: copied between quotes when no byte needs an escape
/// ([`tollgate_core::json_text::is_plain_json_string`]), else written by serde_json.
fn string(out: &mut Vec<u8>, s: &str) {
    if tollgate_core::json_text::is_plain_json_string(s) {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else if serde_json::to_writer(&mut *out, s).is_err() {
        // Writing a `str` into a `Vec` cannot fail; should it, the answer stays JSON.
        out.extend_from_slice(b"\"\"");
    }
}

fn int(out: &mut Vec<u8>, n: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

fn opt_int(out: &mut Vec<u8>, n: Option<i64>) {
    match n {
        Some(n) => int(out, n),
        None => out.extend_from_slice(b"null"),
    }
}

fn boolean(out: &mut Vec<u8>, b: bool) {
    out.extend_from_slice(if b { b"true" } else { b"false" });
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What serde_json writes for an admitted acquire: the struct the route serialised
    /// before this module wrote it.
    #[derive(serde::Serialize)]
    struct AcquireOk<'a> {
        lease_id: Option<String>,
        lease_expires_at_ms: Option<i64>,
        statuses: &'a [LimitStatus],
        degraded: bool,
    }

    /// Text with every kind of byte serde_json treats apart: control bytes, `"`, `\`, DEL,
    /// non-ASCII.
    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9_]{0,12}",
            "[a-z\"\\\x00-\x1f\x7f\u{e9}\u{2028}\u{1F600}]{0,10}",
            any::<String>(),
        ]
    }

    fn a_status() -> impl Strategy<Value = LimitStatus> {
        (
            text(),
            prop_oneof![Just("rate".to_string()), Just("quota".to_string()), text()],
            any::<i64>(),
            any::<i64>(),
            any::<i64>(),
            any::<bool>(),
            any::<Option<i64>>(),
            any::<Option<i64>>(),
        )
            .prop_map(
                |(limit, kind, capacity, available, requested, exceeded, retry, resets)| {
                    LimitStatus {
                        limit: limit.into(),
                        kind: kind.into(),
                        capacity,
                        available,
                        requested,
                        exceeded,
                        retry_after_ms: retry,
                        resets_at_ms: resets,
                    }
                },
            )
    }

    proptest! {
        /// Any strings (control bytes, quotes, backslashes, non-ASCII), any numbers, absent
        /// or present options, zero to three statuses: the same bytes as serde_json's.
        #[test]
        fn written_as_serde_json_writes_it(
            lease_id in proptest::option::of(text()),
            expires in any::<Option<i64>>(),
            statuses in proptest::collection::vec(a_status(), 0..4),
            degraded in any::<bool>(),
        ) {
            let mut ours = Vec::new();
            write_acquire_ok(&mut ours, lease_id.as_deref(), expires, &statuses, degraded);
            let serde = serde_json::to_vec(&AcquireOk {
                lease_id,
                lease_expires_at_ms: expires,
                statuses: &statuses,
                degraded,
            })
            .unwrap();
            prop_assert_eq!(String::from_utf8_lossy(&ours), String::from_utf8_lossy(&serde));
        }
    }

    #[test]
    fn a_plain_answer_reads_as_json() {
        let mut out = Vec::new();
        let s = LimitStatus {
            limit: "rps".into(),
            kind: "rate".into(),
            capacity: 10,
            available: 9,
            requested: 1,
            exceeded: false,
            retry_after_ms: None,
            resets_at_ms: Some(1_000),
        };
        write_acquire_ok(&mut out, Some("tok\"en"), Some(5), &[s], false);
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"lease_id":"tok\"en","lease_expires_at_ms":5,"statuses":[{"limit":"rps","kind":"rate","capacity":10,"available":9,"requested":1,"exceeded":false,"retry_after_ms":null,"resets_at_ms":1000}],"degraded":false}"#
        );
    }
}

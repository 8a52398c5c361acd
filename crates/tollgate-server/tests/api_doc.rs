//! `docs/http-api.md` against the server: every route (method, path, role), every error code
//! (with its status) and every `LimitSpec` field is documented, and nothing documented is
//! missing from the server.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use tollgate::{LimitSpec, Limiter};
use tollgate_server::{routes, RouteInfo, Server, ServerConfig};
use tollgate_store::MemoryStore;
use tower::ServiceExt;

fn doc() -> String {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/http-api.md");
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("read {p}: {e}"))
}

/// The rows of the first table under `## {heading}`, as trimmed cells with backticks removed.
fn table(doc: &str, heading: &str) -> Vec<Vec<String>> {
    let start = doc
        .find(&format!("\n## {heading}\n"))
        .unwrap_or_else(|| panic!("no section {heading:?}"));
    let section = &doc[start + 1..];
    let end = section[3..].find("\n## ").map_or(section.len(), |i| i + 3);
    let section = &section[..end];
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in section.lines() {
        if line.starts_with('|') {
            in_table = true;
            let cells: Vec<String> = line
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().replace('`', ""))
                .collect();
            if cells.iter().all(|c| c.chars().all(|ch| ch == '-')) {
                continue;
            }
            rows.push(cells);
        } else if in_table {
            break;
        }
    }
    // Without the header row.
    rows.into_iter().skip(1).collect()
}

fn role_name(r: &RouteInfo) -> &'static str {
    match r.needs {
        None => "public",
        Some(role) => role.as_str(),
    }
}

/// What differs between the route table and the document's.
fn route_drift(routes: &[RouteInfo], doc: &str) -> Vec<String> {
    let have: BTreeSet<(String, String, String)> = routes
        .iter()
        .map(|r| (r.method.into(), r.path.into(), role_name(r).into()))
        .collect();
    let documented: BTreeSet<(String, String, String)> = table(doc, "Routes")
        .into_iter()
        .map(|c| (c[0].clone(), c[1].clone(), c[2].clone()))
        .collect();
    let mut out = Vec::new();
    for r in have.difference(&documented) {
        out.push(format!("undocumented route: {} {} ({})", r.0, r.1, r.2));
    }
    for r in documented.difference(&have) {
        out.push(format!(
            "documented but not served: {} {} ({})",
            r.0, r.1, r.2
        ));
    }
    out
}

#[test]
fn every_route_is_documented_with_its_role() {
    let drift = route_drift(&routes(), &doc());
    assert!(
        drift.is_empty(),
        "docs/http-api.md is out of date:\n{}",
        drift.join("\n")
    );
    assert_eq!(routes().len(), 39);
}

#[test]
fn a_route_added_without_documentation_is_caught() {
    let mut r = routes();
    r.push(RouteInfo {
        method: "POST",
        path: "/v1/new-thing",
        needs: None,
    });
    assert_eq!(
        route_drift(&r, &doc()),
        vec!["undocumented route: POST /v1/new-thing (public)".to_string()]
    );
    // A role changed without the document is caught too.
    let mut r = routes();
    r[0].needs = None;
    assert_eq!(route_drift(&r, &doc()).len(), 2);
}

#[test]
fn every_error_code_is_documented_with_its_status() {
    let have: BTreeSet<(String, String)> = tollgate_server::error::CODES
        .iter()
        .map(|(c, s, _)| (c.to_string(), s.to_string()))
        .collect();
    let documented: BTreeSet<(String, String)> = table(&doc(), "Errors")
        .into_iter()
        .map(|c| (c[0].clone(), c[1].clone()))
        .collect();
    assert_eq!(
        have.symmetric_difference(&documented).collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "error codes and docs/http-api.md differ"
    );
    assert_eq!(have.len(), 41);
}

#[test]
fn every_limit_spec_field_is_documented() {
    let full = LimitSpec {
        name: "x".into(),
        capacity: 1,
        refill_amount: Some(1),
        refill_period_ms: Some(1),
        reset_cron: Some("0 0 * * *".into()),
        reset_tz: Some("UTC".into()),
        reset_after_s: Some(1),
        schedule: Some(vec![]),
        schedule_tz: Some("UTC".into()),
        soft: true,
    };
    let v = serde_json::to_value(&full).unwrap();
    let have: BTreeSet<String> = v.as_object().unwrap().keys().cloned().collect();
    let documented: BTreeSet<String> = table(&doc(), "LimitSpec")
        .into_iter()
        .map(|c| c[0].clone())
        .collect();
    assert_eq!(have, documented);
    assert!(have.contains("schedule"));
}

/// The route table is the router: each documented route reaches a handler (not the
/// fallback's `not_found` / `method_not_allowed`).
#[tokio::test]
async fn every_table_route_reaches_a_handler() {
    let limiter = Limiter::new(Arc::new(MemoryStore::new())).unwrap();
    let app = Server::new(limiter, ServerConfig::default()).router();
    for r in routes() {
        let uri = r
            .path
            .replace("{id}", "x1")
            .replace("{entity}", "e1")
            .replace("{*resource}", "r1");
        let uri = if uri == "/v1/availability" && r.method == "GET" {
            "/v1/availability?entity=e1&resource=r1".to_string()
        } else {
            uri
        };
        let req = Request::builder()
            .method(r.method)
            .uri(&uri)
            .body(Body::from("{}"))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        let code = v["error"].as_str().unwrap_or("");
        assert!(
            code != "not_found" && code != "method_not_allowed",
            "{} {uri}: {status} {v}",
            r.method
        );
    }
}

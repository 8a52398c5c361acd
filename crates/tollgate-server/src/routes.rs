//! Handlers, the route table and the router.
//!
//! Every route is a row of [`table`]: method, path, the role it needs, handler. The router is
//! built from the table, authorization reads it, and `docs/http-api.md` documents it (a test
//! compares the two), so a route cannot be added without a role and a document entry. A path
//! the router knows but the table does not would need `admin` (deny by default).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put, MethodRouter};
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json_;
use tollgate::{
    AcquireOptions, Error, Limit, LimitSpec, LimitStatus, MergeSpec, OnUnavailable, PatchSpec,
    Repair, Scope,
};
use tollgate_core::limit::MAX_TOKENS;

use crate::auth::{Principal, Role};
use crate::error::ApiError;
use crate::extract::{JsonBody, PathParams, QueryPairs};
use crate::headers::{add_ratelimit_headers, retry_after_secs};
use crate::AppState;

mod many;

type St = State<Arc<AppState>>;
pub(crate) type ApiResult<T> = Result<T, ApiError>;

/// One route of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteInfo {
    /// The method (`HEAD` is answered wherever `GET` is).
    pub method: &'static str,
    /// The path template (`{id}` one segment, `{*resource}` the rest of the path).
    pub path: &'static str,
    /// The role a token needs when authentication is on; `None`: public.
    pub needs: Option<Role>,
}

type Handler = MethodRouter<Arc<AppState>>;

/// Every route: the one place routes are added.
fn table() -> Vec<(RouteInfo, Handler)> {
    const CLIENT: Option<Role> = Some(Role::Client);
    const ADMIN: Option<Role> = Some(Role::Admin);
    let r = |method, path, needs, h: Handler| {
        (
            RouteInfo {
                method,
                path,
                needs,
            },
            h,
        )
    };
    vec![
        r("POST", "/v1/acquire", CLIENT, post(acquire)),
        r("POST", "/v1/acquire/many", CLIENT, post(many::acquire_many)),
        r("POST", "/v1/leases/{id}/adjust", CLIENT, post(adjust)),
        r("POST", "/v1/leases/{id}/commit", CLIENT, post(commit)),
        r("POST", "/v1/leases/{id}/rollback", CLIENT, post(rollback)),
        r("GET", "/v1/availability", CLIENT, get(availability_get)),
        r("POST", "/v1/availability", CLIENT, post(availability_post)),
        r("GET", "/v1/usage", CLIENT, get(usage)),
        r("POST", "/v1/entities", ADMIN, post(create_entity)),
        r("GET", "/v1/entities/{id}", ADMIN, get(get_entity)),
        r("DELETE", "/v1/entities/{id}", ADMIN, delete(delete_entity)),
        r("POST", "/v1/entities/{id}/reset", ADMIN, post(reset_bucket)),
        r(
            "POST",
            "/v1/entities/{id}/top-up",
            ADMIN,
            post(top_up_bucket),
        ),
        r("PUT", "/v1/entities/{id}/parent", ADMIN, put(move_entity)),
        r(
            "PUT",
            "/v1/entities/{id}/enforcement",
            ADMIN,
            put(set_enforcement),
        ),
        r("PUT", "/v1/enforcement", ADMIN, put(set_scope_enforcement)),
        r("GET", "/v1/limits/system", ADMIN, get(get_system)),
        r("PUT", "/v1/limits/system", ADMIN, put(put_system)),
        r("DELETE", "/v1/limits/system", ADMIN, delete(delete_system)),
        r(
            "GET",
            "/v1/limits/resources/{*resource}",
            ADMIN,
            get(get_resource),
        ),
        r(
            "PUT",
            "/v1/limits/resources/{*resource}",
            ADMIN,
            put(put_resource),
        ),
        r(
            "DELETE",
            "/v1/limits/resources/{*resource}",
            ADMIN,
            delete(delete_resource),
        ),
        r(
            "GET",
            "/v1/limits/entities/{entity}",
            ADMIN,
            get(get_entity_default),
        ),
        r(
            "PUT",
            "/v1/limits/entities/{entity}",
            ADMIN,
            put(put_entity_default),
        ),
        r(
            "DELETE",
            "/v1/limits/entities/{entity}",
            ADMIN,
            delete(delete_entity_default),
        ),
        r(
            "GET",
            "/v1/limits/entities/{entity}/resources/{*resource}",
            ADMIN,
            get(get_entity_resource),
        ),
        r(
            "PUT",
            "/v1/limits/entities/{entity}/resources/{*resource}",
            ADMIN,
            put(put_entity_resource),
        ),
        r(
            "DELETE",
            "/v1/limits/entities/{entity}/resources/{*resource}",
            ADMIN,
            delete(delete_entity_resource),
        ),
        r("GET", "/v1/audit", ADMIN, get(audit_list)),
        r("GET", "/v1/namespaces", ADMIN, get(namespace_list)),
        r("POST", "/v1/namespaces", ADMIN, post(namespace_register)),
        r("GET", "/v1/namespaces/{name}", ADMIN, get(namespace_get)),
        r(
            "DELETE",
            "/v1/namespaces/{name}",
            ADMIN,
            delete(namespace_delete),
        ),
        r(
            "POST",
            "/v1/namespaces/ids/{id}/recover",
            ADMIN,
            post(namespace_recover),
        ),
        r(
            "POST",
            "/v1/namespaces/ids/{id}/purge",
            ADMIN,
            post(namespace_purge),
        ),
        r("GET", "/livez", None, get(livez)),
        r("GET", "/readyz", None, get(readyz)),
        r("GET", "/healthz", None, get(healthz)),
        r("GET", "/metrics", CLIENT, get(metrics)),
    ]
}

/// The route table (without handlers), in table order.
pub fn routes() -> Vec<RouteInfo> {
    table().into_iter().map(|(i, _)| i).collect()
}

/// The role `method path` needs: the table's; `None` (public, or the router answers `405`)
/// for a method the path's routes do not take; `admin` for a path the table lacks.
pub(crate) fn needs(method: &Method, path: &str) -> Option<Role> {
    let m = if method == Method::HEAD {
        "GET"
    } else {
        method.as_str()
    };
    let mut path_known = false;
    for info in table_infos() {
        if info.path == path {
            path_known = true;
            if info.method == m {
                return info.needs;
            }
        }
    }
    if path_known {
        None
    } else {
        Some(Role::Admin)
    }
}

fn table_infos() -> &'static [RouteInfo] {
    static INFOS: std::sync::OnceLock<Vec<RouteInfo>> = std::sync::OnceLock::new();
    INFOS.get_or_init(routes)
}

pub(crate) fn router(state: Arc<AppState>) -> Router {
    let mut router = Router::new();
    for (info, handler) in table() {
        router = router.route(info.path, handler);
    }
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Request id, access log, JSON errors, URI guard, authorization, timeouts and body
        // limit: one service around every route (see `edge.rs`).
        .layer(crate::edge::EdgeLayer::new(state.clone()))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method",
    )
}

// ---------------------------------------------------------------------------------------
// Amounts

/// Convert JSON amounts to tokens: integers in `0..=MAX_TOKENS` (the limiter refuses
/// negatives and the too-large with its own message; anything not an i64 is refused here).
fn amounts_of(m: &BTreeMap<String, Json_>) -> ApiResult<Vec<(String, i64)>> {
    m.iter()
        .map(|(k, v)| amount(k, v).map(|a| (k.clone(), a)))
        .collect()
}

/// [`amounts_of`], the names moved out of the map rather than copied.
fn amounts_from(m: BTreeMap<String, Json_>) -> ApiResult<Vec<(String, i64)>> {
    m.into_iter()
        .map(|(k, v)| amount(&k, &v).map(|a| (k, a)))
        .collect()
}

/// The tokens of one JSON amount.
fn amount(name: &str, v: &Json_) -> ApiResult<i64> {
    v.as_i64().ok_or_else(|| {
        ApiError::invalid_amount(format!(
            "invalid amount for {name:?}: must be an integer between 0 and {MAX_TOKENS}, not {v}"
        ))
    })
}

fn borrow(a: &[(String, i64)]) -> Vec<(&str, i64)> {
    a.iter().map(|(n, v)| (n.as_str(), *v)).collect()
}

fn specs_to_limits(specs: &[Json_]) -> ApiResult<Vec<Limit>> {
    specs
        .iter()
        .map(|v| {
            let spec: LimitSpec = serde_json::from_value(v.clone()).map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_limit",
                    format!("invalid limit spec {v}: {e}"),
                )
            })?;
            spec.to_limit()
                .map_err(|e| match (&e, spec.reset_cron.as_deref()) {
                    (tollgate_core::RuleError::InvalidLimit { reason, .. }, Some(c))
                        if reason.starts_with("cron ") || reason.starts_with("time zone ") =>
                    {
                        let tz = spec.reset_tz.as_deref().unwrap_or("UTC");
                        ApiError::new(
                            StatusCode::BAD_REQUEST,
                            "invalid_limit",
                            format!(
                                "limit {:?}: {}",
                                spec.name,
                                crate::cron::limit_reason(reason, c, tz)
                            ),
                        )
                    }
                    _ => e.into(),
                })
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Acquire

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireBody {
    entity: String,
    resource: String,
    #[serde(default)]
    amounts: BTreeMap<String, Json_>,
    #[serde(default)]
    limits: Option<Vec<Json_>>,
    #[serde(default)]
    on_unavailable: Option<OnUnavailable>,
    #[serde(default)]
    commit: bool,
}

/// `429 Too Many Requests` with `body`, `Retry-After` when the refusal says when, and the
/// RateLimit headers of the refused statuses (`limits`: the policies they name).
pub(crate) fn too_many_requests<T: Serialize>(
    body: &T,
    ex: &tollgate::Exceeded,
    limits: &[Limit],
    now_ms: i64,
) -> Response {
    let mut resp = json_answer(StatusCode::TOO_MANY_REQUESTS, body);
    let headers = resp.headers_mut();
    if let Some(ms) = ex.retry_after_ms {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs(ms)));
    }
    add_ratelimit_headers(headers, &ex.statuses, limits, now_ms);
    resp
}

/// A JSON answer, as axum's `Json` makes one (`Content-Type: application/json`; a value
/// that cannot be serialized is a plain-text `500`), written into a buffer kept by the
/// thread and copied out at its final size: one allocation, and one header map the caller
/// adds to.
pub(crate) fn json_answer<T: Serialize>(status: StatusCode, value: &T) -> Response {
    json_answer_written(status, |out| serde_json::to_writer(out, value))
}

/// [`json_answer`] with the body written by `write` (the JSON of `value`, for a body
/// written without serde: [`crate::acquire_json`]).
pub(crate) fn json_answer_written(
    status: StatusCode,
    write: impl FnOnce(&mut Vec<u8>) -> serde_json::Result<()>,
) -> Response {
    /// The largest buffer a thread keeps between answers.
    const KEPT: usize = 64 * 1024;
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let written = BUF.with(|buf| {
        let mut fresh = Vec::new();
        let mut kept = buf.try_borrow_mut();
        let out = match &mut kept {
            Ok(b) => &mut **b,
            Err(_) => &mut fresh,
        };
        out.clear();
        let r = write(&mut *out).map(|()| axum::body::Bytes::copy_from_slice(out));
        if out.capacity() > KEPT {
            *out = Vec::new();
        }
        r
    });
    match written {
        Ok(bytes) => {
            let mut resp = Response::new(axum::body::Body::from(bytes));
            *resp.status_mut() = status;
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            resp
        }
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            )],
            e.to_string(),
        )
            .into_response(),
    }
}

#[derive(Debug, Serialize)]
struct Rejected<'a> {
    error: &'static str,
    message: String,
    retry_after_ms: Option<i64>,
    resets_at_ms: Option<i64>,
    limits: &'a [LimitStatus],
}

async fn acquire(
    State(app): St,
    Extension(principal): Extension<Principal>,
    JsonBody(body): JsonBody<AcquireBody>,
) -> Response {
    let started = Instant::now();
    let r = acquire_inner(&app, &principal, body).await;
    let outcome = match &r {
        Ok(resp) if resp.status() == StatusCode::TOO_MANY_REQUESTS => "rejected",
        Ok(_) => "admitted",
        Err(_) => "error",
    };
    app.metrics.acquire(outcome, started.elapsed());
    r.unwrap_or_else(IntoResponse::into_response)
}

async fn acquire_inner(
    app: &AppState,
    principal: &Principal,
    mut body: AcquireBody,
) -> ApiResult<Response> {
    if body.limits.is_some() && !principal.may_override_limits(app.config.allow_limit_overrides) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "overrides_disabled",
            "per-call limits are disabled: the stored limits apply (start the server with \
             --allow-limit-overrides, or acquire with an admin token)",
        ));
    }
    if !body.commit && app.leases.is_full(app.config.max_leases) {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_leases",
            format!(
                "the server holds {} leases; commit or roll back leases, or acquire with \"commit\": true",
                app.config.max_leases
            ),
        ));
    }
    let amounts = amounts_from(std::mem::take(&mut body.amounts))?;
    let overrides = body.limits.as_deref().map(specs_to_limits).transpose()?;
    let lim = &app.limiter;
    let opts = AcquireOptions {
        limits: overrides.clone(),
        on_unavailable: body.on_unavailable,
    };
    let r = lim
        .acquire_with(
            &body.entity,
            &body.resource,
            tollgate::Amounts::from(amounts),
            opts,
        )
        .await;
    // The answer is its own future: what it holds is not laid out beside the acquire's.
    answer_acquire(app, &body, overrides.as_deref(), r).await
}

/// The answer to an acquire the limiter decided (`r`): the lease committed or held, the
/// statuses, the RateLimit headers; a refusal as `429`.
async fn answer_acquire(
    app: &AppState,
    body: &AcquireBody,
    overrides: Option<&[Limit]>,
    r: tollgate::Result<tollgate::Lease>,
) -> ApiResult<Response> {
    let lim = &app.limiter;
    // The limits, for the policy windows in the headers (cached by the limiter).
    let limits_for_headers = || async {
        match overrides {
            Some(l) => l.to_vec(),
            None => lim
                .resolve_limits(&body.entity, &body.resource)
                .await
                .unwrap_or_default(),
        }
    };
    match r {
        Ok(mut lease) => {
            let statuses = lease.statuses().to_vec();
            let degraded = lease.is_degraded();
            // The limits the acquire was judged by (a degraded lease has none, and the store
            // just failed to answer: it is not asked again).
            let limits: Arc<[Limit]> = lease.judged_by().unwrap_or_else(|| Arc::new([]));
            let now = lim.clock().now_ms();
            let (lease_id, lease_expires_at_ms) = if body.commit {
                lease.commit().await?;
                (None, None)
            } else {
                // Boxed: holding a lease (a token signed, a slot taken) is as large as the
                // acquire's own future, and held in place it would size every acquire's.
                let (token, expires) = Box::pin(hold(app, lease)).await?;
                (Some(token), Some(expires))
            };
            let mut resp = json_answer_written(StatusCode::OK, |out| {
                crate::acquire_json::write_acquire_ok(
                    out,
                    lease_id.as_deref(),
                    lease_expires_at_ms,
                    &statuses,
                    degraded,
                );
                Ok(())
            });
            add_ratelimit_headers(resp.headers_mut(), &statuses, &limits, now);
            Ok(resp)
        }
        Err(Error::RateLimitExceeded(ex)) => {
            let limits = limits_for_headers().await;
            let now = lim.clock().now_ms();
            let body = Rejected {
                error: "rate_limit_exceeded",
                message: ex.to_string(),
                retry_after_ms: ex.retry_after_ms,
                resets_at_ms: ex.resets_at_ms,
                limits: &ex.statuses,
            };
            Ok(too_many_requests(&body, &ex, &limits, now))
        }
        Err(e) => Err(e.into()),
    }
}

// ---------------------------------------------------------------------------------------
// Leases

/// Export a granted lease as its token and hold it until its expiry: the token and the
/// expiry. A token too long for this server's request head to carry back would be a lease
/// nobody can finish: it is rolled back instead (`500`), so nothing stays charged.
pub(crate) async fn hold(app: &AppState, mut lease: tollgate::Lease) -> ApiResult<(String, i64)> {
    let token = app
        .limiter
        .lease_token(&mut lease, &app.lease_key, app.config.lease_ttl)?;
    let room = app.config.max_header_bytes.saturating_sub(1024);
    if token.len() > room {
        let undo = lease.rollback().await;
        tracing::warn!(bytes = token.len(), room, undo = ?undo.err(), "lease token too long for the request head: rolled back");
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            format!(
                "the lease's token would be {} bytes, more than this server's request head carries ({room}); the acquire was rolled back (raise --max-header-size)",
                token.len()
            ),
        ));
    }
    let (Some(id), Some(expires)) = (lease.token_id().map(str::to_string), lease.expires_at_ms())
    else {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "an exported lease has no id",
        ));
    };
    app.leases.insert(id, lease, expires);
    Ok((token, expires))
}

/// The lease a request names by its token, locked: the copy this server holds, else the
/// token's lease (adopted, held until its expiry). `400 invalid_lease` for a token that
/// does not verify, `404 lease_not_found` for one past its expiry that this server does
/// not hold, `409 lease_stale` for a version older than the one held here (while it is
/// open). A newer version
/// replaces the copy held here, unless that copy already began to close.
pub(crate) async fn lease_for(
    app: &AppState,
    token: &str,
) -> ApiResult<tokio::sync::OwnedMutexGuard<crate::leases::Held>> {
    let t = tollgate::LeaseToken::verify(token, &app.lease_key)?;
    let (id, version, expires) = (t.id().to_string(), t.version(), t.expires_at_ms());
    let slot = match app.leases.get(&id) {
        Some(slot) => slot,
        None => {
            let lease = app.limiter.resume_verified(t)?;
            app.leases.adopt(&id, lease, expires)
        }
    };
    let mut h = slot.lock_owned().await;
    let held = h.lease.version();
    // A closed lease answers `lease_closed` whatever version names it.
    if version < held && !h.lease.is_closed() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "lease_stale",
            format!(
                "this token is version {version} of lease {id}; this server holds version {held}: pass the latest token (the one the last adjust answered)"
            ),
        ));
    }
    if version > held && !h.lease.is_closed() && !h.lease.is_closing() {
        h.lease = app.limiter.resume_lease(token, &app.lease_key)?;
        h.expires_at_ms = expires;
    }
    Ok(h)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AdjustBody {
    limit: String,
    delta: Json_,
}

#[derive(Debug, Serialize)]
struct LeaseState {
    lease_id: String,
    consumed: BTreeMap<String, i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    committed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rolled_back: Option<bool>,
}

async fn adjust(
    State(app): St,
    PathParams(id): PathParams<String>,
    JsonBody(body): JsonBody<AdjustBody>,
) -> ApiResult<Json<LeaseState>> {
    let delta = body
        .delta
        .as_i64()
        .filter(|d| d.unsigned_abs() <= MAX_TOKENS as u64)
        .ok_or_else(|| {
            ApiError::invalid_amount(format!(
                "invalid delta for {:?}: must be an integer between -{MAX_TOKENS} and {MAX_TOKENS}, not {}",
                body.limit, body.delta
            ))
        })?;
    let mut h = lease_for(&app, &id).await?;
    h.lease.adjust(&body.limit, delta)?;
    // The next version's token: the one to pass from now on.
    let next = app
        .limiter
        .lease_token(&mut h.lease, &app.lease_key, app.config.lease_ttl)?;
    Ok(Json(LeaseState {
        lease_id: next,
        consumed: h.lease.consumed(),
        committed: None,
        rolled_back: None,
    }))
}

async fn commit(State(app): St, PathParams(id): PathParams<String>) -> ApiResult<Json<LeaseState>> {
    let mut h = lease_for(&app, &id).await?;
    // What the lease consumed, adjustments included (commit clears them once written).
    let consumed = h.lease.consumed();
    h.lease.commit().await?;
    Ok(Json(LeaseState {
        lease_id: id,
        consumed,
        committed: Some(true),
        rolled_back: None,
    }))
}

async fn rollback(
    State(app): St,
    PathParams(id): PathParams<String>,
) -> ApiResult<Json<LeaseState>> {
    let mut h = lease_for(&app, &id).await?;
    h.lease.rollback().await?;
    Ok(Json(LeaseState {
        lease_id: id,
        consumed: BTreeMap::new(),
        committed: None,
        rolled_back: Some(true),
    }))
}

// ---------------------------------------------------------------------------------------
// Availability

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AvailabilityBody {
    entity: String,
    resource: String,
    #[serde(default)]
    amounts: Option<BTreeMap<String, Json_>>,
}

async fn availability(
    app: &AppState,
    entity: &str,
    resource: &str,
    amounts: Option<Vec<(String, i64)>>,
) -> ApiResult<Response> {
    let asked = tollgate::Amounts::from(amounts.unwrap_or_default());
    let a = app
        .limiter
        .check_availability(entity, resource, asked)
        .await?;
    Ok(Json(a).into_response())
}

async fn availability_post(
    State(app): St,
    JsonBody(body): JsonBody<AvailabilityBody>,
) -> ApiResult<Response> {
    let amounts = body.amounts.as_ref().map(amounts_of).transpose()?;
    availability(&app, &body.entity, &body.resource, amounts).await
}

/// Query amounts: `amounts=rpm:1,tpm:500` (or repeated `amount=rpm:1`).
fn query_amounts(v: &str, out: &mut Vec<(String, i64)>) -> ApiResult<()> {
    for part in v.split(',').filter(|p| !p.is_empty()) {
        let (n, a) = part.split_once(':').ok_or_else(|| {
            ApiError::invalid_amount(format!("amount {part:?} is not NAME:TOKENS"))
        })?;
        let a: i64 = a.trim().parse().map_err(|_| {
            ApiError::invalid_amount(format!(
                "invalid amount for {n:?}: must be an integer between 0 and {MAX_TOKENS}, not {a:?}"
            ))
        })?;
        out.push((n.trim().to_string(), a));
    }
    Ok(())
}

async fn availability_get(State(app): St, QueryPairs(q): QueryPairs) -> ApiResult<Response> {
    let mut entity = None;
    let mut resource = None;
    let mut amounts: Option<Vec<(String, i64)>> = None;
    for (k, v) in q {
        match k.as_str() {
            "entity" => entity = Some(v),
            "resource" => resource = Some(v),
            "amounts" | "amount" => query_amounts(&v, amounts.get_or_insert_with(Vec::new))?,
            other => {
                return Err(ApiError::invalid_request(format!(
                    "unknown query parameter {other:?} (entity, resource, amounts)"
                )))
            }
        }
    }
    let (Some(entity), Some(resource)) = (entity, resource) else {
        return Err(ApiError::invalid_request(
            "entity and resource are required query parameters",
        ));
    };
    availability(&app, &entity, &resource, amounts).await
}

// ---------------------------------------------------------------------------------------
// Usage

/// Millitokens per limit as tokens.
fn in_tokens(milli: &BTreeMap<String, i64>) -> BTreeMap<&str, f64> {
    milli
        .iter()
        .map(|(l, m)| (l.as_str(), *m as f64 / 1000.0))
        .collect()
}

/// One usage snapshot as the API shows it: consumption, and overdraw (ADR-151), per limit.
pub fn snapshot_json(s: &tollgate::Snapshot) -> Json_ {
    serde_json::json!({
        "entity": s.entity,
        "resource": s.resource,
        "window": s.window.name(),
        "window_start": tollgate_core::usage::iso_utc(s.start_ms),
        "window_end": tollgate_core::usage::iso_utc(s.window.end_ms(s.start_ms)),
        "window_start_ms": s.start_ms,
        "requests": s.requests,
        "consumed": in_tokens(&s.milli),
        "consumed_milli": s.milli,
        "overdraw": in_tokens(&s.overdraw),
        "overdraw_milli": s.overdraw,
    })
}

async fn usage(State(app): St, QueryPairs(q): QueryPairs) -> ApiResult<Response> {
    let mut uq = tollgate::UsageQuery::default();
    let instant = |k: &str, v: &str| {
        tollgate_core::usage::parse_instant(v).ok_or_else(|| {
            ApiError::invalid_request(format!(
                "{k}={v:?}: expected epoch milliseconds or an RFC 3339 time (2025-09-04T15:00:00Z)"
            ))
        })
    };
    for (k, v) in q {
        match k.as_str() {
            "entity" => uq.entity = Some(v),
            "resource" => uq.resource = Some(v),
            "window" => {
                uq.window = Some(tollgate::Window::parse(&v).ok_or_else(|| {
                    ApiError::invalid_request(format!(
                        "window={v:?}: expected hourly, daily or monthly"
                    ))
                })?)
            }
            "from" => uq.from_ms = Some(instant("from", &v)?),
            "to" => uq.to_ms = Some(instant("to", &v)?),
            "limit" => {
                uq.limit = Some(v.parse().map_err(|_| {
                    ApiError::invalid_request(format!("limit={v:?}: expected 1 to 1000"))
                })?)
            }
            "after" => uq.after = Some(v),
            other => {
                return Err(ApiError::invalid_request(format!(
                    "unknown query parameter {other:?} (entity, resource, window, from, to, limit, after)"
                )))
            }
        }
    }
    let page = app.limiter.usage(&uq).await?;
    let snaps: Vec<Json_> = page.snapshots.iter().map(snapshot_json).collect();
    Ok(Json(serde_json::json!({ "snapshots": snaps, "next": page.next })).into_response())
}

// ---------------------------------------------------------------------------------------
// Entities

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntityBody {
    id: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    parent_id: Option<String>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    /// The entity's base cascade policy (ADR-146): its acquires also debit the parent.
    #[serde(default)]
    cascade: bool,
}

async fn create_entity(
    State(app): St,
    Extension(who): Extension<Principal>,
    JsonBody(b): JsonBody<EntityBody>,
) -> ApiResult<Response> {
    if b.name.as_deref().is_some_and(|n| n.len() > 1024) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_name",
            "entity names are at most 1024 bytes",
        ));
    }
    let e = app
        .limiter
        .acting_as(&who.name)?
        .admin()
        .create_entity_with(
            &b.id,
            tollgate::NewEntity {
                name: b.name.as_deref(),
                parent_id: b.parent_id.as_deref(),
                cascade: b.cascade,
                metadata: b.metadata,
            },
        )
        .await?;
    tracing::info!(target: "tollgate::admin", principal = %who.name, entity = %e.id, "entity created");
    Ok((StatusCode::CREATED, Json(e)).into_response())
}

async fn get_entity(State(app): St, PathParams(id): PathParams<String>) -> ApiResult<Response> {
    match app.limiter.get_entity(&id).await? {
        Some(e) => Ok(Json(e).into_response()),
        None => Err(Error::EntityNotFound(id).into()),
    }
}

async fn delete_entity(
    State(app): St,
    Extension(who): Extension<Principal>,
    PathParams(id): PathParams<String>,
) -> ApiResult<Response> {
    let d = app
        .limiter
        .acting_as(&who.name)?
        .admin()
        .delete_entity_with_repairs(&id)
        .await?;
    let n = d.deleted_items;
    if n == 0 {
        return Err(Error::EntityNotFound(id).into());
    }
    tracing::info!(target: "tollgate::admin", principal = %who.name, entity = %id, deleted_items = n, corrupt = d.repairs.len(), "entity deleted");
    let mut body = serde_json::json!({ "deleted_items": n });
    add_warnings(&mut body, &d.repairs);
    Ok(Json(body).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResetBody {
    resource: String,
    #[serde(default)]
    op: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TopUpBody {
    resource: String,
    amounts: BTreeMap<String, Json_>,
    #[serde(default)]
    op: Option<String>,
}

/// `POST /v1/entities/{id}/reset` (ADR-149): refill the entity's bucket for `resource` to
/// full on every shard, in one transaction with its audit record. A retry with the same
/// `op` lands once (`already_applied: true`).
async fn reset_bucket(
    State(app): St,
    Extension(who): Extension<Principal>,
    PathParams(id): PathParams<String>,
    JsonBody(b): JsonBody<ResetBody>,
) -> ApiResult<Response> {
    let out = app
        .limiter
        .acting_as(&who.name)?
        .admin()
        .reset(&id, &b.resource, b.op.as_deref())
        .await?;
    tracing::info!(target: "tollgate::admin", principal = %who.name, entity = %id, resource = %b.resource, op = %out.op, shards = out.shards, already_applied = out.already_applied, "bucket reset");
    Ok(Json(out).into_response())
}

/// `POST /v1/entities/{id}/top-up` (ADR-149): add `amounts` (tokens per limit) above the
/// entity's grant for `resource`, split across its shards, in one transaction with its audit
/// record; a retry with the same `op` lands once.
async fn top_up_bucket(
    State(app): St,
    Extension(who): Extension<Principal>,
    PathParams(id): PathParams<String>,
    JsonBody(b): JsonBody<TopUpBody>,
) -> ApiResult<Response> {
    let amounts = amounts_of(&b.amounts)?;
    let out = app
        .limiter
        .acting_as(&who.name)?
        .admin()
        .top_up(&id, &b.resource, &borrow(&amounts), b.op.as_deref())
        .await?;
    tracing::info!(target: "tollgate::admin", principal = %who.name, entity = %id, resource = %b.resource, op = %out.op, shards = out.shards, already_applied = out.already_applied, "bucket topped up");
    Ok(Json(out).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EnforcementBody {
    resource: String,
    /// `enforce`, `disabled` or `bypass` (ADR-151).
    mode: tollgate::Enforcement,
}

/// `PUT /v1/entities/{id}/enforcement` (ADR-151): put the entity's use of `resource` in
/// `mode` — `enforce`, `disabled` (every acquire `403 resource_disabled`) or `bypass`
/// (every acquire admitted and recorded, no balance debited) — on every shard, in one
/// transaction with its audit record.
async fn set_enforcement(
    State(app): St,
    Extension(who): Extension<Principal>,
    PathParams(id): PathParams<String>,
    JsonBody(b): JsonBody<EnforcementBody>,
) -> ApiResult<Response> {
    let shards = app
        .limiter
        .acting_as(&who.name)?
        .admin()
        .set_enforcement(&id, &b.resource, b.mode)
        .await?;
    tracing::info!(target: "tollgate::admin", principal = %who.name, entity = %id, resource = %b.resource, mode = %b.mode, shards, "enforcement set");
    Ok(Json(serde_json::json!({
        "entity": id,
        "resource": b.resource,
        "mode": b.mode,
        "shards": shards,
    }))
    .into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScopeEnforcementBody {
    /// `system`, `resource:R`, `entity:E` (the entity's default) or `entity:E/resource:R`.
    scope: String,
    /// `enforce`, `disabled`, `bypass`, or `null` to clear the level's mode.
    mode: Option<tollgate::Enforcement>,
}

/// A scope as [`scope_name`] spells it, back: `system`, `resource:R`, `entity:E`,
/// `entity:E/resource:R` (ids validated by the call that uses it).
pub fn parse_scope(s: &str) -> Result<Scope, ApiError> {
    if s == "system" {
        return Ok(Scope::System);
    }
    if let Some(r) = s.strip_prefix("resource:") {
        return Ok(Scope::Resource(r.into()));
    }
    if let Some(rest) = s.strip_prefix("entity:") {
        return Ok(match rest.split_once("/resource:") {
            Some((e, r)) => Scope::Entity(e.into(), Some(r.into())),
            None => Scope::Entity(rest.into(), None),
        });
    }
    Err(ApiError::invalid_request(format!(
        "scope is 'system', 'resource:R', 'entity:E' or 'entity:E/resource:R', not {s:?}"
    )))
}

/// `PUT /v1/enforcement` (ADR-151, bypass per scope): set or clear (`"mode": null`) the
/// mode stored at a config level; the most specific level that sets one wins. The pair's
/// level (`entity:E/resource:R`) is stamped on its shards at once; a broader level reaches
/// each bucket on its next acquire (at once in this server, within the config cache TTL
/// in other processes). Answers the scope, the mode and the shards stamped now.
async fn set_scope_enforcement(
    State(app): St,
    Extension(who): Extension<Principal>,
    JsonBody(b): JsonBody<ScopeEnforcementBody>,
) -> ApiResult<Response> {
    let scope = parse_scope(&b.scope)?;
    let shards = app
        .limiter
        .acting_as(&who.name)?
        .admin()
        .set_scope_enforcement(&scope, b.mode)
        .await?;
    tracing::info!(target: "tollgate::admin", principal = %who.name, scope = %scope_name(&scope), mode = ?b.mode, shards, "enforcement set");
    Ok(Json(serde_json::json!({
        "scope": scope_name(&scope),
        "mode": b.mode,
        "shards": shards,
    }))
    .into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ParentBody {
    /// The new parent; `null` makes the entity a root.
    parent_id: Option<String>,
}

/// `PUT /v1/entities/{id}/parent` (ADR-150): move the entity under `parent_id` (`null`: a
/// root), refused with `409 parent_cycle` when that would make it its own ancestor.
async fn move_entity(
    State(app): St,
    Extension(who): Extension<Principal>,
    PathParams(id): PathParams<String>,
    JsonBody(b): JsonBody<ParentBody>,
) -> ApiResult<Response> {
    let m = app
        .limiter
        .acting_as(&who.name)?
        .admin()
        .set_parent(&id, b.parent_id.as_deref())
        .await?;
    tracing::info!(target: "tollgate::admin", principal = %who.name, entity = %id, parent = ?m.parent_id, pgen = m.pgen, "entity moved");
    Ok(Json(m).into_response())
}

/// One repair of a corrupt item, as the API reports it: the item, the attribute at fault,
/// what was done, and all of it in one sentence (`message`).
#[derive(Debug, Serialize)]
pub struct Warning<'a> {
    /// The repair in one sentence.
    pub message: String,
    /// Its parts.
    #[serde(flatten)]
    pub repair: &'a Repair,
}

/// The warnings of an administrative write, for its JSON answer.
pub fn warnings(repairs: &[Repair]) -> Vec<Warning<'_>> {
    repairs
        .iter()
        .map(|r| Warning {
            message: r.to_string(),
            repair: r,
        })
        .collect()
}

/// Add `warnings` to an answer when a corrupt item was repaired (absent otherwise).
fn add_warnings(body: &mut Json_, repairs: &[Repair]) {
    if let (Some(o), false) = (body.as_object_mut(), repairs.is_empty()) {
        o.insert(
            "warnings".into(),
            serde_json::to_value(warnings(repairs)).unwrap_or_default(),
        );
    }
}

// ---------------------------------------------------------------------------------------
// Limits

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsBody {
    limits: Vec<Json_>,
    #[serde(default)]
    on_unavailable: Option<OnUnavailable>,
    /// ADR-143 merge flags.
    #[serde(default)]
    inherit_limits: bool,
    #[serde(default)]
    exclude_limits: std::collections::BTreeSet<String>,
    #[serde(default)]
    patch_limits: BTreeMap<String, PatchSpec>,
}

#[derive(Debug, Serialize)]
struct LimitsOut {
    scope: String,
    limits: Vec<LimitSpec>,
    on_unavailable: Option<OnUnavailable>,
    /// The level's mode (ADR-151), where it sets one.
    #[serde(skip_serializing_if = "Option::is_none")]
    enforcement: Option<tollgate::Enforcement>,
    #[serde(flatten)]
    merge: MergeSpec,
}

/// A scope as the API and the CLI spell it: `system`, `resource:R`, `entity:E`,
/// `entity:E/resource:R`.
pub fn scope_name(s: &Scope) -> String {
    match s {
        Scope::System => "system".into(),
        Scope::Resource(r) => format!("resource:{r}"),
        Scope::Entity(e, None) => format!("entity:{e}"),
        Scope::Entity(e, Some(r)) => format!("entity:{e}/resource:{r}"),
    }
}

async fn put_limits(
    app: &AppState,
    who: &Principal,
    scope: Scope,
    b: LimitsBody,
) -> ApiResult<Response> {
    scope.validate()?;
    let limits = specs_to_limits(&b.limits)?;
    let spec = MergeSpec {
        inherit_limits: b.inherit_limits,
        exclude_limits: b.exclude_limits,
        patch_limits: b.patch_limits,
    };
    let merge = spec.to_merge()?;
    let repairs = app
        .limiter
        .acting_as(&who.name)?
        .admin()
        .set_level(&scope, &limits, &merge, b.on_unavailable)
        .await?;
    tracing::info!(target: "tollgate::admin", principal = %who.name, scope = %scope_name(&scope), limits = limits.len(), corrupt = repairs.len(), "limits set");
    let mut body = serde_json::to_value(LimitsOut {
        scope: scope_name(&scope),
        limits: limits.iter().map(LimitSpec::from).collect(),
        on_unavailable: b.on_unavailable,
        // The level's mode is kept by a change of its limits (shown by GET).
        enforcement: None,
        merge: MergeSpec::from(&merge),
    })
    .unwrap_or_default();
    add_warnings(&mut body, &repairs);
    Ok(Json(body).into_response())
}

async fn get_limits(app: &AppState, scope: Scope) -> ApiResult<Response> {
    let (limits, on) = app.limiter.get_limits(&scope).await?;
    let merge = app.limiter.get_merge(&scope).await?;
    let enforcement = app.limiter.scope_enforcement(&scope).await?;
    Ok(Json(LimitsOut {
        scope: scope_name(&scope),
        limits: limits.iter().map(LimitSpec::from).collect(),
        on_unavailable: on,
        enforcement,
        merge: MergeSpec::from(&merge),
    })
    .into_response())
}

async fn delete_limits(app: &AppState, who: &Principal, scope: Scope) -> ApiResult<Response> {
    let (deleted, repairs) = app
        .limiter
        .acting_as(&who.name)?
        .admin()
        .delete_limits_with_repairs(&scope)
        .await?;
    tracing::info!(target: "tollgate::admin", principal = %who.name, scope = %scope_name(&scope), deleted, corrupt = repairs.len(), "limits deleted");
    let mut body = serde_json::json!({ "scope": scope_name(&scope), "deleted": deleted });
    add_warnings(&mut body, &repairs);
    Ok(Json(body).into_response())
}

async fn get_system(State(app): St) -> ApiResult<Response> {
    get_limits(&app, Scope::System).await
}
async fn put_system(
    State(app): St,
    Extension(who): Extension<Principal>,
    JsonBody(b): JsonBody<LimitsBody>,
) -> ApiResult<Response> {
    put_limits(&app, &who, Scope::System, b).await
}
async fn delete_system(
    State(app): St,
    Extension(who): Extension<Principal>,
) -> ApiResult<Response> {
    delete_limits(&app, &who, Scope::System).await
}

async fn get_resource(State(app): St, PathParams(r): PathParams<String>) -> ApiResult<Response> {
    get_limits(&app, Scope::Resource(r)).await
}
async fn put_resource(
    State(app): St,
    Extension(who): Extension<Principal>,
    PathParams(r): PathParams<String>,
    JsonBody(b): JsonBody<LimitsBody>,
) -> ApiResult<Response> {
    put_limits(&app, &who, Scope::Resource(r), b).await
}
async fn delete_resource(
    State(app): St,
    Extension(who): Extension<Principal>,
    PathParams(r): PathParams<String>,
) -> ApiResult<Response> {
    delete_limits(&app, &who, Scope::Resource(r)).await
}

async fn get_entity_default(
    State(app): St,
    PathParams(e): PathParams<String>,
) -> ApiResult<Response> {
    get_limits(&app, Scope::Entity(e, None)).await
}
async fn put_entity_default(
    State(app): St,
    Extension(who): Extension<Principal>,
    PathParams(e): PathParams<String>,
    JsonBody(b): JsonBody<LimitsBody>,
) -> ApiResult<Response> {
    put_limits(&app, &who, Scope::Entity(e, None), b).await
}
async fn delete_entity_default(
    State(app): St,
    Extension(who): Extension<Principal>,
    PathParams(e): PathParams<String>,
) -> ApiResult<Response> {
    delete_limits(&app, &who, Scope::Entity(e, None)).await
}

async fn get_entity_resource(
    State(app): St,
    PathParams((e, r)): PathParams<(String, String)>,
) -> ApiResult<Response> {
    get_limits(&app, Scope::Entity(e, Some(r))).await
}
async fn put_entity_resource(
    State(app): St,
    Extension(who): Extension<Principal>,
    PathParams((e, r)): PathParams<(String, String)>,
    JsonBody(b): JsonBody<LimitsBody>,
) -> ApiResult<Response> {
    put_limits(&app, &who, Scope::Entity(e, Some(r)), b).await
}
async fn delete_entity_resource(
    State(app): St,
    Extension(who): Extension<Principal>,
    PathParams((e, r)): PathParams<(String, String)>,
) -> ApiResult<Response> {
    delete_limits(&app, &who, Scope::Entity(e, Some(r))).await
}

// ---------------------------------------------------------------------------------------
// Audit log

/// `GET /v1/audit?entity=&resource=&limit=&cursor=`: one page of the audit log, newest
/// first (`limit` 1 to 1000, default 100; `cursor` the previous page's `next_cursor`).
async fn audit_list(State(app): St, QueryPairs(q): QueryPairs) -> ApiResult<Response> {
    let mut query = tollgate::AuditQuery::default();
    for (k, v) in q {
        match k.as_str() {
            "entity" => query.entity = Some(v),
            "resource" => query.resource = Some(v),
            "cursor" => query.cursor = Some(v),
            "registry" => {
                query.registry = match v.as_str() {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return Err(ApiError::invalid_request(format!(
                            "registry is true or false, not {v:?}"
                        )))
                    }
                }
            }
            "limit" => {
                query.limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=tollgate_core::audit::MAX_PAGE).contains(n))
                    .ok_or_else(|| {
                        ApiError::invalid_request(format!(
                            "limit is a whole number from 1 to 1000, not {v:?}"
                        ))
                    })?
            }
            other => {
                return Err(ApiError::invalid_request(format!(
                    "unknown query parameter {other:?} (entity, resource, limit, cursor, registry)"
                )))
            }
        }
    }
    let page = app.limiter.audit_log(&query).await?;
    Ok(Json(page).into_response())
}

// ---------------------------------------------------------------------------------------
// Namespaces (spec-base-system.md §7.3)

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NamespaceBody {
    name: String,
}

async fn namespace_list(State(app): St) -> ApiResult<Response> {
    let all = app.limiter.list_namespaces().await?;
    Ok(Json(serde_json::json!({ "namespaces": all })).into_response())
}

async fn namespace_register(
    State(app): St,
    Extension(who): Extension<Principal>,
    JsonBody(b): JsonBody<NamespaceBody>,
) -> ApiResult<Response> {
    let ns = app
        .limiter
        .acting_as(&who.name)?
        .admin()
        .register_namespace(&b.name)
        .await?;
    tracing::info!(target: "tollgate::admin", principal = %who.name, name = %ns.name, id = %ns.id, "namespace registered");
    Ok(Json(ns).into_response())
}

async fn namespace_get(
    State(app): St,
    PathParams(name): PathParams<String>,
) -> ApiResult<Response> {
    match app.limiter.get_namespace(&name).await? {
        Some(ns) => Ok(Json(ns).into_response()),
        None => Err(Error::NamespaceNotFound(name).into()),
    }
}

async fn namespace_delete(
    State(app): St,
    Extension(who): Extension<Principal>,
    PathParams(name): PathParams<String>,
) -> ApiResult<Response> {
    let deleted = app
        .limiter
        .acting_as(&who.name)?
        .admin()
        .delete_namespace(&name)
        .await?;
    tracing::info!(target: "tollgate::admin", principal = %who.name, name = %name, deleted = deleted.is_some(), "namespace deleted");
    Ok(Json(serde_json::json!({ "name": name, "deleted": deleted })).into_response())
}

async fn namespace_recover(
    State(app): St,
    Extension(who): Extension<Principal>,
    PathParams(id): PathParams<String>,
) -> ApiResult<Response> {
    let ns = app
        .limiter
        .acting_as(&who.name)?
        .admin()
        .recover_namespace(&id)
        .await?;
    tracing::info!(target: "tollgate::admin", principal = %who.name, name = %ns.name, id = %id, "namespace recovered");
    Ok(Json(ns).into_response())
}

async fn namespace_purge(
    State(app): St,
    Extension(who): Extension<Principal>,
    PathParams(id): PathParams<String>,
) -> ApiResult<Response> {
    let n = app
        .limiter
        .acting_as(&who.name)?
        .admin()
        .purge_namespace(&id)
        .await?;
    tracing::info!(target: "tollgate::admin", principal = %who.name, id = %id, deleted_items = n, "namespace purged");
    Ok(Json(serde_json::json!({ "namespace_id": id, "deleted_items": n })).into_response())
}

// ---------------------------------------------------------------------------------------
// Health and metrics

/// Probe the store: one read of a key that never exists, within 5 s.
async fn probe_store(app: &AppState) -> ApiResult<()> {
    let r = tokio::time::timeout(Duration::from_secs(5), app.limiter.ping()).await;
    match r {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            format!("store check failed: {e}"),
        )),
        Err(_) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            "store check timed out after 5 s",
        )),
    }
}

/// The process answers: no store request.
async fn livez() -> Response {
    Json(serde_json::json!({ "status": "ok" })).into_response()
}

/// Ready to serve: the store answers.
async fn readyz(State(app): St) -> ApiResult<Response> {
    probe_store(&app).await?;
    Ok(
        Json(serde_json::json!({ "status": "ok", "backend": app.limiter.backend() }))
            .into_response(),
    )
}

async fn healthz(State(app): St) -> ApiResult<Response> {
    probe_store(&app).await?;
    Ok(Json(serde_json::json!({
        "status": "ok",
        "backend": app.limiter.backend(),
        "leases_held": app.leases.len(),
    }))
    .into_response())
}

async fn metrics(State(app): St) -> Response {
    match app.metrics.render() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "metrics could not be rendered",
        )
        .into_response(),
    }
}

//! `POST /v1/acquire/many`: several resources of one entity, all or none (ADR-148).
//!
//! Each admitted resource gets its own lease token (finished with the lease routes like any
//! other); a refusal leaves nothing charged and answers like `POST /v1/acquire`'s `429`,
//! naming the resource that refused.

use super::*;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ManyBody {
    entity: String,
    resources: Vec<Wanted>,
    #[serde(default)]
    on_unavailable: Option<OnUnavailable>,
    #[serde(default)]
    commit: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wanted {
    resource: String,
    #[serde(default)]
    amounts: BTreeMap<String, Json_>,
}

#[derive(Debug, Serialize)]
struct Granted {
    resource: String,
    lease_id: Option<String>,
    lease_expires_at_ms: Option<i64>,
    statuses: Vec<LimitStatus>,
}

#[derive(Debug, Serialize)]
struct ManyOk {
    resources: Vec<Granted>,
    degraded: bool,
}

#[derive(Debug, Serialize)]
struct ManyRejected<'a> {
    error: &'static str,
    message: String,
    resource: &'a str,
    retry_after_ms: Option<i64>,
    resets_at_ms: Option<i64>,
    limits: &'a [LimitStatus],
}

pub(super) async fn acquire_many(State(app): St, JsonBody(body): JsonBody<ManyBody>) -> Response {
    let started = Instant::now();
    let r = inner(&app, body).await;
    let outcome = match &r {
        Ok(resp) if resp.status() == StatusCode::TOO_MANY_REQUESTS => "rejected",
        Ok(_) => "admitted",
        Err(_) => "error",
    };
    app.metrics.acquire(outcome, started.elapsed());
    r.unwrap_or_else(IntoResponse::into_response)
}

async fn inner(app: &AppState, body: ManyBody) -> ApiResult<Response> {
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
    let amounts: Vec<Vec<(String, i64)>> = body
        .resources
        .iter()
        .map(|w| amounts_of(&w.amounts))
        .collect::<ApiResult<_>>()?;
    let borrowed: Vec<Vec<(&str, i64)>> = amounts.iter().map(|a| borrow(a)).collect();
    let wants: Vec<(&str, &[(&str, i64)])> = body
        .resources
        .iter()
        .zip(&borrowed)
        .map(|(w, a)| (w.resource.as_str(), a.as_slice()))
        .collect();
    let lim = &app.limiter;
    let opts = AcquireOptions {
        limits: None,
        on_unavailable: body.on_unavailable,
    };
    match lim.acquire_many_with(&body.entity, &wants, opts).await {
        Ok(mut many) => {
            let degraded = many.is_degraded();
            if body.commit {
                many.commit().await?;
            }
            let mut granted = Vec::new();
            let mut leases = many.into_leases().into_iter();
            while let Some(lease) = leases.next() {
                let resource = lease.resource().to_string();
                let statuses = lease.statuses().to_vec();
                let (lease_id, lease_expires_at_ms) = if body.commit {
                    (None, None)
                } else {
                    match hold(app, lease).await {
                        Ok((t, e)) => (Some(t), Some(e)),
                        Err(e) => {
                            // The rest were not exported: roll them back (the ones already
                            // held are finished by their tokens or their expiry).
                            for mut l in leases {
                                let undo = l.rollback().await;
                                tracing::warn!(resource = l.resource(), undo = ?undo.err(), "multi-resource acquire: lease not exported, rolled back");
                            }
                            return Err(e);
                        }
                    }
                };
                granted.push(Granted {
                    resource,
                    lease_id,
                    lease_expires_at_ms,
                    statuses,
                });
            }
            Ok(json_answer(
                StatusCode::OK,
                &ManyOk {
                    resources: granted,
                    degraded,
                },
            ))
        }
        Err(Error::RateLimitExceeded(ex)) => {
            let limits = lim
                .resolve_limits(&body.entity, &ex.resource)
                .await
                .unwrap_or_default();
            let now = lim.clock().now_ms();
            let body = ManyRejected {
                error: "rate_limit_exceeded",
                message: ex.to_string(),
                resource: &ex.resource,
                retry_after_ms: ex.retry_after_ms,
                resets_at_ms: ex.resets_at_ms,
                limits: &ex.statuses,
            };
            Ok(too_many_requests(&body, &ex, &limits, now))
        }
        Err(e) => Err(e.into()),
    }
}

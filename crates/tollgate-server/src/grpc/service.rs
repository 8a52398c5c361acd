//! The `ShouldRateLimit` handler: authentication, mapping, the all-or-none charge of the
//! request phase, and the usage report.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use tollgate::limits_file::{resolve, Charge, EnvoySettings};
use tollgate::{Error, Lease, Limit, LimitStatus};
use tonic::{Request, Response, Status};

use super::answer::{descriptor_status, header, headers};
use super::rls::rate_limit_response::Code;
use super::rls::rate_limit_service_server::RateLimitService;
use super::rls::{RateLimitRequest, RateLimitResponse};
use super::{Mapping, METHOD};
use crate::auth::{bearer, Principal, Role};
use crate::error::ApiError;
use crate::AppState;

/// The gRPC service: the HTTP server's state plus the descriptor mapping.
#[derive(Debug, Clone)]
pub struct RateLimiter {
    app: Arc<AppState>,
    mapping: Mapping,
}

impl RateLimiter {
    /// A service over a server's state.
    pub fn new(app: Arc<AppState>, mapping: Mapping) -> Self {
        RateLimiter { app, mapping }
    }

    /// The caller, from the `authorization` metadata (`Bearer TOKEN`), with role client or
    /// admin; without authentication configured, anyone.
    fn principal<T>(&self, req: &Request<T>) -> Result<Principal, Status> {
        let Some(auth) = &self.app.auth else {
            return Ok(Principal::anonymous());
        };
        let Some(v) = req.metadata().get("authorization") else {
            return Err(Status::unauthenticated(
                "this service needs a bearer token: metadata authorization: Bearer TOKEN",
            ));
        };
        let Some(t) = bearer(v.as_bytes()) else {
            return Err(Status::unauthenticated(
                "the authorization metadata is not of the form: Bearer TOKEN",
            ));
        };
        match auth.tokens().authenticate(t) {
            Some(p) if p.role.allows(Role::Client) => Ok(p),
            Some(p) => Err(Status::permission_denied(format!(
                "token {:?} has role {}; this service needs role client",
                p.name,
                p.role.as_str()
            ))),
            None => Err(Status::unauthenticated(
                "the bearer token is not known to this server",
            )),
        }
    }
}

/// The gRPC status of a limiter error (the HTTP API's code, in the message).
pub(crate) fn status_of(e: &Error) -> Status {
    let (_, code) = crate::classify(e);
    let msg = format!("{code}: {e}");
    match e {
        Error::Unavailable(_) => Status::unavailable(msg),
        Error::Invalid(_) | Error::UnknownLimit { .. } | Error::InvalidAdjustment { .. } => {
            Status::invalid_argument(msg)
        }
        Error::InvalidLease(_) => Status::invalid_argument(msg),
        Error::NoLimits { .. } | Error::LeaseClosed | Error::LeaseExpired => {
            Status::failed_precondition(msg)
        }
        Error::Contended { .. } => Status::aborted(msg),
        Error::ResourceDisabled { .. } => Status::permission_denied(msg),
        _ => Status::internal(msg),
    }
}

fn status_of_api(e: ApiError) -> Status {
    Status::internal(format!("{}: {}", e.code, e.message))
}

/// Descriptors of one (entity, resource): one acquire.
struct Group {
    entity: String,
    resource: String,
    /// (limit, tokens), each limit once (amounts of one limit named twice are summed).
    amounts: Vec<(String, i64)>,
    report_usage: bool,
}

fn groups_of(charges: &[Charge]) -> Result<(Vec<Group>, Vec<usize>), Status> {
    let mut groups: Vec<Group> = Vec::new();
    let mut of = Vec::with_capacity(charges.len());
    for c in charges {
        let gi = match groups
            .iter()
            .position(|g| g.entity == c.entity && g.resource == c.resource)
        {
            Some(i) => i,
            None => {
                groups.push(Group {
                    entity: c.entity.clone(),
                    resource: c.resource.clone(),
                    amounts: Vec::new(),
                    report_usage: false,
                });
                groups.len() - 1
            }
        };
        let g = &mut groups[gi];
        g.report_usage |= c.report_usage;
        match g.amounts.iter_mut().find(|(n, _)| *n == c.limit) {
            Some((_, a)) => {
                *a = a
                    .checked_add(c.amount)
                    .filter(|a| *a <= tollgate_core::limit::MAX_TOKENS)
                    .ok_or_else(|| {
                        Status::invalid_argument(format!(
                            "the hits of limit {:?} add up to more than {}",
                            c.limit,
                            tollgate_core::limit::MAX_TOKENS
                        ))
                    })?
            }
            None => g.amounts.push((c.limit.clone(), c.amount)),
        }
        of.push(gi);
    }
    Ok((groups, of))
}

fn borrow(a: &[(String, i64)]) -> Vec<(&str, i64)> {
    a.iter().map(|(n, v)| (n.as_str(), *v)).collect()
}

/// What each group ended as.
enum Outcome {
    Admitted(Box<Lease>),
    /// Admitted, then rolled back because a later group refused: its statuses as of the
    /// acquire with the debit given back.
    Undone(Vec<LimitStatus>),
    Refused(Vec<LimitStatus>),
    /// Not tried (an earlier group refused): availability without a write.
    Untried(Vec<LimitStatus>),
}

impl RateLimiter {
    async fn limits_of(&self, entity: &str, resource: &str) -> Vec<Limit> {
        self.app
            .limiter
            .resolve_limits(entity, resource)
            .await
            .unwrap_or_default()
    }

    /// The request phase: every group admitted, or none.
    async fn charge(
        &self,
        settings: &EnvoySettings,
        charges: Vec<Charge>,
    ) -> Result<RateLimitResponse, Status> {
        let lim = &self.app.limiter;
        let (groups, of) = groups_of(&charges)?;
        // A lease kept for a usage report is held in the server's lease table: the same cap
        // as the HTTP API's, checked before anything is debited.
        if groups.iter().any(|g| g.report_usage)
            && self.app.leases.is_full(self.app.config.max_leases)
        {
            return Err(Status::resource_exhausted(format!(
                "too_many_leases: the server holds {} leases; usage reports close them",
                self.app.leases.len()
            )));
        }
        let mut outcomes: Vec<Outcome> = Vec::with_capacity(groups.len());
        // Set once a group is refused (to its retry-after; `None` inside: it never fits).
        let mut retry_after_ms: Option<Option<i64>> = None;
        for g in &groups {
            if retry_after_ms.is_some() {
                let asked = borrow(&g.amounts);
                let st = lim
                    .check_availability(&g.entity, &g.resource, &asked)
                    .await
                    .map(|a| a.limits)
                    .unwrap_or_default();
                outcomes.push(Outcome::Untried(st));
                continue;
            }
            match lim
                .acquire(&g.entity, &g.resource, &borrow(&g.amounts))
                .await
            {
                Ok(lease) => outcomes.push(Outcome::Admitted(Box::new(lease))),
                Err(Error::RateLimitExceeded(ex)) => {
                    // All or none: give back what the earlier groups took, exactly.
                    for o in outcomes.iter_mut() {
                        if let Outcome::Admitted(lease) = o {
                            let mut st = lease.statuses().to_vec();
                            if let Err(e) = lease.rollback().await {
                                tracing::warn!(error = %e, entity = lease.entity(), resource = lease.resource(), "grpc: rollback of an admitted descriptor group failed");
                            }
                            for s in &mut st {
                                s.available = s.available.saturating_add(s.requested);
                            }
                            *o = Outcome::Undone(st);
                        }
                    }
                    retry_after_ms = Some(ex.retry_after_ms);
                    outcomes.push(Outcome::Refused(ex.statuses.clone()));
                }
                Err(e) => {
                    for o in outcomes.iter_mut() {
                        if let Outcome::Admitted(lease) = o {
                            if let Err(e) = lease.rollback().await {
                                tracing::warn!(error = %e, "grpc: rollback after a failed descriptor group failed");
                            }
                        }
                    }
                    return Err(status_of(&e));
                }
            }
        }
        let refused = outcomes.iter().any(|o| matches!(o, Outcome::Refused(_)));
        let now = lim.clock().now_ms();
        let mut resp = RateLimitResponse {
            overall_code: if refused {
                Code::OverLimit as i32
            } else {
                Code::Ok as i32
            },
            ..Default::default()
        };
        let mut all_statuses: Vec<LimitStatus> = Vec::new();
        let mut all_limits: Vec<Limit> = Vec::new();
        let mut tokens = Vec::new();
        let mut degraded = false;
        let mut group_statuses: Vec<Vec<LimitStatus>> = Vec::with_capacity(groups.len());
        let mut group_limits: Vec<Vec<Limit>> = Vec::with_capacity(groups.len());
        for (g, o) in groups.iter().zip(outcomes) {
            let st = match o {
                Outcome::Admitted(mut lease) => {
                    let st = lease.statuses().to_vec();
                    if lease.is_degraded() {
                        degraded = true;
                        lease.commit().await.map_err(|e| status_of(&e))?;
                    } else if g.report_usage {
                        let (token, _) = crate::routes::hold(&self.app, *lease)
                            .await
                            .map_err(status_of_api)?;
                        tokens.push(token);
                    } else {
                        lease.commit().await.map_err(|e| status_of(&e))?;
                    }
                    st
                }
                Outcome::Undone(st) | Outcome::Refused(st) | Outcome::Untried(st) => st,
            };
            let limits = if degraded {
                Vec::new()
            } else {
                self.limits_of(&g.entity, &g.resource).await
            };
            for s in &st {
                if !all_statuses.iter().any(|x| x.limit == s.limit) {
                    all_statuses.push(s.clone());
                }
            }
            for l in &limits {
                if !all_limits.iter().any(|x| x.name() == l.name()) {
                    all_limits.push(l.clone());
                }
            }
            group_statuses.push(st);
            group_limits.push(limits);
        }
        for (c, gi) in charges.iter().zip(&of) {
            let s = group_statuses[*gi].iter().find(|s| s.limit == c.limit);
            let l = group_limits[*gi].iter().find(|l| l.name() == c.limit);
            resp.statuses.push(descriptor_status(s, l, now));
        }
        resp.response_headers_to_add =
            headers(&all_statuses, &all_limits, retry_after_ms.flatten(), now);
        if degraded {
            resp.response_headers_to_add.push(header(
                &settings.degraded_header,
                "store unavailable; admitted by on_unavailable = allow",
            ));
        }
        if !tokens.is_empty() {
            resp.request_headers_to_add
                .push(header(&settings.lease_header, tokens.join(",")));
        }
        Ok(resp)
    }

    /// The usage report: each lease named in the lease entry is adjusted so that what it
    /// consumed of each reported limit is the reported amount, then committed.
    async fn report(&self, charges: Vec<Charge>) -> Result<RateLimitResponse, Status> {
        let key = &self.app.lease_key;
        // token → (limit → tokens reported)
        let mut by_token: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
        for c in &charges {
            let tokens: Vec<&str> = c
                .report
                .as_deref()
                .unwrap_or("")
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .collect();
            if tokens.is_empty() {
                // The request phase held no lease (refused, degraded, or no report_usage
                // rule): nothing to reconcile.
                continue;
            }
            let mut found = None;
            for t in tokens {
                let v = tollgate::LeaseToken::verify(t, key).map_err(|e| status_of(&e))?;
                if v.entity() == c.entity && v.resource() == c.resource {
                    found = Some(t.to_string());
                    break;
                }
            }
            let Some(t) = found else {
                return Err(Status::invalid_argument(format!(
                    "the lease entry holds no lease of {}/{}",
                    c.entity, c.resource
                )));
            };
            let e = by_token
                .entry(t)
                .or_default()
                .entry(c.limit.clone())
                .or_insert(0);
            *e = e.saturating_add(c.amount);
        }
        for (token, limits) in &by_token {
            let mut h = crate::routes::lease_for(&self.app, token)
                .await
                .map_err(|e| match e.code {
                    "lease_closed" | "lease_stale" | "lease_not_found" => {
                        Status::failed_precondition(format!("{}: {}", e.code, e.message))
                    }
                    "invalid_lease" => {
                        Status::invalid_argument(format!("{}: {}", e.code, e.message))
                    }
                    _ => status_of_api(e),
                })?;
            let consumed = h.lease.consumed();
            for (limit, used) in limits {
                let delta = used - consumed.get(limit).copied().unwrap_or(0);
                if delta != 0 {
                    h.lease.adjust(limit, delta).map_err(|e| status_of(&e))?;
                }
            }
            h.lease.commit().await.map_err(|e| status_of(&e))?;
        }
        let now = self.app.limiter.clock().now_ms();
        let mut resp = RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..Default::default()
        };
        for c in &charges {
            let limits = self.limits_of(&c.entity, &c.resource).await;
            let l = limits.iter().find(|l| l.name() == c.limit);
            resp.statuses.push(descriptor_status(None, l, now));
        }
        Ok(resp)
    }

    async fn decide(&self, req: RateLimitRequest) -> Result<RateLimitResponse, Status> {
        let settings = self.mapping.current();
        if req.domain.is_empty() {
            return Err(Status::invalid_argument("the request's domain is empty"));
        }
        if req.descriptors.is_empty() {
            return Err(Status::invalid_argument("the request has no descriptors"));
        }
        let default_hits = if req.hits_addend == 0 {
            1
        } else {
            u64::from(req.hits_addend)
        };
        let mut charges = Vec::with_capacity(req.descriptors.len());
        for (i, d) in req.descriptors.iter().enumerate() {
            let entries: Vec<(String, String)> = d
                .entries
                .iter()
                .map(|e| (e.key.clone(), e.value.clone()))
                .collect();
            let hits = d.hits_addend.map(|h| h.value).unwrap_or(default_hits);
            let c = resolve(
                &settings,
                &req.domain,
                i,
                &entries,
                hits,
                d.is_negative_hits,
            )
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
            charges.push(c);
        }
        let reports = charges.iter().filter(|c| c.report.is_some()).count();
        match reports {
            0 => self.charge(&settings, charges).await,
            n if n == charges.len() => self.report(charges).await,
            _ => Err(Status::invalid_argument(format!(
                "a request mixes usage reports (descriptors with the {:?} entry) and charges: send them in separate requests",
                settings.lease_entry
            ))),
        }
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimiter {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        let principal = match self.principal(&request) {
            Ok(p) => p,
            Err(s) => {
                self.app
                    .metrics
                    .request("POST", METHOD, 401, started.elapsed());
                return Err(s);
            }
        };
        let req = request.into_inner();
        let domain = req.domain.clone();
        let r = self.decide(req).await;
        let (outcome, status) = match &r {
            Ok(resp) if resp.overall_code == Code::OverLimit as i32 => ("rejected", 429),
            Ok(_) => ("admitted", 200),
            Err(s) if s.code() == tonic::Code::InvalidArgument => ("error", 400),
            Err(s) if s.code() == tonic::Code::Unavailable => ("error", 503),
            Err(_) => ("error", 500),
        };
        let took = started.elapsed();
        self.app.metrics.acquire(outcome, took);
        self.app.metrics.request("POST", METHOD, status, took);
        match &r {
            Ok(resp) => {
                tracing::info!(principal = %principal.name, %domain, outcome, descriptors = resp.statuses.len(), took_ms = took.as_millis() as u64, "grpc ShouldRateLimit")
            }
            Err(s) => {
                tracing::info!(principal = %principal.name, %domain, code = ?s.code(), message = s.message(), took_ms = took.as_millis() as u64, "grpc ShouldRateLimit refused")
            }
        }
        r.map(Response::new)
    }
}

//! `tollgate serve`: the HTTP server, its authentication, connection settings and signals.
//!
//! - Tokens come from `--auth-file` (re-read on SIGHUP) and/or `TOLLGATE_AUTH_TOKENS`.
//! - Without tokens the server listens only on loopback addresses; any other `--listen` is
//!   refused unless `--insecure-no-auth` is given.
//! - Lease tokens are signed with the secret of `--lease-secret-file` or
//!   `TOLLGATE_LEASE_SECRET` (at least 32 bytes; the same on every server that should finish
//!   the others' leases). Without one the process signs with a random key and says so: its
//!   leases finish only on this server.
//! - `--grpc ADDR` serves Envoy's rate limit service (gRPC) beside the HTTP API, over the
//!   same limiter, tokens, leases and metrics (docs/envoy.md); the same loopback rule.
//! - `--limits FILE` applies a limits file at start (a bad file refuses to start), again on
//!   SIGHUP and whenever its modification time changes; a bad file then is logged with its
//!   line and field and the limits and descriptor mapping in force stay (docs/limits-file.md).
//! - SIGINT / SIGTERM: graceful shutdown (open connections finish, open leases are
//!   committed). SIGHUP: re-read the auth file and the limits file; the server keeps
//!   running, with its connections and leases.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use serde_json::json;
use tollgate::Limiter;
use tollgate_server::{Auth, Server, ServerConfig, StoreMetrics, TokenSet};

use crate::fail::Failure;
use crate::spec;
use crate::store::{self, Access};
use crate::StoreArgs;

/// The environment variable holding inline token entries.
pub const TOKENS_ENV: &str = "TOLLGATE_AUTH_TOKENS";
/// The environment variable holding the lease secret itself.
pub const LEASE_SECRET_ENV: &str = "TOLLGATE_LEASE_SECRET";

/// Arguments of `serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Address to listen on (port 0 picks a free port; the address is printed). Without
    /// authentication only loopback addresses are accepted.
    #[arg(long, env = "TOLLGATE_LISTEN", default_value = "127.0.0.1:8080")]
    listen: String,
    /// How long an open lease is held; at expiry it is committed (debit stands,
    /// adjustments written).
    #[arg(long, default_value = "300s", value_parser = spec::parse_duration)]
    lease_ttl: Duration,
    /// The secret lease tokens are signed with (a file of at least 32 bytes; a trailing
    /// newline is ignored): give every server sharing the store the same one, and any of
    /// them can adjust, commit or roll back a lease another granted. The secret itself may
    /// come from TOLLGATE_LEASE_SECRET instead. Without either, a random per-process key:
    /// leases finish only on the server that granted them.
    #[arg(long, value_name = "PATH")]
    lease_secret_file: Option<PathBuf>,
    /// Bearer tokens, one `name:token:role` per line (role `client` or `admin`); re-read
    /// on SIGHUP. More entries may come from TOLLGATE_AUTH_TOKENS.
    #[arg(long, env = "TOLLGATE_AUTH_FILE", value_name = "PATH")]
    auth_file: Option<PathBuf>,
    /// Serve without authentication on a non-loopback address (anyone who can connect may
    /// change limits and delete entities).
    #[arg(long, conflicts_with = "auth_file")]
    insecure_no_auth: bool,
    /// Let every caller send its own `limits` in an acquire (otherwise only admin tokens
    /// may; others get 403 overrides_disabled).
    #[arg(long)]
    allow_limit_overrides: bool,
    /// Time allowed for a complete request head, at connect and between keep-alive
    /// requests (so also the idle keep-alive timeout).
    #[arg(long, default_value = "10s", value_parser = spec::parse_duration)]
    header_timeout: Duration,
    /// Time a request body may stall while it is read (then 408).
    #[arg(long, default_value = "10s", value_parser = spec::parse_duration)]
    body_timeout: Duration,
    /// Longest time a request may spend in the server (then 503 timeout).
    #[arg(long, default_value = "30s", value_parser = spec::parse_duration)]
    request_timeout: Duration,
    /// Most connections open at once; at the limit the server stops accepting.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Largest request body (bytes, or with KiB / MiB).
    #[arg(long, default_value = "64KiB", value_parser = spec::parse_bytes)]
    body_limit: usize,
    /// Largest request head: request line and headers (bytes, or with KiB / MiB).
    #[arg(long, default_value = "16KiB", value_parser = spec::parse_bytes)]
    max_header_size: usize,
    /// Do not run the feed aggregator (usage snapshots, background refills) in this process.
    /// By default it runs on a memory or SQLite store.
    #[arg(long, conflicts_with = "aggregate")]
    no_aggregate: bool,
    /// Run the feed aggregator in this process on a DynamoDB table too (by default a table's
    /// aggregator is `tollgate aggregate`, run apart; several share one checkpoint safely).
    #[arg(long)]
    aggregate: bool,
    #[command(flatten)]
    usage: crate::usage::UsageArgs,
    /// Also serve Envoy's rate limit service (RLS v3, gRPC) on this address (docs/envoy.md).
    /// Without authentication only loopback addresses are accepted.
    #[arg(long, env = "TOLLGATE_GRPC_LISTEN", value_name = "ADDR")]
    grpc: Option<String>,
    /// A limits file (TOML, docs/limits-file.md) applied at start, on SIGHUP and when it
    /// changes; it also holds the gRPC descriptor mapping.
    #[arg(long, env = "TOLLGATE_LIMITS_FILE", value_name = "FILE")]
    limits: Option<PathBuf>,
    /// How often the limits file's modification time is checked.
    #[arg(long, default_value = "1s", value_parser = spec::parse_duration)]
    limits_poll: Duration,
}

fn positive(name: &str, d: Duration) -> Result<(), Failure> {
    if d.is_zero() {
        return Err(Failure::BadInput(format!("{name} must be positive")));
    }
    Ok(())
}

/// The tokens of the file and the environment, if any.
fn auth_of(a: &ServeArgs) -> Result<Option<Arc<Auth>>, Failure> {
    let env = match std::env::var(TOKENS_ENV) {
        Ok(v) if !v.trim().is_empty() => Some(
            TokenSet::parse(&v, TOKENS_ENV, true).map_err(|e| Failure::BadInput(e.to_string()))?,
        ),
        _ => None,
    };
    if a.auth_file.is_none() && env.is_none() {
        return Ok(None);
    }
    if a.insecure_no_auth {
        return Err(Failure::BadInput(format!(
            "--insecure-no-auth contradicts the tokens in {TOKENS_ENV}"
        )));
    }
    Auth::new(a.auth_file.clone(), env)
        .map(|auth| Some(Arc::new(auth)))
        .map_err(|e| Failure::BadInput(e.to_string()))
}

/// The lease key of the secret file or the environment (`None`: neither is given).
fn lease_key_of(a: &ServeArgs) -> Result<Option<tollgate::LeaseKey>, Failure> {
    let env = std::env::var(LEASE_SECRET_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty());
    let (secret, from) = match (&a.lease_secret_file, env) {
        (Some(_), Some(_)) => {
            return Err(Failure::BadInput(format!(
                "--lease-secret-file and {LEASE_SECRET_ENV} are both given: give one"
            )))
        }
        (Some(p), None) => {
            let bytes = std::fs::read(p).map_err(|e| {
                Failure::BadInput(format!(
                    "cannot read --lease-secret-file {}: {e}",
                    p.display()
                ))
            })?;
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                if std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o077 != 0) {
                    tracing::warn!(path = %p.display(), "the lease secret file can be read by other users (chmod 600 it)");
                }
            }
            (bytes, format!("--lease-secret-file {}", p.display()))
        }
        (None, Some(v)) => (v.into_bytes(), LEASE_SECRET_ENV.to_string()),
        (None, None) => return Ok(None),
    };
    let trimmed = secret.trim_ascii_end();
    tollgate::LeaseKey::from_bytes(trimmed)
        .map(Some)
        .map_err(|e| Failure::BadInput(format!("{from}: {e}")))
}

/// Refuse a non-loopback address without authentication (unless told otherwise).
async fn check_listen(a: &ServeArgs, authed: bool) -> Result<(), Failure> {
    check_addr(a, "--listen", &a.listen, authed).await?;
    match &a.grpc {
        Some(g) => check_addr(a, "--grpc", g, authed).await,
        None => Ok(()),
    }
}

async fn check_addr(a: &ServeArgs, flag: &str, listen: &str, authed: bool) -> Result<(), Failure> {
    if authed {
        return Ok(());
    }
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(listen)
        .await
        .map_err(|e| Failure::BadInput(format!("cannot resolve {flag} {listen}: {e}")))?
        .collect();
    let loopback = !addrs.is_empty() && addrs.iter().all(|s| s.ip().is_loopback());
    if loopback {
        return Ok(());
    }
    if a.insecure_no_auth {
        tracing::warn!(%listen, "serving WITHOUT authentication on a non-loopback address (--insecure-no-auth)");
        return Ok(());
    }
    let what = if flag == "--listen" {
        listen.to_string()
    } else {
        format!("{listen} ({flag})")
    };
    Err(Failure::BadInput(format!(
        "refusing to listen on {what} without authentication: anyone who can connect could change limits and delete entities. \
         Give --auth-file (or {TOKENS_ENV}), listen on a loopback address (127.0.0.1), or pass --insecure-no-auth"
    )))
}

/// SIGINT or SIGTERM, whichever comes first. The handlers are installed when this is
/// called, not when the future is first polled: call it before the server announces itself,
/// so a signal sent as soon as the address is printed never meets the default action (which
/// ends the process without the graceful shutdown). Outside unix only Ctrl-C is heard.
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let (int, term) = {
        use tokio::signal::unix::{signal, SignalKind};
        let listen = |kind: SignalKind, name: &str| match signal(kind) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for {name}");
                None
            }
        };
        (
            listen(SignalKind::interrupt(), "SIGINT"),
            listen(SignalKind::terminate(), "SIGTERM"),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let wait = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = wait(int) => {},
                _ = wait(term) => {},
            }
        }
        #[cfg(not(unix))]
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
        tracing::info!("shutting down");
    }
}

/// SIGHUP re-reads the auth file. Installed before the server announces itself, so a
/// SIGHUP never meets the default action (which would end the process).
#[cfg(unix)]
fn reload_on_hangup(
    auth: Option<Arc<Auth>>,
    limits: Option<Arc<crate::limits_file::Follower>>,
) -> Result<(), Failure> {
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| Failure::Other(anyhow::anyhow!("cannot listen for SIGHUP: {e}")))?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            if let Some(f) = &limits {
                f.reload("SIGHUP").await;
            }
            match &auth {
                Some(a) if a.file().is_some() => match a.reload() {
                    Ok(n) => tracing::info!(tokens = n, "SIGHUP: auth file reloaded"),
                    Err(e) => {
                        tracing::error!(error = %e, "SIGHUP: auth file not reloaded; the tokens in force stay")
                    }
                },
                _ => tracing::info!("SIGHUP: no auth file to reload; still serving"),
            }
        }
    });
    Ok(())
}

#[cfg(not(unix))]
fn reload_on_hangup(
    _auth: Option<Arc<Auth>>,
    _limits: Option<Arc<crate::limits_file::Follower>>,
) -> Result<(), Failure> {
    Ok(())
}

/// Run the server until SIGINT / SIGTERM.
pub async fn run(a: ServeArgs, json_out: bool) -> Result<(), Failure> {
    positive("--lease-ttl", a.lease_ttl)?;
    positive("--header-timeout", a.header_timeout)?;
    positive("--body-timeout", a.body_timeout)?;
    positive("--request-timeout", a.request_timeout)?;
    if a.max_connections == 0 {
        return Err(Failure::BadInput(
            "--max-connections must be at least 1".into(),
        ));
    }
    if a.max_header_size < 1024 {
        return Err(Failure::BadInput(
            "--max-header-size must be at least 1KiB".into(),
        ));
    }
    let auth = auth_of(&a)?;
    let lease_key = lease_key_of(&a)?;
    check_listen(&a, auth.is_some()).await?;
    #[cfg(unix)]
    if let Some(p) = a.auth_file.as_deref() {
        use std::os::unix::fs::PermissionsExt;
        if std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o077 != 0) {
            tracing::warn!(path = %p.display(), "the auth file can be read by other users (chmod 600 it)");
        }
    }

    let store_metrics = StoreMetrics::new();
    let embedded = !matches!(a.store.store, store::StoreSpec::DynamoDb(_));
    let aggregating = !a.no_aggregate && (a.aggregate || embedded);
    let (limiter, run, probe) = if aggregating {
        let (limiter, run, probe) =
            crate::usage::open_run(&a.store, &a.usage, Access::Create, |s| {
                store_metrics.wrap(s)
            })
            .await?;
        (limiter, Some(run), probe)
    } else {
        let (raw, probe) = store::open_probed(
            &a.store.store,
            a.store.endpoint.as_deref(),
            Access::Create,
            a.store.store_timeout,
        )
        .await?;
        // The namespace by name (spec-base-system.md §7.3): its registered id is the prefix.
        // Changes the server makes itself (a limits file at start and on reload) are
        // recorded for `--principal` or the OS user; an HTTP admin route names its token.
        let limiter = a
            .store
            .audit
            .apply(Limiter::builder(store_metrics.wrap(raw)))
            .open_namespace(&a.store.namespace)
            .await?;
        (limiter, None, probe)
    };
    positive("--limits-poll", a.limits_poll)?;
    let follower = match &a.limits {
        Some(p) => {
            let (f, n) = crate::limits_file::Follower::start(p.clone(), limiter.clone()).await?;
            tracing::info!(file = %p.display(), changes = n, "limits file applied");
            Some(Arc::new(f))
        }
        None => None,
    };
    let mapping = follower.as_ref().map(|f| f.mapping()).unwrap_or_default();
    let listener = tokio::net::TcpListener::bind(&a.listen)
        .await
        .map_err(|e| Failure::BadInput(format!("cannot listen on {}: {e}", a.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::Other(e.into()))?;
    let grpc_listener = match &a.grpc {
        Some(g) => Some(
            tokio::net::TcpListener::bind(g)
                .await
                .map_err(|e| Failure::BadInput(format!("cannot listen on --grpc {g}: {e}")))?,
        ),
        None => None,
    };
    let grpc_addr = grpc_listener
        .as_ref()
        .map(|l| l.local_addr())
        .transpose()
        .map_err(|e| Failure::Other(e.into()))?;
    let cfg = ServerConfig {
        lease_ttl: a.lease_ttl,
        allow_limit_overrides: a.allow_limit_overrides,
        header_timeout: a.header_timeout,
        body_timeout: a.body_timeout,
        request_timeout: a.request_timeout,
        max_connections: a.max_connections,
        body_limit: a.body_limit,
        max_header_bytes: a.max_header_size,
        lease_key: lease_key.clone(),
        ..Default::default()
    };
    let mut builder = Server::builder(limiter)
        .config(cfg)
        .store_metrics(store_metrics);
    if let Some(auth) = &auth {
        builder = builder.auth(auth.clone());
    }
    if let Some(run) = run {
        builder = builder.aggregator(run);
    }
    if let Some(store) = probe {
        builder = builder.group_commit(store);
    }
    let server = builder.build();
    reload_on_hangup(auth.clone(), follower.clone())?;
    // Installed now, before the address is announced (see `shutdown_signal`).
    let signals = shutdown_signal();
    if let Some(f) = &follower {
        crate::limits_file::watch(f.clone(), a.limits_poll);
    }

    let tokens = auth.as_ref().map(|x| x.tokens().len());
    let store_name = a.store.store.to_string();
    if json_out {
        crate::print_json(&json!({
            "listening": format!("http://{addr}"),
            "store": store_name,
            "auth": tokens.is_some(),
            "tokens": tokens,
            "shared_leases": lease_key.is_some(),
            "aggregator": aggregating,
            "grpc": grpc_addr.map(|g| g.to_string()),
            "limits_file": a.limits.as_ref().map(|p| p.display().to_string()),
        }));
    } else {
        let auth_note = match tokens {
            Some(n) => format!("{n} bearer token(s)"),
            None => "no authentication".into(),
        };
        let lease_note = if lease_key.is_some() {
            "leases signed with the shared secret"
        } else {
            "leases finish only on this server: no lease secret"
        };
        let agg_note = if aggregating {
            "aggregator running"
        } else {
            "no aggregator"
        };
        // One line (scripts read the addresses from it): the HTTP API, then the gRPC service.
        let grpc_note = grpc_addr
            .map(|g| format!(" and Envoy's rate limit service on grpc://{g}"))
            .unwrap_or_default();
        println!(
            "tollgate listening on http://{addr}{grpc_note} (store {store_name}, {auth_note}, {lease_note}, {agg_note})"
        );
    }
    let _ = std::io::stdout().flush();
    tracing::info!(%addr, grpc = ?grpc_addr, store = %store_name, auth = tokens.is_some(), "listening");
    // One shutdown for both servers.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        signals.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let grpc = match grpc_listener {
        Some(l) => {
            let s = server.clone();
            let rx = stop_rx.clone();
            Some(tokio::spawn(async move {
                s.serve_grpc(mapping, l, stopped(rx)).await
            }))
        }
        None => None,
    };
    let http = server.serve(listener, stopped(stop_rx)).await;
    if let Some(g) = grpc {
        match g.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "the gRPC server failed"),
            Err(e) => tracing::error!(error = %e, "the gRPC server task failed"),
        }
    }
    http.map_err(|e| Failure::Other(e.into()))
}

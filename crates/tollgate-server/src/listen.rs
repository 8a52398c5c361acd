//! Accepting connections: hyper's HTTP/1.1 server with its header read timeout and head size
//! limit, a cap on open connections, and graceful shutdown (hyper-util's
//! `GracefulShutdown`).
//!
//! - **Connection cap.** A connection holds one permit of a semaphore of
//!   [`ServerConfig::max_connections`](crate::ServerConfig::max_connections) until it
//!   closes; without a permit the server does not accept, so descriptors stay bounded and
//!   waiting clients queue in the kernel's listen backlog.
//! - **Slow clients.** A head not complete within
//!   [`header_timeout`](crate::ServerConfig::header_timeout) (also the idle time allowed
//!   between keep-alive requests) closes the connection; a body that stalls is cut by the
//!   router's body timeout.
//! - **Accept errors** (out of descriptors, …) are logged and retried after a pause instead of
//!   spinning or ending the server.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

use crate::wire::WireIo;
use crate::AppState;

/// How long to pause after an accept error that is not about one connection.
const ACCEPT_PAUSE: Duration = Duration::from_millis(250);

fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// Serve `router` on `listener` until `shutdown`; then wait for open connections (at most
/// the shutdown timeout).
pub async fn run(
    app: Arc<AppState>,
    router: Router,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let cfg = app.config.clone();
    debug_assert!(cfg.max_connections > 0);
    let permits = Arc::new(Semaphore::new(cfg.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(cfg.header_timeout)
        .max_header_size(cfg.max_header_bytes)
        .keep_alive(true);
    tokio::pin!(shutdown);
    let mut at_limit = false;
    loop {
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => {
                at_limit = false;
                p
            }
            Err(_) => {
                if !at_limit {
                    tracing::warn!(
                        max_connections = cfg.max_connections,
                        "connection limit reached; not accepting until a connection closes"
                    );
                    at_limit = true;
                }
                tokio::select! {
                    p = permits.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => break,
                    },
                    _ = &mut shutdown => break,
                }
            }
        };
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "accept failed; pausing");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let svc = router.clone().map_request(
            move |mut req: axum::http::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(ConnectInfo::<SocketAddr>(peer));
                req
            },
        );
        let io = TokioIo::new(WireIo::new(tcp, peer.to_string(), app.clone()));
        let conn = graceful.watch(http.serve_connection(io, TowerToHyperService::new(svc)));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    let open = graceful.count();
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(cfg.shutdown_timeout) => {
            tracing::warn!(open, "connections still open at the shutdown timeout; closing");
        }
    }
    Ok(())
}

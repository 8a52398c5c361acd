//! Helpers: a server on a loopback port, and a raw HTTP/1.1 reader.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate::Limiter;
use tollgate_server::{Server, ServerConfig};
use tollgate_store::MemoryStore;

pub struct Running {
    pub addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Running {
    pub async fn start(cfg: ServerConfig) -> Running {
        let limiter = Limiter::new(Arc::new(MemoryStore::new())).unwrap();
        Self::serve(Server::new(limiter, cfg)).await
    }

    pub async fn serve(server: Server) -> Running {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server
                .serve(listener, async move {
                    let _ = rx.await;
                })
                .await
        });
        Running {
            addr,
            stop: Some(tx),
            task,
        }
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        (&mut self.task).await.unwrap().unwrap();
    }
}

/// One parsed answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub head: String,
    pub body: Value,
    pub text: String,
}

/// Read one answer (head and a content-length body; none for a `HEAD` request) from `s`.
pub async fn read_answer(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    head_request: bool,
) -> Option<Answer> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            let len = if head_request { 0 } else { len };
            while buf.len() < end + 4 + len {
                let mut chunk = [0u8; 4096];
                let n = s.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            let body = buf[end + 4..end + 4 + len].to_vec();
            buf.drain(..end + 4 + len);
            let status = head.get(9..12)?.parse().ok()?;
            return Some(Answer {
                status,
                head,
                body: serde_json::from_slice(&body).unwrap_or(Value::Null),
                text: String::from_utf8_lossy(&body).to_string(),
            });
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Send raw bytes on a fresh connection and read one answer.
pub async fn raw(addr: std::net::SocketAddr, bytes: &[u8]) -> Answer {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut buf = Vec::new();
    read_answer(&mut s, &mut buf, false)
        .await
        .unwrap_or_else(|| {
            panic!(
                "no answer to {:?}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(80)])
            )
        })
}

/// Wait until the server closes `s`; how long it took.
pub async fn closed_after(s: &mut TcpStream, limit: Duration) -> Duration {
    let t = Instant::now();
    let mut chunk = [0u8; 1024];
    loop {
        match tokio::time::timeout(limit, s.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return t.elapsed(),
            Ok(Ok(_)) => continue,
            Err(_) => panic!("still open after {limit:?}"),
        }
    }
}

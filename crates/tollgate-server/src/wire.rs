//! JSON bodies for the answers hyper writes on its own.
//!
//! When a request head cannot be parsed (a malformed request line or header, a URI over
//! hyper's limit, a head over [`crate::ServerConfig::max_header_bytes`] or more than 100
//! headers), hyper never calls the service: it writes `400`, `414` or `431` with an empty
//! body and closes the connection. hyper has no hook for that answer, so [`WireIo`] — the
//! connection's transport — recognises it on its way out and writes a JSON error instead:
//!
//! - the answer is a complete response head with a `4xx`/`5xx` status at the end of what
//!   hyper asks to write;
//! - it carries no `x-request-id` header. Every response the router produces has one (see
//!   [`crate::request_id`]), so only hyper's own answers lack it.
//!
//! The replacement has the same status, `{"error": code, "message": …}` (`bad_request`,
//! `uri_too_long`, `headers_too_large`), a fresh `x-request-id`, and `connection: close`; it
//! is counted in the request metrics with route `unparsed` and logged like every request.
//!
//! The transport reports itself as not vectored, so hyper hands it one flat buffer per
//! write and a head is never split across buffers of one call.
//!
//! # Lingering close
//!
//! When the server ends a connection while the client is still sending (a body the route
//! did not read, a refused oversized body, a malformed request), closing the socket with
//! unread input makes the kernel send a reset, which can destroy the answer before the
//! client reads it. So on shutdown [`WireIo`] sends its FIN, then reads and discards what
//! the client still sends until the client closes, [`LINGER`] passes or [`LINGER_BYTES`]
//! were discarded — the lingering close of nginx and Go's `net/http`.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use crate::AppState;

/// Longest wait for the client to close after the server's FIN.
pub const LINGER: std::time::Duration = std::time::Duration::from_secs(1);

/// Most bytes discarded while lingering.
pub const LINGER_BYTES: usize = 1 << 20;

/// A connection's transport: `T` with hyper's own error answers rewritten and a lingering
/// close (module docs).
#[derive(Debug)]
pub struct WireIo<T> {
    inner: T,
    /// A rewritten answer still to be written, and how much of it was written.
    pending: Option<(Vec<u8>, usize)>,
    peer: String,
    app: Arc<AppState>,
    /// Set once the write side is shut down: until when to discard input.
    linger: Option<Pin<Box<Sleep>>>,
    lingered_bytes: usize,
}

impl<T> WireIo<T> {
    /// Wrap a connection from `peer`.
    pub fn new(inner: T, peer: String, app: Arc<AppState>) -> Self {
        WireIo {
            inner,
            pending: None,
            peer,
            app,
            linger: None,
            lingered_bytes: 0,
        }
    }
}

const HEAD_END: &[u8] = b"\r\n\r\n";

/// Where hyper's own error answer starts in `buf`, and its status: a suffix of `buf` that is
/// one complete response head with a 4xx/5xx status and no `x-request-id` header.
pub(crate) fn automatic_answer(buf: &[u8]) -> Option<(usize, u16)> {
    if !buf.ends_with(HEAD_END) {
        return None;
    }
    // The head starts at the last "HTTP/1." whose suffix holds exactly one head end.
    let mut at = None;
    let mut i = 0;
    while let Some(p) = find(&buf[i..], b"HTTP/1.") {
        at = Some(i + p);
        i += p + 1;
    }
    let start = at?;
    let head = &buf[start..];
    if find(head, HEAD_END) != Some(head.len() - HEAD_END.len()) {
        return None;
    }
    // "HTTP/1.1 431 Request Header Fields Too Large\r\n"
    let status: u16 = std::str::from_utf8(head.get(9..12)?).ok()?.parse().ok()?;
    if !(400..600).contains(&status) || head.get(8) != Some(&b' ') {
        return None;
    }
    let lower = head.to_ascii_lowercase();
    if find(&lower, b"\r\nx-request-id:").is_some() {
        return None;
    }
    Some((start, status))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The stable code and message of an answer hyper wrote for `status`.
pub(crate) fn code_of(status: u16) -> (&'static str, &'static str) {
    match status {
        414 => (
            "uri_too_long",
            "the request URI is longer than the server accepts",
        ),
        431 => (
            "headers_too_large",
            "the request head (request line and headers) is larger than the server accepts, or has too many headers",
        ),
        400 => (
            "bad_request",
            "the request could not be parsed as HTTP/1.1 (request line, header or framing)",
        ),
        _ => ("bad_request", "the request could not be processed"),
    }
}

fn reason(status: u16) -> &'static str {
    axum::http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error")
}

fn rewrite(status: u16, request_id: &str) -> Vec<u8> {
    let (code, message) = code_of(status);
    let body = serde_json::json!({ "error": code, "message": message }).to_string();
    format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nx-request-id: {request_id}\r\nconnection: close\r\n\r\n{body}",
        reason(status),
        body.len()
    )
    .into_bytes()
}

impl<T: AsyncWrite + Unpin> WireIo<T> {
    /// Write what is pending; `Ready(Ok)` once nothing is.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, done)) = &mut self.pending {
            if *done >= bytes.len() {
                self.pending = None;
                break;
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*done..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *done += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> WireIo<T> {
    /// Discard input until EOF, an error, the deadline or the byte cap.
    fn poll_linger(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let mut scratch = [0u8; 8192];
        while self.lingered_bytes < LINGER_BYTES {
            let mut rb = ReadBuf::new(&mut scratch);
            match Pin::new(&mut self.inner).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if rb.filled().is_empty() => return Poll::Ready(()),
                Poll::Ready(Ok(())) => self.lingered_bytes += rb.filled().len(),
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Pending => {
                    return match self.linger.as_mut() {
                        Some(deadline) => deadline.as_mut().poll(cx),
                        None => Poll::Ready(()),
                    }
                }
            }
        }
        Poll::Ready(())
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WireIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WireIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = &mut *self;
        ready!(me.drain(cx))?;
        match automatic_answer(buf) {
            Some((0, status)) => {
                let id = crate::request_id::fresh();
                me.app
                    .metrics
                    .request("other", "unparsed", status, std::time::Duration::ZERO);
                tracing::info!(
                    target: "tollgate::access",
                    request_id = %id,
                    peer = %me.peer,
                    principal = "-",
                    method = "-",
                    path = "-",
                    route = "unparsed",
                    status,
                    latency_ms = 0.0,
                    "request"
                );
                me.pending = Some((rewrite(status, &id), 0));
                // Written or not yet, the answer is ours to deliver now: flush and shutdown
                // drain it.
                if let Poll::Ready(Err(e)) = me.drain(cx) {
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(Ok(buf.len()))
            }
            // Bytes before hyper's answer go out first, unchanged.
            Some((start, _)) => Pin::new(&mut me.inner).poll_write(cx, &buf[..start]),
            None => Pin::new(&mut me.inner).poll_write(cx, buf),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.linger.is_none() {
            ready!(self.drain(cx))?;
            ready!(Pin::new(&mut self.inner).poll_flush(cx))?;
            ready!(Pin::new(&mut self.inner).poll_shutdown(cx))?;
            self.linger = Some(Box::pin(tokio::time::sleep(LINGER)));
        }
        ready!(self.poll_linger(cx));
        Poll::Ready(Ok(()))
    }

    fn is_write_vectored(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_only_heads_without_a_request_id() {
        let auto =
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        assert_eq!(automatic_answer(auto), Some((0, 431)));
        let mut after =
            b"HTTP/1.1 200 OK\r\nx-request-id: a\r\ncontent-length: 2\r\n\r\n{}".to_vec();
        let start = after.len();
        after.extend_from_slice(auto);
        assert_eq!(automatic_answer(&after), Some((start, 431)));
        let ours = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\nX-Request-Id: a\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(automatic_answer(ours), None);
        assert_eq!(automatic_answer(b"HTTP/1.1 100 Continue\r\n\r\n"), None);
        assert_eq!(automatic_answer(b"HTTP/1.1 200 OK\r\n\r\n"), None);
        assert_eq!(automatic_answer(b"{\"a\":1}"), None);
        assert_eq!(
            automatic_answer(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n"),
            Some((0, 400))
        );
    }

    #[test]
    fn rewritten_answers_are_json() {
        for status in [400, 414, 431] {
            let r = rewrite(status, "abc");
            let text = String::from_utf8(r).unwrap();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            assert!(head.starts_with(&format!("HTTP/1.1 {status} ")), "{head}");
            assert!(head.contains(&format!("content-length: {}", body.len())));
            let v: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(v["error"], code_of(status).0);
        }
    }
}

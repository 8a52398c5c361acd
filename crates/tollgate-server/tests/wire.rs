//! Over real TCP: hyper's own refusals come back as JSON, slow clients are disconnected, idle
//! keep-alive connections are closed, and the connection cap holds.

mod common;

use std::time::{Duration, Instant};

use common::{closed_after, raw, read_answer, Running};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tollgate_server::ServerConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyper_refusals_are_json_with_codes() {
    let srv = Running::start(ServerConfig::default()).await;
    let long_uri = format!("GET /{} HTTP/1.1\r\nhost: x\r\n\r\n", "a".repeat(9000));
    let many_headers = format!(
        "GET /livez HTTP/1.1\r\nhost: x\r\n{}\r\n",
        (0..150)
            .map(|i| format!("x-h{i}: v\r\n"))
            .collect::<String>()
    );
    let big_header = format!(
        "GET /livez HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "b".repeat(20_000)
    );
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (
            b"G@T /livez HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(),
            400,
            "bad_request",
        ),
        (
            b"GET /livez HTTP/1.1\r\nbad header: x\r\n\r\n".to_vec(),
            400,
            "bad_request",
        ),
        (
            b"POST /v1/acquire HTTP/1.1\r\nhost: x\r\ncontent-length: abc\r\n\r\n".to_vec(),
            400,
            "bad_request",
        ),
        (
            b"GET /livez HTTP/9.9\r\nhost: x\r\n\r\n".to_vec(),
            400,
            "bad_request",
        ),
        (
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n".to_vec(),
            400,
            "bad_request",
        ),
        (long_uri.into_bytes(), 414, "uri_too_long"),
        (many_headers.into_bytes(), 431, "headers_too_large"),
        (big_header.into_bytes(), 431, "headers_too_large"),
        (
            b"GET /nope HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(),
            404,
            "not_found",
        ),
        (
            b"FROB /livez HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(),
            405,
            "method_not_allowed",
        ),
        (
            format!(
                "POST /v1/acquire HTTP/1.1\r\nhost: x\r\ncontent-length: 70000\r\n\r\n{}",
                "x".repeat(70_000)
            )
            .into_bytes(),
            413,
            "payload_too_large",
        ),
    ];
    for (bytes, status, code) in cases {
        let a = raw(srv.addr, &bytes).await;
        let what = String::from_utf8_lossy(&bytes[..bytes.len().min(40)]).to_string();
        assert_eq!(a.status, status, "{what:?}: {a:?}");
        assert_eq!(a.body["error"], code, "{what:?}: {a:?}");
        assert!(a.body["message"].is_string(), "{what:?}: {a:?}");
        assert!(
            a.head.to_ascii_lowercase().contains("\r\nx-request-id: "),
            "{a:?}"
        );
        assert!(a.head.contains("content-type: application/json"), "{a:?}");
    }

    // A malformed request after a good one on the same keep-alive connection.
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(
        b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\nGET /livez HTTP/1.1\r\nno colon here\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let a = read_answer(&mut s, &mut buf, false).await.unwrap();
    assert_eq!((a.status, a.body["status"].as_str()), (200, Some("ok")));
    let b = read_answer(&mut s, &mut buf, false).await.unwrap();
    assert_eq!(
        (b.status, b.body["error"].as_str()),
        (400, Some("bad_request")),
        "{b:?}"
    );
    closed_after(&mut s, Duration::from_secs(5)).await;

    // Still serving.
    let a = raw(srv.addr, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert_eq!(a.status, 200);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_disconnected_within_the_timeouts() {
    let cfg = ServerConfig {
        header_timeout: Duration::from_millis(400),
        body_timeout: Duration::from_millis(400),
        ..Default::default()
    };
    let srv = Running::start(cfg).await;

    // Headers never finished.
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: ")
        .await
        .unwrap();
    let took = closed_after(&mut s, Duration::from_secs(5)).await;
    assert!(took >= Duration::from_millis(300), "{took:?}");
    eprintln!("head never finished: closed after {took:?} (header timeout 400 ms)");

    // Nothing sent at all.
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    let took = closed_after(&mut s, Duration::from_secs(5)).await;
    eprintln!("nothing sent: closed after {took:?}");

    // Body never sent: 408 body_timeout, then the connection is closed.
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(b"POST /v1/acquire HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"ent")
        .await
        .unwrap();
    let t = Instant::now();
    let mut buf = Vec::new();
    let a = read_answer(&mut s, &mut buf, false).await.unwrap();
    assert_eq!(
        (a.status, a.body["error"].as_str()),
        (408, Some("body_timeout")),
        "{a:?}"
    );
    closed_after(&mut s, Duration::from_secs(5)).await;
    eprintln!(
        "body never sent: 408 and closed after {:?} (body timeout 400 ms)",
        t.elapsed()
    );

    // Idle keep-alive: one answer, then nothing; closed after the header timeout.
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    assert_eq!(
        read_answer(&mut s, &mut buf, false).await.unwrap().status,
        200
    );
    let took = closed_after(&mut s, Duration::from_secs(5)).await;
    eprintln!("idle keep-alive: closed after {took:?}");

    // A keep-alive connection that keeps sending is served for longer than the timeout.
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    let mut buf = Vec::new();
    for _ in 0..4 {
        s.write_all(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(
            read_answer(&mut s, &mut buf, false).await.unwrap().status,
            200
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_cap_holds_until_a_connection_closes() {
    let cfg = ServerConfig {
        max_connections: 2,
        header_timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let srv = Running::start(cfg).await;
    let idle1 = TcpStream::connect(srv.addr).await.unwrap();
    let _idle2 = TcpStream::connect(srv.addr).await.unwrap();
    // Let the server accept both.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut third = TcpStream::connect(srv.addr).await.unwrap();
    third
        .write_all(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let early = tokio::time::timeout(
        Duration::from_millis(500),
        read_answer(&mut third, &mut buf, false),
    )
    .await;
    assert!(early.is_err(), "answered beyond the cap: {early:?}");
    drop(idle1);
    let a = tokio::time::timeout(
        Duration::from_secs(5),
        read_answer(&mut third, &mut buf, false),
    )
    .await
    .expect("answered once a slot freed")
    .unwrap();
    assert_eq!(a.status, 200);
    srv.stop().await;
}

/// Send a POST of `/v1/acquire` whose body comes in `chunks` (chunked transfer encoding,
/// one write per chunk, a pause between them so that each arrives on its own); its answer.
async fn chunked_acquire(addr: std::net::SocketAddr, chunks: &[&[u8]]) -> common::Answer {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST /v1/acquire HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    for c in chunks {
        let mut frame = format!("{:x}\r\n", c.len()).into_bytes();
        frame.extend_from_slice(c);
        frame.extend_from_slice(b"\r\n");
        s.write_all(&frame).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.write_all(b"0\r\n\r\n").await.unwrap();
    let mut buf = Vec::new();
    read_answer(&mut s, &mut buf, false)
        .await
        .expect("an answer")
}

/// A body that comes in several pieces is read whole: a field in its last piece is seen
/// (an unknown one is refused by name), and the limit counts every piece (`413`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_in_pieces_is_read_whole_and_limited_whole() {
    let srv = Running::start(ServerConfig::default()).await;
    let a = chunked_acquire(
        srv.addr,
        &[
            b"{\"entity\":\"e\",",
            b"\"resource\":\"r\",",
            b"\"bogus_field\":1}",
        ],
    )
    .await;
    assert_eq!(a.status, 400, "{a:?}");
    assert_eq!(a.body["error"], "invalid_request", "{a:?}");
    assert!(
        a.body["message"]
            .as_str()
            .unwrap_or("")
            .contains("bogus_field"),
        "{a:?}"
    );
    // 3 pieces of 30,000 bytes: each under the 64 KiB limit, together over it.
    let piece = vec![b' '; 30_000];
    let a = chunked_acquire(srv.addr, &[&piece, &piece, &piece]).await;
    assert_eq!(a.status, 413, "{a:?}");
    assert_eq!(a.body["error"], "payload_too_large", "{a:?}");
    srv.stop().await;
}

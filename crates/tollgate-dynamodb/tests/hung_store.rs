//! A hung DynamoDB: the server process frozen with SIGSTOP keeps its port open (the kernel
//! still accepts connections and buffers requests) but never answers. Every store call must
//! come back within its deadline: a read as `Unavailable`, a write whose request went out as
//! `Ambiguous`; once the process is resumed, calls work again.
//!
//! The test freezes a DynamoDB Local of its own (started with `scripts/dynamodb-local` on a
//! free port and stopped at the end), never the shared instance at
//! `TOLLGATE_DYNAMODB_ENDPOINT`; a guard resumes the process whatever happens. Skipped, like
//! every DynamoDB Local test, when `TOLLGATE_DYNAMODB_ENDPOINT` is unset.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use tollgate_core::expr::{ReturnValues, Update};
use tollgate_core::value::{Item, Key, Value};
use tollgate_dynamodb::{DynamoDbError, DynamoDbStore};
use tollgate_store::{PutRequest, Store, StoreError, UpdateRequest};

/// The deadline under test: short, so the test is fast.
const DEADLINE: Duration = Duration::from_millis(500);
/// The bound the calls must meet: the deadline plus a generous margin for a loaded machine
/// (a hang would take the SDK's own minute or forever).
const BOUND: Duration = Duration::from_millis(5 * 500);

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/dynamodb-local")
}

/// A DynamoDB Local of this test's own; stopped (resumed first) when dropped.
struct OwnServer {
    port: u16,
    pid: i32,
    endpoint: String,
    /// The script's log of this instance, removed with it.
    log: PathBuf,
}

impl OwnServer {
    fn start() -> OwnServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let out = Command::new(script())
            .args(["start", &port.to_string()])
            .output()
            .expect("scripts/dynamodb-local runs");
        assert!(
            out.status.success(),
            "scripts/dynamodb-local start {port} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let endpoint = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let home = std::env::var("DDB_LOCAL_HOME").unwrap_or_else(|_| {
            format!(
                "{}/.cache/dynamodb-local",
                std::env::var("HOME").unwrap_or_default()
            )
        });
        let pidfile = format!("{home}/ddb-{port}.pid");
        let log = PathBuf::from(format!("{home}/ddb-{port}.log"));
        let pid = std::fs::read_to_string(&pidfile)
            .unwrap_or_else(|e| panic!("{pidfile}: {e}"))
            .trim()
            .parse()
            .expect("a pid");
        OwnServer {
            port,
            pid,
            endpoint,
            log,
        }
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        signal(self.pid, libc::SIGCONT);
        let _ = Command::new(script())
            .args(["stop", &self.port.to_string()])
            .status();
        let _ = std::fs::remove_file(&self.log);
    }
}

fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) on a pid this test started; no memory is shared.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

/// SIGSTOP now, SIGCONT when dropped (also when the test panics).
struct Frozen(i32);

impl Frozen {
    fn new(pid: i32) -> Frozen {
        signal(pid, libc::SIGSTOP);
        // kill(2) returns before every thread has stopped: wait until the process state is
        // "stopped" (`T` in /proc/PID/stat), or a request could still be served.
        let stat = format!("/proc/{pid}/stat");
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(5) {
            let state = std::fs::read_to_string(&stat)
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .map(|(_, r)| r.trim_start().chars().next())
                })
                .flatten();
            if state == Some('T') {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // Let the threads that were mid-request settle too.
        std::thread::sleep(Duration::from_millis(50));
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: as in `signal`; never panics inside drop.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

fn bump() -> UpdateRequest {
    UpdateRequest {
        key: Key::new("p", "s"),
        update: Update::new().add("n", 1),
        condition: None,
        returns: ReturnValues::None,
    }
}

async fn store(endpoint: &str, table: &str, deadline: Duration) -> DynamoDbStore {
    let mut b = DynamoDbStore::builder(table)
        .endpoint(endpoint)
        .deadline(deadline);
    if std::env::var("AWS_ACCESS_KEY_ID").is_err() {
        b = b.static_credentials("test", "test");
    }
    b.build().await.expect("store builds")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_dynamodb_answers_within_the_deadline() {
    if common::endpoint("a_frozen_dynamodb_answers_within_the_deadline").is_none() {
        return;
    }
    let server = OwnServer::start();
    let table = common::table_name("hung");
    // Set-up on a patient store: a fresh JVM is slow on its first requests.
    let admin = store(&server.endpoint, &table, common::TEST_DEADLINE).await;
    admin.create_table().await.expect("table created");
    admin
        .put(PutRequest {
            key: Key::new("p", "s"),
            item: Item::from([("n".into(), Value::N(1))]),
            condition: None,
        })
        .await
        .expect("seed");
    let s = store(&server.endpoint, &table, DEADLINE).await;
    assert_eq!(s.deadline(), DEADLINE);
    // Warm: the connection pool holds an open connection when the server freezes.
    let got = s.get(&Key::new("p", "s"), true).await.expect("get");
    assert_eq!(got.and_then(|i| i.get("n").cloned()), Some(Value::N(1)));

    // A limiter over the same store, warm (limits cached, bucket written) before the freeze.
    let lim = tollgate::Limiter::builder(std::sync::Arc::new(s.clone()))
        .build()
        .expect("limiter");
    let quota = tollgate::Limit::quota_after("q", 100, Duration::from_secs(3600)).expect("limit");
    lim.admin()
        .set_limits(&tollgate::Scope::Resource("r".into()), &[quota])
        .await
        .expect("limits");
    lim.acquire("u", "r", &[("q", 1)])
        .await
        .expect("warm acquire")
        .commit()
        .await
        .expect("commit");
    let allow = tollgate::AcquireOptions {
        limits: None,
        on_unavailable: Some(tollgate::OnUnavailable::Allow),
    };

    {
        let _frozen = Frozen::new(server.pid);

        // The limiter: `block` refuses as an outage, `allow` admits degraded, both within
        // the deadline's bound.
        let t = Instant::now();
        let r = lim.acquire("u", "r", &[("q", 1)]).await;
        let block_took = t.elapsed();
        match r {
            Err(e) => assert!(e.is_outage(), "block: {e}"),
            Ok(l) => panic!("block admitted through a frozen store: {l:?}"),
        }
        assert!(block_took < BOUND, "block acquire took {block_took:?}");
        let t = Instant::now();
        let l = lim
            .acquire_with("u", "r", &[("q", 1)], allow.clone())
            .await
            .expect("allow admits");
        let allow_took = t.elapsed();
        assert!(l.is_degraded());
        assert!(allow_took < BOUND, "allow acquire took {allow_took:?}");
        eprintln!("frozen: acquire block {block_took:?}, allow {allow_took:?}");

        let t = Instant::now();
        let r = s.get(&Key::new("p", "s"), true).await;
        let read_took = t.elapsed();
        assert!(matches!(r, Err(StoreError::Unavailable(_))), "get: {r:?}");
        assert!(read_took < BOUND, "get took {read_took:?}");

        // The request is sent (the kernel accepts for the frozen process), so its outcome
        // is unknown: Ambiguous, never a silent success or a hang.
        let t = Instant::now();
        let r = s.update(bump()).await;
        let write_took = t.elapsed();
        assert!(matches!(r, Err(StoreError::Ambiguous(_))), "update: {r:?}");
        assert!(write_took < BOUND, "update took {write_took:?}");

        let t = Instant::now();
        let r = s.check_table().await;
        let check_took = t.elapsed();
        match r {
            Err(e @ DynamoDbError::Api { .. }) => assert!(e.is_unavailable(), "{e}"),
            other => panic!("check_table: expected an outage, got {other:?}"),
        }
        assert!(check_took < BOUND, "check_table took {check_took:?}");
        eprintln!(
            "frozen, deadline {DEADLINE:?}: get {read_took:?}, update {write_took:?}, \
             check_table {check_took:?}"
        );
    }

    // Resumed: calls work again (the server first drains what queued up while frozen).
    let resumed = Instant::now();
    let mut last = None;
    let mut worked = false;
    while resumed.elapsed() < Duration::from_secs(20) {
        match s.get(&Key::new("p", "s"), true).await {
            Ok(_) => {
                worked = true;
                break;
            }
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(worked, "get never worked again: {last:?}");
    s.update(bump()).await.expect("update works again");
    let after = s.get(&Key::new("p", "s"), true).await.expect("get");
    let n = after.and_then(|i| i.get("n").and_then(Value::as_n));
    // 1, plus the acknowledged update, plus the ambiguous one if the resumed server applied
    // it (it may, and at any moment after resuming: exactly what Ambiguous says).
    assert!(matches!(n, Some(2) | Some(3)), "n = {n:?}");
    s.check_table().await.expect("check_table works again");
    drop(server);
}

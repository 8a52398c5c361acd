//! Helpers: run the real `tollgate` binary.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

/// A running `tollgate serve`.
pub struct ServerProc {
    pub child: Child,
    pub base: String,
    /// `http://ADDR` of the gRPC service, when started with `--grpc`.
    pub grpc: Option<String>,
}

/// How to start a server.
#[derive(Default)]
pub struct Opts<'a> {
    /// `RUST_LOG` (default `warn`).
    pub rust_log: Option<&'a str>,
    /// Write stderr here instead of inheriting it.
    pub stderr_to: Option<&'a Path>,
    /// Extra environment.
    pub env: Vec<(&'a str, String)>,
}

impl ServerProc {
    /// Start `tollgate serve --store sqlite:DB --listen 127.0.0.1:0` and read the address it
    /// prints.
    pub fn start(db: &Path, extra: &[&str]) -> ServerProc {
        Self::start_with(db, extra, Opts::default())
    }

    /// As [`ServerProc::start`], with options.
    pub fn start_with(db: &Path, extra: &[&str], o: Opts<'_>) -> ServerProc {
        let store = format!("sqlite:{}", db.display());
        let mut args = vec!["--store", store.as_str()];
        args.extend_from_slice(extra);
        Self::start_args(&args, o)
    }

    /// Start `tollgate serve --listen 127.0.0.1:0 ARGS` (ARGS name the store).
    pub fn start_args(args: &[&str], o: Opts<'_>) -> ServerProc {
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", o.rust_log.unwrap_or("warn"))
            .env_remove("TOLLGATE_AUTH_TOKENS")
            .env_remove("TOLLGATE_AUTH_FILE")
            .env_remove("TOLLGATE_LEASE_SECRET")
            .stdout(Stdio::piped());
        for (k, v) in &o.env {
            cmd.env(k, v);
        }
        match o.stderr_to {
            Some(p) => cmd.stderr(std::fs::File::create(p).expect("stderr file")),
            None => cmd.stderr(Stdio::inherit()),
        };
        let mut child = cmd.spawn().expect("spawn tollgate serve");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the listening line");
        let base = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_string();
        let grpc = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("grpc://"))
            .map(|a| format!("http://{a}"));
        ServerProc { child, base, grpc }
    }

    /// Send a signal (`HUP`, `TERM`, ...).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -{sig}");
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().expect("wait").is_none()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// SIGTERM, then wait (at most 20 s) for a clean exit.
    pub fn stop(mut self) {
        let pid = self.child.id().to_string();
        let ok = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success();
        assert!(ok);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                assert!(st.success(), "server exited with {st}");
                return;
            }
            assert!(Instant::now() < deadline, "server did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run the CLI to completion.
pub fn tollgate(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "error")
        .env_remove("TOLLGATE_STORE")
        .output()
        .expect("run tollgate")
}

pub fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

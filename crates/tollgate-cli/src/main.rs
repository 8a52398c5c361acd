//! The `tollgate` binary: run the HTTP server, and operate a limiter from the shell.
//!
//! Exit codes (see [`fail`]): 0 ok, 1 other failure, 2 bad input (usage errors too), 3
//! rejected by a limit, 4 the store (no such store, unavailable, no credentials, corrupt), 5
//! `doctor` found corrupt items.
//! With `--json` every outcome, failures and usage errors included, is one JSON document
//! on stdout.

mod audit;
mod bench;
mod demo;
mod doctor;
mod fail;
mod limits_file;
mod logbuf;
mod logfmt;
mod namespace;
mod progress;
mod serve;
mod spec;
mod store;
mod usage;

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use serde_json::json;
use tollgate::{Availability, Limit, LimitSpec, LimitStatus, Limiter, OnUnavailable, Scope};

use crate::fail::Failure;
use crate::spec::human_ms;
use crate::store::{Access, StoreSpec};
use tollgate_server::scope_name;
use tracing_subscriber::fmt::writer::EitherWriter;

const LIMIT_SYNTAX: &str = "\
LIMIT SYNTAX
  NAME:rate=AMOUNT/PERIOD[,burst=TOKENS]     rate limit (token bucket; burst = capacity,
                                             default AMOUNT)
  NAME:quota=TOKENS,cron=\"EXPR\"[,tz=ZONE]    quota reset on a calendar (5-field cron,
                                             IANA zone, default UTC)
  NAME:quota=TOKENS,after=DURATION           quota whose window opens at first use
  …,soft                                     any of the above as a soft limit (shadow
                                             mode): consumption recorded, never refused
  any of them ,schedule=\"ENTRY[;ENTRY]\"[,tz=ZONE]
                                             time-of-day capacity (ADR-135): ENTRY is
                                             DAYS HH:MM-HH:MM CAPACITY[/RATE], e.g.
                                             mon-fri 09:00-17:00 120/120; first match wins
  PERIOD is s|sec|second|min|minute|h|hour|d|day or a DURATION;
  DURATION is whole numbers with units ms, s, m, h, d: 500ms, 90s, 5h, 1h30m.

EXAMPLES
  tollgate limits set --resource gpt-4 rpm:rate=60/min tpm:rate=100000/min,burst=200000
  tollgate limits set --entity user-1 --for-resource gpt-4 'rpd:quota=1000,cron=\"0 0 * * *\",tz=Europe/Berlin'
  tollgate limits set --system session:quota=10,after=5h
  tollgate limits set --resource gpt-4 rpm:rate=60/min,soft
  tollgate limits set --resource gpt-4 'rpm:rate=60/min,schedule=\"mon-fri 09:00-17:00 120/120\",tz=Europe/Berlin'

MERGED LIMITS (ADR-143; by default the most specific level with limits replaces the rest)
  --inherit                 also take, by name, the limits of the levels beneath that this
                            level does not define (entity+resource > entity > resource > system)
  --exclude NAME            drop an inherited limit (repeatable; needs --inherit)
  --patch 'NAME=ENTRY[;ENTRY...][@ZONE]'
                            replace only the schedule of an inherited limit; ENTRY is
                            'DAYS HH:MM-HH:MM CAPACITY[/RATE]' (needs --inherit)
  tollgate limits set --resource gpt-4 --inherit rpm:rate=50/min
  tollgate limits set --entity u1 --inherit --exclude tpm --patch 'rpm=* 22:00-06:00 500/500@UTC'";

const EXIT_CODES: &str = "\
EXIT CODES
  0  ok
  1  other failure (entity exists or not found, lease closed, namespace not found or in
     a state that refuses the operation, I/O)
  2  bad input (usage, ids, names, amounts, limits, durations, unknown limit, no limits
     configured, invalid table name, non-loopback --listen without authentication)
  3  rejected (a limit refused the acquire, the resource is disabled, or the namespace
     was deleted)
  4  store: no such store (read-only commands never create one), unavailable,
     no AWS credentials or region, corrupt data
  5  doctor: corrupt items found (and not all repaired)
With --json, failures (usage errors too) are one JSON document {\"error\", \"message\"} on stdout.";

/// tollgate: a distributed rate limiter and quota engine.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, about, after_help = EXIT_CODES)]
struct Cli {
    /// Print JSON (one document on stdout) instead of readable text.
    #[arg(long, global = true)]
    json: bool,
    /// Log lines on stderr as text or JSON (one object per line).
    #[arg(long, global = true, env = "TOLLGATE_LOG_FORMAT", value_parser = ["text", "json"], default_value = "text")]
    log_format: String,
    #[command(subcommand)]
    cmd: Cmd,
}

/// Which store to use.
#[derive(Debug, Clone, Args)]
pub(crate) struct StoreArgs {
    /// memory | sqlite:PATH | dynamodb:TABLE
    #[arg(long, env = "TOLLGATE_STORE", default_value = "sqlite:./tollgate.db")]
    pub(crate) store: StoreSpec,
    /// DynamoDB endpoint URL (DynamoDB Local, a VPC endpoint).
    #[arg(long, env = "TOLLGATE_ENDPOINT")]
    pub(crate) endpoint: Option<String>,
    /// The namespace by name (`tollgate namespace register NAME` first; `default` needs
    /// no registration). Nothing crosses namespaces.
    #[arg(
        short = 'N',
        long,
        env = "TOLLGATE_NAMESPACE",
        default_value = "default"
    )]
    pub(crate) namespace: String,
    /// The deadline of every store call (e.g. 1s, 500ms): a store that does not answer in
    /// time is unavailable, and `on_unavailable` decides.
    #[arg(long, env = "TOLLGATE_STORE_TIMEOUT", default_value = "1s", value_parser = spec::parse_duration)]
    pub(crate) store_timeout: std::time::Duration,
    #[command(flatten)]
    pub(crate) audit: audit::AuditArgs,
}

impl StoreArgs {
    pub(crate) async fn limiter(&self, access: Access) -> Result<Limiter, Failure> {
        let store = store::open(
            &self.store,
            self.endpoint.as_deref(),
            access,
            self.store_timeout,
        )
        .await?;
        let b = Limiter::builder(store);
        Ok(self.audit.apply(b).open_namespace(&self.namespace).await?)
    }

    /// A limiter for the namespace registry's commands: the registry is not inside any
    /// namespace, so `-N` is not resolved (a deleted namespace can still be recovered).
    pub(crate) async fn registry_limiter(&self, access: Access) -> Result<Limiter, Failure> {
        let store = store::open(
            &self.store,
            self.endpoint.as_deref(),
            access,
            self.store_timeout,
        )
        .await?;
        Ok(self.audit.apply(Limiter::builder(store)).build()?)
    }
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the HTTP server (JSON API, 429 + Retry-After + RateLimit headers, /metrics;
    /// the API is documented in docs/http-api.md).
    Serve(serve::ServeArgs),
    /// Acquire amounts now (the lease is committed at once, with any --adjust). Exit 3 when
    /// rejected; exit 2 when an adjustment would refund more than the lease consumed.
    Acquire {
        /// Entity id.
        entity: String,
        /// Resource name.
        resource: String,
        /// Amounts as NAME=TOKENS (e.g. rpm=1 tpm=500).
        #[arg(value_parser = spec::parse_amount, required = true)]
        amounts: Vec<(String, i64)>,
        /// What the call really used, as NAME=DELTA (e.g. tpm=230 or tpm=-270), committed
        /// with the lease. A lease never returns more than it consumed.
        #[arg(long = "adjust", value_parser = spec::parse_amount)]
        adjust: Vec<(String, i64)>,
        /// More resources acquired with this one, all or none (ADR-148; up to 16 in all), as
        /// RESOURCE:NAME=TOKENS[,NAME=TOKENS] (e.g. --also tools:rpm=1). --adjust applies
        /// to the first resource.
        #[arg(long = "also", value_parser = spec::parse_also)]
        also: Vec<(String, Vec<(String, i64)>)>,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Show availability (no write; the store is opened read-only); with amounts, whether
    /// they would be admitted.
    Check {
        /// Entity id.
        entity: String,
        /// Resource name.
        resource: String,
        /// Amounts as NAME=TOKENS.
        #[arg(value_parser = spec::parse_amount)]
        amounts: Vec<(String, i64)>,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Set, show or delete stored limits (system, resource or entity level).
    #[command(after_help = LIMIT_SYNTAX)]
    Limits {
        #[command(subcommand)]
        cmd: LimitsCmd,
    },
    /// Create, show, move or delete entities; reset or top up their buckets.
    Entity {
        #[command(subcommand)]
        cmd: EntityCmd,
    },
    /// List every stored item tollgate cannot read (naming the attribute and the command
    /// that repairs it); exit 5 when corrupt items remain. Read-only unless --repair. On
    /// DynamoDB it reads the whole table. See docs/repair.md.
    Doctor(doctor::DoctorArgs),
    /// List the audit log: one record per administrative change, newest first (or purge
    /// the records past their retention).
    Audit {
        #[command(subcommand)]
        cmd: audit::AuditCmd,
    },
    /// The namespace registry: register, list, show, delete (soft), recover, purge.
    /// Nothing crosses namespaces; pick one with -N NAME.
    Namespace {
        #[command(subcommand)]
        cmd: namespace::NamespaceCmd,
    },
    /// Run the feed aggregator: usage snapshots from the store's change feed, and the
    /// background refill / roll / reset / doubling of the buckets that consumed.
    Aggregate(usage::AggregateArgs),
    /// Usage snapshots: `list` them, or a `summary` (with `--plot`, a terminal chart).
    Usage {
        #[command(subcommand)]
        cmd: usage::UsageCmd,
    },
    /// DynamoDB table administration.
    Table {
        #[command(subcommand)]
        cmd: TableCmd,
    },
    /// A self-contained demo: a server over a temporary SQLite file, limits, requests until
    /// a 429, a lease adjusted and committed.
    Demo,
    /// Load-generate acquires against a running server (loopback only) and report
    /// requests/s and latency percentiles.
    BenchHttp(bench::BenchArgs),
}

/// The level limits are stored at.
#[derive(Debug, Clone, Args)]
#[group(required = true, multiple = false, id = "level")]
struct Level {
    /// System defaults.
    #[arg(long)]
    system: bool,
    /// A resource's defaults.
    #[arg(long, value_name = "R")]
    resource: Option<String>,
    /// An entity's limits (its default for every resource, or with --for-resource).
    #[arg(long, value_name = "E")]
    entity: Option<String>,
}

#[derive(Debug, Clone, Args)]
struct ScopeArgs {
    #[command(flatten)]
    level: Level,
    /// With --entity: the limits for this one resource.
    #[arg(long, value_name = "R", requires = "entity", conflicts_with_all = ["system", "resource"])]
    for_resource: Option<String>,
}

impl ScopeArgs {
    fn scope(&self) -> Scope {
        match (&self.level.resource, &self.level.entity) {
            (Some(r), _) => Scope::Resource(r.clone()),
            (None, Some(e)) => Scope::Entity(e.clone(), self.for_resource.clone()),
            (None, None) => Scope::System,
        }
    }
}

#[derive(Debug, Subcommand)]
enum LimitsCmd {
    /// Store limits at a level (replacing what was there, also a corrupt item: a warning
    /// names it).
    #[command(after_help = LIMIT_SYNTAX)]
    Set {
        #[command(flatten)]
        scope: ScopeArgs,
        /// Limits (see LIMIT SYNTAX below; none with --inherit is allowed).
        #[arg(value_parser = spec::parse_limit, required_unless_present = "inherit", value_name = "LIMIT")]
        limits: Vec<Limit>,
        /// System level only: admit (allow) or refuse (block) when the store is down.
        #[arg(long, value_parser = ["block", "allow"])]
        on_unavailable: Option<String>,
        /// Merge the limits of the levels beneath by name (inherit_limits, ADR-143).
        #[arg(long)]
        inherit: bool,
        /// An inherited limit to drop (exclude_limits; repeatable).
        #[arg(long, value_name = "NAME", requires = "inherit")]
        exclude: Vec<String>,
        /// Replace the schedule of an inherited limit: 'NAME=ENTRY[;ENTRY...][@ZONE]'
        /// (patch_limits; repeatable).
        #[arg(long, value_name = "NAME=SCHEDULE", requires = "inherit", value_parser = spec::parse_patch)]
        patch: Vec<(String, tollgate::PatchSpec)>,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Show the limits stored at a level (read-only).
    Get {
        #[command(flatten)]
        scope: ScopeArgs,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Delete the limits stored at a level (also a corrupt item: a warning names it).
    Delete {
        #[command(flatten)]
        scope: ScopeArgs,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Set or clear the mode stored at a level (ADR-151): enforce, disabled or bypass (a
    /// shadow mode: every acquire admitted and recorded, nothing debited); the most
    /// specific level that sets one wins. The pair's level (--entity E --for-resource R) is
    /// stamped on its shards at once; a broader level reaches each bucket on its next
    /// acquire (within the config cache TTL in other processes). Audited.
    Enforce {
        #[command(flatten)]
        scope: ScopeArgs,
        /// enforce, disabled, bypass, or clear (the level sets no mode).
        #[arg(long, value_parser = parse_mode)]
        mode: Mode,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Show what `apply -f FILE` would change: the file's levels against what the store
    /// holds now (read-only; docs/limits-file.md).
    Plan(limits_file::FileArgs),
    /// Make the store hold exactly the levels FILE declares (levels it does not declare are
    /// deleted); one write per level, through the same calls as `limits set` / `delete`.
    Apply(limits_file::FileArgs),
}

#[derive(Debug, Subcommand)]
enum EntityCmd {
    /// Create an entity (exit 1 if it exists).
    Create {
        /// Entity id.
        id: String,
        /// Display name.
        #[arg(long)]
        name: Option<String>,
        /// Parent entity id.
        #[arg(long)]
        parent: Option<String>,
        /// Metadata as KEY=VALUE (repeatable).
        #[arg(long = "meta", value_parser = parse_kv)]
        metadata: Vec<(String, String)>,
        /// Cascade: the entity's acquires also charge its parent (ADR-146; a resource or
        /// entity config's cascade policy, where set, overrules this).
        #[arg(long, requires = "parent")]
        cascade: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Show an entity (exit 1 if absent; read-only).
    Get {
        /// Entity id.
        id: String,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Delete an entity, its limits and its buckets, corrupt ones too (a warning names each;
    /// exit 1 if absent).
    Delete {
        /// Entity id.
        id: String,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Move an entity under a new parent (--parent P) or make it a root (--root); refused
    /// when P is the entity or one of its descendants. One audit record.
    Move {
        /// Entity id.
        id: String,
        /// The new parent.
        #[arg(long, conflicts_with = "root", required_unless_present = "root")]
        parent: Option<String>,
        /// Make the entity a root (no parent).
        #[arg(long)]
        root: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Reset the entity's bucket for a resource to full on every shard (rate limits to
    /// capacity, quotas to their allowance, a reset_after window restarted now), in one
    /// transaction with an audit record. Rerun with the printed --op to retry safely.
    Reset {
        /// Entity id.
        id: String,
        /// Resource name.
        resource: String,
        /// Operation id (1-64 of A-Za-z0-9_.-): the same id lands once. Default: a new ULID.
        #[arg(long)]
        op: Option<String>,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Set how the entity's bucket for a resource treats its limits (ADR-151), on every
    /// shard, in one transaction with an audit record: enforce (the default), disabled
    /// (every acquire refused) or bypass (every acquire admitted and recorded in usage, no
    /// balance debited, no window opened nor quota reset; enforcing again resumes from the
    /// balances as they were).
    Enforce {
        /// Entity id.
        id: String,
        /// Resource name.
        resource: String,
        /// enforce, disabled or bypass.
        #[arg(long, value_parser = parse_enforcement)]
        mode: tollgate::Enforcement,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Top up the entity's bucket for a resource: add NAME=TOKENS above the current
    /// allowance (a quota's ceiling rises until its next reset; a rate limit gains at most
    /// its headroom), split across the shards, in one transaction with an audit record.
    TopUp {
        /// Entity id.
        id: String,
        /// Resource name.
        resource: String,
        /// Amounts as NAME=TOKENS (e.g. daily=500).
        #[arg(value_parser = spec::parse_amount, required = true)]
        amounts: Vec<(String, i64)>,
        /// Operation id (1-64 of A-Za-z0-9_.-): the same id lands once. Default: a new ULID.
        #[arg(long)]
        op: Option<String>,
        #[command(flatten)]
        store: StoreArgs,
    },
}

#[derive(Debug, Subcommand)]
enum TableCmd {
    /// Create the DynamoDB table (with its indexes and TTL) if it does not exist.
    Create {
        /// Table name.
        #[arg(long)]
        table: String,
        /// Endpoint URL (e.g. DynamoDB Local).
        #[arg(long, env = "TOLLGATE_ENDPOINT")]
        endpoint: Option<String>,
    },
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?}: expected KEY=VALUE"))
}

/// Log to standard error. `serve` logs a line per request (the access log): its lines are
/// gathered in memory and written out together by a thread of their own (`logbuf.rs`: at
/// most one write and one wake-up every 10 ms under load, instead of one per line). No line
/// is dropped: a sink that cannot keep up makes the loggers wait, as a direct write would.
/// The guard writes what is left when `main` returns.
fn init_tracing(default: &str, json: bool, batched: bool) -> Option<logbuf::Flush> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let ansi = std::io::stderr().is_terminal();
    let started = batched
        .then(|| logbuf::batched(std::io::stderr(), logbuf::Pacing::default(), "tollgate-log"))
        .and_then(|r| match r {
            Ok(pair) => Some(pair),
            Err(e) => {
                // No thread for the writer: log directly, one write per line.
                eprintln!("tollgate: cannot start the log writer thread ({e}); writing directly");
                None
            }
        });
    let (writer, guard) = match started {
        Some((w, g)) => (LogSink::Batched(w), Some(g)),
        None => (LogSink::Stderr, None),
    };
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi);
    let _ = if json {
        b.json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init()
    } else {
        b.event_format(logfmt::Text::default()).try_init()
    };
    guard
}

/// Where log lines go: the batched writer, or standard error directly.
#[derive(Debug, Clone)]
enum LogSink {
    Batched(logbuf::Batched),
    Stderr,
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogSink {
    type Writer = EitherWriter<logbuf::Line<'a>, std::io::Stderr>;

    fn make_writer(&'a self) -> Self::Writer {
        match self {
            LogSink::Batched(b) => EitherWriter::A(b.make_writer()),
            LogSink::Stderr => EitherWriter::B(std::io::stderr()),
        }
    }
}

/// Whether `--json` is among the raw arguments (for usage errors, before parsing).
fn json_requested() -> bool {
    std::env::args_os()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--json")
}

// The server's request path allocates for every JSON body, item image and change-feed
// record; mimalloc serves those faster than the system allocator, and without glibc's
// consolidation passes (measured with `scripts/bench-peers http`).
#[global_allocator]
static ALLOC: tollgate_alloc::Mimalloc = tollgate_alloc::Mimalloc;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            if !e.use_stderr() {
                // --help, --version.
                let _ = e.print();
                return ExitCode::from(fail::OK);
            }
            if json_requested() {
                let text = e.render().to_string();
                let message = text
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with("For more information"))
                    .collect::<Vec<_>>()
                    .join(" ");
                let message = message.strip_prefix("error: ").unwrap_or(&message);
                print_json(&json!({ "error": "invalid_input", "message": message }));
            } else {
                let _ = e.print();
            }
            return ExitCode::from(fail::BAD_INPUT);
        }
    };
    let is_serve = matches!(cli.cmd, Cmd::Serve(_));
    // The AWS SDK warns on every failed credential source; our message says it once. The
    // commands print their own warning line for each repair of a corrupt item; `serve` logs
    // them.
    let _log_guard = init_tracing(
        if is_serve {
            "info,aws_config=error"
        } else {
            "warn,aws_config=error,tollgate::repair=error"
        },
        cli.log_format == "json",
        is_serve,
    );
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tollgate: cannot start the runtime: {e}");
            return ExitCode::from(fail::OTHER);
        }
    };
    let json = cli.json;
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::from(fail::OK),
        Err(f) => {
            report_failure(&f, json);
            ExitCode::from(f.exit_code())
        }
    }
}

fn report_failure(f: &Failure, json: bool) {
    match (f, json) {
        (Failure::Rejected(x), true) => print_json(&json!({
            "admitted": false,
            "error": "rate_limit_exceeded",
            "message": x.to_string(),
            "retry_after_ms": x.retry_after_ms,
            "resets_at_ms": x.resets_at_ms,
            "limits": x.statuses,
        })),
        (Failure::Rejected(x), false) => {
            let by: Vec<&str> = x
                .statuses
                .iter()
                .filter(|s| s.exceeded)
                .map(|s| s.limit.as_str())
                .collect();
            let when = match x.retry_after_ms {
                Some(ms) => format!("retry in {}", human_ms(ms)),
                None => "larger than a limit's capacity: never admitted".into(),
            };
            println!(
                "rejected: {} / {} by {}; {when}",
                x.entity,
                x.resource,
                by.join(", ")
            );
            print_statuses(&x.statuses, now_ms());
        }
        // The doctor printed its report, the one JSON document.
        (Failure::CorruptFound(_), true) => {}
        (f, true) => print_json(&json!({ "error": f.code(), "message": f.to_string() })),
        (f, false) => eprintln!("tollgate: {f}"),
    }
}

pub(crate) fn print_json(v: &serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer_pretty(&mut out, v);
    let _ = writeln!(out);
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Print a readable table of statuses. A rate limit that is not full says when it is
/// "full again"; a quota says when it "resets".
pub(crate) fn print_statuses(statuses: &[LimitStatus], now: i64) {
    for s in statuses {
        let mut line = format!(
            "  {:<12} {:<5} available {:>10} / {:<10} requested {:<8}",
            s.limit, s.kind, s.available, s.capacity, s.requested
        );
        if s.exceeded {
            match s.retry_after_ms {
                Some(ms) => line.push_str(&format!(" EXCEEDED, retry in {}", human_ms(ms))),
                None => line.push_str(" EXCEEDED, larger than the capacity"),
            }
        } else if let Some(at) = s.resets_at_ms {
            let when = human_ms((at - now).max(0));
            if s.kind == "rate" {
                line.push_str(&format!(" full again in {when}"));
            } else {
                line.push_str(&format!(" resets in {when}"));
            }
        }
        println!("{}", line.trim_end());
    }
}

fn borrow(a: &[(String, i64)]) -> Vec<(&str, i64)> {
    a.iter().map(|(n, v)| (n.as_str(), *v)).collect()
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let json = cli.json;
    match cli.cmd {
        Cmd::Serve(args) => serve::run(args, json).await,
        Cmd::Acquire {
            entity,
            resource,
            amounts,
            adjust,
            also,
            store,
        } if !also.is_empty() => {
            let limiter = store.limiter(Access::Existing).await?;
            let mut wanted: Vec<(String, Vec<(&str, i64)>)> =
                vec![(resource.clone(), borrow(&amounts))];
            wanted.extend(also.iter().map(|(r, a)| (r.clone(), borrow(a))));
            let wants: Vec<(&str, &[(&str, i64)])> = wanted
                .iter()
                .map(|(r, a)| (r.as_str(), a.as_slice()))
                .collect();
            let mut lease = limiter.acquire_many(&entity, &wants).await?;
            let degraded = lease.is_degraded();
            for (limit, delta) in &adjust {
                if let Err(e) = lease.adjust(&resource, limit, *delta) {
                    // The acquire stands (its debits are the leases'); nothing else is written.
                    lease.commit().await?;
                    return Err(e.into());
                }
            }
            lease.commit().await?;
            let per: Vec<(String, Vec<tollgate::LimitStatus>)> = lease
                .leases()
                .iter()
                .map(|l| (l.resource().to_string(), l.statuses().to_vec()))
                .collect();
            if json {
                print_json(&json!({
                    "admitted": true,
                    "entity": entity,
                    "degraded": degraded,
                    "resources": per
                        .iter()
                        .map(|(r, st)| json!({ "resource": r, "statuses": st }))
                        .collect::<Vec<_>>(),
                }));
            } else {
                for (r, st) in &per {
                    println!(
                        "admitted: {entity} / {r}{}",
                        if degraded {
                            " (degraded: store unavailable)"
                        } else {
                            ""
                        }
                    );
                    print_statuses(st, limiter.clock().now_ms());
                }
            }
            Ok(())
        }
        Cmd::Acquire {
            entity,
            resource,
            amounts,
            adjust,
            also: _,
            store,
        } => {
            let limiter = store.limiter(Access::Existing).await?;
            let mut lease = limiter
                .acquire(&entity, &resource, &borrow(&amounts))
                .await?;
            let statuses = lease.statuses().to_vec();
            let degraded = lease.is_degraded();
            for (limit, delta) in &adjust {
                if let Err(e) = lease.adjust(limit, *delta) {
                    // The acquire stands (its debit is the lease's); nothing else is written.
                    lease.commit().await?;
                    return Err(e.into());
                }
            }
            lease.commit().await?;
            if json {
                print_json(&json!({
                    "admitted": true,
                    "entity": entity,
                    "resource": resource,
                    "degraded": degraded,
                    "statuses": statuses,
                }));
            } else {
                println!(
                    "admitted: {entity} / {resource}{}",
                    if degraded {
                        " (degraded: store unavailable)"
                    } else {
                        ""
                    }
                );
                print_statuses(&statuses, limiter.clock().now_ms());
            }
            Ok(())
        }
        Cmd::Check {
            entity,
            resource,
            amounts,
            store,
        } => {
            let limiter = store.limiter(Access::ReadOnly).await?;
            let asked = borrow(&amounts);
            let a = limiter
                .check_availability(&entity, &resource, &asked)
                .await?;
            print_availability(&a, json, limiter.clock().now_ms());
            Ok(())
        }
        Cmd::Limits { cmd } => limits(cmd, json).await,
        Cmd::Entity { cmd } => entity(cmd, json).await,
        Cmd::Table {
            cmd: TableCmd::Create { table, endpoint },
        } => {
            store::create_table(&table, endpoint.as_deref()).await?;
            if json {
                print_json(&json!({ "table": table, "created": true }));
            } else {
                println!("table {table} is ready");
            }
            Ok(())
        }
        Cmd::Doctor(args) => doctor::run(args, json).await,
        Cmd::Audit { cmd } => audit::run(cmd, json).await,
        Cmd::Namespace { cmd } => namespace::run(cmd, json).await,
        Cmd::Aggregate(args) => usage::aggregate(args, json).await,
        Cmd::Usage { cmd } => usage::usage(cmd, json).await,
        Cmd::Demo => demo::run(json).await,
        Cmd::BenchHttp(args) => bench::run(args, json).await,
    }
}

fn print_availability(a: &Availability, json: bool, now: i64) {
    if json {
        print_json(&serde_json::to_value(a).unwrap_or_default());
        return;
    }
    println!(
        "{} / {}: {}",
        a.entity,
        a.resource,
        if a.allowed {
            "allowed"
        } else {
            "would be rejected"
        }
    );
    print_statuses(&a.limits, now);
    if let Some(ms) = a.retry_after_ms {
        println!("  retry in {}", human_ms(ms));
    }
}

async fn limits(cmd: LimitsCmd, json: bool) -> Result<(), Failure> {
    match cmd {
        LimitsCmd::Plan(a) => limits_file::run_plan(a, json).await,
        LimitsCmd::Apply(a) => limits_file::run_apply(a, json).await,
        LimitsCmd::Set {
            scope,
            limits,
            on_unavailable,
            inherit,
            exclude,
            patch,
            store,
        } => {
            let on: Option<OnUnavailable> = on_unavailable
                .map(|s| s.parse().map_err(Failure::BadInput))
                .transpose()?;
            let scope = scope.scope();
            let spec = tollgate::MergeSpec {
                inherit_limits: inherit,
                exclude_limits: exclude.into_iter().collect(),
                patch_limits: patch.into_iter().collect(),
            };
            let merge = spec
                .to_merge()
                .map_err(|e| Failure::Limiter(tollgate::Error::Invalid(e)))?;
            let limiter = store.limiter(Access::Create).await?;
            let repairs = limiter
                .admin()
                .set_level(&scope, &limits, &merge, on)
                .await?;
            warn(&repairs, json);
            print_limits(&scope, &limits, on, &merge, None, json, "set", &repairs);
            Ok(())
        }
        LimitsCmd::Get { scope, store } => {
            let scope = scope.scope();
            let limiter = store.limiter(Access::ReadOnly).await?;
            let (limits, on) = limiter.get_limits(&scope).await?;
            let merge = limiter.get_merge(&scope).await?;
            let mode = limiter.scope_enforcement(&scope).await?;
            print_limits(&scope, &limits, on, &merge, mode, json, "stored", &[]);
            Ok(())
        }
        LimitsCmd::Enforce { scope, mode, store } => {
            let scope = scope.scope();
            let limiter = store.limiter(Access::Create).await?;
            let shards = limiter
                .admin()
                .set_scope_enforcement(&scope, mode.0)
                .await?;
            let shown = mode.0.map_or("cleared", |m| m.as_str());
            if json {
                print_json(
                    &json!({ "scope": scope_name(&scope), "mode": mode.0, "shards": shards }),
                );
            } else {
                println!(
                    "{}: mode {shown} ({shards} shard(s) stamped now)",
                    scope_name(&scope)
                );
            }
            Ok(())
        }
        LimitsCmd::Delete { scope, store } => {
            let scope = scope.scope();
            let limiter = store.limiter(Access::Existing).await?;
            let (deleted, repairs) = limiter.admin().delete_limits_with_repairs(&scope).await?;
            warn(&repairs, json);
            if json {
                let mut v = json!({ "scope": scope_name(&scope), "deleted": deleted });
                with_warnings(&mut v, &repairs);
                print_json(&v);
            } else if deleted {
                println!("deleted the limits of {}", scope_name(&scope));
            } else {
                println!("{} had no limits", scope_name(&scope));
            }
            Ok(())
        }
    }
}

/// One warning line on stderr per corrupt item an administrative write repaired (with
/// `--json` they are the document's `warnings`).
pub(crate) fn warn(repairs: &[tollgate::Repair], json: bool) {
    if !json {
        for r in repairs {
            eprintln!("tollgate: warning: corrupt item {r}");
        }
    }
}

/// Add `warnings` to a JSON answer when a corrupt item was repaired (absent otherwise, as
/// in the HTTP API).
fn with_warnings(v: &mut serde_json::Value, repairs: &[tollgate::Repair]) {
    if let (Some(o), false) = (v.as_object_mut(), repairs.is_empty()) {
        o.insert(
            "warnings".into(),
            serde_json::to_value(tollgate_server::warnings(repairs)).unwrap_or_default(),
        );
    }
}

/// Print a level's limits (and, for `limits get`, the mode it stores: ADR-151).
#[allow(clippy::too_many_arguments)]
fn print_limits(
    scope: &Scope,
    limits: &[Limit],
    on: Option<OnUnavailable>,
    merge: &tollgate::Merge,
    mode: Option<tollgate::Enforcement>,
    json: bool,
    verb: &str,
    repairs: &[tollgate::Repair],
) {
    let spec = tollgate::MergeSpec::from(merge);
    if json {
        let mut v = json!({
            "scope": scope_name(scope),
            "limits": limits.iter().map(LimitSpec::from).collect::<Vec<_>>(),
            "syntax": limits.iter().map(spec::format_limit).collect::<Vec<_>>(),
            "on_unavailable": on,
        });
        if let (Some(o), Some(m)) = (v.as_object_mut(), mode) {
            o.insert("enforcement".into(), json!(m.as_str()));
        }
        if let (Some(o), Ok(serde_json::Value::Object(m))) =
            (v.as_object_mut(), serde_json::to_value(&spec))
        {
            o.extend(m);
        }
        with_warnings(&mut v, repairs);
        print_json(&v);
        return;
    }
    if limits.is_empty() {
        println!("{}: no limits {verb}", scope_name(scope));
    } else {
        println!("{}: {} limit(s) {verb}", scope_name(scope), limits.len());
        for l in limits {
            println!("  {}", spec::format_limit(l));
        }
    }
    if let Some(m) = mode {
        println!("mode: {m}");
    }
    if merge.inherit {
        println!("  inherits the limits of the levels beneath (inherit_limits)");
    }
    if !merge.exclude.is_empty() {
        let names: Vec<&str> = merge.exclude.iter().map(String::as_str).collect();
        println!("  exclude_limits: {}", names.join(", "));
    }
    for (n, p) in &spec.patch_limits {
        println!(
            "  patch_limits: {n} schedule {}@{}",
            p.schedule.join(";"),
            p.schedule_tz.as_deref().unwrap_or("UTC")
        );
    }
    if let Some(o) = on {
        println!(
            "  on_unavailable={}",
            if o == OnUnavailable::Allow {
                "allow"
            } else {
                "block"
            }
        );
    }
}

async fn entity(cmd: EntityCmd, json: bool) -> Result<(), Failure> {
    let show = |e: &tollgate::Entity| {
        if json {
            print_json(&serde_json::to_value(e).unwrap_or_default());
        } else {
            println!("entity {}", e.id);
            println!("  name        {}", e.name);
            if let Some(p) = &e.parent_id {
                println!("  parent      {p}");
                println!("  cascade     {}", e.cascade);
            }
            for (k, v) in &e.metadata {
                println!("  meta        {k}={v}");
            }
            println!("  created_at  {} ms", e.created_at_ms);
        }
    };
    match cmd {
        EntityCmd::Create {
            id,
            name,
            parent,
            metadata,
            cascade,
            store,
        } => {
            let limiter = store.limiter(Access::Create).await?;
            let meta: BTreeMap<String, String> = metadata.into_iter().collect();
            let new = tollgate::NewEntity {
                name: name.as_deref(),
                parent_id: parent.as_deref(),
                cascade,
                metadata: meta,
            };
            let e = limiter.admin().create_entity_with(&id, new).await?;
            show(&e);
            Ok(())
        }
        EntityCmd::Get { id, store } => {
            let limiter = store.limiter(Access::ReadOnly).await?;
            match limiter.get_entity(&id).await? {
                Some(e) => {
                    show(&e);
                    Ok(())
                }
                None => Err(tollgate::Error::EntityNotFound(id).into()),
            }
        }
        EntityCmd::Delete { id, store } => {
            let limiter = store.limiter(Access::Existing).await?;
            let d = limiter.admin().delete_entity_with_repairs(&id).await?;
            let n = d.deleted_items;
            if n == 0 {
                return Err(tollgate::Error::EntityNotFound(id).into());
            }
            warn(&d.repairs, json);
            if json {
                let mut v = json!({ "id": id, "deleted_items": n });
                with_warnings(&mut v, &d.repairs);
                print_json(&v);
            } else {
                println!("deleted entity {id} ({n} item(s))");
            }
            Ok(())
        }
        EntityCmd::Move {
            id,
            parent,
            root: _,
            store,
        } => {
            let limiter = store.limiter(Access::Existing).await?;
            let m = limiter.admin().set_parent(&id, parent.as_deref()).await?;
            if json {
                print_json(&serde_json::to_value(&m).unwrap_or_default());
            } else if m.audit_id.is_none() {
                println!("{id} already has that parent: nothing written");
            } else {
                let name = |p: &Option<String>| p.clone().unwrap_or_else(|| "(root)".into());
                println!(
                    "moved {id}: {} -> {} (pgen {})",
                    name(&m.old_parent),
                    name(&m.parent_id),
                    m.pgen
                );
            }
            Ok(())
        }
        EntityCmd::Reset {
            id,
            resource,
            op,
            store,
        } => {
            let limiter = store.limiter(Access::Existing).await?;
            let out = limiter.admin().reset(&id, &resource, op.as_deref()).await?;
            show_bucket_op("reset", &id, &resource, &out, json);
            Ok(())
        }
        EntityCmd::Enforce {
            id,
            resource,
            mode,
            store,
        } => {
            let limiter = store.limiter(Access::Existing).await?;
            let shards = limiter
                .admin()
                .set_enforcement(&id, &resource, mode)
                .await?;
            if json {
                print_json(&json!({
                    "entity": id, "resource": resource, "mode": mode, "shards": shards,
                }));
            } else if shards == 0 {
                println!("{id} has no bucket for {resource}: nothing to stamp");
            } else {
                println!("{id} / {resource}: {mode} on {shards} shard(s)");
            }
            Ok(())
        }
        EntityCmd::TopUp {
            id,
            resource,
            amounts,
            op,
            store,
        } => {
            let limiter = store.limiter(Access::Existing).await?;
            let a: Vec<(&str, i64)> = amounts.iter().map(|(n, v)| (n.as_str(), *v)).collect();
            let out = limiter
                .admin()
                .top_up(&id, &resource, &a, op.as_deref())
                .await?;
            show_bucket_op("topped up", &id, &resource, &out, json);
            Ok(())
        }
    }
}

/// `--mode enforce|disabled|bypass`.
fn parse_enforcement(s: &str) -> std::result::Result<tollgate::Enforcement, String> {
    s.parse()
}

/// A level's mode as `limits enforce --mode` takes it: a mode, or `clear`.
#[derive(Debug, Clone, Copy)]
struct Mode(Option<tollgate::Enforcement>);

/// `--mode enforce|disabled|bypass|clear`.
fn parse_mode(s: &str) -> std::result::Result<Mode, String> {
    match s {
        "clear" => Ok(Mode(None)),
        _ => s.parse().map(|m| Mode(Some(m))),
    }
}

/// Print what a reset or top-up did.
fn show_bucket_op(
    what: &str,
    id: &str,
    resource: &str,
    out: &tollgate::BucketOpOutcome,
    json: bool,
) {
    if json {
        print_json(&serde_json::to_value(out).unwrap_or_default());
        return;
    }
    if out.already_applied {
        println!(
            "operation {} had already landed on {id} / {resource}: nothing written",
            out.op
        );
        return;
    }
    if out.shards == 0 {
        println!("{id} has no bucket for {resource}: nothing to reset");
        return;
    }
    println!(
        "{what} {id} / {resource} on {} shard(s) (op {})",
        out.shards, out.op
    );
    for (limit, milli) in &out.added_milli {
        println!("  {limit:<12} +{}", tokens_text(*milli));
    }
}

/// Millitokens as tokens, with the fraction only when there is one.
fn tokens_text(milli: i64) -> String {
    if milli % 1000 == 0 {
        format!("{}", milli / 1000)
    } else {
        format!("{:.3}", milli as f64 / 1000.0)
    }
}

//! `tollgate limits plan -f FILE` and `tollgate limits apply -f FILE`: limits as a reviewed
//! file (docs/limits-file.md), diffed against what the store holds now; and the loader
//! `serve --limits FILE` uses at start, on SIGHUP and when the file changes.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use clap::Args;
use serde_json::json;
use tollgate::limits_file::{self, Change, ChangeKind, Level, LimitChange, LimitsFile};
use tollgate::{Limit, LimitSpec, Limiter, OnUnavailable};
use tollgate_server::grpc::Mapping;
use tollgate_server::scope_name;

use crate::fail::Failure;
use crate::spec;
use crate::store::Access;
use crate::StoreArgs;

/// Arguments of `limits plan` and `limits apply`.
#[derive(Debug, Args)]
pub struct FileArgs {
    /// The limits file (TOML; see docs/limits-file.md).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: PathBuf,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Read and validate a limits file; a bad one is bad input naming the line and field.
pub fn load(path: &Path) -> Result<LimitsFile, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::BadInput(format!("cannot read {}: {e}", path.display())))?;
    limits_file::parse(&path.display().to_string(), &text)
        .map_err(|e| Failure::BadInput(e.to_string()))
}

/// The changes that turn what the store holds now into what the file declares.
pub async fn plan(limiter: &Limiter, file: &LimitsFile) -> Result<Vec<Change>, Failure> {
    let stored = limiter.stored_levels().await?;
    Ok(limits_file::plan(&file.levels, &stored))
}

/// Write `changes` in order, with a progress bar on a terminal; returns the repairs.
pub async fn apply(
    limiter: &Limiter,
    changes: &[Change],
    progress: bool,
) -> Result<Vec<tollgate::Repair>, Failure> {
    let bar = crate::progress::bar(
        changes.len() as u64,
        "applying levels",
        progress && changes.len() > 1,
    );
    let mut repairs = Vec::new();
    for c in changes {
        bar.set_message(scope_name(c.scope()));
        repairs.extend(limiter.apply_change(c).await?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(repairs)
}

/// A limit in the CLI's syntax; a calendar quota whose schedule keeps time in another zone
/// than its reset (the syntax's one `tz=` is the reset's) names the schedule's zone too.
fn describe(l: &Limit) -> String {
    let mut s = spec::format_limit(l);
    if let (Some(sched), Some(cal)) = (l.schedule(), l.calendar()) {
        if sched.tz() != cal.tz() {
            s.push_str(&format!(",schedule_tz={}", sched.tz()));
        }
    }
    s
}

fn policy(o: Option<OnUnavailable>) -> &'static str {
    match o {
        None => "(unset)",
        Some(OnUnavailable::Allow) => "allow",
        Some(OnUnavailable::Block) => "block",
    }
}

fn cascade(c: Option<bool>) -> String {
    c.map(|b| b.to_string()).unwrap_or_else(|| "(unset)".into())
}

/// The plan as readable lines (empty: no changes).
pub fn plan_lines(changes: &[Change]) -> Vec<String> {
    let mut out = Vec::new();
    for c in changes {
        let verb = match c.kind {
            ChangeKind::Create => "create",
            ChangeKind::Update => "update",
            ChangeKind::Delete => "delete",
        };
        out.push(format!("{} {verb}", scope_name(c.scope())));
        let (b, a) = (c.before.as_ref(), c.after.as_ref());
        let on = |l: Option<&Level>| l.and_then(|l| l.on_unavailable);
        let cs = |l: Option<&Level>| l.and_then(|l| l.cascade);
        if on(b) != on(a) {
            out.push(format!(
                "  ~ on_unavailable: {} -> {}",
                policy(on(b)),
                policy(on(a))
            ));
        }
        if cs(b) != cs(a) {
            out.push(format!(
                "  ~ cascade: {} -> {}",
                cascade(cs(b)),
                cascade(cs(a))
            ));
        }
        for l in &c.limits {
            out.push(match l {
                LimitChange::Added(l) => format!("  + {}", describe(l)),
                LimitChange::Removed(l) => format!("  - {}", describe(l)),
                LimitChange::Changed { before, after } => {
                    format!("  ~ {} -> {}", describe(before), describe(after))
                }
            });
        }
    }
    out
}

fn plan_json(changes: &[Change]) -> serde_json::Value {
    let level = |l: Option<&Level>| {
        l.map(|l| {
            json!({
                "limits": l.limits.iter().map(LimitSpec::from).collect::<Vec<_>>(),
                "on_unavailable": l.on_unavailable,
                "cascade": l.cascade,
            })
        })
    };
    json!(changes
        .iter()
        .map(|c| json!({
            "scope": scope_name(c.scope()),
            "change": c.kind,
            "before": level(c.before.as_ref()),
            "after": level(c.after.as_ref()),
        }))
        .collect::<Vec<_>>())
}

fn summary(changes: &[Change]) -> String {
    let n = |k| changes.iter().filter(|c| c.kind == k).count();
    format!(
        "{} level(s) to change: {} create, {} update, {} delete",
        changes.len(),
        n(ChangeKind::Create),
        n(ChangeKind::Update),
        n(ChangeKind::Delete)
    )
}

/// `limits plan -f FILE` (read-only).
pub async fn run_plan(a: FileArgs, json_out: bool) -> Result<(), Failure> {
    let file = load(&a.file)?;
    // A store that does not exist yet holds nothing: everything the file declares is a
    // create (plan never creates the store).
    let changes = match a.store.limiter(Access::ReadOnly).await {
        Ok(limiter) => plan(&limiter, &file).await?,
        Err(Failure::NoSuchStore(m)) => {
            eprintln!("tollgate: note: {m}; planned against an empty store");
            limits_file::plan(&file.levels, &Default::default())
        }
        Err(e) => return Err(e),
    };
    if json_out {
        crate::print_json(
            &json!({ "file": a.file.display().to_string(), "changes": plan_json(&changes) }),
        );
    } else if changes.is_empty() {
        println!(
            "no changes: the store holds what {} declares",
            a.file.display()
        );
    } else {
        for l in plan_lines(&changes) {
            println!("{l}");
        }
        println!("{}", summary(&changes));
    }
    Ok(())
}

/// `limits apply -f FILE`.
pub async fn run_apply(a: FileArgs, json_out: bool) -> Result<(), Failure> {
    let file = load(&a.file)?;
    let limiter = a.store.limiter(Access::Create).await?;
    let changes = plan(&limiter, &file).await?;
    let repairs = apply(&limiter, &changes, !json_out).await?;
    crate::warn(&repairs, json_out);
    if json_out {
        crate::print_json(&json!({
            "file": a.file.display().to_string(),
            "applied": plan_json(&changes),
        }));
    } else if changes.is_empty() {
        println!(
            "no changes: the store holds what {} declares",
            a.file.display()
        );
    } else {
        for l in plan_lines(&changes) {
            println!("{l}");
        }
        println!("applied {} level(s)", changes.len());
    }
    Ok(())
}

/// The limits file a running server follows: applied at start, on SIGHUP and when its
/// modification time changes; a file that does not load is refused (logged with its line
/// and field) and the limits and mapping in force stay.
#[derive(Debug)]
pub struct Follower {
    path: PathBuf,
    limiter: Limiter,
    mapping: Mapping,
    state: tokio::sync::Mutex<Option<SystemTime>>,
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

impl Follower {
    /// Load the file now (refusing to start on a bad one) and follow it.
    pub async fn start(path: PathBuf, limiter: Limiter) -> Result<(Self, usize), Failure> {
        let seen = mtime(&path);
        let file = load(&path)?;
        let changes = plan(&limiter, &file).await?;
        apply(&limiter, &changes, false).await?;
        let mapping = Mapping::new(file.envoy);
        Ok((
            Follower {
                path,
                limiter,
                mapping,
                state: tokio::sync::Mutex::new(seen),
            },
            changes.len(),
        ))
    }

    /// The descriptor mapping the gRPC service reads.
    pub fn mapping(&self) -> Mapping {
        self.mapping.clone()
    }

    /// Reload (`why` names the trigger in the log).
    pub async fn reload(&self, why: &str) {
        let mut seen = self.state.lock().await;
        *seen = mtime(&self.path);
        let file = match load(&self.path) {
            Ok(f) => f,
            Err(e) => {
                tracing::error!(trigger = why, error = %e, "limits file refused; the limits in force stay");
                return;
            }
        };
        let changes = match plan(&self.limiter, &file).await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(trigger = why, error = %e, "limits file not applied: cannot read the stored limits; the limits in force stay");
                return;
            }
        };
        match apply(&self.limiter, &changes, false).await {
            Ok(_) => {
                self.mapping.replace(file.envoy);
                tracing::info!(trigger = why, file = %self.path.display(), changes = changes.len(), "limits file applied");
                for l in plan_lines(&changes) {
                    tracing::info!("limits file: {l}");
                }
            }
            Err(e) => {
                tracing::error!(trigger = why, error = %e, "limits file partly applied (the levels before the failure are written); retried on the next change or SIGHUP");
            }
        }
    }

    /// Whether the file's modification time moved since it was last read.
    pub async fn changed(&self) -> bool {
        *self.state.lock().await != mtime(&self.path)
    }
}

/// Poll the file's modification time every `every`, reloading when it moves.
pub fn watch(f: std::sync::Arc<Follower>, every: std::time::Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if f.changed().await {
                f.reload("file changed").await;
            }
        }
    });
}

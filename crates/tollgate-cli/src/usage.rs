//! `tollgate aggregate` (the feed aggregator on its own), `tollgate usage list|summary`
//! (the usage snapshots it keeps, with a terminal chart), and the aggregator options
//! `serve` shares.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::json;
use tollgate::{FeedAggregator, Limiter, Snapshot, UsageOptions, UsageQuery, Window};
use tollgate_server::aggregate::AggregatorRun;

use crate::fail::Failure;
use crate::spec;
use crate::store::{self, Access};
use crate::StoreArgs;

fn window(s: &str) -> Result<Window, String> {
    Window::parse(s).ok_or_else(|| format!("{s:?}: expected hourly, daily or monthly"))
}

fn instant(s: &str) -> Result<i64, String> {
    tollgate_core::usage::parse_instant(s).ok_or_else(|| {
        format!("{s:?}: expected epoch milliseconds or an RFC 3339 time (2025-09-04T15:00:00Z)")
    })
}

/// How the aggregator keeps usage (`aggregate` and `serve`).
#[derive(Debug, Clone, Args)]
pub struct UsageArgs {
    /// Snapshot windows, comma-separated: hourly, daily, monthly.
    #[arg(long, value_delimiter = ',', default_value = "hourly,daily", value_parser = window)]
    pub usage_windows: Vec<Window>,
    /// Days a snapshot is kept after its window ends (its `ttl`).
    #[arg(long, default_value_t = 90)]
    pub usage_retention_days: i64,
    /// Time between aggregator passes.
    #[arg(long, default_value = "1s", value_parser = spec::parse_duration)]
    pub aggregate_interval: Duration,
    /// The checkpoint name: aggregators with the same one share it, and count each change once.
    #[arg(long, default_value = "aggregator")]
    pub consumer: String,
    /// How long counted changes stay in an embedded store's change feed for other consumers
    /// of the same file (another namespace's aggregator) before they are trimmed. On SQLite
    /// the feed costs about 1 KB of disk per write while it is kept: lower it when nothing
    /// else reads the file's feed. Ignored on DynamoDB (Streams keeps 24 hours itself).
    #[arg(long, default_value = "24h", value_parser = spec::parse_duration)]
    pub feed_retention: Duration,
}

impl UsageArgs {
    fn options(&self) -> UsageOptions {
        UsageOptions {
            windows: self.usage_windows.clone(),
            retention_days: self.usage_retention_days,
            consumer: self.consumer.clone(),
            feed_retention_ms: i64::try_from(self.feed_retention.as_millis()).unwrap_or(i64::MAX),
            ..UsageOptions::default()
        }
    }
}

/// Open `store` with its feed and build the aggregator run (and the limiter) over it.
pub async fn open_run(
    store: &StoreArgs,
    usage: &UsageArgs,
    access: Access,
    wrap: impl FnOnce(
        std::sync::Arc<dyn tollgate_store::Store>,
    ) -> std::sync::Arc<dyn tollgate_store::Store>,
) -> Result<(Limiter, AggregatorRun, Option<tollgate_sqlite::SqliteStore>), Failure> {
    if usage.aggregate_interval.is_zero() {
        return Err(Failure::BadInput(
            "--aggregate-interval must be positive".into(),
        ));
    }
    let (feed, probe) = store::open_feed_probed(
        &store.store,
        store.endpoint.as_deref(),
        access,
        store.store_timeout,
    )
    .await?;
    // The namespace by name (spec-base-system.md §7.3), as every store command.
    let limiter = store
        .audit
        .apply(Limiter::builder(wrap(feed.clone())))
        .open_namespace(&store.namespace)
        .await?;
    let mut opts = usage.options();
    if matches!(store.store, store::StoreSpec::Memory) {
        // A memory store lives in this process: no other consumer can read its feed, so
        // what this aggregator counted is dropped at once instead of kept a day (a full
        // in-process log costs every write a fresh allocation). Its only consumer, this
        // aggregator, also sums and trims it between passes and holds what it summed until
        // the pass commits it: the log keeps milliseconds of writes, not a whole interval's.
        opts.feed_retention_ms = 0;
        opts.absorb = true;
    }
    let agg = FeedAggregator::new(&limiter, feed, opts)?;
    Ok((
        limiter,
        AggregatorRun::new(agg, usage.aggregate_interval),
        probe,
    ))
}

/// Arguments of `aggregate`.
#[derive(Debug, Args)]
pub struct AggregateArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    usage: UsageArgs,
    /// One pass, then exit (otherwise pass after pass until SIGINT / SIGTERM).
    #[arg(long)]
    once: bool,
}

/// `tollgate aggregate`.
pub async fn aggregate(a: AggregateArgs, json: bool) -> Result<(), Failure> {
    let (_, run, _) = open_run(&a.store, &a.usage, Access::Existing, |s| s).await?;
    if a.once {
        let p = run.pass().await?;
        if json {
            crate::print_json(&json!({
                "changes": p.changes,
                "usage_changes": p.usage_changes,
                "snapshot_writes": p.snapshot_writes,
                "commits": p.commits,
                "lost_races": p.lost_races,
                "claims_finished": p.claims_finished,
                "lag_ms": p.lag_ms,
                "refilled_items": p.background.refilled_items,
                "doubled": p.background.doubled,
            }));
        } else {
            println!(
                "aggregated {} change(s): {} with usage, {} snapshot update(s) in {} commit(s); lag {} ms",
                p.changes, p.usage_changes, p.snapshot_writes, p.commits, p.lag_ms
            );
        }
        return Ok(());
    }
    tracing::info!(store = %a.store.store, interval_ms = a.usage.aggregate_interval.as_millis() as u64, "aggregator running");
    tokio::select! {
        _ = run.clone().run_forever() => {},
        _ = crate::serve::shutdown_signal() => {},
    }
    Ok(())
}

/// Which snapshots.
#[derive(Debug, Args)]
pub struct QueryArgs {
    /// Entity id (or give --resource alone for every entity's use of it).
    #[arg(long)]
    entity: Option<String>,
    /// Resource name.
    #[arg(long)]
    resource: Option<String>,
    /// Window: hourly, daily or monthly.
    #[arg(long, default_value = "hourly", value_parser = window)]
    window: Window,
    /// Window starts at or after this (epoch ms or RFC 3339).
    #[arg(long, value_parser = instant)]
    from: Option<i64>,
    /// Window starts before this (epoch ms or RFC 3339).
    #[arg(long, value_parser = instant)]
    to: Option<i64>,
    #[command(flatten)]
    store: StoreArgs,
}

/// `tollgate usage …`.
#[derive(Debug, Subcommand)]
pub enum UsageCmd {
    /// Every snapshot that matches, oldest window first.
    List(QueryArgs),
    /// Totals per limit and requests over the range; `--plot` draws one limit over time.
    Summary {
        #[command(flatten)]
        q: QueryArgs,
        /// Draw a chart of a limit's consumption per window in the terminal.
        #[arg(long)]
        plot: bool,
        /// The limit to draw (default: the first by name), or `requests`.
        #[arg(long)]
        limit: Option<String>,
    },
}

/// Every page of the query.
async fn fetch(q: &QueryArgs) -> Result<Vec<Snapshot>, Failure> {
    let limiter = q.store.limiter(Access::ReadOnly).await?;
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let page = limiter
            .usage(&UsageQuery {
                entity: q.entity.clone(),
                resource: q.resource.clone(),
                window: Some(q.window),
                from_ms: q.from,
                to_ms: q.to,
                limit: Some(1000),
                after: after.take(),
            })
            .await?;
        out.extend(page.snapshots);
        match page.next {
            Some(n) => after = Some(n),
            None => return Ok(out),
        }
    }
}

fn tokens(milli: i64) -> String {
    if milli % 1000 == 0 {
        (milli / 1000).to_string()
    } else {
        format!("{:.3}", milli as f64 / 1000.0)
    }
}

/// The value drawn for `limit` of `s` (tokens, or the request count).
fn value(s: &Snapshot, limit: &str) -> f64 {
    if limit == "requests" {
        s.requests as f64
    } else {
        s.milli.get(limit).copied().unwrap_or(0) as f64 / 1000.0
    }
}

/// A chart of `limit` per window start, as text: x is hours since the first window shown.
pub fn render_chart(snaps: &[Snapshot], limit: &str) -> String {
    let mut per_start: BTreeMap<i64, f64> = BTreeMap::new();
    for s in snaps {
        *per_start.entry(s.start_ms).or_default() += value(s, limit);
    }
    let Some(first) = per_start.keys().next().copied() else {
        return String::from("(no usage to plot)\n");
    };
    let points: Vec<(f32, f32)> = per_start
        .iter()
        .map(|(t, v)| (((t - first) as f64 / 3_600_000.0) as f32, *v as f32))
        .collect();
    let xmax = points.last().map_or(1.0, |p| p.0).max(1.0);
    let ymax = points.iter().map(|p| p.1).fold(0.0f32, f32::max).max(1.0);
    use textplots::{Chart, Plot, Shape};
    let shape = Shape::Bars(&points);
    let mut chart = Chart::new_with_y_range(120, 40, 0.0, xmax, 0.0, ymax);
    let c = chart.lineplot(&shape);
    c.axis();
    c.figures();
    format!(
        "{limit} per window (x: hours since {}, y: {})\n{c}",
        tollgate_core::usage::iso_utc(first),
        if limit == "requests" {
            "requests"
        } else {
            "tokens"
        }
    )
}

/// `tollgate usage list|summary`.
pub async fn usage(cmd: UsageCmd, json: bool) -> Result<(), Failure> {
    match cmd {
        UsageCmd::List(q) => {
            let snaps = fetch(&q).await?;
            if json {
                let rows: Vec<_> = snaps.iter().map(tollgate_server::snapshot_json).collect();
                crate::print_json(&json!({ "snapshots": rows }));
                return Ok(());
            }
            if snaps.is_empty() {
                println!("no usage recorded");
            }
            for s in &snaps {
                let mut limits: Vec<String> = s
                    .milli
                    .iter()
                    .map(|(l, m)| format!("{l}={}", tokens(*m)))
                    .collect();
                limits.extend(
                    s.overdraw
                        .iter()
                        .map(|(l, m)| format!("overdraw.{l}={}", tokens(*m))),
                );
                println!(
                    "{}  {} {}  {} / {}  requests={}  {}",
                    tollgate_core::usage::iso_utc(s.start_ms),
                    s.window.name(),
                    tollgate_core::usage::iso_utc(s.window.end_ms(s.start_ms)),
                    s.entity,
                    s.resource,
                    s.requests,
                    limits.join(" ")
                );
            }
            Ok(())
        }
        UsageCmd::Summary { q, plot, limit } => {
            let snaps = fetch(&q).await?;
            let mut totals: BTreeMap<String, i64> = BTreeMap::new();
            let mut overdraw: BTreeMap<String, i64> = BTreeMap::new();
            let mut requests = 0;
            for s in &snaps {
                for (l, m) in &s.milli {
                    *totals.entry(l.clone()).or_default() += m;
                }
                for (l, m) in &s.overdraw {
                    *overdraw.entry(l.clone()).or_default() += m;
                }
                requests += s.requests;
            }
            let drawn = limit.or_else(|| totals.keys().next().cloned());
            if let Some(l) = &drawn {
                if l != "requests" && !totals.contains_key(l) && !snaps.is_empty() {
                    return Err(Failure::BadInput(format!(
                        "--limit {l}: no usage of it (limits: {}, or requests)",
                        totals.keys().cloned().collect::<Vec<_>>().join(", ")
                    )));
                }
            }
            let chart = match (&drawn, plot) {
                (Some(l), true) => Some(render_chart(&snaps, l)),
                _ => None,
            };
            if json {
                crate::print_json(&json!({
                    "window": q.window.name(),
                    "windows": snaps.len(),
                    "requests": requests,
                    "consumed_milli": totals,
                    "overdraw_milli": overdraw,
                    "chart": chart,
                }));
                return Ok(());
            }
            println!(
                "{} {} window(s), {} request(s)",
                snaps.len(),
                q.window.name(),
                requests
            );
            for (l, m) in &totals {
                match overdraw.get(l) {
                    Some(od) => println!("  {l}: {} (overdraw {})", tokens(*m), tokens(*od)),
                    None => println!("  {l}: {}", tokens(*m)),
                }
            }
            if let Some(c) = chart {
                print!("{c}");
            } else if plot {
                println!("(no usage to plot)");
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(start_ms: i64, tpm: i64, requests: i64) -> Snapshot {
        Snapshot {
            entity: "u1".into(),
            resource: "gpt".into(),
            window: Window::Hourly,
            start_ms,
            milli: [("tpm".to_string(), tpm)].into(),
            overdraw: BTreeMap::new(),
            requests,
        }
    }

    /// The chart renders to a string: braille dots, the y range and the first window.
    #[test]
    fn the_chart_renders_to_a_string() {
        let h = 3_600_000;
        let t0 = 1_756_998_000_000;
        let snaps = vec![
            snap(t0, 500_000, 2),
            snap(t0 + h, 1_500_000, 3),
            snap(t0 + 3 * h, 250_000, 1),
        ];
        let out = render_chart(&snaps, "tpm");
        assert!(
            out.starts_with("tpm per window (x: hours since 2025-09-04T15:00:00Z, y: tokens)"),
            "{out}"
        );
        assert!(
            out.contains("1500.0"),
            "the y axis reaches the largest window: {out}"
        );
        let dots = out
            .chars()
            .filter(|c| ('\u{2801}'..='\u{28FF}').contains(c))
            .count();
        assert!(dots > 20, "bars are drawn in braille ({dots} dots): {out}");
        assert!(out.lines().count() >= 10, "{out}");
        let req = render_chart(&snaps, "requests");
        assert!(req.contains("y: requests") && req.contains("3.0"), "{req}");
        assert_eq!(render_chart(&[], "tpm"), "(no usage to plot)\n");
    }

    #[test]
    fn tokens_print_exactly() {
        assert_eq!(tokens(1_500_000), "1500");
        assert_eq!(tokens(1_500), "1.500");
        assert_eq!(tokens(-400_000), "-400");
    }
}

//! `status` and `health`: the daemon's state as people and scripts read it.
//! `status` asks `Inspect` (falling back to `Status` for a daemon that
//! predates it), prints a table or `--json`, and with `--watch` redraws
//! in place; `health` asks `Health` and exits 0 when ready, 1 when not.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};

use ratekeeper::budget::money::format_amount;
use ratekeeper::client::Client;
use ratekeeper::limiter::shapes::ELSEWHERE;
use ratekeeper::proto::{
    BucketInspection, BudgetStatus, ErrorCode, HealthStatus, Inspection, LimitInspection, Request,
    Response,
};

use super::{answer_failure, connect};

/// Clears the terminal and puts the cursor home: one frame of `--watch`.
const CLEAR: &str = "\x1b[H\x1b[2J";

/// The shortest `--watch` interval: faster redraws only load the daemon.
const MIN_WATCH: Duration = Duration::from_millis(10);
/// The longest `--watch` interval: a day.
const MAX_WATCH: Duration = Duration::from_secs(24 * 60 * 60);

/// The `--watch SECS` interval: a number of seconds from 0.01 to 86400,
/// or why not (clap shows the message and exits with code 2).
pub fn watch_interval(secs: &str) -> Result<Duration, String> {
    let out_of_range = || {
        format!(
            "{secs:?} is not a number of seconds from {} to {}",
            MIN_WATCH.as_secs_f64(),
            MAX_WATCH.as_secs()
        )
    };
    let secs: f64 = secs.trim().parse().map_err(|_| out_of_range())?;
    match Duration::try_from_secs_f64(secs) {
        Ok(interval) if (MIN_WATCH..=MAX_WATCH).contains(&interval) => Ok(interval),
        _ => Err(out_of_range()),
    }
}

/// How `status` prints.
pub struct StatusOptions {
    pub limit: Option<String>,
    pub json: bool,
    /// Redraw every so often instead of printing once.
    pub watch: Option<Duration>,
}

/// `status`: the store's state and every limit's buckets, once or again
/// and again.
pub async fn status(socket: &Path, options: StatusOptions) -> anyhow::Result<ExitCode> {
    let client = connect(socket).await?;
    let terminal = std::io::stdout().is_terminal();
    loop {
        let inspection = inspect(&client, options.limit.clone()).await?;
        let budgets = budgets(&client, options.limit.clone()).await?;
        let mut frame = String::new();
        if options.watch.is_some() && terminal && !options.json {
            frame.push_str(CLEAR);
        }
        if options.json {
            let shown = Shown {
                inspection: &inspection,
                budgets: budgets.as_deref().ok(),
            };
            let json = if options.watch.is_some() {
                serde_json::to_string(&shown)
            } else {
                serde_json::to_string_pretty(&shown)
            };
            frame.push_str(&json.context("cannot render JSON")?);
            frame.push('\n');
        } else {
            frame.push_str(&render(&inspection));
            frame.push_str(&render_budgets(&budgets));
        }
        let mut stdout = std::io::stdout().lock();
        if stdout
            .write_all(frame.as_bytes())
            .and_then(|()| stdout.flush())
            .is_err()
        {
            // Whoever read the output went away (`| head`): done.
            return Ok(ExitCode::SUCCESS);
        }
        drop(stdout);
        match options.watch {
            Some(every) => tokio::time::sleep(every).await,
            None => return Ok(ExitCode::SUCCESS),
        }
    }
}

/// What `status --json` prints: the inspection's fields, and `budgets`
/// when the daemon could say (absent from a daemon that predates them or
/// while the store is down).
#[derive(serde::Serialize)]
struct Shown<'a> {
    #[serde(flatten)]
    inspection: &'a Inspection,
    #[serde(skip_serializing_if = "Option::is_none")]
    budgets: Option<&'a [BudgetStatus]>,
}

/// `Budgets`, or why there are none to show: the daemon predates them, or
/// could not read them (the store is down).
async fn budgets(
    client: &Client,
    limit: Option<String>,
) -> anyhow::Result<Result<Vec<BudgetStatus>, String>> {
    match client.call(Request::Budgets { limit }).await? {
        Response::Budgets { budgets } => Ok(Ok(budgets)),
        Response::Error { code, .. } if predates(code) => {
            Ok(Err("this daemon predates spend budgets".into()))
        }
        Response::Error { message, .. } => Ok(Err(message)),
        other => answer_failure(other),
    }
}

/// The budgets' table, after the limits'; nothing when none is configured.
pub fn render_budgets(budgets: &Result<Vec<BudgetStatus>, String>) -> String {
    let budgets = match budgets {
        Ok(budgets) if budgets.is_empty() => return String::new(),
        Ok(budgets) => budgets,
        Err(why) if why.contains("predates") => return String::new(),
        Err(why) => {
            return format!(
                "
budgets: unknown ({why})
"
            );
        }
    };
    let mut out = String::from(
        "
budgets
",
    );
    out.push_str(&format!(
        "  {:<20} {:<16} {:<26} {:<10} {:>12} {:>12} {:>12} {:>12}  {}
",
        "OWNER", "TENANT", "BUDGET", "PERIOD", "AMOUNT", "SPENT", "RESERVED", "REMAINING", "RESETS"
    ));
    for budget in budgets {
        let owner = if budget.group {
            format!("group {}", budget.owner)
        } else {
            budget.owner.clone()
        };
        let remaining = match budget.remaining {
            remaining if remaining < 0 => format!("-{}", format_amount(remaining.unsigned_abs())),
            remaining => format_amount(remaining as u64),
        };
        let resets = match budget.resets_at_ms {
            0 => "rolling".to_string(),
            at => jiff::Timestamp::from_millisecond(at as i64)
                .map_or_else(|_| at.to_string(), |at| at.to_string()),
        };
        out.push_str(&format!(
            "  {:<20} {:<16} {:<26} {:<10} {:>12} {:>12} {:>12} {:>12}  {}\n",
            owner,
            budget.tenant.as_deref().unwrap_or(""),
            budget.name,
            if budget.period.is_empty() {
                "-"
            } else {
                &budget.period
            },
            format_amount(budget.amount),
            format_amount(budget.spent),
            format_amount(budget.reserved),
            remaining,
            resets
        ));
    }
    out
}

/// `Inspect`, or `Status` turned into an inspection for an older daemon.
async fn inspect(client: &Client, limit: Option<String>) -> anyhow::Result<Inspection> {
    let answer = client
        .call(Request::Inspect {
            limit: limit.clone(),
        })
        .await?;
    match answer {
        Response::Inspection(inspection) => Ok(inspection),
        Response::Error { code, .. } if predates(code) => {
            match client.call(Request::Status { limit }).await? {
                Response::Status { store, limits } => Ok(from_status(store, limits)),
                other => answer_failure(other),
            }
        }
        other => answer_failure(other),
    }
}

/// Whether an error answer means the daemon predates the request
/// (`Unsupported`, or `MalformedMessage` from ratekeeper 0.1).
fn predates(code: u16) -> bool {
    code == ErrorCode::Unsupported.as_u16() || code == ErrorCode::MalformedMessage.as_u16()
}

fn from_status(store: String, limits: Vec<ratekeeper::proto::LimitStatus>) -> Inspection {
    Inspection {
        health: HealthStatus {
            ready: true,
            store,
            store_up: true,
            store_down_ms: 0,
            policy: String::new(),
            reason: "this daemon predates Inspect: no store state, no tenant buckets".into(),
        },
        levels_from: "store".into(),
        limits: limits
            .into_iter()
            .map(|limit| LimitInspection {
                name: limit.name,
                waiters: limit.waiters,
                buckets: limit
                    .buckets
                    .into_iter()
                    .map(|bucket| BucketInspection {
                        name: bucket.name,
                        tenant: None,
                        capacity: bucket.capacity,
                        per_minute: bucket.per_minute,
                        level: Some(bucket.level),
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// The table `status` prints.
pub fn render(inspection: &Inspection) -> String {
    let health = &inspection.health;
    let mut out = String::new();
    let state = if health.store_up {
        "up".to_string()
    } else {
        format!("DOWN for {:.1} s", health.store_down_ms as f64 / 1000.0)
    };
    let policy = match health.policy.as_str() {
        "" => String::new(),
        policy => format!(", on_failure = {policy}"),
    };
    out.push_str(&format!("store: {} {state}{policy}\n", health.store));
    out.push_str(&format!(
        "ready: {}, {}\n",
        if health.ready { "yes" } else { "NO" },
        health.reason
    ));
    match inspection.levels_from.as_str() {
        "local" => {
            out.push_str("levels: this sidecar's local buckets (the local policy's share)\n")
        }
        "none" => out.push_str("levels: unknown while the store is down\n"),
        _ => {}
    }
    for limit in &inspection.limits {
        out.push_str(&format!("\n{}  waiters: {}\n", limit.name, limit.waiters));
        out.push_str(&format!(
            "  {:<15} {:<20} {:>14} {:>14} {:>14} {:>7}\n",
            "BUCKET", "TENANT", "LEVEL", "CAPACITY", "PER MINUTE", "FULL"
        ));
        let mut disagreements = Vec::new();
        for bucket in &limit.buckets {
            if let Some(name) = bucket.name.strip_suffix(ELSEWHERE) {
                disagreements.push(format!(
                    "  ! another sidecar draws {name} with capacity {} refilled {} a minute: \
                     configs differ, and both draw with the smaller of each until they agree\n",
                    bucket.capacity, bucket.per_minute
                ));
            }
            let (level, full) = match bucket.level {
                Some(level) if bucket.capacity > 0 => (
                    level.to_string(),
                    format!("{:.1}%", level as f64 * 100.0 / bucket.capacity as f64),
                ),
                Some(level) => (level.to_string(), "-".into()),
                None => ("?".into(), "?".into()),
            };
            out.push_str(&format!(
                "  {:<15} {:<20} {:>14} {:>14} {:>14} {:>7}\n",
                bucket.name,
                bucket.tenant.as_deref().unwrap_or(""),
                level,
                bucket.capacity,
                bucket.per_minute,
                full
            ));
        }
        out.extend(disagreements);
    }
    out
}

/// `health`: readiness over the socket; exit 0 ready, 1 not.
pub async fn health(socket: &Path) -> anyhow::Result<ExitCode> {
    let client = connect(socket).await?;
    match client.call(Request::Health).await? {
        Response::Health(health) => {
            println!(
                "{}: {}",
                if health.ready { "ready" } else { "not ready" },
                health.reason
            );
            Ok(if health.ready {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Response::Error { code, message } if predates(code) => {
            bail!("the daemon predates the Health request ({message}); use `ratekeeper ping`")
        }
        other => answer_failure(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_takes_seconds_from_a_hundredth_to_a_day() {
        for (secs, interval) in [
            ("0.01", Some(MIN_WATCH)),
            ("0.05", Some(Duration::from_millis(50))),
            ("2", Some(Duration::from_secs(2))),
            ("86400", Some(MAX_WATCH)),
            ("0.009", None),
            ("86400.5", None),
            ("1e300", None),
            ("inf", None),
            ("-0", None),
            ("", None),
        ] {
            assert_eq!(watch_interval(secs).ok(), interval, "{secs:?}");
        }
    }
}

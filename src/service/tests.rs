//! The handlers as tables: a script of calls to one service on the embedded
//! store → each call's answer, in one line. Time is tokio's paused clock,
//! which the store reads too: a wait of seconds takes none, and the tables
//! can say to the millisecond how long each acquire was held back.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::*;
use crate::config::from_toml_str;
use crate::limiter::EmbeddedStore;
use crate::limiter::embedded::Clock;
use crate::limiter::health::StoreHealth;
use crate::metrics::Metrics;
use crate::proto::Acquire;

/// No headroom and no preset: the buckets hold what is written.
const CONFIG: &str = r#"
default_priority = "interactive"

[[limits]]
name = "gpt"
burst_headroom_ms = 0
tokens_per_minute = 60000
burst_tokens = 1000
requests_per_minute = 600
burst_requests = 10

[[limits]]
name = "small"
burst_headroom_ms = 0
tokens_per_minute = 6000
burst_tokens = 100

[[priorities]]
name = "interactive"
max_wait_ms = 2000
"#;

/// The store's clock: tokio's, paused in these tests.
struct PausedClock(tokio::time::Instant);

impl Clock for PausedClock {
    fn now_ms(&self) -> i64 {
        self.0.elapsed().as_millis() as i64
    }
}

fn service() -> Service {
    let config = Arc::new(from_toml_str(CONFIG, "service tests").expect("a valid config"));
    let store = Arc::new(EmbeddedStore::with_clock(Arc::new(PausedClock(
        tokio::time::Instant::now(),
    ))));
    let health = StoreHealth::new(&*store, None);
    Service::new(config, store, health, Arc::new(Metrics::new()))
}

/// One step of a script.
enum Step {
    /// An acquire of `limit`: input and output tokens, class, max wait.
    Acquire(&'static str, u64, u64, Option<&'static str>, Option<u64>),
    /// A report of the nth lease granted so far (from 0): input, output.
    Report(usize, u64, u64),
    /// A release of the nth lease granted.
    Release(usize),
    /// A report of a lease never granted.
    ReportUnknown,
    /// New acquires are refused from now on.
    Drain,
    /// Let this many ms pass.
    Pass(u64),
}

use Step::*;

/// An acquire of `limit` by token counts, from a connection named `tests`.
fn acquire(
    limit: &str,
    input_tokens: u64,
    output_tokens: u64,
    priority: Option<&str>,
    max_wait_ms: Option<u64>,
) -> Call {
    Call::Acquire(
        Acquire {
            limit: limit.to_string(),
            tenant: None,
            priority: priority.map(str::to_string),
            cost: Cost::Tokens {
                input_tokens,
                output_tokens,
            },
            max_wait_ms,
        },
        Caller {
            name: Arc::from("tests"),
            uid: None,
        },
    )
}

/// Runs `steps` on a fresh service; each answer as a line: `granted 500
/// after 250 ms`, `denied tokens retry 400 ms`, `settled +300`, `released
/// 500`, `error UnknownLimit`, ...
async fn run(steps: &[Step]) -> Vec<String> {
    let service = service();
    let mut leases = Vec::new();
    let mut answers = Vec::new();
    for step in steps {
        let started = tokio::time::Instant::now();
        let call = match *step {
            Acquire(limit, input_tokens, output_tokens, priority, max_wait_ms) => {
                acquire(limit, input_tokens, output_tokens, priority, max_wait_ms)
            }
            Report(nth, input, output) => Call::Report {
                lease: leases[nth],
                usage: Reported::Tokens { input, output },
            },
            Release(nth) => Call::Release { lease: leases[nth] },
            ReportUnknown => Call::Report {
                lease: 0xdead,
                usage: Reported::Tokens {
                    input: 1,
                    output: 0,
                },
            },
            Drain => {
                service.begin_drain();
                continue;
            }
            Pass(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                continue;
            }
        };
        let answer = service.handle(1, call, CancellationToken::new()).await;
        let held_ms = started.elapsed().as_millis();
        answers.push(match answer {
            Ok(Response::Granted { lease, tokens, .. }) => {
                leases.push(lease);
                format!("granted {tokens} after {held_ms} ms")
            }
            Ok(Response::Denied {
                retry_after_ms,
                bucket,
            }) => format!("denied {bucket} retry {retry_after_ms} ms"),
            Ok(Response::Settled { tokens_returned }) => format!("settled {tokens_returned:+}"),
            Ok(Response::Released { tokens_returned }) => format!("released {tokens_returned}"),
            Ok(other) => format!("{other:?}"),
            Err(error) => format!("error {:?}", error.code()),
        });
    }
    answers
}

/// (what the script shows, the steps, each acquire's or settlement's answer)
type Case = (&'static str, Vec<Step>, &'static [&'static str]);

fn cases() -> Vec<Case> {
    vec![
        (
            "the burst is granted at once; past it, each acquire waits its refill",
            // 1,000 tokens a second: 600 more tokens are 600 ms away.
            vec![
                Acquire("gpt", 600, 400, None, None),
                Acquire("gpt", 500, 100, None, None),
                Acquire("gpt", 1000, 0, None, None),
            ],
            &[
                "granted 1000 after 0 ms",
                "granted 600 after 600 ms",
                "granted 1000 after 1000 ms",
            ],
        ),
        (
            "a wait past max_wait is denied at once, naming the bucket and when it fits",
            vec![
                Acquire("gpt", 1000, 0, None, None),
                Acquire("gpt", 800, 0, None, Some(500)),
                Acquire("gpt", 800, 0, None, Some(800)),
            ],
            // 800 tokens are 800 ms away: the same acquire, willing to wait
            // 500 ms, fits if sent again 300 ms from now.
            &[
                "granted 1000 after 0 ms",
                "denied tokens retry 300 ms",
                "granted 800 after 800 ms",
            ],
        ),
        (
            "the request bucket binds as well as the token bucket",
            vec![
                Acquire("gpt", 1, 0, None, None),
                Acquire("gpt", 1, 0, None, None),
                Acquire("gpt", 1, 0, None, None),
                Acquire("gpt", 1, 0, None, None),
                Acquire("gpt", 1, 0, None, None),
                Acquire("gpt", 1, 0, None, None),
                Acquire("gpt", 1, 0, None, None),
                Acquire("gpt", 1, 0, None, None),
                Acquire("gpt", 1, 0, None, None),
                Acquire("gpt", 1, 0, None, None),
                Acquire("gpt", 1, 0, None, Some(0)),
                Acquire("gpt", 1, 0, None, None),
            ],
            // 10 requests a second: the eleventh is 100 ms away.
            &[
                "granted 1 after 0 ms",
                "granted 1 after 0 ms",
                "granted 1 after 0 ms",
                "granted 1 after 0 ms",
                "granted 1 after 0 ms",
                "granted 1 after 0 ms",
                "granted 1 after 0 ms",
                "granted 1 after 0 ms",
                "granted 1 after 0 ms",
                "granted 1 after 0 ms",
                "denied requests retry 100 ms",
                "granted 1 after 100 ms",
            ],
        ),
        (
            "a report gives back what was not used; an overrun is debited",
            vec![
                Acquire("gpt", 300, 300, None, None),
                Acquire("gpt", 200, 0, None, None),
                Report(0, 300, 120),
                Report(1, 250, 0),
                // 180 given back and 50 taken: 1,000 - 600 - 200 + 180 - 50.
                Acquire("gpt", 330, 0, None, Some(0)),
                Acquire("gpt", 1, 0, None, Some(0)),
            ],
            &[
                "granted 600 after 0 ms",
                "granted 200 after 0 ms",
                "settled +180",
                "settled -50",
                "granted 330 after 0 ms",
                "denied tokens retry 1 ms",
            ],
        ),
        (
            "a release gives the whole reservation back; a lease settles once",
            vec![
                Acquire("gpt", 700, 0, None, None),
                Release(0),
                Report(0, 1, 0),
                Acquire("gpt", 1000, 0, None, Some(0)),
                ReportUnknown,
            ],
            &[
                "granted 700 after 0 ms",
                "released 700",
                "error UnknownLease",
                "granted 1000 after 0 ms",
                "error UnknownLease",
            ],
        ),
        (
            "the buckets refill while nobody asks, up to their burst",
            vec![
                Acquire("gpt", 1000, 0, None, None),
                Pass(400),
                Acquire("gpt", 400, 0, None, Some(0)),
                Pass(10_000),
                Acquire("gpt", 1000, 0, None, Some(0)),
                Acquire("gpt", 1, 0, None, Some(0)),
            ],
            // Ten seconds refilled the burst, not ten seconds' worth.
            &[
                "granted 1000 after 0 ms",
                "granted 400 after 0 ms",
                "granted 1000 after 0 ms",
                "denied tokens retry 1 ms",
            ],
        ),
        (
            "names the config does not know, and costs no wait can satisfy, are errors",
            vec![
                Acquire("nope", 1, 0, None, None),
                Acquire("gpt", 1, 0, Some("nope"), None),
                Acquire("small", 6001, 0, None, None),
            ],
            &[
                "error UnknownLimit",
                "error UnknownPriority",
                "error CostExceedsCapacity",
            ],
        ),
        (
            "a draining service refuses new acquires and still settles the old leases",
            vec![
                Acquire("gpt", 500, 0, None, None),
                Drain,
                Acquire("gpt", 1, 0, None, None),
                Report(0, 400, 0),
            ],
            &[
                "granted 500 after 0 ms",
                "error ShuttingDown",
                "settled +100",
            ],
        ),
    ]
}

#[tokio::test(start_paused = true)]
async fn the_handlers_answer_as_the_tables_say() {
    let mut failures = Vec::new();
    for (what, steps, expected) in cases() {
        let answers = run(&steps).await;
        if answers != expected {
            failures.push(format!(
                "{what}:\n  got      {answers:?}\n  expected {expected:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_wait_returns_its_reservation() {
    let service = service();
    let acquire = |tokens| acquire("gpt", tokens, 0, None, None);
    let first = service
        .handle(1, acquire(1000), CancellationToken::new())
        .await;
    assert!(matches!(first, Ok(Response::Granted { .. })), "{first:?}");
    let cancel = CancellationToken::new();
    let waiting = service.handle(1, acquire(1000), cancel.clone());
    let cancelled = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        cancel.cancel();
    };
    let (answer, ()) = tokio::join!(waiting, cancelled);
    let code = answer.err().map(|error| error.code());
    assert_eq!(code, Some(crate::proto::ErrorCode::Cancelled));
    // 300 ms refilled 300 tokens, and the cancelled 1,000 came back.
    let after = service
        .handle(1, acquire(300), CancellationToken::new())
        .await;
    assert!(
        matches!(after, Ok(Response::Granted { waited_ms: 0, .. })),
        "{after:?}"
    );
}

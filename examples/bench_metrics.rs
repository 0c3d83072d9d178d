//! The cost of counting metrics on the hot path, in process and without a
//! socket or Redis, so that the figure is not lost in their noise: acquire +
//! report cycles through `Service::handle` on the embedded store, with
//! metrics counted (`[metrics] listen` set) and not, in alternating batches.
//! Results and how to read them: bench/metrics/README.md.
//!
//! ```text
//! cargo run --release --example bench_metrics
//! ```

use std::sync::Arc;
use std::time::Instant;

use ratekeeper::app::build_stores;
use ratekeeper::config;
use ratekeeper::limiter::health::StoreHealth;
use ratekeeper::metrics::Metrics;
use ratekeeper::proto::{Acquire, Cost, Response};
use ratekeeper::service::{Call, Caller, Reported, Service};
use tokio_util::sync::CancellationToken;

const LIMITS: &str = r#"
[[limits]]
name = "bench"
tokens_per_minute = 1_000_000_000
burst_tokens = 10_000_000_000
requests_per_minute = 1_000_000_000
burst_requests = 10_000_000_000
tenant_share = 0.5
"#;
const METRICS: &str = "[metrics]\nlisten = \"127.0.0.1:0\"\ntenants = [\"acme\"]\n";

const CYCLES: u32 = 20_000;
const ROUNDS: usize = 15;

fn service(metered: bool) -> Service {
    let text = if metered {
        format!("{METRICS}{LIMITS}")
    } else {
        LIMITS.to_string()
    };
    let config = config::from_toml_str(&text, "bench").expect("a valid config");
    let metrics = Arc::new(Metrics::new());
    let stores = build_stores(&config, &metrics).expect("the embedded store");
    let health = StoreHealth::new(stores.store.as_ref(), None);
    Service::new(Arc::new(config), stores.store, health, metrics)
}

/// Nanoseconds per acquire + report cycle over `CYCLES` cycles.
async fn batch(service: &Service) -> f64 {
    let started = Instant::now();
    for _ in 0..CYCLES {
        let acquire = Acquire {
            limit: "bench".into(),
            tenant: Some("acme".into()),
            priority: None,
            cost: Cost::Tokens {
                input_tokens: 100,
                output_tokens: 20,
            },
            max_wait_ms: Some(0),
        };
        let acquire = Call::Acquire(acquire, Caller::default());
        let answer = service.handle(1, acquire, CancellationToken::new()).await;
        let Ok(Response::Granted { lease, .. }) = answer else {
            panic!("expected a grant, got {answer:?}");
        };
        let report = Call::Report {
            lease,
            usage: Reported::Tokens {
                input: 90,
                output: 10,
            },
        };
        service
            .handle(1, report, CancellationToken::new())
            .await
            .expect("settled");
    }
    started.elapsed().as_nanos() as f64 / f64::from(CYCLES)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let (off, on) = (service(false), service(true));
    // Warm both: the first batch pays for allocations and label sets.
    batch(&off).await;
    batch(&on).await;
    let (mut offs, mut ons, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let (a, b) = if round % 2 == 0 {
            let a = batch(&off).await;
            (a, batch(&on).await)
        } else {
            let b = batch(&on).await;
            (batch(&off).await, b)
        };
        offs.push(a);
        ons.push(b);
        ratios.push(b / a);
    }
    let (off, on, ratio) = (median(&mut offs), median(&mut ons), median(&mut ratios));
    println!(
        "acquire + report through Service::handle, median of {ROUNDS} paired batches of {CYCLES}:"
    );
    println!("  metrics off: {off:.0} ns per cycle");
    println!("  metrics on:  {on:.0} ns per cycle");
    println!(
        "  counting costs {:.0} ns per cycle ({ratio:.3}x, range {:.3}-{:.3})",
        on - off,
        ratios[0],
        ratios[ROUNDS - 1]
    );
}

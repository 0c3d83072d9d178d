//! The planning rules as tables: (limit, class, tenant, input, output) →
//! the draws per bucket, or the refusal.

use super::*;
use crate::config::from_toml_str;

/// Every limit but the `edge` ones keeps no burst headroom, so that the
/// capacities below are the bursts as written.
const CONFIG: &str = r#"
default_priority = "interactive"

[[limits]]
name = "edge"
tokens_per_minute = 60000
burst_tokens = 3000
requests_per_minute = 600
burst_requests = 600
burst_headroom_ms = 500

[[limits]]
name = "edge_floors"
tokens_per_minute = 60000
burst_tokens = 1000
max_request_tokens = 900
requests_per_minute = 600
burst_requests = 4
burst_headroom_ms = 1000

[[limits]]
name = "sum"
burst_headroom_ms = 0
tokens_per_minute = 6000
burst_tokens = 1000
requests_per_minute = 60
burst_requests = 5
max_request_tokens = 900

[[limits]]
name = "openai"
burst_headroom_ms = 0
provider = "openai"
model = "gpt-4o-mini"
tokens_per_minute = 6000
burst_tokens = 2000

[[limits]]
name = "openai_minute"
burst_headroom_ms = 0
provider = "openai"
enforcement_window = "minute"
tokens_per_minute = 6000
burst_tokens = 2000

[[limits]]
name = "anthropic"
provider = "anthropic"
input_tokens_per_minute = 30000
output_tokens_per_minute = 6000
requests_per_minute = 50
tenant_share = 0.5

[[limits]]
name = "split"
burst_headroom_ms = 0
input_tokens_per_minute = 600
output_tokens_per_minute = 300
tenant_share = 0.5

[[limits]]
name = "grouped"
burst_headroom_ms = 0
tokens_per_minute = 1000
group = "org"

[[limits]]
name = "group"
burst_headroom_ms = 0
tokens_per_minute = 1000
group = "org"

[[limits]]
name = "windows"
burst_headroom_ms = 0
tokens_per_minute = 6000
requests_per_minute = 60
tokens_per_day = 100000
requests_per_day = 1000

[[limits]]
name = "rps"
burst_headroom_ms = 0
requests_per_second = 5

[[groups]]
name = "org"
tokens_per_minute = 5000
burst_tokens = 4000
requests_per_minute = 100

[[priorities]]
name = "interactive"
max_wait_ms = 2000

[[priorities]]
name = "batch"
reserved_fraction = 0.25
max_wait_ms = 60000
limits = ["sum", "grouped"]
"#;

fn planner() -> Planner {
    Planner::new(Arc::new(
        from_toml_str(CONFIG, "plan.toml").expect("valid config"),
    ))
}

/// An acquire as a client asks it.
#[derive(Debug, Clone, Copy)]
struct Ask {
    limit: &'static str,
    priority: Option<&'static str>,
    tenant: Option<&'static str>,
    input: u64,
    output: u64,
}

fn ask(limit: &'static str, input: u64, output: u64) -> Ask {
    Ask {
        limit,
        priority: None,
        tenant: None,
        input,
        output,
    }
}

impl Ask {
    fn class(self, priority: &'static str) -> Ask {
        Ask {
            priority: Some(priority),
            ..self
        }
    }

    fn tenant(self, tenant: &'static str) -> Ask {
        Ask {
            tenant: Some(tenant),
            ..self
        }
    }

    fn plan(self, planner: &Planner) -> Result<AcquirePlan, PlanError> {
        let checked = planner.check_acquire(self.limit, self.tenant, self.priority, None)?;
        planner.plan_acquire(checked, self.tenant, (self.input, self.output), 0)
    }
}

/// A plan's draws, one per bucket, as `role cost+floor settle/capacity`.
fn draws(plan: &AcquirePlan) -> String {
    let draws: Vec<String> = plan
        .reserved
        .iter()
        .map(|r| {
            let draw = &r.draw;
            let (role, settle) = (r.role.name(), r.settle);
            let (cost, floor, capacity) = (draw.cost, draw.floor, draw.bucket.capacity);
            // A bucket that grants more than its capacity once full says so.
            let largest = match draw.bucket.largest {
                largest if largest > capacity => format!(" up to {largest}"),
                _ => String::new(),
            };
            format!("{role} {cost}+{floor} {settle:?}/{capacity}{largest}")
        })
        .collect();
    draws.join(", ")
}

#[test]
fn costs_become_one_draw_per_bucket() {
    // (what, acquire) → (Granted.tokens, the draws)
    let cases: Vec<(&str, Ask, u64, &str)> = vec![
        (
            "the burst keeps headroom for the delay before the provider sees a call",
            ask("edge", 100, 0),
            100,
            "tokens 100+0 Total/2500, requests 1+0 Never/595",
        ),
        (
            "but never less than max_request_tokens, or half the burst",
            ask("edge_floors", 100, 0),
            100,
            "tokens 100+0 Total/900, requests 1+0 Never/2",
        ),
        (
            "windows beside the minute: each one bucket more, a window's worth each",
            ask("windows", 300, 200),
            500,
            "tokens 500+0 Total/6000, requests 1+0 Never/60, \
             tokens_per_day 500+0 Total/100000, requests_per_day 1+0 Never/1000",
        ),
        (
            "requests only: any cost, even none, takes one request and no tokens",
            ask("rps", 0, 0),
            0,
            "requests_per_second 1+0 Never/5",
        ),
        (
            "sum: tokens take input + output and settle to the total; one request",
            ask("sum", 300, 200),
            500,
            "tokens 500+0 Total/1000, requests 1+0 Never/5",
        ),
        (
            "a class with a reserved fraction leaves a floor in every bucket",
            ask("sum", 300, 200).class("batch"),
            500,
            "tokens 500+250 Total/1000, requests 1+2 Never/5",
        ),
        (
            "a tenant on a limit without shares draws nothing more",
            ask("sum", 10, 0).tenant("acme"),
            10,
            "tokens 10+0 Total/1000, requests 1+0 Never/5",
        ),
        (
            "openai: the charge is max(input, output) and is kept",
            ask("openai", 300, 1000),
            1000,
            "tokens 1000+0 Never/2000 up to 6000",
        ),
        (
            "under a second's enforcement a cost above the burst waits for a full bucket",
            ask("openai", 10, 2001),
            2001,
            "tokens 2001+0 Never/2000 up to 6000",
        ),
        (
            "the presets' bursts hold one second of the rate, less 200 ms; a request \
             larger passes once full, up to the minute's figure; the tenant likewise",
            ask("anthropic", 10000, 1000).tenant("acme"),
            11000,
            "input_tokens 10000+0 Input/400 up to 30000, output_tokens 1000+0 Output/80 up to 6000, \
             requests 1+0 Never/1 up to 50, tenant 11000+0 Total/300 up to 18000",
        ),
        (
            "separate buckets take their own figure; the tenant takes the sum from its share",
            ask("split", 200, 100).tenant("acme"),
            300,
            "input_tokens 200+0 Input/600, output_tokens 100+0 Output/300, tenant 300+0 Total/450",
        ),
        (
            "a grouped limit also draws from the group's buckets",
            ask("grouped", 40, 0).class("batch"),
            40,
            "tokens 40+250 Total/1000, group_tokens 40+1000 Total/4000, \
             group_requests 1+25 Never/100",
        ),
    ];
    let planner = planner();
    for (what, ask, tokens, expected) in cases {
        let plan = ask
            .plan(&planner)
            .unwrap_or_else(|refusal| panic!("{what}: {refusal}"));
        assert_eq!(plan.tokens, tokens, "{what}");
        assert_eq!(draws(&plan), expected, "{what}");
    }
}

#[test]
fn impossible_costs_are_refused_before_any_store_sees_them() {
    let never_fits = |limit: &str, cost, capacity, floor, class: &str| PlanError::NeverFits {
        cost,
        bucket: "tokens",
        limit: limit.into(),
        capacity,
        floor,
        class: class.into(),
    };
    // (what, acquire) → refusal
    let cases: Vec<(&str, Ask, PlanError)> = vec![
        ("zero", ask("sum", 0, 0), PlanError::ZeroCost),
        ("overflow", ask("sum", u64::MAX, 1), PlanError::CostOverflow),
        (
            "above max_request_tokens",
            ask("sum", 901, 0),
            PlanError::AboveMaxRequestTokens {
                tokens: 901,
                largest: 900,
                limit: "sum".into(),
            },
        ),
        (
            "above the burst under a minute's enforcement",
            ask("openai_minute", 10, 2001),
            never_fits("openai_minute", 2001, 2000, 0, "interactive"),
        ),
        (
            "above the minute's figure under a second's",
            ask("openai", 10, 6001),
            never_fits("openai", 6001, 6000, 0, "interactive"),
        ),
        (
            "within the burst but not above the class's floor",
            ask("grouped", 800, 0).class("batch"),
            never_fits("grouped", 800, 1000, 250, "batch"),
        ),
    ];
    let planner = planner();
    for (what, ask, expected) in cases {
        assert_eq!(ask.plan(&planner).expect_err(what), expected, "{what}");
    }
    assert_eq!(
        never_fits("grouped", 800, 1000, 250, "batch").to_string(),
        "a cost of 800 can never be granted: the tokens bucket of limit \"grouped\" holds at most 1000 less 250 kept for classes above \"batch\""
    );
}

#[test]
fn names_classes_and_waits_are_checked() {
    let long = "x".repeat(MAX_NAME_LEN + 1);
    // (what, limit, tenant, priority, max wait) → Ok(max wait in force) or the refusal
    type Case<'a> = (
        &'a str,
        &'a str,
        Option<&'a str>,
        Option<&'a str>,
        Option<u64>,
        Result<u64, PlanError>,
    );
    let cases: Vec<Case> = vec![
        (
            "the class's wait by default",
            "sum",
            None,
            None,
            None,
            Ok(2000),
        ),
        (
            "the request's own wait",
            "sum",
            None,
            Some("batch"),
            Some(7),
            Ok(7),
        ),
        (
            "another class's default",
            "sum",
            None,
            Some("batch"),
            None,
            Ok(60000),
        ),
        (
            "the longest wait a request may name is its class's (issue 27)",
            "sum",
            None,
            None,
            Some(MAX_WAIT_MS),
            Ok(2000),
        ),
        (
            "a longer class allows a longer wait",
            "sum",
            None,
            Some("batch"),
            Some(45_000),
            Ok(45_000),
        ),
        (
            "but caps it at its own",
            "sum",
            None,
            Some("batch"),
            Some(MAX_WAIT_MS),
            Ok(60000),
        ),
        (
            "a wait above the maximum",
            "sum",
            None,
            None,
            Some(MAX_WAIT_MS + 1),
            Err(PlanError::MaxWaitTooLong(MAX_WAIT_MS + 1)),
        ),
        (
            "an unknown limit lists the configured ones",
            "nope",
            None,
            None,
            None,
            Err(PlanError::UnknownLimit {
                name: "nope".into(),
                configured: "edge, edge_floors, sum, openai, openai_minute, anthropic, split, grouped, group, windows, rps"
                    .into(),
            }),
        ),
        (
            "an unknown class",
            "sum",
            None,
            Some("vip"),
            None,
            Err(PlanError::UnknownPriority("vip".into())),
        ),
        (
            "a class that does not apply to the limit",
            "openai",
            None,
            Some("batch"),
            None,
            Err(PlanError::PriorityNotForLimit {
                class: "batch".into(),
                limit: "openai".into(),
            }),
        ),
        (
            "a tenant name above the bound",
            "sum",
            Some(long.as_str()),
            None,
            None,
            Err(PlanError::NameTooLong {
                what: "tenant",
                len: MAX_NAME_LEN + 1,
            }),
        ),
        (
            "a limit name above the bound",
            long.as_str(),
            None,
            None,
            None,
            Err(PlanError::NameTooLong {
                what: "limit",
                len: MAX_NAME_LEN + 1,
            }),
        ),
    ];
    let planner = planner();
    for (what, limit, tenant, priority, max_wait, expected) in cases {
        let got = planner
            .check_acquire(limit, tenant, priority, max_wait)
            .map(|checked| checked.max_wait_ms);
        assert_eq!(got, expected, "{what}");
    }
}

#[test]
fn buckets_of_different_limits_and_groups_never_share_a_key() {
    let planner = planner();
    let mut keys = std::collections::HashSet::new();
    for limit in &planner.config().limits {
        for (role, spec) in planner.buckets(limit) {
            // Group buckets are shared by the group's limits, on purpose.
            if !matches!(role, BucketRole::GroupTokens | BucketRole::GroupRequests) {
                assert!(keys.insert(spec.key.clone()), "{} reused", spec.key);
            }
        }
    }
    let group_key = |name: &str| {
        let limit = planner.config().limit(name).unwrap();
        planner
            .buckets(limit)
            .iter()
            .find(|(role, _)| *role == BucketRole::GroupTokens)
            .map(|(_, spec)| spec.key.clone())
            .unwrap()
    };
    // The limit named "group" and the group's own bucket stay apart.
    assert_eq!(group_key("grouped"), group_key("group"));
    assert!(
        keys.insert(group_key("group")),
        "a group bucket collides with a limit's"
    );
}

#[test]
fn a_uid_names_only_the_tenants_and_classes_its_entry_allows() {
    let config = format!(
        "{CONFIG}\n[[clients]]\nuids = [7]\ntenants = [\"acme\"]\npriorities = [\"batch\"]\n\
         [[clients]]\nuids = [8]\npriorities = [\"interactive\"]\n"
    );
    let planner = Planner::new(Arc::new(from_toml_str(&config, "plan.toml").unwrap()));
    let class = |name: &str| planner.config().priority(name).unwrap();
    let refusal = |uid, tenant, name| {
        planner
            .check_client(uid, tenant, class(name))
            .err()
            .map(|refused| refused.to_string())
    };
    let allowed = "(allowed by [[clients]]: tenants \"acme\")";
    let table = [
        (Some(7), Some("acme"), "batch", None),
        (
            Some(7),
            Some("globex"),
            "batch",
            Some(format!("uid 7 may not name tenant \"globex\" {allowed}")),
        ),
        (
            Some(7),
            None,
            "batch",
            Some(format!(
                "uid 7 may not acquire without naming a tenant {allowed}"
            )),
        ),
        (
            Some(7),
            Some("acme"),
            "interactive",
            Some(
                "uid 7 may not use priority class \"interactive\" \
                 (allowed by [[clients]]: classes \"batch\")"
                    .to_string(),
            ),
        ),
        // No `tenants`: any tenant, or none.
        (Some(8), None, "interactive", None),
        // Not listed, and no `other_uids` entry: unrestricted.
        (Some(9), Some("globex"), "batch", None),
        (None, Some("globex"), "batch", None),
    ];
    for (uid, tenant, name, expected) in table {
        assert_eq!(
            refusal(uid, tenant, name),
            expected,
            "{uid:?} {tenant:?} {name}"
        );
    }
}

//! Config tests: every listed mistake with its located message, defaults,
//! environment overrides and the effective-config round trip.
use super::diagnostics::line_col;
use super::*;
use crate::tokens::{CharEstimator, Counter, Encoding};

fn no_env(_: &str) -> Option<String> {
    None
}

fn parse_ok(text: &str) -> Config {
    match from_toml_str(text, "test.toml") {
        Ok(config) => config,
        Err(err) => panic!("expected a valid config, got:\n{err}"),
    }
}

fn parse_err(text: &str) -> String {
    match from_toml_str(text, "test.toml") {
        Ok(config) => panic!("expected an error, got {config:#?}"),
        Err(err) => err.to_string(),
    }
}

const LIMIT_A: &str = "[[limits]]\nname = \"a\"\ntokens_per_minute = 100\n";

/// (what, file text, expected substring of the error, location included).
const MISTAKES: &[(&str, &str, &str)] = &[
    (
        "unknown top-level key",
        "bogus = 1\n",
        "test.toml:1:1: unknown field `bogus`",
    ),
    (
        "unknown key in a limit",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\ntoken_per_minute = 2\n",
        "test.toml:4:1: limits: unknown field `token_per_minute`",
    ),
    (
        "unknown key in server",
        "[server]\nsockett = \"/x\"\n",
        "test.toml:2:1: server: unknown field `sockett`",
    ),
    (
        "unknown key in redis",
        "[redis]\nurl = \"redis://h\"\npassword = \"x\"\n",
        "test.toml:3:1: redis: unknown field `password`",
    ),
    (
        "unknown key in a priority",
        "[[priorities]]\nname = \"p\"\nmax_wait = 3\n",
        "test.toml:3:1: priorities: unknown field `max_wait`",
    ),
    ("syntax error", "[[limits]\n", "test.toml:1:"),
    (
        "wrong type",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = \"lots\"\n",
        "test.toml:3:21: limits.tokens_per_minute: invalid type: string \"lots\", expected an integer",
    ),
    (
        "zero tokens_per_minute",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\n[[limits]]\nname = \"gpt-4o\"\ntokens_per_minute = 0\n",
        "test.toml:6:21: limits[1] \"gpt-4o\": tokens_per_minute must be greater than zero (got 0)",
    ),
    (
        "negative tokens_per_minute",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = -5\n",
        "test.toml:3:21: limits[0] \"a\": tokens_per_minute must be greater than zero (got -5)",
    ),
    (
        "tokens_per_minute above bound",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1_000_000_001\n",
        "test.toml:3:21: limits[0] \"a\": tokens_per_minute must be at most 1000000000",
    ),
    (
        "missing tokens_per_minute",
        "[[limits]]\nname = \"a\"\n",
        "test.toml:1:1: limits[0] \"a\": tokens_per_minute is required",
    ),
    (
        "zero requests_per_minute",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nrequests_per_minute = 0\n",
        "test.toml:4:23: limits[0] \"a\": requests_per_minute must be greater than zero",
    ),
    (
        "negative burst_tokens",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nburst_tokens = -1\n",
        "test.toml:4:16: limits[0] \"a\": burst_tokens must be greater than zero (got -1)",
    ),
    (
        "burst_tokens above bound",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nburst_tokens = 10_000_000_001\n",
        "test.toml:4:16: limits[0] \"a\": burst_tokens must be at most 10000000000",
    ),
    (
        "duplicate limit name",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\n\n[[limits]]\nname = \"a\"\ntokens_per_minute = 2\n",
        "test.toml:6:8: limits[1] \"a\": duplicate limit name \"a\" (first declared at line 2)",
    ),
    (
        "duplicate priority name",
        "[[priorities]]\nname = \"p\"\n[[priorities]]\nname = \"q\"\n[[priorities]]\nname = \"p\"\n",
        "test.toml:6:8: priorities[2] \"p\": duplicate priority class name \"p\" (first declared at line 2)",
    ),
    (
        "burst_tokens below max_request_tokens",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1000\nburst_tokens = 500\nmax_request_tokens = 800\n",
        "test.toml:4:16: limits[0] \"a\": burst_tokens (500) is below max_request_tokens (800)",
    ),
    (
        "defaulted burst below max_request_tokens",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1000\nmax_request_tokens = 1001\n",
        "test.toml:4:22: limits[0] \"a\": burst_tokens (defaulted to tokens_per_minute = 1000) is below max_request_tokens (1001)",
    ),
    (
        "zero max_request_tokens",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1000\nmax_request_tokens = 0\n",
        "test.toml:4:22: limits[0] \"a\": max_request_tokens must be greater than zero",
    ),
    (
        "burst_requests without requests_per_minute",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nburst_requests = 10\n",
        "test.toml:4:18: limits[0] \"a\": burst_requests is set but requests_per_minute is not",
    ),
    (
        "tenant_share zero",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\ntenant_share = 0.0\n",
        "test.toml:4:16: limits[0] \"a\": tenant_share must be in (0, 1] (got 0)",
    ),
    (
        "tenant_share above one",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\ntenant_share = 1.5\n",
        "test.toml:4:16: limits[0] \"a\": tenant_share must be in (0, 1] (got 1.5)",
    ),
    (
        "tenant_share nan",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\ntenant_share = nan\n",
        "test.toml:4:16: limits[0] \"a\": tenant_share must be in (0, 1] (got NaN)",
    ),
    (
        "reserved_fraction one",
        "[[priorities]]\nname = \"p\"\nreserved_fraction = 1.0\n",
        "test.toml:3:21: priorities[0] \"p\": reserved_fraction must be in [0, 1) (got 1)",
    ),
    (
        "reserved_fraction negative",
        "[[priorities]]\nname = \"p\"\nreserved_fraction = -0.1\n",
        "test.toml:3:21: priorities[0] \"p\": reserved_fraction must be in [0, 1) (got -0.1)",
    ),
    (
        "priority naming an unknown limit",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\n[[priorities]]\nname = \"p\"\nlimits = [\"a\", \"gpt-5\"]\n",
        "test.toml:6:16: priorities[0] \"p\": limits names \"gpt-5\", which is not a declared limit (declared: \"a\")",
    ),
    (
        "priority referencing nothing",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\n[[priorities]]\nname = \"p\"\nlimits = []\n",
        "test.toml:6:10: priorities[0] \"p\": limits is empty",
    ),
    (
        "default_priority naming an unknown class",
        "default_priority = \"urgent\"\n[[priorities]]\nname = \"interactive\"\n",
        "test.toml:1:20: default_priority \"urgent\" is not a declared priority class (declared: \"interactive\")",
    ),
    (
        "default_priority with no classes declared",
        "default_priority = \"interactive\"\n",
        "test.toml:1:20: default_priority \"interactive\" is not a declared priority class (no [[priorities]] are declared",
    ),
    (
        "empty limit name",
        "[[limits]]\nname = \"\"\ntokens_per_minute = 1\n",
        "test.toml:2:8: limits[0]: name must not be empty",
    ),
    (
        "missing limit name",
        "[[limits]]\ntokens_per_minute = 1\n",
        "test.toml:1:1: limits[0]: name is required",
    ),
    (
        "limit name too long",
        concat!(
            "[[limits]]\nname = \"",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "\"\ntokens_per_minute = 1\n"
        ),
        "test.toml:2:8: limits[0] \"aaaa",
    ),
    (
        "empty priority name",
        "[[priorities]]\nname = \"\"\n",
        "test.toml:2:8: priorities[0]: name must not be empty",
    ),
    (
        "socket_mode not octal",
        "[server]\nsocket_mode = \"0689\"\n",
        "test.toml:2:15: server: socket_mode \"0689\" is not an octal file mode",
    ),
    (
        "socket_mode above 0777",
        "[server]\nsocket_mode = \"01777\"\n",
        "test.toml:2:15: server: socket_mode \"01777\" is above the largest file mode \"0777\"",
    ),
    (
        "socket_mode as an integer",
        "[server]\nsocket_mode = 660\n",
        "test.toml:2:15: server.socket_mode: invalid type: integer `660`, expected a string",
    ),
    (
        "empty socket",
        "[server]\nsocket = \"\"\n",
        "test.toml:2:10: server: socket must not be empty",
    ),
    (
        "negative uid",
        "[server]\nallowed_uids = [1000, -1]\n",
        "test.toml:2:23: server: allowed_uids[1] must not be negative (got -1)",
    ),
    (
        "gid above u32",
        "[server]\nallowed_gids = [4294967296]\n",
        "test.toml:2:17: server: allowed_gids[0] must be at most 4294967295",
    ),
    (
        "negative drain timeout",
        "[server]\ndrain_timeout_ms = -1\n",
        "test.toml:2:20: server: drain_timeout_ms must not be negative (got -1)",
    ),
    (
        "redis url with a bad scheme, password masked",
        "[redis]\nurl = \"http://:hunter2@127.0.0.1:6379\"\n",
        "test.toml:2:7: redis: url \"http://:****@127.0.0.1:6379\" must start with redis://, rediss:// or unix://",
    ),
    (
        "redis url without host",
        "[redis]\nurl = \"redis://\"\n",
        "test.toml:2:7: redis: url \"redis://\" names no host",
    ),
    (
        "redis section without url",
        "default_priority = \"default\"\n\n[redis]\n",
        "test.toml:3:1: redis: url (or cluster_nodes) is required",
    ),
    (
        "redis with both url and cluster_nodes",
        "[redis]\nurl = \"redis://h\"\ncluster_nodes = [\"redis://a:7000\"]\n",
        "test.toml:3:17: redis: give either url (one node) or cluster_nodes",
    ),
    (
        "cluster node over a unix socket",
        "[redis]\ncluster_nodes = [\"unix:///tmp/r.sock\"]\n",
        "test.toml:2:18: redis: cluster nodes are reached over TCP",
    ),
    (
        "local failure policy without a share",
        "[redis]\nurl = \"redis://h\"\non_failure = \"local\"\n",
        "test.toml:3:14: redis: on_failure = \"local\" needs local_share",
    ),
    (
        "local_share without the local policy",
        "[redis]\nurl = \"redis://h\"\nlocal_share = 0.5\n",
        "test.toml:3:15: redis: local_share only applies with on_failure = \"local\"",
    ),
    (
        "unknown failure policy",
        "[redis]\nurl = \"redis://h\"\non_failure = \"retry\"\n",
        "test.toml:3:14: redis.on_failure: unknown variant `retry`",
    ),
    (
        "pool of zero connections",
        "[redis]\nurl = \"redis://h\"\npool_size = 0\n",
        "test.toml:3:13: redis: pool_size must be greater than zero",
    ),
    (
        "key prefix with a hash tag",
        "[redis]\nurl = \"redis://h\"\nkey_prefix = \"rk{x}\"\n",
        "test.toml:3:14: redis: key_prefix must be 1 to 128 bytes without braces",
    ),
    (
        "limit naming an undeclared group",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\ngroup = \"org\"\n",
        "test.toml:4:9: limits[0] \"a\": group \"org\" is not a declared group (no [[groups]] are declared)",
    ),
    (
        "group without any rate",
        "[[groups]]\nname = \"org\"\n",
        "test.toml:1:1: groups[0] \"org\": a group needs tokens_per_minute, requests_per_minute or both",
    ),
    (
        "duplicate group",
        "[[groups]]\nname = \"org\"\ntokens_per_minute = 1\n[[groups]]\nname = \"org\"\ntokens_per_minute = 1\n",
        "test.toml:5:8: groups[1] \"org\": duplicate group name \"org\" (first declared at line 2)",
    ),
    (
        "a CA file without TLS",
        "[redis]\nurl = \"redis://h\"\ntls_ca_file = \"/etc/ssl/ca.pem\"\n",
        "test.toml:3:15: redis: tls_ca_file is set but no node uses TLS (rediss://)",
    ),
    (
        "an unreadable CA file",
        "[redis]\nurl = \"rediss://h\"\ntls_ca_file = \"/nonexistent/ca.pem\"\n",
        "test.toml:3:15: redis: cannot read tls_ca_file \"/nonexistent/ca.pem\"",
    ),
    (
        "a refund fraction above one",
        "[leases]\non_disconnect = \"refund\"\ndisconnect_refund_fraction = 1.5\n",
        "test.toml:3:30: leases: disconnect_refund_fraction must be in [0, 1] (got 1.5)",
    ),
    (
        "leases that never expire",
        "[leases]\nexpire_after_ms = 0\n",
        "test.toml:2:19: leases: expire_after_ms must be greater than zero",
    ),
    (
        "unknown provider",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nprovider = \"azure\"\n",
        "test.toml:4:12: limits.provider: unknown variant `azure`, expected one of `openai`, `anthropic`, `generic`",
    ),
    (
        "unknown tokenizer",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\ntokenizer = \"p50k_base\"\n",
        "test.toml:4:13: limits.tokenizer: unknown variant `p50k_base`, expected one of `auto`, `o200k_base`, `cl100k_base`, `chars`",
    ),
    (
        "unknown cost rule",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\ncost_rule = \"min\"\n",
        "test.toml:4:13: limits.cost_rule: unknown variant `min`, expected `sum` or `max`",
    ),
    (
        "unknown settlement rule",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nsettle = \"keep\"\n",
        "test.toml:4:10: limits.settle: unknown variant `keep`, expected `refund` or `none`",
    ),
    (
        "learn_max_output as a string",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nlearn_max_output = \"yes\"\n",
        "test.toml:4:20: limits.learn_max_output: invalid type: string \"yes\", expected a boolean",
    ),
    (
        "combined and separate token buckets",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\ninput_tokens_per_minute = 1\noutput_tokens_per_minute = 1\n",
        "test.toml:4:27: limits[0] \"a\": give either tokens_per_minute (one token bucket) or input_tokens_per_minute and output_tokens_per_minute (separate buckets), not both",
    ),
    (
        "an input bucket without an output bucket",
        "[[limits]]\nname = \"a\"\ninput_tokens_per_minute = 1000\n",
        "test.toml:3:27: limits[0] \"a\": input_tokens_per_minute needs output_tokens_per_minute too (separate buckets come in pairs)",
    ),
    (
        "an output bucket without an input bucket",
        "[[limits]]\nname = \"a\"\noutput_tokens_per_minute = 1000\n",
        "test.toml:3:28: limits[0] \"a\": output_tokens_per_minute needs input_tokens_per_minute too",
    ),
    (
        "zero output_tokens_per_minute",
        "[[limits]]\nname = \"a\"\ninput_tokens_per_minute = 1000\noutput_tokens_per_minute = 0\n",
        "test.toml:4:28: limits[0] \"a\": output_tokens_per_minute must be greater than zero (got 0)",
    ),
    (
        "burst_tokens with separate buckets",
        "[[limits]]\nname = \"a\"\ninput_tokens_per_minute = 1000\noutput_tokens_per_minute = 100\nburst_tokens = 5\n",
        "test.toml:5:16: limits[0] \"a\": burst_tokens is set but this limit has separate input and output buckets (use burst_input_tokens and burst_output_tokens)",
    ),
    (
        "burst_input_tokens without its rate",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nburst_input_tokens = 5\n",
        "test.toml:4:22: limits[0] \"a\": burst_input_tokens is set but input_tokens_per_minute is not (a bucket needs a rate)",
    ),
    (
        "separate buckets below max_request_tokens",
        "[[limits]]\nname = \"a\"\ninput_tokens_per_minute = 100\noutput_tokens_per_minute = 50\nmax_request_tokens = 200\n",
        "test.toml:5:22: limits[0] \"a\": the input and output buckets together (150) is below max_request_tokens (200)",
    ),
    (
        "openai with a model tiktoken does not know",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nprovider = \"openai\"\nmodel = \"my-proxy\"\n",
        "test.toml:5:9: limits[0] \"a\": provider = \"openai\" counts with tiktoken, but model \"my-proxy\" has no known encoding; set tokenizer = \"o200k_base\" or \"cl100k_base\" (or \"chars\" for an estimate)",
    ),
    (
        "openai without a model",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nprovider = \"openai\"\n",
        "test.toml:4:12: limits[0] \"a\": provider = \"openai\" counts with the model's tiktoken encoding: set model",
    ),
    (
        "chars_per_token with a tiktoken model",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nmodel = \"gpt-4o\"\nchars_per_token = 4.0\n",
        "test.toml:5:19: limits[0] \"a\": chars_per_token only applies to the character estimate (tokenizer = \"chars\"), but this limit counts with o200k_base",
    ),
    (
        "chars_per_token of zero",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nprovider = \"anthropic\"\nchars_per_token = 0.0\n",
        "test.toml:5:19: limits[0] \"a\": chars_per_token must be from 0.5 to 16 (got 0)",
    ),
    (
        "safety_factor below one",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\ntokenizer = \"chars\"\nsafety_factor = 0.9\n",
        "test.toml:5:17: limits[0] \"a\": safety_factor must be from 1 to 10 (got 0.9)",
    ),
    (
        "negative default_max_output_tokens",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\ndefault_max_output_tokens = -1\n",
        "test.toml:4:29: limits[0] \"a\": default_max_output_tokens must not be negative (got -1)",
    ),
    (
        "redis as a string, password masked",
        "redis = \"redis://:hunter2@h\"\n",
        "test.toml:1:9: redis: invalid type: string \"redis://:****@h\", expected a [redis] table",
    ),
    (
        "max_wait_ms above bound",
        "[[priorities]]\nname = \"p\"\nmax_wait_ms = 3_600_001\n",
        "test.toml:3:15: priorities[0] \"p\": max_wait_ms must be at most 3600000 (got 3600001)",
    ),
    (
        "negative max_wait_ms",
        "[[priorities]]\nname = \"p\"\nmax_wait_ms = -1\n",
        "test.toml:3:15: priorities[0] \"p\": max_wait_ms must not be negative",
    ),
];

#[test]
fn config_mistakes_are_reported_with_their_location() {
    let mut failures = Vec::new();
    for (what, text, expected) in MISTAKES {
        match from_toml_str(text, "test.toml") {
            Ok(_) => failures.push(format!("{what}: accepted")),
            Err(err) => {
                let message = err.to_string();
                if !message.contains(expected) {
                    failures.push(format!(
                        "{what}:\n  expected: {expected}\n  got:      {message}"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn config_reports_every_error_in_file_order() {
    let text = "\
default_priority = \"nope\"
[[limits]]
name = \"a\"
tokens_per_minute = 0
tenant_share = 2.0

[[limits]]
name = \"a\"
tokens_per_minute = 10

[[priorities]]
name = \"p\"
limits = [\"b\"]
";
    let message = parse_err(text);
    let lines: Vec<&str> = message.lines().collect();
    assert_eq!(lines.len(), 5, "{message}");
    assert!(lines[0].starts_with("test.toml:1:20: default_priority \"nope\""));
    assert!(lines[1].starts_with("test.toml:4:21: limits[0] \"a\": tokens_per_minute"));
    assert!(lines[2].starts_with("test.toml:5:16: limits[0] \"a\": tenant_share"));
    assert!(lines[3].starts_with("test.toml:8:8: limits[1] \"a\": duplicate limit name"));
    assert!(lines[4].starts_with("test.toml:13:11: priorities[0] \"p\": limits names \"b\""));
}

#[test]
fn config_columns_count_characters() {
    let message = parse_err("[[limits]]\nname = \"a\" # é\ntokens_per_minute = 0\n");
    assert!(message.contains("test.toml:3:21:"), "{message}");
    let message = parse_err("# ééé\n[[limits]]\nname = \"é\"; tokens_per_minute = 1\n");
    assert!(message.starts_with("test.toml:3:"), "{message}");
}

#[test]
fn config_defaults_without_a_file() {
    let config = load(None, no_env).unwrap();
    assert_eq!(config, Config::default());
    assert_eq!(config.server.socket, PathBuf::from("/tmp/ratekeeper.sock"));
    assert_eq!(config.server.socket_mode, 0o660);
    assert_eq!(config.server.drain_timeout_ms, 10_000);
    assert!(config.redis.is_none());
    assert!(config.limits.is_empty());
    assert_eq!(config.priorities.len(), 1);
    assert_eq!(config.priorities[0].name, "default");
    assert_eq!(config.priorities[0].reserved_fraction, 0.0);
    assert_eq!(config.priorities[0].max_wait_ms, 10_000);
    assert_eq!(config.priorities[0].limits, None);
    assert_eq!(config.default_priority, "default");
}

#[test]
fn config_empty_file_is_the_defaults() {
    assert_eq!(parse_ok(""), Config::default());
    assert_eq!(
        parse_ok("default_priority = \"default\"\n"),
        Config::default()
    );
}

#[test]
fn config_resolves_defaults() {
    let config = parse_ok(
        "\
[[limits]]
name = \"gpt-4o\"
tokens_per_minute = 30000
requests_per_minute = 500

[[limits]]
name = \"embed\"
tokens_per_minute = 1000
burst_tokens = 2000
max_request_tokens = 2000
tenant_share = 1

[[priorities]]
name = \"interactive\"

[[priorities]]
name = \"batch\"
reserved_fraction = 0.25
max_wait_ms = 0
limits = [\"gpt-4o\"]
",
    );
    let gpt = config.limit("gpt-4o").unwrap();
    assert_eq!(gpt.tokens_per_minute, 30_000);
    assert_eq!(gpt.burst_tokens, 30_000);
    assert_eq!(gpt.requests_per_minute, Some(500));
    assert_eq!(gpt.burst_requests, Some(500));
    assert_eq!(gpt.tenant_share, None);
    assert_eq!(gpt.max_request_tokens, None);
    assert_eq!(gpt.model, None);

    let embed = config.limit("embed").unwrap();
    assert_eq!(embed.burst_tokens, 2000);
    assert_eq!(embed.requests_per_minute, None);
    assert_eq!(embed.burst_requests, None);
    assert_eq!(embed.tenant_share, Some(1.0));
    assert_eq!(embed.max_request_tokens, Some(2000));

    assert_eq!(config.default_priority, "interactive");
    let interactive = config.priority("interactive").unwrap();
    assert_eq!(interactive.reserved_fraction, 0.0);
    assert_eq!(interactive.max_wait_ms, 10_000);
    assert_eq!(interactive.limits, None);
    let batch = config.priority("batch").unwrap();
    assert_eq!(batch.reserved_fraction, 0.25);
    assert_eq!(batch.max_wait_ms, 0);
    assert_eq!(batch.limits, Some(vec!["gpt-4o".to_string()]));
    assert!(config.priority("default").is_none());
}

#[test]
fn config_explicit_values() {
    let config = parse_ok(
        "\
default_priority = \"batch\"

[server]
socket = \"/run/rk.sock\"
socket_mode = \"0600\"
allowed_uids = [1000, 0]
allowed_gids = [4294967295]
drain_timeout_ms = 0

[redis]
url = \"rediss://user:pw@redis.example:6380/2\"

[[limits]]
name = \"a\"
tokens_per_minute = 1_000_000_000
requests_per_minute = 1
burst_tokens = 10_000_000_000
burst_requests = 7
model = \"cl100k_base\"

[[priorities]]
name = \"interactive\"
[[priorities]]
name = \"batch\"
",
    );
    assert_eq!(config.default_priority, "batch");
    assert_eq!(config.server.socket, PathBuf::from("/run/rk.sock"));
    assert_eq!(config.server.socket_mode, 0o600);
    assert_eq!(config.server.allowed_uids, vec![1000, 0]);
    assert_eq!(config.server.allowed_gids, vec![u32::MAX]);
    assert_eq!(config.server.drain_timeout_ms, 0);
    assert_eq!(
        config.redis,
        Some(RedisConfig::with_url(
            "rediss://user:pw@redis.example:6380/2"
        ))
    );
    let a = config.limit("a").unwrap();
    assert_eq!(a.burst_tokens, 10_000_000_000);
    assert_eq!(a.burst_requests, Some(7));
    assert_eq!(a.model.as_deref(), Some("cl100k_base"));
}

#[test]
fn config_socket_mode_spellings() {
    for (text, mode) in [
        ("0660", 0o660),
        ("660", 0o660),
        ("0o600", 0o600),
        ("0777", 0o777),
        ("0", 0),
    ] {
        let config = parse_ok(&format!("[server]\nsocket_mode = \"{text}\"\n"));
        assert_eq!(config.server.socket_mode, mode, "{text}");
    }
    for text in [
        "",
        "0o",
        "rw-rw----",
        "0x1ff",
        "-660",
        "0 660",
        "99999999999999999",
    ] {
        let message = parse_err(&format!("[server]\nsocket_mode = \"{text}\"\n"));
        assert!(message.contains("is not an octal file mode"), "{message}");
    }
    for text in ["1000", "0o7777", "77777777777777777777"] {
        let message = parse_err(&format!("[server]\nsocket_mode = \"{text}\"\n"));
        assert!(
            message.contains("is above the largest file mode"),
            "{message}"
        );
    }
}

#[test]
fn config_env_overrides() {
    let env = |name: &str| match name {
        ENV_SOCKET => Some("/run/override.sock".to_string()),
        ENV_REDIS_URL => Some("redis://:pw@10.0.0.1:6379/1".to_string()),
        _ => None,
    };
    // Without a file: the defaults, overridden.
    let config = load(None, env).unwrap();
    assert_eq!(config.server.socket, PathBuf::from("/run/override.sock"));
    assert_eq!(
        config.redis.as_ref().and_then(|r| r.url.as_deref()),
        Some("redis://:pw@10.0.0.1:6379/1")
    );

    // With a file: the override replaces the file's values.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rk.toml");
    std::fs::write(
        &path,
        format!("[server]\nsocket = \"/run/file.sock\"\nsocket_mode = \"0600\"\n[redis]\nurl = \"redis://file:6379\"\n{LIMIT_A}"),
    )
    .unwrap();
    let config = load(Some(&path), env).unwrap();
    assert_eq!(config.server.socket, PathBuf::from("/run/override.sock"));
    assert_eq!(config.server.socket_mode, 0o600);
    assert_eq!(
        config.redis.unwrap().url.as_deref(),
        Some("redis://:pw@10.0.0.1:6379/1")
    );
    assert_eq!(config.limits.len(), 1);

    // No overrides: the file's values.
    let config = load(Some(&path), no_env).unwrap();
    assert_eq!(config.server.socket, PathBuf::from("/run/file.sock"));
    assert_eq!(
        config.redis.unwrap().url.as_deref(),
        Some("redis://file:6379")
    );
}

#[test]
fn config_env_overrides_are_validated() {
    let env = |name: &str| match name {
        ENV_SOCKET => Some(String::new()),
        ENV_REDIS_URL => Some("http://:secret@h".to_string()),
        _ => None,
    };
    let message = load(None, env).unwrap_err().to_string();
    assert_eq!(
        message,
        "RATEKEEPER_SOCKET: socket must not be empty\n\
         RATEKEEPER_REDIS_URL: url \"http://:****@h\" must start with redis://, rediss:// or unix://"
    );

    // A bad file and a bad override: both reported.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[[limits]]\nname = \"a\"\ntokens_per_minute = 0\n").unwrap();
    let message = load(Some(&path), env).unwrap_err().to_string();
    let lines: Vec<&str> = message.lines().collect();
    assert_eq!(lines.len(), 3, "{message}");
    assert_eq!(
        lines[0],
        format!(
            "{}:3:21: limits[0] \"a\": tokens_per_minute must be greater than zero (got 0)",
            path.display()
        )
    );
    assert!(lines[1].starts_with("RATEKEEPER_SOCKET: "));
    assert!(lines[2].starts_with("RATEKEEPER_REDIS_URL: "));

    let long = format!("/{}", "s".repeat(MAX_SOCKET_PATH_LEN));
    let message = load(None, |name: &str| {
        (name == ENV_SOCKET).then(|| long.clone())
    })
    .unwrap_err()
    .to_string();
    assert!(
        message.starts_with("RATEKEEPER_SOCKET: socket path is"),
        "{message}"
    );
}

#[test]
fn config_load_reports_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.toml");
    let err = load(Some(&missing), no_env).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }));
    let message = err.to_string();
    assert!(
        message.starts_with(&format!("cannot read {}: ", missing.display())),
        "{message}"
    );

    let path = dir.path().join("syntax.toml");
    std::fs::write(&path, "[server\n").unwrap();
    let message = load(Some(&path), no_env).unwrap_err().to_string();
    assert!(
        message.starts_with(&format!("{}:1:", path.display())),
        "{message}"
    );
}

#[test]
fn config_mask_redis_url() {
    for (url, masked) in [
        ("redis://user:pass@h", "redis://user:****@h"),
        ("redis://:pass@h", "redis://:****@h"),
        (
            "redis://:secret@127.0.0.1:6379/0",
            "redis://:****@127.0.0.1:6379/0",
        ),
        (
            "rediss://u:p%40ss@h:6380/1?x=1",
            "rediss://u:****@h:6380/1?x=1",
        ),
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("redis://user@h", "redis://user@h"),
        ("redis://:@h", "redis://:@h"),
        ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
        ("unix:///run/redis.sock", "unix:///run/redis.sock"),
        (
            "unix:///run/redis.sock?db=1&pass=secret",
            "unix:///run/redis.sock?db=1&pass=****",
        ),
        (
            "unix:///run/redis.sock?password=s#frag",
            "unix:///run/redis.sock?password=****#frag",
        ),
        ("redis://a:b@c@h/0", "redis://a:****@h/0"),
        ("not a url", "not a url"),
        ("", ""),
    ] {
        assert_eq!(mask_redis_url(url), masked, "{url}");
    }
}

#[test]
fn config_effective_toml_round_trips_and_masks() {
    let text = "\
[server]
socket = \"/run/rk.sock\"
socket_mode = \"0600\"
allowed_uids = [1000]

[redis]
url = \"redis://:hunter2@127.0.0.1:6379/0\"

[[limits]]
name = \"gpt-4o\"
tokens_per_minute = 30000
requests_per_minute = 500
tenant_share = 0.25
max_request_tokens = 16000
model = \"gpt-4o\"

[[priorities]]
name = \"interactive\"
[[priorities]]
name = \"batch\"
reserved_fraction = 0.2
limits = [\"gpt-4o\"]
";
    let config = parse_ok(text);
    let effective = config.to_effective_toml();
    assert!(!effective.contains("hunter2"), "{effective}");
    assert!(
        effective.contains("url = \"redis://:****@127.0.0.1:6379/0\""),
        "{effective}"
    );
    assert!(effective.contains("socket_mode = \"0600\""), "{effective}");
    assert!(
        effective.contains("default_priority = \"interactive\""),
        "{effective}"
    );
    assert!(effective.contains("burst_tokens = 30000"), "{effective}");
    assert!(effective.contains("burst_requests = 500"), "{effective}");

    // The output is itself a valid configuration, equal but for the
    // masked password.
    let mut reparsed = parse_ok(&effective);
    assert_eq!(
        reparsed.redis.as_ref().unwrap().url.as_deref(),
        Some("redis://:****@127.0.0.1:6379/0")
    );
    reparsed.redis = config.redis.clone();
    assert_eq!(reparsed, config);

    // The defaults round-trip too (implicit class made explicit).
    let defaults = Config::default();
    assert_eq!(parse_ok(&defaults.to_effective_toml()), defaults);
}

#[test]
fn config_provider_presets_and_overrides() {
    use CostRule::{Max, Sum};
    use SettleRule::{NoRefund, Refund};
    use Tokenizer::{Chars, Cl100kBase, O200kBase};
    // (keys after name and tokens_per_minute) → (tokenizer, chars
    // per token and safety factor, cost rule, settlement rule)
    type Expected = (Tokenizer, Option<(f64, f64)>, CostRule, SettleRule);
    let cases: &[(&str, Expected)] = &[
        ("", (Chars, Some((3.5, 1.1)), Sum, Refund)),
        ("model = \"gpt-4o-mini\"", (O200kBase, None, Sum, Refund)),
        ("model = \"gpt-4\"", (Cl100kBase, None, Sum, Refund)),
        (
            "model = \"claude-sonnet-4-5\"",
            (Chars, Some((3.5, 1.1)), Sum, Refund),
        ),
        (
            "provider = \"openai\"\nmodel = \"gpt-4o\"",
            (O200kBase, None, Max, NoRefund),
        ),
        (
            "provider = \"openai\"\nmodel = \"gpt-3.5-turbo\"",
            (Cl100kBase, None, Max, NoRefund),
        ),
        (
            "provider = \"openai\"\ntokenizer = \"o200k_base\"",
            (O200kBase, None, Max, NoRefund),
        ),
        (
            "provider = \"openai\"\nmodel = \"gpt-4o\"\ncost_rule = \"sum\"\nsettle = \"refund\"",
            (O200kBase, None, Sum, Refund),
        ),
        (
            "provider = \"anthropic\"",
            (Chars, Some((3.5, 1.1)), Sum, Refund),
        ),
        // An Anthropic limit never uses tiktoken, whatever the model.
        (
            "provider = \"anthropic\"\nmodel = \"gpt-4o\"\nchars_per_token = 3\nsafety_factor = 1.25",
            (Chars, Some((3.0, 1.25)), Sum, Refund),
        ),
        (
            "provider = \"anthropic\"\nsettle = \"none\"\ncost_rule = \"max\"",
            (Chars, Some((3.5, 1.1)), Max, NoRefund),
        ),
        (
            "model = \"gpt-4o\"\ntokenizer = \"chars\"",
            (Chars, Some((3.5, 1.1)), Sum, Refund),
        ),
        (
            "model = \"gpt-4o\"\ntokenizer = \"auto\"",
            (O200kBase, None, Sum, Refund),
        ),
    ];
    for (keys, (tokenizer, estimate, cost_rule, settle)) in cases {
        let text = format!("{LIMIT_A}{keys}\n");
        let config = parse_ok(&text);
        let limit = &config.limits[0];
        assert_eq!(limit.tokenizer, *tokenizer, "{keys}");
        assert_eq!(
            limit.chars_per_token.zip(limit.safety_factor),
            *estimate,
            "{keys}"
        );
        assert_eq!(limit.cost_rule, *cost_rule, "{keys}");
        assert_eq!(limit.settle, *settle, "{keys}");
        assert_eq!(limit.default_max_output_tokens, DEFAULT_MAX_OUTPUT_TOKENS);
        assert!(!limit.learn_max_output);
        // check-config's output reads back as the same configuration.
        assert_eq!(parse_ok(&config.to_effective_toml()), config, "{keys}");
    }
    let limit = &parse_ok("[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nprovider = \"anthropic\"\nchars_per_token = 2.5\n").limits[0];
    assert_eq!(
        limit.counter(),
        Counter::Chars(CharEstimator::new(2.5, 1.1).unwrap())
    );
    let config = parse_ok(
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nmodel = \"gpt-4o\"\n[[limits]]\nname = \"b\"\ntokens_per_minute = 1\nmodel = \"gpt-4o-mini\"\n[[limits]]\nname = \"c\"\ntokens_per_minute = 1\nprovider = \"anthropic\"\n",
    );
    assert_eq!(
        config.encodings(),
        std::collections::BTreeSet::from([Encoding::O200kBase])
    );
}

#[test]
fn config_separate_input_and_output_buckets() {
    let config = parse_ok(
        "\
[[limits]]
name = \"claude\"
provider = \"anthropic\"
input_tokens_per_minute = 40000
output_tokens_per_minute = 8000
burst_output_tokens = 4000
requests_per_minute = 50
tenant_share = 0.5
default_max_output_tokens = 2048
learn_max_output = true
max_request_tokens = 40000
",
    );
    let limit = config.limit("claude").unwrap();
    assert_eq!(
        limit.token_buckets(),
        TokenBuckets::Split {
            input: TokenRate {
                per_minute: 40_000,
                burst: 40_000
            },
            output: TokenRate {
                per_minute: 8_000,
                burst: 4_000
            },
        }
    );
    assert_eq!(
        limit.total_token_rate(),
        TokenRate {
            per_minute: 48_000,
            burst: 44_000
        }
    );
    assert_eq!((limit.tokens_per_minute, limit.burst_tokens), (0, 0));
    assert_eq!(limit.default_max_output_tokens, 2048);
    assert!(limit.learn_max_output);
    let effective = config.to_effective_toml();
    assert!(!effective.contains("\ntokens_per_minute"), "{effective}");
    assert!(!effective.contains("\nburst_tokens"), "{effective}");
    assert!(
        effective.contains("burst_input_tokens = 40000"),
        "{effective}"
    );
    assert_eq!(parse_ok(&effective), config);

    let combined = parse_ok(LIMIT_A);
    assert_eq!(
        combined.limits[0].token_buckets(),
        TokenBuckets::Combined(TokenRate {
            per_minute: 100,
            burst: 100
        })
    );
}

#[test]
fn config_example_commented_anthropic_limit_is_valid() {
    let example = include_str!("../../examples/ratekeeper.toml");
    let start = example
        .find("# --- anthropic example ---\n")
        .expect("the example marks its anthropic block");
    let end = example[start..]
        .find("# --- end of anthropic example ---")
        .expect("the block ends")
        + start;
    let block: String = example[start..end]
        .lines()
        .skip(1)
        .map(|line| format!("{}\n", line.strip_prefix("# ").unwrap_or(line)))
        .collect();
    let config = parse_ok(&block);
    let limit = config.limit("claude-sonnet").unwrap();
    assert_eq!(limit.provider, Provider::Anthropic);
    assert!(matches!(limit.token_buckets(), TokenBuckets::Split { .. }));
    assert_eq!(limit.tokenizer, Tokenizer::Chars);
    // The commented keys of the first limit are its defaults.
    let uncommented: String = example
        .lines()
        .map(|line| {
            let key = line.trim_start_matches("# ");
            let is_default_key = [
                "provider =",
                "tokenizer =",
                "default_max_output_tokens =",
                "cost_rule =",
                "settle =",
                "learn_max_output =",
            ]
            .iter()
            .any(|k| key.starts_with(k));
            if is_default_key { key } else { line }.to_string() + "\n"
        })
        .collect();
    assert_eq!(
        parse_ok(&uncommented).limits[0],
        parse_ok(example).limits[0]
    );
}

#[test]
fn config_readme_token_counting_example_is_valid() {
    let readme = include_str!("../../README.md");
    let section = readme
        .split("## Token counting and cost")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("README has a token counting section");
    let blocks: Vec<&str> = section
        .split("```toml\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .collect();
    assert!(!blocks.is_empty(), "no TOML example in the section");
    for block in blocks {
        let config = parse_ok(block);
        assert!(
            config
                .limits
                .iter()
                .any(|l| l.provider != Provider::Generic)
        );
    }
}

#[test]
fn config_line_col() {
    let text = "ab\ncdé\n\nx";
    assert_eq!(line_col(text, 0), (1, 1));
    assert_eq!(line_col(text, 2), (1, 3));
    assert_eq!(line_col(text, 3), (2, 1));
    assert_eq!(line_col(text, 7), (2, 4));
    assert_eq!(line_col(text, 8), (3, 1));
    assert_eq!(line_col(text, 9), (4, 1));
    assert_eq!(line_col(text, 100), (4, 2));
}

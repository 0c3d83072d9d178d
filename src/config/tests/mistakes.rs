//! Every listed mistake is refused with its located message.

use super::*;

/// (what, file text, expected substring of the error, location included).
const MISTAKES: &[(&str, &str, &str)] = &[
    (
        "unknown top-level key",
        "bogus = 1\n",
        "test.toml:1:1: unknown key `bogus`, expected one of `default_priority`, `server`",
    ),
    (
        "unknown key in a limit",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\ntoken_per_minute = 2\n",
        "test.toml:4:1: limits[0]: unknown key `token_per_minute`, did you mean `tokens_per_minute`?",
    ),
    (
        "unknown key in server",
        "[server]\nsockett = \"/x\"\n",
        "test.toml:2:1: server: unknown key `sockett`, did you mean `socket`?",
    ),
    (
        "unknown key in redis",
        "[redis]\nurl = \"redis://h\"\npassword = \"x\"\n",
        "test.toml:3:1: redis: unknown key `password`, expected one of `url`",
    ),
    (
        "unknown key in a priority",
        "[[priorities]]\nname = \"p\"\nmax_wait = 3\n",
        "test.toml:3:1: priorities[0]: unknown key `max_wait`, did you mean `max_wait_ms`?",
    ),
    ("syntax error", "[[limits]\n", "test.toml:1:"),
    (
        "wrong type",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = \"lots\"\n",
        "test.toml:3:21: limits[0].tokens_per_minute: invalid type: string \"lots\", expected an integer",
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
        "no bucket at all",
        "[[limits]]\nname = \"a\"\n",
        "test.toml:1:1: limits[0] \"a\": a limit needs a bucket: tokens_per_minute",
    ),
    (
        "a tenant share of a limit without a per-minute token bucket",
        "[[limits]]\nname = \"a\"\nrequests_per_minute = 10\ntenant_share = 0.5\n",
        "test.toml:4:16: limits[0] \"a\": tenant_share is a share of the per-minute token bucket, and this limit has none",
    ),
    (
        "a window figure of zero",
        "[[limits]]\nname = \"a\"\nrequests_per_day = 0\n",
        "test.toml:3:20: limits[0] \"a\": requests_per_day must be greater than zero (got 0)",
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
        "redis url with an unescaped / in the password, masked",
        "[redis]\nurl = \"redis://user:pa/ss@host\"\n",
        "test.toml:2:7: redis: url \"redis://user:****@host\": a '/', '?' or '#' in the userinfo must be percent-encoded (%2F, %3F, %23)",
    ),
    (
        "sentinel url with an unescaped ?, # and / in the password, masked",
        "[redis]\nsentinels = [\"redis://:ab/c?d#e@s:26379\"]\nmaster_name = \"m\"\n",
        "test.toml:2:14: redis: url \"redis://:****@s:26379\": a '/', '?' or '#' in the userinfo must be percent-encoded",
    ),
    (
        "redis as a string with a space in the password, masked",
        "redis = \"redis://:a b@h\"\n",
        "test.toml:1:9: redis: invalid type: string \"redis://:****@h\", expected a [redis] table",
    ),
    (
        "redis as a string with a quote and a space in the password, masked",
        "redis = 'redis://:a\"b c@h'\n",
        "test.toml:1:9: redis: invalid type: string \"redis://:****@h\", expected a [redis] table",
    ),
    (
        "redis url without host",
        "[redis]\nurl = \"redis://\"\n",
        "test.toml:2:7: redis: url \"redis://\" names no host",
    ),
    (
        "redis section without url",
        "default_priority = \"default\"\n\n[redis]\n",
        "test.toml:3:1: redis: url (or cluster_nodes, or sentinels) is required",
    ),
    (
        "redis with both url and cluster_nodes",
        "[redis]\nurl = \"redis://h\"\ncluster_nodes = [\"redis://a:7000\"]\n",
        "test.toml:3:17: redis: give one of url (one node), cluster_nodes (a Redis Cluster) or sentinels",
    ),
    (
        "sentinels and a url",
        "[redis]\nurl = \"redis://h\"\nsentinels = [\"redis://s:26379\"]\nmaster_name = \"m\"\n",
        "test.toml:3:13: redis: give one of url (one node), cluster_nodes (a Redis Cluster) or sentinels",
    ),
    (
        "sentinels without the primary's name",
        "[redis]\nsentinels = [\"redis://s:26379\"]\n",
        "test.toml:1:1: redis: sentinels need master_name",
    ),
    (
        "no sentinels",
        "[redis]\nsentinels = []\nmaster_name = \"m\"\n",
        "test.toml:2:13: redis: sentinels is empty",
    ),
    (
        "the primary's credentials without sentinels",
        "[redis]\nurl = \"redis://h\"\nmaster_password = \"x\"\n",
        "test.toml:3:19: redis: master_name, master_username, master_password and master_db go with sentinels",
    ),
    (
        "a negative database",
        "[redis]\nsentinels = [\"redis://s:26379\"]\nmaster_name = \"m\"\nmaster_db = -1\n",
        "test.toml:4:13: redis: master_db must not be negative",
    ),
    (
        "cluster node over a unix socket",
        "[redis]\ncluster_nodes = [\"unix:///tmp/r.sock\"]\n",
        "test.toml:2:18: redis: cluster_nodes are reached over TCP",
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
        "test.toml:3:14: redis.on_failure: unknown value `retry`, expected one of `fail_closed`, `fail_open`, `local`",
    ),
    (
        "misspelled failure policy",
        "[redis]\nurl = \"redis://h\"\non_failure = \"locall\"\nlocal_share = 0.5\n",
        "test.toml:3:14: redis.on_failure: unknown value `locall`, expected one of `fail_closed`, `fail_open`, `local`; did you mean `local`?",
    ),
    (
        "failure policy spelled as in Rust",
        "[redis]\nurl = \"redis://h\"\non_failure = \"FailOpen\"\n",
        "did you mean `fail_open`?",
    ),
    (
        "unknown key in a group",
        "[[groups]]\nname = \"org\"\ntokens_per_minutes = 1\n",
        "test.toml:3:1: groups[0]: unknown key `tokens_per_minutes`, did you mean `tokens_per_minute`?",
    ),
    (
        "unknown key in leases",
        "[leases]\non_disconect = \"refund\"\n",
        "test.toml:2:1: leases: unknown key `on_disconect`, did you mean `on_disconnect`?",
    ),
    (
        "unknown key in the second limit",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\n[[limits]]\nname = \"b\"\nburst_token = 1\ntokens_per_minute = 1\n",
        "test.toml:6:1: limits[1]: unknown key `burst_token`, did you mean `burst_tokens`?",
    ),
    (
        "misspelled limit in a priority class",
        "[[limits]]\nname = \"gpt-4o-mini\"\ntokens_per_minute = 1\n[[priorities]]\nname = \"p\"\nlimits = [\"gpt-4o-mni\"]\n",
        "test.toml:6:11: priorities[0] \"p\": limits names \"gpt-4o-mni\", which is not a declared limit (declared: \"gpt-4o-mini\"); did you mean \"gpt-4o-mini\"?",
    ),
    (
        "misspelled group",
        "[[groups]]\nname = \"org\"\ntokens_per_minute = 1\n[[limits]]\nname = \"a\"\ntokens_per_minute = 1\ngroup = \"orgg\"\n",
        "limits[0] \"a\": group \"orgg\" is not a declared group (declared: \"org\"); did you mean \"org\"?",
    ),
    (
        "misspelled default_priority",
        "default_priority = \"interactiv\"\n[[priorities]]\nname = \"interactive\"\n",
        "(declared: \"interactive\"); did you mean \"interactive\"?",
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
        "test.toml:1:1: groups[0] \"org\": a group needs tokens_per_minute, requests_per_minute or a budget",
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
        "test.toml:4:12: limits[0].provider: unknown value `azure`, expected one of `openai`, `anthropic`, `generic`",
    ),
    (
        "unknown tokenizer",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\ntokenizer = \"p50k_base\"\n",
        "test.toml:4:13: limits[0].tokenizer: unknown value `p50k_base`, expected one of `auto`, `o200k_base`, `cl100k_base`, `chars`",
    ),
    (
        "unknown cost rule",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\ncost_rule = \"min\"\n",
        "test.toml:4:13: limits[0].cost_rule: unknown value `min`, expected `sum` or `max`",
    ),
    (
        "unknown settlement rule",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nsettle = \"keep\"\n",
        "test.toml:4:10: limits[0].settle: unknown value `keep`, expected `refund` or `none`",
    ),
    (
        "learn_max_output as a string",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nlearn_max_output = \"yes\"\n",
        "test.toml:4:20: limits[0].learn_max_output: invalid type: string \"yes\", expected a boolean",
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
        "safety_factor with OpenAI's character rule",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nprovider = \"openai\"\nsafety_factor = 1.2\n",
        "test.toml:5:17: limits[0] \"a\": safety_factor only applies to the character estimate (tokenizer = \"chars\"), but this limit counts with openai_chars",
    ),
    (
        "OpenAI's divisor out of range",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nprovider = \"openai\"\nchars_per_token = 40\n",
        "test.toml:5:19: limits[0] \"a\": chars_per_token must be from 0.5 to 16 (got 40)",
    ),
    (
        "chars_per_token with a tiktoken model",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nmodel = \"gpt-4o\"\nchars_per_token = 4.0\n",
        "test.toml:5:19: limits[0] \"a\": chars_per_token only applies to a character count (tokenizer = \"chars\" or \"openai_chars\"), but this limit counts with o200k_base",
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
        "no slots",
        "[[limits]]\nname = \"a\"\nmax_concurrent = 0\n",
        "test.toml:3:18: limits[0] \"a\": max_concurrent must be greater than zero (got 0)",
    ),
    (
        "a slot timeout under a second",
        "[[limits]]\nname = \"a\"\nmax_concurrent = 2\nconcurrent_timeout_ms = 999\n",
        "test.toml:4:25: limits[0] \"a\": concurrent_timeout_ms must be at least 1000 (got 999)",
    ),
    (
        "negative burst_headroom_ms",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nburst_headroom_ms = -1\n",
        "test.toml:4:21: limits[0] \"a\": burst_headroom_ms must not be negative (got -1)",
    ),
    (
        "burst_headroom_ms above a minute",
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nburst_headroom_ms = 60001\n",
        "test.toml:4:21: limits[0] \"a\": burst_headroom_ms must be at most 60000 (got 60001)",
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

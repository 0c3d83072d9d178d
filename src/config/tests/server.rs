//! `[server]`'s resource bounds: defaults, limits, located mistakes, and
//! what `check-config` shows.

use super::*;

#[test]
fn config_server_bounds_default_to_fit_the_shipped_pod() {
    let server = parse_ok("").server;
    assert_eq!(server.max_connections, 1024);
    assert_eq!(server.max_buffered_bytes, 64 * 1024 * 1024);
    assert_eq!(server.hello_timeout_ms, 10_000);
    assert_eq!(server.frame_timeout_ms, 10_000);
    assert_eq!(server.threads, 1);
}

#[test]
fn config_server_bounds_are_read() {
    let server = parse_ok(
        "[server]\nmax_connections = 1\nmax_buffered_bytes = 4194308\n\
         hello_timeout_ms = 250\nframe_timeout_ms = 3600000\nthreads = 4\n",
    )
    .server;
    assert_eq!(server.max_connections, 1);
    assert_eq!(server.max_buffered_bytes, 4_194_308);
    assert_eq!(server.hello_timeout_ms, 250);
    assert_eq!(server.frame_timeout_ms, 3_600_000);
    assert_eq!(server.threads, 4);
}

#[test]
fn config_server_bound_mistakes_are_located() {
    for (text, expected) in [
        (
            "[server]\nmax_connections = 0\n",
            "test.toml:2:19: server: max_connections must be greater than zero (got 0)",
        ),
        (
            "[server]\nthreads = 0\n",
            "test.toml:2:11: server: threads must be greater than zero (got 0)",
        ),
        (
            "[server]\nthreads = 65\n",
            "test.toml:2:11: server: threads must be at most 64 (got 65)",
        ),
        (
            "[server]\nmax_connections = 1_000_001\n",
            "test.toml:2:19: server: max_connections must be at most 1000000 (got 1000001)",
        ),
        (
            "[server]\nmax_buffered_bytes = 4194303\n",
            "test.toml:2:22: server: max_buffered_bytes must be at least 4194308, one frame of the largest size (got 4194303)",
        ),
        (
            "[server]\nmax_buffered_bytes = -1\n",
            "test.toml:2:22: server: max_buffered_bytes must be greater than zero (got -1)",
        ),
        (
            "[server]\nhello_timeout_ms = 0\n",
            "test.toml:2:20: server: hello_timeout_ms must be greater than zero (got 0)",
        ),
        (
            "[server]\nframe_timeout_ms = 3_600_001\n",
            "test.toml:2:20: server: frame_timeout_ms must be at most 3600000 (got 3600001)",
        ),
    ] {
        let message = parse_err(text);
        assert!(message.contains(expected), "{text}:\n{message}");
    }
}

#[test]
fn config_server_bounds_are_shown_by_check_config() {
    let shown = parse_ok("[server]\nmax_connections = 7\n").to_effective_toml();
    for line in [
        "max_connections = 7",
        "max_buffered_bytes = 67108864",
        "hello_timeout_ms = 10000",
        "frame_timeout_ms = 10000",
    ] {
        assert!(shown.contains(line), "{line} missing from:\n{shown}");
    }
}

//! `[server]`: the socket and who may connect to it.

use std::path::PathBuf;

use crate::config::diagnostics::{Diagnostics, check_int};
use crate::config::model::{
    MAX_BUFFERED_BYTES, MAX_CONNECTIONS, MAX_SOCKET_MODE, MAX_SOCKET_PATH_LEN, MAX_THREADS,
    MAX_WAIT_MS, ServerConfig,
};
use crate::config::raw::RawServer;
use crate::proto::{LENGTH_PREFIX_LEN, MAX_FRAME_LEN};

/// The `[server]` section over `out`; bad values are reported and left at
/// their defaults.
pub(super) fn resolve_server(server: RawServer, out: &mut ServerConfig, d: &mut Diagnostics) {
    if let Some(socket) = server.socket {
        match socket_problem(socket.get_ref()) {
            Some(problem) => d.error(socket.span().start, format!("server: {problem}")),
            None => out.socket = PathBuf::from(socket.into_inner()),
        }
    }
    if let Some(mode) = server.socket_mode {
        match parse_socket_mode(mode.get_ref()) {
            Some(m) if m <= MAX_SOCKET_MODE => out.socket_mode = m,
            Some(_) => d.error(
                mode.span().start,
                format!(
                    "server: socket_mode {:?} is above the largest file mode \"{MAX_SOCKET_MODE:04o}\"",
                    mode.get_ref()
                ),
            ),
            None => d.error(
                mode.span().start,
                format!(
                    "server: socket_mode {:?} is not an octal file mode (e.g. \"0660\")",
                    mode.get_ref()
                ),
            ),
        }
    }
    if let Some(allow) = server.allow_world_writable_dir {
        out.allow_world_writable_dir = allow;
    }
    for (field, ids, target) in [
        ("allowed_uids", server.allowed_uids, &mut out.allowed_uids),
        ("allowed_gids", server.allowed_gids, &mut out.allowed_gids),
    ] {
        for (i, id) in ids.iter().flatten().enumerate() {
            let label = format!("{field}[{i}]");
            if let Some(v) = check_int(d, "server", &label, id, 0, u64::from(u32::MAX)) {
                target.push(v as u32);
            }
        }
    }
    if let Some(per_uid) = server.max_connections_per_uid {
        let field = "max_connections_per_uid";
        if let Some(v) = check_int(d, "server", field, &per_uid, 1, MAX_CONNECTIONS) {
            out.max_connections_per_uid = Some(v);
        }
    }
    if let Some(threads) = server.threads {
        if let Some(v) = check_int(d, "server", "threads", &threads, 1, MAX_THREADS) {
            out.threads = v as usize;
        }
    }
    if let Some(drain) = server.drain_timeout_ms {
        if let Some(v) = check_int(d, "server", "drain_timeout_ms", &drain, 0, i64::MAX as u64) {
            out.drain_timeout_ms = v;
        }
    }
    // A budget smaller than one whole frame would refuse every large frame.
    let one_frame = i64::from(MAX_FRAME_LEN) + LENGTH_PREFIX_LEN as i64;
    for (field, value, min, max, target) in [
        (
            "max_connections",
            server.max_connections,
            1,
            MAX_CONNECTIONS,
            &mut out.max_connections,
        ),
        (
            "max_buffered_bytes",
            server.max_buffered_bytes,
            one_frame,
            MAX_BUFFERED_BYTES,
            &mut out.max_buffered_bytes,
        ),
        (
            "hello_timeout_ms",
            server.hello_timeout_ms,
            1,
            MAX_WAIT_MS,
            &mut out.hello_timeout_ms,
        ),
        (
            "frame_timeout_ms",
            server.frame_timeout_ms,
            1,
            MAX_WAIT_MS,
            &mut out.frame_timeout_ms,
        ),
    ] {
        let Some(value) = value else { continue };
        if *value.get_ref() > 0 && *value.get_ref() < min {
            d.error(
                value.span().start,
                format!(
                    "server: {field} must be at least {min}, one frame of the largest size (got {})",
                    value.get_ref()
                ),
            );
        } else if let Some(v) = check_int(d, "server", field, &value, 1, max) {
            *target = v;
        }
    }
}

/// Problem with a socket path, if any.
pub(in crate::config) fn socket_problem(socket: &str) -> Option<String> {
    if socket.is_empty() {
        Some("socket must not be empty".to_string())
    } else if socket.len() > MAX_SOCKET_PATH_LEN {
        Some(format!(
            "socket path is {} bytes long, longer than the {MAX_SOCKET_PATH_LEN} a Unix socket address can hold",
            socket.len()
        ))
    } else {
        None
    }
}

/// `"0660"` (or `"660"`, `"0o660"`) → `0o660`; `None` when not octal. A
/// value too large for a `u32` comes back as `u32::MAX` (above any mode).
fn parse_socket_mode(mode: &str) -> Option<u32> {
    let digits = mode.strip_prefix("0o").unwrap_or(mode);
    if digits.is_empty() || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return None;
    }
    Some(u32::from_str_radix(digits, 8).unwrap_or(u32::MAX))
}

//! The systemd readiness protocol (`Type=notify`): one datagram to the
//! socket systemd names in `NOTIFY_SOCKET`, without a library. Outside
//! systemd the variable is unset and nothing is sent.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixDatagram;

/// The variable systemd sets for a `Type=notify` service.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Tells systemd the service is ready (`READY=1`); false when not run by
/// systemd.
pub fn notify_ready() -> io::Result<bool> {
    notify("READY=1\nSTATUS=serving\n")
}

/// Tells systemd the service is stopping (`STOPPING=1`).
pub fn notify_stopping() -> io::Result<bool> {
    notify("STOPPING=1\n")
}

/// Sends `state` (newline-separated `KEY=value` assignments) to systemd.
pub fn notify(state: &str) -> io::Result<bool> {
    let Some(path) = std::env::var_os(NOTIFY_SOCKET) else {
        return Ok(false);
    };
    let socket = UnixDatagram::unbound()?;
    let path = path.as_bytes();
    match path.strip_prefix(b"@") {
        // An abstract socket: its name follows the '@'.
        Some(name) => send_abstract(&socket, name, state)?,
        None => {
            socket.send_to(state.as_bytes(), std::ffi::OsStr::from_bytes(path))?;
        }
    }
    Ok(true)
}

#[cfg(target_os = "linux")]
fn send_abstract(socket: &UnixDatagram, name: &[u8], state: &str) -> io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
    socket.send_to_addr(state.as_bytes(), &address)?;
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn send_abstract(_: &UnixDatagram, _: &[u8], _: &str) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "abstract sockets exist only on Linux",
    ))
}

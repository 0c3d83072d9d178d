//! Binding the Unix socket: stale files from a dead daemon are replaced, a
//! live daemon is never displaced, and the socket is created with its mode.

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use rustix::fs::Mode;
use rustix::process::umask;
use tokio::net::UnixListener;

/// Why the socket could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("another process is already listening on {0}; stop it or choose another socket path")]
    InUse(PathBuf),
    #[error("{0} exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
    #[error("cannot remove the stale socket {path}: {source}")]
    RemoveStale { path: PathBuf, source: io::Error },
    #[error("cannot bind {path}: {source}")]
    Bind { path: PathBuf, source: io::Error },
    #[error(
        "cannot create the socket's directory {path}: {source}; create it for the daemon's \
         user (systemd: RuntimeDirectory=ratekeeper), or set server.socket or RATEKEEPER_SOCKET \
         to a path in a directory it can write"
    )]
    CreateDir { path: PathBuf, source: io::Error },
    #[error(
        "refusing to serve from {0}: every local user can write that directory, so another \
         user could bind the socket's path first and receive every worker's prompts; put the \
         socket in a directory only the daemon's user can write (the default is \
         $XDG_RUNTIME_DIR/ratekeeper.sock, else /run/ratekeeper/ratekeeper.sock), or set \
         server.allow_world_writable_dir = true"
    )]
    WorldWritableDir(PathBuf),
}

/// Binds `path` with file mode `mode`, replacing a socket file that nobody
/// listens on any more. Its directory is created (mode 0755) when missing,
/// and refused when every user may write it, unless `allow_world_writable_dir`.
pub fn bind(
    path: &Path,
    mode: u32,
    allow_world_writable_dir: bool,
) -> Result<UnixListener, BindError> {
    check_directory(path, allow_world_writable_dir)?;
    remove_stale_socket(path)?;
    // The socket is created with its final mode: a chmod after bind would
    // leave a moment in which the process umask's wider mode lets any local
    // user connect. The umask is process-wide, but nothing else creates
    // files while the daemon binds.
    let creation_mask = Mode::from_bits_truncate(!mode & 0o777);
    let previous = umask(creation_mask);
    let bound = UnixListener::bind(path);
    umask(previous);
    bound.map_err(|source| BindError::Bind {
        path: path.to_path_buf(),
        source,
    })
}

/// The socket's directory exists (created if it did not) and, unless
/// allowed, is not writable by every user: in such a directory (`/tmp`)
/// any local user can bind the path before the daemon does, and the
/// workers would send their prompts to that user's process.
fn check_directory(path: &Path, allow_world_writable_dir: bool) -> Result<(), BindError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    if !directory.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(directory)
            .map_err(|source| BindError::CreateDir {
                path: directory.to_path_buf(),
                source,
            })?;
        tracing::info!(directory = %directory.display(), "created the socket's directory");
    }
    let metadata = std::fs::metadata(directory).map_err(|source| BindError::Bind {
        path: path.to_path_buf(),
        source,
    })?;
    let world_writable = metadata.permissions().mode() & 0o002 != 0;
    if world_writable && !allow_world_writable_dir {
        return Err(BindError::WorldWritableDir(directory.to_path_buf()));
    }
    Ok(())
}

fn remove_stale_socket(path: &Path) -> Result<(), BindError> {
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(BindError::Bind {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    if !metadata.file_type().is_socket() {
        return Err(BindError::NotASocket(path.to_path_buf()));
    }
    // A connect that succeeds means a live daemon owns the file.
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(BindError::InUse(path.to_path_buf())),
        Err(_) => {
            tracing::info!(socket = %path.display(), "removing stale socket file left by a previous daemon");
            std::fs::remove_file(path).map_err(|source| BindError::RemoveStale {
                path: path.to_path_buf(),
                source,
            })
        }
    }
}

/// Removes the socket file at shutdown, if it is still ours to remove.
pub fn remove_socket(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => {
            tracing::warn!(socket = %path.display(), %error, "could not remove the socket file")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::os::unix::fs::PermissionsExt;

    #[tokio::test]
    async fn stale_socket_is_replaced_and_live_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rk.sock");
        let first = bind(&path, 0o600, false).unwrap();
        assert!(matches!(
            bind(&path, 0o600, false),
            Err(BindError::InUse(_))
        ));
        drop(first); // the file stays behind, as after a crash
        assert!(path.exists());
        let _second = bind(&path, 0o640, false).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
    }

    #[tokio::test]
    async fn a_regular_file_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("precious.txt");
        std::fs::write(&path, "data").unwrap();
        assert!(matches!(
            bind(&path, 0o600, false),
            Err(BindError::NotASocket(_))
        ));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "data");
    }

    /// Issue 27: the default socket was in /tmp, where any local user can
    /// bind the path first. A directory every user can write is refused
    /// unless the config allows it; a sticky bit does not make it safe.
    #[tokio::test]
    async fn a_directory_every_user_can_write_is_refused_unless_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let path = shared.join("rk.sock");
        let refused = bind(&path, 0o660, false);
        assert!(
            matches!(&refused, Err(BindError::WorldWritableDir(d)) if *d == shared),
            "{refused:?}"
        );
        assert!(!path.exists());
        let message = refused.unwrap_err().to_string();
        assert!(message.contains("allow_world_writable_dir"), "{message}");
        bind(&path, 0o660, true).expect("allowed by the config");
    }

    #[tokio::test]
    async fn a_missing_directory_is_created_for_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run").join("ratekeeper").join("rk.sock");
        let _listener = bind(&path, 0o660, false).unwrap();
        let created = path.parent().unwrap();
        let mode = std::fs::metadata(created).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            mode & !0o755,
            0,
            "created {mode:o}: no one else may write it"
        );
        assert!(path.exists());
    }
}

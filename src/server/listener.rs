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
}

/// Binds `path` with file mode `mode`, replacing a socket file that nobody
/// listens on any more.
pub fn bind(path: &Path, mode: u32) -> Result<UnixListener, BindError> {
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
        let first = bind(&path, 0o600).unwrap();
        assert!(matches!(bind(&path, 0o600), Err(BindError::InUse(_))));
        drop(first); // the file stays behind, as after a crash
        assert!(path.exists());
        let _second = bind(&path, 0o640).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
    }

    #[tokio::test]
    async fn a_regular_file_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("precious.txt");
        std::fs::write(&path, "data").unwrap();
        assert!(matches!(bind(&path, 0o600), Err(BindError::NotASocket(_))));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "data");
    }
}

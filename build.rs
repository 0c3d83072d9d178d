//! Puts the git commit into `ratekeeper --version`: `0.1.0 (1a2b3c4)`.
//!
//! The commit is `RATEKEEPER_GIT_COMMIT` when set (for builds from a
//! tarball or a container context without `.git`), else `git rev-parse
//! --short HEAD` when this crate is the root of a git checkout and git is
//! installed; otherwise the version is the package's alone. Nothing here
//! can fail the build.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RATEKEEPER_GIT_COMMIT");
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let given = std::env::var("RATEKEEPER_GIT_COMMIT")
        .ok()
        .map(|commit| commit.trim().to_string())
        .filter(|commit| !commit.is_empty());
    watch_git(&root);
    let commit = given.or_else(|| git_commit(&root));
    let package = env!("CARGO_PKG_VERSION");
    let version = match commit {
        Some(commit) => format!("{package} ({commit})"),
        None => package.to_string(),
    };
    println!("cargo:rustc-env=RATEKEEPER_VERSION={version}");
}

/// Asks cargo to run this again when HEAD moves in `root`'s own git
/// directory, read without git: a run whose `git` failed (not installed yet,
/// a lock held by a commit under way) must not leave the version without its
/// commit for every build after it.
fn watch_git(root: &Path) {
    let Some((git_dir, common_dir)) = git_dirs(root) else {
        return;
    };
    let head = std::fs::read_to_string(git_dir.join("HEAD")).unwrap_or_default();
    let head_ref = head
        .strip_prefix("ref:")
        .map(|name| common_dir.join(name.trim()));
    let watched = [git_dir.join("HEAD"), git_dir.join("logs/HEAD")]
        .into_iter()
        .chain([common_dir.join("packed-refs")])
        .chain(head_ref);
    for path in watched {
        // A path that does not exist would make cargo rerun this every build.
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}

/// The git directory of `root`'s checkout (its HEAD) and the one holding
/// its branches: both `.git` in a plain clone; in a `git worktree`, `.git`
/// is a file naming the worktree's own directory, whose `commondir` names
/// the repository's.
fn git_dirs(root: &Path) -> Option<(PathBuf, PathBuf)> {
    let dot_git = root.join(".git");
    if dot_git.is_dir() {
        return Some((dot_git.clone(), dot_git));
    }
    let pointer = std::fs::read_to_string(&dot_git).ok()?;
    let git_dir = root.join(pointer.strip_prefix("gitdir:")?.trim());
    let common_dir = std::fs::read_to_string(git_dir.join("commondir"))
        .map_or_else(|_| git_dir.clone(), |common| git_dir.join(common.trim()));
    Some((git_dir, common_dir))
}

/// HEAD's short hash, if `root` is the top of a git work tree.
fn git_commit(root: &Path) -> Option<String> {
    let toplevel = git(root, &["rev-parse", "--show-toplevel"])?;
    // Built inside some other repository (vendored, unpacked in a checkout):
    // its commit says nothing about this code.
    if Path::new(&toplevel).canonicalize().ok()? != root.canonicalize().ok()? {
        return None;
    }
    git(root, &["rev-parse", "--short", "HEAD"])
}

/// `git ARGS` run in `root`: its trimmed output, or None if it failed.
fn git(root: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .args(args)
        .current_dir(root)
        .output()
        .ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (output.status.success() && !text.is_empty()).then(|| text.to_string())
}

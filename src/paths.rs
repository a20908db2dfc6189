//! Where bgwork keeps its state (contract §8, §9), and Unix socket paths of any length.
//!
//! A Unix socket path is limited to 107 bytes. When a path is longer, [`SocketPath`]
//! opens its folder and names the socket through `/proc/self/fd/N/NAME`, which is short
//! whatever the folder's own path is.

use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The files of one home.
#[derive(Debug, Clone)]
pub struct Paths {
    pub home: PathBuf,
    pub socket: PathBuf,
    pub db: PathBuf,
    pub daemon_log: PathBuf,
    pub lock: PathBuf,
    pub jobs: PathBuf,
}

impl Paths {
    /// The home of this user: `$BGWORK_HOME`, else `$XDG_DATA_HOME/bgwork`, else
    /// `~/.local/share/bgwork`. The socket lives in the home when `BGWORK_HOME` is set,
    /// else in `$XDG_RUNTIME_DIR/bgwork` (or `/tmp/bgwork-$UID`).
    pub fn from_env() -> Paths {
        let env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        if let Some(home) = env("BGWORK_HOME") {
            let home = PathBuf::from(home);
            return Paths::new(home.clone(), home);
        }
        let data = env("XDG_DATA_HOME")
            .map(PathBuf::from)
            .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".local/share")))
            .unwrap_or_else(|| PathBuf::from("/tmp"))
            .join("bgwork");
        let run = env("XDG_RUNTIME_DIR")
            .map(|d| PathBuf::from(d).join("bgwork"))
            .unwrap_or_else(|| PathBuf::from(format!("/tmp/bgwork-{}", nix::unistd::geteuid())));
        Paths::new(data, run)
    }

    pub fn new(home: PathBuf, run_dir: PathBuf) -> Paths {
        Paths {
            socket: run_dir.join("bgwork.sock"),
            db: home.join("work.db"),
            daemon_log: home.join("daemon.log"),
            lock: run_dir.join("daemon.lock"),
            jobs: home.join("jobs"),
            home,
        }
    }

    /// Creates the home, the socket's folder and `jobs/`, each 0700.
    pub fn create_dirs(&self) -> std::io::Result<()> {
        let socket_dir = self.socket.parent().unwrap_or(Path::new("/"));
        for dir in [&self.home, &socket_dir.to_path_buf(), &self.jobs] {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
        for dir in [&self.home, &socket_dir.to_path_buf()] {
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
        }
        Ok(())
    }

    /// A job's folder, named by its record's row id (short, so socket paths stay short).
    /// Rows are never reused, so neither are folders.
    pub fn job_dir(&self, row: i64) -> PathBuf {
        self.jobs.join(row.to_string())
    }

    /// The job folders there are, by row number (names that are no number are not
    /// job folders).
    pub fn job_folders(&self) -> Vec<(i64, PathBuf)> {
        let Ok(entries) = fs::read_dir(&self.jobs) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| Some((e.file_name().to_str()?.parse::<i64>().ok()?, e.path())))
            .collect()
    }
}

/// A socket path short enough for `bind`/`connect`; keep it alive while it is used.
pub struct SocketPath {
    pub path: PathBuf,
    _dir: Option<OwnedFd>,
}

impl SocketPath {
    pub fn new(full: &Path) -> std::io::Result<SocketPath> {
        if full.as_os_str().len() < 100 {
            return Ok(SocketPath {
                path: full.to_path_buf(),
                _dir: None,
            });
        }
        let dir = full.parent().unwrap_or(Path::new("/"));
        let name = full.file_name().unwrap_or_default();
        let fd: OwnedFd = fs::File::open(dir)?.into();
        let path = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())).join(name);
        Ok(SocketPath {
            path,
            _dir: Some(fd),
        })
    }
}

/// A path a caller gave, made absolute against the caller's own working directory
/// (contract §3: the client resolves every path; the daemon accepts only absolute ones).
/// `what` names the argument in the error.
pub fn resolve(path: &str, what: &str) -> Result<String, crate::wire::WireError> {
    let bad = |why: String| crate::wire::WireError::bad_request(format!("{what} {path:?}: {why}"));
    if path.is_empty() {
        return Err(bad("an empty path names no folder: give a path".into()));
    }
    let absolute = std::path::absolute(path).map_err(|e| {
        bad(format!(
            "the current folder cannot be found ({e}): give an absolute path"
        ))
    })?;
    absolute
        .to_str()
        .map(str::to_string)
        .ok_or_else(|| bad("the path is not UTF-8: give a UTF-8 path".into()))
}

/// Refuses a path that is not absolute: the daemon never guesses whose folder a
/// relative path meant.
pub fn require_absolute(path: &str, what: &str) -> Result<(), crate::wire::WireError> {
    if Path::new(path).is_absolute() {
        return Ok(());
    }
    Err(crate::wire::WireError::bad_request(format!(
        "{what} {path:?} is relative: the daemon takes only absolute paths (the bgwork CLI \
         resolves them against your folder; a socket client must send an absolute path)"
    )))
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// RFC 3339 text of a time in milliseconds since the epoch.
pub fn rfc3339(ms: i64) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(time).to_string()
}

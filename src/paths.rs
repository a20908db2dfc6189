//! Where bgwork keeps its state (contract §8, §9), and Unix socket paths of any length.
//!
//! A Unix socket path is limited to 107 bytes. When a path is longer, [`SocketPath`]
//! opens its folder and names the socket through `/proc/self/fd/N/NAME`, which is short
//! whatever the folder's own path is.

use std::fs;
use std::io::{Error, ErrorKind};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
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
    /// `~/.local/share/bgwork` (with no `HOME` either: `/tmp/bgwork-$UID`). The socket
    /// lives in the home when `BGWORK_HOME` is set, else in `$XDG_RUNTIME_DIR/bgwork`
    /// (or `/tmp/bgwork-$UID`). Folders in a shared place such as `/tmp` may have been
    /// made by another user first: [`check_private_dir`] is asked before any is trusted.
    pub fn from_env() -> Paths {
        // XDG names only absolute folders; a relative one is ignored, as its spec says.
        let env = |name: &str| {
            std::env::var_os(name).filter(|v| !v.is_empty() && Path::new(v).is_absolute())
        };
        if let Some(home) = std::env::var_os("BGWORK_HOME").filter(|v| !v.is_empty()) {
            // A relative home is the caller's folder's, for the daemon it starts too
            // (which runs in `/`).
            let home = std::path::absolute(&home).unwrap_or_else(|_| PathBuf::from(home));
            return Paths::new(home.clone(), home);
        }
        let private_tmp = PathBuf::from(format!("/tmp/bgwork-{}", nix::unistd::geteuid()));
        let data = env("XDG_DATA_HOME")
            .map(|d| PathBuf::from(d).join("bgwork"))
            .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".local/share/bgwork")))
            .unwrap_or_else(|| private_tmp.clone());
        let run = env("XDG_RUNTIME_DIR")
            .map(|d| PathBuf::from(d).join("bgwork"))
            .unwrap_or(private_tmp);
        Paths::new(data, run)
    }

    pub fn new(home: PathBuf, run_dir: PathBuf) -> Paths {
        Paths {
            socket: run_dir.join("bgwork.sock"),
            db: home.join("work.db"),
            daemon_log: home.join("daemon.log"),
            // In the home, not the socket's folder: one home has one daemon, whatever
            // socket folder each daemon was started with.
            lock: home.join("daemon.lock"),
            jobs: home.join("jobs"),
            home,
        }
    }

    /// The folder the socket lives in.
    pub fn socket_dir(&self) -> &Path {
        self.socket.parent().unwrap_or(Path::new("/"))
    }

    /// Creates the home, the socket's folder and `jobs/`, each 0700. A folder that
    /// exists already must pass [`check_private_dir`]; it is then made 0700.
    pub fn create_dirs(&self) -> std::io::Result<()> {
        for dir in [&self.home, self.socket_dir(), &self.jobs] {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
        for dir in [&self.home, self.socket_dir()] {
            check_private_dir(dir)?;
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

/// Checks that `dir` is this user's own folder and that no other user may write in it
/// (nor replace it: a symbolic link must be this user's too). Another user could have
/// made a folder in a shared place such as `/tmp` first, to receive this user's
/// requests (environment values included) or to plant files there. Errors of kind
/// `NotFound` when it does not exist, `PermissionDenied` (with a message naming the
/// folder and what to do) when it must not be used.
pub fn check_private_dir(dir: &Path) -> std::io::Result<()> {
    let me = nix::unistd::geteuid().as_raw();
    let refuse = |why: String| {
        Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "refused to use {}: {why}; another user may have made it to receive your \
                 requests. Remove it, or set BGWORK_HOME (or XDG_RUNTIME_DIR) to a folder \
                 of your own",
                dir.display()
            ),
        )
    };
    let link = fs::symlink_metadata(dir)?;
    if link.file_type().is_symlink() && link.uid() != me {
        return Err(refuse(format!(
            "it is a symbolic link of uid {}, not yours (uid {me})",
            link.uid()
        )));
    }
    let meta = fs::metadata(dir)?;
    if !meta.is_dir() {
        return Err(refuse("it is not a folder".to_string()));
    }
    if meta.uid() != me {
        return Err(refuse(format!(
            "it belongs to uid {}, not to you (uid {me})",
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(refuse(format!(
            "other users may write in it (mode {:04o})",
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Opens a file that a job may have replaced (anything in a job's folder): no symbolic
/// link is followed, a FIFO does not block the open, and only a regular file is taken.
/// Errors of kind `InvalidInput` ("not a regular file") otherwise.
pub fn open_untrusted(path: &Path) -> std::io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let opened = fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
        .open(path);
    let not_regular = |what: &str| {
        Error::new(
            ErrorKind::InvalidInput,
            format!("{} is not a regular file ({what})", path.display()),
        )
    };
    let file = match opened {
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => {
            return Err(not_regular("it is a symbolic link"))
        }
        other => other?,
    };
    if !file.metadata()?.file_type().is_file() {
        return Err(not_regular("a FIFO, a device or a socket"));
    }
    Ok(file)
}

/// Writes a file whole under a temporary name beside it (`NAME.tmp`), then renames it
/// into place: a reader never sees half of it.
pub fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let temp = path.with_extension("tmp");
    std::fs::write(&temp, bytes).and_then(|()| std::fs::rename(&temp, path))
}

/// Reads at most `max` bytes of a file opened with [`open_untrusted`].
pub fn read_untrusted(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    open_untrusted(path)?.take(max).read_to_end(&mut bytes)?;
    Ok(bytes)
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

/// RFC 3339 text of a time in milliseconds since the epoch (one past the year 9999,
/// which RFC 3339 cannot write, as its last moment).
pub fn rfc3339(ms: i64) -> String {
    const LAST: i64 = 253_402_300_799_999;
    let ms = ms.clamp(0, LAST) as u64;
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(time).to_string()
}

/// A file's device and inode, without following a symlink (none when it cannot be
/// looked at): tells a file from another made at the same path since.
pub fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

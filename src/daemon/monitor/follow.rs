//! Where a line monitor's bytes come from: an item's output log ([`LogSource`]), or a
//! file followed by name as `tail -F` does ([`Follow`]).
//!
//! How `Follow` works: the followed file is held open and known by its device and inode.
//! At each look, in order: the open file is shorter than the offset, or the bytes just
//! before the offset are no longer those that were read (truncated, then written again)
//! → read again from the start; the open file has bytes past the offset → read them
//! (passing over holes); the open file is read to its end and the path now names
//! another file or none (rotated: moved away, perhaps made anew) → the old file's last
//! line is finished and the new file is read from its start, once it exists. A file
//! replaced while the daemon was down is read from its start.

use super::super::Daemon;
use crate::daemon::output::scan::read_data;
use crate::output;
use crate::wire::State;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// How many of the last bytes read are kept to notice a file rewritten in place.
const FINGERPRINT: usize = 16;

/// What a source has next for its scan.
pub(crate) enum Next {
    /// Bytes read into the buffer, found at this offset; an empty buffer means nothing
    /// but holes up to this offset.
    Data(u64),
    /// Nothing new yet.
    Idle,
    /// The bytes so far are all there will be: an item ended, or a followed file was
    /// rotated or removed (its last line is finished; the scan starts again at 0).
    Ended,
    /// The file was truncated or rewritten: read it again from the start.
    Restart,
}

/// An item's output log.
pub(crate) struct LogSource {
    pub row: i64,
    pub id: String,
    path: Option<PathBuf>,
    file: Option<File>,
    /// The log's dropped middle as last read.
    dropped: u64,
}

impl LogSource {
    pub fn new(row: i64, id: String) -> LogSource {
        LogSource {
            row,
            id,
            path: None,
            file: None,
            dropped: 0,
        }
    }

    /// The log's path, once looked up, and its dropped middle as last read.
    pub fn path(&self) -> Option<(&Path, u64)> {
        self.path.as_deref().map(|path| (path, self.dropped))
    }

    /// What the log holds past `offset`: a chunk of it, or whether the item ended.
    pub fn next(
        &mut self,
        daemon: &Daemon,
        offset: u64,
        buf: &mut Vec<u8>,
    ) -> Result<Next, String> {
        let head = daemon.config.log_head;
        let (dropped, ended) = {
            let inner = daemon.lock();
            match (inner.live.get(&self.row), &self.path) {
                // Attached and running: no need to ask the store.
                (Some(live), Some(_)) => (live.dropped, false),
                _ => {
                    let Ok(Some(record)) = inner.store.get(self.row) else {
                        return Err(format!("{} no longer exists", self.id));
                    };
                    self.path = Some(output::log_path(&record.job_dir));
                    (inner.dropped(&record), record.state == State::Ended)
                }
            }
        };
        self.dropped = dropped;
        let Some(path) = &self.path else {
            return Ok(Next::Idle);
        };
        // The state is read before the length, so an ended item's length is final.
        let len = output::log_len(path);
        if offset >= len {
            return Ok(if ended { Next::Ended } else { Next::Idle });
        }
        if self.file.is_none() {
            self.file = File::open(path).ok();
        }
        let Some(file) = &self.file else {
            return Ok(Next::Idle);
        };
        match read_data(file, offset, len, head..head + dropped, buf) {
            Ok(at) => Ok(Next::Data(at)),
            Err(e) => Err(format!("could not read the output of {}: {e}", self.id)),
        }
    }
}

/// A file followed by name.
pub(crate) struct Follow {
    path: PathBuf,
    open: Option<Opened>,
    /// The file the saved offset belongs to and its bytes just before that offset,
    /// until the first open after a (re)start.
    expected: Option<(u64, u64)>,
    expected_tail: Option<Vec<u8>>,
}

struct Opened {
    file: File,
    id: (u64, u64),
    /// The last bytes read, and the offset they end at.
    last: Vec<u8>,
    last_end: u64,
}

impl Follow {
    pub fn new(path: &Path, expected: Option<(u64, u64)>, tail: Option<Vec<u8>>) -> Follow {
        Follow {
            path: path.to_path_buf(),
            open: None,
            expected,
            expected_tail: tail,
        }
    }

    /// The bytes of the open file just before `at` (at most [`FINGERPRINT`]), saved with
    /// a watch's progress so that a resumed watch can tell a file rewritten meanwhile.
    pub fn tail_before(&self, at: u64) -> Option<Vec<u8>> {
        let open = self.open.as_ref()?;
        let len = (at as usize).min(FINGERPRINT);
        let mut bytes = vec![0u8; len];
        open.file.read_exact_at(&mut bytes, at - len as u64).ok()?;
        Some(bytes)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file being followed (device, inode), if one is open.
    pub fn file_id(&self) -> Option<(u64, u64)> {
        self.open.as_ref().map(|o| o.id).or(self.expected)
    }

    pub fn next(&mut self, offset: u64, buf: &mut Vec<u8>) -> Result<Next, String> {
        buf.clear();
        let Some(open) = &mut self.open else {
            return self.open_file(offset, buf);
        };
        let size = open
            .file
            .metadata()
            .map(|m| m.len())
            .map_err(|e| format!("could not read {}: {e}", self.path.display()))?;
        if offset > size || rewritten(open, offset) {
            open.last.clear();
            return Ok(Next::Restart);
        }
        if offset < size {
            let at = read_data(&open.file, offset, size, 0..0, buf)
                .map_err(|e| format!("could not read {}: {e}", self.path.display()))?;
            let keep = buf.len().min(FINGERPRINT);
            if keep > 0 {
                open.last.clear();
                open.last.extend_from_slice(&buf[buf.len() - keep..]);
                open.last_end = at + buf.len() as u64;
            }
            return Ok(Next::Data(at));
        }
        // Read to its end: is it still the file at the path?
        let current = std::fs::metadata(&self.path)
            .ok()
            .map(|m| (m.dev(), m.ino()));
        if current == Some(open.id) {
            return Ok(Next::Idle);
        }
        self.open = None;
        Ok(Next::Ended)
    }

    fn open_file(&mut self, offset: u64, buf: &mut Vec<u8>) -> Result<Next, String> {
        let meta = match std::fs::metadata(&self.path) {
            Ok(meta) => meta,
            Err(_) => return Ok(Next::Idle),
        };
        if !meta.is_file() {
            return Err(format!(
                "{} is not a regular file: a watch follows regular files",
                self.path.display()
            ));
        }
        // Non-blocking, so a FIFO put there since the check cannot hang the open.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags((nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_NOCTTY).bits())
            .open(&self.path);
        let Ok(file) = file else {
            return Ok(Next::Idle);
        };
        let Ok(meta) = file.metadata() else {
            return Ok(Next::Idle);
        };
        if !meta.is_file() {
            return Ok(Next::Idle);
        }
        let id = (meta.dev(), meta.ino());
        self.open = Some(Opened {
            file,
            id,
            last: Vec::new(),
            last_end: 0,
        });
        let expected_tail = self.expected_tail.take();
        match self.expected.take() {
            // Replaced while nobody followed it: its bytes are all new.
            Some(expected) if expected != id && offset > 0 => Ok(Next::Restart),
            // The same file, but truncated and written again meanwhile.
            Some(_) if expected_tail.is_some_and(|tail| self.changed_before(offset, &tail)) => {
                Ok(Next::Restart)
            }
            _ => self.next(offset, buf),
        }
    }

    /// Whether the open file no longer holds `tail` just before `offset`.
    fn changed_before(&self, offset: u64, tail: &[u8]) -> bool {
        match self.tail_before(offset) {
            Some(now) if now.len() == tail.len() => now != tail && now.iter().any(|&b| b != 0),
            _ => true,
        }
    }
}

/// Whether the bytes just before `offset` changed since they were read (a file
/// truncated and written again). Bytes that became a hole do not count: a log that
/// releases old bytes (as bgwork's own do) was not rewritten.
fn rewritten(open: &Opened, offset: u64) -> bool {
    if open.last.is_empty() || open.last_end != offset {
        return false;
    }
    let mut now = vec![0u8; open.last.len()];
    let from = offset - open.last.len() as u64;
    match open.file.read_exact_at(&mut now, from) {
        Ok(()) => now != open.last && now.iter().any(|&b| b != 0),
        Err(_) => true,
    }
}

//! `OutputLog`: the job's output file, with the head-and-newest cap of contract §6.
//!
//! How it works: a byte's offset in the file is its offset in the job's output, for
//! ever, so cursors and `--from` never shift. Once more than `cap` bytes were written,
//! the bytes between the first `head` bytes and the newest `cap - head` bytes are
//! released with `fallocate(PUNCH_HOLE)`: the file stays the same length but holds
//! at most `cap` bytes on disk. `dropped()` says how many bytes were released; they
//! lie in `[head, head + dropped)`. Bytes that cannot be written (a full disk) are
//! counted in `unwritten`, with the log offset where the first of them was lost, and
//! the job goes on: the log holds what could be written, with no gap of zeros.

use nix::fcntl::{splice, SpliceFFlags};
use std::fs::File;
use std::os::unix::fs::FileExt;

pub struct OutputLog {
    file: File,
    cap: u64,
    head: u64,
    written: u64,
    punched_to: u64,
    unwritten: u64,
    /// The log offset at which the first unwritten byte was lost.
    unwritten_at: Option<u64>,
}

impl OutputLog {
    pub fn new(file: File, cap: u64, head: u64) -> OutputLog {
        let head = head.min(cap);
        OutputLog {
            file,
            cap,
            head,
            written: 0,
            punched_to: head,
            unwritten: 0,
            unwritten_at: None,
        }
    }

    /// Appends one chunk of output; what cannot be written is counted, not kept.
    pub fn append(&mut self, bytes: &[u8]) {
        let mut done = 0;
        while done < bytes.len() {
            match self.file.write_at(&bytes[done..], self.written) {
                Ok(0) => break,
                Ok(n) => {
                    done += n;
                    self.written += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    if self.unwritten == 0 {
                        crate::note!("bgwork supervise: output log write failed: {e}");
                    }
                    break;
                }
            }
        }
        let lost = (bytes.len() - done) as u64;
        if lost > 0 {
            self.unwritten += lost;
            self.unwritten_at.get_or_insert(self.written);
        }
        self.release_middle();
    }

    /// Moves up to `max` bytes from a pipe into the log with `splice` (no copy through
    /// this process). `Ok(0)` at end of file; `WouldBlock` when the pipe is empty; any
    /// other error means the caller should copy instead (a terminal, a full disk).
    pub fn splice_from(&mut self, pipe: &File, max: usize) -> std::io::Result<usize> {
        let mut offset = self.written as i64;
        let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
        let n = splice(pipe, None, &self.file, Some(&mut offset), max, flags)?;
        self.written += n as u64;
        self.release_middle();
        Ok(n)
    }

    pub fn len(&self) -> u64 {
        self.written
    }

    /// Whether the log at `path` (this log's file, whose own descriptor is write-only)
    /// is empty or its last byte ends a line, so that a line bgwork appends is a line
    /// of its own. Opened as outside input (the job may have replaced the name).
    pub fn at_line_start(&self, path: &std::path::Path) -> bool {
        if self.written == 0 {
            return true;
        }
        let mut last = [0u8; 1];
        crate::paths::open_untrusted(path)
            .and_then(|file| file.read_exact_at(&mut last, self.written - 1))
            .is_ok_and(|()| last[0] == b'\n')
    }

    pub fn dropped(&self) -> u64 {
        self.punched_to - self.head
    }

    pub fn unwritten(&self) -> u64 {
        self.unwritten
    }

    /// The log offset where output was first lost (0 when none was).
    pub fn unwritten_at(&self) -> u64 {
        self.unwritten_at.unwrap_or(0)
    }

    fn release_middle(&mut self) {
        let released = crate::output::release_middle(
            &self.file,
            self.written,
            self.cap,
            self.head,
            self.punched_to,
        );
        match released {
            Ok(to) => self.punched_to = to,
            Err(e) => crate::note!("bgwork supervise: could not release old output: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn keeps_head_and_newest_within_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let mut log = OutputLog::new(file, 4 << 20, 1 << 20);
        let chunk = vec![b'x'; 64 << 10];
        for _ in 0..(32 * 16) {
            log.append(&chunk);
        }
        assert_eq!(log.len(), 32 << 20);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), 32 << 20, "offsets never shift");
        assert!(
            meta.blocks() * 512 <= 5 << 20,
            "disk use stays near the cap"
        );
        assert!(log.dropped() >= 27 << 20);
        let mut byte = [0u8; 1];
        log.file.read_exact_at(&mut byte, 0).unwrap();
        assert_eq!(byte[0], b'x', "the head is kept");
        log.file.read_exact_at(&mut byte, (32 << 20) - 1).unwrap();
        assert_eq!(byte[0], b'x', "the newest bytes are kept");
    }
}

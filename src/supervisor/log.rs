//! `OutputLog`: the job's output file, with the head-and-newest cap of SPEC §6.
//!
//! How it works: a byte's offset in the file is its offset in the job's output, for
//! ever, so cursors and `--from` never shift. Once more than `cap` bytes were written,
//! the bytes between the first `head` bytes and the newest `cap - head` bytes are
//! released with `fallocate(PUNCH_HOLE)`: the file stays the same length but holds
//! at most `cap` bytes on disk. `dropped()` says how many bytes were released; they
//! lie in `[head, head + dropped)`. A write that fails (a full disk) is counted in
//! `unwritten` and the job goes on: its later bytes still land at their own offsets.

use nix::fcntl::{fallocate, splice, FallocateFlags, SpliceFFlags};
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Holes are punched in steps of this many bytes, so punching is rare.
const PUNCH_STEP: u64 = 1 << 20;

pub struct OutputLog {
    file: File,
    cap: u64,
    head: u64,
    written: u64,
    punched_to: u64,
    unwritten: u64,
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
        }
    }

    /// Appends one chunk of output.
    pub fn append(&mut self, bytes: &[u8]) {
        if let Err(e) = self.file.write_all_at(bytes, self.written) {
            self.unwritten += bytes.len() as u64;
            if self.unwritten == bytes.len() as u64 {
                crate::note!("bgwork supervise: output log write failed: {e}");
            }
        }
        self.written += bytes.len() as u64;
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

    pub fn dropped(&self) -> u64 {
        self.punched_to - self.head
    }

    pub fn unwritten(&self) -> u64 {
        self.unwritten
    }

    fn release_middle(&mut self) {
        if self.written <= self.cap {
            return;
        }
        let keep_from = self.written - (self.cap - self.head);
        let target = keep_from - keep_from % PUNCH_STEP;
        if target < self.punched_to + PUNCH_STEP {
            return;
        }
        let flags = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
        let length = (target - self.punched_to) as i64;
        match fallocate(&self.file, flags, self.punched_to as i64, length) {
            Ok(()) => self.punched_to = target,
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

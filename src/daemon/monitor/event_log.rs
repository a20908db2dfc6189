//! `EventLog`: a watch's log of matching lines (`read mon-N`), capped like a job's
//! output log (contract §6).
//!
//! How it works: the rule of the supervisor's output log. Offsets never shift; once more
//! than `cap` bytes were written, the bytes between the first `head` and the newest
//! `cap - head` are released with `fallocate(PUNCH_HOLE)` in 1 MiB steps, so the disk
//! holds about the cap and `read` skips `[head, head + dropped)`. The log's length is
//! saved with the watch's progress in one transaction; on opening, a log longer than
//! that holds lines written but never recorded (the daemon died between the two), and
//! it is cut back, so those lines are recorded once when they are matched again.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

pub(crate) struct EventLog {
    file: File,
    cap: u64,
    head: u64,
    len: u64,
    /// The end of the released middle (it starts at `head`).
    punched_to: u64,
}

impl EventLog {
    /// Opens (or makes) the log at `path`, cut back to `recorded` bytes when it is longer;
    /// `dropped` bytes after the head were already released.
    pub fn open(
        path: &Path,
        cap: u64,
        head: u64,
        recorded: Option<u64>,
        dropped: u64,
    ) -> std::io::Result<EventLog> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
            .open(path)?;
        let mut len = file.metadata()?.len();
        if let Some(recorded) = recorded.filter(|&r| r < len) {
            file.set_len(recorded)?;
            len = recorded;
        }
        let head = head.min(cap);
        Ok(EventLog {
            file,
            cap,
            head,
            len,
            punched_to: head + dropped,
        })
    }

    pub fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.file.write_all_at(bytes, self.len)?;
        self.len += bytes.len() as u64;
        self.release_middle();
        Ok(())
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn dropped(&self) -> u64 {
        self.punched_to.saturating_sub(self.head)
    }

    fn release_middle(&mut self) {
        let released = crate::output::release_middle(
            &self.file,
            self.len,
            self.cap,
            self.head,
            self.punched_to,
        );
        match released {
            Ok(to) => self.punched_to = to,
            Err(e) => crate::note!("bgwork daemon: could not release old watch events: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_log_stays_near_its_cap_and_is_cut_back_to_what_was_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("output.log");
        let mut log = EventLog::open(&path, 2 << 20, 512 << 10, None, 0).unwrap();
        let line = vec![b'x'; 4096];
        for _ in 0..(8 << 20) / 4096 {
            log.append(&line).unwrap();
        }
        assert_eq!(log.len(), 8 << 20);
        let blocks = std::fs::metadata(&path).unwrap().blocks() * 512;
        assert!(blocks <= 4 << 20, "{blocks} bytes on disk");
        let (len, dropped) = (log.len(), log.dropped());
        assert!(dropped >= 4 << 20, "{dropped}");
        log.append(b"never recorded\n").unwrap();
        drop(log);
        let log = EventLog::open(&path, 2 << 20, 512 << 10, Some(len), dropped).unwrap();
        assert_eq!(log.len(), len);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
    }
}

//! The job's status file (`status.json`): its end, written once and whole, read by
//! the daemon, the executors and a restarted daemon.

use super::STATUS_ROOM;
use crate::job_dir::JobDir;
use crate::paths::now_ms;
use crate::wire::control::{ExitStatus, PROTOCOL};
use std::io::ErrorKind;
use std::path::Path;

/// Writes the status file atomically (the room made by [`reserve_status`], then
/// rename): a reader finds the whole status or none, whenever any process dies. It is
/// not fsynced: like the store (`synchronous=NORMAL`), it survives process crashes,
/// not a power cut.
pub fn write_status(job_dir: &Path, status: &ExitStatus) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let temp = JobDir(job_dir).temp(JobDir::STATUS);
    let bytes = status.encode();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&temp)?;
    // Written over the room made earlier (no new block is needed), the rest blanked:
    // JSON allows the trailing spaces.
    let room = file.metadata()?.len() as usize;
    let mut padded = bytes;
    padded.resize(padded.len().max(room), b' ');
    file.write_all_at(&padded, 0)?;
    std::fs::rename(&temp, JobDir(job_dir).status())
}

/// Makes room for the status file while the disk has some.
pub(super) fn reserve_status(job_dir: &Path) {
    let _ = std::fs::write(
        JobDir(job_dir).temp(JobDir::STATUS),
        vec![b' '; STATUS_ROOM],
    );
}

/// Writes the status of a job of `owner` that could not start, and why.
pub fn write_not_started(job_dir: &Path, owner: &str, why: &str) -> std::io::Result<()> {
    let status = ExitStatus {
        protocol: PROTOCOL,
        spawn_error: Some(why.to_string()),
        ended_at_ms: now_ms(),
        owner: owner.to_string(),
        ..ExitStatus::default()
    };
    write_status(job_dir, &status)
}

/// Reads a job's status file, if it has one. A status that names another owner than
/// `owner` (a folder left by an earlier job) is no status of this job.
pub fn read_status(job_dir: &Path, owner: &str) -> Option<Result<ExitStatus, String>> {
    // The job may have replaced it (a FIFO would block the reader, a link leak a file).
    let status = match crate::paths::read_untrusted(&JobDir(job_dir).status(), 1 << 20) {
        Ok(bytes) => ExitStatus::decode(&bytes),
        Err(e) if e.kind() == ErrorKind::NotFound => return None,
        Err(e) => return Some(Err(format!("status file unreadable: {e}"))),
    };
    if let Ok(found) = &status {
        if !owner.is_empty() && !found.owner.is_empty() && found.owner != owner {
            crate::note!(
                "bgwork: {} holds the status of {}, not of {owner}: ignored",
                job_dir.display(),
                found.owner
            );
            return None;
        }
    }
    Some(status)
}

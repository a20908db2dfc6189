//! `FolderWake`: hears at once of a file renamed (or made) into a job's folder, so
//! that the daemon's tracker and the supervisor on the node answer each other's files
//! without waiting for their next look.
//!
//! How it works: one inotify watch on the job's folder, for names made or moved in
//! (every file of the folder the two sides exchange is written whole and renamed into
//! place: the hand-over's key and answer, the tree record, the status, the figures).
//! The log's growth is not watched (it would wake the tracker at every write). inotify
//! sees only changes made on this machine: on a filesystem shared with other hosts
//! (NFS) a file the node writes wakes nothing here, so both sides still look at the
//! folder on their clock (every 100 ms). Nothing depends on the wake but speed.

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::Path;
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_ONLYDIR
}

fn watch(folder: &Path) -> Option<Inotify> {
    let flags = InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC;
    let inotify = Inotify::init(flags).ok()?;
    inotify.add_watch(folder, mask()).ok()?;
    Some(inotify)
}

/// The daemon's side: an async wake.
pub(crate) struct FolderWake {
    inotify: AsyncFd<Instance>,
}

struct Instance(Inotify);

impl AsRawFd for Instance {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

impl FolderWake {
    /// Watches `folder`; none where inotify is not available (then the clock alone
    /// says when to look).
    pub(crate) fn new(folder: &Path) -> Option<FolderWake> {
        let instance = Instance(watch(folder)?);
        // SAFETY: `Instance` owns the inotify descriptor for as long as the `AsyncFd`
        // holds it, and `as_raw_fd` always returns that same descriptor.
        let inotify =
            unsafe { AsyncFd::register_with_interest(instance, Interest::READABLE) }.ok()?;
        Some(FolderWake { inotify })
    }

    /// Waits until a name was made or moved into the folder (every event waiting is
    /// taken at once). Pending for ever once the watch is gone.
    pub(crate) async fn next(&mut self) {
        loop {
            let Ok(mut ready) = self.inotify.readable().await else {
                return std::future::pending().await;
            };
            match ready.try_io(|fd| fd.get_ref().0.read_events().map_err(std::io::Error::from)) {
                Ok(Ok(events)) if !events.is_empty() => return,
                Ok(Ok(_)) | Err(_) => continue,
                Ok(Err(_)) => return std::future::pending().await,
            }
        }
    }
}

/// Waits in `wake` (blocking) until a name was made or moved into its folder or
/// `patience` passed; without a watch, just the patience.
pub(crate) fn wait_blocking(wake: Option<&Inotify>, patience: Duration) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let Some(inotify) = wake else {
        std::thread::sleep(patience);
        return;
    };
    let millis = u16::try_from(patience.as_millis()).unwrap_or(u16::MAX);
    let mut fds = [PollFd::new(inotify.as_fd(), PollFlags::POLLIN)];
    if matches!(poll(&mut fds, PollTimeout::from(millis)), Ok(n) if n > 0) {
        // Drained: the caller looks at the folder now.
        let _ = inotify.read_events();
    }
}

/// The supervisor's side: a blocking watch of `folder`, made before the file it waits
/// for can be written.
pub(crate) fn watch_blocking(folder: &Path) -> Option<Inotify> {
    watch(folder)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file renamed into the folder wakes the tracker at once; the log's writes do not.
    #[test]
    fn issue27_6_a_file_renamed_into_the_folder_wakes_the_tracker() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut wake = FolderWake::new(dir.path()).expect("inotify works here");
            std::fs::write(dir.path().join("output.log"), b"x").unwrap();
            // Made: a wake (the log is made once, at the start).
            tokio::time::timeout(Duration::from_secs(5), wake.next())
                .await
                .expect("woken by a new file");
            let mut log = std::fs::OpenOptions::new()
                .append(true)
                .open(dir.path().join("output.log"))
                .unwrap();
            std::io::Write::write_all(&mut log, b"more").unwrap();
            let quiet = tokio::time::timeout(Duration::from_millis(100), wake.next()).await;
            assert!(quiet.is_err(), "a write to the log woke the tracker");
            crate::paths::write_whole(&dir.path().join("status"), b"{}").unwrap();
            tokio::time::timeout(Duration::from_secs(5), wake.next())
                .await
                .expect("woken by a file renamed into place");
        });
    }
}

//! `FsWake`: wakes a file monitor when something happens at its path, with inotify on
//! the folder that holds it, so a file that exists for a moment is still seen and a
//! followed file is read as soon as it grows.
//!
//! How it works: one inotify instance per file monitor watches the path's folder (or,
//! while that folder does not exist, the nearest folder on the way to it, moving down as
//! folders appear). Events about other names are drained and ignored. Where inotify is
//! not available (no instance left, a folder that cannot be watched), the monitor still
//! polls with a back-off, so nothing depends on it but speed.

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// What happened at the path since the last wake.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FsEvents {
    /// Its name was created or moved in: it existed, if only for a moment.
    pub created: bool,
}

pub(crate) struct FsWake {
    inotify: AsyncFd<Instance>,
    target: PathBuf,
    /// The folder watched and its descriptor.
    watched: Option<(WatchDescriptor, PathBuf)>,
}

struct Instance(Inotify);

impl AsRawFd for Instance {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_ONLYDIR
}

impl FsWake {
    /// Watches the way to `target`; none where inotify is not available.
    pub fn new(target: &Path) -> Option<FsWake> {
        let flags = InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC;
        let instance = Instance(Inotify::init(flags).ok()?);
        // SAFETY: `Instance` owns the inotify descriptor for as long as the `AsyncFd`
        // holds it, and `as_raw_fd` always returns that same descriptor.
        let inotify =
            unsafe { AsyncFd::register_with_interest(instance, Interest::READABLE) }.ok()?;
        let mut wake = FsWake {
            inotify,
            target: target.to_path_buf(),
            watched: None,
        };
        wake.arm();
        wake.watched.as_ref()?;
        Some(wake)
    }

    /// Watches the nearest existing folder on the way to the target.
    fn arm(&mut self) {
        let want = nearest_folder(&self.target);
        if self.watched.as_ref().map(|(_, dir)| dir) == want.as_ref() {
            return;
        }
        let instance = &self.inotify.get_ref().0;
        if let Some((wd, _)) = self.watched.take() {
            let _ = instance.rm_watch(wd);
        }
        if let Some(dir) = want {
            if let Ok(wd) = instance.add_watch(&dir, mask()) {
                self.watched = Some((wd, dir));
            }
        }
    }

    /// Waits for an event about the target, or about a folder on the way to it.
    pub async fn next(&mut self) -> FsEvents {
        let name = self.target.file_name().map(|n| n.to_os_string());
        let parent = self.target.parent().map(Path::to_path_buf);
        loop {
            let Ok(mut ready) = self.inotify.readable().await else {
                return std::future::pending().await;
            };
            let events = match ready
                .try_io(|fd| fd.get_ref().0.read_events().map_err(std::io::Error::from))
            {
                Ok(Ok(events)) => events,
                Ok(Err(_)) => return std::future::pending().await,
                Err(_would_block) => continue,
            };
            let mut relevant = false;
            let mut created = false;
            for event in events {
                let moved_in = event
                    .mask
                    .intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO);
                if event.mask.intersects(
                    AddWatchFlags::IN_Q_OVERFLOW
                        | AddWatchFlags::IN_IGNORED
                        | AddWatchFlags::IN_DELETE_SELF
                        | AddWatchFlags::IN_MOVE_SELF,
                ) {
                    relevant = true;
                    continue;
                }
                let Some((wd, dir)) = &self.watched else {
                    continue;
                };
                if event.wd != *wd {
                    continue;
                }
                if Some(dir) == parent.as_ref() {
                    if event.name.is_some() && event.name == name {
                        relevant = true;
                        created |= moved_in;
                    }
                } else if moved_in {
                    // A folder on the way may exist now.
                    relevant = true;
                }
            }
            self.arm();
            if relevant {
                return FsEvents { created };
            }
        }
    }
}

/// The target's folder, or its nearest existing ancestor.
fn nearest_folder(target: &Path) -> Option<PathBuf> {
    let mut folder = target.parent()?;
    while !folder.is_dir() {
        folder = folder.parent()?;
    }
    Some(folder.to_path_buf())
}

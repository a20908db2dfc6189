//! Text handed to a reader, and knowing when the reader took it: a notice counts as
//! shown once whoever reads stdout (or stderr, for the rewake hook) has read it from
//! the pipe or socket, not when it was written (`notices --follow | head -n1` takes
//! exactly the one notice `head` read).

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

/// The longest pause between two looks at whether the reader took the text.
const DRAIN_POLL_MAX: Duration = Duration::from_millis(50);

nix::ioctl_read_bad!(unread_in_pipe, nix::libc::FIONREAD, nix::libc::c_int);
nix::ioctl_read_bad!(unsent_on_socket, nix::libc::TIOCOUTQ, nix::libc::c_int);

/// What stdout is, for knowing when a reader has taken what was written.
#[derive(Clone, Copy)]
pub(crate) enum OutKind {
    Pipe,
    Socket,
    /// A terminal or a file: written is shown.
    Other,
}

impl OutKind {
    pub(crate) fn of(fd: BorrowedFd<'_>) -> OutKind {
        use nix::sys::stat::{fstat, SFlag};
        match fstat(fd) {
            Ok(stat) => match SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT {
                SFlag::S_IFIFO => OutKind::Pipe,
                SFlag::S_IFSOCK => OutKind::Socket,
                _ => OutKind::Other,
            },
            Err(_) => OutKind::Other,
        }
    }

    /// Bytes written to stdout that its reader has not taken yet.
    fn unread(self, fd: BorrowedFd<'_>) -> Option<i32> {
        use std::os::fd::AsRawFd;
        let mut n: nix::libc::c_int = 0;
        // SAFETY: both ioctls write one c_int through the pointer, which is valid.
        let asked = unsafe {
            match self {
                OutKind::Pipe => unread_in_pipe(fd.as_raw_fd(), &mut n),
                OutKind::Socket => unsent_on_socket(fd.as_raw_fd(), &mut n),
                OutKind::Other => return Some(0),
            }
        };
        asked.ok().map(|_| n)
    }
}

/// Writes one notice to `out` (stdout here, stderr for the rewake hook) and waits until
/// its reader has taken it; an error means the reader went away first.
pub(crate) fn show<W: Write + AsFd>(out: &mut W, kind: OutKind, text: &str) -> std::io::Result<()> {
    out.write_all(text.as_bytes())?;
    out.flush()?;
    let fd = out.as_fd();
    let mut pause = Duration::from_millis(1);
    loop {
        match kind.unread(fd) {
            Some(0) | None => return Ok(()),
            Some(_) => {}
        }
        let mut fds = [PollFd::new(fd, PollFlags::empty())];
        let timeout = PollTimeout::try_from(pause).unwrap_or(PollTimeout::NONE);
        if let Ok(n) = poll(&mut fds, timeout) {
            let gone = PollFlags::POLLERR | PollFlags::POLLHUP;
            if n > 0 && fds[0].revents().is_some_and(|r| r.intersects(gone)) {
                // The reader went away: after taking the notice, or before.
                return match kind.unread(fd) {
                    Some(0) => Ok(()),
                    _ => Err(std::io::ErrorKind::BrokenPipe.into()),
                };
            }
        }
        pause = (pause * 2).min(DRAIN_POLL_MAX);
    }
}

//! `notices --follow`: prints each notice as it arrives and acknowledges it (`ack`)
//! once it is out, so the daemon marks it delivered only then.
//!
//! "Out" means written to stdout and, when stdout is a pipe or a socket, read from it
//! by whoever reads it: `notices --follow | head -n1` consumes exactly the one notice
//! `head` read, and the next ones stay pending. A follower whose reader goes away ends
//! quietly (exit 0); one whose daemon goes away ends with an error (exit 1); either way
//! the notices it did not acknowledge are delivered again to the next puller.

use super::notices::notice_text;
use crate::client::Client;
use crate::delivery::{show, Delivery, OutKind};
use crate::wire::{Envelope, ErrorCode, Request, WireError};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::os::fd::{AsFd, BorrowedFd};
use std::process::ExitCode;

pub fn follow(client: &mut Client, envelope: &Envelope, json: bool) -> Result<ExitCode, WireError> {
    let peek = matches!(envelope.request, Request::Notices { peek: true, .. });
    let mut delivery = Delivery::over(client, &envelope.session);
    if peek {
        // Shown, not claimed: nothing to acknowledge.
        delivery.client().send(envelope)?;
    } else {
        delivery.follow()?;
    }
    let stdout = std::io::stdout();
    let kind = OutKind::of(stdout.as_fd());
    loop {
        let waiting = !delivery.client().has_buffered();
        if waiting && wait_for_line(delivery.client(), stdout.as_fd())? == Wait::ReaderGone {
            return Ok(ExitCode::SUCCESS);
        }
        let notice = match delivery.next_in_stream() {
            Ok(Some(notice)) => notice,
            Ok(None) => return Err(daemon_gone()),
            Err(e) if e.code == ErrorCode::Unavailable => return Err(daemon_gone()),
            Err(e) => return Err(e),
        };
        let mut text = if json {
            serde_json::to_string(&notice).unwrap_or_default()
        } else {
            notice_text(&notice)
        };
        if !text.ends_with('\n') {
            text.push('\n');
        }
        if show(&mut stdout.lock(), kind, &text).is_err() {
            // The reader went away: this notice was not shown, so it stays pending.
            return Ok(ExitCode::SUCCESS);
        }
        if !peek {
            delivery
                .acknowledge_in_stream(&notice.id)
                .map_err(|_| daemon_gone())?;
        }
    }
}

fn daemon_gone() -> WireError {
    WireError::new(
        ErrorCode::Unavailable,
        "the daemon went away (it stopped or was killed) while following notices: those not \
         shown stay pending; run `bgwork notices --follow` again to go on",
    )
}

#[derive(PartialEq, Eq)]
enum Wait {
    Line,
    ReaderGone,
}

/// Blocks until the daemon sends something or stdout's reader goes away. After each
/// quiet spell the daemon is asked, on a connection of its own, whether it still
/// answers: a stopped or hung daemon ends the follower with an error.
fn wait_for_line(client: &Client, stdout: BorrowedFd<'_>) -> Result<Wait, WireError> {
    let quiet = PollTimeout::try_from(client.quiet_period().as_millis().min(60_000) as i32)
        .unwrap_or(PollTimeout::MAX);
    loop {
        let mut fds = [
            PollFd::new(client.as_fd(), PollFlags::POLLIN),
            PollFd::new(stdout, PollFlags::empty()),
        ];
        match poll(&mut fds, quiet) {
            Ok(0) => {
                client.check_alive()?;
                continue;
            }
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return Ok(Wait::Line),
        }
        let gone = PollFlags::POLLERR | PollFlags::POLLHUP;
        if fds[1].revents().is_some_and(|r| r.intersects(gone)) {
            return Ok(Wait::ReaderGone);
        }
        if fds[0].revents().is_some_and(|r| !r.is_empty()) {
            return Ok(Wait::Line);
        }
    }
}

//! Notices as their clients receive them: claimed, shown, then acknowledged.
//!
//! One vocabulary on both sides of the socket (the daemon's side is
//! `daemon/delivery.rs`, the outbox `store/notices.rs`):
//! - **claim**: pending notices are taken for one daemon connection, and no other
//!   connection gets them while it holds them;
//! - **show**: the client puts them where its reader is (stdout, stderr, a tool result,
//!   a hook's output);
//! - **acknowledge** (`ack` on the wire): the client's word that they were shown; the
//!   daemon then marks them **delivered**, and they are never sent again;
//! - **release**: a claim that was not acknowledged when its connection closed is
//!   pending again, with the same id, for the next claim.
//!
//! Every client (`bgwork notices`, `notices --follow`, the MCP server, the hooks and
//! the rewake hook) does these three steps through [`Delivery`]. They differ only in
//! when they know a notice was shown: the CLI once stdout took it, a follower and the
//! rewake hook once the reader of their pipe read it ([`show`]), a hook once it printed
//! its answer, the MCP server when its client's next message arrives.

use crate::client::Client;
use crate::paths::Paths;
use crate::wire::{self, Ack, Envelope, Notice, NoticesReply, ProcessKey, Request, WireError};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::borrow::BorrowMut;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

/// The default bound on notices per turn boundary.
const DEFAULT_MAX_NOTICES_PER_TURN: u32 = 10;
/// The longest pause between two looks at whether a reader took what was shown.
const DRAIN_POLL_MAX: Duration = Duration::from_millis(50);

/// A daemon connection that claims a session's notices and acknowledges them once
/// shown. `C` is the connection, owned or borrowed.
pub struct Delivery<C: BorrowMut<Client> = Client> {
    client: C,
    session: String,
}

/// Notices claimed for one connection: shown, they must be acknowledged
/// ([`Delivery::acknowledge`]); else they are released when the connection closes.
#[derive(Debug, Default)]
pub struct Claimed {
    pub notices: Vec<Notice>,
    /// Pending beyond the bound of the claim: left for a later one.
    pub more: u64,
}

impl Claimed {
    pub fn is_empty(&self) -> bool {
        self.notices.is_empty()
    }

    pub fn ids(&self) -> Vec<String> {
        self.notices.iter().map(|n| n.id.clone()).collect()
    }

    /// The reply object of `notices` (what `--json` prints).
    pub fn reply(&self) -> NoticesReply {
        NoticesReply {
            notices: self.notices.clone(),
            more: self.more,
            unbound: None,
        }
    }
}

impl Delivery<Client> {
    /// A new connection (the daemon is started when none answers).
    pub fn connect(paths: &Paths, session: &str) -> Result<Delivery<Client>, WireError> {
        Ok(Delivery::over(Client::connect(paths)?, session))
    }
}

impl<C: BorrowMut<Client>> Delivery<C> {
    /// Claims over an open connection.
    pub fn over(client: C, session: &str) -> Delivery<C> {
        Delivery {
            client,
            session: session.to_string(),
        }
    }

    /// The connection, for other calls of the same client (they never touch its claims).
    pub fn client(&mut self) -> &mut Client {
        self.client.borrow_mut()
    }

    pub fn envelope(&self, request: Request) -> Envelope {
        Envelope {
            session: self.session.clone(),
            request,
        }
    }

    /// Claims the session's pending notices, the `limit` oldest (all with `None`);
    /// with `wait_s`, first waits up to that many seconds (checked by the daemon) while
    /// none is pending.
    pub fn claim(&mut self, limit: Option<u32>, wait_s: Option<f64>) -> Result<Claimed, WireError> {
        let request = self.envelope(claim_request(limit, wait_s, None));
        let reply: NoticesReply = self.client().call(&request)?;
        Ok(Claimed {
            notices: reply.notices,
            more: reply.more,
        })
    }

    /// Binds the session to the harness process `harness` (contract §11) and claims
    /// its pending notices, the `limit` oldest, in one request (a hook's turn
    /// boundary). A bind that failed still claims: the second value says why it did.
    pub fn bind_and_claim(
        &mut self,
        harness: ProcessKey,
        limit: Option<u32>,
    ) -> Result<(Claimed, Option<String>), WireError> {
        let request = self.envelope(claim_request(limit, None, Some(harness)));
        let reply: NoticesReply = self.client().call(&request)?;
        let claimed = Claimed {
            notices: reply.notices,
            more: reply.more,
        };
        Ok((claimed, reply.unbound))
    }

    /// Starts a stream of claims (`notices --follow`): each notice is claimed as it
    /// comes ([`Delivery::next_in_stream`]) and acknowledged on the stream
    /// ([`Delivery::acknowledge_in_stream`]).
    pub fn follow(&mut self) -> Result<(), WireError> {
        let request = self.envelope(Request::Notices {
            peek: false,
            follow: true,
            wait_s: None,
            ack: true,
            limit: None,
            bind_harness: None,
        });
        self.client().send(&request)
    }

    /// The next notice of a stream (`None`: the daemon closed it).
    pub fn next_in_stream(&mut self) -> Result<Option<Notice>, WireError> {
        match self.client().next_line()? {
            Some(line) => wire::decode_reply(&line).map(Some),
            None => Ok(None),
        }
    }

    /// The client showed these notices: the daemon marks them delivered.
    pub fn acknowledge(&mut self, ids: &[String]) -> Result<(), WireError> {
        for ids in ids.chunks(wire::MAX_ACK_IDS) {
            let ack = self.envelope(Request::Ack { ids: ids.to_vec() });
            self.client().call::<Ack>(&ack)?;
        }
        Ok(())
    }

    /// Acknowledges a notice of a stream (no reply comes on a stream).
    pub fn acknowledge_in_stream(&mut self, id: &str) -> Result<(), WireError> {
        let ack = self.envelope(Request::Ack {
            ids: vec![id.to_string()],
        });
        self.client().send(&ack)
    }
}

/// The request that claims notices (`notices` with `ack`: held by the connection until
/// it acknowledges them).
fn claim_request(
    limit: Option<u32>,
    wait_s: Option<f64>,
    bind_harness: Option<ProcessKey>,
) -> Request {
    Request::Notices {
        peek: false,
        follow: false,
        wait_s,
        ack: true,
        limit,
        bind_harness,
    }
}

/// The most notices one turn boundary delivers (hooks and MCP results):
/// `BGWORK_MAX_NOTICES_PER_TURN`, default 10; 0 lifts the bound, a value that is no
/// number keeps the default. `None`: no bound.
pub fn max_notices_per_turn() -> Option<u32> {
    let limit = std::env::var("BGWORK_MAX_NOTICES_PER_TURN")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(DEFAULT_MAX_NOTICES_PER_TURN);
    (limit > 0).then_some(limit)
}

/// What follows the notices of a turn boundary: that they are reports, and how many
/// more wait beyond the bound.
pub fn notices_note(more: u64) -> String {
    let mut note = String::from(
        "Each notice is a report of work that ended, not a request to start more work.",
    );
    if more > 0 {
        note.push_str(&format!("\n{more} more pending: `bgwork notices`"));
    }
    note
}

nix::ioctl_read_bad!(unread_in_pipe, nix::libc::FIONREAD, nix::libc::c_int);
nix::ioctl_read_bad!(unsent_on_socket, nix::libc::TIOCOUTQ, nix::libc::c_int);

/// What an output is, for knowing when its reader has taken what was written.
#[derive(Clone, Copy)]
pub enum OutKind {
    Pipe,
    Socket,
    /// A terminal or a file: written is shown.
    Other,
}

impl OutKind {
    pub fn of(fd: BorrowedFd<'_>) -> OutKind {
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

    /// Bytes written that the reader has not taken yet.
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

/// Shows `text` on `out` (a follower's stdout, the rewake hook's stderr) and waits
/// until its reader has taken it; an error means the reader went away first, and what
/// was claimed must not be acknowledged.
pub fn show<W: Write + AsFd>(out: &mut W, kind: OutKind, text: &str) -> std::io::Result<()> {
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
                // The reader went away: after taking the text, or before.
                return match kind.unread(fd) {
                    Some(0) => Ok(()),
                    _ => Err(std::io::ErrorKind::BrokenPipe.into()),
                };
            }
        }
        pause = (pause * 2).min(DRAIN_POLL_MAX);
    }
}

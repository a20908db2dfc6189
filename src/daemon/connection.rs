//! A client connection's framing, shared by the accept loop (`serve.rs`), `run`'s own
//! connection and notice streams: request lines read with a bound and cancel-safe
//! (`FrameReader`), replies written in chunks with a deadline (`write_reply`).

use crate::wire::frame::{LineError, Lines};
use crate::wire::{ErrorCode, WireError, MAX_FRAME};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

/// A reply is written this many bytes at a time, each within the write deadline.
pub(super) const WRITE_CHUNK: usize = 64 << 10;

/// Request lines of one connection ([`Lines`], the framing every connection shares),
/// cancel-safe: [`FrameReader::next`] can be dropped in a `select!` without losing bytes.
pub(crate) struct FrameReader(Lines<OwnedReadHalf>);

impl FrameReader {
    pub(super) fn new(read_half: OwnedReadHalf) -> FrameReader {
        FrameReader(Lines::new(read_half, MAX_FRAME))
    }

    /// The next request line; `None` at the end of the stream (or when it fails). A
    /// line longer than [`MAX_FRAME`] is refused.
    pub(crate) async fn next(&mut self) -> Result<Option<Vec<u8>>, WireError> {
        match self.0.next().await {
            Ok(line) => Ok(line),
            Err(LineError::Io(_)) => Ok(None),
            Err(LineError::TooLong(max)) => Err(WireError::new(
                ErrorCode::TooLarge,
                format!("request refused: larger than {max} bytes"),
            )),
        }
    }

    /// Shuts the client's way of the connection: its next write fails, while what it
    /// wrote before stays to be read here, up to the end of the stream (and replies
    /// may still be written to it).
    pub(crate) fn shut(&self) {
        use std::os::fd::AsFd;
        let stream: &tokio::net::UnixStream = self.0.get_ref().as_ref();
        let _ = nix::sys::socket::shutdown(
            std::os::fd::AsRawFd::as_raw_fd(&stream.as_fd()),
            nix::sys::socket::Shutdown::Read,
        );
    }

    /// Whether the client has gone (closed the connection whole), told without reading
    /// what it sent before: a run that waits for its job to read the caller's input
    /// sees a Ctrl-C of its caller so.
    pub(crate) fn peer_gone(&self) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        let stream: &tokio::net::UnixStream = self.0.get_ref().as_ref();
        let mut fds = [PollFd::new(stream.as_fd(), PollFlags::empty())];
        matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
            && fds[0]
                .revents()
                .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR))
    }

    /// Resolves when the client closes its side of the connection (bytes it sends
    /// meanwhile stay buffered for [`FrameReader::next`]).
    pub(crate) async fn closed(&mut self) {
        self.0.closed().await
    }
}

/// Writes a reply (or one line of a stream) in chunks; fails when the client is gone
/// or takes no byte of a chunk within `stall` (it is then dropped).
pub(crate) async fn write_reply(
    writer: &mut OwnedWriteHalf,
    line: &[u8],
    stall: Duration,
) -> Result<(), ()> {
    for chunk in line.chunks(WRITE_CHUNK) {
        match tokio::time::timeout(stall, writer.write_all(chunk)).await {
            Ok(Ok(())) => {}
            _ => return Err(()),
        }
    }
    Ok(())
}

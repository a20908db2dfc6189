//! `Conn`: one control connection of a supervisor (to a daemon), non-blocking both ways.
//!
//! Output progress is coalesced: while earlier messages wait in the write buffer, only a
//! flag is set, and the newest offsets are sent once the buffer drains. A slow or absent
//! daemon therefore never slows the job down or grows the supervisor's memory.

use crate::wire::control::{self, FromSupervisor, ToSupervisor};
use crate::wire::frame::LineBuffer;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;

/// A line longer than this on a control connection closes it: more than the largest
/// write a daemon sends (a 1 MiB request's input, base64-encoded).
pub(crate) const MAX_LINE: usize = 4 << 20;

pub struct Conn {
    pub stream: UnixStream,
    read_buf: LineBuffer,
    write_buf: Vec<u8>,
    progress_due: bool,
    pub closed: bool,
}

impl Conn {
    pub fn new(stream: UnixStream, already_read: Vec<u8>) -> std::io::Result<Conn> {
        stream.set_nonblocking(true)?;
        let mut read_buf = LineBuffer::new(MAX_LINE);
        read_buf.push(&already_read);
        Ok(Conn {
            stream,
            read_buf,
            write_buf: Vec::new(),
            progress_due: false,
            closed: false,
        })
    }

    pub fn wants_write(&self) -> bool {
        !self.write_buf.is_empty()
    }

    /// Queues a message and tries to send it now.
    pub fn send(&mut self, message: &FromSupervisor) {
        self.write_buf.extend_from_slice(&control::encode(message));
        self.flush();
    }

    /// Sends the newest output figures, or remembers to once the buffer drains.
    pub fn progress(&mut self, figures: FromSupervisor) {
        if self.write_buf.is_empty() {
            self.send(&figures);
        } else {
            self.progress_due = true;
        }
    }

    /// Writes what it can; returns true when a coalesced progress message is due.
    pub fn flush(&mut self) -> bool {
        while !self.write_buf.is_empty() && !self.closed {
            match self.stream.write(&self.write_buf) {
                Ok(0) => self.closed = true,
                Ok(n) => {
                    self.write_buf.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => self.closed = true,
            }
        }
        let due = self.write_buf.is_empty() && self.progress_due;
        if due {
            self.progress_due = false;
        }
        due
    }

    /// Reads what has arrived and returns the complete messages in it. Complete lines
    /// are taken as they come, so only a single line longer than [`MAX_LINE`] (which no
    /// daemon sends) closes the connection.
    pub fn receive(&mut self) -> Vec<ToSupervisor> {
        let mut chunk = [0u8; 16 << 10];
        let mut messages = Vec::new();
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    self.closed = true;
                    break;
                }
                Ok(n) => self.read_buf.push(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    self.closed = true;
                    break;
                }
            }
            messages.extend(self.take_messages());
            if self.closed {
                break;
            }
        }
        messages.extend(self.take_messages());
        messages
    }

    /// The complete messages already buffered.
    pub fn take_messages(&mut self) -> Vec<ToSupervisor> {
        let mut messages = Vec::new();
        loop {
            match self.read_buf.next_line() {
                Ok(Some(line)) => match control::decode(&line) {
                    Ok(message) => messages.push(message),
                    Err(e) => crate::note!("bgwork supervise: {e}"),
                },
                Ok(None) => break,
                Err(max) => {
                    crate::note!("bgwork supervise: a control line passed {max} bytes");
                    self.closed = true;
                    break;
                }
            }
        }
        messages
    }

    /// Blocks (up to `timeout`) until everything queued is written.
    pub fn flush_blocking(&mut self, timeout: std::time::Duration) {
        let _ = self.stream.set_nonblocking(false);
        let _ = self.stream.set_write_timeout(Some(timeout));
        if !self.closed && !self.write_buf.is_empty() {
            let _ = self.stream.write_all(&self.write_buf);
            self.write_buf.clear();
        }
    }
}

//! The framing of every bgwork connection (client ↔ daemon, daemon ↔ supervisor):
//! newline-delimited messages, read with a bound.
//!
//! [`LineBuffer`] is the framing itself, without I/O: bytes go in as they arrive,
//! complete lines come out, a partial line waits in the buffer. The readers built on it
//! are [`Lines`] (async: the daemon's connections and its executor's relays) and
//! [`SyncLines`] (the CLI client); the supervisor's non-blocking `Conn` feeds one
//! directly from its poll loop. The buffer lives in the struct, not in the future that
//! reads: a `select!` that drops a pending `next` loses no byte, and a line that
//! arrives in pieces is assembled across calls. A line longer than the bound is an
//! error (the peer broke the protocol), never an allocation without end.

use tokio::io::{AsyncRead, AsyncReadExt};

/// How much one read takes from a stream.
const CHUNK: usize = 64 << 10;

/// Newline framing without I/O.
pub struct LineBuffer {
    buffer: Vec<u8>,
    /// Where the unread bytes begin (bytes before it were returned as lines).
    start: usize,
    /// Where the search for a newline resumes (unread bytes before it hold none).
    scanned: usize,
    max: usize,
}

impl LineBuffer {
    /// A buffer for lines of at most `max` bytes.
    pub fn new(max: usize) -> LineBuffer {
        LineBuffer {
            buffer: Vec::new(),
            start: 0,
            scanned: 0,
            max,
        }
    }

    /// Adds bytes that arrived.
    pub fn push(&mut self, bytes: &[u8]) {
        self.compact();
        self.buffer.extend_from_slice(bytes);
    }

    /// The buffer, with room for `at_least` more bytes past its end, for a reader to
    /// append to in place (no chunk in between, nothing zeroed).
    pub fn room(&mut self, at_least: usize) -> &mut Vec<u8> {
        self.compact();
        self.buffer.reserve(at_least);
        &mut self.buffer
    }

    /// Drops the bytes already returned once they are half the buffer.
    fn compact(&mut self) {
        if self.start > 0 && self.start >= self.buffer.len() / 2 {
            self.buffer.drain(..self.start);
            self.scanned -= self.start;
            self.start = 0;
        }
    }

    /// The next complete line without its newline; `Ok(None)` until one is complete;
    /// `Err(max)` when the partial line has passed the bound.
    pub fn next_line(&mut self) -> Result<Option<Vec<u8>>, usize> {
        let from = self.scanned.max(self.start);
        match memchr::memchr(b'\n', &self.buffer[from..]) {
            Some(at) if self.start == 0 && from + at + 1 == self.buffer.len() => {
                // The whole buffer is one line (a large reply): handed over, not copied.
                let mut line = std::mem::take(&mut self.buffer);
                line.pop();
                self.scanned = 0;
                Ok(Some(line))
            }
            Some(at) => {
                let end = from + at;
                let line = self.buffer[self.start..end].to_vec();
                self.start = end + 1;
                self.scanned = self.start;
                if self.start == self.buffer.len() {
                    self.buffer.clear();
                    self.start = 0;
                    self.scanned = 0;
                }
                Ok(Some(line))
            }
            None => {
                self.scanned = self.buffer.len();
                match self.buffer.len() - self.start > self.max {
                    true => Err(self.max),
                    false => Ok(None),
                }
            }
        }
    }

    /// What is left after the last newline (a stream's last line without one).
    pub fn take_rest(&mut self) -> Option<Vec<u8>> {
        let rest = self.buffer.split_off(self.start);
        self.buffer.clear();
        self.start = 0;
        self.scanned = 0;
        (!rest.is_empty()).then_some(rest)
    }

    /// Up to `n` of the bytes that wait after the last line returned (a frame that
    /// follows its line).
    pub fn take_bytes(&mut self, n: usize) -> Vec<u8> {
        let end = self.start.saturating_add(n).min(self.buffer.len());
        let bytes = self.buffer[self.start..end].to_vec();
        self.start = end;
        self.scanned = self.scanned.max(end);
        if self.start == self.buffer.len() {
            self.buffer.clear();
            self.start = 0;
            self.scanned = 0;
        }
        bytes
    }

    /// Whether bytes wait that no line has returned yet.
    pub fn has_pending(&self) -> bool {
        self.buffer.len() > self.start
    }
}

/// Why no line came.
#[derive(Debug)]
pub enum LineError {
    /// The peer sent more than the bound without a newline.
    TooLong(usize),
    Io(std::io::Error),
}

/// Lines of an async stream. Cancel-safe.
pub struct Lines<R> {
    reader: R,
    buffer: LineBuffer,
}

impl<R: AsyncRead + Unpin> Lines<R> {
    pub fn new(reader: R, max: usize) -> Lines<R> {
        Lines {
            reader,
            buffer: LineBuffer::new(max),
        }
    }

    pub fn get_ref(&self) -> &R {
        &self.reader
    }

    /// The next line without its newline; `Ok(None)` at the end of the stream (a last
    /// line without a newline is returned first). Cancel-safe.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, LineError> {
        loop {
            if let Some(line) = self.buffer.next_line().map_err(LineError::TooLong)? {
                return Ok(Some(line));
            }
            // `read_buf` is cancel-safe: when this future is dropped, no byte was taken.
            let room = self.buffer.room(CHUNK);
            let n = self.reader.read_buf(room).await.map_err(LineError::Io)?;
            if n == 0 {
                return Ok(self.buffer.take_rest());
            }
        }
    }

    /// Resolves when the peer closes its side of the stream (or it fails); bytes that
    /// arrive meanwhile stay buffered for [`Lines::next`], and once any wait, this
    /// never resolves. Cancel-safe.
    pub async fn closed(&mut self) {
        loop {
            if self.buffer.has_pending() {
                return std::future::pending().await;
            }
            match self.reader.read_buf(self.buffer.room(CHUNK)).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }
}

/// Lines of a blocking stream (the CLI's connection, with its read timeouts): a read
/// that times out keeps the partial line for the next call.
pub struct SyncLines<R> {
    reader: R,
    buffer: LineBuffer,
}

impl<R: std::io::Read> SyncLines<R> {
    pub fn new(reader: R, max: usize) -> SyncLines<R> {
        SyncLines {
            reader,
            buffer: LineBuffer::new(max),
        }
    }

    pub fn get_ref(&self) -> &R {
        &self.reader
    }

    /// Whether bytes have arrived that no line has returned yet.
    pub fn has_pending(&self) -> bool {
        self.buffer.has_pending()
    }

    /// The next line without its newline; `Ok(None)` at the end of the stream.
    pub fn next_line(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        let mut chunk = vec![0u8; CHUNK];
        loop {
            let line = self
                .buffer
                .next_line()
                .map_err(|max| std::io::Error::other(format!("a line passed {max} bytes")))?;
            if let Some(line) = line {
                return Ok(Some(line));
            }
            let n = self.reader.read(&mut chunk)?;
            if n == 0 {
                return Ok(self.buffer.take_rest());
            }
            self.buffer.push(&chunk[..n]);
        }
    }

    /// Exactly `n` bytes that follow the last line (a frame): what arrived with the
    /// line first, the rest read straight into place.
    pub fn read_bytes(&mut self, n: usize) -> std::io::Result<Vec<u8>> {
        let mut bytes = self.buffer.take_bytes(n);
        let have = bytes.len();
        bytes.resize(n, 0);
        self.reader.read_exact(&mut bytes[have..])?;
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_line_split_across_reads_and_a_cancelled_read_lose_nothing() {
        let (mut a, b) = tokio::io::duplex(64);
        let mut lines = Lines::new(b, 1 << 10);
        use tokio::io::AsyncWriteExt;
        a.write_all(b"hel").await.unwrap();
        // A read that is cancelled part-way keeps what it had.
        let cancelled =
            tokio::time::timeout(std::time::Duration::from_millis(20), lines.next()).await;
        assert!(cancelled.is_err());
        a.write_all(b"lo\nworld").await.unwrap();
        assert_eq!(lines.next().await.unwrap().unwrap(), b"hello");
        drop(a);
        assert_eq!(lines.next().await.unwrap().unwrap(), b"world");
        assert!(lines.next().await.unwrap().is_none());
    }

    #[test]
    fn a_frame_after_a_line_is_read_whole_and_the_next_line_follows() {
        let sent = b"{\"output_bytes\":5}\nab\ncd{\"next\":1}\n".to_vec();
        // Whatever the reads' sizes, the frame's bytes are not taken for lines.
        for piece in [1, 3, 64] {
            let reader = Pieces(sent.chunks(piece).map(<[u8]>::to_vec).collect());
            let mut lines = SyncLines::new(reader, 1 << 10);
            assert_eq!(lines.next_line().unwrap().unwrap(), b"{\"output_bytes\":5}");
            assert_eq!(lines.read_bytes(5).unwrap(), b"ab\ncd");
            assert_eq!(lines.next_line().unwrap().unwrap(), b"{\"next\":1}");
            assert!(lines.next_line().unwrap().is_none());
        }
    }

    /// A reader that returns its bytes in the given pieces.
    struct Pieces(Vec<Vec<u8>>);

    impl std::io::Read for Pieces {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.0.is_empty() {
                return Ok(0);
            }
            let piece = &mut self.0[0];
            let n = piece.len().min(buf.len());
            buf[..n].copy_from_slice(&piece[..n]);
            piece.drain(..n);
            if piece.is_empty() {
                self.0.remove(0);
            }
            Ok(n)
        }
    }

    #[test]
    fn the_buffer_returns_each_line_once_whatever_the_pieces() {
        let mut buffer = LineBuffer::new(1 << 10);
        let text = b"one\ntwo\n\nthree\nfour";
        for piece in text.chunks(3) {
            buffer.push(piece);
        }
        let mut lines = Vec::new();
        while let Some(line) = buffer.next_line().unwrap() {
            lines.push(line);
        }
        assert_eq!(
            lines,
            vec![
                b"one".to_vec(),
                b"two".to_vec(),
                b"".to_vec(),
                b"three".to_vec()
            ]
        );
        assert!(buffer.has_pending());
        assert_eq!(buffer.take_rest(), Some(b"four".to_vec()));
        assert!(!buffer.has_pending());
        let mut small = LineBuffer::new(4);
        small.push(b"12345");
        assert_eq!(small.next_line(), Err(4));
    }

    #[test]
    fn a_blocking_read_that_times_out_keeps_the_partial_line() {
        use std::io::Write;
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        b.set_read_timeout(Some(std::time::Duration::from_millis(20)))
            .unwrap();
        let mut lines = SyncLines::new(b, 1 << 10);
        a.write_all(b"hel").unwrap();
        assert!(lines.next_line().is_err());
        assert!(lines.has_pending());
        a.write_all(b"lo\n").unwrap();
        assert_eq!(lines.next_line().unwrap().unwrap(), b"hello");
    }

    #[tokio::test]
    async fn a_line_past_the_bound_is_an_error() {
        let (mut a, b) = tokio::io::duplex(4096);
        let mut lines = Lines::new(b, 100);
        use tokio::io::AsyncWriteExt;
        a.write_all(&[b'x'; 300]).await.unwrap();
        assert!(matches!(lines.next().await, Err(LineError::TooLong(100))));
    }
}

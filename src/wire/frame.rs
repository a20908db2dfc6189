//! `Lines`: newline-framed messages read from an async stream, cancel-safe.
//!
//! The buffer lives in the struct, not in the future that reads: a `select!` that drops
//! a pending `next` loses no byte, and a line that arrives in pieces is assembled across
//! calls. A line longer than the bound is an error (the peer broke the protocol), never
//! an allocation without end.

use tokio::io::{AsyncRead, AsyncReadExt};

pub struct Lines<R> {
    reader: R,
    buffer: Vec<u8>,
    /// Where the search for a newline resumes (bytes before it hold none).
    scanned: usize,
    max: usize,
}

/// Why no line came.
#[derive(Debug)]
pub enum LineError {
    /// The peer sent more than the bound without a newline.
    TooLong(usize),
    Io(std::io::Error),
}

impl<R: AsyncRead + Unpin> Lines<R> {
    pub fn new(reader: R, max: usize) -> Lines<R> {
        Lines {
            reader,
            buffer: Vec::new(),
            scanned: 0,
            max,
        }
    }

    /// The next line without its newline; `Ok(None)` at the end of the stream (a last
    /// line without a newline is returned first). Cancel-safe.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, LineError> {
        let mut chunk = [0u8; 16 << 10];
        loop {
            if let Some(line) = self.take_line() {
                return Ok(Some(line));
            }
            if self.buffer.len() > self.max {
                return Err(LineError::TooLong(self.max));
            }
            // `read` is cancel-safe: when this future is dropped, no byte was taken.
            let n = self.reader.read(&mut chunk).await.map_err(LineError::Io)?;
            if n == 0 {
                self.scanned = 0;
                return Ok((!self.buffer.is_empty()).then(|| std::mem::take(&mut self.buffer)));
            }
            self.buffer.extend_from_slice(&chunk[..n]);
        }
    }

    fn take_line(&mut self) -> Option<Vec<u8>> {
        let found = self.buffer[self.scanned..].iter().position(|&b| b == b'\n');
        match found {
            Some(at) => {
                let end = self.scanned + at;
                let mut line: Vec<u8> = self.buffer.drain(..=end).collect();
                line.pop();
                self.scanned = 0;
                Some(line)
            }
            None => {
                self.scanned = self.buffer.len();
                None
            }
        }
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

    #[tokio::test]
    async fn a_line_past_the_bound_is_an_error() {
        let (mut a, b) = tokio::io::duplex(4096);
        let mut lines = Lines::new(b, 100);
        use tokio::io::AsyncWriteExt;
        a.write_all(&[b'x'; 300]).await.unwrap();
        assert!(matches!(lines.next().await, Err(LineError::TooLong(100))));
    }
}

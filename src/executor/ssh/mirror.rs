//! A job on a host: its output mirrored from the host's log into the local job folder
//! by offset, a window of reads in flight while it is behind.

use super::link::{self, LinkError};
use super::Tracker;
use crate::executor::ExecEvent;
use crate::job_dir::JobDir;
use crate::wire::{Envelope, ReadArgs, ReadReply, Request};
use std::io::Write;
use std::time::Duration;

/// The most output one request brings over.
const CHUNK: usize = 4 << 20;
/// How many reads of a job's output are in flight at once while the mirror is behind
/// (the host reads the next chunk while this one crosses the link), the extra ones
/// within the link's own bound (`Link::extra_read`).
const WINDOW: usize = 4;

impl Tracker {
    /// Reads the host's log from the mirror's offset until a read comes back short (the
    /// mirror caught up), and writes each chunk at the same offset here, in order. One
    /// read at a time while each comes back short; once one was a whole chunk (the
    /// mirror is behind), up to `WINDOW` reads at consecutive offsets stay in flight,
    /// the next asked as each one lands (so the host reads, the link carries and this
    /// daemon writes at once, with no pause between batches), the extra ones within
    /// the link's bound. A chunk is taken only at the mirror's offset: after a short one
    /// (or a middle the host's cap dropped, `clipped`) the reads beyond it are left and
    /// asked again from the new offset. The last reply taken.
    pub(super) async fn catch_up(&mut self, id: &str) -> Result<ReadReply, LinkError> {
        type Asked = tokio::task::JoinHandle<Result<link::Reply, LinkError>>;
        // Each read in flight: its offset, its task, whether it is the job's own read.
        let mut asked: std::collections::VecDeque<(u64, Asked, bool)> = Default::default();
        let mut wide = 1;
        loop {
            // Fill the window from where the reads in flight end.
            let mut own_asked = asked.iter().any(|(_, _, own)| *own);
            while asked.len() < wide {
                let permit = match own_asked {
                    false => None,
                    true => match self.link.extra_read() {
                        Some(permit) => Some(permit),
                        None => break,
                    },
                };
                let from = asked
                    .back()
                    .map_or(self.mirrored, |(from, _, _)| from + CHUNK as u64);
                let own = !own_asked;
                own_asked = true;
                let (link, envelope) = (self.link.clone(), self.mirror_read(id, from));
                let read = tokio::spawn(async move {
                    let _permit = permit;
                    link.request_frame(&envelope, Duration::ZERO).await
                });
                asked.push_back((from, read, own));
            }
            let Some((from, read, _)) = asked.pop_front() else {
                return Err(LinkError::Down("no read was made".into()));
            };
            let (line, bytes) = read
                .await
                .map_err(|e| LinkError::Down(format!("the read did not finish: {e}")))??;
            let reply: ReadReply = crate::wire::decode_reply(&line).map_err(LinkError::Refused)?;
            if from != self.mirrored {
                // Asked past a chunk that came back short: asked again from here.
                asked.clear();
                continue;
            }
            self.take_chunk(&reply, &bytes);
            // More is there when the chunk was whole, or when the read stopped short of
            // the log's end (`clipped`: a middle the host's cap dropped, read past in
            // steps, with the newest bytes after it).
            let full = bytes.len() >= CHUNK || reply.clipped;
            if !full {
                return Ok(reply);
            }
            wide = WINDOW;
            if asked
                .front()
                .is_some_and(|(from, _, _)| *from != self.mirrored)
            {
                // The chunk ended elsewhere than a whole one would (a dropped middle).
                asked.clear();
            }
        }
    }

    /// Writes one read's bytes at its offset here and tells the daemon the log grew.
    pub(super) fn take_chunk(&mut self, reply: &ReadReply, bytes: &[u8]) {
        // A raw read's bytes are the last of `[from, to)`: all of it, or none when it
        // lay in the middle the host's cap dropped (a hole here too).
        let at = reply
            .to
            .saturating_sub(bytes.len() as u64)
            .max(self.mirrored);
        let skipped = at > self.mirrored;
        let grew = !bytes.is_empty();
        if grew {
            self.append(at, bytes);
        }
        self.mirrored = reply.to.max(self.mirrored);
        if grew || skipped {
            let log_len = std::fs::metadata(JobDir(&self.job_dir).log()).map_or(0, |m| m.len());
            let _ = self.events.send(ExecEvent::Output {
                row: self.row,
                log_len,
                // A mirror's dropped middles are its holes, found in the file by
                // every reader (`output::Holes`): no figure at this daemon's head.
                dropped: 0,
                unwritten: 0,
                unwritten_at: 0,
            });
        }
    }

    /// A read of the host's log from `from`: the exact bytes, raw after the reply's
    /// line (no base64, no JSON escapes), as the host's log holds them (token shapes
    /// are masked when read here, as for a local job's log, so every offset is the
    /// host's).
    pub(super) fn mirror_read(&self, id: &str, from: u64) -> Envelope {
        self.envelope(Request::Read(ReadArgs {
            id: id.to_string(),
            from: Some(from),
            raw: true,
            max_bytes: Some(CHUNK),
            no_redact: true,
            output_frame: true,
            ..ReadArgs::default()
        }))
    }

    /// Writes `bytes` at the host's offset `at`: a middle the host's cap dropped stays
    /// a hole here too, so every byte keeps its offset (and a reattach resumes from
    /// the log's length). Readers find the holes in the file (`output::Holes`); one
    /// shorter than the rest of the block it begins in would be no hole but zeros, so
    /// that block's output before it (which the host's cap dropped too: its first
    /// middle is always more than a block) is dropped with it.
    pub(super) fn append(&self, at: u64, bytes: &[u8]) {
        let log = JobDir(&self.job_dir).log();
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .and_then(|mut file| {
                let meta = file.metadata()?;
                let len = meta.len();
                if len < at {
                    let block = std::os::unix::fs::MetadataExt::blksize(&meta).max(512);
                    let block_start = len - len % block;
                    if len % block != 0 && at <= block_start + block {
                        use nix::fcntl::{fallocate, FallocateFlags};
                        let flags = FallocateFlags::FALLOC_FL_PUNCH_HOLE
                            | FallocateFlags::FALLOC_FL_KEEP_SIZE;
                        fallocate(&file, flags, block_start as i64, (at - block_start) as i64)
                            .map_err(std::io::Error::from)?;
                    }
                    file.set_len(at)?;
                }
                file.write_all(bytes)
            });
        if let Err(e) = written {
            crate::note!(
                "bgwork daemon: could not mirror output into {}: {e}",
                log.display()
            );
        }
    }
}

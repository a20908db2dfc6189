//! The job's output: read from its pipe or terminal into the log, masked for secrets
//! when the log is read back, and reported to the daemon at its pace.

use super::{Supervisor, PROGRESS_INTERVAL, READ_CHUNK};
use crate::job_dir::JobDir;
use crate::redact::{Secrets, StreamMask};
use crate::wire::control::{self, FromSupervisor};
use std::fs::File;
use std::io::{ErrorKind, Read};
use std::path::Path;
use std::time::Instant;

impl Supervisor {
    pub(super) fn read_output(&mut self) {
        let Some(output) = self.output.as_mut() else {
            return;
        };
        let mut appended = false;
        for _ in 0..16 {
            let moved = if self.splicing {
                self.log.splice_from(output, READ_CHUNK)
            } else {
                output.read(&mut self.buffer).inspect(|&n| {
                    let bytes = &self.buffer[..n];
                    match self.mask.as_mut() {
                        None => self.log.append(bytes),
                        Some(mask) => {
                            self.log.append(mask.push(bytes, &mut self.masked));
                            if let Some(raw) = self.raw_log.as_mut() {
                                raw.append(bytes);
                            }
                        }
                    }
                })
            };
            match moved {
                Ok(0) => {
                    self.output = None;
                    break;
                }
                Ok(_) => appended = true,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // splice does not serve this output (a terminal) or this disk (full):
                // copy through the buffer from now on, which counts what it cannot write.
                Err(_) if self.splicing => self.splicing = false,
                Err(_) => {
                    self.output = None;
                    break;
                }
            }
        }
        if self.output.is_none() {
            self.flush_mask();
        }
        if appended {
            self.progress_due = true;
        }
        self.report_progress(false);
    }

    /// A sub-agent's report (the file its `BGWORK_REPORT` names) becomes the notice of
    /// its end: it is masked like the output, whatever its size (a chunk at a time,
    /// through a mask of its own), into a new file renamed over it, before the end is
    /// told. Outside input: a link or a FIFO is left alone (the daemon refuses it).
    pub(super) fn mask_report(&self) {
        let (Some(mask), Some(path)) = (&self.mask, self.spec.env.get("BGWORK_REPORT")) else {
            return;
        };
        let path = Path::new(path);
        let Ok(file) = crate::paths::open_untrusted(path) else {
            return;
        };
        let temp = path.with_extension("masking");
        let _ = std::fs::remove_file(&temp);
        match mask_file(file, &temp, mask.secrets()) {
            Ok(false) => {
                let _ = std::fs::remove_file(&temp);
            }
            Ok(true) => {
                if let Err(e) = std::fs::rename(&temp, path) {
                    self.report_unmasked(path, &temp, &e);
                }
            }
            Err(e) => self.report_unmasked(path, &temp, &e),
        }
    }

    /// A report that could not be masked is not left in clear for the notice.
    pub(super) fn report_unmasked(&self, path: &Path, temp: &Path, e: &std::io::Error) {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        crate::note!("bgwork supervise: could not mask the report: {e}");
        let _ = std::fs::remove_file(temp);
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
            .open(path)
            .and_then(|mut file| {
                file.write_all(b"[bgwork: the report held a secret and could not be masked]\n")
            });
    }

    /// The output ended (or will no longer be read): what the mask held back, to the log.
    pub(super) fn flush_mask(&mut self) {
        if let Some(mask) = self.mask.as_mut() {
            mask.finish(&mut self.masked);
            self.log.append(&self.masked);
        }
    }

    /// When output progress is next due, if any is: after the daemon's pace, or
    /// after [`PROGRESS_INTERVAL`] when the dropped or unwritten bytes changed (a read
    /// must not take the cap's new hole for output).
    pub(super) fn progress_at(&self) -> Option<Instant> {
        if !self.progress_due {
            return None;
        }
        let interval = match self.log_figures() == self.reported {
            true => self.pace,
            false => PROGRESS_INTERVAL,
        };
        Some(self.last_progress + interval)
    }

    /// Tells the daemon how far the log has grown, at most once per pace while output
    /// streams, so a fast writer does not make the daemon spin; `now` forces it
    /// (before the end is reported).
    pub(super) fn report_progress(&mut self, now: bool) {
        let Some(due_at) = self.progress_at() else {
            return;
        };
        if !now && Instant::now() < due_at {
            return;
        }
        self.progress_due = false;
        self.last_progress = Instant::now();
        self.reported = self.log_figures();
        if self.commands.is_some() {
            self.write_figures();
        }
        for index in 0..self.conns.len() {
            let figures = self.figures();
            self.conns[index].progress(figures);
        }
    }

    /// Under Slurm, no daemon is connected: the log's dropped middle and unwritten
    /// bytes, which the file's length does not tell, go to [`JobDir::FIGURES`] each time
    /// they change (rarely: a punch of the cap, a full disk).
    pub(super) fn write_figures(&mut self) {
        let now = self.log_figures();
        if now == self.figures_written {
            return;
        }
        let figures = JobDir(Path::new(&self.spec.job_dir)).figures();
        let written = crate::paths::write_whole(&figures, &control::encode(&self.figures()));
        match written {
            Ok(()) => self.figures_written = now,
            Err(e) => crate::note!("bgwork supervise: could not write {}: {e}", JobDir::FIGURES),
        }
    }

    /// The log's dropped bytes, unwritten bytes and where the first of those was lost:
    /// what its length does not tell.
    pub(super) fn log_figures(&self) -> (u64, u64, u64) {
        (
            self.log.dropped(),
            self.log.unwritten(),
            self.log.unwritten_at(),
        )
    }

    /// The log's figures, as an output progress message.
    pub(super) fn figures(&self) -> FromSupervisor {
        FromSupervisor::Output {
            log_len: self.log.len(),
            dropped: self.log.dropped(),
            unwritten: self.log.unwritten(),
            unwritten_at: self.log.unwritten_at(),
        }
    }
}

/// Writes `file` masked by `secrets` into the new file `temp`, a chunk at a time (memory
/// stays bounded whatever the file's size); false (and `temp` left to remove) when the
/// masked text is the same as the file's.
pub(super) fn mask_file(file: File, temp: &Path, secrets: &Secrets) -> std::io::Result<bool> {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(temp)?;
    let mut stream = StreamMask::new(secrets.clone());
    let (mut chunk, mut masked) = (vec![0u8; READ_CHUNK], Vec::new());
    let (mut read_len, mut written_len) = (0u64, 0u64);
    let mut reader = &file;
    loop {
        let n = match reader.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        read_len += n as u64;
        let piece = stream.push(&chunk[..n], &mut masked);
        written_len += piece.len() as u64;
        out.write_all(piece)?;
    }
    stream.finish(&mut masked);
    written_len += masked.len() as u64;
    out.write_all(&masked)?;
    drop(out);
    if read_len != written_len {
        return Ok(true);
    }
    same_bytes(&file, temp).map(|same| !same)
}

/// Whether `file` and the file at `other` hold the same bytes.
pub(super) fn same_bytes(file: &File, other: &Path) -> std::io::Result<bool> {
    let other = File::open(other)?;
    let (mut a, mut b) = (vec![0u8; READ_CHUNK], vec![0u8; READ_CHUNK]);
    let mut at = 0u64;
    loop {
        let n = crate::output::read_full_at(file, &mut a, at)?;
        let m = crate::output::read_full_at(&other, &mut b, at)?;
        if n != m || a[..n] != b[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
        at += n as u64;
    }
}

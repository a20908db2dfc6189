//! A sub-agent's report: the file named by its `BGWORK_REPORT`, read for its notice.
//!
//! The sub-agent controls that file, so it is read as outside input: opened without
//! following a symbolic link and without blocking (a FIFO would hang the reader), used
//! only when it is a regular file of this user with one name, and only its last
//! [`REPORT_MAX`] bytes are read (a huge file costs no memory). The text is made inert
//! like job output (escape sequences stripped). The caller reads it without holding
//! the daemon's lock.

use crate::output;
use std::fs::File;
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The most of a sub-agent's report a notice carries: its end.
const REPORT_MAX: u64 = 16 << 10;
/// How far before the cut a report's reader looks for a token that the cut splits.
const TOKEN_CONTEXT: u64 = 256;

/// What a sub-agent's report gives its notice.
pub(crate) enum Report {
    /// No report file, or an empty one: the notice carries the output's tail.
    Absent,
    /// The report's text (its end when it is long).
    Text(String),
    /// The file was not read, and why, in words for the notice.
    Refused(String),
}

impl Report {
    /// Reads the report in `job_dir`.
    pub(crate) fn read(job_dir: &Path) -> Report {
        let path = crate::job_dir::JobDir(job_dir).report();
        match open(&path) {
            Ok(Some(file)) => text(&file, &path),
            Ok(None) => Report::Absent,
            Err(why) => Report::Refused(format!(
                "[bgwork: the sub-agent's report {} was refused: {why}]",
                path.display()
            )),
        }
    }

    /// Puts the report into a notice's tail (a refusal goes before the output's tail).
    pub(crate) fn apply(self, tail: &mut String) {
        match self {
            Report::Absent => {}
            Report::Text(text) => *tail = text,
            Report::Refused(why) => *tail = format!("{why}\n{tail}"),
        }
    }
}

/// Opens the report if it is a regular file of this user with one name; `None` when
/// there is none; the reason for the notice when it is refused.
fn open(path: &Path) -> Result<Option<File>, String> {
    let file = match crate::paths::open_untrusted(path) {
        Ok(file) => file,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) if e.kind() == ErrorKind::InvalidInput => {
            return Err(
                "report is not a regular file (a link, a FIFO, a device or a socket)".into(),
            )
        }
        Err(e) => return Err(format!("report could not be opened: {e}")),
    };
    let meta = file
        .metadata()
        .map_err(|e| format!("report could not be read: {e}"))?;
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(format!("report is not owned by you (uid {})", meta.uid()));
    }
    if meta.nlink() > 1 {
        return Err("report has other names (a hard link to another file)".into());
    }
    Ok(Some(file))
}

/// The report's last [`REPORT_MAX`] bytes as readable text (token shapes masked; the
/// supervisor masked the job's known values in the file itself).
fn text(file: &File, path: &Path) -> Report {
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut from = len.saturating_sub(REPORT_MAX);
    // A little before the cut is read too, to see a token shape the cut would split.
    let lead = from.min(TOKEN_CONTEXT);
    let mut bytes = vec![0u8; (len - from + lead) as usize];
    let filled = match crate::output::read_full_at(file, &mut bytes, from - lead) {
        Ok(filled) => filled,
        Err(e) => return Report::Refused(format!("[bgwork: report could not be read: {e}]")),
    };
    bytes.truncate(filled);
    if from > 0 {
        // Start past a token the cut splits (none of it is shown), at a character.
        let mut start = (lead as usize).min(bytes.len());
        if let Some((_, end)) = crate::redact::token_across(&bytes, start) {
            start = end;
        }
        start += bytes[start..]
            .iter()
            .position(|&b| b & 0xc0 != 0x80)
            .unwrap_or(0);
        from = from - lead + start as u64;
        bytes.drain(..start);
    }
    let text = output::readable(&bytes);
    if text.trim().is_empty() {
        return Report::Absent;
    }
    if from == 0 {
        return Report::Text(text);
    }
    Report::Text(format!(
        "[... the first {from} bytes of the report are not shown; it is in {}]\n{text}",
        path.display()
    ))
}

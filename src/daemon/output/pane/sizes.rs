//! A pane's sizes over its life: the record of its resizes in the job's folder
//! (`sizes`: the log offset of each resize and the new size), so that a rebuilt screen
//! wraps each byte at the width it was written at.

use super::check_size;
use super::screen::{SizeAt, TAIL};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

/// The most of the sizes file (`JobDir::SIZES`) that is read; it is compacted when it grows past this.
const SIZES_MAX: u64 = 64 << 10;

/// Opens a file of the job folder that the daemon owns: never through a link, never
/// blocking (a job can reach its own folder), a regular file only.
fn open_own(path: &Path, write: bool) -> std::io::Result<std::fs::File> {
    use nix::fcntl::OFlag;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(!write)
        .append(write)
        .create(write)
        .mode(0o600)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits())
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(file)
}

/// The sizes a pane had, in log order; `current` alone when it was never resized (or
/// its record of sizes cannot be read).
pub(super) fn read_sizes(job_dir: &Path, current: (u16, u16)) -> Vec<SizeAt> {
    let only = vec![(0, current.0, current.1)];
    let Ok(mut file) = open_own(&crate::job_dir::JobDir(job_dir).sizes(), false) else {
        return only;
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(SIZES_MAX);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(start)).is_err()
        || file.take(SIZES_MAX).read_to_end(&mut bytes).is_err()
    {
        return only;
    }
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    if start > 0 {
        // The first line read may be the end of a longer one.
        text = text
            .split_once('\n')
            .map(|(_, rest)| rest.to_string())
            .unwrap_or_default();
    }
    let sizes = parse_sizes(&text);
    if sizes.is_empty() {
        only
    } else {
        sizes
    }
}

fn parse_sizes(text: &str) -> Vec<SizeAt> {
    let mut sizes: Vec<SizeAt> = Vec::new();
    for line in text.lines() {
        let mut fields = line.split(' ');
        let parsed = (|| {
            let at = fields.next()?.parse().ok()?;
            let cols = fields.next()?.parse().ok()?;
            let rows = fields.next()?.parse().ok()?;
            check_size(cols, rows).ok()?;
            Some((at, cols, rows))
        })();
        let Some(size) = parsed else {
            continue;
        };
        // Offsets only grow; a later resize at the same offset replaces the earlier.
        match sizes.last_mut() {
            Some(last) if last.0 == size.0 => *last = size,
            Some(last) if last.0 > size.0 => {}
            _ => sizes.push(size),
        }
    }
    sizes
}

/// Appends a resize at log offset `at` (with the size before it, when it is the first).
/// A file grown past [`SIZES_MAX`] is compacted to the sizes a rebuild can still need.
pub(super) fn record_size(
    job_dir: &Path,
    at: u64,
    old: (u16, u16),
    new: (u16, u16),
) -> std::io::Result<()> {
    let path = crate::job_dir::JobDir(job_dir).sizes();
    let mut file = open_own(&path, true)?;
    let mut lines = String::new();
    if file.metadata()?.len() == 0 {
        lines.push_str(&format!("0 {} {}\n", old.0, old.1));
    }
    lines.push_str(&format!("{at} {} {}\n", new.0, new.1));
    file.write_all(lines.as_bytes())?;
    if file.metadata()?.len() > SIZES_MAX {
        // Only the size in effect where a rebuild may start, and the later ones.
        let sizes = read_sizes(job_dir, new);
        let oldest = at.saturating_sub(TAIL);
        let first = sizes.iter().rposition(|s| s.0 <= oldest).unwrap_or(0);
        let text: String = sizes[first..]
            .iter()
            .enumerate()
            .map(|(i, s)| format!("{} {} {}\n", if i == 0 { 0 } else { s.0 }, s.1, s.2))
            .collect();
        let fresh = job_dir.join(format!("{}.new", crate::job_dir::JobDir::SIZES));
        let _ = std::fs::remove_file(&fresh);
        open_own(&fresh, true)?.write_all(text.as_bytes())?;
        std::fs::rename(&fresh, &path)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::output::pane::screen::Source;
    use std::path::PathBuf;

    #[test]
    fn the_sizes_file_stays_small_and_keeps_what_a_rebuild_needs() {
        let dir = tempfile::tempdir().unwrap();
        record_size(dir.path(), 10, (80, 24), (100, 30)).unwrap();
        assert_eq!(
            read_sizes(dir.path(), (1, 1)),
            vec![(0, 80, 24), (10, 100, 30)]
        );
        for i in 0..20_000u64 {
            let cols = 20 + (i % 400) as u16;
            record_size(dir.path(), 1000 + i * 100, (0, 0), (cols, 40)).unwrap();
        }
        let size = std::fs::metadata(crate::job_dir::JobDir(dir.path()).sizes())
            .unwrap()
            .len();
        assert!(size <= SIZES_MAX + 64, "{size}");
        let sizes = read_sizes(dir.path(), (1, 1));
        let last = 1000 + 19_999 * 100;
        assert_eq!(
            *sizes.last().unwrap(),
            (last, 20 + (19_999 % 400) as u16, 40)
        );
        // A rebuild starts at most TAIL bytes back: the size there is the true one.
        let source = Source {
            log: PathBuf::new(),
            len: last,
            head: 0,
            dropped: 0,
            sizes,
        };
        for at in [last - TAIL, last - TAIL / 2, last] {
            let i = (at - 1000) / 100;
            assert_eq!(source.size_at(at), (20 + (i % 400) as u16, 40), "at {at}");
        }
    }

    #[test]
    fn sizes_parse_in_order_and_later_ones_replace_earlier_at_one_offset() {
        let sizes =
            parse_sizes("0 80 24\n10 100 30\n10 90 20\nbad line\n5 1 1\n20 2000 5\n30 50 10\n");
        assert_eq!(sizes, vec![(0, 80, 24), (10, 90, 20), (30, 50, 10)]);
    }
}

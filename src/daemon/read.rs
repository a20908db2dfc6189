//! `read`: an item's output since this session's last read (a durable cursor), or a
//! chosen range. Never blocks.

use super::Daemon;
use crate::output;
use crate::wire::{ReadArgs, ReadReply, State, WireError};
use base64::Engine;

/// What a reader is told of output a full disk kept out of the log.
pub(crate) fn unwritten_line(unwritten: u64) -> String {
    format!("[... {unwritten} bytes could not be written: disk full ...]")
}

/// How far back `--tail N` looks for its lines.
const TAIL_WINDOW: u64 = 1 << 20;
/// The default size of a `--raw` read (raw bytes are returned consecutively).
const RAW_MAX_BYTES: usize = 8 << 20;
/// The most one read returns, whatever `--max-bytes` asks (the rest is read by range).
const MAX_READ_BYTES: usize = 16 << 20;

impl Daemon {
    pub(crate) fn read(&self, session: &str, args: &ReadArgs) -> Result<ReadReply, WireError> {
        let mut inner = self.lock();
        let record = Self::find(&inner, session, &args.id)?;
        let path = output::log_path(&record.job_dir);
        let len = output::log_len(&path);
        let dropped = inner.dropped(&record);
        let by_cursor = args.from.is_none() && !args.all && args.tail.is_none();
        let from = match (args.from, args.all, args.tail) {
            (Some(from), _, _) => from.min(len),
            (None, true, _) => 0,
            (None, false, Some(_)) => len.saturating_sub(TAIL_WINDOW),
            (None, false, None) => inner.store.cursor(session, record.row)?.min(len),
        };
        let default_max = if args.raw {
            RAW_MAX_BYTES
        } else {
            output::DEFAULT_MAX_BYTES
        };
        let max = args
            .max_bytes
            .unwrap_or(default_max)
            .clamp(64, MAX_READ_BYTES);
        let head = self.config.log_head;
        let running = record.state != State::Ended;
        // Text of a running item stops before a character or escape sequence whose
        // rest has not arrived, so no read shows half of one (the next read has it).
        let len = if running && !args.raw {
            output::text_end(&path, from, len, head, dropped)
        } else {
            len
        };
        let (to, text, clipped, skipped, base64) = if args.raw {
            // Raw bytes are never clipped in the middle: a read returns up to `max`
            // consecutive bytes and the next read goes on from `to`.
            let to = len.min(from + max as u64);
            let (bytes, _) = output::read_range(&path, from, to, head, dropped);
            let skipped = output::dropped_in(from, to, head, dropped);
            let encoded = base64::engine::general_purpose::STANDARD.encode(&bytes);
            let text = String::from_utf8_lossy(&bytes).into_owned();
            (to, text, to < len, skipped, Some(encoded))
        } else {
            let excerpt = output::excerpt(&path, from, len, head, dropped, max);
            let (mut text, clipped) = excerpt.render(max, &path);
            if let Some(n) = args.tail {
                text = output::last_lines(&text, n);
            }
            let skipped = output::dropped_in(from, len, head, dropped);
            if skipped > 0 {
                text = format!(
                    "[... {skipped} bytes dropped by the log cap (the first and newest bytes are kept) ...]\n{text}"
                );
            }
            (len, text, clipped, skipped, None)
        };
        if by_cursor {
            inner.store.set_cursor(session, record.row, to)?;
        }
        // Output that a full disk kept out of the log is said where it was lost.
        let (unwritten, unwritten_at) = inner.unwritten(&record);
        let lost_here = unwritten > 0 && (from..=to).contains(&unwritten_at);
        let mut text = text;
        if lost_here && !args.raw {
            text = format!("{}\n{text}", unwritten_line(unwritten));
        }
        let skipped = skipped + if lost_here { unwritten } else { 0 };
        let shown = super::items::display_id(session, &record);
        Ok(ReadReply {
            id: shown.clone(),
            running,
            output: text,
            from,
            to,
            dropped_bytes: skipped,
            clipped,
            log_path: path.display().to_string(),
            report: self.item_as(session, &record).report,
            output_base64: base64,
        })
    }
}

//! Panes: a job's visible screen (`read --screen`) and resizing its terminal.
//!
//! This file is the requests and the size limits; `screen.rs` is the emulator each
//! screen is and the screens kept, `sizes.rs` the record of resizes a rebuilt screen
//! follows.

mod screen;
mod sizes;

use crate::daemon::Daemon;
use crate::output;
use crate::wire::control::ToSupervisor;
use crate::wire::{Ack, ErrorCode, Kind, ReadReply, State, WireError};
use screen::Source;
use sizes::{read_sizes, record_size};
use std::path::{Path, PathBuf};

pub(crate) use screen::Screens;

/// The largest pane: 500 columns by 200 rows. A screen cell takes 32 bytes in the
/// emulator (twice that once a program uses the alternate screen), so the largest
/// screen is 3.2 MB (6.4 MB), and its text, which a model reads, at most 100 KB.
pub(crate) const MAX_COLS: u16 = 500;
pub(crate) const MAX_ROWS: u16 = 200;
const MIN_SIZE: u16 = 2;

/// Refuses a pane size outside 2..=500 columns and 2..=200 rows.
pub(crate) fn check_size(cols: u16, rows: u16) -> Result<(), WireError> {
    if (MIN_SIZE..=MAX_COLS).contains(&cols) && (MIN_SIZE..=MAX_ROWS).contains(&rows) {
        return Ok(());
    }
    Err(WireError::bad_request(format!(
        "a pane of {cols}x{rows} is refused: --cols takes {MIN_SIZE} to {MAX_COLS} and --rows \
         {MIN_SIZE} to {MAX_ROWS}"
    )))
}

impl Daemon {
    /// The visible screen of a pane, as text.
    pub(crate) async fn screen(&self, session: &str, id: &str) -> Result<ReadReply, WireError> {
        let (record, dropped, kept) = {
            let mut inner = self.lock();
            let record = Self::find(&inner, session, id)?;
            if record.kind != Kind::Pane {
                return Err(WireError::refused(format!(
                    "{id} has no screen: it was started without --pty; `bgwork read {id}` shows its output"
                )));
            }
            let dropped = inner.dropped(&record);
            // Only a running pane's screen is kept; an ended one is rebuilt when read.
            let kept = (record.state != State::Ended).then(|| {
                let cells = record.cols.unwrap_or(0) as usize * record.rows.unwrap_or(0) as usize;
                inner.screens.get((record.row, record.started_at), cells)
            });
            (record, dropped, kept)
        };
        let log = output::log_path(&record.job_dir);
        let size = (record.cols.unwrap_or(120), record.rows.unwrap_or(40));
        let head = self.config.log_head;
        let job_dir = PathBuf::from(&record.job_dir);
        let path = log.clone();
        let (text, len) = tokio::task::spawn_blocking(move || {
            if job_dir.as_os_str().is_empty() {
                return (String::new(), 0);
            }
            let len = output::log_len(&path);
            let source = Source {
                log: path,
                len,
                head,
                dropped,
                sizes: read_sizes(&job_dir, size),
            };
            let screen = kept.unwrap_or_default();
            let mut screen = screen.lock().unwrap_or_else(|poisoned| {
                // A feed that panicked left the emulator half-fed: start it afresh.
                let mut screen = poisoned.into_inner();
                screen.parser = None;
                screen
            });
            (crate::redact::mask_shapes(screen.catch_up(&source)), len)
        })
        .await
        .map_err(|e| WireError::internal(format!("the screen of {id} could not be built: {e}")))?;
        let shown = crate::daemon::display_id(session, &record);
        Ok(ReadReply {
            id: shown.clone(),
            running: record.state != State::Ended,
            live: self.item_as(session, &record).not_running_words(),
            output: text,
            from: 0,
            to: len,
            dropped_bytes: 0,
            clipped: false,
            log_path: log.display().to_string(),
            folder: log.parent().map(|dir| dir.display().to_string()),
            report: self.item_as(session, &record).report,
            output_base64: None,
            output_bytes: None,
            cost: crate::wire::Cost::recorded(record.cpu_ms, record.peak_rss),
            host_unreachable: None,
        })
    }

    pub(crate) fn resize(
        &self,
        session: &str,
        id: &str,
        cols: u16,
        rows: u16,
    ) -> Result<Ack, WireError> {
        check_size(cols, rows)?;
        let mut inner = self.lock();
        let record = Self::find(&inner, session, id)?;
        if record.kind != Kind::Pane || record.state == State::Ended {
            return Err(WireError::new(
                ErrorCode::NotRunning,
                format!("{id} is not a running pane: only panes (--pty) have a size"),
            ));
        }
        let Some(live) = inner.live.get(&record.row) else {
            return Err(self.not_running_now(&record, id, "resize it"));
        };
        // The bytes written so far were written at the old size: a screen rebuilt from
        // the log switches size at this offset.
        let dir = Path::new(&record.job_dir);
        let at = output::log_len(&output::log_path(&record.job_dir));
        let old = (record.cols.unwrap_or(120), record.rows.unwrap_or(40));
        record_size(dir, at, old, (cols, rows)).map_err(|e| {
            WireError::internal(format!(
                "could not record the resize of {id} in {}: {e}",
                dir.display()
            ))
        })?;
        crate::daemon::sent(id, live.handle.send(ToSupervisor::Resize { cols, rows }))?;
        inner.store.set_size(record.row, cols, rows)?;
        let message = match self.item_as(session, &record).host_unreachable {
            Some(why) => format!(
                "the resize of {id} to {cols}x{rows} is queued: {why}; it is carried out \
                 when the host answers"
            ),
            None => format!("{id} resized to {cols}x{rows}"),
        };
        Ok(Ack { ok: true, message })
    }
}

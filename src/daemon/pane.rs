//! Panes: a job's visible screen (`read --screen`) and resizing its terminal.
//!
//! How it works: the screen is a vt100 terminal emulator fed with the pane's log, from
//! where it was last fed to the log's end, so a read costs only the new bytes. The
//! emulator lives in the daemon (one per pane read so far) and is rebuilt from the log
//! after a restart, so it is right whether or not the daemon saw the bytes arrive.

use super::Daemon;
use crate::output;
use crate::wire::control::ToSupervisor;
use crate::wire::{Ack, ErrorCode, Kind, ReadReply, State, WireError};

/// How much of a log one step of feeding the emulator reads.
const FEED_CHUNK: u64 = 1 << 20;

pub(crate) struct Screen {
    parser: vt100::Parser,
    fed: u64,
}

impl Daemon {
    /// The visible screen of a pane, as text.
    pub(crate) fn screen(&self, session: &str, id: &str) -> Result<ReadReply, WireError> {
        let mut inner = self.lock();
        let record = Self::find(&inner, session, id)?;
        if record.kind != Kind::Pane {
            return Err(WireError::bad_request(format!(
                "{id} has no screen: it was started without --pty; `bgwork read {id}` shows its output"
            )));
        }
        let path = output::log_path(&record.job_dir);
        let len = output::log_len(&path);
        let dropped = inner.dropped(&record);
        let (rows, cols) = (record.rows.unwrap_or(40), record.cols.unwrap_or(120));
        let head = self.config.log_head;
        let screen = inner.screens.entry(record.row).or_insert_with(|| Screen {
            parser: vt100::Parser::new(rows, cols, 0),
            fed: 0,
        });
        while screen.fed < len {
            let to = len.min(screen.fed + FEED_CHUNK);
            let (bytes, _) = output::read_range(&path, screen.fed, to, head, dropped);
            screen.parser.process(&bytes);
            screen.fed = to;
        }
        let text = screen.parser.screen().contents();
        let shown = super::items::display_id(session, &record);
        Ok(ReadReply {
            id: shown.clone(),
            running: record.state != State::Ended,
            output: text,
            from: 0,
            to: len,
            dropped_bytes: 0,
            clipped: false,
            log_path: path.display().to_string(),
            report: record
                .end
                .map(|end| crate::end::report(&shown, end, record.exit_code, record.signal)),
            output_base64: None,
        })
    }

    pub(crate) fn resize(
        &self,
        session: &str,
        id: &str,
        cols: u16,
        rows: u16,
    ) -> Result<Ack, WireError> {
        if !(2..=1000).contains(&cols) || !(2..=1000).contains(&rows) {
            return Err(WireError::bad_request("--cols and --rows take 2 to 1000"));
        }
        let mut inner = self.lock();
        let record = Self::find(&inner, session, id)?;
        if record.kind != Kind::Pane || record.state == State::Ended {
            return Err(WireError::new(
                ErrorCode::NotRunning,
                format!("{id} is not a running pane: only panes (--pty) have a size"),
            ));
        }
        if let Some(live) = inner.live.get(&record.row) {
            live.handle.send(ToSupervisor::Resize { cols, rows });
        }
        inner.store.set_size(record.row, cols, rows)?;
        if let Some(screen) = inner.screens.get_mut(&record.row) {
            screen.parser.screen_mut().set_size(rows, cols);
        }
        Ok(Ack {
            ok: true,
            message: format!("{id} resized to {cols}x{rows}"),
        })
    }
}

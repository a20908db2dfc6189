//! `wait`: blocks until items end, or a pattern appears in their new output, or the
//! timeout passes. Woken by events, never by polling.

use super::Daemon;
use crate::output;
use crate::paths::now_ms;
use crate::store::Record;
use crate::wire::{State, WaitArgs, WaitReason, WaitReply, WireError};
use regex::Regex;
use std::collections::BTreeMap;
use std::time::Duration;

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(50);
/// The most new output one scan for `--until` reads per item.
const SCAN_CHUNK: u64 = 1 << 20;

/// Where a `--until` scan of one item stands.
struct Scan {
    row: i64,
    offset: u64,
    partial: Vec<u8>,
}

impl Daemon {
    pub(crate) async fn wait(
        &self,
        session: &str,
        args: &WaitArgs,
    ) -> Result<WaitReply, WireError> {
        if args.ids.is_empty() {
            return Err(WireError::bad_request(
                "wait needs at least one id, e.g. `bgwork wait bg-1`",
            ));
        }
        let until = match &args.until {
            Some(pattern) => Some(Regex::new(pattern).map_err(|e| {
                WireError::bad_request(format!("--until is not a valid regular expression: {e}"))
            })?),
            None => None,
        };
        let timeout = match args.timeout_s {
            Some(s) if s.is_finite() && s >= 0.0 => Duration::from_secs_f64(s.min(86_400.0)),
            Some(_) => return Err(WireError::bad_request("--timeout takes seconds, 0 or more")),
            None => DEFAULT_TIMEOUT,
        };
        let mut ids = args.ids.clone();
        ids.dedup();
        let rows: Vec<i64> = {
            let inner = self.lock();
            let records: Result<Vec<Record>, WireError> = ids
                .iter()
                .map(|id| Self::find(&inner, session, id))
                .collect();
            records?.iter().map(|r| r.row).collect()
        };
        // "New" output is what this session has not read yet, so `send` then
        // `wait --until` cannot miss a reply that came before the wait.
        let mut scans: Vec<Scan> = rows
            .iter()
            .map(|&row| Scan {
                row,
                offset: self.unread_from(session, row),
                partial: Vec::new(),
            })
            .collect();
        let mut matched = None;
        let mut reason = WaitReason::Timeout;
        self.wait_for(timeout, |daemon| {
            if let Some(regex) = &until {
                if let Some(line) = scans.iter_mut().find_map(|scan| daemon.scan(scan, regex)) {
                    matched = Some(line);
                    reason = WaitReason::Matched;
                    return true;
                }
            }
            let ended = rows.iter().filter(|&&row| daemon.has_ended(row)).count();
            let done = if args.all {
                ended == rows.len()
            } else {
                ended > 0
            };
            if done {
                reason = WaitReason::Ended;
            }
            done
        })
        .await;
        self.wait_reply(session, &rows, reason, matched)
    }

    fn wait_reply(
        &self,
        session: &str,
        rows: &[i64],
        reason: WaitReason,
        matched: Option<String>,
    ) -> Result<WaitReply, WireError> {
        let mut inner = self.lock();
        let mut items = Vec::new();
        let mut tails = BTreeMap::new();
        for &row in rows {
            let Some(record) = inner.store.get(row)? else {
                continue;
            };
            let dropped = inner.dropped(&record);
            let path = output::log_path(&record.job_dir);
            let item = self.item_as(session, &record);
            tails.insert(
                item.id.clone(),
                output::tail(&path, self.config.log_head, dropped),
            );
            if record.state == State::Ended {
                // The reply carries the end, so its notice has been delivered (when it
                // is this session's: a sub-agent still hears of its own work).
                inner.store.mark_end_notice_seen(row, session, now_ms())?;
            }
            items.push(item);
        }
        Ok(WaitReply {
            reason,
            items,
            matched,
            tails,
        })
    }

    fn unread_from(&self, session: &str, row: i64) -> u64 {
        self.lock().store.cursor(session, row).unwrap_or(0)
    }

    /// Reads the new output of one item and returns the first line matching `regex`.
    fn scan(&self, scan: &mut Scan, regex: &Regex) -> Option<String> {
        let (path, dropped) = {
            let inner = self.lock();
            let record = inner.store.get(scan.row).ok()??;
            let dropped = inner.dropped(&record);
            (output::log_path(&record.job_dir), dropped)
        };
        let len = output::log_len(&path);
        while scan.offset < len {
            let to = len.min(scan.offset + SCAN_CHUNK);
            let (bytes, _) =
                output::read_range(&path, scan.offset, to, self.config.log_head, dropped);
            scan.offset = to;
            scan.partial.extend_from_slice(&bytes);
            let complete = scan
                .partial
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |i| i + 1);
            let lines: Vec<u8> = scan.partial.drain(..complete).collect();
            if scan.partial.len() > SCAN_CHUNK as usize {
                scan.partial.clear();
            }
            let text = output::readable(&lines);
            if let Some(line) = text.lines().find(|line| regex.is_match(line)) {
                return Some(line.to_string());
            }
        }
        let partial = output::readable(&scan.partial);
        regex.is_match(&partial).then_some(partial)
    }
}

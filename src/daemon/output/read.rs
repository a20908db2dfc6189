//! `read`: an item's output since this session's last read (a durable cursor), or a
//! chosen range. Never blocks.
//!
//! A reply holds at most [`MAX_READ_BYTES`] of output (larger ranges are read in pages
//! with `--from`). The log is read and the reply encoded on a blocking thread, without
//! the daemon's lock, so a big read delays no other client.

use crate::daemon::{Answer, Daemon, BIG_REPLY};
use crate::output;
use crate::redact;
use crate::wire::{self, ReadArgs, ReadReply, State, WireError};
use base64::Engine;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex, OnceLock};

/// What a reader is told of output a full disk kept out of the log.
pub(crate) fn unwritten_line(unwritten: u64) -> String {
    format!("[... {unwritten} bytes could not be written: disk full ...]")
}

/// How far back `--tail N` looks for its lines.
const TAIL_WINDOW: u64 = 1 << 20;
/// The default size of a `--raw` read (raw bytes are returned consecutively).
const RAW_MAX_BYTES: usize = 8 << 20;
/// The most output one reply carries.
pub(crate) const MAX_READ_BYTES: usize = 16 << 20;
/// Threads that build big replies (as many as may be built at once).
const BUILDER_THREADS: usize = crate::daemon::BIG_REPLIES;

/// What a read takes from the records, under the lock.
struct Plan {
    id: String,
    row: i64,
    path: PathBuf,
    len: u64,
    dropped: u64,
    from: u64,
    by_cursor: bool,
    running: bool,
    live: Option<String>,
    report: Option<String>,
    /// Output a full disk kept out of the log, and the offset where it was lost.
    unwritten: (u64, u64),
    /// The job folder whose processes are looked at (a running job), and whether
    /// their ports are looked for.
    observe: Option<(PathBuf, bool)>,
    /// What an ended job cost.
    cpu_ms: Option<u64>,
    peak_rss: Option<u64>,
    /// While the job's host cannot be reached: since when, and ssh's words.
    host_unreachable: Option<String>,
}

impl Daemon {
    /// The reply to `read`, encoded (the cursor moves when it reads by cursor). A reply
    /// that says the item ended shows its end: it delivers the end's notice, claimed
    /// for the connection `token`, once written (contract §4).
    pub(crate) async fn read(
        self: &Arc<Self>,
        session: &str,
        args: ReadArgs,
        token: i64,
    ) -> Answer {
        let max = match read_size(&args) {
            Ok(max) => max,
            Err(e) => return wire::encode_result::<()>(&Err(e)).into(),
        };
        let permit = if max > BIG_REPLY {
            self.big_reply_permit().await
        } else {
            None
        };
        let plan = match self.read_plan(session, &args) {
            Ok(plan) => plan,
            Err(e) => return wire::encode_result::<()>(&Err(e)).into(),
        };
        let head = self.config.log_head;
        let (session, row, by_cursor) = (session.to_string(), plan.row, plan.by_cursor);
        let shows_end = !plan.running;
        let build = move || {
            let (reply, frame) = build_reply(plan, &args, max, head);
            let to = reply.to;
            (framed(&reply, frame), to)
        };
        let built = if permit.is_some() {
            in_background(build).await
        } else {
            tokio::task::spawn_blocking(build)
                .await
                .map_err(|e| e.to_string())
        };
        let (line, deliver) = match built {
            Ok((line, to)) => {
                if by_cursor {
                    if let Err(e) = self.lock().store.set_cursor(&session, row, to) {
                        return wire::encode_result::<()>(&Err(WireError::from(e))).into();
                    }
                }
                let deliver = match shows_end {
                    true => self.claim_shown_ends(&session, token, &[row]),
                    false => Vec::new(),
                };
                (line, deliver)
            }
            Err(e) => (
                wire::encode_result::<()>(&Err(WireError::internal(format!(
                    "the read failed: {e}"
                )))),
                Vec::new(),
            ),
        };
        Answer {
            line,
            deliver,
            permit,
        }
    }

    fn read_plan(&self, session: &str, args: &ReadArgs) -> Result<Plan, WireError> {
        let inner = self.lock();
        let record = Self::find(&inner, session, &args.id)?;
        let path = output::log_path(&record.job_dir);
        let len = output::log_len(&path);
        let by_cursor = args.from.is_none() && !args.all && args.tail.is_none();
        let from = match (args.from, args.all, args.tail) {
            (Some(from), _, _) => from.min(len),
            (None, true, _) => 0,
            (None, false, Some(_)) => len.saturating_sub(TAIL_WINDOW),
            (None, false, None) => inner.store.cursor(session, record.row)?.min(len),
        };
        let item = self.item_as(session, &record);
        Ok(Plan {
            id: crate::daemon::display_id(session, &record),
            row: record.row,
            dropped: inner.dropped(&record),
            path,
            len,
            from,
            by_cursor,
            running: record.state != State::Ended,
            live: item.not_running_words(),
            report: item.report,
            host_unreachable: item.host_unreachable,
            unwritten: inner.unwritten(&record),
            observe: (record.state != State::Ended
                && record.kind != crate::wire::Kind::Monitor
                && !record.job_dir.is_empty())
            .then(|| (PathBuf::from(&record.job_dir), self.config.ports)),
            cpu_ms: record.cpu_ms,
            peak_rss: record.peak_rss,
        })
    }
}

/// Runs `work` on one of the threads that build big replies. They run at a low
/// priority (nice 10), so building takes the CPU that the daemon's other clients
/// leave; they are kept, so their memory is reused from one reply to the next.
pub(crate) async fn in_background<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    type Job = Box<dyn FnOnce() + Send>;
    static BUILDERS: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let builders = BUILDERS.get_or_init(|| {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for n in 0..BUILDER_THREADS {
            let queue = queue.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("bgwork-reply-{n}"))
                .spawn(move || {
                    let tid = nix::unistd::gettid().as_raw();
                    // SAFETY: setpriority only reads its arguments; on Linux it applies
                    // to the one thread `tid`.
                    unsafe {
                        nix::libc::setpriority(nix::libc::PRIO_PROCESS, tid as nix::libc::id_t, 10)
                    };
                    loop {
                        let job = queue.lock().unwrap_or_else(|p| p.into_inner()).recv();
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                });
            if let Err(e) = spawned {
                crate::note!("bgwork daemon: could not start a reply thread: {e}");
            }
        }
        Mutex::new(jobs)
    });
    let (done, result) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = done.send(work());
    });
    builders
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send(job)
        .map_err(|_| "no thread builds replies".to_string())?;
    result
        .await
        .map_err(|_| "the reply's thread failed".to_string())
}

/// The size a read may reach: its `--max-bytes` (at least 64) or the default, refused
/// past [`MAX_READ_BYTES`].
fn read_size(args: &ReadArgs) -> Result<usize, WireError> {
    let default = if args.raw {
        RAW_MAX_BYTES
    } else {
        output::DEFAULT_MAX_BYTES
    };
    let max = args.max_bytes.unwrap_or(default).max(64);
    if max > MAX_READ_BYTES {
        return Err(WireError::bad_request(format!(
            "--max-bytes {max} is over the cap of {MAX_READ_BYTES} bytes (16 MiB) per reply: \
             read a larger range in pages, each with --from set to the `to` of the one before \
             (e.g. `bgwork read {} --raw --from 0 --max-bytes {MAX_READ_BYTES}`)",
            args.id
        )));
    }
    Ok(max)
}

/// The reply's line, and its output after it as a frame when it has one. The line is
/// put in front of the frame's own buffer (grown in place), so a megabyte of output is
/// not copied into another one.
fn framed(reply: &ReadReply, frame: Option<Vec<u8>>) -> Vec<u8> {
    let line = wire::encode_line(reply);
    match frame {
        Some(mut bytes) => {
            bytes.splice(0..0, line);
            bytes
        }
        None => line,
    }
}

/// Reads the log and builds the reply (on a blocking thread); with `output_frame`, the
/// output is returned beside the reply (whose `output_bytes` says its length).
fn build_reply(plan: Plan, args: &ReadArgs, max: usize, head: u64) -> (ReadReply, Option<Vec<u8>>) {
    let Plan {
        path,
        len,
        dropped,
        from,
        ..
    } = plan;
    // The dropped middles are the log's holes, read from the file (`output::Holes`):
    // the figure reported may be behind a hole just punched, and a mirror's holes lie
    // where the host's cap and the mirror's pace put them, not at this daemon's head.
    // A tail shows the newest lines: when a dropped middle lies inside its window, the
    // window starts after the last one (lines before a gap are not the last lines, and
    // no marker stands above lines that follow one another).
    let from = match args.tail {
        Some(_) => output::last_gap_end(&path, from, len, head, dropped).unwrap_or(from),
        _ => from,
    };
    // Text of a running item stops before a character or escape sequence whose rest
    // has not arrived, so no read shows half of one (the next read has it).
    let len = if plan.running && !args.raw {
        output::text_end(&path, from, len, head, dropped)
    } else {
        len
    };
    let log = output::LogView {
        path: &path,
        len: plan.len,
        head,
        dropped,
    };
    let (to, output, clipped, skipped) = if args.raw {
        // Raw bytes are never clipped in the middle: a read returns up to `max`
        // consecutive bytes and the next read goes on from `to`. It never crosses a
        // dropped middle: it stops where one begins, and one from inside it returns no
        // bytes and goes on from where it ends (so the bytes of a reply are always
        // those of `[from + dropped_bytes, to)`, whatever the cap does).
        let next = output::data_in(&path, from, len, head, dropped);
        let in_gap = from < len && next.as_ref().is_none_or(|data| data.start > from);
        let to = match &next {
            _ if !in_gap => next.map_or(len, |data| data.end).min(from + max as u64),
            Some(data) => data.start,
            None => len,
        };
        // Known values were masked in the log itself; token shapes are masked here,
        // raw or not, unless the person asked to see them, and no page cuts one.
        let (cut, to) = match (args.no_redact, in_gap) {
            (true, _) | (_, true) => (0, to),
            (false, false) => log.token_edges(from, to, plan.running),
        };
        let (bytes, skipped_here, to) = match in_gap {
            true => (Vec::new(), to - from, to),
            false => {
                let start = from + cut;
                let mut bytes = output::read_span(&path, start, to);
                // The cap may have dropped more while this was read: the front of the
                // bytes that is a hole now is left out (never its zeros), so the bytes
                // are still the last of the range; a hole made at their end (a mirror
                // that passed over a middle its host dropped) ends them.
                match output::data_in(&path, start, to, head, dropped) {
                    Some(data) if data.start == start && data.end >= to => (bytes, 0, to),
                    Some(data) => {
                        bytes.truncate((data.end - start) as usize);
                        let lost = (data.start - start) as usize;
                        let kept = bytes.get(lost..).unwrap_or_default().to_vec();
                        (kept, lost as u64, data.end)
                    }
                    None => (Vec::new(), to - start, to),
                }
            }
        };
        let bytes = match args.no_redact {
            true => bytes,
            false => {
                let mut shown = match cut {
                    0 => Vec::new(),
                    _ => redact::CUT_TOKEN.as_bytes().to_vec(),
                };
                shown.extend_from_slice(&redact::mask_shapes_shown(&bytes));
                shown
            }
        };
        // A raw read never crosses a hole: what it skipped is all it did not show.
        let skipped = skipped_here;
        let output = match args.output_frame {
            true => Output::Frame(bytes),
            false => Output::Base64(
                base64::engine::general_purpose::STANDARD.encode(&bytes),
                String::from_utf8_lossy(&bytes).into_owned(),
            ),
        };
        (to, output, to < len, skipped)
    } else {
        let (cut, len) = match args.no_redact {
            true => (0, len),
            false => log.token_edges(from, len, plan.running),
        };
        // What the holes held before the log is read (the cap only adds to them: more
        // while it is read is in the excerpt's own count).
        let dropped_before = output::dropped_now(&path, from, len, head, dropped);
        let excerpt = output::excerpt(&path, from + cut, len, head, dropped, max);
        let excerpt_skipped = excerpt.skipped;
        let (mut text, clipped) = excerpt.into_text(max, &path, !args.no_redact);
        if cut > 0 {
            text = format!("{}{text}", redact::CUT_TOKEN);
        }
        if let Some(n) = args.tail {
            text = output::last_lines(&text, n);
        }
        let skipped = dropped_before.max(excerpt_skipped);
        if skipped > 0 {
            text = format!(
                "[... {skipped} bytes dropped by the log cap (the first and newest bytes are kept) ...]\n{text}"
            );
        }
        (len, Output::Text(text), clipped, skipped)
    };
    // Output that a full disk kept out of the log is said where it was lost.
    let (unwritten, unwritten_at) = plan.unwritten;
    let lost_here = unwritten > 0 && (from..=to).contains(&unwritten_at);
    let (text, base64, frame) = match output {
        Output::Text(text) => {
            let text = match lost_here {
                true => format!("{}\n{text}", unwritten_line(unwritten)),
                false => text,
            };
            match args.output_frame {
                true => (String::new(), None, Some(text.into_bytes())),
                false => (text, None, None),
            }
        }
        Output::Base64(base64, text) => (text, Some(base64), None),
        Output::Frame(bytes) => (String::new(), None, Some(bytes)),
    };
    let skipped = skipped + if lost_here { unwritten } else { 0 };
    let mut reply = ReadReply {
        id: plan.id,
        running: plan.running,
        live: plan.live,
        output: text,
        from,
        to,
        dropped_bytes: skipped,
        clipped,
        log_path: path.display().to_string(),
        folder: path.parent().map(|dir| dir.display().to_string()),
        report: plan.report,
        output_base64: base64,
        output_bytes: frame.as_ref().map(|bytes| bytes.len() as u64),
        cost: crate::wire::Cost::recorded(plan.cpu_ms, plan.peak_rss),
        host_unreachable: plan.host_unreachable,
    };
    if let Some((job_dir, ports)) = &plan.observe {
        crate::daemon::processes::observe_read(&mut reply, job_dir, *ports);
    }
    (reply, frame)
}

/// A read's output as the reply carries it.
enum Output {
    /// Text, in `output`.
    Text(String),
    /// Raw bytes in `output_base64`, and as text in `output`.
    Base64(String, String),
    /// Raw bytes, after the reply's line.
    Frame(Vec<u8>),
}

//! `read --grep`: the lines of an item's kept log that match a regex, with their line
//! numbers, byte offsets and context, without moving the read cursor.
//!
//! This file is the request: its limits checked, its pattern compiled, the records
//! read under the lock, and the search run off it on a reply thread (a reply holds at
//! most `max_matches` matches and about `max_bytes` of text). `search.rs` goes through
//! the log; `shown.rs` is how a line is shown in a reply.

mod search;
mod shown;

use crate::daemon::{Answer, Daemon};
use crate::output;
use crate::wire::{self, GrepReply, ReadArgs, State, WireError};
use regex::{bytes, Regex, RegexBuilder};
use std::path::PathBuf;
use std::sync::Arc;

pub(crate) use search::{Found, Search};

/// Matches a reply carries unless the caller says otherwise, and at most.
pub(crate) const DEFAULT_MATCHES: usize = 1000;
const MAX_MATCHES: usize = 10_000;
/// Text a reply carries unless the caller says otherwise (`max_bytes`).
pub(crate) const DEFAULT_TEXT: usize = 1 << 20;
/// The most context lines asked for.
const MAX_CONTEXT: usize = 100;
/// The most a regex may take once compiled (a huge alternation is refused, not
/// compiled for seconds), and the longest pattern.
const REGEX_SIZE: usize = 8 << 20;
const MAX_PATTERN: usize = 64 << 10;

/// A search pattern, compiled for text (a line as `read` shows it) and for bytes (a
/// plain stretch of the log, searched where it lies: no copy, no UTF-8 check again).
pub(crate) struct Pattern {
    text: Regex,
    bytes: bytes::Regex,
}

/// Compiles a search pattern, or says what is wrong with it.
pub(crate) fn compile(pattern: &str) -> Result<Pattern, WireError> {
    if pattern.len() > MAX_PATTERN {
        return Err(WireError::bad_request(format!(
            "--grep: the regex is {} bytes long, over the limit of {MAX_PATTERN}: search for \
             fewer alternatives at once",
            pattern.len()
        )));
    }
    let refused = |e: regex::Error| match e {
        regex::Error::CompiledTooBig(limit) => WireError::bad_request(format!(
            "--grep: the regex is too large once compiled (over {limit} bytes): make it \
             simpler (fewer alternatives, smaller repetition counts such as {{1000}}, \
             or ASCII classes like [0-9] or (?-u:\\w) in place of Unicode ones)"
        )),
        e => WireError::bad_request(format!("--grep is not a valid regular expression: {e}")),
    };
    let text = RegexBuilder::new(pattern)
        .multi_line(true)
        .size_limit(REGEX_SIZE)
        .dfa_size_limit(REGEX_SIZE)
        .build()
        .map_err(refused)?;
    let bytes = bytes::RegexBuilder::new(pattern)
        .multi_line(true)
        .size_limit(REGEX_SIZE)
        .dfa_size_limit(REGEX_SIZE)
        .build()
        .map_err(refused)?;
    Ok(Pattern { text, bytes })
}

/// Checks the numbers of a grep request.
fn limits(args: &ReadArgs) -> Result<(usize, usize, usize), WireError> {
    if args.raw || args.screen || args.all || args.tail.is_some() {
        return Err(WireError::bad_request(
            "--grep searches the whole kept log and returns lines: it does not combine with \
             --raw, --screen, --all or --tail (use --from to start further on)",
        ));
    }
    let context = args.context.unwrap_or(0);
    if context > MAX_CONTEXT {
        return Err(WireError::bad_request(format!(
            "--context {context} is over the limit of {MAX_CONTEXT} lines"
        )));
    }
    let matches = args.max_matches.unwrap_or(DEFAULT_MATCHES);
    if matches == 0 || matches > MAX_MATCHES {
        return Err(WireError::bad_request(format!(
            "--max-matches {matches}: give 1 to {MAX_MATCHES}"
        )));
    }
    let text = args.max_bytes.unwrap_or(DEFAULT_TEXT).max(64);
    if text > crate::daemon::output::read::MAX_READ_BYTES {
        return Err(WireError::bad_request(format!(
            "--max-bytes {text} is over the cap of {} bytes per reply: narrow the regex, \
             or go on with --from",
            crate::daemon::output::read::MAX_READ_BYTES
        )));
    }
    Ok((context, matches, text))
}

/// What a search takes from the records, under the lock.
struct Plan {
    id: String,
    path: PathBuf,
    len: u64,
    dropped: u64,
    running: bool,
}

impl Daemon {
    /// The reply to `read --grep`, encoded; the cursor does not move.
    pub(crate) async fn grep(self: &Arc<Self>, session: &str, args: ReadArgs) -> Answer {
        let failed = |e: WireError| -> Answer { wire::encode_result::<()>(&Err(e)).into() };
        let (context, max_matches, max_text) = match limits(&args) {
            Ok(limits) => limits,
            Err(e) => return failed(e),
        };
        let plan = {
            let inner = self.lock();
            match Self::find(&inner, session, &args.id) {
                Ok(record) => {
                    let path = output::log_path(&record.job_dir);
                    Plan {
                        id: crate::daemon::display_id(session, &record),
                        len: output::log_len(&path),
                        path,
                        dropped: inner.dropped(&record),
                        running: record.state != State::Ended,
                    }
                }
                Err(e) => return failed(e),
            }
        };
        // Every search may read the whole log: it waits its turn with the big reads.
        let permit = self.big_reply_permit().await;
        let head = self.config.log_head;
        let pattern = args.grep.unwrap_or_default();
        let from = args.from.unwrap_or(0);
        let redact = !args.no_redact;
        let build = move || -> Result<GrepReply, WireError> {
            let regex = compile(&pattern)?;
            let from = from.min(plan.len);
            let gap = head..head + plan.dropped;
            let search = Search {
                regex: &regex,
                from,
                to: plan.len,
                gap: gap.clone(),
                context,
                max_matches,
                max_text,
                redact,
            };
            let found = match plan.len {
                0 => Ok(Found {
                    to: from,
                    ..Found::default()
                }),
                _ => output::open_log(&plan.path).and_then(|file| search.run(&file)),
            }
            .map_err(|e| {
                WireError::internal(format!(
                    "the log of {} ({}) could not be searched: {e}",
                    plan.id,
                    plan.path.display()
                ))
            })?;
            let message = found.stopped_by.map(|why| {
                format!(
                    "more matches: {why}; narrow the regex or go on with --from {}",
                    found.next_from.unwrap_or(found.to)
                )
            });
            Ok(GrepReply {
                id: plan.id,
                running: plan.running,
                matches: found.matches,
                truncated: found.truncated,
                next_from: found.next_from,
                from,
                to: found.to,
                dropped_bytes: found.skipped,
                log_path: plan.path.display().to_string(),
                message,
            })
        };
        let line =
            match crate::daemon::output::read::in_background(move || wire::encode_result(&build()))
                .await
            {
                Ok(line) => line,
                Err(e) => wire::encode_result::<()>(&Err(WireError::internal(format!(
                    "the search failed: {e}"
                )))),
            };
        Answer {
            line,
            deliver: Vec::new(),
            permit,
        }
    }
}

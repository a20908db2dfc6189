//! `run`: a foreground run with a deadline. It ends in time (its output and status), or
//! it is promoted to a background job when the session has room, or killed when not.
//!
//! The job is an ordinary job record from its first byte, so promotion loses nothing:
//! the output is all in its log, and its notice (if armed) fires as for any job.

use super::jobs::Launch;
use super::Daemon;
use crate::output;
use crate::wire::control::ToSupervisor;
use crate::wire::{self, Actor, Chunk, RunArgs, RunOutcome, RunReply, State, WireError};
use std::future::Future;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedWriteHalf;

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a killed run may take to be gone.
const KILL_WAIT: Duration = Duration::from_secs(3);

/// Where streamed output goes, and how to notice the caller has gone.
pub(crate) struct Stream<'a, G> {
    pub writer: &'a mut OwnedWriteHalf,
    pub gone: G,
}

impl Daemon {
    /// Runs without streaming: the reply carries the output. A run that ended is
    /// added to `ends_shown` (its notice is delivered with the reply).
    pub(crate) async fn run(
        &self,
        session: &str,
        args: RunArgs,
        ends_shown: &mut Vec<i64>,
    ) -> Result<RunReply, WireError> {
        let no_stream = None::<Stream<'_, std::future::Pending<()>>>;
        self.run_streaming(session, args, no_stream, ends_shown)
            .await
    }

    pub(crate) async fn run_streaming<G: Future<Output = ()>>(
        &self,
        session: &str,
        args: RunArgs,
        stream: Option<Stream<'_, G>>,
        ends_shown: &mut Vec<i64>,
    ) -> Result<RunReply, WireError> {
        let timeout = match args.timeout_s {
            Some(s) if s.is_finite() && s >= 0.0 => Duration::from_secs_f64(s.min(86_400.0)),
            Some(_) => return Err(WireError::bad_request("--timeout takes seconds, 0 or more")),
            None => DEFAULT_TIMEOUT,
        };
        let launch = Launch {
            over_limit: true,
            ..Launch::default()
        };
        let row = self.launch(session, &args.start, launch).await?;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut shown = 0;
        match stream {
            Some(Stream { writer, gone }) => {
                tokio::pin!(gone);
                loop {
                    let grew = |d: &Daemon| d.has_ended(row) || d.log_len_of(row) > shown;
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    tokio::select! {
                        _ = self.wait_for(left, grew) => {}
                        _ = &mut gone => {
                            // The caller went away from a foreground run: stop it, as a
                            // terminal's Ctrl-C would.
                            self.stop_now(row, Duration::from_secs(2));
                            return Err(WireError::bad_request("the caller went away"));
                        }
                    }
                    let len = self.log_len_of(row);
                    if len > shown {
                        let text = self.text_between(row, shown, len);
                        shown = len;
                        let line = wire::encode_line(&Chunk { chunk: text });
                        if writer.write_all(&line).await.is_err() {
                            self.stop_now(row, Duration::from_secs(2));
                            return Err(WireError::bad_request("the caller went away"));
                        }
                    }
                    if self.has_ended(row) || tokio::time::Instant::now() >= deadline {
                        break;
                    }
                }
            }
            None => {
                self.wait_for(timeout, |d| d.has_ended(row)).await;
            }
        }
        let reply = self.finish_run(session, row, shown, timeout).await?;
        if reply.outcome == RunOutcome::Ended {
            ends_shown.push(row);
        }
        Ok(reply)
    }

    async fn finish_run(
        &self,
        session: &str,
        row: i64,
        shown: u64,
        timeout: Duration,
    ) -> Result<RunReply, WireError> {
        let outcome = if self.has_ended(row) {
            RunOutcome::Ended
        } else {
            let inner = self.lock();
            let running = Self::counted(&inner, session)?.len();
            if running <= self.config.max_running {
                RunOutcome::Promoted
            } else {
                RunOutcome::Killed
            }
        };
        if outcome == RunOutcome::Killed {
            self.stop_now(row, Duration::ZERO);
            self.wait_for(KILL_WAIT, |d| d.has_ended(row)).await;
        }
        let len = self.log_len_of(row);
        let output = self.text_between(row, shown, len);
        let mut inner = self.lock();
        inner.store.set_cursor(session, row, len)?;
        let record = inner
            .store
            .get(row)?
            .ok_or_else(|| WireError::internal("record vanished"))?;
        let item = self.item(&record);
        let seconds = timeout.as_secs_f64();
        let message = match outcome {
            RunOutcome::Ended => item.report.clone().unwrap_or_default(),
            RunOutcome::Promoted => format!(
                "{} still runs after {seconds} s: promoted to the background (`bgwork read {}`, `bgwork wait {}`)",
                item.id, item.id, item.id
            ),
            RunOutcome::Killed => format!(
                "{} ran past {seconds} s and was killed: the session is at its limit of {} running items",
                item.id, self.config.max_running
            ),
        };
        debug_assert!(outcome != RunOutcome::Ended || record.state == State::Ended);
        Ok(RunReply {
            outcome,
            item,
            output,
            message,
        })
    }

    /// Asks a job's supervisor to stop it now (TERM, KILL after `grace`).
    fn stop_now(&self, row: i64, grace: Duration) {
        let mut inner = self.lock();
        if let Some(live) = inner.live.get(&row) {
            live.handle.send(ToSupervisor::Stop {
                grace_ms: grace.as_millis() as u64,
                actor: Actor::Agent,
            });
        }
        let _ = inner.store.set_stop_actor(row, Actor::Agent);
    }

    pub(crate) fn log_len_of(&self, row: i64) -> u64 {
        let inner = self.lock();
        match inner.store.get(row) {
            Ok(Some(record)) => output::log_len(&output::log_path(&record.job_dir)),
            _ => 0,
        }
    }

    /// Readable text of `[from, to)` of a job's log, clipped to the default size.
    fn text_between(&self, row: i64, from: u64, to: u64) -> String {
        let inner = self.lock();
        let Ok(Some(record)) = inner.store.get(row) else {
            return String::new();
        };
        let dropped = inner.dropped(&record);
        let path = output::log_path(&record.job_dir);
        let max = output::DEFAULT_MAX_BYTES;
        let excerpt = output::excerpt(&path, from, to, self.config.log_head, dropped, max);
        excerpt.render(max, &path).0
    }
}

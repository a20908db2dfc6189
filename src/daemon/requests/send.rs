//! `send`: input for a running job's stdin, taken or refused whole by its supervisor.

use crate::daemon::Daemon;
use crate::executor::WriteRefused;
use crate::wire::control::ToSupervisor;
use crate::wire::{Ack, ErrorCode, Kind, SendArgs, State, WireError};
use std::time::Duration;

/// How long `send` waits for a supervisor to confirm that it took the input.
const INPUT_ANSWER: Duration = Duration::from_secs(10);

impl Daemon {
    /// Writes to a job's stdin; answers once its supervisor has taken the bytes.
    pub(crate) async fn send(&self, session: &str, args: &SendArgs) -> Result<Ack, WireError> {
        let id = &args.id;
        let (record, handle) = {
            let inner = self.lock();
            let record = Self::find(&inner, session, id)?;
            if record.kind == Kind::Monitor {
                return Err(WireError::new(
                    ErrorCode::NoInput,
                    format!("{id} is a monitor and takes no input: `bgwork stop {id}` ends it"),
                ));
            }
            if record.state == State::Ended {
                return Err(WireError::new(
                    ErrorCode::NotRunning,
                    format!("{id} has ended and takes no input: start it again to send it input"),
                ));
            }
            if record.state == State::Waiting {
                let what = self.waiting.get(record.row).unwrap_or_default();
                return Err(WireError::new(
                    ErrorCode::NoInput,
                    format!(
                        "{id} waits for {what} and runs nothing yet: nothing was sent; send it \
                         input once it runs"
                    ),
                ));
            }
            if record.restarting() {
                return Err(self.not_running_now(&record, id, "send it input or keys"));
            }
            let live = inner
                .live
                .get(&record.row)
                .ok_or_else(|| self.not_running_now(&record, id, "send it input or keys"))?;
            if live.input_closed {
                return Err(no_input(id));
            }
            // Neither input nor a key waits for a job that has not started (a key left
            // for it would reach it the moment it starts).
            let queued = record.state == State::Starting
                && self.executors.which(record.row, &record.job_dir).queues();
            if queued {
                return Err(WireError::new(
                    ErrorCode::NoInput,
                    format!(
                        "{id} has not started yet (it waits in its scheduler's queue: `bgwork \
                         list` shows why): nothing was sent; send it input or keys once it runs"
                    ),
                ));
            }
            (record, live.handle.clone())
        };
        let mut commands = Vec::new();
        let data = crate::keys::unescape(&args.text)?;
        if !data.is_empty() {
            commands.push(ToSupervisor::Input { data });
        }
        for key in &args.keys {
            commands.push(match record.kind {
                Kind::Pane => ToSupervisor::Input {
                    data: crate::keys::key_bytes(key)?,
                },
                _ => crate::keys::plain_job_key(key)?,
            });
        }
        let mut sent = 0;
        for command in commands {
            match command {
                ToSupervisor::Input { data } => {
                    let len = data.len();
                    let taken = tokio::time::timeout(INPUT_ANSWER, handle.write(data)).await;
                    match taken {
                        Ok(Ok(_)) => sent += len,
                        Ok(Err(WriteRefused::Closed)) => return Err(no_input(id)),
                        // A bound, not a refusal for good: the same bytes may be taken
                        // once the job reads.
                        Ok(Err(WriteRefused::Full(reason))) => {
                            return Err(WireError::new(
                                ErrorCode::Limit,
                                format!("{id} did not take the input ({sent} bytes sent before): {reason}; send it again once it reads (`bgwork read {id}`)"),
                            ))
                        }
                        Ok(Err(reason)) => {
                            return Err(WireError::new(
                                ErrorCode::NoInput,
                                format!("{id} did not take the input ({sent} bytes sent before): {reason}"),
                            ))
                        }
                        Err(_) => {
                            return Err(WireError::new(
                                ErrorCode::Unavailable,
                                format!(
                                    "{id}'s supervisor did not confirm the input within {} s (it may be stopped or very busy; {sent} bytes were confirmed before): the input is on its way and may still arrive, so `bgwork read {id}` before sending it again",
                                    INPUT_ANSWER.as_secs()
                                ),
                            ))
                        }
                    }
                }
                other => crate::daemon::sent(id, handle.send(other))?,
            }
        }
        Ok(Ack {
            ok: true,
            message: format!("sent to {id}"),
        })
    }
}

fn no_input(id: &str) -> WireError {
    WireError::new(
        ErrorCode::NoInput,
        format!("{id} has no input: its stdin is closed; a pane (--pty) takes keystrokes"),
    )
}

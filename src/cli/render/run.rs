//! `run`: its output streamed to stdout, stdin passed on, and its end as the exit code.

use super::terminal::{inert, inert_lines};
use crate::client::Client;
use crate::wire::{self, Envelope, Request, RunOutcome, RunReply, WireError};
use base64::Engine;
use std::io::Write;
use std::process::ExitCode;

/// `run`: streams output chunks, then exits with the command's own status when it
/// ended in time, 0 when it was promoted, 1 when it was killed.
pub(super) fn run(
    client: &mut Client,
    envelope: &Envelope,
    json: bool,
) -> Result<ExitCode, WireError> {
    client.send(envelope)?;
    // Stdin frames and a detach frame share one writer, a whole line at a time.
    let writer = std::sync::Arc::new(std::sync::Mutex::new(client.writer()?));
    if matches!(&envelope.request, Request::Run(args) if args.stdin == wire::RunStdin::Forward) {
        let writer = writer.clone();
        std::thread::spawn(move || forward_stdin(&writer));
    }
    let mut out = std::io::stdout();
    // Why stdout could not take the output (a full disk): the run was asked to go on in
    // the background, and nothing more goes to stdout.
    let mut detached: Option<String> = None;
    // Whether the choice of `--timeout auto` was said before the wait.
    let mut said = false;
    // The run's job, once the daemon named it.
    let mut started: Option<String> = None;
    let reply: RunReply = loop {
        let line = match (client.next_line(), &started) {
            (Ok(Some(line)), _) => line,
            // The job lives on under its supervisor; a daemon started by the next call
            // takes it back.
            (Ok(None) | Err(_), Some(id)) => {
                return Err(WireError::new(
                    wire::ErrorCode::Unavailable,
                    format!(
                        "the daemon went away during the run of {id}, which goes on: \
                         `bgwork wait {id}` for its end, `bgwork read {id}` for its output"
                    ),
                ))
            }
            (Ok(None), None) => {
                return Err(WireError::new(
                    wire::ErrorCode::Unavailable,
                    "the daemon closed the connection",
                ))
            }
            (Err(e), None) => return Err(e),
        };
        if let Ok(chunk) = serde_json::from_slice::<wire::Chunk>(&line) {
            // The command's own bytes, as they are (its stdout is this one).
            let bytes = match &chunk.bytes {
                Some(encoded) => base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .unwrap_or_default(),
                None => inert_lines(&chunk.chunk).into_owned().into_bytes(),
            };
            if detached.is_some() {
                continue;
            }
            match out.write_all(&bytes).and_then(|()| out.flush()) {
                Ok(()) => {}
                // Whoever read this stdout went away (`run … | head`): so does the run,
                // and the daemon stops its job as the person's Ctrl-C would.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                    return Ok(ExitCode::from(141))
                }
                // A full disk (or a failing device) is no reader going away: the command
                // goes on in the background, and the caller is told so on stderr.
                Err(e) => {
                    let why = format!("the run's output could not be written to stdout ({e})");
                    let frame = wire::StdinFrame {
                        detach: Some(why.clone()),
                        ..wire::StdinFrame::default()
                    };
                    let mut writer = writer.lock().unwrap_or_else(|p| p.into_inner());
                    let _ = writer.write_all(&wire::encode_line(&frame));
                    detached = Some(why);
                }
            }
            continue;
        }
        if let Ok(first) = serde_json::from_slice::<wire::RunStarted>(&line) {
            if let Some(note) = &first.note {
                // On stderr, `--json` or not: stdout keeps the reply alone.
                eprintln!("[{}]", inert(note));
                said = true;
            }
            started = Some(first.started).filter(|id| !id.is_empty());
            continue;
        }
        break wire::decode_reply(&line)?;
    };
    if detached.is_some() {
        // Stdout takes nothing: the end (or the promotion) is said on stderr.
        eprintln!("bgwork: {}", inert(&reply.message));
        let code = match (reply.outcome, reply.item.exit_code, reply.item.signal) {
            (RunOutcome::Ended, Some(code), _) => code,
            (RunOutcome::Ended, None, Some(signal)) => 128 + signal,
            _ => 1,
        };
        return Ok(ExitCode::from(code.clamp(0, 255) as u8));
    }
    let mut text = match json {
        true => wire::to_json_text(&reply),
        false => inert_lines(&reply.output).into_owned(),
    };
    if json && !text.ends_with('\n') {
        text.push('\n');
    }
    let printed = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    if let Err(e) = printed {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            // A full disk: the reply is lost, which the caller must hear of.
            eprintln!(
                "bgwork: the run's reply could not be written to stdout ({e}): {}",
                inert(&reply.message)
            );
            return Ok(ExitCode::from(1));
        }
    }
    if let (false, false, Some(choice)) = (json, said, &reply.timeout_choice) {
        eprintln!("[{}]", inert(choice));
    }
    if !json && reply.outcome != RunOutcome::Ended {
        eprintln!("[{}]", inert(&reply.message));
    }
    let code = match reply.outcome {
        RunOutcome::Ended => match (reply.item.exit_code, reply.item.signal) {
            (Some(code), _) => code,
            (None, Some(signal)) => 128 + signal,
            (None, None) => 1,
        },
        RunOutcome::Promoted => 0,
        RunOutcome::Killed => 1,
    };
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// Passes this process's stdin on to a run, until it ends (or cannot be read: a closed
/// or unreadable stdin is an ended one), then says end-of-input.
fn forward_stdin(writer: &std::sync::Mutex<std::os::unix::net::UnixStream>) {
    use std::io::Read;
    let mut stdin = std::io::stdin().lock();
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        let n = match stdin.read(&mut buffer) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => 0,
        };
        let frame = wire::StdinFrame {
            stdin: base64::engine::general_purpose::STANDARD.encode(&buffer[..n]),
            eof: n == 0,
            detach: None,
        };
        let mut writer = writer.lock().unwrap_or_else(|p| p.into_inner());
        if writer.write_all(&wire::encode_line(&frame)).is_err() || n == 0 {
            return;
        }
    }
}

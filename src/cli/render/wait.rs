//! `wait` and `read --follow`: calls that wait on the daemon, what they print, and
//! their exit codes.

use super::terminal::{indent, inert, print_text};
use crate::client::Client;
use crate::wire::{
    self, End, Envelope, Item, ReadReply, Request, WaitReason, WaitReply, WireError,
};
use std::io::Write;
use std::process::ExitCode;

/// `wait`: one call, or calls of a day each until something happens (`--timeout
/// none`); prints what happened unless `--quiet`.
pub fn wait(
    paths: &crate::paths::Paths,
    session: &str,
    cmd: crate::cli::options::WaitCmd,
    json: bool,
) -> Result<ExitCode, WireError> {
    use crate::cli::options::Timeout;
    let unlimited = matches!(cmd.timeout, Some(Timeout::Unlimited));
    let args = wire::WaitArgs {
        ids: cmd.ids,
        all: cmd.all,
        until: cmd.until,
        timeout_s: match cmd.timeout {
            Some(Timeout::Seconds(s)) => Some(s),
            Some(Timeout::Unlimited) => Some(86_400.0),
            None => None,
        },
    };
    let envelope = Envelope {
        session: session.to_string(),
        request: Request::Wait(args.clone()),
    };
    let reply: WaitReply = loop {
        let mut client = Client::connect(paths)?;
        let reply: WaitReply = client.call(&envelope)?;
        if !(unlimited && reply.reason == WaitReason::Timeout) {
            break reply;
        }
    };
    if cmd.quiet {
    } else if json {
        print_text(&wire::to_json_text(&reply));
    } else {
        let waited = args.timeout_s.unwrap_or(50.0);
        print_text(&wait_text(&reply, Some(waited), args.until.as_deref()));
    }
    Ok(wait_code(&reply))
}

/// `read --follow`: prints what is new, waits for a new line or the end, and again;
/// once the item has ended, prints its end (on stderr) and exits with its code.
pub fn follow_output(
    paths: &crate::paths::Paths,
    session: &str,
    id: &str,
    max_bytes: Option<usize>,
    no_redact: bool,
    json: bool,
) -> Result<ExitCode, WireError> {
    let call = |request: Request| -> Result<Vec<u8>, WireError> {
        let envelope = Envelope {
            session: session.to_string(),
            request,
        };
        let mut client = Client::connect(paths)?;
        client.send(&envelope)?;
        client.next_line()?.ok_or_else(|| {
            WireError::new(
                wire::ErrorCode::Unavailable,
                "the daemon closed the connection",
            )
        })
    };
    let mut out = std::io::stdout();
    loop {
        let read: ReadReply = wire::decode_reply(&call(Request::Read(wire::ReadArgs {
            id: id.to_string(),
            max_bytes,
            no_redact,
            ..wire::ReadArgs::default()
        }))?)?;
        if json {
            let _ = writeln!(out, "{}", serde_json::to_string(&read).unwrap_or_default());
        } else {
            let _ = out.write_all(read.output.as_bytes());
        }
        let _ = out.flush();
        // Until a new line comes (any line matches) or the item ends.
        let waited: WaitReply = wire::decode_reply(&call(Request::Wait(wire::WaitArgs {
            ids: vec![id.to_string()],
            all: false,
            until: read.running.then(String::new),
            timeout_s: Some(if read.running { 50.0 } else { 0.0 }),
        }))?)?;
        if read.running || waited.reason != WaitReason::Ended {
            continue;
        }
        let item = waited.items.first();
        if let Some(report) = item.and_then(|i| i.report.as_ref()) {
            if !json {
                eprintln!("[{report}]");
            }
        }
        let code = match item.map(|i| (i.exit_code, i.signal, i.end)) {
            Some((Some(code), _, _)) => code,
            Some((None, Some(signal), _)) => 128 + signal,
            Some((None, None, Some(end))) if crate::end::is_failure(end) => 1,
            _ => 0,
        };
        return Ok(ExitCode::from(code.clamp(0, 255) as u8));
    }
}

/// 0 when the items ended well or the pattern matched; 1 on a timeout or a failure.
pub(super) fn wait_code(reply: &WaitReply) -> ExitCode {
    let failed = reply.reason == WaitReason::Timeout
        || reply
            .items
            .iter()
            .any(|i| i.end.is_some_and(crate::end::is_failure) || never_ran(i));
    match failed {
        true => ExitCode::from(1),
        false => ExitCode::SUCCESS,
    }
}

/// A job cancelled while it waited (`start --after`; only a waiting job ends so): what
/// it was to run never ran, which a `wait` on it reports as a failure (a pane closed by
/// its person, also `cancelled`, ran and is not one).
fn never_ran(item: &Item) -> bool {
    item.end == Some(End::Cancelled) && item.kind == wire::Kind::Job
}

pub(super) fn wait_text(reply: &WaitReply, waited_s: Option<f64>, until: Option<&str>) -> String {
    // What has not ended, each as it is: "bg-2 is waiting for bg-1 to succeed".
    let running: Vec<String> = reply
        .items
        .iter()
        .filter(|i| i.report.is_none())
        .map(|i| match i.not_running_words() {
            Some(words) => format!("{} is {}", inert(&i.id), inert(&words)),
            None => inert(&i.id).into_owned(),
        })
        .collect();
    let all_running = reply
        .items
        .iter()
        .all(|i| i.report.is_some() || i.not_running_words().is_none());
    let mut text = match (&reply.reason, &reply.matched) {
        (WaitReason::Matched, Some(line)) => format!("matched: {}\n", inert(line)),
        (WaitReason::Timeout, _) => {
            let mut head = match waited_s {
                Some(s) => format!("timed out after {s} s"),
                None => "timed out".to_string(),
            };
            if let Some(pattern) = until {
                head.push_str(&format!(
                    ": /{}/ was not seen in new output",
                    inert(pattern)
                ));
            }
            match running.as_slice() {
                [] => {}
                many if !all_running => head.push_str(&format!("; {}", many.join("; "))),
                [one] => head.push_str(&format!("; {one} is still running")),
                many => head.push_str(&format!("; {} are still running", many.join(", "))),
            }
            head + "\n"
        }
        _ => String::new(),
    };
    let one = reply.items.len() == 1;
    for item in &reply.items {
        let tail = reply.tails.get(&item.id).filter(|t| !t.is_empty());
        match (&item.report, reply.reason) {
            (Some(report), _) => {
                text.push_str(&inert(report));
                text.push('\n');
            }
            // A timeout already named what still runs; a match names it here.
            (None, WaitReason::Timeout) if one => {}
            (None, WaitReason::Timeout) if tail.is_some() => {
                text.push_str(&format!("{}:\n", inert(&item.id)));
            }
            (None, WaitReason::Timeout) => {}
            (None, _) => text.push_str(&format!(
                "{} is {}\n",
                inert(&item.id),
                inert(&item.live_words().unwrap_or_else(|| "still running".into()))
            )),
        }
        if let Some(tail) = tail {
            text.push_str(&indent(tail));
        }
    }
    text
}

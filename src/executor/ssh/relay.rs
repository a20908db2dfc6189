//! `bgwork ssh-relay`, run on the host by the local daemon over its ssh channel: it
//! says which bgwork it is, then carries each request line `N <envelope>` to the host's
//! own daemon (started when none answers, as any client starts one) and writes its
//! reply as `N <reply line>`; a reply that says `"output_bytes":K` (a `read` asked with
//! `output_frame`) is followed by its K bytes of output, raw, as on the daemon's own
//! socket. Each request is served on a thread of its own, so a slow one (a stop's
//! grace) holds up no other. Its first line also says when the host's logind kills
//! the jobs at logout (`logout.rs`), which then also decides how it starts the daemon.

use crate::client::Client;
use crate::paths::Paths;
use crate::wire::ssh::{RelayHello, RELAY_PROTOCOL};
use crate::wire::{self, Envelope, ErrorReply, WireError};
use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

/// What a logout does here, looked at once when the relay starts.
static LOGOUT: std::sync::OnceLock<super::logout::Logout> = std::sync::OnceLock::new();

pub fn main() -> ExitCode {
    let logout = LOGOUT.get_or_init(super::logout::Logout::look);
    let hello = RelayHello {
        relay: "bgwork".into(),
        version: super::deploy::VERSION.into(),
        protocol: RELAY_PROTOCOL,
        control: wire::control::PROTOCOL,
        logout: logout.warning(&Paths::from_env()),
    };
    let out = Arc::new(Mutex::new(std::io::stdout()));
    {
        let mut out = out.lock().unwrap_or_else(|p| p.into_inner());
        let _ = out.write_all(&wire::encode_line(&hello));
        let _ = out.flush();
    }
    let stdin = std::io::stdin();
    for line in stdin.lock().split(b'\n') {
        let Ok(line) = line else { break };
        let Some(space) = line.iter().position(|&b| b == b' ') else {
            continue;
        };
        let id = String::from_utf8_lossy(&line[..space]).into_owned();
        let body = line[space + 1..].to_vec();
        let out = out.clone();
        std::thread::spawn(move || {
            let (mut reply, frame) = answer(&body);
            if !reply.ends_with(b"\n") {
                reply.push(b'\n');
            }
            let mut framed = format!("{id} ").into_bytes();
            framed.extend_from_slice(&reply);
            let mut out = out.lock().unwrap_or_else(|p| p.into_inner());
            let _ = out.write_all(&framed);
            let _ = out.write_all(&frame);
            let _ = out.flush();
        });
    }
    ExitCode::SUCCESS
}

fn error_line(error: WireError) -> Vec<u8> {
    wire::encode_line(&ErrorReply { error })
}

/// The reply line to one request, and the output frame that follows it (empty when
/// none).
fn answer(body: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let envelope: Envelope = match serde_json::from_slice(body) {
        Ok(envelope) => envelope,
        Err(e) => {
            return (
                error_line(WireError::bad_request(format!("the relay got {e}"))),
                Vec::new(),
            )
        }
    };
    let paths = Paths::from_env();
    let connected = match LOGOUT.get() {
        Some(logout) => logout.connect(&paths),
        None => Client::connect(&paths),
    };
    let mut client = match connected {
        Ok(client) => client,
        Err(e) => return (error_line(e), Vec::new()),
    };
    if let Err(e) = client.send(&envelope) {
        return (error_line(e), Vec::new());
    }
    let line = match client.next_line() {
        Ok(Some(line)) => line,
        Ok(None) => {
            return (
                error_line(WireError::new(
                    wire::ErrorCode::Unavailable,
                    "the host's daemon closed the connection",
                )),
                Vec::new(),
            )
        }
        Err(e) => return (error_line(e), Vec::new()),
    };
    let Some(n) = frame_len(&line) else {
        return (line, Vec::new());
    };
    match client.read_frame(n) {
        Ok(frame) => (line, frame),
        Err(e) => (error_line(e), Vec::new()),
    }
}

/// The length of the output frame a reply line announces (`"output_bytes":K`).
pub fn frame_len(line: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"output_bytes\":";
    line.windows(KEY.len()).position(|w| w == KEY)?;
    let reply: serde_json::Value = serde_json::from_slice(line).ok()?;
    reply["output_bytes"].as_u64()
}

/// Checks the relay's first line: the same bgwork (its hello), or a clear refusal.
pub fn check_hello(host: &str, line: &[u8]) -> Result<RelayHello, String> {
    let hello: RelayHello = serde_json::from_slice(line.trim_ascii()).map_err(|_| {
        format!(
            "{host} did not answer as bgwork's relay (it said {:?}): is BGWORK_REMOTE_BIN a bgwork \
             binary? Its login shell must print nothing for a command",
            String::from_utf8_lossy(&line[..line.len().min(200)]).trim()
        )
    })?;
    let here = super::deploy::VERSION;
    if hello.protocol != RELAY_PROTOCOL
        || hello.control != wire::control::PROTOCOL
        || hello.version != here
    {
        return Err(format!(
            "{host} runs bgwork {} (relay protocol {}, control {}), this is bgwork {here} (relay \
             protocol {RELAY_PROTOCOL}, control {}): refused; unset BGWORK_REMOTE_BIN (bgwork then \
             copies itself there) or install bgwork {here} on the host",
            hello.version,
            hello.protocol,
            hello.control,
            wire::control::PROTOCOL
        ));
    }
    Ok(hello)
}

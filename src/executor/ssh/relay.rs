//! `bgwork ssh-relay`, run on the host by the local daemon over its ssh channel: it
//! says which bgwork it is, then carries each request line `N <envelope>` to the host's
//! own daemon (started when none answers, as any client starts one) and writes its
//! reply as `N <reply line>`; a reply that says `"output_bytes":K` (a `read` asked with
//! `output_frame`) is followed by its K bytes of output, raw, as on the daemon's own
//! socket. Each request is served on a thread of its own, so a slow one (a stop's
//! grace) holds up no other; the connections of requests that only look are kept a
//! few seconds for the next one (`Pool`). Its first line also says when the host's
//! logind kills the jobs at logout (`logout.rs`), which then also decides how it starts
//! the daemon.

use crate::client::Client;
use crate::paths::Paths;
use crate::wire::ssh::{RelayHello, RELAY_PROTOCOL};
use crate::wire::{self, Envelope, ErrorReply, Request, WireError};
use std::io::{BufRead, Write};
use std::os::fd::AsFd;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a connection to the host's daemon is kept unused before it is closed (so a
/// link with no work leaves the daemon free to end when idle), and how many are kept.
const POOL_IDLE: Duration = Duration::from_secs(3);
const POOL_MOST: usize = 32;

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
    // The output frames go to ssh through this pipe: 1 MiB at a time, not 64 KiB.
    let _ = nix::fcntl::fcntl(
        std::io::stdout().as_fd(),
        nix::fcntl::FcntlArg::F_SETPIPE_SZ(1 << 20),
    );
    let out = Arc::new(Mutex::new(std::io::stdout()));
    {
        let mut out = out.lock().unwrap_or_else(|p| p.into_inner());
        let _ = out.write_all(&wire::encode_line(&hello));
        let _ = out.flush();
    }
    let pool = Arc::new(Pool::default());
    {
        let pool = pool.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(POOL_IDLE / 2);
            pool.close_unused();
        });
    }
    let stdin = std::io::stdin();
    for line in stdin.lock().split(b'\n') {
        let Ok(line) = line else { break };
        let Some(space) = line.iter().position(|&b| b == b' ') else {
            continue;
        };
        let id = String::from_utf8_lossy(&line[..space]).into_owned();
        let body = line[space + 1..].to_vec();
        let (out, pool) = (out.clone(), pool.clone());
        std::thread::spawn(move || {
            let (mut reply, frame) = answer(&body, &pool);
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

/// Connections to the host's daemon that served a request and wait for the next one,
/// with when each was last used: the mirror's reads and the ends' waits of a hundred
/// jobs would otherwise each make a connection.
#[derive(Default)]
struct Pool(Mutex<Vec<(Instant, Client)>>);

impl Pool {
    fn take(&self) -> Option<Client> {
        let mut idle = self.0.lock().unwrap_or_else(|p| p.into_inner());
        idle.pop().map(|(_, client)| client)
    }

    fn give(&self, client: Client) {
        let mut idle = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < POOL_MOST {
            idle.push((Instant::now(), client));
        }
    }

    fn close_unused(&self) {
        let mut idle = self.0.lock().unwrap_or_else(|p| p.into_inner());
        idle.retain(|(since, _)| since.elapsed() < POOL_IDLE);
    }
}

fn error_line(error: WireError) -> Vec<u8> {
    wire::encode_line(&ErrorReply { error })
}

/// The reply line to one request, and the output frame that follows it (empty when
/// none). A request that only looks (`read`, `list`, `wait`) goes over a kept
/// connection, and once more over a new one if that one had been closed; one that acts
/// (`start`, `stop`, `send`) always over a new one, so it is never sent twice.
fn answer(body: &[u8], pool: &Pool) -> (Vec<u8>, Vec<u8>) {
    let envelope: Envelope = match serde_json::from_slice(body) {
        Ok(envelope) => envelope,
        Err(e) => {
            return (
                error_line(WireError::bad_request(format!("the relay got {e}"))),
                Vec::new(),
            )
        }
    };
    let looks = matches!(
        envelope.request,
        Request::Read(_) | Request::List { .. } | Request::Wait(_)
    );
    if looks {
        if let Some(mut client) = pool.take() {
            if let Ok(answer) = ask(&mut client, &envelope) {
                pool.give(client);
                return answer;
            }
        }
    }
    let paths = Paths::from_env();
    let connected = match LOGOUT.get() {
        Some(logout) => logout.connect(&paths),
        None => Client::connect(&paths),
    };
    let mut client = match connected {
        Ok(client) => client,
        Err(e) => return (error_line(e), Vec::new()),
    };
    match ask(&mut client, &envelope) {
        Ok(answer) => {
            if looks {
                pool.give(client);
            }
            answer
        }
        Err(e) => (error_line(e), Vec::new()),
    }
}

/// One request on a connection of the host's daemon: its reply line and output frame.
fn ask(client: &mut Client, envelope: &Envelope) -> Result<(Vec<u8>, Vec<u8>), WireError> {
    client.send(envelope)?;
    let line = client.next_line()?.ok_or_else(|| {
        WireError::new(
            wire::ErrorCode::Unavailable,
            "the host's daemon closed the connection",
        )
    })?;
    let frame = match frame_len(&line) {
        Some(n) => client.read_frame(n)?,
        None => Vec::new(),
    };
    Ok((line, frame))
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

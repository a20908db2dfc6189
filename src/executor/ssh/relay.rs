//! `bgwork ssh-relay`, run on the host by the local daemon over its ssh channel: it
//! says which bgwork it is, then carries each request line `N <envelope>` to the host's
//! own daemon (started when none answers, as any client starts one) and writes its
//! reply as `N <reply line>`; a reply that says `"output_bytes":K` (a `read` asked with
//! `output_frame`) is followed by its K bytes of output, raw, as on the daemon's own
//! socket. The connections it holds to the host's daemon are bounded whatever the
//! number of jobs: requests that only look (`read`, `list`) are served in turn by
//! [`LOOKS_AT_ONCE`] workers over connections kept a few seconds for the next one
//! (`Pool`); a `wait` (the link's one per session for all its jobs' ends) gets a
//! connection of its own, closed when the link cancels it (a line `-N`); requests that
//! act get a new one each (never sent twice), each on a thread of its own so a slow one
//! (a stop's grace) holds up no other, [`ACTS_MOST`] at once. Its first line also says
//! when the host's logind kills the jobs at logout (`logout.rs`), which then also
//! decides how it starts the daemon.

use crate::client::Client;
use crate::paths::Paths;
use crate::wire::ssh::{RelayHello, RELAY_PROTOCOL};
use crate::wire::{self, Envelope, ErrorReply, Request, WireError};
use std::collections::HashMap;
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
    let looks = Looks::start(pool, out.clone());
    let waits = Arc::new(Room::new(WAITS_MOST));
    let acts = Arc::new(Room::new(ACTS_MOST));
    let cancels = Arc::new(Cancels::default());
    let stdin = std::io::stdin();
    for line in stdin.lock().split(b'\n') {
        let Ok(line) = line else { break };
        if let Some(id) = line.strip_prefix(b"-") {
            cancels.cancel(&String::from_utf8_lossy(id));
            continue;
        }
        let Some(space) = line.iter().position(|&b| b == b' ') else {
            continue;
        };
        let id = String::from_utf8_lossy(&line[..space]).into_owned();
        let envelope: Envelope = match serde_json::from_slice(&line[space + 1..]) {
            Ok(envelope) => envelope,
            Err(e) => {
                let refusal = WireError::bad_request(format!("the relay got {e}"));
                write_answer(&out, &id, (error_line(refusal), Vec::new()));
                continue;
            }
        };
        match envelope.request {
            Request::Read(_) | Request::List { .. } | Request::Status | Request::Ping => {
                looks.ask(id, envelope)
            }
            // A `wait` that does not wait is a look at one item.
            Request::Wait(ref args) if args.timeout_s == Some(0.0) => looks.ask(id, envelope),
            Request::Wait(_) => {
                let (out, waits, cancels) = (out.clone(), waits.clone(), cancels.clone());
                std::thread::spawn(move || {
                    let _room = waits.enter();
                    let answer = wait(&id, &envelope, &cancels);
                    write_answer(&out, &id, answer);
                });
            }
            _ => {
                let (out, acts) = (out.clone(), acts.clone());
                std::thread::spawn(move || {
                    let _room = acts.enter();
                    let answer = act(&envelope);
                    write_answer(&out, &id, answer);
                });
            }
        }
    }
    ExitCode::SUCCESS
}

/// How many requests that only look (`read`, `list`, `status`) are served at once, each
/// over a connection kept in the pool: the mirror's reads of a hundred jobs take turns
/// on these, never a connection each.
const LOOKS_AT_ONCE: usize = 8;
/// How many `wait`s are served at once (the link asks one per session for the ends of
/// all its jobs); more wait for room.
const WAITS_MOST: usize = 32;
/// How many requests that act (`start`, `stop`, `send`, …) are served at once, each on
/// a connection of its own; more wait for room (a stop holds its connection for the
/// job's grace).
const ACTS_MOST: usize = 64;
/// How many marks of requests cancelled before they began are kept.
const CANCELS_MOST: usize = 1024;

/// Writes one answer to the local daemon: `N <reply line>` and the output frame.
fn write_answer(out: &Mutex<std::io::Stdout>, id: &str, (mut reply, frame): (Vec<u8>, Vec<u8>)) {
    if !reply.ends_with(b"\n") {
        reply.push(b'\n');
    }
    let mut framed = format!("{id} ").into_bytes();
    framed.extend_from_slice(&reply);
    let mut out = out.lock().unwrap_or_else(|p| p.into_inner());
    let _ = out.write_all(&framed);
    let _ = out.write_all(&frame);
    let _ = out.flush();
}

/// The workers that serve the requests that only look, in the order they came.
struct Looks(std::sync::mpsc::Sender<(Instant, String, Envelope)>);

/// How long a look may wait for a worker before it is answered at once that the host's
/// daemon is behind: the link has given up on it by then (its patience is 30 s), and
/// asking it still would only put the looks behind it further back.
const LOOK_STALE: Duration = Duration::from_secs(25);

impl Looks {
    fn start(pool: Arc<Pool>, out: Arc<Mutex<std::io::Stdout>>) -> Looks {
        let (tx, rx) = std::sync::mpsc::channel::<(Instant, String, Envelope)>();
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..LOOKS_AT_ONCE {
            let (rx, pool, out) = (rx.clone(), pool.clone(), out.clone());
            std::thread::spawn(move || loop {
                let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                let Ok((came, id, envelope)) = next else {
                    return;
                };
                let answer = match came.elapsed() < LOOK_STALE {
                    true => look(&envelope, &pool),
                    false => {
                        let behind = WireError::new(
                            wire::ErrorCode::Unavailable,
                            format!(
                                "the host's daemon is behind: this request waited {} s for its \
                                 turn there",
                                came.elapsed().as_secs()
                            ),
                        );
                        (error_line(behind), Vec::new())
                    }
                };
                write_answer(&out, &id, answer);
            });
        }
        Looks(tx)
    }

    fn ask(&self, id: String, envelope: Envelope) {
        let _ = self.0.send((Instant::now(), id, envelope));
    }
}

/// A count of requests served at once, with room for `most`.
struct Room {
    inside: Mutex<usize>,
    freed: std::sync::Condvar,
    most: usize,
}

/// A request inside its room while this lives.
struct Inside<'a>(&'a Room);

impl Room {
    fn new(most: usize) -> Room {
        Room {
            inside: Mutex::new(0),
            freed: std::sync::Condvar::new(),
            most,
        }
    }

    fn enter(&self) -> Inside<'_> {
        let mut inside = self.inside.lock().unwrap_or_else(|p| p.into_inner());
        while *inside >= self.most {
            inside = self.freed.wait(inside).unwrap_or_else(|p| p.into_inner());
        }
        *inside += 1;
        Inside(self)
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        *self.0.inside.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        self.0.freed.notify_one();
    }
}

/// The `wait`s in flight that may be cancelled (`-N`), by request number: the handle
/// that closes each one's connection, or a mark for one cancelled before it began.
#[derive(Default)]
struct Cancels(Mutex<HashMap<String, Option<crate::client::Closer>>>);

impl Cancels {
    fn cancel(&self, id: &str) {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // Dropping the closer ends the connection: the host's daemon ends the `wait`.
        if all.remove(id).is_none() {
            // Cancelled before it began, or after it was answered: a mark, the oldest
            // of which are let go (a wait begins at once or never).
            if all.len() >= CANCELS_MOST {
                all.retain(|_, closer| closer.is_some());
            }
            all.insert(id.to_string(), None);
        }
    }

    /// Registers a `wait`'s connection; false when it was cancelled already.
    fn begin(&self, id: &str, closer: crate::client::Closer) -> bool {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match all.remove(id) {
            Some(None) => false,
            _ => {
                all.insert(id.to_string(), Some(closer));
                true
            }
        }
    }

    fn end(&self, id: &str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    }
}

/// Connections to the host's daemon that served a look and wait for the next one, with
/// when each was last used (at most [`LOOKS_AT_ONCE`] are in use at once).
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

fn connect() -> Result<Client, WireError> {
    let paths = Paths::from_env();
    match LOGOUT.get() {
        Some(logout) => logout.connect(&paths),
        None => Client::connect(&paths),
    }
}

/// A request that only looks, over a kept connection, and once more over a new one if
/// that one had been closed.
fn look(envelope: &Envelope, pool: &Pool) -> (Vec<u8>, Vec<u8>) {
    if let Some(mut client) = pool.take() {
        if let Ok(answer) = ask(&mut client, envelope) {
            pool.give(client);
            return answer;
        }
    }
    let mut client = match connect() {
        Ok(client) => client,
        Err(e) => return (error_line(e), Vec::new()),
    };
    match ask(&mut client, envelope) {
        Ok(answer) => {
            pool.give(client);
            answer
        }
        Err(e) => (error_line(e), Vec::new()),
    }
}

/// A `wait` on a connection of its own, closed when the link cancels it.
fn wait(id: &str, envelope: &Envelope, cancels: &Cancels) -> (Vec<u8>, Vec<u8>) {
    let cancelled = || {
        let refusal = WireError::new(wire::ErrorCode::Unavailable, "the wait was cancelled");
        (error_line(refusal), Vec::new())
    };
    let mut client = match connect() {
        Ok(client) => client,
        Err(e) => return (error_line(e), Vec::new()),
    };
    let closer = match client.closer() {
        Ok(closer) => closer,
        Err(e) => {
            let e = WireError::new(wire::ErrorCode::Unavailable, e.to_string());
            return (error_line(e), Vec::new());
        }
    };
    if !cancels.begin(id, closer) {
        return cancelled();
    }
    let answer = ask(&mut client, envelope);
    cancels.end(id);
    answer.unwrap_or_else(|e| (error_line(e), Vec::new()))
}

/// A request that acts (`start`, `stop`, `send`): always over a new connection, so it
/// is never sent twice.
fn act(envelope: &Envelope) -> (Vec<u8>, Vec<u8>) {
    let mut client = match connect() {
        Ok(client) => client,
        Err(e) => return (error_line(e), Vec::new()),
    };
    ask(&mut client, envelope).unwrap_or_else(|e| (error_line(e), Vec::new()))
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

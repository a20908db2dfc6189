//! `bgwork keep`: the process that keeps a waiting item's start arguments (its
//! environment's values among them) in memory while it waits, so that they are never
//! written to disk and still outlive a daemon restart (contract §14).
//!
//! How it works: the daemon starts it in a session of its own with the folder of the
//! waiting item, hands it the arguments on stdin (one JSON line, `wire::after::Kept`),
//! and reads `ready` on its stdout once it listens on `keep.sock` in that folder (0700,
//! the daemon's). Each connection of its own uid may ask `get` (the arguments, one
//! line) or `done` (the same, and the keeper ends). It ends as well when its folder is
//! gone (`gc`, a removed home), so that none outlives its item for long.

use crate::wire::after::{KeepRequest, Kept};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The keeper's socket in a waiting item's folder.
pub const SOCKET: &str = "keep.sock";
/// Its pid, written by the daemon that started it: a keeper that no longer answers (its
/// socket removed, or stopped) is still ended.
pub const PID_FILE: &str = "keep.pid";
/// The largest arguments a keeper takes (a request line is at most 1 MiB; base64 of
/// the environment's bytes may add to it).
const MAX_KEPT: u64 = 8 << 20;
/// How often a keeper looks whether its folder is still there.
const FOLDER_CHECK: Duration = Duration::from_secs(2);

/// The socket of the keeper of a waiting item's folder.
pub fn socket_of(job_dir: &Path) -> PathBuf {
    job_dir.join(SOCKET)
}

/// Runs the keeper of `dir` until it is told `done` or its folder is gone.
pub fn main(dir: &Path) -> std::process::ExitCode {
    let mut line = Vec::new();
    let read = std::io::stdin()
        .lock()
        .take(MAX_KEPT)
        .read_until(b'\n', &mut line);
    let kept: Kept = match read.map_err(|e| e.to_string()).and_then(|_| {
        serde_json::from_slice(&line).map_err(|e| format!("unreadable arguments: {e}"))
    }) {
        Ok(kept) => kept,
        Err(e) => {
            eprintln!("bgwork keep: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let answer = match serde_json::to_vec(&kept) {
        Ok(mut answer) => {
            answer.push(b'\n');
            answer
        }
        Err(e) => {
            eprintln!("bgwork keep: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let socket = socket_of(dir);
    let _ = std::fs::remove_file(&socket);
    let short = match crate::paths::SocketPath::new(&socket) {
        Ok(short) => short,
        Err(e) => {
            eprintln!("bgwork keep: {}: {e}", dir.display());
            return std::process::ExitCode::FAILURE;
        }
    };
    let listener = match UnixListener::bind(&short.path) {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("bgwork keep: could not listen on {}: {e}", socket.display());
            return std::process::ExitCode::FAILURE;
        }
    };
    // The daemon waits for this word before it counts on the keeper.
    let mut stdout = std::io::stdout();
    let _ = stdout.write_all(b"ready\n").and_then(|()| stdout.flush());
    // A keeper whose folder is gone has nothing left to keep for.
    let watched = dir.to_path_buf();
    std::thread::spawn(move || loop {
        std::thread::sleep(FOLDER_CHECK);
        if std::fs::symlink_metadata(&watched).is_err() {
            std::process::exit(0);
        }
    });
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        if serve(stream, &answer) == Some(KeepRequest::Done) {
            let _ = std::fs::remove_file(&socket);
            return std::process::ExitCode::SUCCESS;
        }
    }
    std::process::ExitCode::SUCCESS
}

/// Answers one connection; returns what it asked.
fn serve(stream: UnixStream, answer: &[u8]) -> Option<KeepRequest> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let own = getsockopt(&stream, PeerCredentials)
        .is_ok_and(|peer| peer.uid() == nix::unistd::geteuid().as_raw());
    if !own {
        return None;
    }
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
    let mut line = String::new();
    BufReader::new(&stream).take(64).read_line(&mut line).ok()?;
    let request: KeepRequest = serde_json::from_str(line.trim()).ok()?;
    (&stream).write_all(answer).ok()?;
    Some(request)
}

/// Records the pid of the keeper of `job_dir`.
pub fn write_pid(job_dir: &Path, pid: u32) {
    let _ = std::fs::write(job_dir.join(PID_FILE), pid.to_string());
}

/// Ends the keeper of `job_dir`: told `done` (given a moment to answer), and, if it is
/// still there (it did not answer, or another keeper of the folder outlived its
/// socket), killed by its pid, once that pid is seen to be a keeper of this folder.
/// Blocking: call it off the daemon's runtime threads.
pub fn end(job_dir: &Path) {
    let _ = ask_within(job_dir, KeepRequest::Done, Duration::from_millis(500));
    let pid_file = job_dir.join(PID_FILE);
    let pid = std::fs::read_to_string(&pid_file)
        .ok()
        .and_then(|text| text.trim().parse::<i32>().ok());
    if let Some(pid) = pid.filter(|&pid| pid > 1 && keeps(pid, job_dir)) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = std::fs::remove_file(pid_file);
}

/// Whether process `pid` is `bgwork keep JOB_DIR` (a pid used again is never killed).
fn keeps(pid: i32, job_dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let dir = job_dir.as_os_str().as_encoded_bytes();
    args.get(1) == Some(&b"keep".as_slice()) && args.get(2) == Some(&dir)
}

/// Whether the keeper of `job_dir` still listens (a connection it closes at once).
/// Blocking, and quick: the socket is local.
pub fn answers(job_dir: &Path) -> bool {
    crate::paths::SocketPath::new(&socket_of(job_dir))
        .is_ok_and(|short| UnixStream::connect(&short.path).is_ok())
}

/// Asks the keeper of `job_dir` for the arguments it keeps (and, with `done`, to end).
/// Blocking: call it off the daemon's runtime threads.
pub fn ask(job_dir: &Path, request: KeepRequest) -> Result<Kept, String> {
    ask_within(job_dir, request, Duration::from_secs(5))
}

/// A keeper that could not be asked, in plain words ("connection refused", "timed out").
fn silent(e: std::io::Error) -> String {
    match e.kind() {
        // A read that waited out its patience.
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            "it does not answer: no answer within 5 s".to_string()
        }
        kind => format!("it does not answer: {kind}"),
    }
}

fn ask_within(job_dir: &Path, request: KeepRequest, patience: Duration) -> Result<Kept, String> {
    let socket = socket_of(job_dir);
    let short = crate::paths::SocketPath::new(&socket).map_err(|e| e.to_string())?;
    let stream = UnixStream::connect(&short.path).map_err(silent)?;
    let _ = stream.set_read_timeout(Some(patience));
    let _ = stream.set_write_timeout(Some(patience));
    let mut line = serde_json::to_vec(&request).map_err(|e| e.to_string())?;
    line.push(b'\n');
    (&stream).write_all(&line).map_err(silent)?;
    let mut answer = Vec::new();
    BufReader::new(&stream)
        .take(MAX_KEPT)
        .read_until(b'\n', &mut answer)
        .map_err(silent)?;
    serde_json::from_slice(&answer).map_err(|e| format!("its keeper answered badly ({e})"))
}

//! `LocalExecutor`: jobs on this machine, each under its own supervisor process.
//!
//! How it works: `start` makes a socket pair, spawns `bgwork supervise` in a session of
//! its own with one end on fd 3, writes the [`JobSpec`] and waits for `spawned` (or
//! `spawn_failed`). `reattach` connects to the `control.sock` a supervisor keeps in its
//! job's folder, checks the protocol version in `hello`, and falls back to the status
//! file when no supervisor answers. Either way one task per job then relays the
//! supervisor's messages as [`ExecEvent`]s and the daemon's commands to it.

use super::{ExecEvent, JobHandle, Reattach, Running};
use crate::paths::SocketPath;
use crate::supervisor::{self, CONTROL_SOCKET};
use crate::wire::control::{self, FromSupervisor, JobSpec, ToSupervisor, PROTOCOL};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

/// How long a new supervisor may take to report that its job started.
const SPAWN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a supervisor may take to answer `hello` on reattach.
const HELLO_TIMEOUT: Duration = Duration::from_secs(3);

pub struct LocalExecutor {
    exe: PathBuf,
    events: mpsc::UnboundedSender<ExecEvent>,
}

impl LocalExecutor {
    pub fn new(events: mpsc::UnboundedSender<ExecEvent>) -> LocalExecutor {
        let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("bgwork"));
        LocalExecutor { exe, events }
    }

    /// Starts a job; `Err` carries the reason it could not start.
    pub async fn start(&self, row: i64, spec: &JobSpec) -> Result<Running, String> {
        let job_dir = Path::new(&spec.job_dir);
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| format!("could not make a socket pair: {e}"))?;
        let stderr = std::fs::File::create(job_dir.join("supervisor.log"))
            .map_err(|e| format!("could not write in {}: {e}", job_dir.display()))?;
        // The launch socket is the supervisor's stdin, and it leaves the daemon's session
        // itself: with no hook between fork and exec, the spawn is a fast posix_spawn.
        let mut command = std::process::Command::new(&self.exe);
        command
            .arg("supervise")
            .arg(job_dir)
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .stderr(stderr);
        let mut child = tokio::process::Command::from(command)
            .spawn()
            .map_err(|e| format!("could not start the supervisor {}: {e}", self.exe.display()))?;
        tokio::spawn(async move {
            let _ = child.wait().await;
        });

        ours.set_nonblocking(true)
            .map_err(|e| format!("socket setup failed: {e}"))?;
        let stream = UnixStream::from_std(ours).map_err(|e| format!("socket setup failed: {e}"))?;
        let (read_half, mut write_half) = stream.into_split();
        let mut reader = BufReader::new(read_half);
        let _ = write_half.write_all(&control::encode(spec)).await;
        let first = tokio::time::timeout(SPAWN_TIMEOUT, next_message(&mut reader))
            .await
            .map_err(|_| "the supervisor did not report within 10 s".to_string())?;
        match first {
            Some(FromSupervisor::Spawned { pid }) => {
                let handle = self.relay(row, reader, write_half);
                Ok(Running {
                    pid,
                    log_len: 0,
                    dropped: 0,
                    handle,
                })
            }
            Some(FromSupervisor::SpawnFailed { message }) => Err(message),
            _ => Err(supervisor_error(job_dir)),
        }
    }

    /// Finds a job again after a daemon restart.
    pub async fn reattach(&self, row: i64, job_dir: &Path) -> Reattach {
        let socket = job_dir.join(CONTROL_SOCKET);
        let mut connected = connect(&socket).await;
        // A supervisor started just before the old daemon died may not have bound its
        // socket yet: while it lives, give it time to.
        let deadline = tokio::time::Instant::now() + SPAWN_TIMEOUT;
        while connected.is_none()
            && supervisor::read_status(job_dir).is_none()
            && supervisor::tree::supervisor_alive(job_dir)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
            connected = connect(&socket).await;
        }
        if let Some(stream) = connected {
            let (read_half, mut write_half) = stream.into_split();
            let mut reader = BufReader::new(read_half);
            let hello = control::encode(&ToSupervisor::Hello { protocol: PROTOCOL });
            let _ = write_half.write_all(&hello).await;
            let reply = tokio::time::timeout(HELLO_TIMEOUT, next_message(&mut reader)).await;
            match reply {
                Ok(Some(FromSupervisor::Hello {
                    protocol,
                    pid,
                    log_len,
                    dropped,
                    status,
                })) => {
                    if protocol != PROTOCOL {
                        return Reattach::Lost(format!(
                            "its supervisor speaks protocol {protocol} and this daemon {PROTOCOL}"
                        ));
                    }
                    if let Some(status) = status {
                        return Reattach::Ended(status);
                    }
                    let handle = self.relay(row, reader, write_half);
                    return Reattach::Running(Running {
                        pid,
                        log_len,
                        dropped,
                        handle,
                    });
                }
                Ok(Some(FromSupervisor::Exited { status })) => return Reattach::Ended(status),
                _ => {}
            }
        }
        match supervisor::read_status(job_dir) {
            Some(Ok(status)) => Reattach::Ended(status),
            Some(Err(reason)) => Reattach::Lost(reason),
            None => Reattach::Lost("its supervisor is gone and left no exit status".into()),
        }
    }

    /// Spawns the task that relays one supervisor connection; returns its handle.
    fn relay(
        &self,
        row: i64,
        mut reader: BufReader<OwnedReadHalf>,
        mut writer: OwnedWriteHalf,
    ) -> JobHandle {
        let (commands, mut incoming) = mpsc::unbounded_channel();
        let events = self.events.clone();
        tokio::spawn(async move {
            let mut ended = false;
            loop {
                tokio::select! {
                    message = next_message(&mut reader) => match message {
                        Some(FromSupervisor::Output { log_len, dropped }) => {
                            let _ = events.send(ExecEvent::Output { row, log_len, dropped });
                        }
                        Some(FromSupervisor::InputClosed) => {
                            let _ = events.send(ExecEvent::InputClosed { row });
                        }
                        Some(FromSupervisor::Exited { status }) => {
                            ended = true;
                            let _ = events.send(ExecEvent::Ended { row, status });
                            break;
                        }
                        Some(_) => {}
                        None => break,
                    },
                    command = incoming.recv() => match command {
                        Some(command) => {
                            let _ = writer.write_all(&control::encode(&command)).await;
                        }
                        None => return,
                    },
                }
            }
            if !ended {
                let _ = events.send(ExecEvent::Detached { row });
            }
        });
        JobHandle { commands }
    }
}

async fn connect(socket: &Path) -> Option<UnixStream> {
    let short = SocketPath::new(socket).ok()?;
    UnixStream::connect(&short.path).await.ok()
}

/// The next message from a supervisor; `None` when the connection ends.
async fn next_message(reader: &mut BufReader<OwnedReadHalf>) -> Option<FromSupervisor> {
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
        match control::decode(line.strip_suffix(b"\n").unwrap_or(&line)) {
            Ok(message) => return Some(message),
            Err(e) => crate::note!("bgwork daemon: {e}"),
        }
    }
}

fn supervisor_error(job_dir: &Path) -> String {
    let log = std::fs::read_to_string(job_dir.join("supervisor.log")).unwrap_or_default();
    let last = log.lines().last().unwrap_or("it exited without a word");
    format!("the supervisor failed: {last}")
}

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
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
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
    exe: Arc<PathBuf>,
    events: mpsc::UnboundedSender<ExecEvent>,
    /// A supervisor started ahead of need, waiting for its job on its launch socket, so
    /// that `start` does not wait for a process to load.
    warm: Arc<Mutex<Option<Warm>>>,
}

/// An idle supervisor: its pid and the daemon's end of its launch socket.
struct Warm {
    pid: u32,
    launch: std::os::unix::net::UnixStream,
}

/// The file in a job's folder that names the pid of its supervisor.
pub const SUPERVISOR_PID_FILE: &str = "supervisor.pid";

impl LocalExecutor {
    pub fn new(events: mpsc::UnboundedSender<ExecEvent>) -> LocalExecutor {
        let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("bgwork"));
        LocalExecutor {
            exe: Arc::new(exe),
            events,
            warm: Arc::new(Mutex::new(None)),
        }
    }

    /// Hands a job to a supervisor and returns at once; `Spawned` or `SpawnFailed`
    /// follows as an event. `Err` when no supervisor could be had.
    pub fn start(&self, row: i64, spec: &JobSpec) -> Result<JobHandle, String> {
        let job_dir = Path::new(&spec.job_dir);
        let taken = self.warm.lock().unwrap_or_else(|p| p.into_inner()).take();
        let warm = match taken {
            Some(warm) => warm,
            None => spawn_supervisor(&self.exe)?,
        };
        self.refill();
        // Written before the job is handed over: a daemon that restarts before the
        // supervisor binds its socket still finds it.
        std::fs::write(job_dir.join(SUPERVISOR_PID_FILE), warm.pid.to_string())
            .map_err(|e| format!("could not write in {}: {e}", job_dir.display()))?;
        let mut launch = warm.launch;
        // A fresh socket's buffer takes the spec whole: this write does not wait.
        launch
            .write_all(&control::encode(spec))
            .and_then(|()| launch.set_nonblocking(true))
            .map_err(|e| format!("the supervisor did not take the job: {e}"))?;
        let stream =
            UnixStream::from_std(launch).map_err(|e| format!("socket setup failed: {e}"))?;
        let (read_half, write_half) = stream.into_split();
        let launching = Some(job_dir.to_path_buf());
        Ok(self.relay(row, BufReader::new(read_half), write_half, launching))
    }

    /// Finds a job again after a daemon restart.
    pub async fn reattach(&self, row: i64, job_dir: &Path) -> Reattach {
        let socket = job_dir.join(CONTROL_SOCKET);
        let mut connected = connect(&socket).await;
        // A supervisor started just before the old daemon died may not have bound its
        // socket yet: while it lives, give it time to.
        let began = tokio::time::Instant::now();
        let deadline = began + SPAWN_TIMEOUT;
        let mut said = false;
        while connected.is_none()
            && supervisor::read_status(job_dir).is_none()
            && supervisor_alive(job_dir)
            && tokio::time::Instant::now() < deadline
        {
            if !said && began.elapsed() > Duration::from_secs(1) {
                said = true;
                crate::note!(
                    "bgwork daemon: waiting for the supervisor of {} to open its socket",
                    job_dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            connected = connect(&socket).await;
        }
        if let Some(stream) = connected {
            let (read_half, mut write_half) = stream.into_split();
            let mut reader = BufReader::new(read_half);
            let hello = control::encode(&ToSupervisor::Hello { protocol: PROTOCOL });
            let _ = write_half.write_all(&hello).await;
            let reply = tokio::time::timeout(HELLO_TIMEOUT, answer_to_hello(&mut reader)).await;
            match reply {
                Ok(Some(FromSupervisor::Hello {
                    protocol,
                    pid,
                    dropped,
                    status,
                    ..
                })) => {
                    if protocol != PROTOCOL {
                        return Reattach::Lost(format!(
                            "its supervisor speaks protocol {protocol} and this daemon {PROTOCOL}"
                        ));
                    }
                    if let Some(status) = status {
                        return Reattach::Ended(status);
                    }
                    let handle = self.relay(row, reader, write_half, None);
                    return Reattach::Running(Running {
                        pid,
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
    /// `launching` (the job's folder) while the supervisor has yet to say whether the
    /// job started.
    fn relay(
        &self,
        row: i64,
        mut reader: BufReader<OwnedReadHalf>,
        mut writer: OwnedWriteHalf,
        mut launching: Option<PathBuf>,
    ) -> JobHandle {
        let (commands, mut incoming) = mpsc::unbounded_channel();
        let events = self.events.clone();
        tokio::spawn(async move {
            let launch_deadline = tokio::time::Instant::now() + SPAWN_TIMEOUT;
            let mut ended = false;
            loop {
                tokio::select! {
                    message = next_message(&mut reader) => match message {
                        Some(FromSupervisor::Spawned { pid }) => {
                            launching = None;
                            let _ = events.send(ExecEvent::Spawned { row, pid });
                        }
                        Some(FromSupervisor::SpawnFailed { message }) => {
                            launching = None;
                            ended = true;
                            let _ = events.send(ExecEvent::SpawnFailed { row, message });
                            break;
                        }
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
                        Some(FromSupervisor::Hello { .. }) => {}
                        None => break,
                    },
                    command = incoming.recv() => match command {
                        Some(command) => {
                            let _ = writer.write_all(&control::encode(&command)).await;
                        }
                        None => return,
                    },
                    _ = tokio::time::sleep_until(launch_deadline), if launching.is_some() => break,
                }
            }
            if let Some(job_dir) = launching {
                let message = supervisor_error(&job_dir);
                let _ = events.send(ExecEvent::SpawnFailed { row, message });
            } else if !ended {
                let _ = events.send(ExecEvent::Detached { row });
            }
        });
        JobHandle { commands }
    }
}

impl LocalExecutor {
    /// Starts an idle supervisor in the background, unless one is waiting already.
    pub fn refill(&self) {
        let (exe, warm) = (self.exe.clone(), self.warm.clone());
        tokio::task::spawn_blocking(move || {
            let mut slot = warm.lock().unwrap_or_else(|p| p.into_inner());
            if slot.is_none() {
                *slot = spawn_supervisor(&exe).ok();
            }
        });
    }
}

/// Spawns `bgwork supervise` with its launch socket as stdin. It leaves the daemon's
/// session itself: with no hook between fork and exec, the spawn is a fast posix_spawn.
fn spawn_supervisor(exe: &Path) -> Result<Warm, String> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| format!("could not make a socket pair: {e}"))?;
    // It needs none of the daemon's environment: its job's comes in the spec.
    let mut child = tokio::process::Command::new(exe)
        .arg("supervise")
        .env_clear()
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("could not start the supervisor {}: {e}", exe.display()))?;
    let pid = child.id().unwrap_or(0);
    // Reap it whenever it ends (it outlives this daemon if the daemon goes first).
    tokio::spawn(async move { child.wait().await });
    Ok(Warm { pid, launch: ours })
}

/// The supervisor's answer to `hello`: its `hello`, or `exited` if it is ending. Output
/// progress it sent on the new connection before reading the `hello` is passed over
/// (the daemon reads the log's length from the file).
async fn answer_to_hello(reader: &mut BufReader<OwnedReadHalf>) -> Option<FromSupervisor> {
    loop {
        match next_message(reader).await? {
            FromSupervisor::Output { .. } | FromSupervisor::InputClosed => continue,
            answer => return Some(answer),
        }
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
    let log = crate::paths::read_untrusted(&job_dir.join("supervisor.log"), 64 << 10)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default();
    let last = log.lines().last().unwrap_or("it exited without a word");
    format!("the supervisor failed: {last}")
}

/// Whether the supervisor named in a job's folder still runs.
fn supervisor_alive(job_dir: &Path) -> bool {
    let pid = crate::paths::read_untrusted(&job_dir.join(SUPERVISOR_PID_FILE), 64)
        .ok()
        .and_then(|p| String::from_utf8_lossy(&p).trim().parse::<i32>().ok());
    pid.is_some_and(supervisor::tree::is_supervisor)
}

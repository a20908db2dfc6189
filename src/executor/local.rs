//! `LocalExecutor`: jobs on this machine, each under its own supervisor process.
//!
//! How it works: `start` makes a socket pair, spawns `bgwork supervise` in a session of
//! its own with one end on its stdin (fd 0), writes the [`JobSpec`]; `spawned` or
//! `spawn_failed` follows as a message. `reattach` connects to the `control.sock` a supervisor keeps in its
//! job's folder, checks the protocol version in `hello`, and falls back to the status
//! file when no supervisor answers. Either way one task per job then relays the
//! supervisor's messages as [`ExecEvent`]s and the daemon's commands to it; output
//! progress, the most frequent message, it applies itself ([`OutputSink`]).

use super::{
    carries_all, Command, ExecEvent, Executor, JobHandle, On, OutputSink, Reattach, Running, View,
    Which, WriteRefused, Writes,
};
use crate::job_dir::JobDir;
use crate::paths::SocketPath;
use crate::supervisor;
use crate::wire::control::{self, FromSupervisor, JobSpec, ToSupervisor, PROTOCOL};
use crate::wire::frame::{LineError, Lines};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

/// How long a reattach waits for a live supervisor to bind its control socket.
const SPAWN_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest line a supervisor sends (its messages are small; a status is < 1 KiB).
const MAX_SUPERVISOR_LINE: usize = 1 << 20;
/// How long a supervisor may take to answer `hello` on reattach.
const HELLO_TIMEOUT: Duration = Duration::from_secs(3);

pub struct LocalExecutor {
    exe: Arc<PathBuf>,
    /// Whether supervisors give their jobs a cgroup (`BGWORK_CGROUPS`): a warm one
    /// makes it while it waits.
    cgroups: bool,
    events: mpsc::UnboundedSender<ExecEvent>,
    /// Output progress, applied by the relay itself.
    output: OutputSink,
    /// A supervisor started ahead of need, waiting for its job on its launch socket, so
    /// that `start` does not wait for a process to load.
    warm: Arc<Mutex<Option<Warm>>>,
}

/// An idle supervisor: its pid and the daemon's end of its launch socket.
struct Warm {
    pid: u32,
    launch: std::os::unix::net::UnixStream,
}

impl LocalExecutor {
    pub fn new(
        events: mpsc::UnboundedSender<ExecEvent>,
        output: OutputSink,
        cgroups: bool,
    ) -> LocalExecutor {
        let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("bgwork"));
        LocalExecutor {
            exe: Arc::new(exe),
            cgroups,
            events,
            output,
            warm: Arc::new(Mutex::new(None)),
        }
    }

    /// Hands a job to a supervisor and returns at once; `Spawned` or `SpawnFailed`
    /// follows as an event. `Err` when no supervisor could be had.
    fn start_here(&self, row: i64, spec: &JobSpec) -> Result<JobHandle, String> {
        let job_dir = Path::new(&spec.job_dir);
        // The next warm supervisor is started once this job's process runs (its relay
        // asks for it): started now, it would take a core from the job's own start.
        let taken = self.warm.lock().unwrap_or_else(|p| p.into_inner()).take();
        // The warm supervisor may have died while it waited (killed by someone): then
        // the job goes to a fresh one.
        let mut candidates = vec![taken];
        candidates.push(None);
        let mut refused = String::new();
        let mut launch = None;
        for candidate in candidates {
            let warm = match candidate {
                Some(warm) => warm,
                None => spawn_supervisor(&self.exe, self.cgroups)?,
            };
            // Written before the job is handed over: a daemon that restarts before the
            // supervisor binds its socket still finds it.
            std::fs::write(JobDir(job_dir).supervisor_pid(), warm.pid.to_string())
                .map_err(|e| format!("could not write in {}: {e}", job_dir.display()))?;
            let mut socket = warm.launch;
            // A fresh socket's buffer takes the spec whole: this write does not wait.
            match socket
                .write_all(&control::encode(spec))
                .and_then(|()| socket.set_nonblocking(true))
            {
                Ok(()) => {
                    launch = Some(socket);
                    break;
                }
                Err(e) => refused = format!("the supervisor did not take the job: {e}"),
            }
        }
        let Some(launch) = launch else {
            self.refill();
            return Err(refused);
        };
        let stream = UnixStream::from_std(launch).map_err(|e| {
            self.refill();
            format!("socket setup failed: {e}")
        })?;
        let (read_half, write_half) = stream.into_split();
        let refill = Some(Refill {
            exe: self.exe.clone(),
            cgroups: self.cgroups,
            warm: self.warm.clone(),
        });
        Ok(self.relay(
            row,
            Lines::new(read_half, MAX_SUPERVISOR_LINE),
            write_half,
            refill,
        ))
    }

    /// Finds a job again after a daemon restart.
    async fn reattach_here(&self, row: i64, job_dir: &Path, owner: &str) -> Reattach {
        let socket = JobDir(job_dir).control_socket();
        let mut connected = connect(&socket).await;
        // A supervisor started just before the old daemon died may not have bound its
        // socket yet: while it lives, give it time to.
        let began = tokio::time::Instant::now();
        let deadline = began + SPAWN_TIMEOUT;
        let mut said = false;
        while connected.is_none()
            && supervisor::read_status(job_dir, owner).is_none()
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
            let mut reader = Lines::new(read_half, MAX_SUPERVISOR_LINE);
            let hello = control::encode(&ToSupervisor::Hello { protocol: PROTOCOL });
            let _ = write_half.write_all(&hello).await;
            let reply = tokio::time::timeout(HELLO_TIMEOUT, answer_to_hello(&mut reader)).await;
            match reply {
                Ok(Some(FromSupervisor::Hello {
                    protocol,
                    pid,
                    dropped,
                    unwritten,
                    unwritten_at,
                    status,
                    between,
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
                        unwritten,
                        unwritten_at,
                        handle,
                        between: between.map(|between| *between),
                    });
                }
                Ok(Some(FromSupervisor::Exited { status })) => return Reattach::Ended(status),
                _ => {}
            }
        }
        match supervisor::read_status(job_dir, owner) {
            Some(Ok(status)) => Reattach::Ended(status),
            Some(Err(reason)) => Reattach::Lost(reason),
            None => Reattach::Lost("its supervisor is gone and left no exit status".into()),
        }
    }

    /// Spawns the task that relays one supervisor connection; returns its handle.
    ///
    /// No deadline runs here: a job is `spawn_failed` only when its supervisor says so
    /// (or its status file does), and a connection that closes without an end is
    /// reported as `Detached`, after which the daemon checks whether the supervisor
    /// still lives before it concludes anything.
    fn relay(
        &self,
        row: i64,
        mut reader: Lines<OwnedReadHalf>,
        mut writer: OwnedWriteHalf,
        mut refill: Option<Refill>,
    ) -> JobHandle {
        let (commands, mut incoming) = mpsc::unbounded_channel();
        let events = self.events.clone();
        let output = self.output.clone();
        let unanswered = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let handle = JobHandle::new(commands, unanswered.clone(), carries_all);
        tokio::spawn(async move {
            let mut ended = false;
            let mut writable = true;
            let mut writes = Writes {
                unanswered,
                ..Writes::default()
            };
            loop {
                tokio::select! {
                    // A message already waiting is handled before anything else.
                    biased;
                    message = next_message(&mut reader) => {
                    // The job's start is answered (or its supervisor is gone): the
                    // next job's supervisor may load now.
                    if let Some(refill) = refill.take() {
                        refill.start();
                    }
                    match message {
                        Some(FromSupervisor::Spawned { pid }) => {
                            let _ = events.send(ExecEvent::Spawned { row, pid });
                        }
                        Some(FromSupervisor::SpawnFailed { message }) => {
                            ended = true;
                            let _ = events.send(ExecEvent::SpawnFailed { row, message });
                            break;
                        }
                        Some(FromSupervisor::Output { log_len, dropped, unwritten, unwritten_at }) => {
                            // Applied here: the waiters of this output are woken from
                            // this task, with no hop through the event queue.
                            output(ExecEvent::Output {
                                row,
                                log_len,
                                dropped,
                                unwritten,
                                unwritten_at,
                            });
                        }
                        Some(FromSupervisor::InputClosed) => {
                            let _ = events.send(ExecEvent::InputClosed { row });
                        }
                        Some(FromSupervisor::Exited { status }) => {
                            ended = true;
                            let _ = events.send(ExecEvent::Ended { row, status });
                            break;
                        }
                        Some(FromSupervisor::RunEnded { between }) => {
                            let _ = events.send(ExecEvent::RunEnded {
                                row,
                                between: *between,
                            });
                        }
                        Some(FromSupervisor::InputTaken { seq, queued }) => {
                            writes.answer(seq, Ok(queued));
                        }
                        Some(FromSupervisor::InputRefused { seq, reason, full }) => {
                            let refusal = match full {
                                true => WriteRefused::Full(reason),
                                false => WriteRefused::Closed,
                            };
                            writes.answer(seq, Err(refusal));
                        }
                        Some(FromSupervisor::Hello { .. }) => {}
                        None => break,
                    }
                    },
                    command = incoming.recv(), if writable => {
                        let lines = match command {
                            Some(Command::Send(command)) => vec![control::encode(&command)],
                            Some(Command::Write { data, answer }) => writes.ask(data, answer),
                            None => return,
                        };
                        for line in lines {
                            // A failed write is not the supervisor's death: reading
                            // goes on until the connection really ends.
                            if writer.write_all(&line).await.is_err() {
                                writable = false;
                            }
                        }
                    },
                }
            }
            // Nothing is waiting on a connection that is gone.
            writes
                .unanswered
                .store(0, std::sync::atomic::Ordering::SeqCst);
            if !ended {
                let _ = events.send(ExecEvent::Detached { row });
            }
        });
        handle
    }
}

impl Executor for LocalExecutor {
    async fn start(&self, row: i64, spec: &JobSpec, _on: &On) -> Result<JobHandle, String> {
        self.start_here(row, spec)
    }

    async fn reattach(&self, row: i64, job_dir: &Path, owner: &str) -> Reattach {
        self.reattach_here(row, job_dir, owner).await
    }

    fn view(&self, _row: i64, _job_dir: &str) -> Option<View> {
        Some(View {
            which: Which::Local,
            ..View::default()
        })
    }

    fn supervisor_alive(&self, job_dir: &Path) -> bool {
        supervisor_alive(job_dir)
    }

    fn sweep(&self, key: &str, job_dir: &Path) -> usize {
        supervisor::tree::sweep_job(key, job_dir)
    }

    fn warm_up(&self) {
        self.refill();
    }
}

impl LocalExecutor {
    /// Starts an idle supervisor in the background, unless one is waiting already.
    fn refill(&self) {
        Refill {
            exe: self.exe.clone(),
            cgroups: self.cgroups,
            warm: self.warm.clone(),
        }
        .start();
    }
}

/// What starts the next warm supervisor: the binary and the slot it waits in.
struct Refill {
    exe: Arc<PathBuf>,
    cgroups: bool,
    warm: Arc<Mutex<Option<Warm>>>,
}

impl Refill {
    /// Starts an idle supervisor in the background, unless one is waiting already.
    fn start(self) {
        tokio::task::spawn_blocking(move || {
            let mut slot = self.warm.lock().unwrap_or_else(|p| p.into_inner());
            if slot.is_none() {
                *slot = spawn_supervisor(&self.exe, self.cgroups).ok();
            }
        });
    }
}

/// Spawns `bgwork supervise` with its launch socket as stdin (and `--cgroup`: it makes
/// its job's cgroup while it waits, moving into one being the slow part of a start). It
/// leaves the daemon's session itself: with no hook between fork and exec, the spawn is
/// a fast posix_spawn.
fn spawn_supervisor(exe: &Path, cgroups: bool) -> Result<Warm, String> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| format!("could not make a socket pair: {e}"))?;
    // It needs none of the daemon's environment: its job's comes in the spec.
    let mut child = tokio::process::Command::new(exe)
        .arg("supervise")
        .args(cgroups.then_some("--cgroup"))
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
async fn answer_to_hello(reader: &mut Lines<OwnedReadHalf>) -> Option<FromSupervisor> {
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

/// The next message from a supervisor; `None` when the connection ends. Cancel-safe
/// (the partial line stays in `reader`).
async fn next_message(reader: &mut Lines<OwnedReadHalf>) -> Option<FromSupervisor> {
    loop {
        match reader.next().await {
            Ok(Some(line)) => match FromSupervisor::decode(&line) {
                Ok(message) => return Some(message),
                Err(e) => crate::note!("bgwork daemon: {e}"),
            },
            Ok(None) => return None,
            Err(LineError::TooLong(max)) => {
                crate::note!("bgwork daemon: a supervisor sent a line over {max} bytes");
                return None;
            }
            Err(LineError::Io(_)) => return None,
        }
    }
}

/// Whether the supervisor named in a job's folder still runs. Once the job ran, the
/// folder records the supervisor's start time, and only the process with that pid and
/// that start time counts (a pid given to another process, even another supervisor, is
/// not it); before that, a live `bgwork supervise` with the pid in `supervisor.pid`.
pub(super) fn supervisor_alive(job_dir: &Path) -> bool {
    let recorded = supervisor::tree::TreeRecord::read(job_dir).supervisor;
    if let Some((pid, start)) = recorded {
        return supervisor::tree::start_time(pid) == Some(start)
            && supervisor::tree::is_supervisor(pid);
    }
    let pid = crate::paths::read_untrusted(&JobDir(job_dir).supervisor_pid(), 64)
        .ok()
        .and_then(|p| String::from_utf8_lossy(&p).trim().parse::<i32>().ok());
    pid.is_some_and(supervisor::tree::is_supervisor)
}

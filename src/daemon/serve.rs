//! Starting the daemon (lock, socket, store, reconcile) and serving client connections.
//!
//! A request is read with a hard bound ([`MAX_FRAME`]) before any parsing; a peer of
//! another uid is refused; a malformed request gets a `bad_request` reply and the
//! connection goes on. `notices --follow` and `wait` watch the client's side of the
//! connection, so a client that goes away ends them and leaves everything else as it was.

use super::{Config, Daemon};
use crate::paths::{Paths, SocketPath};
use crate::store::Store;
use crate::wire::{self, Envelope, ErrorCode, Request, WireError, MAX_FRAME};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};

/// Job folder numbers at or past this are no job folders of this home (a row number
/// never comes near it): they raise no floor and are never taken back.
pub(crate) const MAX_JOB_FOLDER: i64 = 1 << 53;
/// How long a starting daemon waits for the home's lock before refusing.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// `bgwork daemon`: takes the home's lock, binds the socket and serves until shutdown.
pub fn main() -> anyhow::Result<()> {
    // Nothing a client left open reaches the daemon, its supervisors or their jobs.
    close_inherited_descriptors();
    // A daemon started from inside a job is no part of that job.
    crate::supervisor::cgroup::leave_job_cgroups();
    let paths = Paths::from_env();
    // Refuses a home or socket folder that another user made or may write in.
    paths.create_dirs()?;
    // One daemon per home (the lock lives in the home, whatever socket folder each
    // daemon was started with), and one per socket folder (two homes that share one
    // must not take the socket from each other).
    let home_lock = take_lock(&paths.lock, &paths.home)?;
    let socket_lock = match paths.socket_dir().join("daemon.lock") {
        lock if lock != paths.lock => Some(take_lock(&lock, &paths.socket)?),
        _ => None,
    };
    // New rows (and so job folders) start above every folder there is, even when the
    // database was lost.
    let floor = paths
        .job_folders()
        .iter()
        .map(|(row, _)| *row)
        .filter(|&row| row < MAX_JOB_FOLDER)
        .max()
        .unwrap_or(0);
    let store = Store::open(&paths.db, floor)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = bind(&paths)?;
        let (daemon, events) = Daemon::new(paths.clone(), Config::from_env(), store);
        crate::note!(
            "bgwork daemon {} serving {} (pid {})",
            env!("CARGO_PKG_VERSION"),
            paths.socket.display(),
            std::process::id()
        );
        let shutdown = daemon.shutdown_signal();
        run(daemon, events, listener, shutdown).await;
        let _ = std::fs::remove_file(&paths.socket);
        anyhow::Ok(())
    })?;
    drop(socket_lock);
    drop(home_lock);
    Ok(())
}

/// Takes the lock file at `path` for serving `what`, and writes this daemon's pid in it.
fn take_lock(path: &std::path::Path, what: &std::path::Path) -> anyhow::Result<std::fs::File> {
    let mut lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)?;
    // A daemon that was just killed holds the lock until its last thread is gone: give
    // it a moment before deciding that another daemon serves this home.
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    while lock.try_lock().is_err() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    if lock.try_lock().is_err() {
        let holder = std::fs::read_to_string(path).unwrap_or_default();
        anyhow::bail!(
            "another bgwork daemon (pid {}) already serves {}: use it, or `bgwork shutdown` first",
            holder.trim(),
            what.display()
        );
    }
    lock.set_len(0)?;
    write!(lock, "{}", std::process::id())?;
    Ok(lock)
}

/// Closes every descriptor above stderr that the process that started this daemon left
/// open without close-on-exec.
fn close_inherited_descriptors() {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: nothing in this process owns these descriptors yet (this runs first
        // in `main`, before any file, socket or thread exists); the one read_dir used
        // to list them is closed by then or fails harmlessly with EBADF.
        unsafe { nix::libc::close(fd) };
    }
}

/// Binds the socket under a restrictive umask and makes it 0600.
fn bind(paths: &Paths) -> std::io::Result<UnixListener> {
    let _ = std::fs::remove_file(&paths.socket);
    let short = SocketPath::new(&paths.socket)?;
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let listener = UnixListener::bind(&short.path);
    nix::sys::stat::umask(old);
    let listener = listener?;
    std::fs::set_permissions(&paths.socket, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Serves `listener` until `shutdown` turns true. Tests and `main` both come here.
pub async fn run(
    daemon: Arc<Daemon>,
    events: tokio::sync::mpsc::UnboundedReceiver<crate::executor::ExecEvent>,
    listener: UnixListener,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    daemon.adopt_orphans();
    daemon.reconcile().await;
    tokio::spawn(daemon.clone().apply_events(events));
    daemon.resume_monitors();
    daemon.executor.refill();
    if let Err(e) = daemon.gc() {
        crate::note!("bgwork daemon: gc at start failed: {}", e.message);
    }
    let me = nix::unistd::geteuid().as_raw();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let daemon = daemon.clone();
                    tokio::spawn(async move { serve_client(daemon, stream, me).await });
                }
                Err(e) => crate::note!("bgwork daemon: accept failed: {e}"),
            },
            _ = shutdown.changed() => break,
        }
    }
    crate::note!("bgwork daemon: shut down; running work goes on under its supervisors");
}

async fn serve_client(daemon: Arc<Daemon>, stream: UnixStream, me: u32) {
    let peer = stream.peer_cred().map(|c| c.uid());
    let (read_half, mut writer) = stream.into_split();
    if peer.ok() != Some(me) {
        // Not a usage error of the caller's (exit 2): this daemon is not theirs to use.
        let refusal = WireError::new(
            ErrorCode::Unavailable,
            "refused: this daemon serves only its own user",
        );
        let _ = writer
            .write_all(&wire::encode_result::<()>(&Err(refusal)))
            .await;
        return;
    }
    let mut reader = BufReader::new(read_half);
    loop {
        let line = match read_frame(&mut reader).await {
            Ok(Some(line)) => line,
            Ok(None) => return,
            Err(error) => {
                let _ = writer
                    .write_all(&wire::encode_result::<()>(&Err(error)))
                    .await;
                return;
            }
        };
        let envelope: Envelope = match serde_json::from_slice(&line) {
            Ok(envelope) => envelope,
            Err(e) => {
                let error = WireError::bad_request(format!(
                    "malformed request: {e}; send one JSON object per line with \"session\" and \"op\""
                ));
                if writer
                    .write_all(&wire::encode_result::<()>(&Err(error)))
                    .await
                    .is_err()
                {
                    return;
                }
                continue;
            }
        };
        let reply = match envelope.request {
            Request::Notices {
                peek, follow: true, ..
            } => {
                let session = envelope.session.clone();
                if let Err(error) = daemon.check_session(&session) {
                    let _ = writer
                        .write_all(&wire::encode_result::<()>(&Err(error)))
                        .await;
                    return;
                }
                let gone = client_gone(&mut reader);
                daemon
                    .follow_notices(&session, peek, &mut writer, gone)
                    .await;
                return;
            }
            Request::Run(args) => {
                // The connection is the run's: its output, and the caller's stdin.
                let forward = args.stdin == wire::RunStdin::Forward;
                let result = match daemon.check_session(&envelope.session) {
                    Ok(()) => {
                        let caller = super::run::Caller {
                            reader: &mut reader,
                            writer: &mut writer,
                        };
                        daemon.run(&envelope.session, args, caller).await
                    }
                    Err(e) => Err(e),
                };
                if writer
                    .write_all(&wire::encode_result(&result))
                    .await
                    .is_err()
                    || forward
                {
                    // What the caller sends after the reply is the rest of its stdin.
                    return;
                }
                continue;
            }
            Request::Wait(_)
            | Request::Notices {
                wait_s: Some(_), ..
            } => {
                let gone = client_gone(&mut reader);
                tokio::select! {
                    reply = daemon.dispatch(envelope) => reply,
                    _ = gone => return,
                }
            }
            _ => daemon.dispatch(envelope).await,
        };
        if writer.write_all(&reply.line).await.is_err() {
            return;
        }
        daemon.delivered(&reply.deliver);
    }
}

/// Reads one request line, refusing it once it passes [`MAX_FRAME`] bytes.
async fn read_frame(reader: &mut BufReader<OwnedReadHalf>) -> Result<Option<Vec<u8>>, WireError> {
    let mut line = Vec::new();
    loop {
        let buf = match reader.fill_buf().await {
            Ok(buf) => buf,
            Err(_) => return Ok(None),
        };
        if buf.is_empty() {
            return Ok((!line.is_empty()).then_some(line));
        }
        if let Some(end) = buf.iter().position(|&b| b == b'\n') {
            line.extend_from_slice(&buf[..end]);
            reader.consume(end + 1);
            return Ok(Some(line));
        }
        let n = buf.len();
        line.extend_from_slice(buf);
        reader.consume(n);
        if line.len() > MAX_FRAME {
            return Err(WireError::new(
                ErrorCode::TooLarge,
                format!("request refused: larger than {MAX_FRAME} bytes"),
            ));
        }
    }
}

/// Resolves when the client closes its side of the connection.
async fn client_gone(reader: &mut BufReader<OwnedReadHalf>) {
    match reader.fill_buf().await {
        Ok([]) | Err(_) => {}
        Ok(_) => std::future::pending::<()>().await,
    }
}

/// Writes a stream of lines (for `notices --follow`); false once the client is gone.
pub(crate) async fn write_line(writer: &mut OwnedWriteHalf, line: &[u8]) -> bool {
    writer.write_all(line).await.is_ok()
}

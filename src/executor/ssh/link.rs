//! One connection per host: the system's OpenSSH client, run once per host as a
//! connection master (`ControlMaster`, its socket in a private folder of the home), and
//! over it one `ssh -T` channel to `bgwork ssh-relay` on the host, which carries
//! bgwork's own JSON-lines requests to the host's daemon. Requests are numbered: the
//! relay answers each as `N <reply line>` (a `read` with `output_frame` followed by its
//! output, raw), in any order, so a slow request (a stop's grace) holds up no other; a
//! line `-N` drops request N there (a `wait` whose set of jobs changed).
//!
//! A link that fails is marked down with ssh's own words and when it went down; it is
//! tried again with back-off, and while it is down every request fails at once (no
//! caller waits on a host that cannot be reached).

use super::call::{explain, SshCall, CONNECT_TIMEOUT_S};
use super::deploy;
use crate::wire::{Envelope, WireError};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

/// How long one request may take beyond what it asks for itself.
const PATIENCE: Duration = Duration::from_secs(30);
/// The first and the longest wait before a link that failed is tried again.
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_MOST: Duration = Duration::from_secs(10);

/// How long the host's daemon stays with no work and no link before it ends:
/// `BGWORK_HOST_EXIT_WHEN_IDLE_MS` of this daemon (a whole number of ms, at least 100),
/// else 10 minutes.
fn host_exit_when_idle_ms() -> u64 {
    std::env::var("BGWORK_HOST_EXIT_WHEN_IDLE_MS")
        .ok()
        .and_then(|ms| ms.trim().parse::<u64>().ok())
        .map_or(600_000, |ms| ms.max(100))
}

/// Why a request to a host did not get its answer.
#[derive(Debug, Clone)]
pub enum LinkError {
    /// The host cannot be reached now (ssh's words, and the fix): try again later.
    Down(String),
    /// The request was sent, and the connection failed before its answer: the host may
    /// have carried it out.
    InDoubt(String),
    /// The host's daemon answered with an error.
    Refused(WireError),
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkError::Down(why) | LinkError::InDoubt(why) => f.write_str(why),
            LinkError::Refused(e) => f.write_str(&e.message),
        }
    }
}

/// A reply line and the output frame after it (empty when none).
pub type Reply = (Vec<u8>, Vec<u8>);
type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>>;

/// An open channel to the host's relay.
struct Channel {
    stdin: tokio::process::ChildStdin,
    pending: Pending,
    /// Ends (with its reader) when the channel closes.
    closed: Arc<tokio::sync::Notify>,
    alive: Arc<std::sync::atomic::AtomicBool>,
    /// When (ms) the channel last brought a reply.
    heard: Arc<std::sync::atomic::AtomicI64>,
    _child: tokio::process::Child,
}

/// The link to one host.
pub struct Link {
    pub call: SshCall,
    /// The remote bgwork's home, as a shell word for the host (`"$HOME"/…`).
    pub remote_home: String,
    channel: tokio::sync::Mutex<Option<Channel>>,
    next: std::sync::atomic::AtomicU64,
    /// Since when (ms) and why the host cannot be reached.
    down: Mutex<Option<(i64, String)>>,
    /// When the next connection may be tried, and the back-off after it.
    retry: Mutex<(tokio::time::Instant, Duration)>,
    /// How many jobs' tasks use it now.
    jobs: Arc<std::sync::atomic::AtomicUsize>,
    /// What the host's relay said of logout when the channel last opened.
    logout: Mutex<Option<String>>,
    /// Room for the reads beyond each job's own that catch a mirror up
    /// ([`EXTRA_READS`]: the output they hold in memory is bounded per link, not per job).
    extra_reads: Arc<tokio::sync::Semaphore>,
}

/// How many reads beyond one per job may be in flight on a link.
const EXTRA_READS: usize = 6;

/// A job's task using a link: counted while it lives.
pub struct Busy(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Link {
    pub fn new(call: SshCall, remote_home: String) -> Link {
        Link {
            call,
            remote_home,
            channel: tokio::sync::Mutex::new(None),
            next: std::sync::atomic::AtomicU64::new(1),
            down: Mutex::new(None),
            retry: Mutex::new((tokio::time::Instant::now(), BACKOFF_FIRST)),
            jobs: Arc::default(),
            logout: Mutex::default(),
            extra_reads: Arc::new(tokio::sync::Semaphore::new(EXTRA_READS)),
        }
    }

    /// Set when jobs started on the host now die at logout there: why, and the fix.
    pub fn logout(&self) -> Option<String> {
        self.logout
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Room for one more read in flight to catch a mirror up, if the link has it.
    pub fn extra_read(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.extra_reads.clone().try_acquire_owned().ok()
    }

    /// Counts a job's task as using the link while the guard lives.
    pub fn busy(&self) -> Busy {
        self.jobs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Busy(self.jobs.clone())
    }

    /// "host unreachable since T (ssh: …)" while the link is down.
    pub fn unreachable(&self) -> Option<String> {
        let down = self.down.lock().unwrap_or_else(|p| p.into_inner());
        down.as_ref().map(|(since, why)| {
            format!(
                "host {} unreachable since {}: {why}",
                self.call.host,
                crate::paths::rfc3339(*since)
            )
        })
    }

    fn mark_down(&self, why: &str) {
        let mut down = self.down.lock().unwrap_or_else(|p| p.into_inner());
        if down.is_none() {
            crate::note!("bgwork daemon: {why}");
            *down = Some((crate::paths::now_ms(), why.to_string()));
        } else if let Some((_, old)) = down.as_mut() {
            *old = why.to_string();
        }
        let mut retry = self.retry.lock().unwrap_or_else(|p| p.into_inner());
        retry.0 = tokio::time::Instant::now() + retry.1;
        retry.1 = (retry.1 * 2).min(BACKOFF_MOST);
    }

    /// Lets the next request try the host now, whatever the back-off: a start asked for
    /// this host succeeds as soon as the host answers (when no job's task kept the link
    /// open, nothing else would have tried it since it came back). A job's mirror keeps
    /// the back-off.
    pub fn try_now(&self) {
        self.retry.lock().unwrap_or_else(|p| p.into_inner()).0 = tokio::time::Instant::now();
    }

    fn mark_up(&self) {
        *self.down.lock().unwrap_or_else(|p| p.into_inner()) = None;
        *self.retry.lock().unwrap_or_else(|p| p.into_inner()) =
            (tokio::time::Instant::now(), BACKOFF_FIRST);
    }

    /// Sends one request to the host's daemon and returns its reply line.
    pub async fn request(
        &self,
        envelope: &Envelope,
        takes: Duration,
    ) -> Result<Vec<u8>, LinkError> {
        self.request_frame(envelope, takes)
            .await
            .map(|(line, _)| line)
    }

    /// Sends one request and returns its reply line and the output frame after it
    /// (a `read` with `output_frame`).
    pub async fn request_frame(
        &self,
        envelope: &Envelope,
        takes: Duration,
    ) -> Result<Reply, LinkError> {
        match self
            .request_or(envelope, takes, std::future::pending::<()>())
            .await?
        {
            Some(reply) => Ok(reply),
            None => Err(LinkError::Down("the request was cancelled".into())),
        }
    }

    /// Sends one request and returns its reply, or `None` once `cancel` is ready first:
    /// then the relay is told to drop it (`-N`: it closes the request's connection to
    /// the host's daemon, so a cancelled `wait` holds nothing there).
    pub async fn request_or(
        &self,
        envelope: &Envelope,
        takes: Duration,
        cancel: impl std::future::Future<Output = ()>,
    ) -> Result<Option<Reply>, LinkError> {
        let (id, answer, closed, alive, heard, pending) = {
            let mut channel = self.channel.lock().await;
            let open = channel
                .as_ref()
                .is_some_and(|c| c.alive.load(std::sync::atomic::Ordering::SeqCst));
            if !open {
                *channel = None;
                let wait = self.retry.lock().unwrap_or_else(|p| p.into_inner()).0;
                if tokio::time::Instant::now() < wait {
                    if let Some(why) = self.unreachable() {
                        return Err(LinkError::Down(why));
                    }
                }
                match self.open().await {
                    Ok(opened) => {
                        self.mark_up();
                        *channel = Some(opened);
                    }
                    Err(why) => {
                        self.mark_down(&why);
                        return Err(LinkError::Down(self.unreachable().unwrap_or(why)));
                    }
                }
            }
            let Some(open) = channel.as_mut() else {
                return Err(LinkError::Down("no channel".into()));
            };
            let id = self.next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let (tx, rx) = oneshot::channel();
            open.pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, tx);
            let mut line = format!("{id} ").into_bytes();
            line.extend_from_slice(&serde_json::to_vec(envelope).unwrap_or_default());
            line.push(b'\n');
            if let Err(e) = open.stdin.write_all(&line).await {
                open.alive.store(false, std::sync::atomic::Ordering::SeqCst);
                let why = format!("the connection to {} broke: {e}", self.call.host);
                self.mark_down(&why);
                return Err(LinkError::Down(why));
            }
            let _ = open.stdin.flush().await;
            (
                id,
                rx,
                open.closed.clone(),
                open.alive.clone(),
                open.heard.clone(),
                open.pending.clone(),
            )
        };
        tokio::select! {
            biased;
            reply = answer => match reply {
                Ok(reply) => Ok(Some(reply)),
                Err(_) => {
                    let why = format!("the connection to {} closed", self.call.host);
                    self.mark_down(&why);
                    Err(LinkError::InDoubt(self.unreachable().unwrap_or(why)))
                }
            },
            _ = cancel => {
                pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
                self.cancel(id, &alive).await;
                Ok(None)
            }
            _ = closed.notified() => {
                let why = format!("the connection to {} closed", self.call.host);
                self.mark_down(&why);
                Err(LinkError::InDoubt(self.unreachable().unwrap_or(why)))
            }
            _ = tokio::time::sleep(PATIENCE + takes) => {
                pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
                let quiet_ms = crate::paths::now_ms()
                    - heard.load(std::sync::atomic::Ordering::SeqCst);
                if quiet_ms < PATIENCE.as_millis() as i64 {
                    // Other replies come: this one request is slow there (a loaded
                    // host), not the link; the requests in flight keep their channel.
                    return Err(LinkError::InDoubt(format!(
                        "{} did not answer request {id} within {} s",
                        self.call.host,
                        (PATIENCE + takes).as_secs()
                    )));
                }
                // A channel that does not answer at all is given up, and opened again.
                alive.store(false, std::sync::atomic::Ordering::SeqCst);
                let why = format!("{} did not answer request {id} within {} s", self.call.host, (PATIENCE + takes).as_secs());
                self.mark_down(&why);
                Err(LinkError::InDoubt(why))
            }
        }
    }

    /// Tells the relay of the channel `alive` belongs to (if it is still the open one)
    /// to drop request `id`; its reply, if one comes, is read and thrown away.
    async fn cancel(&self, id: u64, alive: &Arc<std::sync::atomic::AtomicBool>) {
        let mut channel = self.channel.lock().await;
        let Some(open) = channel.as_mut() else {
            return;
        };
        if !Arc::ptr_eq(&open.alive, alive) || !alive.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let line = format!("-{id}\n");
        if open.stdin.write_all(line.as_bytes()).await.is_err() {
            open.alive.store(false, std::sync::atomic::Ordering::SeqCst);
            return;
        }
        let _ = open.stdin.flush().await;
    }

    /// Makes sure the host has this bgwork, then opens the relay's channel and checks
    /// that it speaks this version.
    async fn open(&self) -> Result<Channel, String> {
        let bin = deploy::ensure(&self.call).await?;
        // The host's daemon (started by the relay when none answers) ends on its own
        // once it has had no work and no link for a while.
        // It looks for no ports (a job on a host is watched for none: `port` is refused
        // there), so the mirror's reads cost it no scan of the host's sockets.
        let remote = format!(
            "BGWORK_HOME={home} BGWORK_EXIT_WHEN_IDLE_MS={idle} BGWORK_PORTS=0 exec {bin} ssh-relay",
            home = self.remote_home,
            idle = host_exit_when_idle_ms(),
            bin = deploy::shell_quote(&bin)
        );
        let mut command = self.call.command(&remote);
        command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = command
            .spawn()
            .map_err(|e| format!("could not run ssh (install openssh-client): {e}"))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        // Output crosses in chunks of megabytes: a larger pipe wakes ssh and this daemon
        // less often for them.
        wide_pipe(&stdout);
        let mut stderr = child.stderr.take().ok_or("no stderr")?;
        let mut lines = tokio::io::BufReader::new(stdout);
        let mut hello = Vec::new();
        let read = tokio::time::timeout(
            Duration::from_secs(u64::from(CONNECT_TIMEOUT_S) + 20),
            lines.read_until(b'\n', &mut hello),
        )
        .await;
        if !matches!(read, Ok(Ok(n)) if n > 0) {
            let _ = child.start_kill();
            let mut said = String::new();
            let _ = tokio::time::timeout(
                Duration::from_secs(2),
                tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut said),
            )
            .await;
            return Err(explain(&self.call.host, &said));
        }
        let hello = super::relay::check_hello(&self.call.host, &hello)?;
        *self.logout.lock().unwrap_or_else(|p| p.into_inner()) = hello.logout;
        let pending: Pending = Arc::default();
        let closed = Arc::new(tokio::sync::Notify::new());
        let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let heard = Arc::new(std::sync::atomic::AtomicI64::new(crate::paths::now_ms()));
        tokio::spawn(read_replies(
            lines,
            pending.clone(),
            closed.clone(),
            alive.clone(),
            heard.clone(),
        ));
        // ssh's complaints after the channel opened go to the daemon's log.
        let host = self.call.host.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                crate::note!("bgwork daemon: ssh {host}: {line}");
            }
        });
        Ok(Channel {
            stdin,
            pending,
            closed,
            alive,
            heard,
            _child: child,
        })
    }
}

/// Makes a pipe hold 1 MiB (the most an unprivileged process may ask by default); a
/// pipe that cannot grow stays as it is.
pub fn wide_pipe(pipe: &impl std::os::fd::AsFd) {
    let _ = nix::fcntl::fcntl(pipe.as_fd(), nix::fcntl::FcntlArg::F_SETPIPE_SZ(1 << 20));
}

async fn read_replies(
    mut lines: tokio::io::BufReader<tokio::process::ChildStdout>,
    pending: Pending,
    closed: Arc<tokio::sync::Notify>,
    alive: Arc<std::sync::atomic::AtomicBool>,
    heard: Arc<std::sync::atomic::AtomicI64>,
) {
    loop {
        let mut line = Vec::new();
        match lines.read_until(b'\n', &mut line).await {
            Ok(n) if n > 0 && line.ends_with(b"\n") => {
                heard.store(crate::paths::now_ms(), std::sync::atomic::Ordering::SeqCst);
                line.pop();
                let Some(space) = line.iter().position(|&b| b == b' ') else {
                    continue;
                };
                let id = std::str::from_utf8(&line[..space])
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok());
                let Some(id) = id else { continue };
                let body = line[space + 1..].to_vec();
                let mut frame = Vec::new();
                if let Some(n) = super::relay::frame_len(&body) {
                    frame.resize(n as usize, 0);
                    if tokio::io::AsyncReadExt::read_exact(&mut lines, &mut frame)
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
                let waiter = pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id);
                if let Some(waiter) = waiter {
                    let _ = waiter.send((body, frame));
                }
            }
            _ => break,
        }
    }
    alive.store(false, std::sync::atomic::Ordering::SeqCst);
    pending.lock().unwrap_or_else(|p| p.into_inner()).clear();
    closed.notify_waiters();
}

/// The links of a daemon, one per host, made when first needed.
pub struct Links {
    config: Option<PathBuf>,
    control_dir: PathBuf,
    remote_home: String,
    links: Mutex<HashMap<String, Arc<Link>>>,
}

impl Links {
    pub fn new(home: &Path, home_id: &str) -> Links {
        Links {
            config: std::env::var_os("BGWORK_SSH_CONFIG")
                .filter(|c| !c.is_empty())
                .map(PathBuf::from),
            control_dir: home.join("ssh"),
            remote_home: format!("\"$HOME\"/.bgwork-remote/{home_id}"),
            links: Mutex::default(),
        }
    }

    pub fn of(&self, host: &str) -> Arc<Link> {
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        links
            .entry(host.to_string())
            .or_insert_with(|| {
                let _ = make_private_dir(&self.control_dir);
                Arc::new(Link::new(
                    SshCall {
                        host: host.to_string(),
                        config: self.config.clone(),
                        control_dir: self.control_dir.clone(),
                    },
                    self.remote_home.clone(),
                ))
            })
            .clone()
    }

    /// The links that jobs use now.
    pub fn busy(&self) -> Vec<Arc<Link>> {
        let links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        links
            .values()
            .filter(|l| l.jobs.load(std::sync::atomic::Ordering::SeqCst) > 0)
            .cloned()
            .collect()
    }

    /// The link of `host` if one was made.
    pub fn known(&self, host: &str) -> Option<Arc<Link>> {
        self.links
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(host)
            .cloned()
    }
}

fn make_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        }
        Err(e) => Err(e),
    }
}

//! The test harness: a temporary `BGWORK_HOME` with a real daemon, driven through the
#![allow(dead_code)]
//! real `bgwork` binary.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_bgwork");

/// A throw-away home; its daemon and work are stopped when it is dropped.
pub struct Home {
    pub dir: tempfile::TempDir,
    pub env: Vec<(String, String)>,
    pub session: String,
}

/// What one CLI call printed and returned.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub raw_stdout: Vec<u8>,
}

impl Run {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", self.stdout, self.stderr))
    }
}

impl Home {
    pub fn new() -> Home {
        let dir = tempfile::Builder::new()
            .prefix("bgw")
            .tempdir_in("/tmp")
            .expect("temp home");
        Home {
            dir,
            // Tests start work faster than any agent should: the start-rate guard is off
            // unless a test sets it (tests/it/search.rs does).
            env: vec![("BGWORK_MAX_STARTS_PER_MINUTE".into(), "0".into())],
            session: "test".to_string(),
        }
    }

    /// A setting for the daemon (and every call), e.g. `BGWORK_MAX_RUNNING`.
    pub fn with(mut self, key: &str, value: &str) -> Home {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        command
            .args(args)
            .env("BGWORK_HOME", self.path())
            .env("BGWORK_SESSION", &self.session)
            .env_remove("BGWORK_JOB")
            .stdin(Stdio::null());
        for (k, v) in &self.env {
            command.env(k, v);
        }
        command
    }

    /// Runs `bgwork ARGS` and returns what it printed.
    pub fn run(&self, args: &[&str]) -> Run {
        let output: Output = self.command(args).output().expect("run bgwork");
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            raw_stdout: output.stdout,
        }
    }

    /// Runs `bgwork --json ARGS`, expects success, and returns the reply.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let run = self.run(&all);
        if run.code != 0 {
            let log = std::fs::read_to_string(self.path().join("daemon.log")).unwrap_or_default();
            panic!(
                "bgwork {args:?} failed: {}{}\ndaemon.log:\n{log}",
                run.stdout, run.stderr
            );
        }
        run.json()
    }

    /// Runs `bgwork --json ARGS` expecting an error; returns its code.
    pub fn error(&self, args: &[&str]) -> (i32, String, String) {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let run = self.run(&all);
        assert_ne!(run.code, 0, "bgwork {args:?} should fail: {}", run.stdout);
        let reply = run.json();
        let code = reply["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let message = reply["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        (run.code, code, message)
    }

    /// Starts a job (window 0) and returns its id.
    pub fn start(&self, command: &str) -> String {
        self.start_with(&[], command)
    }

    /// `start --window 0 OPTIONS -- COMMAND`: the reply as it comes, which may be before
    /// the process runs (or, with `--after`, while the item waits).
    pub fn start_reply(&self, options: &[&str], command: &str) -> Value {
        let mut args = vec!["start", "--window", "0"];
        args.extend_from_slice(options);
        args.extend_from_slice(&["--", command]);
        self.json(&args)
    }

    /// Starts a job (window 0) with `options` and returns its id once it runs.
    pub fn start_with(&self, options: &[&str], command: &str) -> String {
        let reply = self.start_reply(options, command);
        let id = reply["id"].as_str().expect("an id").to_string();
        // With no window the reply comes before the process runs: wait until it does.
        eventually(Duration::from_secs(20), || {
            self.item(&id)["state"] != "starting"
        });
        id
    }

    /// Starts a job with the restart policy `on-failure`, at most `max_restarts` restarts
    /// and back-off `backoff`, and further `options`; returns its id once it runs.
    pub fn start_restarting(
        &self,
        max_restarts: &str,
        backoff: &str,
        options: &[&str],
        command: &str,
    ) -> String {
        let mut all = vec![
            "--restart",
            "on-failure",
            "--max-restarts",
            max_restarts,
            "--backoff",
            backoff,
        ];
        all.extend_from_slice(options);
        self.start_with(&all, command)
    }

    /// Waits for an item to end and returns it.
    pub fn wait_end(&self, id: &str) -> Value {
        let reply = self.run(&["--json", "wait", id, "--timeout", "30"]).json();
        assert_eq!(reply["reason"], "ended", "{id} did not end: {reply}");
        reply["items"][0].clone()
    }

    pub fn item(&self, id: &str) -> Value {
        let list = self.json(&["list", "--all"]);
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("{id} not listed: {list}"))
    }

    /// Starts the home's daemon if none runs (`status` never starts one; `list` does).
    pub fn start_daemon(&self) {
        self.json(&["list"]);
    }

    pub fn daemon_pid(&self) -> i32 {
        self.start_daemon();
        self.json(&["status"])["pid"].as_i64().unwrap() as i32
    }

    /// Kills the daemon with SIGKILL and waits until it is gone: its listening socket
    /// refuses connections (its last thread may exit after its leader is a zombie), or
    /// another daemon serves it already (a client, an MCP server's follower, started one).
    pub fn kill_daemon(&self) {
        let pid = self.daemon_pid();
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        eventually(Duration::from_secs(10), || {
            if std::os::unix::net::UnixStream::connect(self.socket()).is_err() {
                return true;
            }
            let status = self.run(&["--json", "status"]);
            status.code == 0
                && serde_json::from_str::<Value>(&status.stdout)
                    .ok()
                    .and_then(|s| s["pid"].as_i64())
                    .is_some_and(|now| now != pid as i64)
        });
    }

    pub fn socket(&self) -> PathBuf {
        self.path().join("bgwork.sock")
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = self
            .command(&["shutdown", "--stop-work"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Polls `condition` until it holds or `timeout` passes; panics on timeout.
pub fn eventually(timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "condition not met within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for a child to end, reading its output as it comes (as a harness does: a
/// rewake hook acknowledges its notice only once its stderr was read); kills it, by
/// pid, and fails the test past `limit`.
pub fn finish_within(child: Child, limit: Duration) -> Output {
    let pid = child.id();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    match receiver.recv_timeout(limit) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("still running after {limit:?}");
        }
    }
}

/// Runs a command to its end with its stdout and stderr read, failing the test when
/// it takes longer than `limit`.
pub fn output_within(mut command: Command, limit: Duration) -> Output {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    finish_within(child, limit)
}

/// Feeds one hook event to `command` (a `bgwork hook …`) on its stdin; returns how it
/// ended and what it printed.
pub fn hook_output(mut command: Command, event: &Value) -> Output {
    fed_hook(&mut command, event).wait_with_output().unwrap()
}

/// Feeds one hook event to `command` (a `bgwork hook …`) on its stdin, then closes it;
/// returns how it ended with its stdout and stderr, failing the test past `limit`.
pub fn hook_within(mut command: Command, event: &Value, limit: Duration) -> Output {
    command.stderr(Stdio::piped());
    finish_within(fed_hook(&mut command, event), limit)
}

/// Spawns `command` with its stdout read, writes `event` to its stdin and closes it.
fn fed_hook(command: &mut Command, event: &Value) -> Child {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(
        &mut child.stdin.take().unwrap(),
        event.to_string().as_bytes(),
    )
    .unwrap();
    child
}

/// A folder with a `go` file the test makes to let a job on.
pub struct Gate(tempfile::TempDir);

impl Gate {
    pub fn new() -> Gate {
        Gate(tempfile::tempdir().unwrap())
    }
    pub fn dir(&self) -> String {
        self.0.path().display().to_string()
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
    /// A shell line that waits for `go` in this folder, then runs `then`.
    pub fn after_go(&self, then: &str) -> String {
        format!(
            "while [ ! -f '{}' ]; do sleep 0.02; done; {then}",
            self.path("go").display()
        )
    }
    pub fn open(&self) {
        std::fs::write(self.path("go"), "").unwrap();
    }
    pub fn exists(&self, name: &str) -> bool {
        self.path(name).exists()
    }
}

/// Whether a process is alive (not a zombie).
/// The `bgwork supervise` processes whose parent is `daemon`: each running job's, and
/// the idle one the daemon keeps for the next start.
pub fn supervisors_of(daemon: i32) -> Vec<i32> {
    let parent = |pid: i32| -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let after = stat.get(stat.rfind(')')? + 2..)?;
        after.split(' ').nth(1)?.parse().ok()
    };
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            cmdline.split(|&b| b == 0).nth(1) == Some(b"supervise".as_slice())
                && parent(pid) == Some(daemon)
                && alive(pid)
        })
        .collect()
}

pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

/// CPU time (user + system) a process has used, from `/proc/PID/stat` (in clock
/// ticks of 10 ms).
pub fn cpu_time(pid: i32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

/// Pids of processes whose environment holds `BGWORK_HOME=home` (the jobs of a home).
pub fn processes_of(home: &Path) -> Vec<i32> {
    let marker = format!("BGWORK_HOME={}", home.display());
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if environ.split(|&b| b == 0).any(|v| v == marker.as_bytes()) && alive(pid) {
            pids.push(pid);
        }
    }
    pids
}

/// Whether a process holds a socket (a client that has connected).
pub fn has_socket(pid: i32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten().any(|fd| {
                std::fs::read_link(fd.path())
                    .map(|l| l.to_string_lossy().starts_with("socket:"))
                    .unwrap_or(false)
            })
        })
        .unwrap_or(false)
}

/// Says that `test` did not run and why, on stderr and, when `BGWORK_TEST_NOT_RUN`
/// names a file (`scripts/test` sets one), in a line of it: the run ends with the list,
/// so a test that returned early never counts as passed.
pub fn not_run(test: &str, why: &str) {
    eprintln!("{test}: NOT RUN: {why}");
    if let Some(path) = std::env::var_os("BGWORK_TEST_NOT_RUN") {
        let line = format!("{test}: {why}\n");
        let file = std::fs::OpenOptions::new().append(true).open(path);
        // One short write in append mode: lines of tests running at once never mix.
        if let Ok(mut file) = file {
            let _ = std::io::Write::write_all(&mut file, line.as_bytes());
        }
    }
}

/// The name of the test running on this thread (the harness names its threads so).
pub fn this_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string()
}

/// Whether a test that needs root (to mount a small tmpfs) is skipped: it is when the
/// mount failed and this is no root, with the reason printed; as root a failed mount is
/// a failure.
pub fn skipped_without_root(mounted: bool) -> bool {
    if mounted {
        return false;
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        == Some("0");
    assert!(
        !root,
        "mounting a small tmpfs failed although this runs as root"
    );
    not_run(&this_test(), "it mounts a small tmpfs, which needs root");
    true
}

/// A home on a 3 MiB tmpfs, for full-disk tests: `None` (the test is skipped, with the
/// reason printed) where no tmpfs can be mounted and this is no root. When dropped, it
/// stops the home's daemon and work, then unmounts.
pub fn small_disk(home: &Home) -> Option<SmallDisk> {
    // mode=700: a home others may write in is refused (a tmpfs is 1777 by default).
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=3m,mode=700", "tmpfs"])
        .arg(home.path())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if skipped_without_root(mounted) {
        return None;
    }
    Some(SmallDisk(home.path().to_path_buf()))
}

pub struct SmallDisk(PathBuf);

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new(BIN)
            .args(["shutdown", "--stop-work"])
            .env("BGWORK_HOME", &self.0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The live (not zombie) `bgwork SUBCOMMAND` processes whose `BGWORK_HOME` is `home`,
/// found in `/proc` (only looked at: a test ends nothing it finds this way).
pub fn bgwork_processes(subcommand: &str, home: &Path) -> Vec<i32> {
    let want = format!("BGWORK_HOME={}", home.display());
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            cmdline
                .split(|&b| b == 0)
                .any(|arg| arg == subcommand.as_bytes())
                && environ.split(|&b| b == 0).any(|v| v == want.as_bytes())
                && !state.contains(") Z ")
        })
        .collect()
}

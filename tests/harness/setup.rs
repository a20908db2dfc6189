//! What each harness test stands on: the harness installed from npm at its pinned version
//! into a cache under `target/` (never globally), and a private world for one run: a
//! HOME with the user's settings, a project folder, a `BGWORK_HOME` whose daemon the
//! hooks and the MCP server start, and the `bgwork` under test first on PATH.
//!
//! A harness that cannot be installed (no node, no npm, the registry out of reach) fails
//! its test with a loud line, unless `BGWORK_TEST_HARNESS=skip`: then the test says NOT
//! RUN on stderr and in `target/harness-not-run` (which `scripts/test` prints at its end).

use crate::server::{excerpt, text, ModelServer, Step};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_bgwork");

/// The versions tested (docs/harnesses.md says the same).
pub const CLAUDE_CODE: (&str, &str, &str) = ("@anthropic-ai/claude-code", "2.1.332", "claude");
pub const CODEX: (&str, &str, &str) = ("@openai/codex", "0.171.0", "codex");
pub const GEMINI: (&str, &str, &str) = ("@google/gemini-cli", "0.61.0", "gemini");

/// The target folder the test binary was built into.
pub fn target_dir() -> PathBuf {
    Path::new(BIN)
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

/// The harness's executable, installed into `target/harness-npm/` when missing; `None`
/// (after saying so loudly) when it cannot be and `BGWORK_TEST_HARNESS=skip`.
pub fn installed(test: &str, (package, version, bin): (&str, &str, &str)) -> Option<PathBuf> {
    static INSTALLING: Mutex<()> = Mutex::new(());
    let _one = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = target_dir()
        .join("harness-npm")
        .join(format!("{}@{version}", package.replace('/', "+")));
    let exe = dir.join("node_modules/.bin").join(bin);
    let done = dir.join(".installed");
    if done.exists() && exe.exists() {
        return Some(exe);
    }
    std::fs::create_dir_all(&dir).unwrap();
    let started = Instant::now();
    let result = Command::new("npm")
        .args([
            "install",
            "--no-audit",
            "--no-fund",
            "--no-save",
            "--prefix",
        ])
        .arg(&dir)
        .arg(format!("{package}@{version}"))
        .stdin(Stdio::null())
        .output();
    let why = match result {
        Ok(out) if out.status.success() && exe.exists() => {
            std::fs::write(&done, "").unwrap();
            eprintln!(
                "harness: installed {package}@{version} in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            return Some(exe);
        }
        Ok(out) => format!(
            "npm install {package}@{version} failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .filter(|l| l.to_lowercase().contains("err"))
                .take(3)
                .collect::<Vec<_>>()
                .join(" / ")
        ),
        Err(e) => format!("npm could not run ({e}): apt-get install nodejs npm"),
    };
    not_run(test, &why)
}

pub fn not_run<T>(test: &str, why: &str) -> Option<T> {
    let line = format!("HARNESS TEST NOT RUN: {test}: {why}");
    eprintln!("\n{line}\n");
    if std::env::var("BGWORK_TEST_HARNESS").as_deref() == Ok("skip") {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(target_dir().join("harness-not-run"))
            .unwrap();
        let _ = writeln!(file, "{line}");
        return None;
    }
    panic!("{line} (BGWORK_TEST_HARNESS=skip lets the run go on, marked NOT RUN)");
}

/// A private world for one harness run.
pub struct World {
    pub dir: tempfile::TempDir,
    /// Extra environment for the harness (and so for its hooks and MCP server).
    pub env: Vec<(String, String)>,
}

impl World {
    pub fn new() -> World {
        let dir = tempfile::Builder::new()
            .prefix("bgwh")
            .tempdir_in("/tmp")
            .unwrap();
        for sub in ["home/.cargo/bin", "project", "bgwork"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        // Where `cargo install` puts `bgwork`, on PATH as rustup's `~/.profile` line puts
        // it (harnesses that run `bash -lc` read it again).
        std::os::unix::fs::symlink(BIN, dir.path().join("home/.cargo/bin/bgwork")).unwrap();
        std::fs::write(
            dir.path().join("home/.profile"),
            "PATH=\"$HOME/.cargo/bin:$PATH\"\n",
        )
        .unwrap();
        World {
            dir,
            env: Vec::new(),
        }
    }

    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    pub fn project(&self) -> PathBuf {
        self.dir.path().join("project")
    }

    pub fn bgwork_home(&self) -> PathBuf {
        self.dir.path().join("bgwork")
    }

    pub fn write(&self, relative: &str, text: &str) {
        let path = self.dir.path().join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// `exe ARGS` in the project folder with only this world's environment: the user's
    /// PATH with the `bgwork` under test first (in `~/.cargo/bin`), HOME, BGWORK_HOME and `env`.
    pub fn command(&self, exe: &Path, args: &[&str]) -> Command {
        let bin_dir = self.home().join(".cargo/bin");
        let mut command = Command::new(exe);
        command
            .args(args)
            .current_dir(self.project())
            .env_clear()
            .env(
                "PATH",
                format!("{}:/usr/local/bin:/usr/bin:/bin", bin_dir.display()),
            )
            .env("HOME", self.home())
            .env("BGWORK_HOME", self.bgwork_home())
            .env("LANG", "C.UTF-8")
            .env("TERM", "xterm-256color")
            .env("BGWORK_MAX_STARTS_PER_MINUTE", "0")
            .stdin(Stdio::null());
        for (k, v) in &self.env {
            command.env(k, v);
        }
        command
    }

    /// `bgwork ARGS` against this world's home.
    pub fn bgwork(&self, args: &[&str]) -> std::process::Output {
        self.command(Path::new(BIN), args).output().unwrap()
    }

    /// Runs `command` to its end, killing it (by pid) past `limit`.
    pub fn run(&self, mut command: Command, limit: Duration) -> Finished {
        let started = Instant::now();
        let child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the harness");
        let pid = child.id();
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = sender.send(child.wait_with_output());
        });
        let output = match receiver.recv_timeout(limit) {
            Ok(output) => output.unwrap(),
            Err(_) => {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
                panic!("the harness did not end within {limit:?}");
            }
        };
        if let Some(pid) = self.stray_daemon() {
            let _ = Command::new("kill").arg(pid.to_string()).status();
            panic!("a front end of the harness started a daemon (pid {pid}) in the default home, not in BGWORK_HOME: it did not get the user's environment");
        }
        Finished {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            took: started.elapsed(),
        }
    }
}

impl World {
    /// The pid of a daemon some front end started in the default home of this world's
    /// HOME (a harness that did not pass `BGWORK_HOME` on to it), if one runs.
    pub fn stray_daemon(&self) -> Option<i32> {
        let lock = self.home().join(".local/share/bgwork/daemon.lock");
        let pid: i32 = std::fs::read_to_string(lock).ok()?.trim().parse().ok()?;
        Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(pid) = self.stray_daemon() {
            eprintln!("harness: a daemon ran in the default home of the world's HOME (pid {pid}): stopping it");
            let _ = Command::new("kill").arg(pid.to_string()).status();
        }
        if self.bgwork_home().join("daemon.lock").exists()
            || std::fs::read_dir(self.bgwork_home()).is_ok_and(|mut d| d.next().is_some())
        {
            let _ = self.bgwork(&["shutdown", "--stop-work"]);
        }
    }
}

/// What a harness run printed.
#[derive(Debug)]
pub struct Finished {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub took: Duration,
}

impl Finished {
    /// Asserts that the harness ended with exit code 0, showing what it printed if not.
    pub fn expect_ok(&self) {
        assert_eq!(
            self.code, 0,
            "the harness failed after {:?}\nstdout: {}\nstderr: {}",
            self.took, self.stdout, self.stderr
        );
    }
}

/// How many times `needle` occurs in `haystack`.
pub fn occurrences(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

/// A world's daemon held stopped (SIGSTOP) until this is dropped: a daemon that does not
/// answer, as a hung or swapped-out one does.
pub struct StoppedDaemon(i32);

impl World {
    pub fn stop_daemon(&self) -> StoppedDaemon {
        let _ = self.bgwork(&["list"]);
        let status = self.bgwork(&["status", "--json"]);
        let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
        let pid = status["pid"].as_i64().expect("the daemon's pid") as i32;
        assert!(Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status()
            .unwrap()
            .success());
        StoppedDaemon(pid)
    }
}

impl Drop for StoppedDaemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

/// What a model must never be told by a hook whose daemon did not answer: that work
/// ended, or anything of bgwork's at all.
pub fn assert_nothing_said(everything: &str) {
    for false_word in ["background work ended", "bgwork hook", "bgwork:"] {
        assert!(
            !everything.contains(false_word),
            "a hook under a stopped daemon told the model {false_word:?}"
        );
    }
}

/// Waits (at most 30 s) until the world's session (`BGWORK_SESSION`) has a notice
/// pending, without taking it.
pub fn wait_for_pending_notice(world: &World) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let peek = world.bgwork(&["notices", "--peek", "--json"]);
        let peek: serde_json::Value = serde_json::from_slice(&peek.stdout).unwrap_or_default();
        if peek["notices"].as_array().is_some_and(|n| !n.is_empty()) {
            return;
        }
        assert!(Instant::now() < deadline, "no notice came: {peek}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The script of the MCP round that [`assert_mcp_round`] checks: a tool `start` of a
/// quick job with a secret, three shell calls, then `start` of a server, `read`,
/// `wait` and `stop` of it (`mcp` makes a call of bgwork's tool as the harness names it).
pub fn mcp_round_script(
    mcp: impl Fn(&str, serde_json::Value) -> Step,
    shell: impl Fn(&str) -> Step,
) -> Vec<Step> {
    use serde_json::json;
    vec![
        mcp(
            "start",
            json!({"command": "sleep 2; echo \"token $DEPLOY_TOKEN\"; printf '%s-%s\\n' end mcp-marker",
                "notify": true, "name": "quick", "secrets": ["DEPLOY_TOKEN"]}),
        ),
        shell("sleep 5"),
        shell("true"),
        shell("true"),
        mcp(
            "start",
            json!({"command": "echo serving-now; sleep 300", "name": "server"}),
        ),
        mcp("read", json!({"id": "bg-2"})),
        mcp("wait", json!({"id": "bg-2", "timeout_s": 1})),
        mcp("stop", json!({"id": "bg-2", "grace_s": 1})),
        text("All done."),
    ]
}

/// The script of the shell round that [`assert_shell_round`] checks: a
/// `bgwork start --notify --secret DEPLOY_TOKEN` whose job prints `end-` and `marker`
/// 2 s later, then three more shell calls.
pub fn shell_round_script(shell: impl Fn(&str) -> Step, marker: &str) -> Vec<Step> {
    vec![
        shell(&format!("bgwork start --notify --secret DEPLOY_TOKEN --name deploy -- 'sleep 2; echo \"token $DEPLOY_TOKEN\"; printf \"%s-%s\\n\" end {marker}'")),
        shell("sleep 5"),
        shell("true"),
        shell("true"),
        text("All done."),
    ]
}

/// What the scripted MCP round (start, read, wait, stop) showed the model: each tool's
/// answer at its step, the job's end once and at the next turn boundary, its secret
/// masked and never sent.
pub fn assert_mcp_round(server: &ModelServer, secret: &str) {
    let at = |step: usize| server.at(step).raw;
    assert!(at(1).contains("bg-1"), "start: {}", excerpt(&at(1)));
    assert!(at(6).contains("serving-now"), "read: {}", excerpt(&at(6)));
    assert!(at(7).contains("timeout"), "wait: {}", excerpt(&at(7)));
    assert!(at(8).contains("stopped"), "stop: {}", excerpt(&at(8)));
    assert_eq!(
        occurrences(&at(8), "end-mcp-marker"),
        1,
        "once: {}",
        excerpt(&at(8))
    );
    assert_eq!(occurrences(&at(1), "end-mcp-marker"), 0);
    assert!(
        at(8).contains("token [secret DEPLOY_TOKEN]"),
        "{}",
        excerpt(&at(8))
    );
    assert!(
        !server.everything_sent().contains(secret),
        "the secret reached the model"
    );
    assert_eq!(
        occurrences(&at(2), "end-mcp-marker"),
        1,
        "the end at the next turn boundary: {}",
        excerpt(&at(2))
    );
}

/// What the scripted shell round (a `bgwork start --notify --secret DEPLOY_TOKEN` whose
/// job prints `end-` and `marker`, then three more tool calls) showed the model: the
/// start, the end once at the next turn boundary in its one line, its secret masked
/// and never sent.
pub fn assert_shell_round(server: &ModelServer, marker: &str, secret: &str) {
    let at = |step: usize| server.at(step).raw;
    assert!(
        at(1).contains("bg-1 started"),
        "the start's reply reached the model: {}",
        excerpt(&at(1))
    );
    assert_eq!(occurrences(&at(1), marker), 0);
    assert_eq!(
        occurrences(&at(2), marker),
        1,
        "the end at the next turn boundary: {}",
        excerpt(&at(2))
    );
    assert_eq!(
        occurrences(&at(4), marker),
        1,
        "never twice: {}",
        excerpt(&at(4))
    );
    assert!(
        at(2).contains("[secret DEPLOY_TOKEN]"),
        "{}",
        excerpt(&at(2))
    );
    // Each notice says which id ended and how to read the rest, in one line.
    assert!(
        at(2).contains(
            "- bg-1 finished successfully (exit 0): `bgwork read bg-1` for its output [ntc-"
        ),
        "{}",
        excerpt(&at(2))
    );
    assert!(
        !server.everything_sent().contains(secret),
        "the secret reached the model"
    );
}

/// How a harness test makes its world: `None` when the harness is not installed (the
/// test does not run).
pub type MakeWorld = fn(&str, &ModelServer) -> Option<(World, PathBuf)>;

/// A harness run (`run`, given the world and the harness's binary) while the world's
/// daemon is held stopped: its shell tool (`shell`) runs `echo still-going`, and the
/// harness must go on within `limit` (each hook giving up within 1.25 s), with no hook
/// telling the model anything. `name` names the world and the server's saved log.
pub fn goes_on_under_a_stopped_daemon(
    name: &str,
    shell: impl Fn(&str) -> Step,
    world: MakeWorld,
    limit: Duration,
    run: impl FnOnce(&World, &Path) -> Finished,
) {
    let server = ModelServer::start(vec![shell("echo still-going"), text("Done.")]);
    let Some((world, harness)) = world(name, &server) else {
        return;
    };
    let stopped = world.stop_daemon();
    let finished = run(&world, &harness);
    drop(stopped);
    server.save(name);
    assert_went_on(&server, &finished, limit);
    eprintln!("{name}: under a stopped daemon in {:?}", finished.took);
}

/// A harness that went on under a stopped daemon: its tool ran, it finished within
/// `limit` (each hook giving up within 1.25 s), and no hook told the model anything.
pub fn assert_went_on(server: &ModelServer, finished: &Finished, limit: Duration) {
    finished.expect_ok();
    assert!(
        server.at(1).raw.contains("still-going"),
        "{}",
        excerpt(&server.at(1).raw)
    );
    assert!(finished.took < limit, "took {:?}", finished.took);
    assert_nothing_said(&server.everything_sent());
}

/// A harness that cannot wake an idle session: its shell tool (`shell`) starts, with
/// `--notify`, a job that prints `end-idle-marker` 3 s later; after the first prompt
/// (`first`, given the world and the harness's binary) the job ends while the session
/// is idle and nothing asks the model for 2 s; the next prompt (`next`, a resume of the
/// session) gets the end, once. `name` names the world and the server's saved log.
pub fn idle_session_gets_the_end_at_the_next_prompt(
    name: &str,
    shell: impl Fn(&str) -> Step,
    world: MakeWorld,
    first: impl FnOnce(&World, &Path) -> Finished,
    next: impl FnOnce(&World, &Path) -> Finished,
) {
    let server = ModelServer::start(vec![
        shell(
            "bgwork start --notify --name later -- 'sleep 3; printf \"%s-%s\\n\" end idle-marker'",
        ),
        text("Started it."),
        text("It ended; seen."),
    ]);
    let Some((world, harness)) = world(name, &server) else {
        return;
    };
    let world = &world;
    first(world, &harness).expect_ok();
    wait_for_pending_notice(world);
    let asked = server.requests().len();
    // Not a synchronisation: the 2 s in which no request may come.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        server.requests().len(),
        asked,
        "{name}: something woke the idle session"
    );
    let next = next(world, &harness);
    server.save(name);
    next.expect_ok();
    let at = |step: usize| server.at(step).raw;
    assert_eq!(occurrences(&at(1), "end-idle-marker"), 0);
    assert_eq!(
        occurrences(&at(2), "end-idle-marker"),
        1,
        "the next prompt: {}",
        excerpt(&at(2))
    );
}

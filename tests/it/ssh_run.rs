//! `run` and panes on a host reached with ssh (issue 24), and what a host's logind
//! means for the work there: against the real OpenSSH server of `scripts/ssh-host`,
//! as `tests/it/ssh.rs` (they run only with `BGWORK_TEST_SSH=1`, else say so and
//! return).

use crate::ssh::{clean_host, host, Host};
use crate::util::{eventually, Home};
use serde_json::{json, Value};
use std::io::BufRead;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A home whose daemon reaches the host; on drop its work is stopped and what it
/// left on the host removed.
struct OnHost {
    home: Home,
    host: Host,
}

impl OnHost {
    fn new(test: &str) -> Option<OnHost> {
        OnHost::with(test, Home::new())
    }

    fn with(test: &str, home: Home) -> Option<OnHost> {
        let host = host(test)?;
        let home = home.with("BGWORK_SSH_CONFIG", &host.config);
        Some(OnHost { home, host })
    }

    /// A home reaching an sshd of the test's own, which the test may take down (the
    /// shared host is never stopped).
    fn with_own_sshd(test: &str) -> Option<(crate::ssh::OwnSshd, OnHost)> {
        let sshd = crate::ssh::OwnSshd::new(&host(test)?);
        let h = OnHost {
            home: Home::new().with("BGWORK_SSH_CONFIG", &sshd.config()),
            host: Host {
                config: sshd.config(),
                alias: "bgwork-down".into(),
            },
        };
        Some((sshd, h))
    }

    fn on(&self) -> String {
        format!("ssh:{}", self.host.alias)
    }

    /// `bgwork ARGS` with `--on ssh:HOST` after the command's name, its stdout piped.
    fn spawn(&self, args: &[&str], stdin: Stdio) -> Child {
        let on = self.on();
        let mut all = args[..1].to_vec();
        all.extend(["--on", &on]);
        all.extend_from_slice(&args[1..]);
        self.home
            .command(&all)
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Takes the host away (no new logins, the open connection dropped) and waits
    /// until `id` is shown unreachable.
    fn cut(&self, sshd: &mut crate::ssh::OwnSshd, id: &str) {
        sshd.down();
        let control = self.home.path().join("ssh").join("%C");
        let _ = std::process::Command::new("ssh")
            .args(["-F", &self.host.config, "-o"])
            .arg(format!("ControlPath={}", control.display()))
            .args(["-O", "exit", &self.host.alias])
            .output();
        eventually(Duration::from_secs(30), || {
            self.home.item(id)["host_unreachable"].is_string()
        });
    }

    fn start_pane(&self, options: &[&str], command: &str) -> String {
        let on = self.on();
        let mut args = vec!["start", "--window", "0", "--pty", "--on", &on];
        args.extend_from_slice(options);
        args.extend(["--", command]);
        let id = self.home.json(&args)["id"].as_str().unwrap().to_string();
        eventually(Duration::from_secs(60), || {
            self.home.item(&id)["state"] != "starting"
        });
        id
    }
}

impl Drop for OnHost {
    fn drop(&mut self) {
        let _ = self.home.command(&["shutdown", "--stop-work"]).output();
        clean_host(&self.host, self.home.path());
    }
}

/// A folder both the test and the host's user reach (the host is this machine).
fn shared() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("bgw-ssh-run")
        .tempdir_in("/tmp")
        .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// The lines a child prints, as they come.
fn lines_of(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    let stdout = child.stdout.take().unwrap();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    receiver
}

/// The child's exit code, once it ended within `limit` (killed, by pid, past it).
fn exit_within(child: &mut Child, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn newest(home: &Home) -> Value {
    let listed = home.json(&["list", "--all"]);
    listed["items"].as_array().unwrap().last().cloned().unwrap()
}

#[test]
fn issue24_1_run_on_a_host_streams_as_it_comes_and_exits_with_the_commands_status() {
    let Some(h) = OnHost::new(
        "issue24_1_run_on_a_host_streams_as_it_comes_and_exits_with_the_commands_status",
    ) else {
        return;
    };
    let dir = shared();
    let gate = dir.path().join("gate");
    let job = format!(
        "whoami; echo first; while [ ! -e {} ]; do sleep 0.05; done; echo second; exit 3",
        gate.display()
    );
    let mut child = h.spawn(&["run", "--timeout", "120", "--", &job], Stdio::null());
    let lines = lines_of(&mut child);
    let mut seen = Vec::new();
    while !seen.iter().any(|l| l == "first") {
        let line = lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no streamed line: {seen:?}"));
        seen.push(line);
    }
    assert_eq!(seen, ["bgwork-ssh", "first"], "runs as the host's user");
    assert!(
        child.try_wait().unwrap().is_none(),
        "the output came while the job ran"
    );
    std::fs::write(&gate, "").unwrap();
    assert_eq!(exit_within(&mut child, Duration::from_secs(60)), Some(3));
    let rest: Vec<String> = lines.iter().collect();
    assert_eq!(rest, ["second"]);
    let item = newest(&h.home);
    assert_eq!(item["executor"], "ssh", "{item}");
    assert_eq!(item["end"], "failed", "{item}");
    assert_eq!(item["exit_code"], 3, "{item}");
    // The run showed its end: no notice of it is left.
    let notices = h.home.json(&["notices"]);
    assert_eq!(notices["notices"], json!([]), "{notices}");
}

#[test]
fn issue24_1_run_on_a_host_past_its_deadline_is_promoted_with_its_notice_armed() {
    let Some(h) =
        OnHost::new("issue24_1_run_on_a_host_past_its_deadline_is_promoted_with_its_notice_armed")
    else {
        return;
    };
    // The caller's stdin stays open (a terminal's would), so `read` waits past the
    // deadline; after the promotion the job takes `send`.
    let mut child = h.spawn(
        &[
            "run",
            "--json",
            "--timeout",
            "3",
            "--",
            "echo before; read x; echo after-$x; exit 4",
        ],
        Stdio::piped(),
    );
    let held = child.stdin.take();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0));
    let reply: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(reply["outcome"], "promoted", "{reply}");
    assert_eq!(reply["state"], "running", "{reply}");
    assert_eq!(reply["executor"], "ssh", "{reply}");
    assert!(
        reply["message"]
            .as_str()
            .unwrap()
            .contains("promoted to the background; a notice will come when it ends"),
        "{reply}"
    );
    let id = reply["id"].as_str().unwrap().to_string();
    assert!(reply["output"].as_str().unwrap().contains("before"));
    // The text form says it on stderr, exit 0.
    let mut text = h.spawn(
        &["run", "--timeout", "2", "--", "sleep 1000"],
        Stdio::null(),
    );
    assert_eq!(exit_within(&mut text, Duration::from_secs(60)), Some(0));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut text.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("promoted to the background"), "{stderr}");
    // Its notice is armed without --notify.
    h.home.json(&["send", &id, r"yes\n"]);
    // The caller's pipe ends only now (its end would be the job's end of input).
    drop(held);
    let notices = h.home.json(&["notices", "--wait", "60"]);
    assert_eq!(notices["notices"][0]["item"], id.as_str(), "{notices}");
    assert_eq!(notices["notices"][0]["exit_code"], 4, "{notices}");
    assert_eq!(
        h.home.json(&["read", &id, "--all"])["output"],
        "before\nafter-yes\n"
    );
    assert_eq!(
        h.home.json(&["read", &id])["output"],
        "after-yes\n",
        "the run showed the rest"
    );
}

#[test]
fn issue24_1_run_on_a_host_at_the_hosts_limit_is_killed_at_its_deadline_and_says_so() {
    let Some(h) = OnHost::with(
        "issue24_1_run_on_a_host_at_the_hosts_limit_is_killed_at_its_deadline_and_says_so",
        Home::new().with("BGWORK_MAX_RUNNING", "1"),
    ) else {
        return;
    };
    let on = h.on();
    let first = h
        .home
        .json(&["start", "--window", "0", "--on", &on, "--", "sleep 1000"]);
    let first = first["id"].as_str().unwrap().to_string();
    // This machine's slot is its own: a local job does not make the run's room.
    h.home.start("sleep 1000");
    let mut child = h.spawn(
        &["run", "--json", "--timeout", "2", "--", "exec sleep 1000"],
        Stdio::null(),
    );
    assert_eq!(exit_within(&mut child, Duration::from_secs(60)), Some(1));
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    let reply: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(reply["outcome"], "killed", "{reply}");
    assert_eq!(reply["state"], "ended", "{reply}");
    let message = reply["message"].as_str().unwrap();
    assert!(
        message.contains("limit of 1 running job on ssh hosts"),
        "{message}"
    );
    assert_eq!(h.home.item(&first)["state"], "running");
}

#[test]
fn issue24_1_a_run_on_a_host_whose_caller_is_interrupted_is_stopped_there_as_locally() {
    let Some(h) = OnHost::new(
        "issue24_1_a_run_on_a_host_whose_caller_is_interrupted_is_stopped_there_as_locally",
    ) else {
        return;
    };
    let mut child = h.spawn(
        &["run", "--timeout", "120", "--", "echo up; exec sleep 1000"],
        Stdio::null(),
    );
    let lines = lines_of(&mut child);
    assert_eq!(
        lines.recv_timeout(Duration::from_secs(60)).as_deref(),
        Ok("up")
    );
    let item = newest(&h.home);
    let id = item["id"].as_str().unwrap().to_string();
    let pid = item["pid"].as_i64().unwrap() as i32;
    assert!(crate::util::alive(pid), "the job runs on the host: {item}");
    // Ctrl-C in the caller's terminal: SIGINT to the CLI.
    let _ = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    exit_within(&mut child, Duration::from_secs(30));
    let ended = h
        .home
        .run(&["--json", "wait", &id, "--timeout", "60"])
        .json();
    assert_eq!(ended["reason"], "ended", "{ended}");
    assert_eq!(ended["items"][0]["end"], "stopped_by_person", "{ended}");
    // Its process on the host (this machine) is gone.
    eventually(Duration::from_secs(20), || !crate::util::alive(pid));
}

#[test]
fn issue24_1_mcp_run_with_on_runs_on_the_host() {
    let Some(h) = OnHost::new("issue24_1_mcp_run_with_on_runs_on_the_host") else {
        return;
    };
    let mut mcp = crate::mcp::Mcp::start(&h.home);
    let (error, reply) = mcp.call(
        "run",
        json!({"command": "echo on-$(whoami); exit 2", "on": h.on(), "timeout_s": 60}),
    );
    assert!(!error, "{reply}");
    assert_eq!(reply["outcome"], "ended", "{reply}");
    assert_eq!(reply["exit_code"], 2, "{reply}");
    assert_eq!(reply["executor"], "ssh", "{reply}");
    assert!(
        reply["output"].as_str().unwrap().contains("on-bgwork-ssh"),
        "{reply}"
    );
    // Without `on`, a run stays here.
    let (error, reply) = mcp.call("run", json!({"command": "true"}));
    assert!(!error, "{reply}");
    assert!(reply.get("executor").is_none(), "{reply}");
}

/// A process of the host's user whose command line is `argv` (the host is this
/// machine).
fn runs_on_host(argv: &[u8]) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        std::fs::read(entry.path().join("cmdline")).is_ok_and(|cmdline| cmdline == argv)
    })
}

#[test]
fn issue24_2_a_pane_on_a_host_takes_keys_shows_its_screen_resizes_and_hangs_up() {
    use crate::panes::{screen, until};
    let Some(h) =
        OnHost::new("issue24_2_a_pane_on_a_host_takes_keys_shows_its_screen_resizes_and_hangs_up")
    else {
        return;
    };
    let id = h.start_pane(&["--cols", "90", "--rows", "20"], "bash --norc -i");
    let item = h.home.item(&id);
    assert_eq!(item["kind"], "pane", "{item}");
    assert_eq!(item["executor"], "ssh", "{item}");
    h.home
        .json(&["send", &id, r"tput cols; echo hello-$(whoami)\n"]);
    until(&h.home, &id, "^hello-bgwork-ssh");
    let text = screen(&h.home, &id);
    assert!(text.lines().any(|l| l.trim() == "90"), "{text}");
    assert!(
        text.lines().any(|l| l.trim() == "hello-bgwork-ssh"),
        "{text}"
    );
    // C-c reaches the pane's terminal there: only the sleep is interrupted.
    h.home.json(&["send", &id, r"sleep 4242\n"]);
    eventually(Duration::from_secs(30), || {
        runs_on_host(b"sleep\x004242\x00")
    });
    h.home.json(&["send", &id, "--key", "C-c"]);
    eventually(Duration::from_secs(30), || {
        !runs_on_host(b"sleep\x004242\x00")
    });
    h.home.json(&["send", &id, r"echo alive-after-interrupt\n"]);
    until(&h.home, &id, "^alive-after-interrupt");
    assert_eq!(h.home.item(&id)["state"], "running");
    // A resize reaches its terminal there and the screen here.
    let resized = h
        .home
        .json(&["resize", &id, "--cols", "70", "--rows", "15"]);
    assert_eq!(resized["ok"], true, "{resized}");
    h.home.json(&["send", &id, r"tput cols; tput lines\n"]);
    until(&h.home, &id, "^15");
    let text = screen(&h.home, &id);
    assert!(text.lines().any(|l| l.trim() == "70"), "{text}");
    assert!(text.lines().count() <= 15, "15 rows: {text}");
    // `close` hangs it up there: cancelled, as locally.
    let closed = h.home.json(&["close", &id]);
    assert_eq!(closed["stop_requested"], true, "{closed}");
    let ended = h.home.wait_end(&id);
    assert_eq!(ended["end"], "cancelled", "{ended}");
    assert_eq!(ended["report"], format!("{id} was cancelled (pane closed)"));
}

#[test]
fn issue24_2_a_pane_on_a_host_is_taken_back_after_a_local_kill_9_and_notifies_its_end_once() {
    use crate::panes::{screen, until};
    let Some(h) = OnHost::new(
        "issue24_2_a_pane_on_a_host_is_taken_back_after_a_local_kill_9_and_notifies_its_end_once",
    ) else {
        return;
    };
    let id = h.start_pane(&["--notify"], "bash --norc -i");
    h.home.json(&["send", &id, r"echo one-$((40+2))\n"]);
    until(&h.home, &id, "^one-42");
    h.home.kill_daemon();
    h.home.start_daemon();
    // The screen, rebuilt here from the mirror, and keys that reach the same shell.
    let text = screen(&h.home, &id);
    assert!(text.lines().any(|l| l.trim() == "one-42"), "{text}");
    h.home.json(&["send", &id, r"echo two-$((6*7))\n"]);
    until(&h.home, &id, "^two-42");
    h.home.json(&["send", &id, r"exit 5\n"]);
    eventually(Duration::from_secs(60), || {
        h.home.item(&id)["state"] == "ended"
    });
    let item = h.home.item(&id);
    assert_eq!(item["end"], "failed", "{item}");
    assert_eq!(item["exit_code"], 5, "{item}");
    let notices = h.home.json(&["notices"]);
    let ends: Vec<&Value> = notices["notices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["item"] == id.as_str())
        .collect();
    assert_eq!(ends.len(), 1, "one notice of its end: {notices}");
    assert!(
        ends[0]["text"]
            .as_str()
            .unwrap()
            .contains("FAILED (exit 5)"),
        "{notices}"
    );
    let again = h.home.json(&["notices"]);
    assert_eq!(again["notices"], json!([]), "once: {again}");
}

#[test]
fn issue24_3_a_host_without_systemd_logind_says_nothing_of_logout_and_runs_the_job() {
    let Some(h) = OnHost::new(
        "issue24_3_a_host_without_systemd_logind_says_nothing_of_logout_and_runs_the_job",
    ) else {
        return;
    };
    if std::path::Path::new("/run/systemd/system").exists() {
        crate::util::not_run(
            "issue24_3_a_host_without_systemd_logind_says_nothing_of_logout_and_runs_the_job",
            "the host (this machine) runs systemd: the branch without logind is not here",
        );
        return;
    }
    let on = h.on();
    let reply = h.home.json(&[
        "start",
        "--window",
        "5000",
        "--on",
        &on,
        "--",
        "echo up; sleep 1000",
    ]);
    assert!(reply.get("logout_warning").is_none(), "{reply}");
    let id = reply["id"].as_str().unwrap().to_string();
    let text = h.home.run(&["list"]).stdout;
    assert!(!text.contains("warning"), "{text}");
    assert_eq!(h.home.item(&id)["state"], "running");
    assert!(h.home.json(&["read", &id, "--all"])["output"]
        .as_str()
        .unwrap()
        .contains("up"));
}

/// Runs `bgwork ssh-relay` as a host where systemd-logind runs with `KillUserProcesses=yes`
/// would: in a mount namespace of its own whose `/run/systemd/system` exists, with a
/// `loginctl` (and a `systemd-run`) on its PATH that answer as logind's would. Returns
/// the relay's first line, `None` where this test cannot make such a host (not root).
fn relay_on_a_logind_host(linger: bool, home: &std::path::Path) -> Option<Value> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next().map(str::to_string));
    if uid.as_deref() != Some("0") {
        crate::util::not_run(
            &crate::util::this_test(),
            "it mounts a tmpfs in a mount namespace of its own, which needs root",
        );
        return None;
    }
    let bin = tempfile::tempdir().unwrap();
    let loginctl = format!(
        "#!/bin/sh\ncase \"$1\" in\n  show-session) printf 'KillUserProcesses=yes\\nKillOnlyUsers=\\nKillExcludeUsers=\\n' ;;\n  show-user) echo Linger={} ;;\n  *) exit 1 ;;\nesac\n",
        if linger { "yes" } else { "no" }
    );
    // A user manager's scope, as far as the relay can tell: the command, run as it is,
    // after a mark that it was asked.
    let systemd_run = format!(
        "#!/bin/sh\necho \"$@\" > {}/scope-asked\nwhile [ \"$1\" != -- ]; do shift; done; shift\nexec \"$@\"\n",
        bin.path().display()
    );
    use std::os::unix::fs::PermissionsExt;
    for (name, text) in [("loginctl", loginctl), ("systemd-run", systemd_run)] {
        let path = bin.path().join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut relay = std::process::Command::new("unshare")
        .args([
            "-m",
            "sh",
            "-c",
            "mount -t tmpfs bgwork-test /run/systemd && mkdir /run/systemd/system && exec \"$@\"",
            "--",
            crate::util::BIN,
            "ssh-relay",
        ])
        .env("PATH", path)
        .env("BGWORK_HOME", home)
        .env_remove("BGWORK_JOB")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let lines = lines_of(&mut relay);
    let hello = lines.recv_timeout(Duration::from_secs(60)).unwrap();
    drop(relay.stdin.take());
    exit_within(&mut relay, Duration::from_secs(30));
    let mut hello: Value = serde_json::from_str(&hello).unwrap();
    hello["scope_asked"] = json!(bin.path().join("scope-asked").exists());
    Some(hello)
}

#[test]
fn issue24_3_a_logind_host_that_kills_at_logout_says_so_without_lingering_and_scopes_with_it() {
    let home = tempfile::Builder::new()
        .prefix("bgw")
        .tempdir_in("/tmp")
        .unwrap();
    let Some(hello) = relay_on_a_logind_host(false, home.path()) else {
        return;
    };
    let why = hello["logout"].as_str().unwrap_or_default();
    assert!(
        why.contains("lingering is off for root") && why.contains("loginctl enable-linger root"),
        "{hello}"
    );
    assert_eq!(hello["scope_asked"], false, "{hello}");
    // Lingering on: the host's daemon is started in a scope, and nothing is said.
    let home = tempfile::Builder::new()
        .prefix("bgw")
        .tempdir_in("/tmp")
        .unwrap();
    let hello = relay_on_a_logind_host(true, home.path()).unwrap();
    assert!(hello.get("logout").is_none(), "{hello}");
    assert_eq!(hello["scope_asked"], true, "{hello}");
    let stopped = std::process::Command::new(crate::util::BIN)
        .arg("shutdown")
        .env("BGWORK_HOME", home.path())
        .output()
        .unwrap();
    assert!(stopped.status.success(), "{stopped:?}");
}

#[test]
fn issue24_3_a_job_on_a_host_whose_logind_kills_at_logout_says_so_in_its_reply_and_record() {
    let test =
        "issue24_3_a_job_on_a_host_whose_logind_kills_at_logout_says_so_in_its_reply_and_record";
    let dir = shared();
    // The host's bgwork runs as on a host whose logind kills at logout, lingering off:
    // in a user and mount namespace of its own (so the host's user may mount), with
    // `/run/systemd/system` and a `loginctl` that answers as logind's would.
    let fake = dir.path().join("bin");
    std::fs::create_dir(&fake).unwrap();
    let loginctl = fake.join("loginctl");
    std::fs::write(
        &loginctl,
        "#!/bin/sh\ncase \"$1\" in\n  show-session) printf 'KillUserProcesses=yes\\nKillOnlyUsers=\\nKillExcludeUsers=\\n' ;;\n  show-user) echo Linger=no ;;\n  *) exit 1 ;;\nesac\n",
    )
    .unwrap();
    let wrapper = dir.path().join("bgwork-on-a-logind-host");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec unshare -rm sh -c 'mount -t tmpfs bgwork-test /run/systemd && mkdir /run/systemd/system && PATH=\"$0:$PATH\" exec \"$@\"' {} {} \"$@\"\n",
            fake.display(),
            crate::util::BIN
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    for path in [&fake, &loginctl, &wrapper] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let home = Home::new().with("BGWORK_REMOTE_BIN", wrapper.to_str().unwrap());
    let Some(h) = OnHost::with(test, home) else {
        return;
    };
    let can = std::process::Command::new("ssh")
        .args(["-F", &h.host.config, "-o", "BatchMode=yes", &h.host.alias])
        .arg(format!("{} --version", wrapper.display()))
        .output()
        .unwrap();
    if !can.status.success() {
        crate::util::not_run(
            test,
            &format!(
                "the host's user cannot make a user namespace here: {}",
                String::from_utf8_lossy(&can.stderr).trim()
            ),
        );
        return;
    }
    let on = h.on();
    let reply = h.home.json(&[
        "start",
        "--window",
        "0",
        "--on",
        &on,
        "--",
        "echo up; sleep 1000",
    ]);
    let id = reply["id"].as_str().unwrap().to_string();
    let said = |item: &Value| {
        item["logout_warning"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let why = said(&reply);
    assert!(
        why.starts_with("on bgwork-test: its jobs die when root's last login there ends")
            && why.contains("lingering is off for root")
            && why.contains("loginctl enable-linger root"),
        "said at start: {reply}"
    );
    let text = h.home.run(&["list"]).stdout;
    assert!(
        text.contains("warning: on bgwork-test: its jobs die"),
        "{text}"
    );
    // Kept with the job: a restarted daemon says it as well.
    h.home.kill_daemon();
    h.home.start_daemon();
    assert_eq!(said(&h.home.item(&id)), why);
    let waited = h
        .home
        .run(&["--json", "wait", &id, "--until", "up", "--timeout", "60"])
        .json();
    assert_eq!(waited["reason"], "matched", "{waited}");
    // Said while it runs: an ended job has nothing left to lose.
    h.home.json(&["stop", &id]);
    assert!(h.home.wait_end(&id).get("logout_warning").is_none());
    let remote_home = format!(
        "BGWORK_HOME=\"$HOME\"/.bgwork-remote/{} {} shutdown",
        crate::ssh::home_id(h.home.path()),
        wrapper.display()
    );
    let _ = std::process::Command::new("ssh")
        .args(["-F", &h.host.config, "-o", "BatchMode=yes", &h.host.alias])
        .arg(remote_home)
        .output();
}

#[test]
fn issue24_2_a_resize_and_a_close_asked_while_the_host_is_down_reach_its_pane_once_it_answers() {
    use crate::panes::until;
    let test =
        "issue24_2_a_resize_and_a_close_asked_while_the_host_is_down_reach_its_pane_once_it_answers";
    let Some((mut sshd, h)) = OnHost::with_own_sshd(test) else {
        return;
    };
    let id = h.start_pane(&["--cols", "90", "--rows", "20"], "bash --norc -i");
    h.home.json(&["send", &id, r"tput cols\n"]);
    until(&h.home, &id, "^90");
    h.cut(&mut sshd, &id);
    let resized = h
        .home
        .json(&["resize", &id, "--cols", "70", "--rows", "15"]);
    assert_eq!(resized["ok"], true, "{resized}");
    sshd.up();
    // Input is refused while the link is down; once it is up, the terminal there has
    // the size asked meanwhile.
    eventually(Duration::from_secs(60), || {
        h.home.run(&["send", &id, r"tput cols; tput lines\n"]).code == 0
    });
    until(&h.home, &id, "^15");
    let out = h.home.json(&["read", &id, "--all"])["output"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(out.lines().any(|l| l.trim() == "70"), "{out}");
    // A close asked while the host is down hangs the pane up once it answers.
    h.cut(&mut sshd, &id);
    let closed = h.home.json(&["close", &id]);
    assert_eq!(closed["stop_requested"], true, "{closed}");
    sshd.up();
    let ended = h
        .home
        .run(&["--json", "wait", &id, "--timeout", "90"])
        .json();
    assert_eq!(ended["reason"], "ended", "{ended}");
    assert_eq!(ended["items"][0]["end"], "cancelled", "{ended}");
}

#[test]
fn issue24_t1_a_stop_asked_while_the_host_is_down_is_carried_out_once_it_answers() {
    let test = "issue24_t1_a_stop_asked_while_the_host_is_down_is_carried_out_once_it_answers";
    let Some((mut sshd, h)) = OnHost::with_own_sshd(test) else {
        return;
    };
    let on = h.on();
    let id = h
        .home
        .json(&["start", "--window", "0", "--on", &on, "--", "sleep 300"])["id"]
        .as_str()
        .unwrap()
        .to_string();
    eventually(Duration::from_secs(60), || {
        h.home.item(&id)["pid"].is_number()
    });
    h.cut(&mut sshd, &id);
    let stopped = h.home.json(&["stop", &id, "--grace", "1"]);
    assert_eq!(stopped["stop_requested"], true, "{stopped}");
    // Kept across a daemon killed meanwhile too.
    h.home.kill_daemon();
    h.home.start_daemon();
    sshd.up();
    // Kept until the host answers, then carried out there: the job ends as stopped.
    let ended = h
        .home
        .run(&["--json", "wait", &id, "--timeout", "90"])
        .json();
    assert_eq!(ended["reason"], "ended", "{ended}");
    assert_eq!(ended["items"][0]["end"], "stopped_by_agent", "{ended}");
}

#[test]
fn issue24_w2_a_resize_and_a_close_asked_while_the_host_is_down_say_they_are_queued() {
    let test = "issue24_w2_a_resize_and_a_close_asked_while_the_host_is_down_say_they_are_queued";
    let Some((mut sshd, h)) = OnHost::with_own_sshd(test) else {
        return;
    };
    let id = h.start_pane(&["--cols", "90", "--rows", "20"], "bash --norc -i");
    h.cut(&mut sshd, &id);
    let resized = h.home.run(&["resize", &id, "--cols", "70", "--rows", "15"]);
    assert_eq!(resized.code, 0, "{}", resized.stderr);
    assert!(
        resized.stdout.contains("is queued")
            && resized.stdout.contains("unreachable since")
            && resized.stdout.contains("when the host answers")
            && !resized.stdout.contains("resized to"),
        "{}",
        resized.stdout
    );
    let closed = h.home.json(&["close", &id]);
    assert!(
        closed["queued"]
            .as_str()
            .is_some_and(|q| q.contains("hang-up") && q.contains("when the host answers")),
        "{closed}"
    );
    let text = h.home.run(&["close", &id]).stdout;
    assert!(
        text.contains("is queued") && !text.contains("was hung up"),
        "{text}"
    );
    sshd.up();
    let ended = h
        .home
        .run(&["--json", "wait", &id, "--timeout", "90"])
        .json();
    assert_eq!(ended["items"][0]["end"], "cancelled", "{ended}");
}

#[test]
fn issue24_w7_a_stop_asked_while_the_host_is_down_answers_at_once_that_it_is_queued() {
    let test = "issue24_w7_a_stop_asked_while_the_host_is_down_answers_at_once_that_it_is_queued";
    let Some((mut sshd, h)) = OnHost::with_own_sshd(test) else {
        return;
    };
    let on = h.on();
    let id = h
        .home
        .json(&["start", "--window", "0", "--on", &on, "--", "sleep 300"])["id"]
        .as_str()
        .unwrap()
        .to_string();
    eventually(Duration::from_secs(60), || {
        h.home.item(&id)["pid"].is_number()
    });
    h.cut(&mut sshd, &id);
    let asked = std::time::Instant::now();
    let stopped = h.home.json(&["stop", &id, "--grace", "5"]);
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "the stop took {took:?}: {stopped}"
    );
    assert_eq!(stopped["stop_requested"], true, "{stopped}");
    assert!(
        stopped["queued"]
            .as_str()
            .is_some_and(|q| q.contains("the stop of") && q.contains("when the host answers")),
        "{stopped}"
    );
    let text = h.home.run(&["stop", &id, "--grace", "5"]).stdout;
    assert!(text.contains("is queued"), "{text}");
    sshd.up();
    let ended = h
        .home
        .run(&["--json", "wait", &id, "--timeout", "90"])
        .json();
    assert_eq!(ended["reason"], "ended", "{ended}");
    assert_eq!(ended["items"][0]["end"], "stopped_by_agent", "{ended}");
}

#[test]
fn issue24_w8_a_second_stop_by_the_person_while_the_agents_waits_ends_as_the_first_asked() {
    let test =
        "issue24_w8_a_second_stop_by_the_person_while_the_agents_waits_ends_as_the_first_asked";
    let Some((mut sshd, h)) = OnHost::with_own_sshd(test) else {
        return;
    };
    let on = h.on();
    let id = h
        .home
        .json(&["start", "--window", "0", "--on", &on, "--", "sleep 300"])["id"]
        .as_str()
        .unwrap()
        .to_string();
    eventually(Duration::from_secs(60), || {
        h.home.item(&id)["pid"].is_number()
    });
    // The agent's stop waits for the host; the person stops it too (the strip's stop).
    h.cut(&mut sshd, &id);
    h.home.json(&["stop", &id, "--grace", "1"]);
    h.home
        .json(&["stop", &id, "--grace", "1", "--as", "person"]);
    sshd.up();
    // As locally: the first stop's actor.
    let ended = h
        .home
        .run(&["--json", "wait", &id, "--timeout", "90"])
        .json();
    assert_eq!(ended["reason"], "ended", "{ended}");
    assert_eq!(ended["items"][0]["end"], "stopped_by_agent", "{ended}");
}

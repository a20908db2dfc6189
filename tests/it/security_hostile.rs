//! Hostile use of paths, sockets, terminals, sub-agent reports and session boundaries
//! (issues 10 and 16). Tests run as root; another user is played by uid 65534, either
//! in a thread whose own credentials are switched (a raw `setresuid`, which changes
//! that thread only) or through `setpriv`.

use crate::util::{alive, eventually, output_within, Home, BIN};
use serde_json::Value;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NOBODY: u32 = 65534;

/// Runs `f` in a thread of its own whose uid is 65534 (the rest of the process keeps
/// root): what it binds or connects is another user's.
pub fn as_nobody<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: the raw system call changes the credentials of this thread
                // only (the libc wrapper would change every thread of the process); the
                // thread ends with `f`.
                let rc =
                    unsafe { nix::libc::syscall(nix::libc::SYS_setresuid, NOBODY, NOBODY, NOBODY) };
                assert_eq!(rc, 0, "setresuid: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .expect("the thread of uid 65534")
    })
}

/// A folder of uid 65534 that anyone may write in, as another user leaves in `/tmp`.
fn squatted(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::os::unix::fs::chown(dir, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
}

/// `bgwork ARGS` with no BGWORK_HOME: the home and socket folder come from XDG_*.
fn xdg_command(data: &Path, runtime: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env_remove("BGWORK_HOME")
        .env_remove("BGWORK_JOB")
        .env("XDG_DATA_HOME", data)
        .env("XDG_RUNTIME_DIR", runtime)
        .stdin(Stdio::null());
    command
}

/// Another session of the home is served at once (within 10 s), whatever this one's
/// job did to its folder.
fn assert_another_session_served(home: &Home) {
    let mut list = home.command(&["--session", "other", "--json", "list"]);
    list.stdin(Stdio::null());
    assert!(output_within(list, Duration::from_secs(10))
        .status
        .success());
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn issue10_6_a_socket_folder_made_by_another_user_is_refused_before_anything_is_sent() {
    let root = tempfile::tempdir_in("/tmp").unwrap();
    let (data, runtime) = (root.path().join("data"), root.path().join("run"));
    std::fs::create_dir_all(&runtime).unwrap();
    let folder = runtime.join("bgwork");
    squatted(&folder);
    // The other user listens where the victim's daemon would.
    let socket = folder.join("bgwork.sock");
    let listener = as_nobody(|| UnixListener::bind(&socket).unwrap());
    listener.set_nonblocking(true).unwrap();
    let start = xdg_command(
        &data,
        &runtime,
        &["start", "--env", "API_KEY=s3cret", "--", "true"],
    );
    let out = output_within(start, Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let message = text(&out.stderr);
    assert!(message.contains(&folder.display().to_string()), "{message}");
    assert!(message.contains("uid 65534"), "{message}");
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == ErrorKind::WouldBlock),
        "the client connected to the other user's socket"
    );
    // A daemon refuses to serve from it too.
    let daemon = xdg_command(&data, &runtime, &["daemon"]);
    let out = output_within(daemon, Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(1));
    let message = text(&out.stderr);
    assert!(
        message.contains("refused to use") && message.contains(&folder.display().to_string()),
        "{message}"
    );
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == ErrorKind::WouldBlock),
        "nothing connected"
    );
    // A folder of one's own that others may write in is refused as well.
    std::os::unix::fs::chown(&folder, Some(0), Some(0)).unwrap();
    let out = output_within(
        xdg_command(&data, &runtime, &["list"]),
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("mode 0777"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn issue10_6_a_client_sends_nothing_to_a_server_of_another_uid() {
    let home = tempfile::Builder::new()
        .prefix("bgw")
        .tempdir_in("/tmp")
        .unwrap();
    let theirs = tempfile::tempdir_in("/tmp").unwrap();
    squatted(theirs.path());
    // The other user's server, its socket then moved into the victim's own folder (the
    // way a folder replaced after it was checked would look).
    let listener = as_nobody(|| UnixListener::bind(theirs.path().join("s")).unwrap());
    std::fs::rename(theirs.path().join("s"), home.path().join("bgwork.sock")).unwrap();
    let mut start = Command::new(BIN);
    start
        .args(["--json", "start", "--env", "API_KEY=s3cret", "--", "true"])
        .env("BGWORK_HOME", home.path())
        .env_remove("BGWORK_JOB")
        .stdin(Stdio::null());
    let out = output_within(start, Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(1));
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("uid 65534") && message.contains("nothing was sent"),
        "{message}"
    );
    let (mut stream, _) = listener.accept().unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut received = Vec::new();
    let _ = stream.read_to_end(&mut received);
    assert_eq!(text(&received), "", "the request reached the other user");
}

#[test]
fn issue10_6_two_runtime_dirs_do_not_give_one_home_two_daemons() {
    let root = tempfile::tempdir_in("/tmp").unwrap();
    let data = root.path().join("data");
    let (first, second) = (root.path().join("run1"), root.path().join("run2"));
    for dir in [&first, &second] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let call = |runtime: &Path, args: &[&str]| {
        output_within(xdg_command(&data, runtime, args), Duration::from_secs(30))
    };
    let out = call(&first, &["list"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = call(&first, &["--json", "status"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pid: Value = serde_json::from_slice(&out.stdout).unwrap();
    let pid = pid["pid"].as_i64().unwrap();
    let out = call(&second, &["daemon"]);
    let message = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{message}");
    assert!(
        message.contains(&format!("pid {pid}")) && message.contains("already serves"),
        "{message}"
    );
    // Two homes that share one socket folder: the second does not take the socket.
    let other_data = root.path().join("data2");
    let out = output_within(
        xdg_command(&other_data, &first, &["daemon"]),
        Duration::from_secs(30),
    );
    let message = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{message}");
    assert!(message.contains("bgwork.sock"), "{message}");
    assert_eq!(
        serde_json::from_slice::<Value>(&call(&first, &["--json", "status"]).stdout).unwrap()
            ["pid"],
        pid,
        "the first daemon still answers on its socket"
    );
    assert!(call(&first, &["shutdown"]).status.success());
}

#[test]
fn issue10_12_a_control_socket_drops_a_peer_of_another_uid() {
    let home = Home::new();
    let id = home.start("exec sleep 1000");
    let item = home.item(&id);
    let pid = item["pid"].as_i64().unwrap() as i32;
    let job_dir = Path::new(item["log_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    let control = job_dir.join("control.sock");
    // Open every mode on the way: only the uid check is left to keep the other user out.
    let open = std::fs::Permissions::from_mode(0o777);
    for path in [home.path(), &home.path().join("jobs"), &job_dir, &control] {
        std::fs::set_permissions(path, open.clone()).unwrap();
    }
    let stop = bgwork::wire::control::encode(&bgwork::wire::control::ToSupervisor::Stop {
        grace_ms: 0,
        actor: bgwork::wire::Actor::Person,
    });
    let mut stream = as_nobody(|| UnixStream::connect(&control).unwrap());
    let _ = stream.write_all(&stop);
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut reply = Vec::new();
    let closed = match stream.read_to_end(&mut reply) {
        Ok(_) => true,
        Err(e) => e.kind() == ErrorKind::ConnectionReset,
    };
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    assert!(closed, "the supervisor kept the connection of uid 65534");
    assert_eq!(text(&reply), "", "the supervisor answered uid 65534");
    assert_eq!(home.item(&id)["state"], "running");
    assert!(alive(pid), "the job was stopped by another uid");
}

#[test]
fn issue10_13_a_planted_symlink_never_becomes_a_jobs_folder() {
    let home = Home::new();
    let first = home.start("true");
    home.wait_end(&first);
    // The folder the next job gets, planted as a link to a folder of the attacker's
    // choosing.
    let paths = bgwork::paths::Paths::new(home.path().to_path_buf(), home.path().to_path_buf());
    let planted = paths.job_dir(2);
    let target = tempfile::tempdir_in("/tmp").unwrap();
    symlink(target.path(), &planted).unwrap();
    let (code, error, message) = home.error(&["start", "--", "echo hello"]);
    assert_eq!((code, error.as_str()), (1, "spawn_failed"), "{message}");
    assert!(
        message.contains(&planted.display().to_string()) && message.contains("already exists"),
        "{message}"
    );
    let written: Vec<_> = std::fs::read_dir(target.path()).unwrap().collect();
    assert!(
        written.is_empty(),
        "the job wrote through the link: {written:?}"
    );
    assert!(std::fs::symlink_metadata(&planted).unwrap().is_symlink());
    // The next job gets a folder of its own.
    let next = home.start("echo fine");
    assert_eq!(home.wait_end(&next)["end"], "succeeded");
}

const HOSTILE_NAME: &str = "\x1b]0;PWNED\x07\x1b[2J\nFAKE bg-99 finished";

/// Bytes that would act on a terminal: C0 controls but newline, DEL, and C1 controls
/// as UTF-8.
fn acting_bytes(out: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    for (index, &b) in out.iter().enumerate() {
        let c1 = b == 0xc2
            && out
                .get(index + 1)
                .is_some_and(|n| (0x80..=0x9f).contains(n));
        if (b < 0x20 && b != b'\n') || b == 0x7f || c1 {
            found.push(format!("{b:#04x} at {index}"));
        }
    }
    found
}

#[test]
fn issue10_11_a_name_with_escapes_cannot_act_on_the_terminal() {
    let home = Home::new();
    let command = "printf 'a\\xc2\\x9b2Jb\\xc2\\x9d0;T\\x07c\\n'; exec sleep 1000";
    let start = home.run(&[
        "start",
        "--name",
        HOSTILE_NAME,
        "--window",
        "0",
        "--",
        command,
    ]);
    assert_eq!(start.code, 0, "{}", start.stderr);
    let id = start.stdout.split_whitespace().next().unwrap().to_string();
    eventually(Duration::from_secs(20), || {
        home.item(&id)["state"] == "running"
    });
    let list = home.run(&["list"]);
    let wait = home.run(&["wait", &id, "--until", "c", "--timeout", "20"]);
    let read = home.run(&["read", &id, "--all"]);
    for (what, run) in [
        ("start", &start),
        ("list", &list),
        ("wait", &wait),
        ("read", &read),
    ] {
        assert_eq!(
            acting_bytes(&run.raw_stdout),
            Vec::<String>::new(),
            "{what}: {}",
            run.stdout
        );
        assert!(
            !run.stdout.lines().any(|l| l.starts_with("FAKE")),
            "{what} printed a forged line: {}",
            run.stdout
        );
    }
    assert!(
        list.stdout.contains("PWNED"),
        "the name is shown: {}",
        list.stdout
    );
    assert!(read.stdout.starts_with("abc\n"), "{}", read.stdout);
    // JSON stays exact.
    assert_eq!(home.item(&id)["name"], HOSTILE_NAME);
    // An error quoting the caller's text is inert too.
    let unknown = home.run(&["read", HOSTILE_NAME]);
    assert_eq!(unknown.code, 1);
    assert_eq!(
        acting_bytes(unknown.stderr.as_bytes()),
        Vec::<String>::new(),
        "{}",
        unknown.stderr
    );
}

/// Starts a sub-agent and returns the notice its end brings (within 30 s).
fn agent_notice(home: &Home, command: &str) -> Value {
    let started = home.json(&["agent", "start", "--", command]);
    let id = started["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut notices = Command::new(BIN);
        notices
            .args(["--json", "notices", "--wait", "5"])
            .env("BGWORK_HOME", home.path())
            .env("BGWORK_SESSION", &home.session);
        let out = output_within(notices, Duration::from_secs(20));
        let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
        if let Some(notice) = reply["notices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["item"] == id.as_str())
        {
            return notice.clone();
        }
        assert!(Instant::now() < deadline, "no notice for {id}");
    }
}

#[test]
fn issue16_1_a_fifo_report_is_refused_and_hangs_nothing() {
    let home = Home::new();
    let notice = agent_notice(&home, "mkfifo \"$BGWORK_REPORT\"; echo done");
    let tail = notice["tail"].as_str().unwrap();
    assert!(tail.contains("report is not a regular file"), "{tail}");
    assert!(tail.contains("done"), "the output's tail follows: {tail}");
    // Another session is served at once.
    assert_another_session_served(&home);
}

#[test]
fn issue16_1_a_fifo_report_found_at_a_restart_hangs_nothing() {
    let home = Home::new();
    let go = home.path().join("go");
    let command = format!(
        "mkfifo \"$BGWORK_REPORT\"; while [ ! -e {} ]; do sleep 0.02; done",
        go.display()
    );
    let started = home.json(&["agent", "start", "--", &command]);
    let id = started["id"].as_str().unwrap().to_string();
    eventually(Duration::from_secs(20), || {
        home.item(&id)["state"] == "running"
    });
    let job_dir = PathBuf::from(home.item(&id)["log_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    home.kill_daemon();
    std::fs::write(&go, "").unwrap();
    eventually(Duration::from_secs(20), || job_dir.join("status").exists());
    // The next call starts a daemon, which settles the sub-agent before it serves.
    let mut notices = home.command(&["--json", "notices"]);
    notices.stdin(Stdio::null());
    let out = output_within(notices, Duration::from_secs(20));
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    let tail = reply["notices"][0]["tail"].as_str().unwrap_or_default();
    assert!(tail.contains("report is not a regular file"), "{reply}");
}

#[test]
fn issue16_1_a_report_linked_to_a_private_file_or_a_device_is_not_read() {
    let home = Home::new();
    let secret = home.path().join("secret");
    std::fs::write(&secret, "TOPSECRET-41d2\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    for target in [secret.display().to_string(), "/dev/zero".to_string()] {
        let command = format!("ln -s {target} \"$BGWORK_REPORT\"");
        let notice = agent_notice(&home, &command);
        let tail = notice["tail"].as_str().unwrap();
        assert!(
            !tail.contains("TOPSECRET"),
            "the linked file leaked: {tail}"
        );
        assert!(tail.contains("report is not a regular file"), "{tail}");
    }
    let command = format!("ln {} \"$BGWORK_REPORT\"", secret.display());
    let tail = agent_notice(&home, &command)["tail"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!tail.contains("TOPSECRET"), "a hard link leaked: {tail}");
}

/// The daemon's peak resident memory, in KiB.
fn peak_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn issue16_1_a_huge_report_costs_no_memory_and_its_end_is_kept_inert() {
    let home = Home::new();
    let pid = home.daemon_pid();
    let before = peak_kib(pid);
    let command = "head -c 60000000 /dev/zero | tr '\\0' a > \"$BGWORK_REPORT\"; \
                   printf '\\nEND \\033]0;PWNED\\007of \\302\\233' >> \"$BGWORK_REPORT\"; \
                   printf '2Jreport\\n' >> \"$BGWORK_REPORT\"";
    let tail = agent_notice(&home, command)["tail"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        tail.ends_with("END of report\n"),
        "{}",
        &tail[tail.len().saturating_sub(200)..]
    );
    assert!(tail.len() < 17 << 10, "{} bytes", tail.len());
    assert!(tail.contains("bytes of the report are not shown"));
    let grown = peak_kib(pid).saturating_sub(before);
    assert!(
        grown < 20 << 10,
        "the daemon grew by {grown} KiB for a 60 MB report"
    );
}

/// A home whose jobs find `bgwork` on their PATH (sub-agents call it).
fn agents_home(home: Home) -> Home {
    let dir = Path::new(BIN).parent().unwrap().display().to_string();
    let path = format!("{dir}:{}", std::env::var("PATH").unwrap_or_default());
    home.with("PATH", &path)
}

/// Writes a script into the home and returns the command that runs it.
fn script(home: &Home, name: &str, body: &str) -> String {
    let path = home.path().join(name);
    std::fs::write(&path, body).unwrap();
    format!("bash {}", path.display())
}

/// Runs `bgwork --json ARGS` as `session`.
fn as_session(home: &Home, session: &str, args: &[&str]) -> crate::util::Run {
    let mut all = vec!["--session", session, "--json"];
    all.extend_from_slice(args);
    home.run(&all)
}

/// The items `session` lists (with `--all`), by id.
fn listed(home: &Home, session: &str) -> Vec<Value> {
    as_session(home, session, &["list", "--all"]).json()["items"]
        .as_array()
        .unwrap()
        .clone()
}

fn find<'a>(items: &'a [Value], id: &str) -> Option<&'a Value> {
    items.iter().find(|i| i["id"] == id)
}

#[test]
fn issue16_7_a_session_named_like_a_child_is_no_child() {
    let home = Home::new();
    let started = as_session(
        &home,
        "proj/feature",
        &["start", "--window", "0", "--", "exec sleep 1000"],
    );
    assert_eq!(started.code, 0, "{}", started.stdout);
    let id = started.json()["id"].as_str().unwrap().to_string();
    assert_eq!(
        listed(&home, "proj"),
        Vec::<Value>::new(),
        "proj sees proj/feature's work"
    );
    for target in [id.clone(), format!("feature/{id}")] {
        let stop = as_session(&home, "proj", &["stop", &target]);
        assert_eq!(stop.json()["error"]["code"], "unknown_id", "{target}");
    }
    eventually(Duration::from_secs(20), || {
        find(&listed(&home, "proj/feature"), &id).unwrap()["state"] == "running"
    });
}

#[test]
fn issue16_7_session_names_are_checked() {
    let home = Home::new();
    for bad in ["a\x1b]0;x\x07b", "tab\there", &"s".repeat(300)] {
        let run = as_session(&home, bad, &["list"]);
        assert_eq!(run.code, 2, "{bad:?}");
        assert!(run.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("control characters"));
    }
    let run = as_session(&home, "proj/sub-1", &["list"]);
    assert_eq!(run.code, 2);
    let message = run.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("agent start"), "{message}");
    assert_eq!(as_session(&home, "proj/feature", &["list"]).code, 0);
}

#[test]
fn issue16_7_two_sub_agents_bg_1s_are_addressed_apart() {
    let home = agents_home(Home::new());
    let body = "bgwork start --window 0 --name \"helper of $BGWORK_SESSION\" -- 'exec sleep 1000' \
                >/dev/null\nread go\n";
    let command = script(&home, "agent.sh", body);
    let first = home.json(&["agent", "start", "--", &command])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let second = home.json(&["agent", "start", "--", &command])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (one, two) = (format!("{first}/bg-1"), format!("{second}/bg-1"));
    eventually(Duration::from_secs(30), || {
        let items = listed(&home, "test");
        [&one, &two]
            .iter()
            .all(|id| find(&items, id).is_some_and(|i| i["state"] == "running"))
    });
    let items = listed(&home, "test");
    assert_eq!(
        find(&items, &two).unwrap()["name"],
        format!("helper of test/{second}")
    );
    // A bare id is the session's own: it has no bg-1.
    assert_eq!(home.error(&["stop", "bg-1"]).1, "unknown_id");
    let stopped = home.json(&["stop", &two]);
    assert_eq!(
        (stopped["id"].as_str(), stopped["end"].as_str()),
        (Some(two.as_str()), Some("stopped_by_agent"))
    );
    assert_eq!(
        home.item(&one)["state"],
        "running",
        "the other sub-agent's bg-1 runs on"
    );
    let read = home.json(&["read", &one]);
    assert_eq!(read["id"], one.as_str());
    let text = home.run(&["list"]).stdout;
    assert!(text.contains(&one) && !text.contains(&two), "{text}");
}

#[test]
fn issue16_7_a_sub_agent_hears_of_its_own_work_and_its_parent_gets_its_report() {
    let home = agents_home(Home::new());
    let body = "bgwork start --notify --window 0 -- 'echo out; exit 3' >/dev/null\n\
                read go\n\
                bgwork notices > \"$BGWORK_REPORT\"\n";
    let command = script(&home, "agent.sh", body);
    let agent = home.json(&["agent", "start", "--", &command])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let job = format!("{agent}/bg-1");
    eventually(Duration::from_secs(30), || {
        find(&listed(&home, "test"), &job).is_some_and(|i| i["state"] == "ended")
    });
    // The parent's pull leaves the sub-agent's notice to the sub-agent.
    let pulled = home.json(&["notices"]);
    assert_eq!(
        pulled["notices"],
        serde_json::json!([]),
        "the parent took its sub-agent's notice"
    );
    // A wait that shows the end to the parent does not deliver it either.
    let wait = home.run(&["--json", "wait", &job, "--timeout", "5"]);
    assert_eq!(wait.json()["reason"], "ended");
    home.json(&["send", &agent, "\\n"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let notice = loop {
        let reply = home.json(&["notices", "--wait", "5"]);
        if let Some(n) = reply["notices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["item"] == agent.as_str())
        {
            break n.clone();
        }
        assert!(Instant::now() < deadline, "no report from {agent}");
    };
    let tail = notice["tail"].as_str().unwrap();
    assert!(
        tail.contains("bg-1 FAILED (exit 3)"),
        "the sub-agent did not hear of its job: {tail}"
    );
}

#[test]
fn issue16_7_work_left_by_an_ended_sub_agent_reports_to_its_parent() {
    let home = agents_home(Home::new());
    let body = "bgwork start --notify --window 0 -- 'read x; exit 4' >/dev/null\n";
    let command = script(&home, "agent.sh", body);
    let agent = home.json(&["agent", "start", "--", &command])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let job = format!("{agent}/bg-1");
    eventually(Duration::from_secs(30), || {
        let items = listed(&home, "test");
        find(&items, &agent).is_some_and(|i| i["state"] == "ended")
            && find(&items, &job).is_some_and(|i| i["state"] == "running")
    });
    home.json(&["notices"]);
    home.json(&["send", &job, "\\n"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let notice = loop {
        let reply = home.json(&["notices", "--wait", "5"]);
        if let Some(n) = reply["notices"].as_array().unwrap().first() {
            break n.clone();
        }
        assert!(Instant::now() < deadline, "the orphaned notice never came");
    };
    assert_eq!(notice["item"], job.as_str());
    assert_eq!(notice["text"], format!("{job} FAILED (exit 4)"));
}

#[test]
fn issue16_7_nested_sub_agents_count_against_the_root_limits() {
    let home = agents_home(Home::new().with("BGWORK_MAX_RUNNING", "3"));
    home.start("exec sleep 1000");
    let nested = script(
        &home,
        "nested.sh",
        "for i in 1 2 3 4; do bgwork start --window 0 -- 'exec sleep 1000' >/dev/null 2>&1; done\n\
         if bgwork agent start -- 'exec sleep 1000' >/dev/null 2>&1; then echo AGENT-STARTED; \
         else echo AGENT-REFUSED; fi\n\
         read go\n",
    );
    let outer = script(
        &home,
        "outer.sh",
        &format!("bgwork agent start -- '{nested}'\nread go\n"),
    );
    let agent = home.json(&["agent", "start", "--", &outer])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let inner = format!("{agent}/sub-1");
    eventually(Duration::from_secs(60), || {
        let read = home.run(&["--json", "read", &inner, "--all"]);
        read.code == 0 && read.json()["output"].as_str().unwrap().contains("AGENT-")
    });
    let output = home.json(&["read", &inner, "--all"])["output"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        output.contains("AGENT-REFUSED"),
        "a third sub-agent ran in the tree: {output}"
    );
    let jobs: Vec<Value> = home.json(&["list"])["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["kind"] == "job")
        .cloned()
        .collect();
    assert_eq!(
        jobs.len(),
        3,
        "the tree runs past the root's limit of 3: {jobs:?}"
    );
    let (_, error, message) = home.error(&["start", "--", "true"]);
    assert_eq!(error, "limit", "{message}");
}

#[test]
fn a_status_file_replaced_by_a_fifo_hangs_nothing() {
    let home = Home::new();
    let id = home.start("mkfifo \"$BGWORK_JOB/status\"; kill -9 $PPID; exec sleep 1000");
    let mut wait = home.command(&["--json", "wait", &id, "--timeout", "20"]);
    wait.stdin(Stdio::null());
    let out = output_within(wait, Duration::from_secs(30));
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["items"][0]["end"], "lost", "{reply}");
    assert_another_session_served(&home);
}

#[test]
fn a_log_replaced_by_a_link_to_a_private_file_is_not_read() {
    let home = Home::new();
    let secret = home.path().join("secret");
    std::fs::write(&secret, "TOPSECRET-77ab\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let command = format!(
        "echo mine; ln -sf {} \"$BGWORK_JOB/output.log\"; exec sleep 1000",
        secret.display()
    );
    let id = home.start(&command);
    let log = PathBuf::from(home.item(&id)["log_path"].as_str().unwrap());
    eventually(Duration::from_secs(20), || log.is_symlink());
    for args in [
        vec!["read", &id, "--all"],
        vec!["read", &id, "--all", "--raw"],
    ] {
        let run = home.run(&args);
        assert!(
            !run.stdout.contains("TOPSECRET"),
            "{args:?} leaked: {}",
            run.stdout
        );
    }
    let stopped = home.json(&["stop", &id]);
    assert_eq!(stopped["end"], "stopped_by_agent");
}

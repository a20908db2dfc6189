//! The MCP server, the hook and the client's deadlines under hostile use: lines that are
//! not JSON-RPC, non-UTF-8 environments, relative paths, clients that cancel or vanish,
//! and a daemon that stops answering.

use crate::util::{eventually, finish_within, Home, BIN};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// `bgwork mcp` driven line by line: raw lines in, parsed replies out (read on a thread,
/// so that a missing answer is a timeout, never a hang).
struct Mcp {
    child: Child,
    stdin: Option<ChildStdin>,
    replies: Receiver<Value>,
    next_id: u64,
}

impl Mcp {
    fn start(home: &Home) -> Mcp {
        Mcp::start_with(home, home.command(&["mcp"]))
    }

    fn start_with(home: &Home, mut command: Command) -> Mcp {
        let _ = home;
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (to_test, replies) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { return };
                let reply: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| json!({"not_json": line, "error": e.to_string()}));
                if to_test.send(reply).is_err() {
                    return;
                }
            }
        });
        let mut mcp = Mcp {
            child,
            stdin,
            replies,
            next_id: 100,
        };
        let init = mcp.request(
            "initialize",
            json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "bgwork-hostile-tests", "version": "1"}
            }),
        );
        assert_eq!(init["result"]["serverInfo"]["name"], "bgwork", "{init}");
        mcp.line(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        mcp
    }

    fn line(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    /// The next reply, within `timeout`.
    fn reply(&mut self, timeout: Duration) -> Option<Value> {
        self.replies.recv_timeout(timeout).ok()
    }

    /// Sends a request and returns its answer (the answer with its id).
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params);
        self.answer_to(&json!(id))
    }

    fn send(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let line =
            json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params});
        self.line(line.to_string().as_bytes());
        self.next_id
    }

    fn answer_to(&mut self, id: &Value) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let reply = self
                .reply(left)
                .unwrap_or_else(|| panic!("no answer to request {id}"));
            if &reply["id"] == id {
                return reply;
            }
        }
    }

    /// Calls a tool; returns (is_error, structured content).
    fn call(&mut self, tool: &str, arguments: Value) -> (bool, Value) {
        let reply = self.request("tools/call", json!({"name": tool, "arguments": arguments}));
        let result = &reply["result"];
        (
            result["isError"] == true,
            result["structuredContent"].clone(),
        )
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends SIGCONT to a stopped daemon when dropped, so a failing test leaves none stopped.
struct Stopped(i32);

impl Stopped {
    fn daemon_of(home: &Home) -> Stopped {
        let pid = home.daemon_pid();
        signal("-STOP", pid);
        eventually(Duration::from_secs(10), || state_of(pid) == 'T');
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal("-CONT", self.0);
    }
}

fn signal(which: &str, pid: i32) {
    let status = Command::new("kill")
        .args([which, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

fn state_of(pid: i32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit(')')
        .next()
        .unwrap_or("")
        .trim_start()
        .chars()
        .next()
        .unwrap_or('?')
}

/// Sockets a process holds open.
fn sockets_of(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .filter(|fd| {
                    std::fs::read_link(fd.path())
                        .map(|l| l.to_string_lossy().starts_with("socket:"))
                        .unwrap_or(false)
                })
                .count()
        })
        .unwrap_or(0)
}

fn threads_of(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| tasks.count())
        .unwrap_or(0)
}

#[test]
fn issue10_10_every_line_gets_an_answer_with_its_id_where_one_can_be_found() {
    let home = Home::new();
    let mut mcp = Mcp::start(&home);
    let deep_args = format!(
        r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"list","arguments":{{"a":{}{}}}}}}}"#,
        "[".repeat(300),
        "]".repeat(300)
    );
    let mut long = br#"{"jsonrpc":"2.0","id":"long","method":"tools/call","params":{"name":"send","arguments":{"id":"bg-1","text":""#.to_vec();
    long.extend(std::iter::repeat_n(b'a', 5 << 20));
    long.extend(br#""}}}"#);
    let cases: Vec<(Vec<u8>, i64, Value)> = vec![
        (b"garbage".to_vec(), -32700, Value::Null),
        (b"\xff\xfe{}".to_vec(), -32700, Value::Null),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\",\"params\":{\"name\":\"start\",\"arguments\":{\"command\":\"echo caf\xe9\"}}}".to_vec(),
            -32700,
            json!(3),
        ),
        (
            format!("{}{}", "[".repeat(300), "]".repeat(300)).into_bytes(),
            -32700,
            Value::Null,
        ),
        (deep_args.into_bytes(), -32700, json!(9)),
        (long, -32600, json!("long")),
        (b"[1,2]".to_vec(), -32600, Value::Null),
        (b"42".to_vec(), -32600, Value::Null),
        (br#"{"jsonrpc":"2.0","id":5}"#.to_vec(), -32600, json!(5)),
        (
            br#"{"jsonrpc":"1.0","id":"v","method":"ping"}"#.to_vec(),
            -32600,
            json!("v"),
        ),
        (
            br#"{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}"#.to_vec(),
            -32600,
            Value::Null,
        ),
        (
            br#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":"list"}"#.to_vec(),
            -32602,
            json!(6),
        ),
    ];
    for (line, code, id) in cases {
        mcp.line(&line);
        let shown = String::from_utf8_lossy(&line[..line.len().min(120)]).into_owned();
        let answer = mcp
            .reply(Duration::from_secs(20))
            .unwrap_or_else(|| panic!("no answer to {shown}"));
        assert_eq!(answer["jsonrpc"], "2.0", "{shown}: {answer}");
        assert_eq!(answer["error"]["code"], code, "{shown}: {answer}");
        assert_eq!(answer["id"], id, "{shown}: {answer}");
        assert!(
            answer["error"]["message"].as_str().unwrap().len() > 10,
            "{answer}"
        );
    }
    // Blank lines are no messages, and a bad notification gets no answer (JSON-RPC
    // forbids one): the next answer is the ping's.
    mcp.line(b"   ");
    mcp.line(br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":5}"#);
    let ping = mcp.request("ping", json!({}));
    assert_eq!(ping["result"], json!({}), "{ping}");
    let (error, list) = mcp.call("list", json!({}));
    assert!(!error, "still serving: {list}");
}

#[test]
fn issue16_12_non_object_arguments_are_invalid_params() {
    let home = Home::new();
    let mut mcp = Mcp::start(&home);
    for arguments in [json!("x"), json!([1]), json!(7), json!(true)] {
        let answer = mcp.request(
            "tools/call",
            json!({"name": "list", "arguments": arguments}),
        );
        assert_eq!(answer["error"]["code"], -32602, "{arguments}: {answer}");
    }
    let answer = mcp.request("tools/call", json!({"arguments": {}}));
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
}

/// A variable that is not UTF-8, in the server's own environment and a job's.
const WEIRD: &[u8] = b"caf\xe9";

fn hex_of_weird(output: &str) -> bool {
    output.split_whitespace().collect::<Vec<_>>() == ["63", "61", "66", "e9"]
}

#[test]
fn issue10_10_a_non_utf8_variable_reaches_the_job_through_mcp_start_and_run() {
    let home = Home::new();
    let mut command = home.command(&["mcp"]);
    command
        .env("WEIRD", std::ffi::OsStr::from_bytes(WEIRD))
        .env(std::ffi::OsStr::from_bytes(b"K\xffEY"), "v");
    let mut mcp = Mcp::start_with(&home, command);
    let print = "printf %s \"$WEIRD\" | od -An -tx1; env | LC_ALL=C grep -ac '^K.EY=v$'";
    let (error, ran) = mcp.call("run", json!({"command": print, "timeout_s": 30}));
    assert!(!error, "{ran}");
    let output = ran["output"].as_str().unwrap();
    let mut lines = output.lines();
    assert!(hex_of_weird(lines.next().unwrap_or("")), "{output}");
    assert_eq!(
        lines.next(),
        Some("1"),
        "the name that is not UTF-8 too: {output}"
    );
    let (error, started) = mcp.call("start", json!({"command": print, "window_ms": 0}));
    assert!(!error, "{started}");
    let id = started["id"].as_str().unwrap().to_string();
    let (_, waited) = mcp.call("wait", json!({"id": id, "timeout_s": 30}));
    assert_eq!(waited["reason"], "ended", "{waited}");
    let (_, read) = mcp.call("read", json!({"id": id}));
    assert!(
        hex_of_weird(read["output"].as_str().unwrap().lines().next().unwrap()),
        "{read}"
    );
    // A variable set by name wins over the inherited one.
    let (_, ran) = mcp.call(
        "run",
        json!({"command": "echo \"[$WEIRD]\"", "env": {"WEIRD": "plain"}, "timeout_s": 30}),
    );
    assert_eq!(ran["output"], "[plain]\n", "{ran}");
}

#[test]
fn issue10_10_the_cli_passes_non_utf8_variables_to_the_job_as_bytes() {
    let home = Home::new();
    let output = home
        .command(&["run", "--", "printf %s \"$WEIRD\" | od -An -tx1"])
        .env("WEIRD", std::ffi::OsStr::from_bytes(WEIRD))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        hex_of_weird(stdout.lines().next().unwrap_or("")),
        "{stdout}"
    );
    // `--env` carries text only, and says so.
    let refused = home
        .command(&["run", "--env"])
        .arg(std::ffi::OsStr::from_bytes(b"A=caf\xe9"))
        .args(["--", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("not UTF-8"), "{stderr}");
    // A raw socket client gets a clear refusal for pairs no environment can hold.
    let bad = json!({"session": "test", "op": "start", "command": "true",
                     "inherit_env": {}, "inherit_env_bytes": [["QQ==", "not base64!"]]});
    let mut socket = std::os::unix::net::UnixStream::connect(home.socket()).unwrap();
    writeln!(socket, "{bad}").unwrap();
    let mut reply = String::new();
    BufReader::new(&socket).read_line(&mut reply).unwrap();
    let reply: Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(reply["error"]["code"], "bad_request", "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("base64"),
        "{reply}"
    );
}

#[test]
fn issue10_1_mcp_paths_are_taken_from_the_servers_own_directory() {
    let home = Home::new();
    let project = tempfile::Builder::new()
        .prefix("bgw-project")
        .tempdir_in("/tmp")
        .unwrap();
    let project_path = project.path().canonicalize().unwrap();
    std::fs::create_dir(project_path.join("sub")).unwrap();
    let mut command = home.command(&["mcp"]);
    command.current_dir(&project_path);
    let mut mcp = Mcp::start_with(&home, command);
    let here = project_path.display().to_string();
    for (cwd, expected) in [
        (Some("."), here.clone()),
        (Some("sub"), format!("{here}/sub")),
        (Some("./sub/../sub"), format!("{here}/sub")),
        (None, here.clone()),
    ] {
        let mut args = json!({"command": "pwd", "timeout_s": 30, "verbose": true});
        if let Some(cwd) = cwd {
            args["cwd"] = json!(cwd);
        }
        let (error, ran) = mcp.call("run", args);
        assert!(!error, "{cwd:?}: {ran}");
        assert_eq!(ran["output"], format!("{expected}\n"), "{cwd:?}: {ran}");
        assert!(ran["cwd"].as_str().unwrap().starts_with('/'), "{ran}");
    }
    // A monitor's file is the server's `flag`, not `/flag`.
    let (error, monitor) = mcp.call(
        "monitor",
        json!({"mode": "wait", "until_file": "flag", "timeout_s": 60}),
    );
    assert!(!error, "{monitor}");
    assert_eq!(monitor["command"], format!("wait file {here}/flag"));
    let id = monitor["id"].as_str().unwrap().to_string();
    std::fs::write(project_path.join("flag"), b"").unwrap();
    let (_, waited) = mcp.call("wait", json!({"id": id, "timeout_s": 30}));
    assert_eq!(waited["items"][0]["end"], "succeeded", "{waited}");
}

#[test]
fn issue16_2_the_hook_answers_within_2_s_when_the_daemon_is_stopped() {
    let home = Home::new();
    home.start("exit 3");
    let stopped = Stopped::daemon_of(&home);
    let hook = || {
        home.command(&["hook", "claude-code"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let began = Instant::now();
    let mut first = hook();
    let event = json!({"session_id": "s", "hook_event_name": "UserPromptSubmit", "prompt": "hi"});
    first
        .stdin
        .take()
        .unwrap()
        .write_all(event.to_string().as_bytes())
        .unwrap();
    let output = finish_within(first, Duration::from_secs(10));
    let took = began.elapsed();
    assert!(took < Duration::from_secs(2), "the hook took {took:?}");
    assert!(output.status.success());
    assert_eq!(output.stdout, b"", "prints nothing");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(&format!("pid {}", stopped.0)), "{stderr}");
    assert!(stderr.contains("stopped"), "{stderr}");
    // A harness that never closes the hook's stdin does not hold it either.
    let began = Instant::now();
    let mut silent = hook();
    let open_stdin = silent.stdin.take();
    let output = finish_within(silent, Duration::from_secs(10));
    drop(open_stdin);
    assert!(output.status.success());
    assert!(began.elapsed() < Duration::from_secs(2));
}

#[test]
fn issue16_2_cli_calls_give_up_on_a_stopped_daemon_with_its_home_and_pid() {
    let home = Home::new().with("BGWORK_ANSWER_TIMEOUT_MS", "1000");
    let id = home.start("sleep 1000");
    let stopped = Stopped::daemon_of(&home);
    // Each call, with how long it may take at most: its own time, the patience, slack.
    let calls: Vec<(Vec<&str>, Duration)> = vec![
        (vec!["list"], Duration::from_secs(5)),
        (vec!["wait", &id, "--timeout", "1"], Duration::from_secs(6)),
        (vec!["notices", "--wait", "1"], Duration::from_secs(6)),
        (vec!["notices", "--follow"], Duration::from_secs(6)),
        (
            vec!["run", "--timeout", "1", "--", "sleep 100"],
            Duration::from_secs(13),
        ),
        (vec!["start", "--", "true"], Duration::from_secs(6)),
    ];
    let began = Instant::now();
    let children: Vec<_> = calls
        .iter()
        .map(|(args, _)| {
            home.command(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut children: Vec<Option<Child>> = children.into_iter().map(Some).collect();
    let mut ended = vec![None; calls.len()];
    let deadline = began + Duration::from_secs(30);
    while ended.iter().any(Option::is_none) && Instant::now() < deadline {
        for (n, child) in children.iter_mut().enumerate() {
            if let Some(running) = child {
                if running.try_wait().unwrap().is_some() {
                    ended[n] = Some(began.elapsed());
                    let output = child.take().unwrap().wait_with_output().unwrap();
                    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
                    let (args, bound) = &calls[n];
                    assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
                    assert!(
                        stderr.contains(&format!("pid {}", stopped.0))
                            && stderr.contains(&home.path().display().to_string())
                            && stderr.contains("did not answer"),
                        "{args:?}: {stderr}"
                    );
                    assert!(ended[n].unwrap() < *bound, "{args:?} took {:?}", ended[n]);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for child in children.iter_mut().flatten() {
        let _ = child.kill();
    }
    assert!(
        ended.iter().all(Option::is_some),
        "calls still waiting on a stopped daemon: {:?}",
        calls
            .iter()
            .zip(&ended)
            .filter(|(_, e)| e.is_none())
            .map(|(c, _)| &c.0)
            .collect::<Vec<_>>()
    );
    drop(stopped);
    assert_eq!(
        home.json(&["list"])["items"][0]["id"],
        id.as_str(),
        "it serves again"
    );
}

#[test]
fn issue16_2_a_follower_of_a_live_quiet_daemon_keeps_following() {
    let home = Home::new().with("BGWORK_ANSWER_TIMEOUT_MS", "300");
    home.start_daemon();
    let mut follower = home
        .command(&["--json", "notices", "--follow"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(follower.stdout.take().unwrap()).lines();
    // Several quiet spells pass: each one checks the daemon, which answers.
    let quiet_until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < quiet_until {
        assert!(
            follower.try_wait().unwrap().is_none(),
            "the follower gave up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    home.start_with(&["--notify"], "exit 4");
    let notice: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(notice["exit_code"], 4, "{notice}");
    let _ = follower.kill();
    let _ = follower.wait();
}

#[test]
fn issue16_6_the_server_exits_when_stdin_closes_mid_wait() {
    let home = Home::new();
    let mut mcp = Mcp::start(&home);
    let (_, started) = mcp.call("start", json!({"command": "sleep 1000", "window_ms": 0}));
    let id = started["id"].as_str().unwrap().to_string();
    mcp.send(
        "tools/call",
        json!({"name": "wait", "arguments": {"id": id, "timeout_s": 120}}),
    );
    let pid = mcp.pid();
    // The wait has reached the daemon: the server holds a connection for it.
    eventually(Duration::from_secs(20), || sockets_of(pid) >= 1);
    let closed = Instant::now();
    drop(mcp.stdin.take());
    eventually(Duration::from_secs(20), || {
        mcp.child.try_wait().unwrap().is_some()
    });
    assert!(
        closed.elapsed() < Duration::from_secs(3),
        "lived {:?} after stdin closed",
        closed.elapsed()
    );
    assert_eq!(
        home.item(&id)["state"],
        "running",
        "the job is not the server's"
    );
}

#[test]
fn issue16_6_cancelled_waits_close_their_daemon_connections_and_threads() {
    let home = Home::new();
    let mut mcp = Mcp::start(&home);
    let (_, started) = mcp.call("start", json!({"command": "sleep 1000", "window_ms": 0}));
    let id = started["id"].as_str().unwrap().to_string();
    let pid = mcp.pid();
    let daemon = home.daemon_pid();
    // The job's supervisor and the idle one the daemon starts after it (each holds a
    // socket of the daemon's): counted before, as they stay.
    eventually(Duration::from_secs(20), || {
        crate::util::supervisors_of(daemon).len() >= 2
    });
    let (sockets_before, threads_before) = (sockets_of(pid), threads_of(pid));
    let daemon_sockets_before = sockets_of(daemon);
    let ids: Vec<u64> = (0..10)
        .map(|_| {
            mcp.send(
                "tools/call",
                json!({"name": "wait", "arguments": {"id": id, "timeout_s": 120}}),
            )
        })
        .collect();
    eventually(Duration::from_secs(20), || {
        sockets_of(pid) >= sockets_before + 10
    });
    for request in &ids {
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                            "params": {"requestId": request, "reason": "not needed"}});
        mcp.line(cancel.to_string().as_bytes());
    }
    let cancelled = Instant::now();
    eventually(Duration::from_secs(20), || {
        sockets_of(pid) <= sockets_before && sockets_of(daemon) <= daemon_sockets_before
    });
    assert!(
        cancelled.elapsed() < Duration::from_secs(3),
        "connections lingered {:?}",
        cancelled.elapsed()
    );
    // The threads that made the calls are gone too.
    eventually(Duration::from_secs(20), || {
        threads_of(pid) <= threads_before + 1
    });
    let (error, listed) = mcp.call("list", json!({}));
    assert!(!error, "still serving: {listed}");
    assert_eq!(home.item(&id)["state"], "running");
}

#[test]
fn issue16_12_refusing_another_users_client_exits_1() {
    use std::os::unix::fs::PermissionsExt;
    let home = Home::new();
    home.start_daemon();
    let open = std::fs::Permissions::from_mode(0o777);
    std::fs::set_permissions(home.path(), open.clone()).unwrap();
    std::fs::set_permissions(home.socket(), open).unwrap();
    let refused = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            BIN,
            "list",
        ])
        .env("BGWORK_HOME", home.path())
        .output()
        .unwrap();
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("refused"), "{stderr}");
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(Path::new(&home.socket()).exists());
}

#[test]
fn issue16_2_a_socket_that_accepts_nothing_fails_the_call_and_starts_no_daemon() {
    use nix::sys::socket::{self, AddressFamily, Backlog, SockFlag, SockType, UnixAddr};
    let home = Home::new().with("BGWORK_ANSWER_TIMEOUT_MS", "1000");
    // A listener (a stuck daemon) that accepts nothing, its queue full.
    let address = UnixAddr::new(&home.socket()).unwrap();
    let listener = socket::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    socket::bind(std::os::fd::AsRawFd::as_raw_fd(&listener), &address).unwrap();
    socket::listen(&listener, Backlog::new(0).unwrap()).unwrap();
    let mut queued = Vec::new();
    loop {
        let client = socket::socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .unwrap();
        if socket::connect(std::os::fd::AsRawFd::as_raw_fd(&client), &address).is_err() {
            break;
        }
        queued.push(client);
    }
    let began = Instant::now();
    let call = home
        .command(&["list"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let output = finish_within(call, Duration::from_secs(10));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "{:?}",
        began.elapsed()
    );
    assert!(stderr.contains("accepts no connection"), "{stderr}");
    assert!(
        !home.path().join("daemon.log").exists(),
        "no second daemon was started over it"
    );
    drop(queued);
    drop(listener);
}

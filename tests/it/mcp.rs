//! `bgwork mcp` over stdio JSON-RPC, the Python SDK interop session, and the Claude Code
//! hook fed with recorded hook events.

use crate::util::{Home, BIN};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Stdio};

pub(crate) struct Mcp {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Mcp {
    pub(crate) fn start(home: &Home) -> Mcp {
        Mcp::start_as(home.command(&["mcp"]), "bgwork-tests")
    }

    /// A server from `command`, initialized by a client named `client`.
    pub(crate) fn start_as(mut command: std::process::Command, client: &str) -> Mcp {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut mcp = Mcp {
            child,
            stdin,
            stdout,
            next_id: 0,
        };
        let init = mcp.request(
            "initialize",
            json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": client, "version": "1"}
            }),
        );
        assert_eq!(init["result"]["serverInfo"]["name"], "bgwork");
        mcp.notify("notifications/initialized");
        mcp
    }

    fn notify(&mut self, method: &str) {
        let line = json!({"jsonrpc": "2.0", "method": method});
        writeln!(self.stdin, "{line}").unwrap();
    }

    pub(crate) fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let line =
            json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params});
        writeln!(self.stdin, "{line}").unwrap();
        loop {
            let mut reply = String::new();
            assert!(
                self.stdout.read_line(&mut reply).unwrap() > 0,
                "the server hung up"
            );
            let reply: Value = serde_json::from_str(&reply).unwrap();
            if reply["id"] == self.next_id {
                return reply;
            }
        }
    }

    /// The server's pid.
    pub(crate) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Calls a tool; returns (is_error, structured content).
    pub(crate) fn call(&mut self, tool: &str, arguments: Value) -> (bool, Value) {
        let reply = self.request("tools/call", json!({"name": tool, "arguments": arguments}));
        let result = &reply["result"];
        let text: Value =
            serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(
            text, result["structuredContent"],
            "text and structured content agree"
        );
        (
            result["isError"] == true,
            result["structuredContent"].clone(),
        )
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn tools_list_offers_every_call_with_a_schema_and_a_description() {
    let home = Home::new();
    let mut mcp = Mcp::start(&home);
    let tools = mcp.request("tools/list", json!({}))["result"]["tools"].clone();
    let names: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "start",
            "run",
            "list",
            "read",
            "send",
            "stop",
            "wait",
            "monitor",
            "notices",
            "resize",
            "dismiss",
            "restart",
            "history",
            "agent_start"
        ]
    );
    for tool in tools.as_array().unwrap() {
        assert_eq!(tool["inputSchema"]["type"], "object");
        assert!(tool["description"].as_str().unwrap().len() > 60);
    }
    let start = &tools[0];
    assert_eq!(start["inputSchema"]["required"], json!(["command"]));
    assert!(start["inputSchema"]["properties"]["window_ms"].is_object());
}

#[test]
fn each_tool_works_and_notices_ride_along_once() {
    let home = Home::new();
    let mut mcp = Mcp::start(&home);
    let (error, started) = mcp.call(
        "start",
        json!({"command": "echo one; read x; echo two", "notify": true, "window_ms": 0}),
    );
    assert!(!error);
    let id = started["id"].as_str().unwrap().to_string();
    assert_eq!(started["notices"], json!([]));
    let (_, waited) = mcp.call(
        "wait",
        json!({"ids": [id], "until": "one", "timeout_s": 20}),
    );
    assert_eq!(waited["reason"], "matched");
    let (_, read) = mcp.call("read", json!({"id": id}));
    assert_eq!(read["output"], "one\n");
    mcp.call("send", json!({"id": id, "text": "\\n"}));
    let (_, ended) = mcp.call("wait", json!({"id": id, "timeout_s": 20}));
    assert_eq!(ended["items"][0]["end"], "succeeded");

    let (_, other) = mcp.call(
        "start",
        json!({"command": "exit 6", "notify": true, "window_ms": 0}),
    );
    // Its notice rides along on the first result after it ends: maybe this very one.
    let mut notices: Vec<Value> = other["notices"].as_array().unwrap().clone();
    let other = other["id"].as_str().unwrap().to_string();
    let (_, listed) = mcp.call(
        "run",
        json!({"command": "sleep 0.3; echo ran", "timeout_s": 20}),
    );
    assert_eq!(listed["outcome"], "ended");
    assert_eq!(listed["output"], "ran\n");
    // The other job's notice rides along on a result once it has ended.
    notices.extend(listed["notices"].as_array().unwrap().iter().cloned());
    for _ in 0..2000 {
        if !notices.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        let (_, list) = mcp.call("list", json!({}));
        notices.extend(list["notices"].as_array().unwrap().iter().cloned());
    }
    if notices.len() != 1 {
        let (_, all) = mcp.call("list", json!({"all": true}));
        let log = std::fs::read_to_string(home.path().join("daemon.log")).unwrap_or_default();
        panic!("notices {notices:?}\nlist {all}\ndaemon.log {log}");
    }
    assert_eq!(notices[0]["item"], other.as_str());
    assert_eq!(notices[0]["exit_code"], 6);
    let (_, list) = mcp.call("list", json!({"all": true}));
    assert_eq!(list["notices"], json!([]), "delivered once");
    assert_eq!(list["items"].as_array().unwrap().len(), 3);

    let (_, mon) = mcp.call("monitor", json!({"mode": "wait", "until_end": other}));
    assert!(mon["id"].as_str().unwrap().starts_with("mon-"));
    let (_, sleeper) = mcp.call("start", json!({"command": "sleep 1000", "window_ms": 0}));
    let (_, stopped) = mcp.call("stop", json!({"id": sleeper["id"], "grace_s": 1}));
    assert_eq!(stopped["end"], "stopped_by_agent");
    let (_, notices) = mcp.call("notices", json!({}));
    assert_eq!(notices["notices"], json!([]));
}

#[test]
fn errors_are_tool_errors_with_the_spec_code_and_the_server_survives() {
    let home = Home::new();
    let mut mcp = Mcp::start(&home);
    let cases = [
        ("read", json!({"id": "bg-77"}), "unknown_id"),
        (
            "wait",
            json!({"ids": ["bg-1"], "until": "(bad"}),
            "bad_request",
        ),
        ("wait", json!({"ids": ["bg-1"]}), "unknown_id"),
        ("start", json!({}), "bad_request"),
        (
            "start",
            json!({"command": "true", "colour": "blue"}),
            "bad_request",
        ),
        (
            "start",
            json!({"command": "true", "cwd": "/no/such/dir", "window_ms": 0}),
            "spawn_failed",
        ),
        ("read", json!({"id": 5}), "bad_request"),
        ("teleport", json!({}), "bad_request"),
    ];
    for (tool, args, code) in cases {
        let (error, body) = mcp.call(tool, args.clone());
        assert!(error, "{tool} {args}");
        assert_eq!(body["error"]["code"], code, "{tool} {args}: {body}");
        assert!(body["notices"].is_array());
    }
    let (error, _) = mcp.call("list", json!({}));
    assert!(!error, "still serving");
}

#[test]
fn the_python_sdk_client_runs_a_whole_session() {
    let python = std::env::var("BGWORK_TEST_PYTHON")
        .expect("BGWORK_TEST_PYTHON names a Python with the `mcp` package: scripts/test makes one");
    let home = Home::new();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/mcp_session.py");
    let output = std::process::Command::new(python)
        .args([script, BIN])
        .env("BGWORK_HOME", home.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("interop session passed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn hook(home: &Home, event: Value, extra: &[&str]) -> String {
    hook_with_env(home, event, extra, &[])
}

/// Feeds one recorded hook event to `bgwork hook claude-code`; returns what it printed.
fn hook_with_env(home: &Home, event: Value, extra: &[&str], env: &[(&str, &Path)]) -> String {
    let mut args = vec!["hook", "claude-code"];
    args.extend_from_slice(extra);
    let mut command = home.command(&args);
    command
        .env_remove("BGWORK_SESSION")
        .envs(env.iter().copied());
    let output = crate::util::hook_output(command, &event);
    assert!(output.status.success());
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn the_claude_code_hook_delivers_notices_once_as_additional_context() {
    let home = Home::new();
    let session = "3f1c2a9e-claude-session";
    let start = |command: &str| {
        let args = [
            "--session",
            session,
            "--json",
            "start",
            "--notify",
            "--window",
            "0",
            "--",
            command,
        ];
        home.run(&args).json()["id"].as_str().unwrap().to_string()
    };
    let id = start("echo 'BUILD FAILED: missing ;'; exit 2");
    home.run(&["--session", session, "wait", &id]);
    let prompt = json!({
        "session_id": session,
        "transcript_path": "/tmp/transcript.jsonl",
        "cwd": "/work",
        "hook_event_name": "UserPromptSubmit",
        "prompt": "what next?"
    });
    // The wait above showed the end: nothing to say.
    assert_eq!(hook(&home, prompt.clone(), &[]), "");
    let second = start("echo ok");
    let mut said = String::new();
    for _ in 0..500 {
        said = hook(
            &home,
            json!({"session_id": session, "hook_event_name": "PostToolUse", "tool_name": "Bash"}),
            &[],
        );
        if !said.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let reply: Value = serde_json::from_str(&said).unwrap();
    assert_eq!(reply["hookSpecificOutput"]["hookEventName"], "PostToolUse");
    let context = reply["hookSpecificOutput"]["additionalContext"]
        .as_str()
        .unwrap();
    assert!(
        context.contains(&format!("{second} finished successfully (exit 0)")),
        "{context}"
    );
    assert!(context.contains("| ok"), "{context}");
    assert_eq!(hook(&home, prompt, &[]), "", "delivered once");
}

#[test]
fn the_stop_hook_asks_to_wait_for_armed_work_only_when_asked_to() {
    let home = Home::new();
    let session = "stop-session";
    home.run(&[
        "--session",
        session,
        "start",
        "--notify",
        "--window",
        "0",
        "--name",
        "suite",
        "--",
        "sleep 1000",
    ]);
    let stop = json!({"session_id": session, "hook_event_name": "Stop", "stop_hook_active": false});
    assert_eq!(hook(&home, stop.clone(), &[]), "");
    let reply: Value = serde_json::from_str(&hook(&home, stop, &["--wait-on-stop"])).unwrap();
    assert_eq!(reply["decision"], "block");
    assert!(
        reply["reason"]
            .as_str()
            .unwrap()
            .contains("bgwork wait bg-1"),
        "{reply}"
    );
    let again = json!({"session_id": session, "hook_event_name": "Stop", "stop_hook_active": true});
    assert_eq!(hook(&home, again, &["--wait-on-stop"]), "", "never loops");
    let env_file = home.path().join("claude-env");
    let start =
        json!({"session_id": session, "hook_event_name": "SessionStart", "source": "startup"});
    hook_with_env(&home, start, &[], &[("CLAUDE_ENV_FILE", &env_file)]);
    let exported = std::fs::read_to_string(env_file).unwrap();
    assert_eq!(exported, format!("export BGWORK_SESSION='{session}'\n"));
}

/// A server with no session given, started by this test process (its harness).
fn server_of_this_harness(home: &Home) -> Mcp {
    let mut command = home.command(&["mcp"]);
    command.env_remove("BGWORK_SESSION");
    Mcp::start_as(command, "claude-code")
}

/// Whether an item whose command is `command` has ended, in any session.
fn ended_anywhere(home: &Home, command: &str) -> bool {
    home.json(&["list", "--all", "--all-sessions"])["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|item| item["command"] == command && item["state"] == "ended")
}

#[test]
fn issue22_11_a_restarted_mcp_server_keeps_its_session_work_and_notices() {
    let home = Home::new();
    let mut first = server_of_this_harness(&home);
    let (_, long) = first.call("start", json!({"command": "sleep 100", "window_ms": 0}));
    let long = long["id"].as_str().unwrap().to_string();
    let trigger = home.path().join("trigger");
    let short = format!(
        "while [ ! -e '{}' ]; do sleep 0.01; done; exit 5",
        trigger.display()
    );
    let (_, armed) = first.call(
        "start",
        json!({"command": short, "notify": true, "window_ms": 0}),
    );
    let armed = armed["id"].as_str().unwrap().to_string();
    // The harness restarts its server (a reconnect, a config reload).
    drop(first);
    std::fs::write(&trigger, "").unwrap();
    crate::util::eventually(std::time::Duration::from_secs(10), || {
        ended_anywhere(&home, &short)
    });
    let mut second = server_of_this_harness(&home);
    let (_, listed) = second.call("list", json!({}));
    assert_eq!(listed["items"][0]["id"], long.as_str(), "{listed}");
    assert_eq!(listed["notices"][0]["item"], armed.as_str(), "{listed}");
    assert_eq!(listed["notices"][0]["exit_code"], 5, "{listed}");
    // The client's next message shows that result arrived: its notices are delivered.
    let (_, again) = second.call("list", json!({}));
    assert_eq!(again["notices"], json!([]), "{again}");
    drop(second);
    // And the daemon restarts too.
    home.kill_daemon();
    let mut third = server_of_this_harness(&home);
    let (_, listed) = third.call("list", json!({}));
    assert_eq!(listed["items"][0]["id"], long.as_str(), "{listed}");
    assert_eq!(listed["notices"], json!([]), "delivered once: {listed}");
    third.call("stop", json!({"id": long}));
}

#[test]
fn issue25_mcp_takes_the_cli_argument_names_and_names_the_one_meant() {
    let home = Home::new();
    let mut mcp = Mcp::start(&home);
    let (_, job) = mcp.call(
        "start",
        json!({"command": "trap '' TERM; sleep 300", "window": 200}),
    );
    let id = job["id"].as_str().unwrap().to_string();
    let (error, refused) = mcp.call("stop", json!({"id": id, "gracee": 1}));
    assert!(error, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("`gracee`") && message.contains("did you mean `grace_s`?"),
        "{message}"
    );
    assert!(message.contains("nothing was done"), "{message}");
    assert_eq!(home.item(&id)["state"], "running");
    let (error, stopped) = mcp.call("stop", json!({"id": id, "grace": 0.2}));
    assert!(!error, "{stopped}");
    assert_eq!(stopped["end"], "stopped_by_agent", "{stopped}");
    assert!(
        stopped["report"].as_str().unwrap().contains("killed after"),
        "the CLI's --grace was the grace: {stopped}"
    );
    let (error, waited) = mcp.call("wait", json!({"id": id, "timeout": 1}));
    assert!(!error, "{waited}");
    let (error, twice) = mcp.call("wait", json!({"id": id, "timeout": 1, "timeout_s": 2}));
    assert!(
        error
            && twice["error"]["message"]
                .as_str()
                .unwrap()
                .contains("twice"),
        "{twice}"
    );
}

/// What a model reads after a `start`: where the output is, and whether a notice will
/// come, in one line (`next`); work that ended within the window gets none.
#[test]
fn issue25_mcp_start_says_where_its_output_is_and_whether_a_notice_will_come() {
    let home = Home::new();
    let mut mcp = Mcp::start(&home);
    let (error, armed) = mcp.call("start", json!({"command": "sleep 30", "notify": true}));
    assert!(!error, "{armed}");
    let id = armed["id"].as_str().unwrap().to_string();
    let next = armed["next"]
        .as_str()
        .unwrap_or_else(|| panic!("no next: {armed}"));
    assert!(next.contains(&format!("`read` {id}")), "{next}");
    assert!(next.contains("will come once as a notice"), "{next}");
    let (_, quiet) = mcp.call("start", json!({"command": "sleep 31"}));
    let next = quiet["next"]
        .as_str()
        .unwrap_or_else(|| panic!("no next: {quiet}"));
    assert!(
        next.contains("`wait`") && next.contains("no notice of its end will come"),
        "{next}"
    );
    let (_, ended) = mcp.call("start", json!({"command": "true", "notify": true}));
    assert!(ended["next"].is_null(), "{ended}");
    for id in [&id, quiet["id"].as_str().unwrap()] {
        mcp.call("stop", json!({"id": id, "grace_s": 0}));
    }
}

/// The CLI's start, as a model reads it from a shell tool: where the output is.
#[test]
fn issue25_cli_start_says_where_its_output_is() {
    let home = Home::new();
    let run = home.run(&["start", "--notify", "--", "sleep 30"]);
    assert!(
        run.stdout
            .contains("`bgwork read bg-1` for its output; a notice will come when it ends"),
        "{}",
        run.stdout
    );
    home.run(&["stop", "bg-1"]);
}

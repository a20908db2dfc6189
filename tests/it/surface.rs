//! The surface a person and a model meet (issue 12): exact commands, stop and status
//! replies, sessions one can see, help that teaches, conveniences, MCP as a model sees it.

use crate::mcp::Mcp;
use crate::util::{Home, BIN};
use serde_json::json;

/// Several arguments after `--` reach the job exactly, and the recorded command is a
/// shell line that gives the same arguments when pasted.
#[test]
fn issue12_1_several_arguments_reach_the_job_exactly() {
    let home = Home::new();
    let args = [
        "printf",
        "[%s]\\n",
        "a b",
        "it's",
        "$HOME",
        "*",
        "x\ny",
        "",
        "\"q\"",
        "back\\slash",
    ];
    let mut call = vec!["run", "--timeout", "20", "--"];
    call.extend_from_slice(&args);
    let run = home.run(&call);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let want = "[a b]\n[it's]\n[$HOME]\n[*]\n[x\ny]\n[]\n[\"q\"]\n[back\\slash]\n";
    assert_eq!(run.stdout, want);
    // The recorded command, pasted into bash, prints the same.
    let list = home.json(&["list", "--all"]);
    let command = list["items"][0]["command"].as_str().unwrap().to_string();
    let pasted = std::process::Command::new("bash")
        .args(["-c", &command])
        .env("HOME", "/nowhere")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&pasted.stdout), want, "{command}");
    assert!(!command.contains('\n'), "one line: {command}");
    // `start` and `agent start` build their command the same way.
    let started = home.json(&["start", "--window", "5000", "--", "echo", "a  b", "$X"]);
    assert_eq!(started["output"], "a  b $X\n");
    let agent = home.json(&["agent", "start", "--", "printf", "%s|", "1 2", "it's"]);
    assert_eq!(agent["command"], "printf '%s|' '1 2' 'it'\\''s'");
}

#[test]
fn issue12_1_one_argument_is_a_shell_command_line() {
    let home = Home::new();
    let run = home.run(&["run", "--timeout", "20", "--", "echo one; echo $((1+1))"]);
    assert_eq!(run.stdout, "one\n2\n");
    // An assignment-looking first word of several is a program name, not a variable.
    let run = home.run(&["run", "--timeout", "20", "--", "A=1", "true"]);
    assert_ne!(run.code, 0, "`A=1` is run as a program: {}", run.stdout);
}

#[test]
fn issue12_help_a_missing_double_dash_is_suggested() {
    let home = Home::new();
    let run = home.run(&["start", "--name", "x", "echo", "a b"]);
    assert_eq!(run.code, 2);
    assert!(
        run.stderr.contains("bgwork start --name x -- echo 'a b'"),
        "{}",
        run.stderr
    );
    let run = home.run(&["run", "make", "test"]);
    assert!(
        run.stderr.contains("bgwork run -- make test"),
        "{}",
        run.stderr
    );
    let run = home.run(&["agent", "start", "claude", "-p", "hi"]);
    assert!(
        run.stderr.contains("bgwork agent start -- claude -p hi"),
        "{}",
        run.stderr
    );
}

#[test]
fn issue12_5_stop_of_an_ended_job_says_it_had_already_ended() {
    let home = Home::new();
    let id = home.start("exit 101");
    home.wait_end(&id);
    let run = home.run(&["stop", &id]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.stdout.trim(),
        format!("{id} had already ended: FAILED (exit 101)")
    );
    let reply = home.json(&["stop", &id]);
    assert_eq!(reply["already_ended"], true);
    assert_eq!(reply["end"], "failed");
}

#[test]
fn issue12_5_a_stop_that_had_to_kill_says_so() {
    let home = Home::new();
    let id = home.start("trap '' TERM; echo ready; while :; do sleep 0.1; done");
    home.run(&["wait", &id, "--until", "ready", "--timeout", "20"]);
    let run = home.run(&["stop", &id, "--grace", "0.5"]);
    assert_eq!(
        run.stdout.trim(),
        format!("{id} was stopped by the agent: did not stop on TERM; killed after 0.5 s"),
        "{}",
        run.stderr
    );
    // A job that stops on TERM says nothing more.
    let id = home.start("sleep 100");
    let run = home.run(&["stop", &id]);
    assert_eq!(run.stdout.trim(), format!("{id} was stopped by the agent"));
}

#[test]
fn issue12_6_status_never_starts_a_daemon() {
    let home = Home::new();
    let run = home.run(&["status"]);
    assert_eq!(run.code, 3, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("no daemon is running"),
        "{}",
        run.stdout
    );
    let run = home.run(&["--json", "status"]);
    assert_eq!(run.code, 3);
    assert_eq!(run.json()["daemon"], false);
    assert!(!home.socket().exists(), "status started a daemon");
    home.start_daemon();
    assert_eq!(home.run(&["status"]).code, 0);
}

#[test]
fn issue12_sessions_every_job_knows_its_session_and_id() {
    let home = Home::new();
    let started = home.json(&[
        "--session",
        "proj",
        "start",
        "--window",
        "5000",
        "--",
        "echo $BGWORK_SESSION $BGWORK_ITEM",
    ]);
    let id = started["id"].as_str().unwrap();
    assert_eq!(started["output"], format!("proj {id}\n"));
    // A `bgwork start` inside a job lands in the job's session.
    let inner = format!("{BIN} start --window 0 -- 'sleep 30'");
    let outer = home.json(&[
        "--session",
        "proj",
        "start",
        "--window",
        "5000",
        "--",
        &inner,
    ]);
    // `--window 0` answers at once: `starting`, or `started` when the process was
    // already running by the time the reply was made (both are true).
    let said = outer["output"].as_str().unwrap();
    assert!(
        said.contains("starting") || said.contains(" started (pid "),
        "{outer}"
    );
    let listed = home.json(&["--session", "proj", "list"]);
    assert_eq!(listed["items"].as_array().unwrap().len(), 1, "{listed}");
}

#[test]
fn issue12_sessions_list_all_sessions_groups_by_session_with_sub_agents() {
    let home = Home::new();
    home.start("sleep 100");
    let foo = |args: &[&str]| {
        let mut all = vec!["--session", "foo"];
        all.extend_from_slice(args);
        home.json(&all)
    };
    foo(&["start", "--window", "0", "--", "sleep 100"]);
    let agent = foo(&["agent", "start", "--", "sleep 100"]);
    let sub = agent["id"].as_str().unwrap().to_string();
    let sub_session = format!("foo/{sub}");
    home.json(&[
        "--session",
        &sub_session,
        "start",
        "--window",
        "0",
        "--",
        "sleep 100",
    ]);
    // `list` of a session shows its own work only, and where the rest is.
    let own = home.run(&["list"]);
    assert!(!own.stdout.contains("foo"), "{}", own.stdout);
    let empty = home.run(&["--session", "nobody", "list"]);
    assert_eq!(
        empty.stdout,
        "no work in session nobody; 4 items run in other sessions: `bgwork list --all-sessions`\n"
    );
    let every = home.run(&["list", "--all-sessions"]);
    let lines: Vec<&str> = every.stdout.lines().collect();
    let at = |text: &str| {
        lines
            .iter()
            .position(|l| l.contains(text))
            .unwrap_or_else(|| panic!("{text} missing:\n{}", every.stdout))
    };
    at("session test");
    assert!(
        at("session foo") < at(&format!("sub-agent {sub}")),
        "{}",
        every.stdout
    );
    let heading = at(&format!("sub-agent {sub}"));
    assert!(
        lines[heading].starts_with("  sub-agent"),
        "{}",
        every.stdout
    );
    assert!(
        lines[heading + 1].starts_with("    bg-"),
        "{}",
        every.stdout
    );
    assert_eq!(
        home.json(&["list", "--all-sessions"])["items"]
            .as_array()
            .unwrap()
            .len(),
        4
    );
    let status = home.run(&["status"]);
    assert!(
        status.stdout.contains("running 4 in 3 sessions"),
        "{}",
        status.stdout
    );
    let counts = home.json(&["status"]);
    assert_eq!(counts["sessions"]["foo"], 2);
    assert_eq!(counts["sessions"][&sub_session], 1);
}

#[test]
fn issue12_list_shows_age_pid_and_end_on_one_line() {
    let home = Home::new();
    let id = home.start("echo one\nexit 3");
    home.wait_end(&id);
    let running = home.start("sleep 100");
    let pid = home.item(&running)["pid"].as_i64().unwrap();
    let run = home.run(&["list", "--all"]);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines.len(),
        3,
        "a heading and one line per item:\n{}",
        run.stdout
    );
    assert!(lines[0].starts_with("ID"), "{}", run.stdout);
    assert!(lines[1].contains("failed (3)") && lines[1].contains("echo one\\nexit 3"));
    assert!(lines[2].contains(&pid.to_string()) && lines[2].contains("running"));
    assert!(lines[2].contains("s "), "an age in seconds: {}", lines[2]);
}

#[test]
fn issue12_mcp_every_property_has_a_description_and_tools_carry_annotations() {
    let home = Home::new();
    let mut mcp = Mcp::start(&home);
    let tools = mcp.request("tools/list", json!({}))["result"]["tools"].clone();
    for tool in tools.as_array().unwrap() {
        let name = tool["name"].as_str().unwrap();
        for (property, schema) in tool["inputSchema"]["properties"].as_object().unwrap() {
            let description = schema["description"].as_str().unwrap_or_default();
            assert!(
                description.len() > 10,
                "{name}.{property} has no description"
            );
        }
        assert!(tool["annotations"].is_object(), "{name} has no annotations");
    }
    let tool = |name: &str| {
        tools
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no tool {name}"))
            .clone()
    };
    for name in ["list", "read", "wait", "notices"] {
        assert_eq!(tool(name)["annotations"]["readOnlyHint"], true, "{name}");
    }
    assert_eq!(tool("stop")["annotations"]["destructiveHint"], true);
    assert_eq!(tool("start")["annotations"]["readOnlyHint"], false);
}

#[test]
fn issue12_mcp_item_results_are_short_unless_verbose() {
    let home = Home::new();
    let mut mcp = Mcp::start(&home);
    let (error, ran) = mcp.call("run", json!({"command": "echo hi", "timeout_s": 30}));
    assert!(!error, "{ran}");
    assert_eq!(ran["output"], "hi\n");
    assert_eq!(ran["exit_code"], 0);
    for field in ["log_path", "env_names", "cwd", "session", "signal"] {
        assert!(ran.get(field).is_none(), "{field} in {ran}");
    }
    let (_, listed) = mcp.call("list", json!({"all": true}));
    assert!(listed["items"][0].get("log_path").is_none(), "{listed}");
    assert_eq!(listed["items"][0]["end"], "succeeded");
    let (_, verbose) = mcp.call("list", json!({"all": true, "verbose": true}));
    assert!(verbose["items"][0]["log_path"].is_string(), "{verbose}");
    assert!(verbose["items"][0]["cwd"].is_string(), "{verbose}");
}

#[test]
fn issue12_mcp_sessions_are_named_after_the_client_and_folder() {
    let home = Home::new();
    let project = tempfile::Builder::new()
        .prefix("bgw")
        .tempdir_in("/tmp")
        .unwrap();
    let folder = project.path().join("MyProject");
    std::fs::create_dir(&folder).unwrap();
    let server = || {
        let mut command = home.command(&["mcp"]);
        command.env_remove("BGWORK_SESSION").current_dir(&folder);
        Mcp::start_as(command, "claude-code")
    };
    let mut first = server();
    let mut second = server();
    let (_, started) = first.call("start", json!({"command": "sleep 100", "window_ms": 0}));
    assert!(started["id"].is_string(), "{started}");
    let (_, other) = second.call("list", json!({}));
    assert_eq!(
        other["items"],
        json!([]),
        "a second server has its own session"
    );
    second.call("start", json!({"command": "sleep 100", "window_ms": 0}));
    let listed = home.run(&["list", "--all-sessions"]);
    assert!(
        listed.stdout.contains("session claude-code@myproject\n"),
        "{}",
        listed.stdout
    );
    assert!(
        listed.stdout.contains("session claude-code@myproject-2\n"),
        "{}",
        listed.stdout
    );
    // `bgwork mcp --help` does not claim a default session.
    let help = home.run(&["mcp", "--help"]);
    assert!(
        !help.stdout.contains("[default: default]"),
        "{}",
        help.stdout
    );
    assert!(
        help.stdout.contains("claude-code@myproject"),
        "{}",
        help.stdout
    );
}

#[test]
fn issue12_mcp_errors_speak_of_tools_not_commands() {
    let home = Home::new();
    let mut mcp = Mcp::start(&home);
    let (error, reply) = mcp.call("read", json!({"id": "bg-999"}));
    assert!(error);
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("the `list` tool with `all: true`") && !message.contains("bgwork "),
        "{message}"
    );
    let (_, started) = mcp.call("start", json!({"command": "sleep 100", "window_ms": 0}));
    let id = started["id"].as_str().unwrap();
    let (error, reply) = mcp.call("dismiss", json!({"id": id}));
    assert!(error);
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("the `stop` tool with `id: {id}`")),
        "{message}"
    );
    let (error, reply) = mcp.call("list", json!({"verbose": "yes"}));
    assert!(error, "{reply}");
    let (error, reply) = mcp.call("stop", json!({"id": id, "grace_s": -1}));
    assert!(error);
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`grace_s`"),
        "{reply}"
    );
}

#[test]
fn issue12_mcp_resize_dismiss_restart_and_agent_start_tools() {
    let home = Home::new();
    let mut mcp = Mcp::start(&home);
    let (_, pane) = mcp.call(
        "start",
        json!({"command": "cat", "pty": true, "window_ms": 0}),
    );
    let pane = pane["id"].as_str().unwrap().to_string();
    let (error, resized) = mcp.call("resize", json!({"id": pane, "cols": 90, "rows": 20}));
    assert!(!error, "{resized}");
    let (_, ran) = mcp.call("run", json!({"command": "echo $((6*7))", "timeout_s": 30}));
    let first = ran["id"].as_str().unwrap().to_string();
    let (error, again) = mcp.call("restart", json!({"id": first, "window_ms": 5000}));
    assert!(!error, "{again}");
    assert_eq!(again["restarted"], first);
    assert_eq!(again["output"], "42\n");
    assert_ne!(again["id"], first);
    let second = again["id"].as_str().unwrap().to_string();
    let (error, dismissed) = mcp.call("dismiss", json!({"ids": [first, second]}));
    assert!(!error, "{dismissed}");
    let (_, listed) = mcp.call("list", json!({"all": true}));
    assert_eq!(listed["items"].as_array().unwrap().len(), 1, "{listed}");
    let (error, agent) = mcp.call(
        "agent_start",
        json!({"command": "echo report > \"$BGWORK_REPORT\""}),
    );
    assert!(!error, "{agent}");
    assert!(agent["id"].as_str().unwrap().starts_with("sub-"), "{agent}");
}

/// The subcommands `bgwork --help` lists, with their own subcommands (`monitor wait`).
fn subcommands(home: &Home) -> Vec<Vec<String>> {
    let names = |args: &[String]| -> Vec<String> {
        let mut call: Vec<&str> = args.iter().map(String::as_str).collect();
        call.push("--help");
        let help = home.run(&call).stdout;
        help.split("Commands:")
            .nth(1)
            .map(|rest| rest.split("\n\n").next().unwrap_or_default().to_string())
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.split_whitespace().next().map(String::from))
            .filter(|name| name != "help")
            .collect()
    };
    let mut all = Vec::new();
    for name in names(&[]) {
        let path = vec![name];
        let children = names(&path);
        all.push(path.clone());
        for child in children {
            all.push(vec![path[0].clone(), child]);
        }
    }
    all
}

#[test]
fn issue12_help_every_option_of_every_subcommand_has_a_description() {
    let home = Home::new();
    let all = subcommands(&home);
    assert!(all.len() > 20, "{all:?}");
    for path in &all {
        let mut call: Vec<&str> = path.iter().map(String::as_str).collect();
        call.push("--help");
        let help = home.run(&call).stdout;
        let what = path.join(" ");
        let first = help.lines().next().unwrap_or_default();
        assert!(first.len() > 15, "bgwork {what}: no purpose line:\n{help}");
        // Every argument and option line carries text after its name.
        for section in ["Arguments:", "Options:"] {
            let Some(body) = help.split(section).nth(1) else {
                continue;
            };
            for line in body
                .split("\n\n")
                .next()
                .unwrap()
                .lines()
                .filter(|l| !l.is_empty())
            {
                let words: Vec<&str> = line.split("  ").filter(|w| !w.trim().is_empty()).collect();
                assert!(
                    words.len() >= 2,
                    "bgwork {what}: `{}` has no description",
                    line.trim()
                );
            }
        }
        let leaf = !help.contains("Commands:");
        let examples =
            ["demo", "status", "man"].contains(&path[0].as_str()) || help.contains("Example");
        assert!(!leaf || examples, "bgwork {what} has no example:\n{help}");
    }
    let top = home.run(&["--help"]).stdout;
    for variable in [
        "BGWORK_HOME",
        "BGWORK_SESSION",
        "BGWORK_ITEM",
        "BGWORK_MAX_RUNNING",
    ] {
        assert!(
            top.contains(variable),
            "{variable} missing from bgwork --help"
        );
    }
    let start = home.run(&["start", "--help"]).stdout;
    assert!(start.contains("[default: 1000]"), "{start}");
}

#[test]
fn issue12_help_completions_and_man_page() {
    let home = Home::new();
    for (shell, marker) in [
        ("bash", "complete -F _bgwork"),
        ("zsh", "#compdef bgwork"),
        ("fish", "complete -c bgwork"),
    ] {
        let run = home.run(&["completions", shell]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        assert!(run.stdout.contains(marker), "{shell}: {}", run.stdout);
        assert!(
            run.stdout.contains("all-sessions"),
            "{shell} lacks list's options"
        );
    }
    // The bash script loads and completes a subcommand.
    let script = home.run(&["completions", "bash"]).stdout;
    let file = home.path().join("bgwork.bash");
    std::fs::write(&file, script).unwrap();
    let probe = format!(
        "source {}; COMP_WORDS=(bgwork sta); COMP_CWORD=1; _bgwork bgwork sta bgwork; \
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        file.display()
    );
    let out = std::process::Command::new("bash")
        .args(["-c", &probe])
        .output()
        .unwrap();
    let completed = String::from_utf8_lossy(&out.stdout);
    assert!(completed.lines().any(|l| l == "start"), "{completed}");
    assert!(completed.lines().any(|l| l == "status"), "{completed}");
    let man = home.run(&["man"]);
    assert_eq!(man.code, 0);
    assert!(
        man.stdout.starts_with(".ie") || man.stdout.contains(".TH bgwork"),
        "{}",
        &man.stdout[..200]
    );
    assert!(
        man.stdout.contains("bgwork\\-start"),
        "the man page covers the subcommands"
    );
    assert!(man.stdout.contains("BGWORK_HOME"));
    assert!(
        man.stdout.contains("bgwork\\-monitor\\-wait"),
        "nested subcommands too"
    );
    assert!(
        man.stdout.is_ascii(),
        "plain roff that any man reader takes"
    );
    assert_eq!(home.run(&["completions", "tcsh"]).code, 2);
}

#[test]
fn issue12_wait_without_a_limit_quiet_and_clear_timeouts() {
    let home = Home::new();
    let id = home.start("sleep 100");
    let run = home.run(&["wait", &id, "--timeout", "0.3"]);
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stdout,
        format!("timed out after 0.3 s; {id} is still running\n")
    );
    let run = home.run(&["wait", &id, "--timeout", "0.3", "--until", "ready"]);
    assert_eq!(
        run.stdout,
        format!(
            "timed out after 0.3 s: /ready/ was not seen in new output; {id} is still running\n"
        )
    );
    let run = home.run(&["wait", &id, "--timeout", "0.3", "--quiet"]);
    assert_eq!((run.code, run.stdout.as_str()), (1, ""));
    // `--timeout none` outlasts what one call may wait: the CLI asks again.
    let quick = home.start("sleep 1; echo done");
    let run = home.run(&["wait", &quick, "--timeout", "none", "-q"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, ""), "{}", run.stderr);
    let run = home.run(&["wait", &id, "--timeout", "soon"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("not a duration"), "{}", run.stderr);
}

#[test]
fn issue12_dismiss_several_and_gc_by_age_or_all_ended() {
    let home = Home::new();
    let ids: Vec<String> = (0..3).map(|_| home.start("true")).collect();
    for id in &ids {
        home.wait_end(id);
    }
    let running = home.start("sleep 100");
    // All or none: one running id refuses the lot.
    let (code, error, message) = home.error(&["dismiss", &ids[0], &running]);
    assert_eq!((code, error.as_str()), (1, "refused"), "{message}");
    assert_eq!(
        home.json(&["list", "--all"])["items"]
            .as_array()
            .unwrap()
            .len(),
        4
    );
    let run = home.run(&["dismiss", &ids[0], &ids[1]]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        home.json(&["list", "--all"])["items"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // Nothing is older than an hour; everything ended is removed by --all-ended.
    assert_eq!(home.json(&["gc", "--older-than", "1h"])["removed"], 0);
    assert_eq!(home.json(&["gc", "--older-than", "0s"])["removed"], 3);
    let last = home.start("true");
    home.wait_end(&last);
    assert_eq!(home.json(&["gc", "--all-ended"])["removed"], 1);
    let ids: Vec<String> = home.json(&["list", "--all"])["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, [running]);
    assert_eq!(
        home.run(&["gc", "--older-than", "1h", "--all-ended"]).code,
        2
    );
}

#[test]
fn issue12_restart_starts_the_same_command_again() {
    let home = Home::new();
    let folder = tempfile::Builder::new()
        .prefix("bgw")
        .tempdir_in("/tmp")
        .unwrap();
    let dir = folder.path().display().to_string();
    let started = home.json(&[
        "start",
        "--name",
        "greet",
        "--cwd",
        &dir,
        "--env",
        "WHO=world",
        "--window",
        "5000",
        "--",
        "echo \"hello $WHO from $(pwd)\"",
    ]);
    let first = started["id"].as_str().unwrap().to_string();
    assert_eq!(started["output"], format!("hello world from {dir}\n"));
    // The value of --env was never recorded: it must be given again.
    let (code, error, message) = home.error(&["restart", &first]);
    assert_eq!((code, error.as_str()), (1, "refused"));
    assert!(message.contains("--env WHO=VALUE"), "{message}");
    let again = home.json(&["restart", &first, "--env", "WHO=again", "--window", "5000"]);
    assert_eq!(again["restarted"], first.as_str());
    assert_eq!(again["output"], format!("hello again from {dir}\n"));
    assert_eq!(again["name"], "greet");
    assert_ne!(again["id"], first.as_str());
    assert_eq!(
        home.item(&first)["end"],
        "succeeded",
        "the old record keeps its end"
    );
    // A running item is stopped first, then started again.
    let server = home.start("sleep 100");
    let text = home.run(&["restart", &server, "--window", "0"]);
    assert_eq!(text.code, 0, "{}", text.stderr);
    assert!(
        text.stdout
            .starts_with(&format!("restart of {server}: bg-")),
        "{}",
        text.stdout
    );
    assert_eq!(home.item(&server)["end"], "stopped_by_agent");
}

#[test]
fn issue12_read_follow_streams_until_the_end_and_exits_with_its_code() {
    use std::io::{BufRead, BufReader};
    let home = Home::new();
    let id = home.start("echo first; read go; echo second; printf last; exit 4");
    let mut follower = home
        .command(&["read", &id, "--follow"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(follower.stdout.take().unwrap());
    let mut line = String::new();
    lines.read_line(&mut line).unwrap();
    assert_eq!(line, "first\n", "the first line comes before the job ends");
    assert!(
        follower.try_wait().unwrap().is_none(),
        "it follows a running job"
    );
    home.run(&["send", &id, "\\n"]);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut lines, &mut rest).unwrap();
    let status = follower.wait().unwrap();
    assert_eq!(rest, "second\nlast");
    assert_eq!(status.code(), Some(4));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut follower.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(
        stderr.contains(&format!("{id} FAILED (exit 4)")),
        "{stderr}"
    );
}

#[test]
fn issue12_3_a_monitor_notifies_by_default_and_no_notify_opts_out() {
    let home = Home::new();
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let (armed, quiet) = (dir.path().join("armed"), dir.path().join("quiet"));
    let create = |path: &std::path::Path, extra: &[&str]| {
        let mut args = vec!["monitor", "wait", "--until-file", path.to_str().unwrap()];
        args.extend_from_slice(extra);
        home.json(&args)["id"].as_str().unwrap().to_string()
    };
    let armed_id = create(&armed, &[]);
    let quiet_id = create(&quiet, &["--no-notify"]);
    std::fs::write(&quiet, "").unwrap();
    std::fs::write(&armed, "").unwrap();
    for id in [&armed_id, &quiet_id] {
        crate::util::eventually(std::time::Duration::from_secs(20), || {
            home.item(id)["state"] == "ended"
        });
    }
    let notices = home.json(&["notices"]);
    let items: Vec<&str> = notices["notices"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["item"].as_str())
        .collect();
    assert_eq!(items, vec![armed_id.as_str()], "{notices}");
}

#[test]
fn issue12_4_a_watch_notice_carries_every_line_it_counts() {
    let home = Home::new();
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let file = dir.path().join("app.log");
    std::fs::write(&file, "").unwrap();
    let id = home.json(&[
        "monitor",
        "watch",
        "--file",
        file.to_str().unwrap(),
        "--regex",
        "ERR",
    ])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let log = |line: &str| {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&file)
            .unwrap();
        writeln!(f, "{line}").unwrap();
    };
    for n in 1..=3 {
        log(&format!("ERR number {n}"));
        // Each line its own batch: the watch has seen it before the next one comes.
        crate::util::eventually(std::time::Duration::from_secs(10), || {
            home.json(&["notices", "--peek"])["notices"]
                .as_array()
                .unwrap()
                .iter()
                .any(|notice| notice["count"].as_u64() == Some(n as u64))
        });
    }
    let notices = home.json(&["notices"]);
    let notice = &notices["notices"][0];
    assert_eq!(notice["item"], id.as_str());
    let tail = notice["tail"].as_str().unwrap();
    for n in 1..=3 {
        assert!(tail.contains(&format!("ERR number {n}")), "{notice}");
    }
}

#[test]
fn job_spans_past_a_day_are_taken_and_the_daemon_alone_says_the_range() {
    // Found by a hostile tester: the CLI refused `--max-runtime 2d` and `--quiet-after
    // 25h` (the day of a `--timeout`), which the daemon takes.
    let home = Home::new();
    let id = home.start_with(&["--max-runtime", "2d", "--quiet-after", "25h"], "sleep 30");
    assert_eq!(home.item(&id)["state"], "running");
    home.run(&["stop", &id]);
    let (code, kind, message) = home.error(&["start", "--max-runtime", "0", "--", "true"]);
    assert_eq!((code, kind.as_str()), (2, "bad_request"), "{message}");
    assert!(message.contains("from 1ms to 365 days"), "{message}");
    let (code, _, message) = home.error(&["start", "--quiet-after", "8d", "--", "true"]);
    assert_eq!(code, 2);
    assert!(message.contains("to 7 days"), "{message}");
}

//! Hooks of agent harnesses fed with recorded hook events (`tests/it/events/`): Claude
//! Code's `--rewake` waiter, Codex CLI and Gemini CLI, the configuration snippets of
//! docs/harnesses.md, and the bound on notices per turn boundary (hooks and MCP).

use crate::mcp::Mcp;
use crate::util::{eventually, finish_within, Home, BIN};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A hook event recorded from `harness`, addressed to `session`.
fn event(harness: &str, name: &str, session: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/it/events")
        .join(harness)
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let mut event: Value = serde_json::from_str(&text).unwrap();
    event["session_id"] = session.into();
    event
}

/// Runs `command` (a shell line, as a harness does) with `stdin` as its input, with
/// the `bgwork` under test first on PATH; the session comes from the event only.
fn spawn_hook(home: &Home, command: &str, stdin: &[u8]) -> Child {
    let bin_dir = Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = home
        .command(&[])
        .env_remove("BGWORK_SESSION")
        .env("PATH", path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn_shell(command);
    let mut input = child.stdin.take().unwrap();
    // A hook may stop reading a huge event early: a broken pipe is its answer.
    let _ = input.write_all(stdin);
    drop(input);
    child
}

trait SpawnShell {
    fn spawn_shell(&mut self, line: &str) -> Child;
}

impl SpawnShell for Command {
    /// Spawns `sh -c LINE` with this command's environment (its program is replaced).
    fn spawn_shell(&mut self, line: &str) -> Child {
        let mut shell = Command::new("sh");
        // `exec`: the hook is the shell's process, so a kill by its pid reaches the hook.
        shell.arg("-c").arg(format!("exec {line}"));
        for (key, value) in self.get_envs() {
            match value {
                Some(value) => shell.env(key, value),
                None => shell.env_remove(key),
            };
        }
        shell
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

fn hook(home: &Home, command: &str, event: &Value) -> Output {
    finish_within(
        spawn_hook(home, command, event.to_string().as_bytes()),
        Duration::from_secs(10),
    )
}

fn stdout_json(output: &Output) -> Value {
    let text = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

/// A job of `home`'s session armed with `--notify` that ends (exit 3, after printing
/// `tail-line`) once the returned trigger file exists.
fn armed_job(home: &Home) -> (String, PathBuf) {
    let trigger = home.path().join(format!("trigger-{}", rand_suffix()));
    let command = format!(
        "while [ ! -e '{}' ]; do sleep 0.005; done; echo tail-line; exit 3",
        trigger.display()
    );
    let id = home.start_with(&["--notify"], &command);
    (id, trigger)
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// A notice of a job that ended, pending (not shown by any reply).
fn pending_notice(home: &Home) -> String {
    let (id, trigger) = armed_job(home);
    std::fs::write(&trigger, "").unwrap();
    eventually(Duration::from_secs(10), || {
        home.json(&["notices", "--peek"])["notices"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["item"] == id.as_str())
    });
    id
}

/// Whether a rewake waiter holds its lock (the file exists only while one waits).
fn waiter_present(home: &Home) -> bool {
    std::fs::read_dir(home.path())
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("rewake-"))
}

const REWAKE: &str = "bgwork hook claude-code --rewake";

#[test]
fn issue15_7_rewake_writes_the_end_on_stderr_and_exits_2() {
    let home = Home::new();
    let (id, trigger) = armed_job(&home);
    let stop = event("claude-code", "Stop", &home.session);
    let waiter = spawn_hook(&home, REWAKE, stop.to_string().as_bytes());
    eventually(Duration::from_secs(10), || waiter_present(&home));
    std::fs::write(&trigger, "").unwrap();
    let output = finish_within(waiter, Duration::from_secs(10));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("{id} FAILED (exit 3)")),
        "{stderr}"
    );
    assert!(stderr.contains("| tail-line"), "{stderr}");
    assert!(
        stderr.contains("not a request to start more work"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty());
    // Delivered: the next boundary has nothing to say, and no waiter is left behind.
    assert_eq!(home.json(&["notices"])["notices"], json!([]));
    assert!(!waiter_present(&home));
}

#[test]
fn issue15_7_rewake_exits_0_at_once_and_silently_with_nothing_armed() {
    let home = Home::new();
    home.start("sleep 1000"); // running, but not armed
    let stop = event("claude-code", "Stop", &home.session);
    let began = Instant::now();
    let output = hook(&home, REWAKE, &stop);
    assert_eq!(output.status.code(), Some(0));
    assert!(
        output.stderr.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        began.elapsed() < Duration::from_secs(3),
        "{:?}",
        began.elapsed()
    );
}

#[test]
fn issue15_7_rewake_delivers_a_notice_already_pending_at_once() {
    let home = Home::new();
    let id = pending_notice(&home);
    let output = hook(&home, REWAKE, &event("claude-code", "Stop", &home.session));
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains(&format!("{id} FAILED (exit 3)")));
}

#[test]
fn issue15_7_a_second_rewake_waiter_of_the_session_exits_0_at_once() {
    let home = Home::new();
    let (id, trigger) = armed_job(&home);
    let stop = event("claude-code", "Stop", &home.session);
    let first = spawn_hook(&home, REWAKE, stop.to_string().as_bytes());
    eventually(Duration::from_secs(10), || waiter_present(&home));
    let began = Instant::now();
    let second = hook(&home, REWAKE, &stop);
    assert_eq!(second.status.code(), Some(0));
    assert!(second.stderr.is_empty());
    assert!(
        began.elapsed() < Duration::from_secs(3),
        "{:?}",
        began.elapsed()
    );
    // Another session's waiter is not held back by this one.
    let other = hook(
        &home,
        REWAKE,
        &event("claude-code", "Stop", "another-session"),
    );
    assert_eq!(other.status.code(), Some(0));
    std::fs::write(&trigger, "").unwrap();
    let first = finish_within(first, Duration::from_secs(10));
    assert_eq!(first.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&first.stderr).contains(&id));
}

#[test]
fn issue15_7_a_rewake_hook_killed_mid_wait_leaves_no_lock_and_loses_nothing() {
    let home = Home::new();
    let (id, trigger) = armed_job(&home);
    let stop = event("claude-code", "Stop", &home.session).to_string();
    let mut first = spawn_hook(&home, REWAKE, stop.as_bytes());
    eventually(Duration::from_secs(10), || waiter_present(&home));
    // SIGKILL, by pid: the shell's child is the hook itself (`sh -c` execs it).
    first.kill().unwrap();
    first.wait().unwrap();
    // Its lock went with it: a new waiter waits (it does not exit at once) and gets it.
    let second = spawn_hook(&home, REWAKE, stop.as_bytes());
    let began = Instant::now();
    std::thread::sleep(Duration::from_millis(300)); // a second waiter exits in ~50 ms
    std::fs::write(&trigger, "").unwrap();
    let second = finish_within(second, Duration::from_secs(10));
    assert!(began.elapsed() >= Duration::from_millis(300));
    assert_eq!(second.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&second.stderr).contains(&format!("{id} FAILED")));
}

#[test]
fn issue15_7_a_rewake_hook_killed_while_its_stderr_is_unread_loses_nothing() {
    let home = Home::new();
    let id = pending_notice(&home);
    let stop = event("claude-code", "Stop", &home.session).to_string();
    let mut waiter = spawn_hook(&home, REWAKE, stop.as_bytes());
    // The hook wrote its notice; its reader took one byte only, so the hook waits for
    // the rest to be taken before it acknowledges. Killed now (Escape), it has not.
    let mut stderr = waiter.stderr.take().unwrap();
    let mut first = [0u8; 1];
    stderr.read_exact(&mut first).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        waiter.try_wait().unwrap().is_none(),
        "the hook waits for its reader"
    );
    waiter.kill().unwrap();
    waiter.wait().unwrap();
    let later = home.json(&["notices"]);
    let items: Vec<&str> = later["notices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["item"].as_str().unwrap())
        .collect();
    assert_eq!(items, [id.as_str()], "{later}");
}

#[test]
fn issue15_7_rewake_takes_the_hook_event_whatever_comes_on_stdin() {
    let home = Home::new();
    pending_notice(&home);
    // Not JSON, a JSON array, a huge event, an empty stdin: no wait, no delivery.
    let huge = format!(
        "{{\"session_id\": \"{}\", \"hook_event_name\": \"Stop\", \"last_assistant_message\": \"{}\"}}",
        home.session,
        "x".repeat(20 << 20)
    );
    for input in [
        b"not json at all".to_vec(),
        b"[1, 2]".to_vec(),
        huge.into_bytes(),
        Vec::new(),
    ] {
        let output = finish_within(spawn_hook(&home, REWAKE, &input), Duration::from_secs(20));
        assert_eq!(output.status.code(), Some(0));
    }
    assert_eq!(
        home.json(&["notices", "--peek"])["notices"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn issue15_7_rewake_with_its_daemon_down_exits_0_with_a_reason() {
    let home = Home::new().with("BGWORK_ANSWER_TIMEOUT_MS", "500");
    home.start("sleep 1000");
    let daemon = home.daemon_pid();
    let signal = |which: &str| {
        let status = Command::new("kill")
            .args([which, &daemon.to_string()])
            .status();
        assert!(status.unwrap().success());
    };
    signal("-STOP");
    let output = hook(&home, REWAKE, &event("claude-code", "Stop", &home.session));
    signal("-CONT");
    assert_eq!(output.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("bgwork hook --rewake"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `claude -p` waits for its background hooks before it exits: under a stopped daemon
/// the rewake hook gives up within the context hooks' deadline, not the client's whole
/// patience (30 s by default: `claude -p` took 37 s to end).
#[test]
fn issue25_5_rewake_under_a_stopped_daemon_ends_within_the_hook_deadline() {
    let home = Home::new();
    home.start_with(&["--notify"], "sleep 1000");
    let daemon = home.daemon_pid();
    let status = Command::new("kill")
        .args(["-STOP", &daemon.to_string()])
        .status();
    assert!(status.unwrap().success());
    // Resumed however the test ends, so that the home's daemon can be shut down.
    struct Resume(i32);
    impl Drop for Resume {
        fn drop(&mut self) {
            let _ = Command::new("kill")
                .args(["-CONT", &self.0.to_string()])
                .status();
        }
    }
    let resume = Resume(daemon);
    let started = Instant::now();
    let output = hook(&home, REWAKE, &event("claude-code", "Stop", &home.session));
    let took = started.elapsed();
    drop(resume);
    assert_eq!(output.status.code(), Some(0));
    assert!(
        took < Duration::from_secs(5),
        "the rewake hook took {took:?}"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no answer within 1.25 s"), "{stderr}");
    assert!(
        stderr.contains(&format!("`kill -CONT {daemon}`")),
        "names what to do: {stderr}"
    );
}

/// The time from a job's last instruction to the rewake hook's exit, a few times;
/// the figure of issue 15 item 7 (target ≤ 50 ms) is measured by the bench
/// (`exit to rewake`); this checks a generous bound on a loaded test machine.
#[test]
fn issue15_7_rewake_exits_soon_after_the_job_ends() {
    let home = Home::new();
    let stop = event("claude-code", "Stop", &home.session).to_string();
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let (_, trigger) = armed_job(&home);
        let waiter = spawn_hook(&home, REWAKE, stop.as_bytes());
        eventually(Duration::from_secs(10), || waiter_present(&home));
        let ended = Instant::now();
        std::fs::write(&trigger, "").unwrap();
        let output = finish_within(waiter, Duration::from_secs(10));
        assert_eq!(output.status.code(), Some(2));
        best = best.min(ended.elapsed());
    }
    assert!(best < Duration::from_secs(1), "{best:?}");
}

// ------------------------------------------------------------------ Codex and Gemini

#[test]
fn issue15_6_the_codex_hook_answers_its_events_as_codex_expects() {
    let mut home = Home::new();
    let session = "019a7c1e-codex-thread";
    home.session = session.to_string();
    let id = pending_notice(&home);
    let output = hook(
        &home,
        "bgwork hook codex",
        &event("codex", "UserPromptSubmit", session),
    );
    assert!(output.status.success());
    let reply = stdout_json(&output);
    assert_eq!(
        reply["hookSpecificOutput"]["hookEventName"],
        "UserPromptSubmit"
    );
    let context = reply["hookSpecificOutput"]["additionalContext"]
        .as_str()
        .unwrap();
    assert!(
        context.contains(&format!("{id} FAILED (exit 3)")),
        "{context}"
    );
    // Codex's output schemas allow no other keys.
    assert_eq!(reply.as_object().unwrap().len(), 1, "{reply}");
    assert_eq!(
        reply["hookSpecificOutput"].as_object().unwrap().len(),
        2,
        "{reply}"
    );
    // Nothing left: nothing printed.
    let output = hook(
        &home,
        "bgwork hook codex",
        &event("codex", "PostToolUse", session),
    );
    assert!(output.stdout.is_empty());
    // SessionStart with nothing pending: nothing (Codex validates this event's output
    // strictly; no key it may not know).
    let output = hook(
        &home,
        "bgwork hook codex",
        &event("codex", "SessionStart", session),
    );
    assert!(output.stdout.is_empty());
    // Stop, asked to wait for armed work.
    let (armed, trigger) = armed_job(&home);
    let output = hook(
        &home,
        "bgwork hook codex --wait-on-stop",
        &event("codex", "Stop", session),
    );
    let reply = stdout_json(&output);
    assert_eq!(reply["decision"], "block");
    assert!(reply["reason"].as_str().unwrap().contains(&armed));
    std::fs::write(trigger, "").unwrap();
}

#[test]
fn issue15_6_the_gemini_hook_answers_its_events_as_gemini_expects() {
    let mut home = Home::new();
    let session = "5f2b9c-gemini-session";
    home.session = session.to_string();
    for name in ["BeforeAgent", "AfterTool", "SessionStart"] {
        let id = pending_notice(&home);
        let output = hook(&home, "bgwork hook gemini", &event("gemini", name, session));
        assert!(output.status.success());
        let reply = stdout_json(&output);
        assert_eq!(reply["hookSpecificOutput"]["hookEventName"], name);
        let context = reply["hookSpecificOutput"]["additionalContext"]
            .as_str()
            .unwrap();
        assert!(
            context.contains(&format!("{id} FAILED (exit 3)")),
            "{name}: {context}"
        );
        assert!(context.contains("| tail-line"), "{context}");
    }
    // Nothing to say: still exactly one JSON object on stdout.
    let output = hook(
        &home,
        "bgwork hook gemini",
        &event("gemini", "BeforeAgent", session),
    );
    assert_eq!(stdout_json(&output), json!({}));
    // A hook event that is not JSON: the same.
    let output = finish_within(
        spawn_hook(&home, "bgwork hook gemini", b"\xff\xfe not json"),
        Duration::from_secs(10),
    );
    assert_eq!(stdout_json(&output), json!({}));
    // AfterAgent, asked to wait for armed work: the answer is rejected with the reason.
    let (armed, trigger) = armed_job(&home);
    let reply = stdout_json(&hook(
        &home,
        "bgwork hook gemini --wait-on-stop",
        &event("gemini", "AfterAgent", session),
    ));
    assert_eq!(reply["decision"], "deny");
    assert!(reply["reason"].as_str().unwrap().contains(&armed));
    std::fs::write(trigger, "").unwrap();
}

// ------------------------------------------------------------------ docs/harnesses.md

/// The JSON snippet of docs/harnesses.md marked `<!-- tested: HARNESS -->`.
fn snippet(harness: &str) -> Value {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/harnesses.md"))
            .unwrap();
    let marker = format!("<!-- tested: {harness} -->");
    let after = &doc[doc.find(&marker).unwrap_or_else(|| panic!("no {marker}")) + marker.len()..];
    let body = after
        .split("```json")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{harness} snippet: {e}"))
}

/// Every (event, command, handler) the snippet configures.
fn configured(snippet: &Value) -> Vec<(String, String, Value)> {
    let mut all = Vec::new();
    for (event, groups) in snippet["hooks"].as_object().unwrap() {
        for group in groups.as_array().unwrap() {
            for handler in group["hooks"].as_array().unwrap() {
                assert_eq!(handler["type"], "command");
                let command = handler["command"].as_str().unwrap().to_string();
                all.push((event.clone(), command, handler.clone()));
            }
        }
    }
    all
}

#[test]
fn issue15_6_the_snippets_of_docs_harnesses_md_work_against_recorded_events() {
    for harness in ["claude-code", "codex", "gemini"] {
        let mut home = Home::new();
        home.session = format!("{harness}-doc-session");
        let hooks = configured(&snippet(harness));
        assert!(hooks.len() >= 3, "{harness}: {hooks:?}");
        for (name, command, handler) in hooks {
            let id = pending_notice(&home);
            let output = hook(&home, &command, &event(harness, &name, &home.session));
            let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
            if handler["asyncRewake"] == true {
                assert_eq!(output.status.code(), Some(2), "{harness} {name}: {stderr}");
                assert!(stderr.contains(&id), "{harness} {name}: {stderr}");
                continue;
            }
            assert!(output.status.success(), "{harness} {name}: {stderr}");
            let reply = stdout_json(&output);
            let context = reply["hookSpecificOutput"]["additionalContext"]
                .as_str()
                .unwrap_or_else(|| panic!("{harness} {name}: {reply}"));
            assert!(context.contains(&id), "{harness} {name}: {context}");
        }
    }
}

// ------------------------------------------------------------------ notices per turn

/// 25 jobs armed with `--notify` that end at once; returns their ids, oldest first.
fn twenty_five_ends(home: &Home) -> Vec<String> {
    let trigger = home.path().join("all-at-once");
    let command = format!(
        "while [ ! -e '{}' ]; do sleep 0.01; done; exit 1",
        trigger.display()
    );
    let ids: Vec<String> = (0..25)
        .map(|_| home.start_with(&["--notify"], &command))
        .collect();
    std::fs::write(&trigger, "").unwrap();
    eventually(Duration::from_secs(30), || {
        home.json(&["notices", "--peek"])["notices"]
            .as_array()
            .unwrap()
            .len()
            == 25
    });
    ids
}

fn noticed_items(context: &str) -> Vec<String> {
    context
        .lines()
        .filter_map(|line| line.strip_prefix("- "))
        .map(|line| line.split(' ').next().unwrap().to_string())
        .collect()
}

#[test]
fn issue15_8_a_turn_boundary_delivers_ten_notices_and_names_the_rest() {
    let home = Home::new().with("BGWORK_MAX_RUNNING", "40");
    let ids = twenty_five_ends(&home);
    let prompt = event("claude-code", "UserPromptSubmit", &home.session);
    let mut delivered = Vec::new();
    for (n, more) in [(10, Some(15)), (10, Some(5)), (5, None)] {
        let reply = stdout_json(&hook(&home, "bgwork hook claude-code", &prompt));
        let context = reply["hookSpecificOutput"]["additionalContext"]
            .as_str()
            .unwrap();
        let items = noticed_items(context);
        assert_eq!(items.len(), n, "{context}");
        match more {
            Some(more) => assert!(
                context
                    .trim_end()
                    .ends_with(&format!("{more} more pending: `bgwork notices`")),
                "{context}"
            ),
            None => assert!(!context.contains("more pending"), "{context}"),
        }
        assert!(
            context.contains("not a request to start more work"),
            "{context}"
        );
        delivered.extend(items);
    }
    // Each once (they ended at once, in any order).
    let mut ids = ids;
    ids.sort();
    delivered.sort();
    assert_eq!(delivered, ids, "each once");
    assert!(hook(&home, "bgwork hook claude-code", &prompt)
        .stdout
        .is_empty());
}

#[test]
fn issue15_8_the_bound_is_set_by_bgwork_max_notices_per_turn() {
    let home = Home::new()
        .with("BGWORK_MAX_RUNNING", "40")
        .with("BGWORK_MAX_NOTICES_PER_TURN", "0");
    twenty_five_ends(&home);
    let prompt = event("gemini", "BeforeAgent", &home.session);
    let reply = stdout_json(&hook(&home, "bgwork hook gemini", &prompt));
    let context = reply["hookSpecificOutput"]["additionalContext"]
        .as_str()
        .unwrap();
    assert_eq!(noticed_items(context).len(), 25, "0 lifts the bound");
    assert!(!context.contains("more pending"));
}

#[test]
fn issue15_8_mcp_results_carry_ten_notices_and_name_the_rest() {
    let home = Home::new().with("BGWORK_MAX_RUNNING", "40");
    let ids = twenty_five_ends(&home);
    let mut mcp = Mcp::start(&home);
    let mut delivered: Vec<String> = Vec::new();
    for (tool, n, more) in [
        ("list", 10, Some(15)),
        ("notices", 10, Some(5)),
        ("list", 5, None),
    ] {
        let (_, result) = mcp.call(tool, json!({}));
        let notices = result["notices"].as_array().unwrap();
        assert_eq!(notices.len(), n, "{tool}: {result}");
        let note = result["notices_note"].as_str().unwrap();
        assert!(note.contains("not a request to start more work"), "{note}");
        match more {
            Some(more) => assert!(
                note.ends_with(&format!("{more} more pending: `bgwork notices`")),
                "{note}"
            ),
            None => assert!(!note.contains("more pending"), "{note}"),
        }
        delivered.extend(
            notices
                .iter()
                .map(|n| n["item"].as_str().unwrap().to_string()),
        );
    }
    // Each once (they ended at once, in any order).
    let mut ids = ids;
    ids.sort();
    delivered.sort();
    assert_eq!(delivered, ids, "each once");
    let (_, result) = mcp.call("list", json!({}));
    assert_eq!(result["notices"], json!([]));
    assert!(result.get("notices_note").is_none(), "{result}");
}

#[test]
fn issue15_8_ten_long_tails_fit_the_harness_cap_on_context_with_their_newest_lines() {
    let home = Home::new().with("BGWORK_MAX_RUNNING", "20");
    let trigger = home.path().join("go");
    let command = format!(
        "while [ ! -e '{}' ]; do sleep 0.01; done; \
         for i in $(seq 100); do echo \"line $i of a long tail, padded to be long enough\"; done",
        trigger.display()
    );
    for _ in 0..10 {
        home.start_with(&["--notify"], &command);
    }
    std::fs::write(&trigger, "").unwrap();
    eventually(Duration::from_secs(30), || {
        home.json(&["notices", "--peek"])["notices"]
            .as_array()
            .unwrap()
            .len()
            == 10
    });
    let prompt = event("claude-code", "UserPromptSubmit", &home.session);
    let reply = stdout_json(&hook(&home, "bgwork hook claude-code", &prompt));
    let context = reply["hookSpecificOutput"]["additionalContext"]
        .as_str()
        .unwrap();
    // Claude Code replaces context over 10,000 characters by a file and a preview.
    assert!(
        context.chars().count() <= 10_000,
        "{}",
        context.chars().count()
    );
    assert_eq!(noticed_items(context).len(), 10, "{context}");
    assert_eq!(
        context.matches("| line 100 of a long tail").count(),
        10,
        "{context}"
    );
    assert!(context.contains("last lines shortened"), "{context}");
}

/// Exit 2 from a hook blocks (or, from a rewake hook, wakes the model with stderr): a
/// hook's bad command line must not exit 2, or every turn would end in the error.
#[test]
fn issue15_7_a_hook_with_a_bad_command_line_exits_1_not_2() {
    let home = Home::new();
    let stop = event("claude-code", "Stop", &home.session);
    for command in [
        "bgwork hook claude-code --rewake --max-wait -5",
        "bgwork hook claude-code --rewake --max-wait=-5",
        "bgwork hook claude-code --rewake --wait-on-stop",
        "bgwork hook claude-code --rewak",
        "bgwork --session s hook gemini --bogus",
    ] {
        let output = hook(&home, command, &stop);
        assert_eq!(output.status.code(), Some(1), "{command}");
        assert!(!output.stderr.is_empty(), "{command}");
    }
}

/// The context hooks, too, deliver a notice only once they printed it: a hook whose
/// stdout is gone (a harness that went away) leaves it pending.
#[test]
fn issue15_7_a_context_hook_that_could_not_print_leaves_its_notices_pending() {
    let home = Home::new();
    let id = pending_notice(&home);
    for command in [
        "bgwork hook claude-code",
        "bgwork hook codex",
        "bgwork hook gemini",
    ] {
        let prompt = match command {
            "bgwork hook gemini" => event("gemini", "BeforeAgent", &home.session),
            "bgwork hook codex" => event("codex", "UserPromptSubmit", &home.session),
            _ => event("claude-code", "UserPromptSubmit", &home.session),
        };
        let mut child = home
            .command(&[])
            .env_remove("BGWORK_SESSION")
            .spawn_shell(&command.replacen("bgwork", BIN, 1));
        drop(child.stdout.take()); // nobody reads what it prints
        let mut input = child.stdin.take().unwrap();
        input.write_all(prompt.to_string().as_bytes()).unwrap();
        drop(input);
        let status = finish_within(child, Duration::from_secs(10)).status;
        assert!(status.success(), "{command}");
        let pending = home.json(&["notices", "--peek"]);
        assert_eq!(
            pending["notices"][0]["item"],
            id.as_str(),
            "{command}: {pending}"
        );
    }
    // Printed, it is delivered once.
    let prompt = event("claude-code", "UserPromptSubmit", &home.session);
    let said = stdout_json(&hook(&home, "bgwork hook claude-code", &prompt));
    assert!(said["hookSpecificOutput"]["additionalContext"]
        .as_str()
        .unwrap()
        .contains(&id));
    assert!(hook(&home, "bgwork hook claude-code", &prompt)
        .stdout
        .is_empty());
}

#[test]
fn issue15_7_of_eight_rewake_hooks_started_at_once_one_waits_and_gets_the_notice() {
    let home = Home::new();
    let (id, trigger) = armed_job(&home);
    let stop = event("claude-code", "Stop", &home.session).to_string();
    let hooks: Vec<Child> = (0..8)
        .map(|_| spawn_hook(&home, REWAKE, stop.as_bytes()))
        .collect();
    let pids: Vec<u32> = hooks.iter().map(Child::id).collect();
    let (sender, receiver) = std::sync::mpsc::channel();
    for child in hooks {
        let sender = sender.clone();
        std::thread::spawn(move || {
            let _ = sender.send(child.wait_with_output().unwrap());
        });
    }
    let kill_all = || {
        for pid in &pids {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    };
    let mut outputs = Vec::new();
    for _ in 0..7 {
        match receiver.recv_timeout(Duration::from_secs(20)) {
            Ok(output) => outputs.push(output),
            Err(_) => {
                kill_all();
                panic!("more than one waiter");
            }
        }
    }
    // A failed assertion ends every hook first: a waiter left would wait for hours.
    let one_waits = outputs
        .iter()
        .all(|o| o.status.code() == Some(0) && o.stderr.is_empty())
        && waiter_present(&home);
    if !one_waits {
        kill_all();
        panic!("the seven others did not exit 0 in silence");
    }
    std::fs::write(&trigger, "").unwrap();
    let Ok(last) = receiver.recv_timeout(Duration::from_secs(20)) else {
        kill_all();
        panic!("the waiter never ended");
    };
    assert_eq!(last.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&last.stderr).contains(&id));
}

// Issue 22 item 11: one harness session for its hooks and its MCP server.

/// An MCP server started by this test process, which stands in for the harness (as
/// the hooks above are), with no session given: it finds its harness's session.
fn mcp_of_this_harness(home: &Home) -> Mcp {
    let mut command = home.command(&["mcp"]);
    command.env_remove("BGWORK_SESSION");
    Mcp::start_as(command, "claude-code")
}

/// An MCP server of another harness process in the same folder: a `perl` that runs
/// `bgwork mcp` as its child and waits for it (perl is no shell, so it is the harness).
fn mcp_of_another_harness(home: &Home) -> Mcp {
    let template = home.command(&[]);
    let mut command = Command::new("perl");
    command.args(["-e", "exit(system(@ARGV) >> 8)", BIN, "mcp"]);
    for (key, value) in template.get_envs() {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    command.env_remove("BGWORK_SESSION");
    Mcp::start_as(command, "claude-code")
}

fn context_of(output: &Output) -> String {
    stdout_json(output)["hookSpecificOutput"]["additionalContext"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn issue22_11_work_started_through_mcp_is_delivered_by_the_hooks_of_its_harness() {
    let home = Home::new();
    let started = hook(
        &home,
        "bgwork hook claude-code",
        &event("claude-code", "SessionStart", &home.session),
    );
    assert!(started.status.success());
    let mut mcp = mcp_of_this_harness(&home);
    let (error, job) = mcp.call(
        "start",
        json!({"command": "sleep 0.5; echo from-mcp; exit 4", "notify": true, "window_ms": 0}),
    );
    assert!(!error, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    // The shell tool's own `bgwork` calls (the hook's session) see it.
    let listed = home.json(&["list", "--all"]);
    assert!(
        listed["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|item| item["id"] == id.as_str()
                && item["command"].as_str().unwrap().contains("from-mcp")),
        "{listed}"
    );
    eventually(Duration::from_secs(10), || {
        home.item(&id)["state"] == "ended"
    });
    let said = hook(
        &home,
        "bgwork hook claude-code",
        &event("claude-code", "PostToolUse", &home.session),
    );
    let context = context_of(&said);
    assert!(
        context.contains(&format!("{id} FAILED (exit 4)")),
        "{context}"
    );
    assert!(context.contains("| from-mcp"), "{context}");
    // Delivered once: the next MCP result does not carry it again.
    let (_, list) = mcp.call("list", json!({}));
    assert_eq!(list["notices"], json!([]), "{list}");
}

#[test]
fn issue22_11_rewake_wakes_the_agent_for_work_started_through_mcp() {
    let home = Home::new();
    hook(
        &home,
        "bgwork hook claude-code",
        &event("claude-code", "UserPromptSubmit", &home.session),
    );
    let trigger = home.path().join("trigger");
    let mut mcp = mcp_of_this_harness(&home);
    let command = format!(
        "while [ ! -e '{}' ]; do sleep 0.01; done; echo woke; exit 6",
        trigger.display()
    );
    let (error, job) = mcp.call(
        "start",
        json!({"command": command, "notify": true, "window_ms": 0}),
    );
    assert!(!error, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    let stop = event("claude-code", "Stop", &home.session);
    let waiter = spawn_hook(&home, REWAKE, stop.to_string().as_bytes());
    eventually(Duration::from_secs(10), || waiter_present(&home));
    std::fs::write(&trigger, "").unwrap();
    let output = finish_within(waiter, Duration::from_secs(15));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("{id} FAILED (exit 6)")),
        "{stderr}"
    );
}

#[test]
fn issue22_11_another_harness_in_the_same_folder_never_shares_the_session() {
    let home = Home::new();
    hook(
        &home,
        "bgwork hook claude-code",
        &event("claude-code", "SessionStart", &home.session),
    );
    let ours = home.start("sleep 101");
    let mut other = mcp_of_another_harness(&home);
    let (_, theirs) = other.call("list", json!({"all": true}));
    assert_eq!(theirs["items"], json!([]), "{theirs} (ours: {ours})");
    let (error, job) = other.call(
        "start",
        json!({"command": "sleep 0.2; exit 7", "notify": true, "window_ms": 0}),
    );
    assert!(!error, "{job}");
    let listed = home.json(&["list", "--all"]);
    let commands: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["command"].as_str().unwrap())
        .collect();
    assert_eq!(commands, ["sleep 101"], "{listed}");
    // Its end is its own harness's notice, not ours.
    let sessions = home.json(&["list", "--all", "--all-sessions"]);
    eventually(Duration::from_secs(10), || {
        home.json(&["list", "--all", "--all-sessions"])["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|item| item["command"] == "sleep 0.2; exit 7" && item["state"] == "ended")
    });
    let said = hook(
        &home,
        "bgwork hook claude-code",
        &event("claude-code", "PostToolUse", &home.session),
    );
    assert!(
        said.stdout.is_empty(),
        "{sessions}: {}",
        String::from_utf8_lossy(&said.stdout)
    );
    let (_, theirs) = other.call("notices", json!({}));
    assert_eq!(theirs["notices"][0]["exit_code"], 7, "{theirs}");
}

#[test]
fn issue22_11_rewake_waits_for_the_quiet_notice_of_a_job_not_armed() {
    let home = Home::new();
    let id = home.start_with(&["--quiet-after", "1s"], "sleep 30");
    let stop = event("claude-code", "Stop", &home.session);
    let output = finish_within(
        spawn_hook(&home, REWAKE, stop.to_string().as_bytes()),
        Duration::from_secs(20),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&id), "{stderr}");
    home.run(&["stop", &id]);
}

#[test]
fn issue26_r1_the_stop_hook_says_a_waiting_item_waits() {
    let home = Home::new();
    let (first, trigger) = armed_job(&home);
    let waiting = home.json(&[
        "start", "--window", "0", "--notify", "--after", &first, "--", "echo b",
    ]);
    let waiting = waiting["id"].as_str().unwrap().to_string();
    let output = hook(
        &home,
        "bgwork hook codex --wait-on-stop",
        &event("codex", "Stop", &home.session),
    );
    let reply = stdout_json(&output);
    assert_eq!(reply["decision"], "block");
    let reason = reply["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!(
            "{waiting} (echo b; waiting for {first} to succeed)"
        )),
        "{reason}"
    );
    assert!(!reason.contains("still running"), "{reason}");
    std::fs::write(trigger, "").unwrap();
}

//! Issue 26, round five: what a hostile tester found in expectations, notices, the
//! rewake hook, help texts, secrets in command lines and the strip's counts.

use crate::mcp::Mcp;
use crate::util::{eventually, finish_within, hook_within, Home, BIN};
use serde_json::{json, Value};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A folder whose file `F` says how long `sleep $(cat F)` sleeps.
struct Folder(tempfile::TempDir);

const SLEEP: &str = "sleep $(cat F)";

impl Folder {
    fn new() -> Folder {
        Folder(tempfile::tempdir().unwrap())
    }
    fn dir(&self) -> String {
        self.0.path().display().to_string()
    }
    fn set(&self, seconds: &str) {
        std::fs::write(self.0.path().join("F"), seconds).unwrap();
    }
}

/// A history of three quick runs of [`SLEEP`] (`seconds` each) in `folder`.
fn fake_history(home: &Home, folder: &Folder, seconds: &str) {
    folder.set(seconds);
    for _ in 0..3 {
        let reply = home.json(&["run", "--cwd", &folder.dir(), "--", SLEEP]);
        assert_eq!(reply["outcome"], "ended", "{reply}");
    }
}

/// A home that tells running-long work soon (margin 0.3 s), and a folder where
/// [`SLEEP`] has a history of three runs of `seconds`.
fn home_with_history(seconds: &str) -> (Home, Folder) {
    let home = Home::new().with("BGWORK_OVERRUN_MARGIN_S", "0.3");
    let folder = Folder::new();
    fake_history(&home, &folder, seconds);
    (home, folder)
}

/// Runs the rewake hook of the home's session (at most `max_wait` s) and returns how it
/// ended, with how long it took.
fn rewake(home: &Home, max_wait: &str) -> (Output, Duration) {
    let began = Instant::now();
    let command = home.command(&["hook", "claude-code", "--rewake", "--max-wait", max_wait]);
    let event = json!({"session_id": home.session, "hook_event_name": "Stop"});
    let output = hook_within(command, &event, Duration::from_secs(60));
    (output, began.elapsed())
}

/// Runs the rewake hook (at most 30 s), which must end with exit code 2 (a notice
/// handed to the agent); returns what it wrote to stderr.
fn rewake_woken(home: &Home) -> String {
    let (output, took) = rewake(home, "30");
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "after {took:?}: {text}");
    text
}

/// Starts [`SLEEP`] in `folder` (window 0) and returns its id.
fn start_sleep(home: &Home, folder: &Folder) -> String {
    home.start_reply(&["--cwd", &folder.dir()], SLEEP)["id"]
        .as_str()
        .unwrap()
        .to_string()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The numbers (seconds) in `text` written as `N s` or `N.N s`, in order.
fn seconds_in(text: &str) -> Vec<f64> {
    let words: Vec<&str> = text.split([' ', '(', ')', ',']).collect();
    words
        .windows(2)
        .filter(|w| w[1] == "s" || w[1].starts_with("s;") || w[1].starts_with("s:"))
        .filter_map(|w| w[0].parse::<f64>().ok())
        .collect()
}

#[test]
fn issue26_q2_rewake_waits_for_a_restart_policy_a_waiting_item_and_a_job_that_runs_long() {
    let home = Home::new().with("BGWORK_OVERRUN_MARGIN_S", "0.3");
    // A restart policy that gives up: its one notice comes unarmed.
    home.start_reply(
        &[
            "--restart",
            "on-failure",
            "--max-restarts",
            "2",
            "--backoff",
            "1s",
        ],
        "sleep 0.5; exit 1",
    );
    let text = rewake_woken(&home);
    assert!(text.contains("gave up after 2 of 2 restarts"), "{text}");

    // A waiting item whose awaited job fails: its cancel notice comes unarmed.
    let awaited = home.start("sleep 1; exit 3");
    home.json(&["start", "--after", &awaited, "--", "true"]);
    let text = rewake_woken(&home);
    assert!(text.contains("was cancelled"), "{text}");

    // A job with a usual time that runs long: its running-long notice comes unarmed.
    let folder = Folder::new();
    fake_history(&home, &folder, "0.2");
    folder.set("30");
    let id = start_sleep(&home, &folder);
    let text = rewake_woken(&home);
    assert!(text.contains("may be stuck"), "{text}");
    home.json(&["stop", &id]);
    home.wait_end(&id);

    // Nothing of these left: the hook still ends at once, in silence.
    let (output, took) = rewake(&home, "30");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn issue26_q3_a_running_long_notice_is_withdrawn_once_the_end_is_recorded() {
    let (home, folder) = home_with_history("0.2");
    // Over 3× its usual time in the foreground, then it ends there: the end was shown.
    folder.set("2");
    let reply = home.json(&["run", "--cwd", &folder.dir(), "--", SLEEP]);
    assert_eq!(reply["outcome"], "ended", "{reply}");
    let notices = home.json(&["notices"]);
    assert_eq!(notices["notices"], json!([]), "{notices}");
    // The same over MCP: a `run` result that says it finished carries no "may be stuck".
    let mut mcp = Mcp::start(&home);
    let (error, result) = mcp.call(
        "run",
        json!({"command": SLEEP, "cwd": folder.dir(), "timeout": 30}),
    );
    assert!(!error, "{result}");
    assert!(!result.to_string().contains("may be stuck"), "{result}");
    let (_, listed) = mcp.call("list", json!({}));
    assert!(!listed.to_string().contains("may be stuck"), "{listed}");
}

#[test]
fn issue26_q4_news_of_running_work_is_not_worded_as_an_end() {
    let (home, folder) = home_with_history("0.2");
    folder.set("30");
    let id = start_sleep(&home, &folder);
    // The MCP result that carries the running-long notice.
    let mut mcp = Mcp::start(&home);
    let mut carried = Value::Null;
    eventually(Duration::from_secs(20), || {
        let (_, result) = mcp.call("list", json!({}));
        let found = result["notices"].as_array().is_some_and(|n| !n.is_empty());
        if found {
            carried = result;
        }
        found
    });
    assert!(carried.to_string().contains("may be stuck"), "{carried}");
    let note = carried["notices_note"].as_str().unwrap();
    assert!(!note.contains("report of work that ended,"), "{note}");
    assert!(note.contains("still runs"), "{note}");
    drop(mcp);
    // The hooks: another running-long notice, read at a turn boundary.
    home.json(&["stop", &id]);
    home.wait_end(&id);
    let id = start_sleep(&home, &folder);
    // (`hook gemini` and `hook codex` word their context with the same function.)
    let text = rewake_woken(&home);
    assert!(text.contains("may be stuck"), "{text}");
    assert!(!text.contains("background work ended since"), "{text}");
    assert!(text.contains("still runs"), "{text}");
    home.json(&["stop", &id]);
}

#[test]
fn issue26_q12_durations_are_shown_one_way_and_agree_with_their_words() {
    let (home, folder) = home_with_history("0.55");
    folder.set("30");
    let reply = home.json(&[
        "run",
        "--timeout",
        "auto",
        "--cwd",
        &folder.dir(),
        "--",
        SLEEP,
    ]);
    assert_eq!(reply["outcome"], "promoted", "{reply}");
    let id = reply["id"].as_str().unwrap().to_string();
    let choice = reply["timeout_choice"].as_str().unwrap();
    let figures = seconds_in(choice);
    // "usually U s here (…), not over the 15 s worth backgrounding: … 3× that (D s)"
    assert_eq!(figures.len(), 3, "{choice}: {figures:?}");
    let (usual, deadline) = (figures[0], figures[2]);
    assert!(
        (usual * 3.0 - deadline).abs() < 1e-9,
        "3 × {usual} is not {deadline}: {choice}"
    );
    let message = reply["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("still runs after {deadline:.1} s")),
        "{message} (deadline {deadline})"
    );
    // The running-long notice: what it ran is past 3× the usual it shows.
    let mut text = String::new();
    eventually(Duration::from_secs(20), || {
        let notices = home.json(&["notices"]);
        text = notices.to_string();
        text.contains("may be stuck")
    });
    let notice = text
        .split('"')
        .find(|t| t.contains("may be stuck"))
        .unwrap()
        .to_string();
    let figures = seconds_in(&notice);
    assert!(figures.len() >= 2, "{notice}");
    assert!(
        figures[0] >= 3.0 * figures[1] - 1e-9,
        "{} is not over 3 × {}: {notice}",
        figures[0],
        figures[1]
    );
    home.json(&["stop", &id]);
}

#[test]
fn issue26_q13_a_promoted_run_says_what_history_expects_as_list_does() {
    let home = Home::new();
    let folder = Folder::new();
    fake_history(&home, &folder, "0.2");
    folder.set("30");
    let reply = home.json(&["run", "--timeout", "1", "--cwd", &folder.dir(), "--", SLEEP]);
    assert_eq!(reply["outcome"], "promoted", "{reply}");
    let id = reply["id"].as_str().unwrap().to_string();
    let listed = home.item(&id);
    assert!(listed["expected"].is_string(), "{listed}");
    assert_eq!(reply["expected"], listed["expected"], "{reply}");
    assert_eq!(reply["usual_ms"], listed["usual_ms"], "{reply}");
    // And over MCP.
    let mut mcp = Mcp::start(&home);
    let (error, result) = mcp.call(
        "run",
        json!({"command": SLEEP, "cwd": folder.dir(), "timeout": 1}),
    );
    assert!(!error, "{result}");
    assert_eq!(result["outcome"], "promoted", "{result}");
    assert!(
        result["expected"]
            .as_str()
            .is_some_and(|e| e.starts_with("usually")),
        "{result}"
    );
    assert!(result["usual_ms"].is_u64(), "{result}");
    home.json(&["stop", &id]);
    home.json(&["stop", result["id"].as_str().unwrap()]);
}

/// Each subcommand, nested ones too, with the line the parent's help gives it.
fn subcommands(path: &[&str]) -> Vec<(Vec<String>, String)> {
    let output = Command::new(BIN).args(path).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&output.stdout).into_owned();
    let mut found = Vec::new();
    let mut inside = false;
    for line in help.lines() {
        if line == "Commands:" {
            inside = true;
            continue;
        }
        if inside && line.trim().is_empty() {
            break;
        }
        if !inside {
            continue;
        }
        let line = line.trim_start();
        let (name, about) = line.split_once(' ').unwrap_or((line, ""));
        if name == "help" {
            continue;
        }
        let mut full: Vec<String> = path.iter().map(|s| s.to_string()).collect();
        full.push(name.to_string());
        found.push((full.clone(), about.trim().to_string()));
        let nested: Vec<&str> = full.iter().map(String::as_str).collect();
        found.extend(subcommands(&nested));
    }
    found
}

/// The first line a command wrote to stdout (empty when it wrote nothing).
fn first_line(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn issue26_q14_every_subcommand_s_first_help_line_is_its_own() {
    let all = subcommands(&[]);
    assert!(all.len() > 20, "{all:?}");
    for (path, about) in &all {
        let help = Command::new(BIN).args(path).arg("--help").output().unwrap();
        let first = first_line(&help);
        assert_eq!(&first, about, "`bgwork {} --help`", path.join(" "));
        // `help start` says the same.
        let mut asked = vec!["help".to_string()];
        asked.extend(path.iter().cloned());
        let help = Command::new(BIN).args(&asked).output().unwrap();
        let first_help = first_line(&help);
        assert_eq!(&first_help, about, "`bgwork {}`", asked.join(" "));
    }
    for (words, wrong) in [
        ("start", "restart policy"),
        ("run", "What every command that starts work takes"),
    ] {
        let help = Command::new(BIN).args([words, "--help"]).output().unwrap();
        let text = String::from_utf8_lossy(&help.stdout).into_owned();
        assert!(
            !text.lines().next().unwrap_or_default().contains(wrong),
            "{text}"
        );
    }
}

#[test]
fn issue26_q15_each_line_of_a_multi_line_secret_is_refused_in_a_command_line() {
    let home = Home::new();
    let folder = Folder::new();
    let run = home
        .command(&[
            "--json",
            "run",
            "--cwd",
            &folder.dir(),
            "--secret",
            "ML",
            "--",
            "echo line2defghij >/dev/null",
        ])
        .env("ML", "line1abcdefg\nline2defghij")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    assert_ne!(run.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("holds the value of secret ML"), "{stdout}");
    // Nothing was recorded: no list, no history holds the line.
    let listed = home.json(&["list", "--all"]);
    assert!(!listed.to_string().contains("line2defghij"), "{listed}");
    let history = home.json(&["history", "--cwd", &folder.dir()]);
    assert!(!history.to_string().contains("line2defghij"), "{history}");
    // The first line too, and in a name.
    let start = home
        .command(&[
            "--json",
            "start",
            "--name",
            "uses line1abcdefg",
            "--secret",
            "ML",
            "--",
            "true",
        ])
        .env("ML", "line1abcdefg\nline2defghij")
        .output()
        .unwrap();
    assert_ne!(start.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&start.stdout).contains("--name holds the value"));
}

#[test]
fn issue26_q18_a_command_right_after_kill_9_of_the_daemon_starts_a_new_one() {
    let home = Home::new();
    for round in 0..8 {
        home.start_daemon();
        let pid = home.daemon_pid();
        let killed = Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        // At once, and a second client racing it.
        let racing = home
            .command(&["--json", "list"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let listed = home.run(&["--json", "list"]);
        assert_eq!(
            listed.code, 0,
            "round {round}: {}{}",
            listed.stdout, listed.stderr
        );
        let other = finish_within(racing, Duration::from_secs(30));
        assert_eq!(
            other.status.code(),
            Some(0),
            "round {round}: {}",
            stderr(&other)
        );
        eventually(Duration::from_secs(10), || !crate::util::alive(pid));
    }
}

#[test]
fn issue26_q16_mcp_list_stays_short_and_says_what_it_left_out() {
    let home = Home::new();
    let awaited = home.start("sleep 60");
    let condition = format!("{awaited}:output {}", "x".repeat(4000));
    // Sixteen conditions (one given twice would be one).
    let conditions: Vec<String> = (0..16).map(|n| format!("{condition}{n}")).collect();
    let mut args = vec!["start", "--window", "0"];
    for condition in &conditions {
        args.extend_from_slice(&["--after", condition]);
    }
    args.extend_from_slice(&["--", "true"]);
    let waiting = home.json(&args);
    assert_eq!(waiting["state"], "waiting", "{waiting}");
    let mut mcp = Mcp::start(&home);
    let (error, result) = mcp.call("list", json!({}));
    assert!(!error, "{result}");
    let size = result.to_string().len();
    assert!(size < 8 << 10, "an MCP list of {size} bytes");
    let listed = result["items"].to_string();
    assert!(listed.contains("more bytes left out"), "{listed}");
    // The CLI's JSON keeps it whole.
    let whole = home.item(waiting["id"].as_str().unwrap());
    assert!(whole["waiting_for"].as_str().unwrap().len() > 16 * 4000);
    home.json(&["stop", waiting["id"].as_str().unwrap()]);
    home.json(&["stop", &awaited]);
}

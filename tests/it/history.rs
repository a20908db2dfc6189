//! The run history (issue 26): what ended is kept per folder and command, shown by
//! `history`, in `start` and `list`, a notice for work far past its usual time, and
//! `run --timeout auto`.

use crate::mcp::Mcp;
use crate::util::{eventually, Home};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A project folder whose `step` script says what the command `sh ./step` does.
struct Project(tempfile::TempDir);

impl Project {
    fn new() -> Project {
        Project(tempfile::tempdir().unwrap())
    }
    fn path(&self) -> &Path {
        self.0.path()
    }
    fn dir(&self) -> String {
        self.path().display().to_string()
    }
    fn step(&self, script: &str) -> &Project {
        std::fs::write(self.path().join("step"), script).unwrap();
        self
    }
}

const STEP: &str = "sh ./step";

fn run_in(home: &Home, project: &Project, extra: &[&str], command: &str) -> Value {
    let dir = project.dir();
    let mut args = vec!["run", "--cwd", &dir];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", command]);
    let run = home.run(&[&["--json"], args.as_slice()].concat());
    run.json()
}

fn history(home: &Home, project: &Project, command: Option<&str>) -> Value {
    let dir = project.dir();
    let mut args = vec!["history", "--cwd", &dir];
    if let Some(command) = command {
        args.extend_from_slice(&["--", command]);
    }
    home.json(&args)
}

fn listed(home: &Home, id: &str) -> Value {
    home.item(id)
}

#[test]
fn issue26_1_history_keeps_each_end_per_folder_and_normalised_command() {
    let home = Home::new();
    let project = Project::new();
    project.step("sleep 0.3");
    // Blanks do not make another command: these are one.
    run_in(&home, &project, &[], "sh  ./step");
    run_in(&home, &project, &[], " sh ./step ");
    let failed = run_in(&home, &project, &[], "exit 3");
    assert_eq!(failed["exit_code"], 3, "{failed}");
    let all = history(&home, &project, None);
    let commands = all["commands"].as_array().unwrap();
    assert_eq!(commands.len(), 2, "{all}");
    // The most recently run first.
    assert_eq!(commands[0]["command"], "exit 3");
    assert_eq!(commands[0]["last"][0]["end"], "failed");
    assert_eq!(commands[0]["last"][0]["exit_code"], 3);
    let step = &commands[1];
    assert_eq!(step["command"], STEP);
    assert_eq!(step["runs"], 2, "{step}");
    let median = step["median_ms"].as_u64().unwrap();
    assert!((300..5000).contains(&median), "{step}");
    assert!(step["p90_ms"].as_u64().unwrap() >= median);
    assert!(step["expected"].as_str().unwrap().starts_with("usually "));
    assert_eq!(step["last"].as_array().unwrap().len(), 2);
    assert_eq!(step["last"][0]["end"], "succeeded");
    // One command alone, named with other blanks; another folder has none.
    let one = history(&home, &project, Some("sh   ./step"));
    assert_eq!(one["commands"].as_array().unwrap().len(), 1, "{one}");
    assert_eq!(one["commands"][0]["runs"], 2);
    let elsewhere = Project::new();
    let none = history(&home, &elsewhere, None);
    assert_eq!(none["commands"], json!([]));
    let dir = project.dir();
    let text = home.run(&["history", "--cwd", &dir]).stdout;
    assert!(
        text.contains("median") && text.contains("sh ./step"),
        "{text}"
    );
    assert!(text.contains("failed (3)"), "{text}");
}

#[test]
fn issue26_1_history_survives_restarts_and_gc_and_keeps_ends_of_the_downtime() {
    let home = Home::new();
    let project = Project::new();
    project.step("exit 0");
    run_in(&home, &project, &[], STEP);
    // A job that ends while no daemon runs is kept with its real duration.
    let dir = project.dir();
    let id = home.start_with(&["--cwd", &dir], "sleep 0.5");
    let log = PathBuf::from(listed(&home, &id)["log_path"].as_str().unwrap());
    home.kill_daemon();
    let status = log.parent().unwrap().join("status");
    eventually(Duration::from_secs(20), || status.exists());
    home.wait_end(&id);
    let all = history(&home, &project, None);
    let commands = all["commands"].as_array().unwrap();
    assert_eq!(commands.len(), 2, "{all}");
    let sleep = commands
        .iter()
        .find(|c| c["command"] == "sleep 0.5")
        .unwrap();
    assert_eq!(sleep["last"][0]["end"], "succeeded", "{sleep}");
    assert!(sleep["median_ms"].as_u64().unwrap() >= 500, "{sleep}");
    // gc deletes the records, not their history.
    home.json(&["gc", "--all-ended"]);
    assert_eq!(home.json(&["list", "--all"])["items"], json!([]));
    let after = history(&home, &project, None);
    assert_eq!(after["commands"].as_array().unwrap().len(), 2, "{after}");
}

#[test]
fn issue26_1_history_keeps_the_newest_20_runs_of_a_command() {
    let home = Home::new();
    let project = Project::new();
    project.step("exit 0");
    for _ in 0..23 {
        run_in(&home, &project, &[], STEP);
    }
    let one = history(&home, &project, Some(STEP));
    assert_eq!(one["commands"][0]["runs"], 20, "{one}");
    let ids: Vec<&str> = one["commands"][0]["last"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.first(), Some(&"bg-23"));
    assert_eq!(ids.last(), Some(&"bg-4"));
}

#[test]
fn issue26_2_start_list_and_mcp_say_what_history_expects() {
    let home = Home::new();
    let project = Project::new();
    project.step("exit 1");
    run_in(&home, &project, &[], STEP);
    project.step("sleep 0.2");
    run_in(&home, &project, &[], STEP);
    run_in(&home, &project, &[], STEP);
    project.step("echo going; sleep 30");
    let dir = project.dir();
    let started = home.json(&["start", "--cwd", &dir, "--", STEP]);
    let expected = started["expected"].as_str().unwrap();
    assert!(
        expected.starts_with("usually 0.") || expected.starts_with("usually 1."),
        "{started}"
    );
    assert!(
        expected.ends_with("(3 runs; 1 of the last 3 failed)"),
        "{started}"
    );
    assert!(started["usual_ms"].as_u64().unwrap() >= 200);
    let id = started["id"].as_str().unwrap();
    let item = listed(&home, id);
    let progress = item["progress"].as_str().unwrap();
    assert!(
        progress.starts_with("running ") && progress.contains(", usually "),
        "{item}"
    );
    let text = home.run(&["list"]).stdout;
    assert!(text.contains("history: running "), "{text}");
    assert!(text.contains("(3 runs; 1 of the last 3 failed)"), "{text}");
    let text = home
        .run(&["start", "--cwd", &dir, "--allow-duplicate", "--", STEP])
        .stdout;
    // Shown after the first second of output: its progress against the usual time.
    assert!(text.contains("history: running "), "{text}");
    assert!(text.contains("(3 runs; 1 of the last 3 failed)"), "{text}");
    // MCP: the start result and list carry the same line.
    let mut mcp = Mcp::start(&home);
    let (error, reply) = mcp.call(
        "start",
        json!({"command": STEP, "cwd": dir, "allow_duplicate": true, "window_ms": 0}),
    );
    assert!(!error, "{reply}");
    assert!(
        reply["expected"].as_str().unwrap().contains("(3 runs;"),
        "{reply}"
    );
    let (_, list) = mcp.call("list", json!({}));
    assert!(
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["expected"].as_str().is_some_and(|e| e.contains("3 runs"))),
        "{list}"
    );
    let (_, past) = mcp.call("history", json!({"cwd": dir, "command": STEP}));
    assert_eq!(past["commands"][0]["runs"], 3, "{past}");
    // A command never seen has no expectation.
    let fresh = home.json(&["start", "--cwd", &dir, "--", "sleep 7"]);
    assert!(fresh.get("expected").is_none(), "{fresh}");
}

#[test]
fn issue26_2_a_job_far_past_its_usual_time_gets_one_notice_with_its_last_lines() {
    let home = Home::new().with("BGWORK_OVERRUN_MARGIN_S", "0");
    let project = Project::new();
    project.step("sleep 0.2");
    run_in(&home, &project, &[], STEP);
    run_in(&home, &project, &[], STEP);
    project.step("echo still going; sleep 60");
    let dir = project.dir();
    let id = home.start_with(&["--cwd", &dir], STEP);
    let notices = home.json(&["notices", "--wait", "20"]);
    let notices = notices["notices"].as_array().unwrap();
    assert_eq!(notices.len(), 1, "{notices:?}");
    let notice = &notices[0];
    assert_eq!(notice["item"], id.as_str());
    assert_eq!(notice["end"], Value::Null);
    let text = notice["text"].as_str().unwrap();
    assert!(text.contains("over 3× its usual"), "{text}");
    assert!(
        notice["tail"].as_str().unwrap().contains("still going"),
        "{notice}"
    );
    // Once only, and the job runs on.
    let again = home.json(&["notices", "--wait", "2"]);
    assert_eq!(again["notices"], json!([]), "{again}");
    assert_eq!(listed(&home, &id)["state"], "running");
}

#[test]
fn issue26_2_no_running_long_notice_for_a_server_or_work_always_stopped() {
    let home = Home::new().with("BGWORK_OVERRUN_MARGIN_S", "0");
    let project = Project::new();
    let dir = project.dir();
    // A server: its command once ended by itself after 2 s, now it listens on a port
    // (well before 3× that: a loaded machine starts Python slowly).
    project.step("sleep 2");
    run_in(&home, &project, &[], STEP);
    project.step("exec python3 -m http.server 0 --bind 127.0.0.1");
    let began = Instant::now();
    let server = home.start_with(&["--cwd", &dir], STEP);
    eventually(Duration::from_secs(20), || {
        listed(&home, &server)["listening"].is_array()
    });
    assert!(
        began.elapsed() < Duration::from_secs(6),
        "the server listened too late for this test"
    );
    // Work stopped every time has no usual time.
    let stopped = home.start_with(&["--cwd", &dir], "sleep 50");
    home.json(&["stop", &stopped]);
    let again = home.json(&["start", "--cwd", &dir, "--window", "0", "--", "sleep 50"]);
    assert!(again["usual_ms"].is_null(), "{again}");
    let line = again["expected"].as_str().unwrap();
    assert!(line.starts_with("no usual time"), "{again}");
    // Until well past 3× the server's usual 2 s: nothing is said.
    let until = Duration::from_secs(8).saturating_sub(began.elapsed());
    let wait = format!("{}", until.as_secs_f64().max(1.0));
    let notices = home.json(&["notices", "--wait", &wait]);
    assert_eq!(notices["notices"], json!([]), "{notices}");
}

fn timed_run(home: &Home, project: &Project, extra: &[&str]) -> (Value, Duration) {
    let started = Instant::now();
    let reply = run_in(home, project, extra, STEP);
    (reply, started.elapsed())
}

#[test]
fn issue26_3_run_timeout_auto_chooses_from_history_and_says_why() {
    let home = Home::new().with("BGWORK_AUTO_BACKGROUND_S", "1");
    let auto = ["--timeout", "auto"];
    // No history: the plain deadline.
    let quick = Project::new();
    quick.step("sleep 0.1");
    let (first, _) = timed_run(&home, &quick, &auto);
    assert_eq!(first["outcome"], "ended", "{first}");
    let choice = first["timeout_choice"].as_str().unwrap();
    assert!(
        choice.contains("no history") && choice.contains("60 s"),
        "{first}"
    );
    // Usually quick: waited for, up to 3× its usual time (at least 1 s), then promoted.
    let (second, _) = timed_run(&home, &quick, &auto);
    assert_eq!(second["outcome"], "ended");
    assert!(second["timeout_choice"]
        .as_str()
        .unwrap()
        .contains("in the foreground"));
    quick.step("echo slow today; sleep 30");
    let (slow, took) = timed_run(&home, &quick, &auto);
    assert_eq!(slow["outcome"], "promoted", "{slow}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(
        slow["timeout_choice"].as_str().unwrap().contains("3×"),
        "{slow}"
    );
    home.json(&["stop", slow["id"].as_str().unwrap()]);
    // Usually long: backgrounded at once, its notice armed.
    let long = Project::new();
    long.step("sleep 1.5");
    run_in(&home, &long, &[], STEP);
    let (back, took) = timed_run(&home, &long, &auto);
    assert_eq!(back["outcome"], "promoted", "{back}");
    assert!(took < Duration::from_millis(1400), "{took:?}");
    assert_eq!(back["notify"], true, "{back}");
    let choice = back["timeout_choice"].as_str().unwrap();
    assert!(choice.contains("backgrounded at once"), "{back}");
    let id = back["id"].as_str().unwrap();
    let notices = home.json(&["notices", "--wait", "20"]);
    assert_eq!(notices["notices"][0]["item"], id, "{notices}");
    assert_eq!(notices["notices"][0]["end"], "succeeded");
    // The text says it too, on stderr.
    let dir = long.dir();
    let text = home.run(&["run", "--cwd", &dir, "--timeout", "auto", "--", STEP]);
    assert!(
        text.stderr.contains("timeout auto: usually "),
        "{}",
        text.stderr
    );
    home.wait_end(&format!("bg-{}", 1 + id[3..].parse::<u64>().unwrap()));
    // Bad values are refused with the way out.
    let bad = home.run(&["run", "--timeout", "sometimes", "--", "true"]);
    assert_eq!(bad.code, 2);
    assert!(bad.stderr.contains("auto"), "{}", bad.stderr);
}

#[test]
fn issue26_3_mcp_run_takes_timeout_auto() {
    let home = Home::new().with("BGWORK_AUTO_BACKGROUND_S", "1");
    let project = Project::new();
    project.step("sleep 1.5");
    let dir = PathBuf::from(project.dir());
    let mut mcp = Mcp::start(&home);
    let args = json!({"command": STEP, "cwd": dir, "timeout": "auto"});
    let (error, first) = mcp.call("run", args.clone());
    assert!(!error, "{first}");
    assert_eq!(first["outcome"], "ended");
    assert!(first["timeout_choice"]
        .as_str()
        .unwrap()
        .contains("no history"));
    let (_, second) = mcp.call("run", args);
    assert_eq!(second["outcome"], "promoted", "{second}");
    assert!(second["timeout_choice"]
        .as_str()
        .unwrap()
        .contains("backgrounded at once"));
    let (error, bad) = mcp.call("run", json!({"command": "true", "timeout": "soon"}));
    assert!(error, "{bad}");
    let (error, both) = mcp.call(
        "run",
        json!({"command": "true", "timeout": "auto", "timeout_s": 5}),
    );
    assert!(error, "{both}");
}

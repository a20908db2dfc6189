//! The run history (issue 26): what ended is kept per folder and command, shown by
//! `history`, in `start` and `list`, a notice for work far past its usual time, and
//! `run --timeout auto`.

use crate::mcp::Mcp;
use crate::util::{eventually, finish_within, Home};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
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

/// A home with one run of `true` in a new project folder, and that folder as history
/// keeps it.
fn one_run_of_true() -> (Home, Project, String) {
    let home = Home::new();
    let project = Project::new();
    run_in(&home, &project, &[], "true");
    let real = history(&home, &project, None)["cwd"]
        .as_str()
        .unwrap()
        .to_string();
    (home, project, real)
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
    assert!(text.contains("× its usual"), "{text}");
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
fn issue26_v1_run_timeout_auto_says_its_wait_before_it_begins() {
    let (home, project, real) = one_run_of_true();
    // Usually 4 s here: waited for up to 12 s.
    for _ in 0..3 {
        insert_run(&home, &real, STEP, 4000, "succeeded");
    }
    project.step("sleep 30");
    let mut child = home
        .command(&[
            "run",
            "--cwd",
            &project.dir(),
            "--timeout",
            "auto",
            "--",
            STEP,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let _ = sender.send(line.unwrap_or_default());
        }
    });
    let first = receiver.recv_timeout(Duration::from_secs(10)).unwrap();
    // Said while the run still waits, not when it returns.
    assert!(child.try_wait().unwrap().is_none(), "{first}");
    assert!(
        first.contains("timeout auto: usually 4.0 s here")
            && first.contains("waiting in the foreground up to 3× that (12 s)")
            && first.contains("backgrounded if the session has room by then, else killed"),
        "{first}"
    );
    let id = home.json(&["list"])["items"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    home.json(&["stop", &id]);
    finish_within(child, Duration::from_secs(20));
    // Said once: the end does not say it again.
    let rest: Vec<String> = receiver.iter().collect();
    assert!(rest.iter().all(|l| !l.contains("timeout auto")), "{rest:?}");
    // With --json too, on stderr (stdout keeps the reply alone).
    project.step("true");
    let dir = project.dir();
    let json = home.run(&[
        "--json",
        "run",
        "--cwd",
        &dir,
        "--timeout",
        "auto",
        "--",
        STEP,
    ]);
    assert!(
        json.stderr.contains("[timeout auto: usually "),
        "{}",
        json.stderr
    );
    let reply: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(reply["outcome"], "ended", "{reply}");
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

// Round four: what a hostile tester found in run history (issue 26, findings h1-h13).

/// The home's database, opened beside its daemon (as a person with `sqlite3` would).
fn db(home: &Home) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(home.path().join("work.db")).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn
}

/// Every command the history keeps, as stored.
fn stored_commands(home: &Home) -> Vec<String> {
    let conn = db(home);
    let mut stmt = conn.prepare("SELECT command FROM runs").unwrap();
    let rows = stmt.query_map([], |r| r.get(0)).unwrap();
    rows.map(Result::unwrap).collect()
}

/// A kept run put into the store directly (a row of an older or damaged home).
fn insert_run(home: &Home, cwd: &str, command: &str, duration_ms: i64, end: &str) {
    db(home)
        .execute(
            "INSERT INTO runs(cwd, command, session, item, started_at, ended_at, duration_ms,
                              end_kind, exit_code, signal)
             VALUES (?1, ?2, 'test', 'bg-99', 0, ?3, ?3, ?4, 0, NULL)",
            rusqlite::params![cwd, command, duration_ms, end],
        )
        .unwrap();
}

const GHP: &str = "ghp_abcdefghijklmnopqrstuvwxyz0123456789AB";

#[test]
fn issue26_h1_no_token_or_env_or_secret_value_in_history_list_or_store() {
    let home = Home::new();
    let project = Project::new();
    let dir = project.dir();
    // A token shape is masked before the run is kept, so gc leaves no question.
    let command = format!("echo {GHP} >/dev/null; true");
    run_in(&home, &project, &[], &command);
    let text = home.run(&["history", "--cwd", &dir]).stdout;
    assert!(!text.contains(GHP) && text.contains("[secret"), "{text}");
    let json = history(&home, &project, None).to_string();
    assert!(!json.contains(GHP), "{json}");
    let listed = home.json(&["list", "--all"]).to_string();
    assert!(!listed.contains(GHP), "{listed}");
    let mut mcp = Mcp::start(&home);
    let (_, past) = mcp.call("history", json!({"cwd": dir}));
    assert!(!past.to_string().contains(GHP), "{past}");
    let (_, list) = mcp.call("list", json!({"all": true}));
    assert!(!list.to_string().contains(GHP), "{list}");
    home.json(&["gc", "--all-ended"]);
    let stored = stored_commands(&home);
    assert!(stored.iter().all(|c| !c.contains(GHP)), "{stored:?}");
    assert_eq!(stored.len(), 1, "{stored:?}");
    // The same command finds its masked history.
    let one = history(&home, &project, Some(&command));
    assert_eq!(one["commands"][0]["runs"], 1, "{one}");
    // An --env value long enough to be masked is refused in the command line, as a
    // --secret's is: no value is in the record, the store or a listing.
    let run = home.run(&[
        "run",
        "--cwd",
        &dir,
        "--env",
        "PW=anotherlongpw99",
        "--",
        "echo anotherlongpw99",
    ]);
    assert_eq!(run.code, 2, "{} {}", run.stdout, run.stderr);
    assert!(run.stderr.contains("--env PW"), "{}", run.stderr);
    assert!(!run.stderr.contains("anotherlongpw99"), "{}", run.stderr);
    // A --secret value that the blanks of the command hide until they are folded.
    let mut secret = home.command(&[
        "run",
        "--cwd",
        &dir,
        "--secret",
        "SEC2",
        "--",
        "echo open  sesame   42 >/dev/null",
    ]);
    secret.env("SEC2", "open sesame 42");
    let out = secret.output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stored = stored_commands(&home).join("\n");
    assert!(!stored.contains("anotherlongpw99"), "{stored}");
    assert!(!stored.contains("open sesame 42"), "{stored}");
    // A short --env value (a port, a mode) is no secret and stays usable.
    let short = home.json(&["run", "--env", "MODE=dev", "--", "echo dev"]);
    assert_eq!(short["exit_code"], 0, "{short}");
}

#[test]
fn issue26_h1_runs_kept_before_are_masked_when_the_daemon_starts() {
    let (home, project, real) = one_run_of_true();
    home.json(&["shutdown"]);
    insert_run(
        &home,
        &real,
        &format!("curl -H 'x: {GHP}'"),
        1000,
        "succeeded",
    );
    let all = history(&home, &project, None);
    assert!(!all.to_string().contains(GHP), "{all}");
    let stored = stored_commands(&home);
    assert!(stored.iter().all(|c| !c.contains(GHP)), "{stored:?}");
    assert_eq!(all["commands"].as_array().unwrap().len(), 2, "{all}");
}

#[test]
fn issue26_h2_one_folder_has_one_history_however_it_is_named() {
    let home = Home::new();
    let root = tempfile::tempdir().unwrap();
    let real = root.path().join("real");
    std::fs::create_dir_all(real.join("sub")).unwrap();
    std::os::unix::fs::symlink(&real, root.path().join("link")).unwrap();
    let dotdot = format!("{}/sub/..", real.display());
    let link = root.path().join("link").display().to_string();
    let real = real.display().to_string();
    for cwd in [&dotdot, &link, &real] {
        let run = home.json(&["run", "--cwd", cwd, "--", "true"]);
        assert_eq!(run["exit_code"], 0, "{run}");
    }
    for cwd in [&dotdot, &link, &real] {
        let past = home.json(&["history", "--cwd", cwd, "--", "true"]);
        assert_eq!(past["commands"][0]["runs"], 3, "{cwd}: {past}");
    }
    let mut mcp = Mcp::start(&home);
    let (error, past) = mcp.call("history", json!({"cwd": dotdot, "command": "true"}));
    assert!(!error, "{past}");
    assert_eq!(past["commands"][0]["runs"], 3, "{past}");
    // `run --timeout auto` finds it too.
    let auto = home.json(&["run", "--cwd", &link, "--timeout", "auto", "--", "true"]);
    let why = auto["timeout_choice"].as_str().unwrap_or_default();
    assert!(why.contains("usually"), "{auto}");
}

#[test]
fn issue26_h3_mcp_history_stays_short_and_says_what_it_left_out() {
    let home = Home::new();
    let project = Project::new();
    let dir = project.dir();
    let long = "y".repeat(4000);
    for n in 0..12 {
        let id = home.start_with(&["--cwd", &dir], &format!("true {n} {long}"));
        home.wait_end(&id);
    }
    let mut mcp = Mcp::start(&home);
    let raw = mcp.request(
        "tools/call",
        json!({"name": "history", "arguments": {"cwd": dir}}),
    );
    let size = raw.to_string().len();
    // Text and structured content each within 32 KiB.
    assert!(size < 2 * (32 << 10) + 8192, "{size} bytes");
    let result = &raw["result"]["structuredContent"];
    let kept = result["commands"].as_array().unwrap().len();
    assert!((1..12).contains(&kept), "{kept}");
    assert_eq!(result["left_out"], 12 - kept, "{result}");
    assert!(result["more"].as_str().unwrap().contains("\"command\""));
    // The newest first; a command left out is there when asked for.
    assert!(result["commands"][0]["command"]
        .as_str()
        .unwrap()
        .starts_with("true 11 "));
    let (_, one) = mcp.call(
        "history",
        json!({"cwd": dir, "command": format!("true 0 {long}")}),
    );
    assert_eq!(one["commands"][0]["runs"], 1, "{one}");
    // The CLI's text cuts each command.
    let text = home.run(&["history", "--cwd", &dir]).stdout;
    assert!(text.len() < 12 * 1000, "{} bytes", text.len());
    assert!(text.contains("…"), "{text}");
}

#[test]
fn issue26_h4_a_failing_history_never_keeps_an_end_from_being_recorded() {
    let home = Home::new();
    let project = Project::new();
    run_in(&home, &project, &[], "true");
    home.json(&["shutdown"]);
    db(&home).execute_batch("DROP TABLE runs").unwrap();
    let started = Instant::now();
    let run = home.run(&[
        "--json",
        "run",
        "--cwd",
        &project.dir(),
        "--",
        "echo after-drop",
    ]);
    assert_eq!(run.code, 0, "{} {}", run.stdout, run.stderr);
    let run = run.json();
    assert_eq!(run["state"], "ended", "{run}");
    assert_eq!(run["exit_code"], 0, "{run}");
    assert!(started.elapsed() < Duration::from_secs(30), "{run}");
    let id = run["id"].as_str().unwrap();
    assert_eq!(listed(&home, id)["state"], "ended");
    let log = std::fs::read_to_string(home.path().join("daemon.log")).unwrap();
    assert_eq!(log.matches("could not keep a run").count(), 1, "{log}");
}

#[test]
fn issue26_h5_long_commands_do_not_merge() {
    let home = Home::new();
    let project = Project::new();
    let prefix = format!(": {}", "x".repeat(4200));
    let slow = format!("{prefix}; sleep 0.5; echo slow");
    let fast = format!("{prefix}; echo fast");
    run_in(&home, &project, &[], &slow);
    run_in(&home, &project, &[], &fast);
    let past = history(&home, &project, Some(&fast));
    assert_eq!(past["commands"][0]["runs"], 1, "{past}");
    let all = history(&home, &project, None);
    let commands = all["commands"].as_array().unwrap();
    assert_eq!(commands.len(), 2, "{all}");
    // Shown cut, with the length and a digest of the whole.
    let shown = commands[0]["command"].as_str().unwrap();
    assert!(
        shown.len() < 4200 && shown.contains("… ("),
        "{}",
        &shown[4000..]
    );
}

#[test]
fn issue26_h6_history_text_names_the_session_of_other_sessions_ids() {
    let home = Home::new();
    let project = Project::new();
    let dir = project.dir();
    let command = "echo failing; exit 2";
    let run = home.run(&["run", "--session", "a", "--cwd", &dir, "--", command]);
    assert_eq!(run.code, 2);
    let text = home
        .run(&["history", "--session", "b", "--cwd", &dir, "--", command])
        .stdout;
    assert!(text.contains("bg-1 of session a failed (2)"), "{text}");
    let own = home
        .run(&["history", "--session", "a", "--cwd", &dir, "--", command])
        .stdout;
    assert!(own.contains("last: bg-1 failed (2)"), "{own}");
}

#[test]
fn issue26_h7_history_refuses_unknown_flags_and_names_the_missing_command() {
    let home = Home::new();
    let project = Project::new();
    let dir = project.dir();
    run_in(&home, &project, &[], "true");
    for args in [
        vec!["history", "--bogus"],
        vec!["history", "--cdw", "/tmp"],
        vec!["history", "exit", "3"],
    ] {
        let run = home.run(&args);
        assert_eq!(run.code, 2, "{args:?}: {} {}", run.stdout, run.stderr);
        assert!(run.stderr.contains("error"), "{args:?}: {}", run.stderr);
    }
    let text = home.run(&["history", "--cwd", &dir, "--", "nosuch"]);
    assert_eq!(text.code, 0);
    assert!(
        text.stdout.contains("no history of `nosuch`"),
        "{}",
        text.stdout
    );
    // An empty command is refused, by the CLI and MCP alike.
    let (code, _, message) = home.error(&["history", "--cwd", &dir, "--", " "]);
    assert_eq!(code, 2, "{message}");
    assert!(message.contains("empty"), "{message}");
    let mut mcp = Mcp::start(&home);
    let (error, reply) = mcp.call("history", json!({"cwd": dir, "command": ""}));
    assert!(error, "{reply}");
}

#[test]
fn issue26_h8_the_count_shown_is_the_basis_of_the_usual_time() {
    let home = Home::new();
    let project = Project::new();
    let dir = project.dir();
    project.step("exit 0");
    run_in(&home, &project, &[], STEP);
    project.step("exit 1");
    run_in(&home, &project, &[], STEP);
    run_in(&home, &project, &[], STEP);
    project.step("sleep 30");
    let id = home.start_with(&["--cwd", &dir], STEP);
    home.json(&["stop", &id]);
    let past = history(&home, &project, Some(STEP));
    let line = past["commands"][0]["expected"].as_str().unwrap();
    assert!(
        line.ends_with("(3 of 4 runs ended by themselves; 2 of the last 3 failed)"),
        "{line}"
    );
    // The median of an even count is the mean of the two middle runs.
    let real = past["cwd"].as_str().unwrap();
    for ms in [1000, 1000, 1000, 8000, 30000, 30000] {
        insert_run(&home, real, "even count", ms, "succeeded");
    }
    let even = history(&home, &project, Some("even count"));
    assert_eq!(even["commands"][0]["median_ms"], 4500, "{even}");
    assert!(even["commands"][0]["expected"]
        .as_str()
        .unwrap()
        .starts_with("usually 4.5 s (6 runs)"));
}

#[test]
fn issue26_h9_one_unreadable_run_is_skipped_not_the_folder() {
    let (home, project, real) = one_run_of_true();
    insert_run(&home, &real, "true", 5, "weird_end");
    let past = history(&home, &project, None);
    assert_eq!(past["commands"][0]["runs"], 1, "{past}");
    let text = home.run(&["history", "--cwd", &project.dir()]);
    assert_eq!(text.code, 0, "{}", text.stderr);
    let auto = run_in(&home, &project, &["--timeout", "auto"], "true");
    assert!(
        auto["timeout_choice"].as_str().unwrap().contains("usually"),
        "{auto}"
    );
}

#[test]
fn issue26_h10_an_absurd_stored_duration_overflows_nothing() {
    let home = Home::new().with("BGWORK_OVERRUN_MARGIN_S", "1");
    let project = Project::new();
    let dir = project.dir();
    run_in(&home, &project, &[], "true");
    let real = history(&home, &project, None)["cwd"]
        .as_str()
        .unwrap()
        .to_string();
    insert_run(
        &home,
        &real,
        "sleep 3 # big",
        4_000_000_000_000_000_000,
        "succeeded",
    );
    let id = home.start_with(&["--cwd", &dir], "sleep 3 # big");
    let notices = home.json(&["notices", "--wait", "2"]);
    assert_eq!(notices["notices"], json!([]), "{notices}");
    assert!(listed(&home, &id)["expected"]
        .as_str()
        .unwrap()
        .starts_with("usually "));
    home.json(&["stop", &id]);
    let past = history(&home, &project, Some("sleep 3 # big"));
    assert_eq!(
        past["commands"][0]["median_ms"],
        4_000_000_000_000_000_000u64
    );
}

#[test]
fn issue26_h11_mcp_start_says_a_running_long_notice_comes_without_notify() {
    let home = Home::new();
    let mut mcp = Mcp::start(&home);
    let (error, reply) = mcp.call("start", json!({"command": "sleep 5", "window_ms": 0}));
    assert!(!error, "{reply}");
    let next = reply["next"].as_str().unwrap();
    assert!(next.contains("no notice of its end"), "{next}");
    assert!(next.contains("far past its usual time"), "{next}");
    home.json(&["stop", reply["id"].as_str().unwrap()]);
}

#[test]
fn issue26_h12_bad_settings_are_said_in_the_log_and_status() {
    let home = Home::new()
        .with("BGWORK_AUTO_BACKGROUND_S", "abc")
        .with("BGWORK_OVERRUN_MARGIN_S", "-5")
        .with("BGWORK_MAX_RUNNING", "ten")
        .with("BGWORK_PORTS", "no");
    let status = {
        home.start_daemon();
        home.json(&["status"])
    };
    let refused = status["settings_refused"].as_array().unwrap();
    assert_eq!(refused.len(), 4, "{status}");
    let log = std::fs::read_to_string(home.path().join("daemon.log")).unwrap();
    for name in [
        "BGWORK_AUTO_BACKGROUND_S",
        "BGWORK_OVERRUN_MARGIN_S",
        "BGWORK_MAX_RUNNING",
        "BGWORK_PORTS",
    ] {
        assert_eq!(log.matches(name).count(), 1, "{name}: {log}");
    }
    let text = home.run(&["status"]).stdout;
    assert!(
        text.contains("setting BGWORK_MAX_RUNNING=\"ten\""),
        "{text}"
    );
}

#[test]
fn issue26_h13_only_what_bash_splits_on_is_folded() {
    let home = Home::new();
    let project = Project::new();
    run_in(&home, &project, &[], "true a\r\ntrue b");
    run_in(&home, &project, &[], "true a\ntrue b");
    run_in(&home, &project, &[], "echo a\u{a0}b");
    run_in(&home, &project, &[], "echo a b");
    let all = history(&home, &project, None);
    let commands = all["commands"].as_array().unwrap();
    assert_eq!(commands.len(), 4, "{all}");
    assert!(commands.iter().all(|c| c["runs"] == 1), "{all}");
    // Spaces and tabs still fold.
    run_in(&home, &project, &[], "echo  a\tb ");
    let folded = history(&home, &project, Some("echo a b"));
    assert_eq!(folded["commands"][0]["runs"], 2, "{folded}");
}

// Round five, a second hostile pass: what it found in running long and `--timeout auto`.

#[test]
fn issue26_t1_each_run_of_a_restart_policy_is_watched_against_the_history_it_gained() {
    let home = Home::new().with("BGWORK_OVERRUN_MARGIN_S", "0");
    let project = Project::new();
    // Its first run has no history, fails after 0.3 s and is recorded; the second runs on.
    project.step(
        "if [ -e ran ]; then echo second run; sleep 60; else touch ran; sleep 0.3; exit 3; fi",
    );
    let dir = project.dir();
    let id = home.start_with(
        &[
            "--cwd",
            &dir,
            "--restart",
            "on-failure",
            "--backoff",
            "1s..1s",
        ],
        STEP,
    );
    let notices = home.json(&["notices", "--wait", "30"]);
    let notices = notices["notices"].as_array().unwrap();
    assert_eq!(notices.len(), 1, "{notices:?}");
    let notice = &notices[0];
    assert_eq!(notice["item"], id.as_str(), "{notice}");
    assert_eq!(notice["end"], Value::Null, "{notice}");
    let text = notice["text"].as_str().unwrap();
    // The times its usual time, rounded down: never "over 3×" at exactly 3×.
    // (Its usual time is the first run's: 0.3 s, more on a loaded machine.)
    assert!(
        text.contains("× its usual 0.") && text.contains("(1 run; it failed)"),
        "{text}"
    );
    assert!(!text.contains("over"), "{text}");
    assert!(
        notice["tail"].as_str().unwrap().contains("second run"),
        "{notice}"
    );
    assert_eq!(listed(&home, &id)["restart"]["restarts"], 1);
}

#[test]
fn issue26_t5_auto_without_room_says_it_waits_and_is_killed_not_that_a_notice_is_armed() {
    let home = Home::new()
        .with("BGWORK_AUTO_BACKGROUND_S", "0.2")
        .with("BGWORK_MAX_RUNNING", "1");
    let project = Project::new();
    project.step("sleep 0.4");
    run_in(&home, &project, &[], STEP);
    // The session's one slot is taken: backgrounding would kill it.
    let busy = home.start("sleep 60");
    let reply = run_in(&home, &project, &["--timeout", "auto"], STEP);
    assert_eq!(reply["outcome"], "ended", "{reply}");
    let choice = reply["timeout_choice"].as_str().unwrap();
    assert!(
        choice.contains("in the foreground up to the plain 60 s"),
        "{choice}"
    );
    assert!(
        choice.contains("backgrounded if the session has room by then, else killed"),
        "{choice}"
    );
    assert!(!choice.contains("notice armed"), "{choice}");
    home.json(&["stop", &busy]);
}

#[test]
fn issue26_u1_the_running_long_warnings_of_every_run_are_withdrawn_at_the_end() {
    let home = Home::new().with("BGWORK_OVERRUN_MARGIN_S", "0");
    let project = Project::new();
    project.step("sleep 0.3; exit 1");
    for _ in 0..3 {
        run_in(&home, &project, &[], STEP);
    }
    // Each run now takes 2 s, past 3× its usual 0.3 s: a warning per run, none taken.
    project.step("sleep 2; exit 1");
    let dir = project.dir();
    let id = home.start_with(
        &[
            "--cwd",
            &dir,
            "--restart",
            "on-failure",
            "--max-restarts",
            "1",
            "--backoff",
            "1s..1s",
        ],
        STEP,
    );
    home.wait_end(&id);
    // The end says the rest: no "may be stuck" of any run after it.
    let notices = home.json(&["notices"]);
    let notices = notices["notices"].as_array().unwrap();
    assert!(notices.iter().all(|n| !n["end"].is_null()), "{notices:?}");
}

#[test]
fn issue26_v25_a_running_long_warning_is_withdrawn_when_its_run_ends_and_a_policy_starts_it_again()
{
    let home = Home::new().with("BGWORK_OVERRUN_MARGIN_S", "0");
    let project = Project::new();
    // Usually 0.3 s; then a run of 3 s that fails (warned of at about 0.9 s).
    project
        .step("if [ -e ran ]; then echo long run; sleep 3; exit 3; else touch ran; sleep 0.3; fi");
    run_in(&home, &project, &[], STEP);
    let dir = project.dir();
    let id = home.start_with(
        &["--cwd", &dir, "--restart", "on-failure", "--backoff", "20s"],
        STEP,
    );
    let pending = |home: &Home| -> Vec<Value> {
        home.json(&["notices", "--peek"])["notices"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|n| n["item"] == id.as_str())
            .collect()
    };
    eventually(Duration::from_secs(20), || !pending(&home).is_empty());
    assert!(
        pending(&home)[0]["text"]
            .as_str()
            .unwrap()
            .contains("may be stuck"),
        "{:?}",
        pending(&home)
    );
    eventually(Duration::from_secs(20), || {
        listed(&home, &id)["state"] == "restarting"
    });
    // Its run ended: the warning of it is gone, not told as if it still ran.
    assert!(pending(&home).is_empty(), "{:?}", pending(&home));
    home.run(&["stop", &id]);
}

/// A kept run whose duration is not a number (a damaged home): it is left out, said
/// once in `daemon.log`, and the folder's other runs are still shown (the whole
/// `history` failed, "Invalid column type").
#[test]
fn issue26_y2_one_unreadable_run_costs_no_other_run_its_history() {
    let (home, project, real) = one_run_of_true();
    db(&home)
        .execute(
            "INSERT INTO runs(cwd, command, session, item, started_at, ended_at, duration_ms,
                              end_kind, exit_code, signal)
             VALUES (?1, 'true', 'test', 'bg-98', 5, 1, 'abc', 'succeeded', 0, NULL)",
            [&real],
        )
        .unwrap();
    let shown = history(&home, &project, None);
    assert_eq!(shown["commands"][0]["command"], "true", "{shown}");
    assert_eq!(shown["commands"][0]["runs"], 1, "{shown}");
    let one = history(&home, &project, Some("true"));
    assert_eq!(one["commands"][0]["runs"], 1, "{one}");
    let log = std::fs::read_to_string(home.path().join("daemon.log")).unwrap();
    assert_eq!(log.matches("a kept run cannot be read").count(), 1, "{log}");
}

/// A folder with more commands than a listing names: the count of the rest is the
/// true one, in the text, `--json` and MCP (they stopped at the 200 listed).
#[test]
fn issue26_y3_history_counts_every_command_past_those_it_lists() {
    let (home, project, real) = one_run_of_true();
    {
        let mut conn = db(&home);
        let tx = conn.transaction().unwrap();
        for n in 0..450 {
            tx.execute(
                "INSERT INTO runs(cwd, command, session, item, started_at, ended_at,
                                  duration_ms, end_kind, exit_code, signal)
                 VALUES (?1, ?2, 'test', 'bg-99', 0, 10, 10, 'succeeded', 0, NULL)",
                rusqlite::params![real, format!("make step{n}")],
            )
            .unwrap();
        }
        tx.commit().unwrap();
    }
    let shown = history(&home, &project, None);
    let listed = shown["commands"].as_array().unwrap().len();
    assert_eq!(listed, 200, "the most recent 200 are listed");
    assert_eq!(
        shown["more_commands"],
        451 - 200,
        "{}",
        shown["more_commands"]
    );
    let dir = project.dir();
    let text = home.run(&["history", "--cwd", &dir]).stdout;
    let last = text.lines().last().unwrap();
    assert!(
        last.starts_with(&format!("{} more commands", 451 - 50))
            && last.contains("200 most recent"),
        "{last}"
    );
    let mut mcp = Mcp::start(&home);
    let (_, result) = mcp.call("history", json!({"cwd": dir}));
    let kept = result["commands"].as_array().unwrap().len();
    assert_eq!(
        result["left_out"].as_u64().unwrap() as usize,
        451 - kept,
        "{}",
        result["more"]
    );
}

/// `run --timeout auto`'s reason counts the failures as the expected line does (it
/// said "usually 2.0 s here (2 runs)" of two failed runs).
#[test]
fn issue26_y4_run_timeout_auto_says_how_the_last_runs_ended() {
    let home = Home::new();
    let project = Project::new();
    project.step("sleep 0.2; exit 3");
    run_in(&home, &project, &[], STEP);
    run_in(&home, &project, &[], STEP);
    let run = run_in(&home, &project, &["--timeout", "auto"], STEP);
    let choice = run["timeout_choice"].as_str().unwrap();
    assert!(choice.contains("(2 runs; the last 2 failed)"), "{choice}");
}

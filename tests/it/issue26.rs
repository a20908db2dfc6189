//! Issue 26, the holes a hostile tester found in waiting work (`start --after`) and
//! restart policies (`--restart on-failure`): each test pins one item of that round.

use crate::mcp::Mcp;
use crate::util::{eventually, Home};
use serde_json::{json, Value};
use std::time::Duration;

/// A folder with a `go` file the test makes to let a job on.
struct Gate(tempfile::TempDir);

impl Gate {
    fn new() -> Gate {
        Gate(tempfile::tempdir().unwrap())
    }
    fn path(&self, name: &str) -> std::path::PathBuf {
        self.0.path().join(name)
    }
    /// A shell line that waits for `go` in this folder, then runs `then`.
    fn after_go(&self, then: &str) -> String {
        format!(
            "while [ ! -f '{}' ]; do sleep 0.02; done; {then}",
            self.path("go").display()
        )
    }
    fn open(&self) {
        std::fs::write(self.path("go"), "").unwrap();
    }
}

/// `start --window 0 OPTIONS -- COMMAND`, its id.
fn start(home: &Home, options: &[&str], command: &str) -> String {
    let mut args = vec!["start", "--window", "0"];
    args.extend_from_slice(options);
    args.extend_from_slice(&["--", command]);
    home.json(&args)["id"].as_str().unwrap().to_string()
}

/// An item waiting for a gated job: (the gate, the job's id, the waiting item's id).
fn waiting(home: &Home, options: &[&str], command: &str) -> (Gate, String, String) {
    let gate = Gate::new();
    let first = home.start(&gate.after_go("true"));
    let mut all = vec!["--after", first.as_str()];
    all.extend_from_slice(options);
    let second = start(home, &all, command);
    assert_eq!(home.item(&second)["state"], "waiting");
    (gate, first, second)
}

/// A job that fails and waits out a long back-off: its id, listed `restarting`.
fn restarting(home: &Home, command: &str) -> String {
    let id = home.start_with(&["--restart", "on-failure", "--backoff", "60s"], command);
    eventually(Duration::from_secs(20), || {
        home.item(&id)["state"] == "restarting"
    });
    id
}

fn ended(home: &Home, id: &str) -> Value {
    let mut item = Value::Null;
    eventually(Duration::from_secs(40), || {
        item = home.item(id);
        item["state"] == "ended"
    });
    item
}

#[test]
fn issue26_r1_readers_say_waiting_and_restarting_not_still_running() {
    let home = Home::new();
    let (_gate, first, second) = waiting(&home, &[], "echo b");
    let waits = format!("waiting for {first} to succeed");
    let third = restarting(&home, "exit 4");
    for (id, words) in [
        (&second, waits.as_str()),
        (&third, "restarting (restart 1 of 5, next at"),
    ] {
        let read = home.run(&["read", id]);
        assert!(
            read.stdout.contains(&format!("[{id} is {words}")),
            "read: {}",
            read.stdout
        );
        let json = home.json(&["read", id]);
        assert!(json["live"].as_str().unwrap().starts_with(words), "{json}");
        let wait = home.run(&["wait", id, "--timeout", "0.3"]);
        assert!(
            wait.stdout.contains(&format!("{id} is {words}")),
            "wait: {}",
            wait.stdout
        );
        let (_, _, message) = home.error(&["dismiss", id]);
        assert!(
            message.contains(&format!("{id} is {words}")),
            "dismiss: {message}"
        );
        for text in [&read.stdout, &wait.stdout, &message] {
            assert!(!text.contains("still running"), "{text}");
        }
    }
    // MCP's read says the same.
    let mut mcp = Mcp::start(&home);
    let (error, read) = mcp.call("read", json!({"id": second}));
    assert!(!error, "{read}");
    assert!(read["live"].as_str().unwrap().starts_with(&waits), "{read}");
}

#[test]
fn issue26_r2_a_restarting_item_is_the_running_twin_of_its_command() {
    let home = Home::new();
    let command = "echo up; exit 3";
    let id = restarting(&home, command);
    let again = home.json(&["start", "--window", "0", "--", command]);
    assert_eq!(again["id"], id, "a second copy started: {again}");
    assert_eq!(again["already_running"], true, "{again}");
    let text = home.run(&["start", "--window", "0", "--", command]);
    assert!(
        text.stdout.contains(&format!(
            "already running as {id}, restarting (restart 1 of 5"
        )),
        "{}",
        text.stdout
    );
    // --allow-duplicate starts another, as for any twin.
    let other = home.json(&["start", "--window", "0", "--allow-duplicate", "--", command]);
    assert_ne!(other["id"], id);
}

#[test]
fn issue26_r3_after_the_final_end_the_last_fields_describe_the_last_run() {
    let home = Home::new();
    let folder = tempfile::tempdir().unwrap();
    let count = folder.path().join("count").display().to_string();
    // Run 1 exits 11, run 2 exits 12.
    let command = format!(
        "n=$(cat '{count}' 2>/dev/null || echo 0); n=$((n+1)); echo $n > '{count}'; exit $((10+n))"
    );
    let id = home.start_with(
        &[
            "--restart",
            "on-failure",
            "--max-restarts",
            "1",
            "--backoff",
            "100ms",
        ],
        &command,
    );
    let item = ended(&home, &id);
    assert_eq!(item["exit_code"], 12, "{item}");
    let restart = &item["restart"];
    assert_eq!(restart["last_exit_code"], 12, "{item}");
    assert_eq!(restart["last_end"], "failed", "{item}");
    assert_eq!(restart["last_ended_at"], item["ended_at"], "{item}");
    // Stopped between two runs, the last run is still the one that failed.
    let id = restarting(&home, "exit 7");
    home.json(&["stop", &id]);
    let item = ended(&home, &id);
    assert_eq!(item["end"], "stopped_by_agent", "{item}");
    assert_eq!(item["restart"]["last_end"], "failed", "{item}");
    assert_eq!(item["restart"]["last_exit_code"], 7, "{item}");
}

#[test]
fn issue26_r4_gc_keeps_an_awaited_record_until_its_waiter_judged_it() {
    // A retention of 0: every ended record is old enough for the gc at a daemon's start.
    let home = Home::new().with("BGWORK_RETAIN_S", "0");
    let gate = Gate::new();
    let done = gate.path("done").display().to_string();
    let first = home.start(&gate.after_go(&format!("touch '{done}'")));
    let out = gate.path("out").display().to_string();
    let second = start(&home, &["--after", &first], &format!("echo ran > '{out}'"));
    let folder = home.item(&first)["folder"].as_str().unwrap().to_string();
    home.kill_daemon();
    gate.open();
    // It succeeds while no daemon runs (its supervisor writes its status).
    let status = std::path::Path::new(&folder).join("status");
    eventually(Duration::from_secs(20), || status.exists());
    let item = home.wait_end(&second);
    assert_eq!(item["end"], "succeeded", "{item}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "ran\n");
}

#[test]
fn issue26_r5_a_folder_removed_while_it_waits_ends_it_instead_of_running_again() {
    let home = Home::new();
    let runs = tempfile::tempdir().unwrap();
    let file = runs.path().join("runs").display().to_string();
    let id = home.start_with(
        &["--restart", "on-failure", "--backoff", "2s"],
        &format!("echo run >> '{file}'; exit 1"),
    );
    eventually(Duration::from_secs(20), || {
        home.item(&id)["state"] == "restarting"
    });
    let folder = home.item(&id)["folder"].as_str().unwrap().to_string();
    std::fs::remove_dir_all(&folder).unwrap();
    let item = ended(&home, &id);
    assert_eq!(item["end"], "failed", "{item}");
    let report = item["report"].as_str().unwrap();
    assert!(
        report.contains("could not start it again: its folder") && report.contains("was removed"),
        "{report}"
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "run\n",
        "it ran again"
    );

    // A waiting item whose own folder is removed ends lost, and never runs.
    let out = runs.path().join("out");
    let (gate, first, second) = waiting(&home, &[], &format!("echo ran > '{}'", out.display()));
    let folder = home.item(&second)["folder"].as_str().unwrap().to_string();
    std::fs::remove_dir_all(&folder).unwrap();
    let item = ended(&home, &second);
    assert_eq!(item["end"], "lost", "{item}");
    assert!(item["started_at"].is_null(), "it never started: {item}");
    assert!(
        item["report"]
            .as_str()
            .unwrap()
            .contains("was removed while it waited"),
        "{item}"
    );
    gate.open();
    let first_end = home.wait_end(&first);
    assert_eq!(first_end["end"], "succeeded");
    assert!(!out.exists(), "the removed item ran");
}

#[test]
fn issue26_r6_the_restart_marker_matches_no_word_a_user_waits_for() {
    let home = Home::new();
    let id = home.start_with(
        &[
            "--restart",
            "on-failure",
            "--max-restarts",
            "1",
            "--backoff",
            "100ms",
        ],
        "echo hi; exit 1",
    );
    ended(&home, &id);
    let log = home.json(&["read", &id, "--from", "0"])["output"]
        .as_str()
        .unwrap()
        .to_string();
    let marker: Vec<&str> = log.lines().filter(|l| l.starts_with("[bgwork:")).collect();
    assert_eq!(marker.len(), 1, "{log}");
    assert!(
        marker[0].starts_with(&format!("[bgwork: {id} run again, restart 1 of 1, at ")),
        "{log}"
    );
    for word in [
        "started",
        "ready",
        "listening",
        "error",
        "failed",
        "exit",
        "done",
    ] {
        assert!(
            !marker[0].to_lowercase().contains(word),
            "{word} in {}",
            marker[0]
        );
        let grep = home.json(&["read", &id, "--grep", &format!("(?i){word}")]);
        assert_eq!(grep["matches"], json!([]), "{word}: {grep}");
    }
}

#[test]
fn issue26_r7_a_waiting_item_has_no_start_time_until_it_starts() {
    let home = Home::new();
    let (gate, first, second) = waiting(&home, &[], "echo b");
    let item = home.item(&second);
    assert!(item["started_at"].is_null(), "{item}");
    let created = item["created_at"].as_str().unwrap().to_string();
    let line = home.run(&["list"]).stdout;
    let row = line
        .lines()
        .find(|l| l.contains(&second))
        .unwrap()
        .to_string();
    gate.open();
    home.wait_end(&first);
    let item = home.wait_end(&second);
    assert_eq!(item["created_at"], created.as_str(), "{item}");
    let started = item["started_at"].as_str().unwrap();
    assert!(started >= created.as_str(), "{item}");
    // While it waited, `list` counted no time for it.
    assert!(row.contains(" - "), "{row}");
}

#[test]
fn issue26_r8_restart_of_a_waiting_item_takes_its_values_from_its_keeper() {
    let home = Home::new();
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("token").display().to_string();
    let (gate, _first, second) = waiting(
        &home,
        &["--env", "TOKEN=kept-by-its-keeper-42"],
        &format!("echo \"$TOKEN\" > '{file}'"),
    );
    let reply = home.json(&["restart", &second, "--window", "0"]);
    let new = reply["id"].as_str().unwrap().to_string();
    home.wait_end(&new);
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "kept-by-its-keeper-42\n"
    );
    assert_eq!(home.item(&second)["end"], "stopped_by_agent");
    gate.open();
}

#[test]
fn issue26_r9_mcp_errors_quote_a_flag_once() {
    let home = Home::new();
    let mut mcp = Mcp::start(&home);
    let (error, refused) = mcp.call("start", json!({"command": "true", "restart": "always"}));
    assert!(error, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("`restart: on-failure`"), "{message}");
    assert!(!message.contains("``"), "{message}");
}

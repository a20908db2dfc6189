//! Issue 26, the holes a hostile tester found in waiting work (`start --after`) and
//! restart policies (`--restart on-failure`): each test pins one item of that round.

use crate::mcp::Mcp;
use crate::util::{eventually, Gate, Home};
use serde_json::{json, Value};
use std::time::Duration;

/// `start --window 0 OPTIONS -- COMMAND`, its id.
fn start(home: &Home, options: &[&str], command: &str) -> String {
    home.start_reply(options, command)["id"]
        .as_str()
        .unwrap()
        .to_string()
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

/// `start --window 0 OPTIONS -- COMMAND`, refused as a bad request that says `why` and
/// that nothing was started: its message.
fn refused(home: &Home, options: &[&str], command: &str, why: &str) -> String {
    let mut args = vec!["start", "--window", "0"];
    args.extend_from_slice(options);
    args.extend_from_slice(&["--", command]);
    let (exit, code, message) = home.error(&args);
    // A condition that can never hold for the item it names is refused (exit 1); a
    // pattern that spells a masked value is a wrong command line (exit 2).
    let wanted = match why {
        "can never hold" => (1, "refused"),
        _ => (2, "bad_request"),
    };
    assert_eq!((exit, code.as_str()), wanted, "{options:?}: {message}");
    assert!(
        message.contains(why) && message.contains("nothing was started"),
        "{options:?}: {message}"
    );
    message
}

/// Every item of the session, ended ones too (`list --all`).
fn all_items(home: &Home) -> Vec<Value> {
    home.json(&["list", "--all"])["items"]
        .as_array()
        .unwrap()
        .clone()
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
        (&third, "restarting (restarted 0 of 5 times, next at"),
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
            "already running as {id}, restarting (restarted 0 of 5 times"
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
    let id = home.start_restarting("1", "100ms", &[], &command);
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
    let id = home.start_restarting("1", "100ms", &[], "echo hi; exit 1");
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

#[test]
fn issue26_p1_a_pattern_holding_a_secret_value_is_refused_at_start() {
    let value = "pattern-secret-777";
    let home = Home::new().with("SX", value);
    let first = start(&home, &["--secret", "SX"], "echo \"token is $SX\"; sleep 5");
    let refusals = [
        // A secret of the new item, as its own pattern.
        vec![
            "--secret",
            "SX",
            "--after",
            "bg-1:output pattern-secret-777",
        ],
        // An --env value of the new item.
        vec![
            "--env",
            "Q=pattern-secret-777",
            "--after",
            "bg-1:output token is pattern-secret-777",
        ],
        // A secret of the awaited item, as the caller holds it.
        vec!["--after", "bg-1:output is pattern-secret-777"],
    ];
    for options in refusals {
        let message = refused(
            &home,
            &options,
            "echo \"$SX\" >/dev/null",
            "two thirds or more of the value",
        );
        assert!(
            !message.contains(value),
            "the error shows the value: {message}"
        );
    }
    // Nothing was recorded: the session has its first item only, and no file of any
    // folder holds the value.
    let items = all_items(&home);
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0]["id"], first.as_str());
    // The mask itself is a pattern that matches as readers are shown it.
    let waits = start(
        &home,
        &[
            "--secret",
            "SX",
            "--after",
            r"bg-1:output token is \[secret SX\]",
        ],
        "true",
    );
    let item = ended(&home, &waits);
    assert_eq!(item["end"], "succeeded", "{item}");
}

#[test]
fn issue26_p8_an_output_condition_on_an_item_that_ended_without_the_line_is_refused() {
    let home = Home::new();
    let first = home.start("echo hello");
    home.wait_end(&first);
    let condition = format!("{first}:output never-printed");
    refused(&home, &["--after", &condition], "true", "can never hold");
    let items = all_items(&home);
    assert_eq!(items.len(), 1, "a record was made: {items:?}");
    // A line it did print holds at once.
    let second = start(
        &home,
        &["--after", &format!("{first}:output hel+o")],
        "true",
    );
    assert_eq!(ended(&home, &second)["end"], "succeeded");
}

#[test]
fn issue26_p10_restart_counts_read_the_same_in_every_reader() {
    let home = Home::new();
    let id = restarting(&home, "exit 4");
    let words = "restarted 0 of 5 times";
    let list = home.run(&["list"]).stdout;
    assert!(list.contains(words), "list: {list}");
    let status = home.json(&["status"]);
    assert_eq!(
        status["restarting"],
        json!([format!("test/{id}: {words}")]),
        "{status}"
    );
    let read = home.json(&["read", &id]);
    assert!(read["live"].as_str().unwrap().contains(words), "{read}");
    let wait = home.run(&["wait", &id, "--timeout", "0.3"]).stdout;
    assert!(wait.contains(words), "wait: {wait}");
    for text in [&list, &status.to_string(), &read.to_string(), &wait] {
        assert!(!text.contains("restart 1 of 5"), "{text}");
        assert!(!text.contains("restarts: 0"), "{text}");
    }
    home.json(&["stop", &id]);
}

#[test]
fn issue26_p11_a_cancelled_chain_names_its_root_cause_and_the_link_above_only() {
    let home = Home::new();
    let gate = Gate::new();
    let first = home.start(&gate.after_go("exit 3"));
    let mut last = first.clone();
    for _ in 0..12 {
        last = start(&home, &["--after", &last], "true");
    }
    gate.open();
    let item = ended(&home, &last);
    assert_eq!(item["end"], "cancelled", "{item}");
    let report = home.json(&["read", &last])["report"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        report.contains(&format!("{first} FAILED (exit 3)")),
        "{report}"
    );
    assert_eq!(report.matches("waited for").count(), 1, "{report}");
    assert!(report.len() < 300, "{} bytes: {report}", report.len());
    // The link above is the item it waited for.
    let above = format!("bg-{}", last[3..].parse::<u32>().unwrap() - 1);
    assert!(
        report.contains(&format!("waited for {above} to succeed")),
        "{report}"
    );
}

#[test]
fn issue26_p9_commands_on_waiting_or_restarting_items_say_so() {
    let home = Home::new();
    let (_gate, _first, pane) = waiting(&home, &["--pty"], "cat");
    let (_, _, resize) = home.error(&["resize", &pane, "--cols", "80", "--rows", "20"]);
    let (_, _, close) = home.error(&["close", &pane]);
    for message in [&resize, &close] {
        assert!(
            message.contains(&format!("{pane} is waiting for")),
            "{message}"
        );
        assert!(!message.contains("try again in a moment"), "{message}");
    }
    let screen = home.run(&["read", &pane, "--screen"]);
    assert!(
        screen.stderr.contains(&format!("[{pane} is waiting for")),
        "read --screen said: {:?} {:?}",
        screen.stdout,
        screen.stderr
    );
    let job = restarting(&home, "exit 5");
    let (_, _, send) = home.error(&["send", &job, "two"]);
    assert!(
        send.contains(&format!("{job} is restarting (restarted")),
        "{send}"
    );
    assert!(!send.contains("stdin is closed"), "{send}");
    home.json(&["stop", &job]);
}

#[test]
fn issue26_p6_a_restart_refused_by_the_start_rate_waits_for_it_and_is_logged_once() {
    let home = Home::new().with("BGWORK_MAX_STARTS_PER_MINUTE", "4");
    let id = home.start_restarting("6", "200ms..400ms", &[], "exit 7");
    let mut item = Value::Null;
    eventually(Duration::from_secs(20), || {
        item = home.item(&id);
        item["restart"]["refused"].is_string()
    });
    let next = item["restart"]["next_attempt_at"]
        .as_str()
        .unwrap()
        .to_string();
    let next = humantime::parse_rfc3339(&next).unwrap();
    let left = next
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    assert!(
        left > Duration::from_secs(20),
        "next start in {left:?}: {item}"
    );
    let refused = item["restart"]["refused"].as_str().unwrap();
    assert!(!refused.contains("allowed in"), "{refused}");
    let list = home.run(&["list"]).stdout;
    assert!(!list.contains("next start in 0s"), "{list}");
    // Two seconds of refusals (five back-offs) write one line.
    let log_path = home.path().join("daemon.log");
    let count = || {
        std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .matches("not started again")
            .count()
    };
    let started = std::time::Instant::now();
    eventually(Duration::from_secs(5), || {
        started.elapsed() > Duration::from_secs(2)
    });
    assert_eq!(
        count(),
        1,
        "{}",
        std::fs::read_to_string(&log_path).unwrap()
    );
    home.json(&["stop", &id]);
}

#[test]
fn issue26_p17_ids_read_as_the_asking_session_reads_them_and_shutdown_counts_waiters() {
    let dir = std::path::Path::new(crate::util::BIN)
        .parent()
        .unwrap()
        .display()
        .to_string();
    let path = format!("{dir}:{}", std::env::var("PATH").unwrap_or_default());
    let home = Home::new().with("PATH", &path);
    let gate = Gate::new();
    let first = home.start(&gate.after_go("true"));
    for _ in 0..31 {
        start(&home, &["--after", &first], "true");
    }
    // The sub-agent's own bg-1 and bg-2 (the 32nd waiting item), then one more.
    let out = home.path().join("refused.json");
    let body = format!(
        "bgwork start --window 0 -- 'sleep 100' >/dev/null\n\
         bgwork start --window 0 --after bg-1 -- true >/dev/null\n\
         bgwork --json start --window 0 --after bg-1 -- true > '{}.tmp' 2>&1\n\
         mv '{0}.tmp' '{0}'\n",
        out.display()
    );
    let script = home.path().join("agent.sh");
    std::fs::write(&script, body).unwrap();
    let command = format!("bash {}", script.display());
    home.json(&["agent", "start", "--", &command]);
    eventually(Duration::from_secs(30), || out.exists());
    let reply: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let message = reply["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("items waiting"), "{reply}");
    assert!(message.contains("bg-2 of session test"), "{message}");
    assert!(!message.contains("sub-1/bg-2"), "{message}");
    // shutdown --stop-work counts the waiting items it stopped.
    let said = home.run(&["shutdown", "--stop-work"]);
    assert!(
        said.stdout.contains("32 waiting items stopped"),
        "{} {}",
        said.stdout,
        said.stderr
    );
}

#[test]
fn issue26_p7_waiters_whose_conditions_hold_start_oldest_first() {
    let home = Home::new()
        .with("BGWORK_MAX_RUNNING", "2")
        .with("BGWORK_MAX_STARTS_PER_MINUTE", "5");
    let gate = Gate::new();
    let first = home.start(&gate.after_go("true"));
    let waiters: Vec<String> = (0..6)
        .map(|_| start(&home, &["--after", &first], "sleep 0.5"))
        .collect();
    gate.open();
    // The rate (5 a minute, bg-1 one of them) lets four start: the four oldest.
    eventually(Duration::from_secs(30), || {
        waiters
            .iter()
            .filter(|id| home.item(id)["state"] != "waiting")
            .count()
            >= 4
    });
    let states: Vec<String> = waiters
        .iter()
        .map(|id| home.item(id)["state"].as_str().unwrap().to_string())
        .collect();
    assert!(
        states[..4].iter().all(|s| s != "waiting") && states[4..].iter().all(|s| s == "waiting"),
        "not oldest first: {:?}",
        waiters.iter().zip(&states).collect::<Vec<_>>()
    );
    for id in &waiters {
        home.run(&["stop", id]);
    }
}

// A second hostile pass on the round's fixes: counts, the restart view, and a keeper
// that is killed.

#[test]
fn issue26_t2_a_count_of_one_reads_one_item() {
    let home = Home::new().with("BGWORK_MAX_RUNNING", "1");
    let first = home.start("sleep 60");
    let (_, code, message) = home.error(&["start", "--window", "0", "--", "sleep 61"]);
    assert_eq!(code, "limit", "{message}");
    assert!(
        message.contains("already runs 1 item, its limit"),
        "{message}"
    );
    assert!(!message.contains("1 items"), "{message}");
    home.json(&["stop", &first]);
}

#[test]
fn issue26_t3_the_restart_view_has_every_field_it_documents() {
    let home = Home::new();
    let id = home.start_with(&["--restart", "on-failure"], "sleep 60");
    let restart = home.item(&id)["restart"].clone();
    for field in [
        "last_end",
        "last_exit_code",
        "last_signal",
        "last_ended_at",
        "next_attempt_at",
        "refused",
    ] {
        assert_eq!(restart.get(field), Some(&Value::Null), "{field}: {restart}");
    }
    home.json(&["stop", &id]);
}

#[test]
fn issue26_t4_restart_names_a_secret_as_a_secret() {
    let home = Home::new().with("SX", "t4-secret-value-90210");
    let id = start(&home, &["--secret", "SX"], "true");
    home.wait_end(&id);
    // Asked where the variable is not set: its value is gone with the run.
    let output = home
        .command(&["--json", "restart", &id])
        .env_remove("SX")
        .output()
        .unwrap();
    let reply: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(reply["error"]["code"], "refused", "{reply}");
    assert_eq!(output.status.code(), Some(1), "{reply}");
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(message.contains("started with --secret SX"), "{message}");
    assert!(message.contains("--env SX=VALUE"), "{message}");
}

#[test]
fn issue26_t6_a_killed_keeper_is_started_again_and_its_values_outlive_a_daemon_restart() {
    let home = Home::new().with("SX", "t6-kept-value-31337");
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("token").display().to_string();
    let (gate, _first, second) = waiting(
        &home,
        &["--secret", "SX"],
        &format!("echo \"$SX\" > '{file}'"),
    );
    let keepers = crate::after::keepers_of(&home);
    assert_eq!(keepers.len(), 1, "{keepers:?}");
    std::process::Command::new("kill")
        .args(["-9", &keepers[0].to_string()])
        .status()
        .unwrap();
    // The daemon holds the values while it runs: it starts a new keeper with them.
    eventually(Duration::from_secs(20), || {
        let now = crate::after::keepers_of(&home);
        now.len() == 1 && now[0] != keepers[0]
    });
    // Then even a daemon killed outright loses nothing.
    home.kill_daemon();
    home.start_daemon();
    assert_eq!(home.item(&second)["state"], "waiting");
    gate.open();
    let ended = home.wait_end(&second);
    assert_eq!(ended["end"], "succeeded", "{ended}");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "t6-kept-value-31337\n"
    );
}

#[test]
fn issue26_u2_a_keeper_whose_socket_is_removed_is_ended_when_another_starts() {
    let home = Home::new();
    let (gate, _first, second) = waiting(&home, &["--env", "Z=u2-kept-value-4242"], "true");
    let keepers = crate::after::keepers_of(&home);
    assert_eq!(keepers.len(), 1, "{keepers:?}");
    let folder = home.item(&second)["folder"].as_str().unwrap().to_string();
    std::fs::remove_file(std::path::Path::new(&folder).join("keep.sock")).unwrap();
    // One keeper again: the new one, the old one ended (it held the value in memory).
    eventually(Duration::from_secs(20), || {
        let now = crate::after::keepers_of(&home);
        now.len() == 1 && now[0] != keepers[0]
    });
    assert!(!crate::util::alive(keepers[0]), "the old keeper lives on");
    gate.open();
    assert_eq!(home.wait_end(&second)["end"], "succeeded");
}

#[test]
fn issue26_u3_a_keeper_that_does_not_answer_when_its_item_starts_is_ended() {
    let home = Home::new();
    let (gate, _first, second) = waiting(&home, &["--env", "Z=u3-kept-value-4343"], "true");
    let keepers = crate::after::keepers_of(&home);
    assert_eq!(keepers.len(), 1, "{keepers:?}");
    std::process::Command::new("kill")
        .args(["-STOP", &keepers[0].to_string()])
        .status()
        .unwrap();
    gate.open();
    assert_eq!(home.wait_end(&second)["end"], "succeeded");
    eventually(Duration::from_secs(20), || {
        crate::after::keepers_of(&home).is_empty()
    });
}

#[test]
fn issue26_v3_two_restarts_of_one_item_at_once_start_one_item() {
    let home = Home::new();
    // Its stop takes the whole grace: the two calls overlap.
    let old = start(&home, &[], "trap '' TERM; sleep 60");
    let calls: Vec<_> = (0..2)
        .map(|_| {
            let command = home.command(&["--json", "restart", &old]);
            std::thread::spawn(move || crate::util::output_within(command, Duration::from_secs(60)))
        })
        .collect();
    let outputs: Vec<_> = calls.into_iter().map(|c| c.join().unwrap()).collect();
    let started: Vec<_> = outputs.iter().filter(|o| o.status.success()).collect();
    assert_eq!(started.len(), 1, "{outputs:?}");
    let refused = outputs.iter().find(|o| !o.status.success()).unwrap();
    let why = String::from_utf8_lossy(&refused.stdout);
    assert!(why.contains("being restarted by another call"), "{why}");
    let all = home.json(&["list", "--all"]);
    assert_eq!(all["items"].as_array().unwrap().len(), 2, "{all}");
    // A call just after it returned is the same click: refused, naming the new item.
    let new = started[0].stdout.clone();
    let new: Value = serde_json::from_slice(&new).unwrap();
    let new = new["id"].as_str().unwrap();
    let again = home.run(&["restart", &old]);
    assert_eq!(again.code, 1, "{}", again.stdout);
    assert!(
        again
            .stderr
            .contains(&format!("was restarted as {new} a moment ago")),
        "{}",
        again.stderr
    );
    // The new one is restarted as asked.
    let next = home.run(&["restart", new]);
    assert_eq!(next.code, 0, "{}", next.stderr);
}

#[test]
fn issue26_v4_first_calls_at_once_start_one_daemon_and_log_no_refusal() {
    let home = Home::new();
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let command = home.command(&["--json", "list"]);
            std::thread::spawn(move || crate::util::output_within(command, Duration::from_secs(30)))
        })
        .collect();
    for call in calls {
        let output = call.join().unwrap();
        assert!(output.status.success(), "{output:?}");
    }
    // The daemons that found another serving left without a word.
    let pid = home.daemon_pid();
    eventually(Duration::from_secs(10), || {
        crate::util::processes_of(home.path()) == vec![pid]
    });
    let log = std::fs::read_to_string(home.path().join("daemon.log")).unwrap_or_default();
    assert!(!log.contains("already serves"), "{log}");
}

#[test]
fn issue26_v10_runs_that_decide_at_once_promote_as_many_as_there_is_room_for() {
    let home = Home::new()
        .with("BGWORK_MAX_RUNNING", "2")
        .with("BGWORK_AUTO_BACKGROUND_S", "0.2");
    home.start("sleep 60");
    let project = tempfile::tempdir().unwrap();
    let step = project.path().join("step");
    let dir = project.path().display().to_string();
    // Usually longer than worth waiting for: `--timeout auto` backgrounds it at once.
    std::fs::write(&step, "sleep 0.4").unwrap();
    home.run(&["run", "--cwd", &dir, "--", "sh ./step"]);
    std::fs::write(&step, "sleep 30").unwrap();
    // Three at once, room for one more background job: one is backgrounded, the two
    // others wait in the foreground (none is killed at once).
    let (sender, receiver) = std::sync::mpsc::channel();
    for _ in 0..3 {
        let command = home.command(&[
            "--json",
            "run",
            "--cwd",
            &dir,
            "--timeout",
            "auto",
            "--",
            "sh ./step",
        ]);
        let sender = sender.clone();
        std::thread::spawn(move || {
            let out = crate::util::output_within(command, Duration::from_secs(90));
            let reply: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let _ = sender.send(reply["outcome"].as_str().unwrap_or("error").to_string());
        });
    }
    let first = receiver.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(first, "promoted");
    // The two others wait in the foreground (neither killed at once): stop them.
    assert!(receiver.recv_timeout(Duration::from_secs(2)).is_err());
    for item in home.json(&["list"])["items"].as_array().unwrap() {
        home.run(&["stop", item["id"].as_str().unwrap()]);
    }
    let rest: Vec<String> = (0..2)
        .map(|_| receiver.recv_timeout(Duration::from_secs(30)).unwrap())
        .collect();
    assert!(rest.iter().all(|o| o == "ended"), "{rest:?}");
}

#[test]
fn issue26_v11_work_that_starts_by_itself_is_not_told_to_stop_a_loop() {
    let home = Home::new().with("BGWORK_MAX_STARTS_PER_MINUTE", "2");
    let gate = Gate::new();
    let first = start(&home, &[], &gate.after_go("true"));
    start(&home, &[], "sleep 30");
    let waiting = home
        .run(&[
            "--json",
            "start",
            "--after",
            &format!("{first}:ended"),
            "--",
            "true",
        ])
        .json();
    let id = waiting["id"].as_str().unwrap().to_string();
    // Its start is the rate guard's third of the minute: refused for now.
    gate.open();
    let mut why = String::new();
    eventually(Duration::from_secs(20), || {
        why = home.item(&id)["waiting_for"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        why.contains("room to start")
    });
    assert!(why.contains("start-rate guard"), "{why}");
    assert!(!why.contains("is a loop starting work"), "{why}");
}

/// A run's stdin from a pipe: what the job has not taken when the run goes to the
/// background still reaches it, whole and in order, and its input ends when the pipe
/// does (it was cut at the promotion, and the job then waited for ever).
#[test]
fn issue26_v32_a_promoted_run_gets_the_rest_of_its_piped_stdin() {
    use std::io::Write;
    let home = Home::new();
    let gate = Gate::new();
    // The job reads nothing until the gate opens, well after the run's 1 s deadline.
    let command = gate.after_go(
        "awk '{ if ($1 != p+1) gaps++; p=$1 } END { print \"lines\", NR, \"gaps\", gaps+0 }'",
    );
    let mut run = piped_run(&home, &command);
    let mut stdin = run.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        // Far more than the pipes and the job's input queue hold, written as the job
        // takes it (after the run was promoted).
        let mut text = String::new();
        for n in 1..=400_000 {
            text.push_str(&format!("{n}\n"));
        }
        stdin.write_all(text.as_bytes()).unwrap();
        // Dropped: the pipe ends, and so must the job's input.
    });
    let id = promoted(run);
    gate.open();
    writer.join().unwrap();
    let ended = home.wait_end(&id);
    assert_eq!(ended["end"], "succeeded", "{ended}");
    let out = home.run(&["read", &id, "--all"]).stdout;
    assert!(out.contains("lines 400000 gaps 0"), "{out}");
}

/// A run whose caller is killed before the deadline is stopped as before, though its
/// piped stdin is passed on by a process of its own.
#[test]
fn issue26_v33_a_run_with_piped_stdin_whose_caller_is_killed_is_stopped() {
    let home = Home::new();
    let mut run = home
        .command(&["run", "--timeout", "60", "--", "cat"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Its pipe stays open: the end of it would be the job's end of input.
    let _held = run.stdin.take();
    let id = first_running(&home);
    run.kill().unwrap();
    let _ = run.wait();
    let ended = home.wait_end(&id);
    assert_eq!(ended["end"], "stopped_by_person", "{ended}");
}

/// The id of the session's first item, once it runs.
fn first_running(home: &Home) -> String {
    let mut id = String::new();
    eventually(Duration::from_secs(20), || {
        let list = home.json(&["list", "--all"]);
        match list["items"].as_array().unwrap().first() {
            Some(item) if item["state"] == "running" => {
                id = item["id"].as_str().unwrap().to_string();
                true
            }
            _ => false,
        }
    });
    id
}

/// The `bgwork run-feed` processes of this home still alive.
fn feeders_of(home: &Home) -> Vec<i32> {
    crate::util::bgwork_processes("run-feed", home.path())
}

/// `bgwork --json run --timeout 1 -- COMMAND`, spawned with a pipe for its stdin.
fn piped_run(home: &Home, command: &str) -> std::process::Child {
    home.command(&["--json", "run", "--timeout", "1", "--", command])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// The id of the job a piped run was promoted to, once the run returned.
fn promoted(run: std::process::Child) -> String {
    let output = run.wait_with_output().unwrap();
    let reply: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(reply["outcome"], "promoted", "{reply}");
    reply["id"].as_str().unwrap().to_string()
}

/// A promoted run's feeder whose pipe stays open and quiet goes when the job ends (it
/// spun on the connection's hang-up for as long as the pipe lived).
#[test]
fn issue26_v34_a_feeder_goes_when_its_job_ends_though_its_pipe_stays_open() {
    let home = Home::new();
    let mut run = piped_run(&home, "sleep 2");
    let held = run.stdin.take();
    let id = promoted(run);
    assert_eq!(feeders_of(&home).len(), 1, "a feeder passes the pipe on");
    home.wait_end(&id);
    eventually(Duration::from_secs(10), || feeders_of(&home).is_empty());
    drop(held);
}

/// A restart refused for what its new item would show leaves the running item running
/// (it was stopped first, and nothing replaced it).
#[test]
fn issue26_v35_a_refused_restart_stops_nothing() {
    let value = "hunter2-Very-Secret-99";
    let home = Home::new();
    let id = home.start_with(&["--env", "K=abc"], &format!("sleep 100 # {value}"));
    let (code, _, message) = home.error(&["restart", &id, "--env", &format!("K={value}")]);
    assert_eq!(code, 2, "{message}");
    assert!(message.contains("nothing was started"), "{message}");
    assert_eq!(
        home.item(&id)["state"],
        "running",
        "the old item was stopped"
    );
}

/// A monitor's and a waiting item's end quote their path or pattern with token shapes
/// masked, in the notice and the report alike.
#[test]
fn issue26_v36_ends_that_quote_a_pattern_or_path_mask_token_shapes() {
    let home = Home::new();
    let token = format!("ghp_{}", "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3z5A");
    let monitor = home.json(&[
        "monitor",
        "wait",
        "--until-file",
        &format!("/tmp/none-{token}"),
        "--timeout",
        "1",
    ]);
    let awaited = home.start_with(&[], "sleep 30");
    let waiting = home.start_with(&["--after", &format!("{awaited}:output {token}")], "true");
    home.json(&["stop", &awaited]);
    // A `wait` that shows an end delivers its notice: the ends as `wait` tells them.
    let failed = home.wait_end(monitor["id"].as_str().unwrap()).to_string();
    let ended = home.wait_end(&waiting);
    assert_eq!(ended["end"], "cancelled", "{ended}");
    let cancelled = ended.to_string();
    let listed = home.json(&["list", "--all"]).to_string();
    for shown in [&failed, &cancelled, &listed] {
        assert!(!shown.contains(&token), "{shown}");
    }
    for shown in [&failed, &cancelled] {
        assert!(shown.contains("[secret github token]"), "{shown}");
    }
}

/// A daemon stopped while a promoted run's stdin is being passed on: what it took
/// reaches the job before it goes, the feeder passes the rest to the daemon that takes
/// the job back, and the job's input ends with the pipe (the rest was lost, and input
/// sent as the daemon went too, and the job waited for ever).
#[test]
fn issue26_v37_a_daemon_restart_while_a_feeder_passes_stdin_loses_none_of_it() {
    use std::io::Write;
    let home = Home::new();
    let mut run = piped_run(&home, "while read l; do echo got $l; done; echo EOF");
    let mut stdin = run.stdin.take().unwrap();
    stdin.write_all(b"line1\nline2\n").unwrap();
    let id = promoted(run);
    stdin.write_all(b"line3\n").unwrap();
    eventually(Duration::from_secs(20), || {
        home.run(&["read", &id, "--all"])
            .stdout
            .contains("got line3")
    });
    home.json(&["shutdown"]);
    // Sent as the daemon goes (its connection still open), then once it is gone.
    stdin.write_all(b"line4\n").unwrap();
    eventually(Duration::from_secs(10), || {
        std::os::unix::net::UnixStream::connect(home.socket()).is_err()
    });
    stdin.write_all(b"line5\n").unwrap();
    drop(stdin);
    let ended = home.wait_end(&id);
    assert_eq!(ended["end"], "succeeded", "{ended}");
    let out = home.run(&["read", &id, "--all"]).stdout;
    assert!(
        out.contains("got line1\ngot line2\ngot line3\ngot line4\ngot line5\nEOF"),
        "{out}"
    );
}

/// `shutdown --stop-work` while a promoted run's pipe stays open: the feeder goes with
/// the job it stopped, and no daemon is started again to pass the rest on (one was,
/// and stayed up with no work).
#[test]
fn issue26_x27_a_feeder_whose_job_shutdown_stopped_starts_no_daemon() {
    use std::io::Write;
    let home = Home::new();
    let mut run = piped_run(&home, "cat; sleep 300");
    let mut stdin = run.stdin.take().unwrap();
    stdin.write_all(b"one\n").unwrap();
    let id = promoted(run);
    assert_eq!(feeders_of(&home).len(), 1);
    let daemon = crate::util::bgwork_processes("daemon", home.path());
    assert_eq!(daemon.len(), 1, "{daemon:?}");
    let said = home.json(&["shutdown", "--stop-work"]);
    assert!(
        said["message"]
            .as_str()
            .unwrap()
            .contains("1 running item stopped"),
        "{said}"
    );
    eventually(Duration::from_secs(10), || feeders_of(&home).is_empty());
    // The pipe is still open (its reader gone: the write may fail), and no daemon
    // came back.
    let _ = stdin.write_all(b"two\n");
    eventually(Duration::from_secs(10), || {
        crate::util::bgwork_processes("daemon", home.path()).is_empty()
    });
    assert!(
        std::os::unix::net::UnixStream::connect(home.socket()).is_err(),
        "a daemon answers after shutdown --stop-work"
    );
    drop(stdin);
    let ended = home.wait_end(&id);
    assert_eq!(ended["end"], "stopped_by_agent", "{ended}");
}

/// A graceful shutdown while a promoted run's job reads none of its input and more of
/// it waits than the job's queue holds: the daemon gives back what the job did not
/// take, the feeder sends it and the rest to the next daemon (waiting while the job's
/// queue is full), and the job gets every line once, in order, then its end of input
/// (the rest was lost and the job waited for input for ever).
#[test]
fn issue26_z1_a_shutdown_while_a_job_is_behind_on_its_input_loses_none_of_it() {
    use std::io::Write;
    let home = Home::new();
    let gate = Gate::new();
    let out = gate.path("out");
    let job = gate.after_go(&format!("cat > '{}'; echo EOF", out.display()));
    let mut run = piped_run(&home, &job);
    let mut stdin = run.stdin.take().unwrap();
    let lines = 1_500_000; // 10.9 MB: more than the job's 8 MiB queue
    let all: String = (1..=lines).map(|n| format!("{n}\n")).collect();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(all.as_bytes());
    });
    let id = promoted(run);
    // The job's queue fills; the rest waits in the feeder's connection.
    eventually(Duration::from_secs(20), || {
        home.item(&id)["state"] == "running" && feeders_of(&home).len() == 1
    });
    let daemon = home.daemon_pid();
    home.json(&["shutdown"]);
    // The feeder starts the next daemon at once: the old one is waited for by its pid.
    eventually(Duration::from_secs(15), || !crate::util::alive(daemon));
    gate.open();
    let ended = home.wait_end(&id);
    writer.join().unwrap();
    assert_eq!(ended["end"], "succeeded", "{ended}");
    let got = std::fs::read_to_string(&out).unwrap();
    let expected: String = (1..=lines).map(|n| format!("{n}\n")).collect();
    if got != expected {
        let have = got.lines().count();
        let first_wrong = got.lines().zip(expected.lines()).position(|(a, b)| a != b);
        panic!("{have} lines of {lines}; first wrong at {first_wrong:?}");
    }
}

/// `shutdown --stop-work` while a fast producer fills a promoted run's connection:
/// the feeder whose write is refused goes with the stopped job, and no daemon is
/// started again (one was, 6 times in 8).
#[test]
fn issue26_z2_a_fast_producer_s_feeder_starts_no_daemon_after_stop_work() {
    let home = Home::new();
    let mut run = piped_run(&home, "cat > /dev/null");
    let mut stdin = run.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let block = vec![b'z'; 64 << 10];
        while stdin.write_all(&block).is_ok() {}
    });
    let id = promoted(run);
    home.json(&["shutdown", "--stop-work"]);
    eventually(Duration::from_secs(15), || feeders_of(&home).is_empty());
    writer.join().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !crate::util::bgwork_processes("daemon", home.path()).is_empty() {
        if std::time::Instant::now() > deadline {
            let log = std::fs::read_to_string(home.path().join("daemon.log")).unwrap();
            panic!("a daemon is up: {log}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        std::os::unix::net::UnixStream::connect(home.socket()).is_err(),
        "a daemon answers after shutdown --stop-work"
    );
    let ended = home.wait_end(&id);
    assert_eq!(ended["end"], "stopped_by_agent", "{ended}");
}

/// 24 MiB of bytes of every value, in a file of `dir`: a promoted run's stdin, three
/// times what a job's input queue holds.
fn binary_input(dir: &std::path::Path) -> (std::path::PathBuf, Vec<u8>) {
    let bytes: Vec<u8> = (0..24u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let path = dir.join("input");
    std::fs::write(&path, &bytes).unwrap();
    (path, bytes)
}

/// A job that copies its stdin into `out`, 64 KiB every 10 ms (about 6 MB/s).
fn slow_copy(out: &std::path::Path) -> String {
    format!(
        "perl -e 'binmode STDIN; binmode STDOUT; $|=1; \
         while (read(STDIN, $b, 65536)) {{ print $b; select(undef, undef, undef, 0.01) }}' > '{}'",
        out.display()
    )
}

/// A promoted run of `command` with `input` as its stdin: the job's id.
fn promoted_with_file(home: &Home, command: &str, input: &std::path::Path) -> String {
    let run = home
        .command(&["--json", "run", "--timeout", "1", "--", command])
        .stdin(std::fs::File::open(input).unwrap())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    promoted(run)
}

/// Calls `restart` each time the job has copied another MiB, `times` times or until it
/// ends.
fn restarts_while_it_copies(
    home: &Home,
    id: &str,
    out: &std::path::Path,
    times: usize,
    restart: impl Fn(),
) {
    let size = || std::fs::metadata(out).map_or(0, |m| m.len());
    for _ in 0..times {
        let before = size();
        let mut ended = false;
        eventually(Duration::from_secs(30), || {
            ended = home.item(id)["state"] == "ended";
            ended || size() > before + (1 << 20)
        });
        if ended {
            break;
        }
        restart();
    }
}

/// A feeder that passes the rest with `send` after one restart went silently at the
/// next when that daemon closed with its `send` unread: the rest of the input was lost
/// and the job's input never ended (11 of 12 runs). Each graceful restart now answers
/// a `send` it read, and one it left unread is asked of the next daemon.
#[test]
fn issue26_z4_stdin_passes_whole_through_one_graceful_restart_after_another() {
    let home = Home::new();
    let dir = tempfile::tempdir().unwrap();
    let (input, bytes) = binary_input(dir.path());
    let out = dir.path().join("out");
    let id = promoted_with_file(&home, &slow_copy(&out), &input);
    restarts_while_it_copies(&home, &id, &out, 6, || {
        home.json(&["shutdown"]);
        home.start_daemon();
    });
    let ended = home.wait_end(&id);
    assert_eq!(ended["end"], "succeeded", "{ended}");
    let copied = std::fs::read(&out).unwrap();
    assert_eq!(copied.len(), bytes.len(), "bytes lost or doubled");
    assert!(copied == bytes, "the job's input differs from the caller's");
    eventually(Duration::from_secs(10), || feeders_of(&home).is_empty());
}

/// The same with the daemon killed (`kill -9`): what a killed daemon held may be lost,
/// as the contract says, but the feeder goes on with the next daemon and the job's
/// input still ends (the feeder went at the first failed `send`, and the job waited for
/// ever).
#[test]
fn issue26_z5_a_feeder_goes_on_after_each_killed_daemon_and_the_input_ends() {
    let home = Home::new();
    let dir = tempfile::tempdir().unwrap();
    let (input, bytes) = binary_input(dir.path());
    let out = dir.path().join("out");
    let id = promoted_with_file(&home, &slow_copy(&out), &input);
    restarts_while_it_copies(&home, &id, &out, 3, || {
        home.kill_daemon();
        home.start_daemon();
    });
    let ended = home.wait_end(&id);
    assert_eq!(ended["end"], "succeeded", "{ended}");
    let copied = std::fs::metadata(&out).unwrap().len();
    assert!(
        copied as usize <= bytes.len() && copied as usize >= bytes.len() - (3 << 20),
        "{copied} of {} bytes reached the job",
        bytes.len()
    );
}

/// SIGINT to a `run` (its pid alone) whose job reads none of its stdin: its feeder,
/// blocked writing input the daemon did not read, held the connection open, so the
/// daemon never saw the caller go and promoted the job at its deadline as if the caller
/// were there. The feeder now goes with its `run`, and the job is stopped as the person.
#[test]
fn issue26_z6_a_run_killed_while_its_job_reads_no_input_stops_it() {
    let home = Home::new();
    let dir = tempfile::tempdir().unwrap();
    let (input, _) = binary_input(dir.path());
    let mut run = home
        .command(&["run", "--timeout", "60", "--", "sleep 60"])
        .stdin(std::fs::File::open(&input).unwrap())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let id = first_running(&home);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let _ = run.wait();
    let ended = home.wait_end(&id);
    assert_eq!(ended["end"], "stopped_by_person", "{ended}");
    eventually(Duration::from_secs(10), || feeders_of(&home).is_empty());
    let notices = home.json(&["notices"]);
    assert!(
        notices["notices"].as_array().unwrap().is_empty(),
        "a run its caller stopped has no notice: {notices}"
    );
}

/// `shutdown --stop-work` while a feeder passes the rest with `send` (after an earlier
/// restart): the feeder asked its unread `send` again, starting a daemon, before it
/// heard that the job had ended, and that daemon stayed up with no work (6 of 6). The
/// feeder now looks at the job's folder first: a job that ended there starts no daemon.
#[test]
fn issue26_z7_stop_work_while_a_feeder_sends_leaves_no_daemon() {
    let home = Home::new();
    let dir = tempfile::tempdir().unwrap();
    let (input, _) = binary_input(dir.path());
    let out = dir.path().join("out");
    let id = promoted_with_file(&home, &slow_copy(&out), &input);
    let size = || std::fs::metadata(&out).map_or(0, |m| m.len());
    eventually(Duration::from_secs(30), || size() > 1 << 20);
    home.json(&["shutdown"]);
    home.start_daemon();
    // The next MiB reached the job through the feeder's `send`s.
    let before = size();
    eventually(Duration::from_secs(30), || size() > before + (1 << 20));
    assert_eq!(home.item(&id)["state"], "running");
    let said = home.json(&["shutdown", "--stop-work"]);
    assert!(
        said["message"]
            .as_str()
            .unwrap()
            .contains("1 running item stopped"),
        "{said}"
    );
    eventually(Duration::from_secs(15), || feeders_of(&home).is_empty());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !crate::util::bgwork_processes("daemon", home.path()).is_empty() {
        if std::time::Instant::now() > deadline {
            let log = std::fs::read_to_string(home.path().join("daemon.log")).unwrap();
            panic!("a daemon is up after shutdown --stop-work: {log}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        std::os::unix::net::UnixStream::connect(home.socket()).is_err(),
        "a daemon answers after shutdown --stop-work"
    );
    let ended = home.wait_end(&id);
    assert_eq!(ended["end"], "stopped_by_agent", "{ended}");
}

/// A pattern that lies more than 64 KiB into one line: `--after ID:output`, `monitor
/// wait --until-output` and `wait --until` looked at a line's first 64 KiB only, so the
/// waiting item was cancelled ("ended without printing MARK"), the monitor failed and
/// the wait timed out (5 of 5 lines past 64 KiB), though `read --grep` found it.
#[test]
fn issue26_aa1_a_pattern_far_into_one_long_line_is_seen_by_every_line_matcher() {
    let home = Home::new();
    let gate = Gate::new();
    let job = gate.after_go("head -c 200000 /dev/zero | tr '\\0' y; echo MARK; exit 0");
    let id = home.start(&job);
    let waiter = home.start_reply(&["--after", &format!("{id}:output MARK")], "echo ran");
    let waiter = waiter["id"].as_str().unwrap().to_string();
    let monitor = home.json(&["monitor", "wait", "--until-output", &id, "MARK"]);
    let monitor = monitor["id"].as_str().unwrap().to_string();
    let wait = home
        .command(&[
            "--json",
            "wait",
            &id,
            "--until",
            "yMARK$",
            "--timeout",
            "30",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // (A wait looks at the output this session has not read: it may start at any time.)
    gate.open();
    let waited = crate::util::finish_within(wait, Duration::from_secs(40));
    let reply: serde_json::Value = serde_json::from_slice(&waited.stdout).unwrap();
    assert_eq!(reply["reason"], "matched", "{reply}");
    assert!(waited.status.success(), "{reply}");
    assert_eq!(home.wait_end(&id)["end"], "succeeded");
    let ran = home.wait_end(&waiter);
    assert_eq!(ran["end"], "succeeded", "{ran}");
    let watched = home.wait_end(&monitor);
    assert_eq!(watched["end"], "succeeded", "{watched}");
    // Once it ended, a new waiter on the same line starts at once, not refused.
    let again = home.start_reply(&["--after", &format!("{id}:output MARK")], "true");
    assert!(again["id"].is_string(), "{again}");
    // A line's start is its own: a piece of it is not matched as one.
    let (code, _, err) = home.error(&[
        "start",
        "--after",
        &format!("{id}:output ^yMARK"),
        "--",
        "true",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("can never hold"), "{err}");
}

/// y6: a request that does not apply to the item it names (of its kind, or in its
/// state) is refused with exit 1 and the code `refused`, in every command; a command
/// line that is wrong whatever the items are is a usage error (exit 2).
#[test]
fn issue26_y6_refusals_of_an_item_exit_1_in_every_command() {
    let home = Home::new();
    let running = start(&home, &[], "exec sleep 1000");
    let done = start(&home, &[], "exit 3");
    home.wait_end(&done);
    let monitor = home.json(&["monitor", "wait", "--until-output", &running, "NEVER"]);
    let monitor = monitor["id"].as_str().unwrap().to_string();
    let restarting = restarting(&home, "exit 1");
    let refusals: Vec<Vec<String>> = [
        vec!["dismiss", &running],
        vec!["restart", &monitor],
        vec!["close", &running],
        vec!["read", &running, "--screen"],
        vec!["monitor", "wait", "--until-port", "--of", &monitor],
        vec![
            "start",
            "--after",
            &format!("{done}:succeeded"),
            "--",
            "true",
        ],
        vec!["start", "--after", &format!("{monitor}:port"), "--", "true"],
        vec!["send", &restarting, "hello"],
        vec!["stop", "bg-999"],
    ]
    .iter()
    .map(|args| args.iter().map(|a| a.to_string()).collect())
    .collect();
    for args in &refusals {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (exit, code, message) = home.error(&args);
        assert_eq!(exit, 1, "{args:?}: {code} {message}");
        assert!(
            ["refused", "not_running", "unknown_id"].contains(&code.as_str()),
            "{args:?}: {code} {message}"
        );
        assert!(!message.is_empty(), "{args:?}");
    }
    // Wrong whatever the items are: a usage error.
    assert_eq!(home.run(&["dismiss"]).code, 2);
    for args in [
        vec!["start", "--after", "bg-1:sometime", "--", "true"],
        vec!["wait", &running, "--until", "("],
    ] {
        let (exit, code, message) = home.error(&args);
        assert_eq!(
            (exit, code.as_str()),
            (2, "bad_request"),
            "{args:?}: {message}"
        );
    }
    home.run(&["stop", &running]);
}

/// y6: a refused setting is said as it was written, not as it was read (`1e400` is
/// not echoed as `inf`, `0x10` not as something else).
#[test]
fn issue26_y6_a_refused_setting_is_echoed_as_written() {
    let home = Home::new()
        .with("BGWORK_OVERRUN_MARGIN_S", "1e400")
        .with("BGWORK_MAX_CONNECTIONS", "0");
    home.start_daemon();
    let status = home.json(&["status"]);
    let refused: Vec<String> = status["settings_refused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect();
    assert_eq!(refused.len(), 2, "{status}");
    assert!(
        refused
            .iter()
            .any(|s| s.starts_with("BGWORK_OVERRUN_MARGIN_S=\"1e400\" is over a day")),
        "{refused:?}"
    );
    assert!(
        refused
            .iter()
            .any(|s| s.starts_with("BGWORK_MAX_CONNECTIONS=\"0\" is below its least value 1")),
        "{refused:?}"
    );
    assert!(!refused.iter().any(|s| s.contains("inf")), "{refused:?}");
}

/// z3: a negative number given to an option is said as such, with the command's usage;
/// clap's own tip (`-- -1`) would make the number the command to run.
#[test]
fn issue26_z3_a_negative_number_for_an_option_names_the_option() {
    let home = Home::new();
    for (args, flag) in [
        (vec!["run", "--timeout", "-1", "--", "true"], "--timeout -1"),
        (vec!["wait", "bg-1", "--timeout", "-1.5"], "--timeout -1.5"),
        (vec!["stop", "bg-1", "--grace", "-3"], "--grace -3"),
        (vec!["read", "bg-1", "--tail", "-5"], "--tail -5"),
    ] {
        let run = home.run(&args);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(
            run.stderr
                .contains(&format!("{flag}: a negative number is no value of")),
            "{args:?}: {}",
            run.stderr
        );
        assert!(!run.stderr.contains("-- -"), "{args:?}: {}", run.stderr);
        assert!(
            run.stderr.contains("Usage: bgwork"),
            "{args:?}: {}",
            run.stderr
        );
    }
}

/// ab1: a token that a long line's piece starts inside is masked for every line
/// matcher (neither shown in what matched nor matched by its characters), no piece's
/// end is taken for the line's end, and an ended item's output is looked at whole
/// before its end is reported.
#[test]
fn issue26_ab1_long_line_pieces_hide_cut_tokens_and_end_nowhere_but_the_line_s_end() {
    let home = Home::new();
    let dir = tempfile::tempdir().unwrap();
    // The second piece of a long line starts at 122,880: two bytes into the token.
    let token = "ghp_Abcdefghij0123456789KLMNOPQRSTuvwxyz4242";
    let mut line = vec![b'y'; 300_000];
    line[122_877] = b' ';
    line[122_878..122_878 + token.len()].copy_from_slice(token.as_bytes());
    line[122_878 + token.len()] = b' ';
    line[140_000..140_004].copy_from_slice(b"MARK");
    *line.last_mut().unwrap() = b'Z';
    line.push(b'\n');
    let file = dir.path().join("line");
    std::fs::write(&file, &line).unwrap();
    let id = home.start(&format!("cat {}; exec sleep 600", file.display()));
    let wait = |pattern: &str, timeout: &str| -> Value {
        home.run(&[
            "--json",
            "wait",
            &id,
            "--until",
            pattern,
            "--timeout",
            timeout,
        ])
        .json()
    };
    let matched = wait("MARK", "30");
    assert_eq!(matched["reason"], "matched");
    let text = matched["match"].as_str().unwrap();
    assert!(!text.contains("hp_Abcdefghij"), "the token's tail shown");
    assert!(text.contains("[secret token]"), "{}", &text[..200]);
    for pattern in [
        "Abcdefghij0123456789",
        "hp_Abcdefghij0123",
        "y$",
        r"\byyyyZ",
    ] {
        let reply = wait(pattern, "1");
        assert_eq!(reply["reason"], "timeout", "{pattern}");
    }
    assert_eq!(wait("yZ$", "30")["reason"], "matched");
    let monitor = home.json(&["monitor", "wait", "--until-output", &id, "hp_Abcdefghij"]);
    let monitor = monitor["id"].as_str().unwrap().to_string();
    home.run(&["stop", &id]);
    let watched = home.wait_end(&monitor);
    assert_ne!(watched["end"], "succeeded", "{watched}");
    // An ended item with 10 MB of output and the line last: matched, not ended.
    let lines = dir.path().join("lines");
    let mut text = "a line of output\n".repeat(600_000);
    text.push_str("THE-LAST-LINE\n");
    std::fs::write(&lines, text).unwrap();
    let ended = home.start(&format!("cat {}", lines.display()));
    home.wait_end(&ended);
    let reply = home
        .run(&[
            "--json",
            "wait",
            &ended,
            "--until",
            "THE-LAST-LINE",
            "--timeout",
            "30",
        ])
        .json();
    assert_eq!(reply["reason"], "matched", "{reply}");
    // And one whose last line, over 64 KiB, never ended.
    let unended = dir.path().join("unended");
    let mut bytes = vec![b'z'; 130_000];
    bytes.extend_from_slice(b"LAST");
    std::fs::write(&unended, bytes).unwrap();
    let ended = home.start(&format!("cat {}", unended.display()));
    home.wait_end(&ended);
    let reply = home
        .run(&[
            "--json",
            "wait",
            &ended,
            "--until",
            "LAST$",
            "--timeout",
            "30",
        ])
        .json();
    assert_eq!(reply["reason"], "matched");
}

//! Issue 26 item 5: restart policies (`start --restart on-failure [--max-restarts N]
//! [--backoff MIN..MAX]`), through the real binary, a real daemon and MCP.

use crate::mcp::Mcp;
use crate::util::{alive, eventually, Home};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const MARKER: &str = "run again, restart";

/// The item, from `list --all` (which delivers no notice).
fn listed(home: &Home, id: &str) -> Value {
    home.item(id)
}

/// Waits until `id` has ended, looking through `list` (a `wait` would take its notice).
fn ended(home: &Home, id: &str) -> Value {
    let mut item = Value::Null;
    eventually(Duration::from_secs(40), || {
        item = listed(home, id);
        item["state"] == "ended"
    });
    item
}

/// The whole log as `read` shows it, from its first byte (the cursor is not moved).
fn log(home: &Home, id: &str) -> String {
    let reply = home.json(&["read", id, "--from", "0"]);
    reply["output"].as_str().unwrap().to_string()
}

fn restart_of(item: &Value) -> &Value {
    &item["restart"]
}

/// Starts `command` with a restart policy of back-off `backoff` and waits until it
/// waits out its first back-off; its id and its listed item then.
fn restarting(home: &Home, backoff: &str, command: &str) -> (String, Value) {
    let id = home.start_with(&["--restart", "on-failure", "--backoff", backoff], command);
    let mut item = Value::Null;
    eventually(Duration::from_secs(20), || {
        item = listed(home, &id);
        item["state"] == "restarting"
    });
    (id, item)
}

#[test]
fn issue26_5_a_failing_job_restarts_as_the_same_item_and_gives_up_with_one_notice() {
    let home = Home::new();
    let id = home.start_restarting(
        "2",
        "100ms..200ms",
        &["--env", "TOKEN=supersecretvalue123"],
        "echo \"run $TOKEN\"; exit 3",
    );
    let item = ended(&home, &id);
    assert_eq!(item["end"], "failed", "{item}");
    assert_eq!(item["exit_code"], 3);
    assert_eq!(restart_of(&item)["restarts"], 2, "{item}");
    assert_eq!(restart_of(&item)["max_restarts"], 2);
    assert_eq!(restart_of(&item)["last_end"], "failed");
    assert!(
        item["report"]
            .as_str()
            .unwrap()
            .contains("gave up after 2 of 2 restarts"),
        "{item}"
    );
    // One notice, at the end, though it was not started with --notify (read before
    // the log: a read that shows the end delivers it).
    let notices = home.json(&["notices"]);
    let notices = notices["notices"].as_array().unwrap();
    assert_eq!(notices.len(), 1, "{notices:?}");
    let notice = notices[0]["text"].as_str().unwrap();
    assert!(
        notice.contains(&format!(
            "{id} FAILED (exit 3): gave up after 2 of 2 restarts"
        )),
        "{notice}"
    );
    assert!(notices[0]["tail"]
        .as_str()
        .unwrap()
        .contains("run [secret TOKEN]"));
    assert_eq!(home.json(&["notices"])["notices"], json!([]), "once");
    // Three runs in one log, each with its environment (masked), a marker before each
    // start again; the value itself nowhere.
    let text = log(&home, &id);
    assert_eq!(text.matches("run [secret TOKEN]").count(), 3, "{text}");
    assert_eq!(text.matches(MARKER).count(), 2, "{text}");
    assert!(!text.contains("supersecretvalue123"), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[1].contains(&format!("{id} {MARKER} 1 of 2")),
        "{text}"
    );
    assert!(
        lines[3].contains(&format!("{id} {MARKER} 2 of 2")),
        "{text}"
    );
    // Every run's end is in the history.
    let history = home.json(&["history", "--", "echo \"run $TOKEN\"; exit 3"]);
    let command = &history["commands"][0];
    assert_eq!(command["runs"], 3, "{history}");
    for run in command["last"].as_array().unwrap() {
        assert_eq!(run["end"], "failed");
        assert_eq!(run["id"], id.as_str());
    }
}

#[test]
fn issue26_5_each_restart_shows_in_list_status_and_the_log_marker_misleads_no_reader() {
    let home = Home::new();
    let (id, item) = restarting(&home, "2s..4s", "echo hello; exit 1");
    let restart = restart_of(&item);
    assert_eq!(restart["restarts"], 0, "{item}");
    assert_eq!(restart["max_restarts"], 5, "the default");
    assert_eq!(restart["backoff"], "2s..4s");
    assert_eq!(restart["last_end"], "failed");
    assert_eq!(restart["last_exit_code"], 1);
    assert!(restart["next_attempt_at"].is_string(), "{item}");
    assert!(item["pid"].is_null(), "nothing runs while it waits: {item}");
    assert!(item["end"].is_null());
    let status = home.json(&["status"]);
    assert_eq!(
        status["restarting"],
        json!([format!("test/{id}: restarted 0 of 5 times")]),
        "{status}"
    );
    let text = home.run(&["list"]).stdout;
    assert!(text.contains("restarting"), "{text}");
    assert!(
        text.contains("restarted 0 of 5 times") && text.contains("last run failed (1)"),
        "{text}"
    );
    assert!(text.contains("next start in"), "{text}");
    eventually(Duration::from_secs(20), || {
        restart_of(&listed(&home, &id))["restarts"] == 1
            && log(&home, &id).matches("hello").count() == 2
    });
    // The marker is a line of its own that names no end: a wait for the job's own
    // words, scanning from the first byte, does not take it for them.
    let waited = home
        .run(&[
            "--json",
            "wait",
            &id,
            "--until",
            "FAILED|[Ee]rror|exit",
            "--timeout",
            "1",
        ])
        .json();
    assert_eq!(waited["reason"], "timeout", "{waited}");
    let found = home.json(&["read", &id, "--grep", "hello"]);
    let lines: Vec<i64> = found["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["line"].as_i64().unwrap())
        .collect();
    assert_eq!(lines, [1, 3], "{found}");
    let text = log(&home, &id);
    assert!(text.starts_with("hello\n[bgwork: "), "{text}");
    // An incremental read after the restart goes on where the last one stopped.
    let first = home.json(&["read", &id]);
    assert!(first["output"].as_str().unwrap().contains(MARKER));
    eventually(Duration::from_secs(20), || {
        restart_of(&listed(&home, &id))["restarts"] == 2
    });
    let next = home.json(&["read", &id]);
    let next = next["output"].as_str().unwrap();
    assert!(next.starts_with("[bgwork: "), "{next}");
    assert!(
        next.contains("restart 2 of 5") && !next.contains("restart 1 of 5"),
        "{next}"
    );
    home.json(&["stop", &id]);
}

#[test]
fn issue26_5_a_stop_during_the_back_off_ends_it_stopped_and_it_never_starts_again() {
    let home = Home::new();
    let id = home.start_with(
        &["--restart", "on-failure", "--backoff", "1500ms"],
        "echo once; exit 2",
    );
    eventually(Duration::from_secs(20), || {
        listed(&home, &id)["state"] == "restarting"
    });
    let stopped = home.json(&["stop", &id]);
    assert_eq!(stopped["end"], "stopped_by_agent", "{stopped}");
    assert_eq!(stopped["state"], "ended");
    // Past the back-off, nothing has started.
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        let text = log(&home, &id);
        assert!(!text.contains(MARKER), "started again after a stop: {text}");
        assert_eq!(listed(&home, &id)["end"], "stopped_by_agent");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(restart_of(&listed(&home, &id))["restarts"], 0);
    assert_eq!(
        home.json(&["notices"])["notices"],
        json!([]),
        "an agent's stop"
    );
    // One run, which failed: the stop ended no run (none ran), so it adds none.
    let history = home.json(&["history", "--", "echo once; exit 2"]);
    let command = &history["commands"][0];
    assert_eq!(command["runs"], 1, "{history}");
    assert_eq!(command["last"][0]["end"], "failed", "{history}");
}

#[test]
fn issue26_5_stops_successes_and_the_runtime_limit_never_restart() {
    let home = Home::new();
    let options = ["--restart", "on-failure", "--backoff", "100ms"];
    let stopped = home.start_with(&options, "echo up; exec sleep 60");
    let pid = listed(&home, &stopped)["pid"].as_i64().unwrap() as i32;
    home.json(&["stop", &stopped, "--as", "person"]);
    let succeeded = home.start_with(&options, "echo fine; exit 0");
    let limited = [&options[..], &["--max-runtime", "1s"]].concat();
    let limited = home.start_with(&limited, "exec sleep 60");
    for (id, end) in [
        (&stopped, "stopped_by_person"),
        (&succeeded, "succeeded"),
        (&limited, "stopped_by_agent"),
    ] {
        let item = ended(&home, id);
        assert_eq!(item["end"], end, "{item}");
        assert_eq!(restart_of(&item)["restarts"], 0, "{item}");
        assert!(!log(&home, id).contains(MARKER));
    }
    assert!(!alive(pid));
    // The person's stop is told (as without a policy); nothing says "gave up".
    let notices = home.json(&["notices"]);
    for notice in notices["notices"].as_array().unwrap() {
        assert!(
            !notice["text"].as_str().unwrap().contains("gave up"),
            "{notice}"
        );
    }
    // `restart ID` of such an item gives the new one the same policy.
    let again = home.json(&["restart", &succeeded, "--window", "0"]);
    assert_eq!(again["restart"]["backoff"], "100ms..100ms", "{again}");
    assert_eq!(again["restart"]["max_restarts"], 5);
}

#[test]
fn issue26_5_restarts_survive_a_daemon_kill_during_the_back_off_and_while_running() {
    let home = Home::new();
    let id = home.start_restarting("2", "1500ms", &[], "echo \"run $$\"; sleep 1; exit 4");
    eventually(Duration::from_secs(20), || {
        listed(&home, &id)["state"] == "restarting"
    });
    home.kill_daemon();
    // A new daemon goes on from the record: the restart comes, once.
    let mut item = Value::Null;
    eventually(Duration::from_secs(20), || {
        item = listed(&home, &id);
        item["state"] == "running" && restart_of(&item)["restarts"] == 1
    });
    home.kill_daemon();
    let item = ended(&home, &id);
    assert_eq!(item["end"], "failed", "{item}");
    assert_eq!(item["exit_code"], 4);
    assert_eq!(restart_of(&item)["restarts"], 2, "{item}");
    let notices = home.json(&["notices"]);
    assert_eq!(notices["notices"].as_array().unwrap().len(), 1, "{notices}");
    let text = log(&home, &id);
    assert_eq!(
        text.lines().filter(|l| l.starts_with("run ")).count(),
        3,
        "no start twice, none lost: {text}"
    );
    assert_eq!(text.matches(MARKER).count(), 2, "{text}");
    let history = home.json(&["history", "--", "echo \"run $$\"; sleep 1; exit 4"]);
    assert_eq!(history["commands"][0]["runs"], 3, "{history}");
}

#[test]
fn issue26_5_a_restart_counts_as_a_start_and_a_refused_one_waits_its_turn() {
    let home = Home::new().with("BGWORK_MAX_STARTS_PER_MINUTE", "2");
    let id = home.start_with(
        &["--restart", "on-failure", "--backoff", "200ms"],
        "echo try; exit 1",
    );
    // Its start and its first restart spend the rate; the second restart is refused
    // and waits (shown), with the run it would start not lost.
    let mut item = Value::Null;
    eventually(Duration::from_secs(20), || {
        item = listed(&home, &id);
        restart_of(&item)["refused"].is_string()
    });
    assert_eq!(item["state"], "restarting", "{item}");
    assert_eq!(restart_of(&item)["restarts"], 1, "{item}");
    let refused = restart_of(&item)["refused"].as_str().unwrap();
    assert!(
        refused.contains("BGWORK_MAX_STARTS_PER_MINUTE"),
        "{refused}"
    );
    let (_, code, _) = home.error(&["start", "--", "true"]);
    assert_eq!(code, "limit", "the restart counted toward the rate");
    home.json(&["stop", &id]);
    assert_eq!(log(&home, &id).matches("try").count(), 2);
}

#[test]
fn issue26_5_bad_policies_are_refused_with_the_fix() {
    let home = Home::new();
    let refused = |args: &[&str], words: &str| {
        let mut all = vec!["start", "--restart", "on-failure"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--", "exit 1"]);
        let (_, code, message) = home.error(&all);
        assert_eq!(code, "bad_request", "{args:?}: {message}");
        assert!(message.contains(words), "{args:?}: {message}");
    };
    refused(&["--backoff", "5s..1s"], "MIN no more than MAX");
    refused(&["--backoff", "10ms"], "at least 100ms");
    refused(&["--backoff", "soon"], "no duration");
    refused(&["--max-restarts", "0"], "1 to 1000");
    refused(&["--pty"], "not a pane");
    refused(&["--on", "slurm"], "not supported on Slurm");
    refused(&["--on", "ssh:nowhere"], "ssh hosts");
    refused(&["--after", "bg-1"], "--restart and --after together");
    // Options of a policy without one, or another policy: usage errors.
    for args in [
        &["start", "--max-restarts", "3", "--", "true"][..],
        &["start", "--restart", "always", "--", "true"][..],
    ] {
        let run = home.run(args);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
    }
    // On the socket, a foreground run and a sub-agent take no policy either.
    for (op, words) in [
        ("run", "a foreground `run`"),
        ("agent_start", "a sub-agent"),
    ] {
        let reply = crate::hostile::raw(
            &home,
            &json!({"session": "test", "op": op, "command": "exit 1",
                    "restart": {"on": "on-failure"}}),
        );
        let message = reply["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(words), "{op}: {reply}");
    }
    assert_eq!(home.json(&["list", "--all"])["items"], json!([]));
}

#[test]
fn issue26_5_mcp_start_takes_the_policy_and_shows_its_restarts() {
    let home = Home::new();
    let mut mcp = Mcp::start(&home);
    let tools = mcp.request("tools/list", json!({}));
    let start = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "start")
        .unwrap()
        .clone();
    for field in ["restart", "max_restarts", "backoff"] {
        let described = &start["inputSchema"]["properties"][field]["description"];
        assert!(described.as_str().is_some_and(|d| d.len() > 20), "{field}");
    }
    let (error, started) = mcp.call(
        "start",
        json!({"command": "echo up; exit 5", "restart": "on-failure", "max_restarts": 1,
               "backoff": "100ms", "window_ms": 0}),
    );
    assert!(!error, "{started}");
    assert_eq!(started["restart"]["max_restarts"], 1, "{started}");
    let next = started["next"].as_str().unwrap();
    assert!(
        next.contains("a notice comes only if it gives up"),
        "{next}"
    );
    let id = started["id"].as_str().unwrap().to_string();
    let mut notices = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while notices.is_empty() {
        assert!(Instant::now() < deadline, "no notice came");
        let (_, listed) = mcp.call("list", json!({"all": true}));
        notices.extend(listed["notices"].as_array().cloned().unwrap_or_default());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert!(notices[0]["text"].as_str().unwrap().contains(&format!(
        "{id} FAILED (exit 5): gave up after 1 of 1 restarts"
    )));
    let (_, listed) = mcp.call("list", json!({"all": true}));
    let item = &listed["items"][0];
    assert_eq!(item["restart"]["restarts"], 1, "{listed}");
    assert_eq!(item["end"], "failed");
    let (error, refused) = mcp.call("start", json!({"command": "true", "max_restarts": 3}));
    assert!(error, "{refused}");
    let (error, refused) = mcp.call(
        "start",
        json!({"command": "true", "restart": "on-failure", "backoff": "1ms"}),
    );
    assert!(error, "{refused}");
    assert!(refused["error"]["message"]
        .as_str()
        .unwrap()
        .contains("backoff"));
}

#[test]
fn issue26_5_the_marker_is_a_line_of_its_own_and_a_run_that_cannot_start_gives_up() {
    let home = Home::new();
    let folder = tempfile::tempdir().unwrap();
    let cwd = folder.path().join("work");
    std::fs::create_dir(&cwd).unwrap();
    let id = home.start_with(
        &[
            "--restart",
            "on-failure",
            "--backoff",
            "100ms",
            "--cwd",
            cwd.to_str().unwrap(),
        ],
        "printf 'no newline'; rmdir \"$PWD\"; exit 1",
    );
    let item = ended(&home, &id);
    assert_eq!(item["end"], "failed", "{item}");
    // The start that could not run is no restart: none is counted, no marker written.
    let report = item["report"].as_str().unwrap();
    assert!(
        report.contains("gave up after 0 of 5 restarts")
            && report.contains("could not start it again")
            && report.contains("working directory"),
        "{report}"
    );
    assert_eq!(restart_of(&item)["restarts"], 0, "{item}");
    let notices = home.json(&["notices"]);
    assert_eq!(notices["notices"].as_array().unwrap().len(), 1, "{notices}");
    let text = log(&home, &id);
    assert!(!text.contains(MARKER), "{text}");
    assert!(text.starts_with("no newline"), "{text}");
}

#[test]
fn issue26_v23_a_cwd_removed_during_the_back_off_counts_no_restart_and_writes_no_marker() {
    let home = Home::new();
    let folder = tempfile::tempdir().unwrap();
    let cwd = folder.path().join("work");
    std::fs::create_dir(&cwd).unwrap();
    let id = home.start_with(
        &[
            "--restart",
            "on-failure",
            "--backoff",
            "3s",
            "--cwd",
            cwd.to_str().unwrap(),
        ],
        "echo run; exit 1",
    );
    // Once it waits out its back-off, its folder goes.
    crate::util::eventually(std::time::Duration::from_secs(10), || {
        home.item(&id)["state"] == "restarting"
    });
    std::fs::remove_dir(&cwd).unwrap();
    let item = ended(&home, &id);
    assert_eq!(item["end"], "failed", "{item}");
    assert_eq!(restart_of(&item)["restarts"], 0, "{item}");
    let report = item["report"].as_str().unwrap();
    assert!(report.contains("working directory"), "{report}");
    let text = log(&home, &id);
    assert!(!text.contains(MARKER), "{text}");
}

#[test]
fn issue26_5_no_quiet_spell_is_told_while_it_waits_out_its_back_off() {
    let home = Home::new();
    let id = home.start_restarting("1", "2500ms", &["--quiet-after", "1s"], "exit 1");
    let item = ended(&home, &id);
    assert_eq!(restart_of(&item)["restarts"], 1, "{item}");
    let notices = home.json(&["notices"]);
    let notices = notices["notices"].as_array().unwrap();
    assert_eq!(notices.len(), 1, "only its end: {notices:?}");
    assert!(notices[0]["text"].as_str().unwrap().contains("gave up"));
}

#[test]
fn issue26_5_a_supervisor_killed_during_the_back_off_ends_lost_and_nothing_starts() {
    let home = Home::new();
    let (id, item) = restarting(&home, "1s", "echo once; exit 1");
    let folder = std::path::PathBuf::from(item["folder"].as_str().unwrap());
    let supervisor: i32 = std::fs::read_to_string(folder.join("supervisor.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let killed = std::process::Command::new("kill")
        .args(["-9", &supervisor.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let item = ended(&home, &id);
    assert_eq!(item["end"], "lost", "{item}");
    assert_eq!(
        restart_of(&item)["restarts"],
        0,
        "no start was decided: {item}"
    );
    assert!(!log(&home, &id).contains(MARKER));
}

#[test]
fn issue26_v24_a_run_that_ended_while_no_daemon_ran_has_waited_out_that_much_of_its_back_off() {
    let home = Home::new();
    let gate = crate::util::Gate::new();
    let ended_file = gate.path("ended");
    let command = format!(
        "echo run; {}; touch '{}'; exit 1",
        gate.after_go("true"),
        ended_file.display()
    );
    let id = home.start_restarting("1", "6s", &[], &command);
    eventually(Duration::from_secs(10), || {
        listed(&home, &id)["state"] == "running"
    });
    home.kill_daemon();
    // The run ends with no daemon, and its back-off passes while none runs.
    gate.open();
    eventually(Duration::from_secs(10), || ended_file.exists());
    let ended_at = Instant::now();
    eventually(Duration::from_secs(15), || {
        ended_at.elapsed() > Duration::from_millis(6500)
    });
    // A new daemon starts it again at once, not a whole back-off after it took it back.
    let taken_back = Instant::now();
    eventually(Duration::from_secs(20), || {
        restart_of(&listed(&home, &id))["restarts"] == 1
    });
    assert!(
        taken_back.elapsed() < Duration::from_secs(4),
        "started again {:?} after the daemon took it back",
        taken_back.elapsed()
    );
    home.run(&["stop", &id]);
}

/// A restart the start rate held back, then a daemon restart: the rate counts afresh,
/// so the job is started again at its back-off's end (it kept the old daemon's
/// minute-long wait and its reason, "session … has made 2 starts").
#[test]
fn issue26_y1_a_restart_the_rate_held_back_is_tried_again_by_the_next_daemon() {
    let home = Home::new().with("BGWORK_MAX_STARTS_PER_MINUTE", "2");
    let id = home.start_with(
        &[
            "--restart",
            "on-failure",
            "--max-restarts",
            "5",
            "--backoff",
            "100ms",
        ],
        "echo try; exit 1",
    );
    let mut item = Value::Null;
    eventually(Duration::from_secs(20), || {
        item = listed(&home, &id);
        restart_of(&item)["refused"].is_string()
    });
    assert_eq!(restart_of(&item)["restarts"], 1, "{item}");
    home.json(&["shutdown"]);
    eventually(Duration::from_secs(10), || {
        std::os::unix::net::UnixStream::connect(home.socket()).is_err()
    });
    // The next daemon (started by this list) starts it again within its back-off.
    eventually(Duration::from_secs(15), || {
        item = listed(&home, &id);
        restart_of(&item)["restarts"].as_u64() >= Some(2)
    });
    home.json(&["stop", &id]);
}

/// Back-offs are shown as a caller would give them (`24h` was `86400s..86400s`).
#[test]
fn issue26_y7_a_backoff_is_shown_in_the_units_it_was_given() {
    let home = Home::new();
    let id = home.start_with(
        &["--restart", "on-failure", "--backoff", "2m..24h"],
        "sleep 300",
    );
    let item = listed(&home, &id);
    let text = item.to_string();
    assert!(text.contains("2m..24h"), "{text}");
    home.json(&["stop", &id]);
}

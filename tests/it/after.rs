//! Work that waits for work (issue 26 item 4): `start --after ID[:COND]`, the state
//! `waiting`, each condition, cancellation with one notice, stop, limits at the moment
//! it starts, daemon restarts, MCP, and a chain from this machine to Slurm.

use crate::mcp::Mcp;
use crate::util::{eventually, Gate, Home};
use serde_json::{json, Value};
use std::time::Duration;

fn notices_of(home: &Home, id: &str) -> Vec<Value> {
    let reply = home.json(&["notices", "--wait", "0"]);
    reply["notices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["item"] == id)
        .cloned()
        .collect()
}

fn state(home: &Home, id: &str) -> Value {
    home.item(id)
}

#[test]
fn issue26_4_waiting_item_starts_once_the_awaited_job_succeeds() {
    let home = Home::new();
    let gate = Gate::new();
    let a = home.start(&gate.after_go("echo built"));
    let marker = gate.path("deployed").display().to_string();
    let b = home.start_reply(&["--after", &a], &format!("echo deployed > '{marker}'"));
    assert_eq!(b["state"], "waiting", "{b}");
    assert_eq!(
        b["waiting_for"],
        format!("waiting for {a} to succeed"),
        "{b}"
    );
    // Listed, in text and JSON, with what it waits for; counted apart in `status`.
    let listed = home.run(&["list"]).stdout;
    assert!(listed.contains("waiting for bg-1 to succeed"), "{listed}");
    let b_id = b["id"].as_str().unwrap();
    assert_eq!(state(&home, b_id)["state"], "waiting");
    let status = home.json(&["status"]);
    assert_eq!(status["waiting"], 1, "{status}");
    assert_eq!(status["running"], 1, "{status}");
    assert!(!gate.exists("deployed"), "nothing runs while it waits");
    let (_, code, message) = home.error(&["send", b_id, "x"]);
    assert_eq!(code, "no_input", "{message}");
    assert!(message.contains("runs nothing yet"), "{message}");
    gate.open();
    let ended = home.wait_end(b_id);
    assert_eq!(ended["end"], "succeeded", "{ended}");
    assert!(gate.exists("deployed"));
    let a_end = state(&home, &a)["ended_at"].as_str().unwrap().to_string();
    assert!(
        ended["started_at"].as_str().unwrap() >= a_end.as_str(),
        "its run is timed from its start, after {a} ended: {ended}"
    );
}

#[test]
fn issue26_4_a_condition_that_can_no_longer_hold_cancels_with_one_notice() {
    let home = Home::new();
    let gate = Gate::new();
    let a = home.start(&gate.after_go("exit 3"));
    let marker = gate.path("ran").display().to_string();
    let b = home.start_reply(&["--after", &a], &format!("touch '{marker}'"));
    let b = b["id"].as_str().unwrap().to_string();
    gate.open();
    // (`list` delivers no notice; a `wait` that showed the end would.)
    eventually(Duration::from_secs(10), || {
        state(&home, &b)["state"] == "ended"
    });
    let ended = state(&home, &b);
    assert_eq!(ended["end"], "cancelled", "{ended}");
    assert_eq!(
        ended["report"],
        format!("{b} was cancelled: {a} FAILED (exit 3), and it waited for {a} to succeed"),
        "{ended}"
    );
    assert!(ended["pid"].is_null() && !gate.exists("ran"), "nothing ran");
    // Its notice comes (not armed: nobody saw it end), exactly once.
    let notices = notices_of(&home, &b);
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert!(notices[0]["text"]
        .as_str()
        .unwrap()
        .contains("FAILED (exit 3), and it waited for"));
    assert!(notices_of(&home, &b).is_empty(), "delivered once");
    // It never ran: no run of its command joins the history.
    let history = home.json(&["history", "--", &format!("touch '{marker}'")]);
    assert!(
        history["commands"].as_array().unwrap().is_empty(),
        "{history}"
    );
}

#[test]
fn issue26_4_ended_output_and_port_conditions() {
    let home = Home::new();
    let gate = Gate::new();
    // `output RE`: a line of what readers are shown, while the job still runs.
    let a = home.start(
        &gate
            .after_go("exit 5")
            .replace("while", "echo 'ready on 42'; while"),
    );
    let on_output = home.start_reply(
        &["--after", &format!("{a}:output ready on [0-9]+")],
        "echo o",
    );
    let on_end = home.start_reply(&["--after", &format!("{a}:ended")], "echo e");
    let o = on_output["id"].as_str().unwrap();
    let e = on_end["id"].as_str().unwrap();
    assert_eq!(home.wait_end(o)["end"], "succeeded");
    assert_eq!(state(&home, e)["state"], "waiting", "bg-1 still runs");
    gate.open();
    // `ended`: however it ended (exit 5 here).
    assert_eq!(home.wait_end(e)["end"], "succeeded");
    // A pattern never printed by an item that ended: refused at start, nothing made
    // (issue26_p8 has the rest).
    let b = home.start("echo nothing to see");
    home.wait_end(&b);
    let (_, _, refused) = home.error(&[
        "start",
        "--window",
        "0",
        "--after",
        &format!("{b}:output ready"),
        "--",
        "echo n",
    ]);
    assert!(
        refused.contains("ended without printing ready"),
        "{refused}"
    );
    // A pattern never printed by the time it ends: cancelled, saying so. The output as
    // readers see it: a token shape is masked, so a pattern of its characters never
    // matches.
    let token = "sk-abcdefghijklmnopqrstuvwx0123456789ABCD";
    let later = Gate::new();
    let t = home.start(
        &later
            .after_go("true")
            .replace("while", &format!("echo key {token}; while")),
    );
    let masked = home.start_reply(
        &["--after", &format!("{t}:output sk-[a-z]{{10}}")],
        "echo m",
    );
    later.open();
    let masked = home.wait_end(masked["id"].as_str().unwrap());
    assert_eq!(masked["end"], "cancelled", "{masked}");
    assert!(
        masked["report"]
            .as_str()
            .unwrap()
            .contains("ended without printing sk-"),
        "{masked}"
    );
    // `port`: once it listens on a TCP port.
    let server = home.start(&gate.after_go(
        "python3 -c 'import socket,time; s=socket.socket(); s.bind((\"127.0.0.1\",0)); s.listen(); time.sleep(60)'",
    ));
    let on_port = home.start_reply(&["--after", &format!("{server}:port")], "echo p");
    let p = on_port["id"].as_str().unwrap();
    assert_eq!(
        on_port["waiting_for"],
        format!("waiting for {server} to listen on a TCP port")
    );
    assert_eq!(home.wait_end(p)["end"], "succeeded");
    home.json(&["stop", &server]);
}

#[test]
fn issue26_4_several_conditions_are_all_required_and_chains_run_in_order() {
    let home = Home::new();
    let first = Gate::new();
    let second = Gate::new();
    let a = home.start(&first.after_go("true"));
    let c = home.start(&second.after_go("true"));
    let both = home.start_reply(&["--after", &a, "--after", &c], "echo both");
    let both = both["id"].as_str().unwrap().to_string();
    assert_eq!(
        state(&home, &both)["waiting_for"],
        format!("waiting for {a} to succeed and {c} to succeed")
    );
    // A chain: this one names a waiting item.
    let next = home.start_reply(&["--after", &both], "echo next");
    let next = next["id"].as_str().unwrap().to_string();
    first.open();
    home.wait_end(&a);
    eventually(Duration::from_secs(10), || {
        state(&home, &both)["waiting_for"] == format!("waiting for {c} to succeed")
    });
    assert_eq!(state(&home, &both)["state"], "waiting");
    second.open();
    assert_eq!(home.wait_end(&next)["end"], "succeeded");
    assert_eq!(state(&home, &both)["end"], "succeeded");
    // A failure cancels down the chain.
    let gate = Gate::new();
    let x = home.start(&gate.after_go("exit 1"));
    let y = home.start_reply(&["--after", &x], "echo y")["id"]
        .as_str()
        .unwrap()
        .to_string();
    let z = home.start_reply(&["--after", &y], "echo z")["id"]
        .as_str()
        .unwrap()
        .to_string();
    gate.open();
    let z_end = home.wait_end(&z);
    assert_eq!(z_end["end"], "cancelled");
    assert!(
        z_end["report"]
            .as_str()
            .unwrap()
            .contains(&format!("{y} was cancelled")),
        "{z_end}"
    );
}

#[test]
fn issue26_4_stop_of_a_waiting_item_ends_it_without_running() {
    let home = Home::new();
    let gate = Gate::new();
    let a = home.start(&gate.after_go("true"));
    let marker = gate.path("ran").display().to_string();
    let b = home.start_reply(&["--notify", "--after", &a], &format!("touch '{marker}'"));
    let b = b["id"].as_str().unwrap().to_string();
    let stopped = home.json(&["stop", &b]);
    assert_eq!(stopped["end"], "stopped_by_agent", "{stopped}");
    assert_eq!(
        stopped["report"],
        format!("{b} was stopped by the agent: while it waited for {a} to succeed; nothing ran")
    );
    gate.open();
    home.wait_end(&a);
    assert!(
        notices_of(&home, &b).is_empty(),
        "the agent's stop: no notice"
    );
    // A person's stop tells the agent.
    let gate2 = Gate::new();
    let d = home.start(&gate2.after_go("true"));
    let e = home.start_reply(&["--after", &d], &format!("touch '{marker}'"));
    let e = e["id"].as_str().unwrap().to_string();
    let stopped = home.json(&["stop", &e, "--as", "person"]);
    assert_eq!(stopped["end"], "stopped_by_person", "{stopped}");
    assert_eq!(notices_of(&home, &e).len(), 1);
    gate2.open();
    home.wait_end(&d);
    assert!(!gate.exists("ran"), "nothing ran");
}

#[test]
fn issue26_4_bad_input_gets_clear_errors_and_nothing_starts() {
    let home = Home::new();
    let gate = Gate::new();
    let a = home.start(&gate.after_go("true"));
    let refused = |after: &str| home.error(&["start", "--after", after, "--", "true"]);
    let (_, code, message) = refused("bg-9");
    assert_eq!(code, "unknown_id", "{message}");
    // The id this start would get is no item yet: no cycle can be made.
    let (_, code, message) = refused("bg-2");
    assert_eq!(code, "unknown_id", "{message}");
    let (_, _, message) = refused(&format!("{a}:finished"));
    assert!(
        message.contains("`succeeded` (the default), `ended`, `output RE` or `port`"),
        "{message}"
    );
    let (_, _, message) = refused(&format!("{a}:output"));
    assert!(message.contains("needs a pattern"), "{message}");
    let (_, _, message) = refused(&format!("{a}:output ([a-z]"));
    assert!(message.contains("not a valid regex"), "{message}");
    let failed = home.start("exit 2");
    home.wait_end(&failed);
    let (_, _, message) = refused(&failed);
    assert!(
        message.contains(&format!(
            "FAILED (exit 2), so --after {failed} can never hold: nothing was started"
        )),
        "{message}"
    );
    // Seventeen conditions (one given twice would be one).
    let many: Vec<String> = (0..17)
        .flat_map(|n| ["--after".to_string(), format!("{a}:output step {n}")])
        .collect();
    let mut args: Vec<&str> = vec!["start"];
    args.extend(many.iter().map(String::as_str));
    args.extend(["--", "true"]);
    let (_, _, message) = home.error(&args);
    assert!(message.contains("at most 16"), "{message}");
    // Nothing was recorded for any of them, and the daemon serves on.
    let list = home.json(&["list", "--all"]);
    assert_eq!(list["items"].as_array().unwrap().len(), 2, "{list}");
    gate.open();
    home.wait_end(&a);
}

#[test]
fn issue26_4_refused_by_a_limit_when_it_may_start_it_waits_for_room() {
    let home = Home::new().with("BGWORK_MAX_RUNNING", "1");
    let gate = Gate::new();
    let a = home.start(&gate.after_go("true").replace("while", "echo ready; while"));
    let b = home.start_reply(&["--after", &format!("{a}:output ready")], "echo b");
    let b = b["id"].as_str().unwrap().to_string();
    // Its condition holds, but bg-1 holds the session's one slot: it keeps waiting,
    // saying why.
    eventually(Duration::from_secs(10), || {
        state(&home, &b)["waiting_for"].as_str().is_some_and(|w| {
            w.starts_with("waiting for room to start: this session already runs 1 item,")
        })
    });
    assert_eq!(state(&home, &b)["state"], "waiting");
    gate.open();
    assert_eq!(home.wait_end(&b)["end"], "succeeded");
}

#[test]
fn issue26_4_waiting_survives_a_daemon_kill_and_an_end_during_the_outage() {
    let home = Home::new();
    let gate = Gate::new();
    let a = home.start(&gate.after_go("true"));
    let out = gate.path("out").display().to_string();
    let value = "kept-in-memory-only-1234";
    let b = home.start_reply(
        &[
            "--env",
            &format!("WAITED={value}"),
            "--env",
            "SHORT=abc",
            "--after",
            &a,
        ],
        &format!("echo \"$SHORT\" > '{out}'"),
    );
    let b = b["id"].as_str().unwrap().to_string();
    let folder = state(&home, &b)["folder"].as_str().unwrap().to_string();
    // No value of its environment is on disk while it waits.
    for entry in std::fs::read_dir(&folder).unwrap().flatten() {
        let bytes = std::fs::read(entry.path()).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            !text.contains(value),
            "{} holds the value",
            entry.path().display()
        );
    }
    home.kill_daemon();
    gate.open();
    // The next call starts a daemon, which settles bg-1 and starts bg-2.
    let ended = home.wait_end(&b);
    assert_eq!(ended["end"], "succeeded", "{ended}");
    assert_eq!(std::fs::read_to_string(gate.path("out")).unwrap(), "abc\n");
    // Killed while waiting and back before the awaited job ends.
    let gate2 = Gate::new();
    let c = home.start(&gate2.after_go("true"));
    let d = home.start_reply(&["--after", &c], "echo d");
    let d = d["id"].as_str().unwrap().to_string();
    home.kill_daemon();
    assert_eq!(state(&home, &d)["state"], "waiting");
    assert!(
        state(&home, &d)["waiting_for"]
            .as_str()
            .unwrap()
            .contains(&format!("{c} to succeed")),
        "what it waits for is known again"
    );
    gate2.open();
    assert_eq!(home.wait_end(&d)["end"], "succeeded");
}

#[test]
fn issue26_4_mcp_start_takes_after() {
    let home = Home::new();
    let gate = Gate::new();
    let a = home.start(&gate.after_go("true"));
    let mut mcp = Mcp::start(&home);
    let (tools_error, tools) = (false, mcp.request("tools/list", json!({})));
    assert!(!tools_error);
    let start_tool = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "start")
        .cloned()
        .unwrap();
    assert!(
        start_tool["inputSchema"]["properties"]["after"]["description"]
            .as_str()
            .unwrap()
            .contains("ID[:COND]")
    );
    let (error, reply) = mcp.call("start", json!({"command": "echo m", "after": [a.clone()]}));
    assert!(!error, "{reply}");
    assert_eq!(reply["state"], "waiting", "{reply}");
    assert_eq!(reply["waiting_for"], format!("waiting for {a} to succeed"));
    assert!(
        reply["next"]
            .as_str()
            .unwrap()
            .contains("ends cancelled with a notice"),
        "{reply}"
    );
    let (_, list) = mcp.call("list", json!({}));
    let waiting = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["state"] == "waiting")
        .cloned()
        .unwrap();
    assert_eq!(
        waiting["waiting_for"],
        format!("waiting for {a} to succeed")
    );
    let (error, reply) = mcp.call(
        "start",
        json!({"command": "echo m", "after": ["bg-1:soon"]}),
    );
    assert!(error, "{reply}");
    gate.open();
    let id = waiting["id"].as_str().unwrap();
    assert_eq!(home.wait_end(id)["end"], "succeeded");
}

#[test]
fn issue26_4_a_local_build_then_a_slurm_job() {
    let Some(conf) = crate::slurm::cluster(&crate::util::this_test()) else {
        return;
    };
    let home = Home::new().with("SLURM_CONF", &conf);
    let gate = Gate::new();
    let build = home.start(&gate.after_go("echo built"));
    let run = home.start_reply(
        &["--on", "slurm", "--cwd", &gate.dir(), "--after", &build],
        "echo ran on $SLURM_JOB_ID",
    );
    let run = run["id"].as_str().unwrap().to_string();
    assert_eq!(state(&home, &run)["state"], "waiting");
    assert!(
        state(&home, &run)["slurm_job_id"].is_null(),
        "nothing submitted yet"
    );
    gate.open();
    let reply = home
        .run(&["--json", "wait", &run, "--timeout", "120"])
        .json();
    assert_eq!(reply["reason"], "ended", "{reply}");
    let ended = &reply["items"][0];
    assert_eq!(ended["end"], "succeeded", "{ended}");
    assert_eq!(ended["executor"], "slurm", "{ended}");
    let output = home.json(&["read", &run, "--all"]);
    assert!(
        output["output"].as_str().unwrap().contains("ran on "),
        "{output}"
    );
}

#[test]
fn issue26_4_a_server_already_running_is_not_started_twice_by_its_waiter() {
    let home = Home::new();
    let gate = Gate::new();
    let server = "python3 -c 'import socket,time; s=socket.socket(); s.bind((\"127.0.0.1\",0)); s.listen(); time.sleep(60)'";
    let first = home.start(server);
    eventually(Duration::from_secs(20), || {
        state(&home, &first)["listening"]
            .as_array()
            .is_some_and(|l| !l.is_empty())
    });
    let a = home.start(&gate.after_go("true"));
    let again = home.start_reply(&["--after", &a], server);
    let again = again["id"].as_str().unwrap().to_string();
    gate.open();
    eventually(Duration::from_secs(10), || {
        state(&home, &again)["state"] == "ended"
    });
    let ended = state(&home, &again);
    assert_eq!(ended["end"], "cancelled", "{ended}");
    assert!(
        ended["report"]
            .as_str()
            .unwrap()
            .contains(&format!("already runs as {first}")),
        "{ended}"
    );
    home.json(&["stop", &first]);
}

/// Pids of the keepers (`bgwork keep DIR`) of a home's folders.
pub(crate) fn keepers_of(home: &Home) -> Vec<i32> {
    let jobs = home.path().join("jobs").display().to_string();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.iter().any(|a| a == "keep") && args.iter().any(|a| a.starts_with(&jobs)) {
            pids.push(pid);
        }
    }
    pids
}

#[test]
fn issue26_4_a_wait_on_a_cancelled_waiting_item_fails_and_the_chain_says_why() {
    let home = Home::new();
    let gate = Gate::new();
    let first = home.start_reply(&[], &gate.after_go("exit 1"));
    let first = first["id"].as_str().unwrap().to_string();
    let second = home.start_reply(&["--after", &first], "echo deploy");
    let second = second["id"].as_str().unwrap().to_string();
    let third = home.start_reply(&["--after", &second], "echo after-deploy");
    let third = third["id"].as_str().unwrap().to_string();
    gate.open();
    // Nothing ran: the caller of `wait` hears a failure, not "ended well".
    let waited = home.run(&["wait", &second, "--timeout", "30"]);
    assert_eq!(waited.code, 1, "{}{}", waited.stdout, waited.stderr);
    let waited = home.run(&["wait", &third, "--timeout", "30"]);
    assert_eq!(waited.code, 1, "{}{}", waited.stdout, waited.stderr);
    // Down the chain, the reason is the one the link above was cancelled for.
    let report = state(&home, &third)["report"].as_str().unwrap().to_string();
    assert!(!report.contains("pane"), "{report}");
    assert!(report.contains(&format!("{first} FAILED")), "{report}");
}

#[test]
fn issue26_4_shutdown_with_stop_work_leaves_no_keeper_behind() {
    let home = Home::new().with("SK", "keeper-secret-ZXCVBNM123");
    let gate = Gate::new();
    let first = home.start_reply(&[], &gate.after_go("true"));
    let first = first["id"].as_str().unwrap().to_string();
    for i in 0..12 {
        home.start_reply(
            &["--secret", "SK", "--after", &first],
            &format!("echo w{i}"),
        );
    }
    eventually(Duration::from_secs(20), || keepers_of(&home).len() == 12);
    home.json(&["shutdown", "--stop-work"]);
    // Every keeper (each holding the secret in its memory) is gone with the work.
    eventually(Duration::from_secs(20), || keepers_of(&home).is_empty());
    gate.open();
}

#[test]
fn issue26_4_a_waiting_item_that_cannot_start_when_its_turn_comes_says_so_once() {
    let home = Home::new();
    let gate = Gate::new();
    let folder = tempfile::tempdir().unwrap();
    let cwd = folder.path().display().to_string();
    let first = home.start_reply(&[], &gate.after_go("true"));
    let first = first["id"].as_str().unwrap().to_string();
    let second = home.start_reply(&["--cwd", &cwd, "--after", &first], "echo w");
    let second = second["id"].as_str().unwrap().to_string();
    drop(folder);
    gate.open();
    eventually(Duration::from_secs(20), || {
        state(&home, &second)["end"] == "spawn_failed"
    });
    // Its `start` answered long ago: a notice says it could not start, and why.
    let report = state(&home, &second)["report"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(report.contains("no longer exists"), "{report}");
    let notices = notices_of(&home, &second);
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert!(notices[0]["text"]
        .as_str()
        .unwrap()
        .contains("could not start"));
}

#[test]
fn issue26_v27_a_pattern_whose_line_was_dropped_unscanned_is_cancelled_saying_so() {
    let home = Home::new()
        .with("BGWORK_LOG_CAP", "65536")
        .with("BGWORK_LOG_HEAD", "4096");
    let gate = Gate::new();
    let awaited = home.start(&format!(
        "head -c 10000 /dev/zero | tr '\\0' a | fold -w 100; echo; echo MARK4-LINE; \
         head -c 3000000 /dev/zero | tr '\\0' b | fold -w 100; touch '{}'; {}",
        gate.path("written").display(),
        gate.after_go("true")
    ));
    // Its line went into the dropped middle before any scan looked for it.
    eventually(Duration::from_secs(30), || {
        gate.exists("written")
            && home
                .run(&["read", &awaited, "--grep", "MARK4"])
                .stdout
                .contains("no line matches")
    });
    let waiting = home.start_with(&["--after", &format!("{awaited}:output MARK4")], "true");
    gate.open();
    let mut item = Value::Null;
    eventually(Duration::from_secs(30), || {
        item = state(&home, &waiting);
        item["state"] == "ended"
    });
    assert_eq!(item["end"], "cancelled", "{item}");
    let notices = notices_of(&home, &waiting);
    let text = notices[0]["text"].as_str().unwrap();
    assert!(
        text.contains("dropped") && text.contains("not looked at"),
        "{text}"
    );
}

/// One condition given several times is one condition: it neither repeats in what the
/// item waits for nor spends the limit of 16.
#[test]
fn issue26_y7_a_condition_given_twice_is_one() {
    let home = Home::new();
    let first = home.start("sleep 300");
    let cond = format!("{first}:ended");
    let mut args = vec!["--json", "start"];
    for _ in 0..20 {
        args.extend_from_slice(&["--after", &cond]);
    }
    args.extend_from_slice(&["--", "true"]);
    let run = home.run(&args);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let waiting = run.json();
    let id = waiting["id"].as_str().unwrap();
    let item = home.item(id);
    let text = item["waiting_for"].to_string();
    assert_eq!(text.matches(&first).count(), 1, "{text}");
    home.json(&["stop", &first]);
}

/// A keeper killed while its daemon runs is started again from the arguments that
/// daemon holds: the waiting item runs later with its `--env` value (contract §14).
#[test]
fn issue26_y5_a_keeper_killed_under_a_running_daemon_is_started_again() {
    let home = Home::new();
    let gate = Gate::new();
    let first = home.start_reply(&[], &gate.after_go("true"));
    let first = first["id"].as_str().unwrap().to_string();
    let second = home.start_reply(
        &["--env", "EV=envvalue-long-23", "--after", &first],
        "echo \"len=${#EV}\"",
    );
    let second = second["id"].as_str().unwrap().to_string();
    let mut keepers = Vec::new();
    eventually(Duration::from_secs(20), || {
        keepers = keepers_of(&home);
        keepers.len() == 1
    });
    let killed = keepers[0];
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(killed),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    eventually(Duration::from_secs(20), || {
        let now = keepers_of(&home);
        now.len() == 1 && now[0] != killed
    });
    gate.open();
    let ended = home.wait_end(&second);
    assert_eq!(ended["end"], "succeeded", "{ended}");
    let out = home.json(&["read", &second, "--all"]);
    assert!(out["output"].as_str().unwrap().contains("len=16"), "{out}");
}

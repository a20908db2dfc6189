//! Monitors (waits and watches, across restarts) and sub-agents.

use crate::util::{eventually, Home, BIN};
use std::time::Duration;

fn monitor(home: &Home, args: &[&str]) -> String {
    let mut all = vec!["monitor"];
    all.extend_from_slice(args);
    home.json(&all)["id"].as_str().unwrap().to_string()
}

fn ended(home: &Home, id: &str) -> serde_json::Value {
    let reply = home.run(&["--json", "wait", id, "--timeout", "30"]).json();
    assert_eq!(reply["reason"], "ended", "{reply}");
    reply["items"][0].clone()
}

#[test]
fn a_wait_for_output_holds_when_a_line_matches_and_fails_at_its_timeout() {
    let home = Home::new();
    let job = home.start("echo booting; read x; echo 'listening on :8080'; exec sleep 1000");
    let met = monitor(
        &home,
        &["wait", "--until-output", &job, "listening on", "--notify"],
    );
    let missed = monitor(
        &home,
        &["wait", "--until-output", &job, "never", "--timeout", "0.3"],
    );
    assert!(met.starts_with("mon-"));
    let item = ended(&home, &missed);
    assert_eq!(item["end"], "failed");
    assert!(
        item["report"].as_str().unwrap().contains("timed out"),
        "{item}"
    );
    assert_eq!(home.item(&met)["state"], "running");
    home.json(&["send", &job, r"\n"]);
    let notices = home.json(&["notices", "--wait", "20"]);
    let notice = &notices["notices"][0];
    assert_eq!(notice["item"], met.as_str());
    assert_eq!(notice["end"], "succeeded");
    assert!(
        notice["text"]
            .as_str()
            .unwrap()
            .contains("listening on :8080"),
        "{notice}"
    );
}

#[test]
fn a_wait_for_a_port_a_file_or_an_end() {
    let home = Home::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let open = format!("127.0.0.1:{}", listener.local_addr().unwrap().port());
    let closed = {
        let spare = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("127.0.0.1:{}", spare.local_addr().unwrap().port())
    };
    let port = monitor(&home, &["wait", "--until-port", &open]);
    assert_eq!(ended(&home, &port)["end"], "succeeded");
    let no_port = monitor(
        &home,
        &["wait", "--until-port", &closed, "--timeout", "0.3"],
    );
    assert_eq!(ended(&home, &no_port)["end"], "failed");

    let path = home.path().join("flag");
    let file = monitor(&home, &["wait", "--until-file", path.to_str().unwrap()]);
    std::fs::write(&path, "x").unwrap();
    assert_eq!(ended(&home, &file)["end"], "succeeded");
    let no_file = monitor(
        &home,
        &["wait", "--until-file", "/no/such/file", "--timeout", "0.3"],
    );
    assert_eq!(ended(&home, &no_file)["end"], "failed");

    let job = home.start("read x");
    let end = monitor(&home, &["wait", "--until-end", &job]);
    home.json(&["send", &job, r"\n"]);
    let item = ended(&home, &end);
    assert_eq!(item["end"], "succeeded");
    assert!(item["report"]
        .as_str()
        .unwrap()
        .contains("finished successfully"));
}

#[test]
fn the_fifth_monitor_is_refused_and_monitors_take_no_input() {
    let home = Home::new();
    let ids: Vec<String> = (0..4)
        .map(|_| monitor(&home, &["wait", "--until-file", "/no/such/file"]))
        .collect();
    let (code, error, message) = home.error(&["monitor", "wait", "--until-file", "/x"]);
    assert_eq!((code, error.as_str()), (1, "limit"));
    assert!(message.contains(&ids[3]), "{message}");
    let (_, error, message) = home.error(&["send", &ids[0], "hello"]);
    assert_eq!(error, "no_input");
    assert!(message.contains("stop"), "{message}");
    assert_eq!(home.json(&["stop", &ids[0]])["end"], "stopped_by_agent");
    monitor(&home, &["wait", "--until-file", "/no/such/file"]);
}

#[test]
fn a_watch_coalesces_a_hundred_matches_into_one_pending_notice() {
    let home = Home::new();
    let job =
        home.start("read x; for i in $(seq 100); do echo \"match $i\"; echo other; done; read y");
    let watch = monitor(&home, &["watch", "--output", &job, "--regex", "^match"]);
    home.json(&["send", &job, r"\n"]);
    eventually(Duration::from_secs(20), || {
        let all = home.json(&["read", &watch, "--all"]);
        all["output"].as_str().unwrap().lines().count() == 100
    });
    let notices = home.json(&["notices", "--peek"]);
    let notices = notices["notices"].as_array().unwrap();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0]["count"], 100);
    assert!(notices[0]["tail"]
        .as_str()
        .unwrap()
        .ends_with("match 100\n"));
    assert_eq!(notices[0]["end"], serde_json::Value::Null);
    let first = home.json(&["read", &watch]);
    assert!(first["output"].as_str().unwrap().starts_with("match 1\n"));
    assert_eq!(
        home.json(&["read", &watch])["output"],
        "",
        "read incrementally"
    );
}

#[test]
fn monitors_resume_after_the_daemon_is_killed() {
    let home = Home::new();
    let job = home.start(
        "read a; echo 'hit one'; read b; echo 'hit two'; read c; echo DONE; exec sleep 1000",
    );
    let watch = monitor(&home, &["watch", "--output", &job, "--regex", "^hit"]);
    let wait = monitor(&home, &["wait", "--until-output", &job, "DONE", "--notify"]);
    home.json(&["send", &job, r"\n"]);
    eventually(Duration::from_secs(20), || {
        home.json(&["read", &watch, "--all"])["output"] == "hit one\n"
    });
    home.kill_daemon();
    home.json(&["send", &job, r"\n"]);
    eventually(Duration::from_secs(20), || {
        home.json(&["read", &watch, "--all"])["output"] == "hit one\nhit two\n"
    });
    home.kill_daemon();
    home.json(&["send", &job, r"\n"]);
    let item = ended(&home, &wait);
    assert_eq!(item["end"], "succeeded");
    assert_eq!(home.item(&watch)["state"], "running");
    assert_eq!(
        home.json(&["read", &watch, "--all"])["output"],
        "hit one\nhit two\n",
        "no line twice"
    );
}

/// A fake agent: starts work of its own, writes its report, ends.
const AGENT: &str = r#"
bgwork start --window 0 --name helper -- 'exec sleep 1000' > /dev/null
echo "agent session: $BGWORK_SESSION"
echo "REPORT: 3 flaky tests found" > "$BGWORK_REPORT"
read go
"#;

fn with_bin_on_path(home: Home) -> Home {
    let dir = std::path::Path::new(BIN)
        .parent()
        .unwrap()
        .display()
        .to_string();
    let path = format!("{dir}:{}", std::env::var("PATH").unwrap_or_default());
    home.with("PATH", &path)
}

#[test]
fn a_sub_agent_reports_once_and_its_work_is_the_parents_to_see() {
    // The sub-agent's helper counts against the parent's limit of 2 (the sub-agent
    // itself does not).
    let home = with_bin_on_path(Home::new().with("BGWORK_MAX_RUNNING", "2"));
    home.start("exec sleep 1000");
    let agent = home.json(&["agent", "start", "--", AGENT]);
    let id = agent["id"].as_str().unwrap().to_string();
    assert_eq!(agent["kind"], "sub_agent");
    assert!(id.starts_with("sub-"));
    eventually(Duration::from_secs(20), || {
        let list = home.json(&["list"]);
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["name"] == "helper")
    });
    let list = home.json(&["list"]);
    let helper = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "helper")
        .unwrap();
    assert_eq!(helper["session"], format!("test/{id}"));
    assert_eq!(helper["id"], format!("{id}/bg-1"));
    let (_, error, _) = home.error(&["start", "--", "true"]);
    assert_eq!(
        error, "limit",
        "the helper counts against the parent's limit"
    );
    home.kill_daemon();
    home.json(&["send", &id, r"\n"]);
    let notices = home.json(&["notices", "--wait", "20"]);
    let notices = notices["notices"].as_array().unwrap();
    assert_eq!(notices.len(), 1);
    assert_eq!(notices[0]["item"], id.as_str());
    assert_eq!(notices[0]["tail"], "REPORT: 3 flaky tests found\n");
    home.kill_daemon();
    assert_eq!(
        home.json(&["notices"])["notices"].as_array().unwrap().len(),
        0,
        "once"
    );
    let output = home.json(&["read", &id, "--all"]);
    assert!(output["output"]
        .as_str()
        .unwrap()
        .contains(&format!("agent session: test/{id}")));
}

#[test]
fn stopping_a_sub_agent_stops_the_work_it_started_and_two_may_run() {
    let home = with_bin_on_path(Home::new());
    let first = home.json(&["agent", "start", "--", AGENT])["id"]
        .as_str()
        .unwrap()
        .to_string();
    home.json(&["agent", "start", "--", "exec sleep 1000"]);
    let (_, error, _) = home.error(&["agent", "start", "--", "true"]);
    assert_eq!(error, "limit");
    let helper = || {
        let list = home.json(&["list", "--all"]);
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == "helper")
            .cloned()
    };
    eventually(Duration::from_secs(20), || helper().is_some());
    assert_eq!(home.json(&["stop", &first])["end"], "stopped_by_agent");
    let helper = helper().unwrap();
    assert_eq!(helper["state"], "ended");
    assert_eq!(helper["end"], "stopped_by_agent");
    let (_, error, _) = home.error(&["--session", "other", "read", &first]);
    assert_eq!(error, "unknown_id");
}

//! Every reply that shows an end delivers its notice; a promoted `run` arms one.

use crate::mcp::Mcp;
use crate::util::{eventually, Home};
use serde_json::json;
use std::time::Duration;

#[test]
fn issue25_a_read_that_shows_the_end_delivers_its_notice() {
    let home = Home::new();
    let id = home.start_with(&["--notify"], "sleep 0.3; seq 30; exit 2");
    eventually(Duration::from_secs(10), || {
        home.item(&id)["state"] == "ended"
    });
    let read = home.run(&["read", &id]);
    assert!(read.stdout.contains("30\n"), "{}", read.stdout);
    assert!(read.stdout.contains("FAILED (exit 2)") || read.stderr.contains("FAILED (exit 2)"));
    assert_eq!(
        home.json(&["notices"])["notices"],
        json!([]),
        "shown by the read"
    );
}

#[test]
fn issue25_an_mcp_read_that_shows_the_end_delivers_its_notice_once() {
    let home = Home::new();
    let mut mcp = Mcp::start(&home);
    let (_, job) = mcp.call(
        "start",
        json!({"command": "sleep 0.3; echo last; exit 3", "notify": true, "window_ms": 0}),
    );
    let id = job["id"].as_str().unwrap().to_string();
    eventually(Duration::from_secs(10), || {
        home.item(&id)["state"] == "ended"
    });
    let (_, read) = mcp.call("read", json!({"id": id}));
    assert_eq!(read["running"], false, "{read}");
    assert_eq!(
        read["notices"],
        json!([]),
        "the read is the delivery: {read}"
    );
    let (_, listed) = mcp.call("list", json!({}));
    assert_eq!(listed["notices"], json!([]), "{listed}");
}

#[test]
fn issue25_a_read_of_a_running_job_leaves_its_notice_to_come() {
    let home = Home::new();
    let id = home.start_with(&["--notify"], "echo early; sleep 1; exit 1");
    home.run(&["read", &id]);
    eventually(Duration::from_secs(10), || {
        home.item(&id)["state"] == "ended"
    });
    let notices = home.json(&["notices"]);
    assert_eq!(notices["notices"][0]["item"], id.as_str(), "{notices}");
}

#[test]
fn issue25_a_promoted_run_arms_its_notice_and_says_so() {
    let home = Home::new();
    let run = home.run(&["run", "--timeout", "0.5", "--", "sleep 1.5; exit 9"]);
    assert_eq!(run.code, 0, "{} {}", run.stdout, run.stderr);
    let said = format!("{}{}", run.stdout, run.stderr);
    assert!(said.contains("a notice will come when it ends"), "{said}");
    let id = home.json(&["list"])["items"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    eventually(Duration::from_secs(10), || {
        home.item(&id)["state"] == "ended"
    });
    let notices = home.json(&["notices"]);
    assert_eq!(notices["notices"][0]["item"], id.as_str(), "{notices}");
    assert_eq!(notices["notices"][0]["exit_code"], 9, "{notices}");
}

#[test]
fn issue25_a_stop_that_finds_the_item_ended_delivers_its_notice() {
    let home = Home::new();
    let id = home.start_with(&["--notify"], "sleep 0.2; exit 2");
    eventually(Duration::from_secs(10), || {
        home.item(&id)["state"] == "ended"
    });
    let stop = home.run(&["stop", &id]);
    assert!(stop.stdout.contains("had already ended"), "{}", stop.stdout);
    assert_eq!(
        home.json(&["notices"])["notices"],
        json!([]),
        "shown by the stop"
    );
}

#[test]
fn issue25_a_persons_stop_leaves_the_agent_its_notice() {
    let home = Home::new();
    let id = home.start_with(&["--notify"], "sleep 0.2; exit 2");
    eventually(Duration::from_secs(10), || {
        home.item(&id)["state"] == "ended"
    });
    home.run(&["stop", &id, "--as", "person"]);
    let notices = home.json(&["notices"]);
    assert_eq!(notices["notices"][0]["item"], id.as_str(), "{notices}");
}

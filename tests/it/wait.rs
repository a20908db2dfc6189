//! `wait`: ends, patterns, timeouts, any and all, and clients that go away.

use crate::util::{alive, Home};

#[test]
fn wait_until_a_pattern_in_new_output() {
    let home = Home::new();
    let id =
        home.start("for i in 1 2 3; do echo step $i; sleep 0.1; done; echo READY; exec sleep 1000");
    let reply = home.json(&["wait", &id, "--until", "^READ[Y]$", "--timeout", "20"]);
    assert_eq!(reply["reason"], "matched");
    assert_eq!(reply["match"], "READY");
    assert_eq!(reply["items"][0]["state"], "running");
}

#[test]
fn wait_times_out_with_exit_code_one_and_says_so() {
    let home = Home::new();
    let id = home.start("exec sleep 1000");
    let mut args = vec!["--json", "wait", &id, "--timeout", "0.3"];
    let run = home.run(&args);
    assert_eq!(run.code, 1);
    assert_eq!(run.json()["reason"], "timeout");
    args.remove(0);
    assert!(home.run(&args).stdout.contains("timed out"));
}

#[test]
fn wait_any_returns_at_the_first_end_and_all_at_the_last() {
    let home = Home::new();
    let quick = home.start("read x; exit 0");
    let slow = home.start("read x; exit 3");
    home.json(&["send", &quick, r"\n"]);
    let any = home.json(&["wait", &quick, &slow, "--any", "--timeout", "20"]);
    assert_eq!(any["reason"], "ended");
    let ended: Vec<&str> = any["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["state"] == "ended")
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    assert_eq!(ended, vec![quick.as_str()]);
    home.json(&["send", &slow, r"\n"]);
    let run = home.run(&["--json", "wait", &quick, &slow, "--all", "--timeout", "20"]);
    let all = run.json();
    assert_eq!(all["reason"], "ended");
    assert!(all["items"]
        .as_array()
        .unwrap()
        .iter()
        .all(|i| i["state"] == "ended"));
    assert_eq!(run.code, 1, "one of them failed");
}

#[test]
fn a_bad_regex_is_a_clear_usage_error() {
    let home = Home::new();
    let id = home.start("exec sleep 1000");
    let (code, error, message) = home.error(&["wait", &id, "--until", "(unclosed"]);
    assert_eq!(code, 2);
    assert_eq!(error, "bad_request");
    assert!(message.contains("regular expression"), "{message}");
}

#[test]
fn a_client_killed_mid_wait_leaves_daemon_and_job_untouched() {
    let home = Home::new();
    let id = home.start("exec sleep 1000");
    let pid = home.item(&id)["pid"].as_i64().unwrap() as i32;
    let mut waiter = home
        .command(&["wait", &id, "--timeout", "60"])
        .spawn()
        .unwrap();
    let mut follower = home.command(&["notices", "--follow"]).spawn().unwrap();
    for child in [&waiter, &follower] {
        crate::util::eventually(std::time::Duration::from_secs(10), || {
            crate::util::has_socket(child.id() as i32)
        });
    }
    waiter.kill().unwrap();
    follower.kill().unwrap();
    waiter.wait().unwrap();
    follower.wait().unwrap();
    assert!(alive(pid));
    assert_eq!(home.item(&id)["state"], "running");
    let reply = home
        .run(&["--json", "wait", &id, "--timeout", "0.1"])
        .json();
    assert_eq!(reply["reason"], "timeout");
}

#[test]
fn notices_fire_once_with_the_end_and_the_tail() {
    let home = Home::new();
    let id = home.start_with(
        &["--notify"],
        "echo building; echo 'error: missing ;'; exit 2",
    );
    let first = home.json(&["notices", "--wait", "20"]);
    let notices = first["notices"].as_array().unwrap();
    assert_eq!(notices.len(), 1);
    assert_eq!(notices[0]["item"], id.as_str());
    assert_eq!(notices[0]["end"], "failed");
    assert_eq!(notices[0]["exit_code"], 2);
    assert_eq!(notices[0]["text"], format!("{id} FAILED (exit 2)"));
    assert!(notices[0]["tail"]
        .as_str()
        .unwrap()
        .contains("error: missing ;"));
    assert!(notices[0]["id"].as_str().unwrap().starts_with("ntc-"));
    assert_eq!(
        home.json(&["notices"])["notices"].as_array().unwrap().len(),
        0
    );
}

#[test]
fn peek_does_not_deliver_and_the_delivery_id_is_stable() {
    let home = Home::new();
    home.start_with(&["--notify"], "exit 0");
    let peeked = home.json(&["notices", "--peek", "--wait", "20"]);
    let again = home.json(&["notices", "--peek"]);
    assert_eq!(peeked["notices"], again["notices"]);
    let taken = home.json(&["notices"]);
    assert_eq!(taken["notices"][0]["id"], peeked["notices"][0]["id"]);
}

#[test]
fn no_notice_for_a_stop_the_agent_asked_for_nor_unarmed_work() {
    let home = Home::new();
    let stopped = home.start_with(&["--notify"], "exec sleep 1000");
    home.start("exit 0");
    let marker = home.start_with(&["--notify"], "exit 1");
    home.json(&["stop", &stopped]);
    let notices = home.json(&["notices", "--wait", "20"]);
    let items: Vec<&str> = notices["notices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["item"].as_str().unwrap())
        .collect();
    assert_eq!(items, vec![marker.as_str()]);
}

#[test]
fn follow_streams_each_notice_as_it_is_created() {
    use std::io::BufRead;
    let home = Home::new();
    let mut follower = home
        .command(&["--json", "notices", "--follow"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let id = home.start_with(&["--notify"], "echo done");
    let mut line = String::new();
    std::io::BufReader::new(follower.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    follower.kill().unwrap();
    follower.wait().unwrap();
    let notice: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(notice["item"], id.as_str());
    assert_eq!(notice["end"], "succeeded");
}

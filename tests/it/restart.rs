//! Work outlives the daemon: reattach, settle and lost after a restart or kill -9.

use crate::util::{alive, eventually, Home};
use std::time::Duration;

#[test]
fn read_cursors_survive_a_daemon_restart() {
    let home = Home::new();
    let id = home.start("echo before; read x; echo after; exec sleep 1000");
    home.json(&["wait", &id, "--until", "before", "--timeout", "20"]);
    assert_eq!(home.json(&["read", &id])["output"], "before\n");
    home.json(&["shutdown"]);
    home.json(&["send", &id, r"\n"]);
    home.json(&["wait", &id, "--until", "after", "--timeout", "20"]);
    assert_eq!(home.json(&["read", &id])["output"], "after\n");
}

#[test]
fn case8_a_killed_daemon_reattaches_running_work() {
    let home = Home::new();
    let id = home.start_with(&["--notify"], "echo one; read x; echo two; read y; exit 7");
    home.json(&["wait", &id, "--until", "one", "--timeout", "20"]);
    let pid = home.item(&id)["pid"].as_i64().unwrap() as i32;
    home.kill_daemon();
    assert!(alive(pid), "the job does not depend on the daemon");
    let item = home.item(&id);
    assert_eq!(item["state"], "running");
    home.json(&["send", &id, r"\n"]);
    home.json(&["wait", &id, "--until", "two", "--timeout", "20"]);
    home.kill_daemon();
    home.json(&["send", &id, r"\n"]);
    let item = home.wait_end(&id);
    assert_eq!(item["end"], "failed");
    assert_eq!(item["exit_code"], 7);
    let notices = home.json(&["notices"]);
    assert_eq!(
        notices["notices"].as_array().unwrap().len(),
        0,
        "wait showed the end"
    );
}

#[test]
fn case9_a_job_that_ends_while_the_daemon_is_down_is_settled_with_its_code() {
    let home = Home::new();
    let id = home.start_with(&["--notify"], "read x; echo finishing; exit 5");
    let pid = home.item(&id)["pid"].as_i64().unwrap() as i32;
    home.json(&["send", &id, r"\n"]);
    home.kill_daemon();
    eventually(Duration::from_secs(20), || !alive(pid));
    let notices = home.json(&["notices", "--wait", "20"]);
    let notices = notices["notices"].as_array().unwrap();
    assert_eq!(notices.len(), 1);
    assert_eq!(notices[0]["exit_code"], 5);
    assert!(notices[0]["tail"].as_str().unwrap().contains("finishing"));
    home.kill_daemon();
    assert_eq!(
        home.json(&["notices"])["notices"].as_array().unwrap().len(),
        0,
        "once"
    );
    assert_eq!(home.item(&id)["end"], "failed");
}

#[test]
fn case10_a_job_whose_supervisor_is_killed_ends_lost_and_does_not_linger() {
    let home = Home::new();
    let id = home.start_with(&["--notify"], "sleep 1000 & sleep 1000");
    let pid = home.item(&id)["pid"].as_i64().unwrap() as i32;
    let supervisor = parent_of(pid);
    std::process::Command::new("kill")
        .args(["-9", &supervisor.to_string()])
        .status()
        .unwrap();
    let item = home.wait_end(&id);
    assert_eq!(item["end"], "lost");
    assert_eq!(
        item["exit_code"],
        serde_json::Value::Null,
        "never an invented code"
    );
    let notices = home.json(&["notices"]);
    assert_eq!(
        notices["notices"].as_array().unwrap().len(),
        0,
        "wait delivered it"
    );
    eventually(Duration::from_secs(10), || !alive(pid));
}

#[test]
fn case11_a_restart_in_the_middle_of_a_stop_completes_the_stop() {
    let home = Home::new();
    let id = home.start("trap '' TERM; echo armed; sleep 1000; sleep 1000");
    home.json(&["wait", &id, "--until", "armed", "--timeout", "20"]);
    let mut stopper = home
        .command(&["stop", &id, "--grace", "2"])
        .spawn()
        .unwrap();
    eventually(Duration::from_secs(10), || {
        home.item(&id).get("stop_requested").is_some()
    });
    home.kill_daemon();
    let _ = stopper.wait();
    let item = home.wait_end(&id);
    assert_eq!(item["end"], "stopped_by_agent");
}

#[test]
fn case14_a_second_daemon_on_the_same_home_refuses_to_start() {
    let home = Home::new();
    home.start_daemon();
    let second = home.run(&["daemon"]);
    assert_eq!(second.code, 1);
    assert!(
        second.stderr.contains("already serves"),
        "{}",
        second.stderr
    );
    assert!(home.json(&["status"])["pid"].as_i64().unwrap() > 0);
}

fn parent_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split(' ').nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_daemon_that_lost_the_race_to_start_does_not_take_the_home_over_later() {
    // Clients that find no daemon each start one: the losers used to wait up to 2 s for
    // the home's lock, took it when the winner was shut down, and served a home nobody
    // used any more (a test's home, deleted, kept a daemon for ever).
    for _ in 0..3 {
        let home = Home::new();
        let clients: Vec<std::process::Child> = (0..4)
            .map(|_| {
                home.command(&["list"])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for mut client in clients {
            assert!(client.wait().unwrap().success(), "each client was served");
        }
        home.json(&["shutdown"]);
        eventually(Duration::from_secs(10), || {
            crate::util::processes_of(home.path()).is_empty()
        });
        // Longer than a starting daemon waits for the lock: none comes back.
        let until = std::time::Instant::now() + Duration::from_millis(2500);
        while std::time::Instant::now() < until {
            let left = crate::util::processes_of(home.path());
            assert!(left.is_empty(), "a daemon took the home over: {left:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

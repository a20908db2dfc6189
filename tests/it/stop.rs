//! Stopping work: cases 1–7 of RELIABILITY.md.

use crate::util::{alive, eventually, processes_of, Home};
use std::time::{Duration, Instant};

/// Processes of the home other than its daemon: supervisors and jobs.
fn leftovers(home: &Home) -> Vec<i32> {
    let daemon = home.daemon_pid();
    processes_of(home.path())
        .into_iter()
        .filter(|&p| p != daemon)
        .collect()
}

fn assert_all_gone(home: &Home) {
    eventually(Duration::from_secs(10), || leftovers(home).is_empty());
}

#[test]
fn case1_a_job_ignoring_term_is_killed_after_the_grace() {
    let home = Home::new();
    let id = home.start("trap '' TERM; echo armed; sleep 1000; sleep 1000");
    home.json(&["wait", &id, "--until", "armed", "--timeout", "20"]);
    let reply = home.json(&["stop", &id, "--grace", "0.5"]);
    assert_eq!(reply["state"], "ended");
    assert_eq!(reply["end"], "stopped_by_agent");
    assert_all_gone(&home);
}

#[test]
fn case2_the_whole_group_dies_pipelines_included() {
    let home = Home::new();
    let id = home.start("yes | tail -f /dev/null");
    eventually(Duration::from_secs(10), || leftovers(&home).len() >= 3);
    assert_eq!(home.json(&["stop", &id])["end"], "stopped_by_agent");
    assert_all_gone(&home);
}

#[test]
fn case3_setsid_grandchildren_and_double_forked_daemons_die_too() {
    let home = Home::new();
    let id = home
        .start("setsid sleep 1001 & (setsid sleep 1002 &); (sleep 1003 &) ; echo up; sleep 1000");
    home.json(&["wait", &id, "--until", "up", "--timeout", "20"]);
    eventually(Duration::from_secs(10), || leftovers(&home).len() >= 4);
    home.json(&["stop", &id, "--grace", "1"]);
    assert_all_gone(&home);
}

#[test]
fn case4_a_lingering_child_of_a_finished_job_is_not_left_running() {
    let home = Home::new().with("BGWORK_LINGER_MS", "300");
    let id = home.start("sleep 1000 & echo started; exit 0");
    let item = home.wait_end(&id);
    assert_eq!(item["end"], "succeeded");
    assert_eq!(item["exit_code"], 0);
    assert_all_gone(&home);
}

#[test]
fn case5_a_stopped_job_still_ends_within_the_grace() {
    let home = Home::new();
    let id = home.start("exec sleep 1000");
    let pid = home.item(&id)["pid"].as_i64().unwrap();
    std::process::Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()
        .unwrap();
    let began = Instant::now();
    let reply = home.json(&["stop", &id, "--grace", "30"]);
    assert_eq!(
        reply["state"], "ended",
        "TERM with CONT ends it before the grace"
    );
    assert_eq!(reply["end"], "stopped_by_agent");
    assert!(began.elapsed() < Duration::from_secs(25));
}

#[test]
fn case7_a_hundred_orphans_leave_no_zombie_and_no_process() {
    // Control: the same script outside bgwork leaves its orphans running.
    let script = "for i in $(seq 100); do (sleep 1000.5 &); done; echo spawned";
    let control = std::process::Command::new("bash")
        .args(["-c", script])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(control.success());
    let orphans = count_processes("1000.5");
    assert!(
        orphans >= 100,
        "the control run shows orphans survive their parent ({orphans})"
    );
    std::process::Command::new("pkill")
        .args(["-f", "sleep 1000.5"])
        .status()
        .unwrap();

    let home = Home::new().with("BGWORK_LINGER_MS", "300");
    let id = home.start(&script.replace("1000.5", "1000.7"));
    let item = home.wait_end(&id);
    assert_eq!(item["end"], "succeeded");
    assert_all_gone(&home);
    assert_eq!(count_processes("1000.7"), 0);
}

fn count_processes(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains(marker) && alive(pid)
        })
        .count()
}

#[test]
fn shutdown_with_stop_work_refuses_new_starts_and_stops_those_that_got_in() {
    // Found by a hostile tester: a job started while `shutdown --stop-work` waited for
    // a stubborn job kept running, and the shutdown said every item was stopped.
    // The session's limits are wide: on a slow machine many starts get in before the
    // shutdown begins, and a limit's refusal is not the one looked for.
    let home = Home::new()
        .with("BGWORK_MAX_RUNNING", "1000")
        .with("BGWORK_MAX_RUNNING_TOTAL", "1000")
        .with("BGWORK_MAX_STARTS_PER_MINUTE", "0");
    home.start(r#"trap "" TERM; sleep 600"#);
    let shutdown = home
        .command(&["shutdown", "--stop-work"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Starts race the shutdown: each is either refused or stopped with the rest.
    let mut refused = None;
    let deadline = Instant::now() + Duration::from_secs(20);
    while refused.is_none() && Instant::now() < deadline {
        let run = home.run(&["start", "--window", "0", "--", "sleep 500"]);
        if run.code != 0 {
            refused = Some(run.stderr);
        }
    }
    let refused = refused.expect("a start during the shutdown is refused");
    assert!(refused.contains("shutting down"), "{refused}");
    let done = shutdown.wait_with_output().unwrap();
    assert!(done.status.success());
    let said = String::from_utf8_lossy(&done.stdout);
    assert!(!said.contains("did not end"), "{said}");
    eventually(Duration::from_secs(10), || {
        processes_of(home.path()).is_empty()
    });
    let running = home.json(&["list"]);
    assert_eq!(running["items"].as_array().unwrap().len(), 0, "{running}");
}

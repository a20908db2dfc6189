//! Every row of contract §2's table of ends, and codes and signals stored apart.

use crate::util::Home;

#[test]
fn exit_zero_succeeds() {
    let home = Home::new();
    let id = home.start("echo hi; exit 0");
    let item = home.wait_end(&id);
    assert_eq!(item["end"], "succeeded");
    assert_eq!(item["exit_code"], 0);
    assert_eq!(item["signal"], serde_json::Value::Null);
    assert_eq!(
        item["report"],
        format!("{id} finished successfully (exit 0)")
    );
}

#[test]
fn nonzero_exit_fails_with_its_code() {
    let home = Home::new();
    let id = home.start("exit 2");
    let item = home.wait_end(&id);
    assert_eq!(item["end"], "failed");
    assert_eq!(item["exit_code"], 2);
    assert_eq!(item["report"], format!("{id} FAILED (exit 2)"));
}

#[test]
fn a_stop_by_the_agent_or_the_person_is_recorded_as_such() {
    let home = Home::new();
    let agent = home.start("sleep 1000");
    let person = home.start("sleep 1000");
    let stopped = home.json(&["stop", &agent]);
    assert_eq!(stopped["end"], "stopped_by_agent");
    let stopped = home.json(&["stop", &person, "--as", "person"]);
    assert_eq!(stopped["end"], "stopped_by_person");
    assert_eq!(
        stopped["report"],
        format!("{person} was stopped by the person")
    );
}

#[test]
fn stop_signals_from_elsewhere_are_signaled() {
    let home = Home::new();
    let by_code = home.start("exit 143");
    let by_signal = home.start("kill -TERM $$");
    let item = home.wait_end(&by_code);
    assert_eq!(item["end"], "signaled");
    assert_eq!(item["exit_code"], 143);
    let item = home.wait_end(&by_signal);
    assert_eq!(item["end"], "signaled");
    assert_eq!(item["exit_code"], serde_json::Value::Null);
    assert_eq!(item["signal"], 15);
}

#[test]
fn a_missing_cwd_is_spawn_failed_and_the_record_is_kept() {
    let home = Home::new();
    let (code, error, message) = home.error(&["start", "--cwd", "/no/such/dir", "--", "true"]);
    assert_eq!(code, 1);
    assert_eq!(error, "spawn_failed");
    assert!(message.contains("/no/such/dir"), "{message}");
    let item = home.item("bg-1");
    assert_eq!(item["end"], "spawn_failed");
    assert_eq!(item["exit_code"], serde_json::Value::Null);
}

#[test]
fn exit_codes_and_signals_are_stored_apart() {
    let home = Home::new();
    let codes = [0, 1, 2, 42, 127, 128, 200, 254, 255];
    let coded: Vec<(i32, String)> = codes
        .iter()
        .map(|c| (*c, home.start(&format!("exit {c}"))))
        .collect();
    let signals = [
        (1, "HUP"),
        (6, "ABRT"),
        (9, "KILL"),
        (15, "TERM"),
        (10, "USR1"),
    ];
    let signalled: Vec<(i32, String)> = signals
        .iter()
        .map(|(n, name)| (*n, home.start(&format!("kill -{name} $$"))))
        .collect();
    for (code, id) in coded {
        let item = home.wait_end(&id);
        assert_eq!(item["exit_code"], code, "{item}");
        assert_eq!(item["signal"], serde_json::Value::Null);
    }
    for (signal, id) in signalled {
        let item = home.wait_end(&id);
        assert_eq!(item["signal"], signal, "{item}");
        assert_eq!(
            item["exit_code"],
            serde_json::Value::Null,
            "never an invented code"
        );
        assert_eq!(item["end"], "signaled");
    }
}

#[test]
fn a_job_that_ends_inside_the_window_reports_its_end_at_once() {
    let home = Home::new();
    let reply = home.json(&["start", "--window", "5000", "--", "echo quick; exit 4"]);
    assert_eq!(reply["state"], "ended");
    assert_eq!(reply["end"], "failed");
    assert_eq!(reply["exit_code"], 4);
    assert_eq!(reply["output"], "quick\n");
}

#[test]
fn the_window_shows_first_output_of_a_running_job() {
    let home = Home::new();
    let reply = home.json(&[
        "start",
        "--window",
        "1500",
        "--",
        "echo ready; exec sleep 1000",
    ]);
    assert_eq!(reply["state"], "running");
    assert!(reply["pid"].as_i64().unwrap() > 0);
    // The window ends when its time is up; what it showed counts as read.
    let read = home.json(&["read", reply["id"].as_str().unwrap()]);
    assert_eq!(read["output"], "");
    assert_eq!(read["running"], true);
    assert!(reply["output"].as_str().unwrap().contains("ready"));
}

//! Panes (PTY jobs with a screen and keystrokes) and `run` with promotion.

use crate::util::{eventually, Home};
use std::time::Duration;

fn pane(home: &Home, command: &str) -> String {
    home.start_with(&["--pty"], command)
}

/// What `read --screen` shows of a pane now.
pub(crate) fn screen(home: &Home, id: &str) -> String {
    home.json(&["read", id, "--screen"])["output"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Waits (at most 30 s) until the item's output matches `pattern`.
pub(crate) fn until(home: &Home, id: &str, pattern: &str) {
    let reply = home
        .run(&["--json", "wait", id, "--until", pattern, "--timeout", "30"])
        .json();
    assert_eq!(reply["reason"], "matched", "{pattern}: {reply}");
}

#[test]
fn python_computes_and_the_answer_is_read_off_the_screen_even_after_a_restart() {
    let home = Home::new();
    let id = pane(&home, "python3 -i -q");
    assert_eq!(home.item(&id)["kind"], "pane");
    until(&home, &id, ">>>");
    home.json(&["send", &id, r"print(sum(range(101)))\n"]);
    until(&home, &id, "^5050");
    home.kill_daemon();
    let text = screen(&home, &id);
    assert!(text.lines().any(|l| l.trim() == "5050"), "{text}");
    home.json(&["send", &id, "--key", "C-d"]);
    assert_eq!(home.wait_end(&id)["end"], "succeeded");
}

#[test]
fn a_prompt_is_answered_with_send() {
    let home = Home::new();
    let id = pane(
        &home,
        r#"read -p "Proceed? [y/n] " answer; echo "you said $answer""#,
    );
    until(&home, &id, r"Proceed\? \[y/n\]");
    home.json(&["send", &id, "y", "--key", "Enter"]);
    assert_eq!(home.wait_end(&id)["end"], "succeeded");
    assert!(screen(&home, &id).contains("you said y"));
}

#[test]
fn ctrl_c_interrupts_a_sleep_in_the_panes_shell() {
    let home = Home::new();
    let id = pane(&home, "bash --norc -i");
    home.json(&["send", &id, r"sleep 1000; echo finished-$?\n"]);
    eventually(Duration::from_secs(10), || {
        crate::util::processes_of(home.path()).iter().any(|&pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default()
                == b"sleep\x001000\x00"
        })
    });
    home.json(&["send", &id, "--key", "C-c"]);
    home.json(&["send", &id, r"echo alive-after-interrupt\n"]);
    until(&home, &id, "^alive-after-interrupt");
    assert_eq!(
        home.item(&id)["state"],
        "running",
        "only the sleep was interrupted"
    );
}

#[test]
fn a_resize_is_seen_by_tput() {
    let home = Home::new();
    let id = home.start_with(
        &["--pty", "--cols", "100", "--rows", "30"],
        "bash --norc -i",
    );
    home.json(&["send", &id, r"tput cols\n"]);
    until(&home, &id, "^100");
    home.json(&["resize", &id, "--cols", "77", "--rows", "20"]);
    home.json(&["send", &id, r"tput cols; tput lines\n"]);
    until(&home, &id, "^20");
    let text = screen(&home, &id);
    assert!(text.lines().any(|l| l.trim() == "77"), "{text}");
}

#[test]
fn a_progress_bar_of_a_thousand_frames_reads_as_one_line() {
    let home = Home::new();
    let id = pane(
        &home,
        r#"for i in $(seq 1000); do printf "\rprogress %d/1000" $i; done; echo; echo done"#,
    );
    home.wait_end(&id);
    let output = home.json(&["read", &id, "--all"])["output"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(output, "progress 1000/1000\ndone\n");
}

#[test]
fn a_pane_whose_terminal_hangs_up_is_cancelled() {
    let home = Home::new();
    let id = pane(&home, "kill -HUP $$");
    let item = home.wait_end(&id);
    assert_eq!(item["end"], "cancelled");
    assert_eq!(item["report"], format!("{id} was cancelled (pane closed)"));
}

#[test]
fn input_to_a_job_whose_stdin_is_closed_is_refused_with_no_input() {
    let home = Home::new();
    let id = home.start("exec 0<&-; exec sleep 1000");
    eventually(Duration::from_secs(10), || {
        let run = home.run(&["--json", "send", &id, "hello"]);
        run.code != 0 && run.json()["error"]["code"] == "no_input"
    });
    let (_, _, message) = home.error(&["send", &id, "hello"]);
    assert!(message.contains("stdin is closed"), "{message}");
}

#[test]
fn run_ends_in_time_with_the_commands_own_status() {
    let home = Home::new();
    let run = home.run(&[
        "run",
        "--timeout",
        "20",
        "--",
        "echo out; echo err >&2; exit 3",
    ]);
    assert_eq!(run.code, 3);
    assert_eq!(run.stdout, "out\nerr\n");
}

#[test]
fn run_past_its_deadline_is_promoted_and_loses_no_output() {
    let home = Home::new();
    // The caller's stdin stays open (a terminal's would), so `read` waits past the
    // deadline; after the promotion the job takes `send`.
    let mut child = home
        .command(&[
            "--json",
            "run",
            "--timeout",
            "0.5",
            "--notify",
            "--",
            "echo before; read x; echo after; exit 4",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let held = child.stdin.take();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0));
    let reply: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(reply["outcome"], "promoted");
    assert_eq!(reply["state"], "running");
    let id = reply["id"].as_str().unwrap().to_string();
    assert!(reply["output"].as_str().unwrap().contains("before"));
    let text = home.run(&["run", "--timeout", "0.3", "--", "sleep 1000"]);
    assert_eq!(text.code, 0);
    assert!(
        text.stderr.contains("promoted to the background"),
        "{}",
        text.stderr
    );
    home.json(&["send", &id, r"\n"]);
    // The caller's pipe ends only now (its end would be the job's end of input).
    drop(held);
    let notices = home.json(&["notices", "--wait", "20"]);
    assert_eq!(notices["notices"][0]["item"], id.as_str());
    assert_eq!(notices["notices"][0]["exit_code"], 4);
    assert_eq!(
        home.json(&["read", &id, "--all"])["output"],
        "before\nafter\n"
    );
    assert_eq!(
        home.json(&["read", &id])["output"],
        "after\n",
        "the run showed the rest"
    );
}

#[test]
fn run_past_its_deadline_at_the_limit_is_killed_and_says_so() {
    let home = Home::new().with("BGWORK_MAX_RUNNING", "2");
    home.start("exec sleep 1000");
    home.start("exec sleep 1000");
    let run = home.run(&["--json", "run", "--timeout", "0.3", "--", "exec sleep 1000"]);
    assert_eq!(run.code, 1);
    let reply = run.json();
    assert_eq!(reply["outcome"], "killed");
    assert_eq!(reply["state"], "ended");
    assert!(reply["message"].as_str().unwrap().contains("limit"));
}

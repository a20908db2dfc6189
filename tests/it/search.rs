//! Issue 15, items 5 and 8: `read --grep` over the whole kept log (CLI and MCP), and
//! the guard rails on starting work (a daemon-wide cap, a start rate per session).

use crate::mcp::Mcp;
use crate::util::{eventually, Home};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The bytes of a job's log at `offset`, `len` long.
fn log_bytes(home: &Home, id: &str, offset: u64, len: usize) -> String {
    let path = home.item(id)["log_path"].as_str().unwrap().to_string();
    let bytes = std::fs::read(path).unwrap();
    let start = offset as usize;
    String::from_utf8_lossy(&bytes[start..start + len]).into_owned()
}

fn lines(matches: &Value) -> Vec<(u64, u64, String)> {
    matches
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["line"].as_u64().unwrap(),
                m["offset"].as_u64().unwrap(),
                m["text"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

const NUMBERS: &str = "for i in $(seq 1 40); do echo \"line $i\"; done; \
                       printf '\\033[31mERROR\\033[0m: red\\n'; echo done";

#[test]
fn issue15_5_grep_finds_lines_with_their_numbers_and_offsets() {
    let home = Home::new();
    let id = home.start(NUMBERS);
    home.wait_end(&id);
    let reply = home.json(&["read", &id, "--grep", r"line [23]7$|ERROR"]);
    let found = lines(&reply["matches"]);
    assert_eq!(
        found
            .iter()
            .map(|(l, _, t)| (*l, t.as_str()))
            .collect::<Vec<_>>(),
        vec![(27, "line 27"), (37, "line 37"), (41, "ERROR: red")],
        "{reply}"
    );
    for (_, offset, text) in &found[..2] {
        assert_eq!(&log_bytes(&home, &id, *offset, text.len()), text);
    }
    // The colored line is shown (and matched) as `read` shows it; its offset is its
    // first byte, the escape.
    assert_eq!(log_bytes(&home, &id, found[2].1, 1), "\u{1b}");
    assert_eq!(reply["truncated"], false);
    assert_eq!(reply["from"], 0);
    // The text form is grep's: LINE:BYTE:TEXT.
    let text = home.run(&["read", &id, "--grep", "line 27$"]).stdout;
    assert!(
        text.starts_with(&format!("27:{}:line 27\n", found[0].1)),
        "{text}"
    );
    assert!(text.contains("the read position did not move"), "{text}");
    // No match is not an error.
    let none = home.json(&["read", &id, "--grep", "absent"]);
    assert_eq!(none["matches"], json!([]));
}

#[test]
fn issue15_5_grep_shows_context_lines_once() {
    let home = Home::new();
    let id = home.start(NUMBERS);
    home.wait_end(&id);
    let reply = home.json(&["read", &id, "--grep", "^line (10|12|30)$", "--context", "2"]);
    let m = reply["matches"].as_array().unwrap();
    assert_eq!(m.len(), 3, "{reply}");
    let texts = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .map(|l| l["text"].as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(texts(&m[0]["before"]), ["line 8", "line 9"]);
    assert_eq!(
        texts(&m[0]["after"]),
        ["line 11"],
        "stops at the next match"
    );
    assert_eq!(
        texts(&m[1]["before"]),
        Vec::<String>::new(),
        "shown already"
    );
    assert_eq!(texts(&m[1]["after"]), ["line 13", "line 14"]);
    assert_eq!(m[2]["before"][0]["line"], 28);
    let text = home
        .run(&["read", &id, "--grep", "^line 30$", "-C", "1"])
        .stdout;
    let printed: Vec<&str> = text.lines().collect();
    assert!(printed[0].starts_with("29-") && printed[0].ends_with("-line 29"));
    assert!(printed[1].starts_with("30:") && printed[1].ends_with(":line 30"));
    assert!(printed[2].starts_with("31-"), "{text}");
}

#[test]
fn issue15_5_grep_does_not_move_the_read_cursor() {
    let home = Home::new();
    let id = home.start("echo first; echo second; echo third");
    home.wait_end(&id);
    let reply = home.json(&["read", &id, "--grep", "second"]);
    assert_eq!(lines(&reply["matches"]), vec![(2, 6, "second".to_string())]);
    let read = home.json(&["read", &id]);
    assert_eq!(
        read["output"], "first\nsecond\nthird\n",
        "everything is still unread"
    );
    // And after a read, a search still sees the whole log.
    let again = home.json(&["read", &id, "--grep", "first"]);
    assert_eq!(lines(&again["matches"]).len(), 1);
    assert_eq!(home.json(&["read", &id])["output"], "");
}

#[test]
fn issue15_5_grep_searches_head_and_tail_across_the_dropped_middle() {
    let home = Home::new()
        .with("BGWORK_LOG_CAP", "131072")
        .with("BGWORK_LOG_HEAD", "16384");
    // 4 MiB of filler between a marked head, a marked middle and a marked tail.
    let id = home.start(
        "echo 'HEAD mark'; yes filler-line-of-text | head -c 2000000; echo; echo 'MIDDLE mark'; \
         yes filler-line-of-text | head -c 2000000; echo; echo 'TAIL mark'; echo end",
    );
    home.wait_end(&id);
    let reply = home.json(&["read", &id, "--grep", "mark$", "--context", "1"]);
    let m = reply["matches"].as_array().unwrap();
    assert!(reply["dropped_bytes"].as_u64().unwrap() > 0, "{reply}");
    let texts: Vec<&str> = m.iter().map(|m| m["text"].as_str().unwrap()).collect();
    assert_eq!(texts, ["HEAD mark", "TAIL mark"], "the middle was dropped");
    assert_eq!(m[0]["line"], 1);
    assert!(m[0].get("line_at_least").is_none());
    assert_eq!(m[1]["line_at_least"], true, "{reply}");
    let offset = m[1]["offset"].as_u64().unwrap();
    assert_eq!(log_bytes(&home, &id, offset, 9), "TAIL mark");
    assert_eq!(m[1]["after"][0]["text"], "end");
    let text = home.run(&["read", &id, "--grep", "mark$"]).stdout;
    assert!(text.contains("dropped by the log cap"), "{text}");
    assert!(text.contains(&format!(":{offset}:TAIL mark")), "{text}");
    assert!(text.contains('≥'), "{text}");
}

#[test]
fn issue15_5_a_bad_regex_is_a_clear_error_and_the_daemon_keeps_serving() {
    let home = Home::new();
    let id = home.start("echo hello");
    home.wait_end(&id);
    let (_, code, message) = home.error(&["read", &id, "--grep", "(unclosed"]);
    assert_eq!(code, "bad_request");
    assert!(
        message.contains("--grep is not a valid regular expression")
            && message.contains("unclosed"),
        "{message}"
    );
    // A pattern that would compile to something huge is refused at once.
    let began = Instant::now();
    let (_, code, message) = home.error(&["read", &id, "--grep", r"\w{500}\w{500}\w{500}\w{500}"]);
    assert_eq!(code, "bad_request");
    assert!(message.contains("too large once compiled"), "{message}");
    assert!(began.elapsed() < Duration::from_secs(10));
    let (_, _, message) = home.error(&["read", &id, "--grep", "x", "--context", "1000"]);
    assert!(message.contains("--context 1000"), "{message}");
    let (_, _, message) = home.error(&["read", &id, "--grep", "x", "--max-matches", "0"]);
    assert!(message.contains("--max-matches"), "{message}");
    // The daemon goes on serving.
    let reply = home.json(&["read", &id, "--grep", "hel+o"]);
    assert_eq!(lines(&reply["matches"]), vec![(1, 0, "hello".to_string())]);
    assert_eq!(home.json(&["list", "--all"])["items"][0]["id"], id.as_str());
}

#[test]
fn issue15_5_a_search_stops_at_its_most_matches_and_says_where_to_go_on() {
    let home = Home::new();
    let id = home.start("seq 1 5000");
    home.wait_end(&id);
    let reply = home.json(&["read", &id, "--grep", "7", "--max-matches", "10"]);
    assert_eq!(reply["matches"].as_array().unwrap().len(), 10);
    assert_eq!(reply["truncated"], true);
    let next = reply["next_from"].as_u64().unwrap();
    let message = reply["message"].as_str().unwrap();
    assert!(
        message.contains("more matches") && message.contains(&format!("--from {next}")),
        "{message}"
    );
    // Going on from there continues with the next match, numbered as before.
    let more = home.json(&[
        "read",
        &id,
        "--grep",
        "7",
        "--max-matches",
        "1",
        "--from",
        &next.to_string(),
    ]);
    assert_eq!(more["matches"][0]["offset"], next);
    // 7, 17, … 67, 70, 71, 72 were the first ten.
    assert_eq!(more["matches"][0]["text"], "73");
    assert_eq!(more["matches"][0]["line"], 73);
}

#[test]
fn issue15_5_grep_while_the_job_writes_and_after_its_log_is_deleted() {
    let home = Home::new().with("BGWORK_LOG_CAP", "1048576");
    let id = home.start("while :; do echo 'tick ERROR here'; seq 1 2000; done");
    eventually(Duration::from_secs(20), || {
        home.item(&id)["state"] == "running"
            && home.json(&["read", &id, "--grep", "ERROR", "--max-matches", "1"])["matches"]
                .as_array()
                .is_some_and(|m| !m.is_empty())
    });
    for _ in 0..5 {
        let reply = home.json(&["read", &id, "--grep", "ERROR", "--max-matches", "5"]);
        for m in reply["matches"].as_array().unwrap() {
            assert_eq!(m["text"], "tick ERROR here");
        }
    }
    let path = home.item(&id)["log_path"].as_str().unwrap().to_string();
    std::fs::remove_file(&path).unwrap();
    let reply = home.json(&["read", &id, "--grep", "ERROR"]);
    assert_eq!(
        reply["matches"],
        json!([]),
        "a log that is gone holds nothing"
    );
    home.json(&["stop", &id]);
    assert_eq!(home.json(&["list", "--all"])["items"][0]["id"], id.as_str());
}

#[test]
fn issue15_5_mcp_read_with_grep() {
    let home = Home::new();
    let mut mcp = Mcp::start(&home);
    let (error, started) = mcp.call(
        "start",
        json!({"command": "seq 1 300; echo 'failed: disk'", "window_ms": 0}),
    );
    assert!(!error);
    let id = started["id"].as_str().unwrap().to_string();
    let (_, waited) = mcp.call("wait", json!({"ids": [id], "timeout_s": 20}));
    assert_eq!(waited["reason"], "ended");
    let (error, found) = mcp.call("read", json!({"id": id, "grep": "^failed", "context": 1}));
    assert!(!error, "{found}");
    assert_eq!(found["matches"][0]["line"], 301, "{found}");
    assert_eq!(found["matches"][0]["text"], "failed: disk");
    assert_eq!(found["matches"][0]["before"][0]["text"], "300");
    // A model gets at most 100 matches unless it asks for more.
    let (_, many) = mcp.call("read", json!({"id": id, "grep": "[0-9]"}));
    assert_eq!(many["matches"].as_array().unwrap().len(), 100);
    assert_eq!(many["truncated"], true);
    let (error, bad) = mcp.call("read", json!({"id": id, "grep": "[z-a]"}));
    assert!(error);
    assert!(
        bad.to_string().contains("not a valid regular expression"),
        "{bad}"
    );
    // The read position did not move.
    let (_, read) = mcp.call("read", json!({"id": id, "tail": 1}));
    assert!(read["output"].as_str().unwrap().contains("failed: disk"));
    let (_, read) = mcp.call("read", json!({"id": id}));
    assert!(read["output"].as_str().unwrap().starts_with("1\n2\n"));
}

// ------------------------------------------------------------------ guard rails

#[test]
fn issue15_8_the_running_total_is_capped_across_sessions() {
    let home = Home::new().with("BGWORK_MAX_RUNNING_TOTAL", "3");
    let start = |session: &str| {
        home.run(&[
            "--json",
            "--session",
            session,
            "start",
            "--window",
            "0",
            "--",
            "sleep 600",
        ])
    };
    for session in ["one", "one", "two"] {
        let run = start(session);
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    }
    let refused = start("two");
    assert_ne!(refused.code, 0);
    let error = &refused.json()["error"];
    assert_eq!(error["code"], "limit");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("cap of 3") && message.contains("BGWORK_MAX_RUNNING_TOTAL"),
        "{message}"
    );
    // Monitors count and are refused the same way.
    let monitor = home.run(&[
        "--json",
        "--session",
        "three",
        "monitor",
        "wait",
        "--until-file",
        "/tmp/none-such",
    ]);
    assert!(
        monitor.stdout.contains("BGWORK_MAX_RUNNING_TOTAL"),
        "{}",
        monitor.stdout
    );
    // Room again once one ends.
    let one = home.run(&["--json", "--session", "one", "list"]).json();
    let first = one["items"][0]["id"].as_str().unwrap().to_string();
    home.run(&["--session", "one", "stop", &first, "--grace", "0"]);
    let run = start("two");
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    home.run(&["shutdown", "--stop-work"]);
}

#[test]
fn issue15_8_the_start_rate_guard_counts_every_kind_of_start() {
    let home = Home::new().with("BGWORK_MAX_STARTS_PER_MINUTE", "5");
    let job = home.start("sleep 600");
    home.json(&["start", "--window", "0", "--pty", "--", "sleep 600"]);
    home.json(&["monitor", "watch", "--output", &job, "--regex", "x"]);
    home.json(&["agent", "start", "--", "sleep 600"]);
    home.json(&["restart", &job, "--window", "0"]);
    let (_, code, message) = home.error(&["start", "--", "true"]);
    assert_eq!(code, "limit");
    assert!(
        message.contains("5 starts a minute") && message.contains("BGWORK_MAX_STARTS_PER_MINUTE"),
        "{message}"
    );
    let (_, _, message) = home.error(&["run", "--", "true"]);
    assert!(message.contains("5 starts a minute"), "{message}");
    // Another session has its own count.
    let other = home.run(&["--json", "--session", "other", "start", "--", "true"]);
    assert_eq!(other.code, 0, "{}", other.stderr);
    home.run(&["shutdown", "--stop-work"]);
}

#[test]
fn issue15_8_the_start_rate_guard_defaults_to_60_a_minute_and_0_turns_it_off() {
    // The default: 60 starts pass, the 61st is refused.
    let mut home = Home::new()
        .with("BGWORK_MAX_RUNNING", "1000")
        .with("BGWORK_LOG_CAP", "65536");
    home.env
        .retain(|(k, _)| k != "BGWORK_MAX_STARTS_PER_MINUTE");
    for n in 0..60 {
        let run = home.run(&["--json", "start", "--window", "0", "--", "true"]);
        assert_eq!(run.code, 0, "start {n}: {}", run.stdout);
    }
    let (_, _, message) = home.error(&["start", "--", "true"]);
    assert!(message.contains("60 starts a minute"), "{message}");
    home.run(&["shutdown", "--stop-work"]);

    let home = Home::new()
        .with("BGWORK_MAX_RUNNING", "1000")
        .with("BGWORK_MAX_STARTS_PER_MINUTE", "0");
    for n in 0..70 {
        let run = home.run(&["--json", "start", "--window", "0", "--", "true"]);
        assert_eq!(run.code, 0, "start {n}: {}", run.stdout);
    }
    home.run(&["shutdown", "--stop-work"]);
}

#[test]
fn issue15_8_a_refused_start_does_not_count_toward_the_rate() {
    let home = Home::new()
        .with("BGWORK_MAX_RUNNING", "1")
        .with("BGWORK_MAX_STARTS_PER_MINUTE", "2");
    let first = home.start("sleep 600");
    // Refused by the session's limit: not a start.
    let (_, code, message) = home.error(&["start", "--", "sleep 600"]);
    assert_eq!(code, "limit");
    assert!(message.contains("its limit"), "{message}");
    home.json(&["stop", &first, "--grace", "0"]);
    // So this is the second start of the minute, within the rate of 2.
    home.start("sleep 600");
    let (_, _, message) = home.error(&["start", "--", "true"]);
    assert!(message.contains("2 starts a minute"), "{message}");
    home.run(&["shutdown", "--stop-work"]);
}

#[test]
fn issue15_8_the_guards_hold_for_mcp_too() {
    let home = Home::new()
        .with("BGWORK_MAX_STARTS_PER_MINUTE", "1")
        .with("BGWORK_MAX_RUNNING_TOTAL", "2");
    let mut mcp = Mcp::start(&home);
    let (error, _) = mcp.call("start", json!({"command": "sleep 600", "window_ms": 0}));
    assert!(!error);
    let (error, refused) = mcp.call("start", json!({"command": "sleep 600", "window_ms": 0}));
    assert!(error);
    assert_eq!(refused["error"]["code"], "limit", "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("1 start a minute") && message.contains("BGWORK_MAX_STARTS_PER_MINUTE"),
        "{message}"
    );
    // The cap counts the CLI's work and the MCP server's alike.
    let other = home.run(&["--json", "--session", "cli", "start", "--", "sleep 600"]);
    assert_eq!(other.code, 0, "{}", other.stdout);
    let (_, _, message) = home.error(&["--session", "cli2", "start", "--", "true"]);
    assert!(message.contains("cap of 2"), "{message}");
    home.run(&["shutdown", "--stop-work"]);
}

#[test]
fn issue15_8_a_run_past_its_deadline_is_not_promoted_past_the_daemon_cap() {
    let home = Home::new().with("BGWORK_MAX_RUNNING_TOTAL", "1");
    home.run(&[
        "--session",
        "other",
        "start",
        "--window",
        "0",
        "--",
        "exec sleep 1000",
    ]);
    // A foreground run starts past the cap (as past a session's limit) …
    let run = home.run(&["--json", "run", "--timeout", "0.3", "--", "exec sleep 1000"]);
    let reply = run.json();
    // … and is killed, not promoted, at its deadline, saying which limit.
    assert_eq!(reply["outcome"], "killed", "{reply}");
    let message = reply["message"].as_str().unwrap();
    assert!(
        message.contains("cap of 1 running item across all sessions"),
        "{message}"
    );
    let id = reply["id"].as_str().unwrap();
    let report = home.item(id)["report"].as_str().unwrap().to_string();
    assert!(report.contains("BGWORK_MAX_RUNNING_TOTAL"), "{report}");
    home.run(&["shutdown", "--stop-work"]);
}

#[test]
fn issue15_8_a_restart_the_rate_refuses_leaves_the_item_running() {
    let home = Home::new().with("BGWORK_MAX_STARTS_PER_MINUTE", "2");
    let first = home.start("exec sleep 600");
    let again = home.json(&["restart", &first, "--window", "0"]);
    let second = again["id"].as_str().unwrap().to_string();
    let (_, code, message) = home.error(&["restart", &second, "--window", "0"]);
    assert_eq!(code, "limit");
    assert!(message.contains("2 starts a minute"), "{message}");
    eventually(Duration::from_secs(10), || {
        home.item(&second)["state"] == "running"
    });
    home.run(&["shutdown", "--stop-work"]);
}

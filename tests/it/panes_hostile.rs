//! Panes, incremental reads and `run` under hostile use (issues 10 and 16): screens that
//! leak across sessions or eat memory, slow screens of huge logs, resizes lost by a
//! restart, keys refused, characters split between reads, a `run` whose stdin never
//! closes, and a `run` killed at the limit that reads as the agent's own stop.

use crate::panes::{screen, until};
use crate::util::{eventually, Home};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn log_path(home: &Home, id: &str) -> PathBuf {
    PathBuf::from(home.item(id)["log_path"].as_str().unwrap())
}

fn log_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// The daemon's resident memory in bytes.
fn rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

fn timed(home: &Home, args: &[&str]) -> (Duration, Value) {
    let started = Instant::now();
    let reply = home.json(args);
    (started.elapsed(), reply)
}

#[test]
fn issue10_8_a_pane_that_reuses_a_row_after_gc_never_shows_the_old_panes_screen() {
    let mut home = Home::new().with("BGWORK_RETAIN_S", "0");
    home.session = "alice".into();
    let old = home.start_with(&["--pty"], "echo SECRET-OF-ALICE; exec sleep 100000");
    until(&home, &old, "SECRET-OF-ALICE");
    assert!(screen(&home, &old).contains("SECRET-OF-ALICE"));
    home.json(&["stop", &old]);
    home.wait_end(&old);
    assert_eq!(home.json(&["gc"])["removed"], 1);
    home.session = "bob".into();
    let new = home.start_with(&["--pty"], "echo bob-here; exec sleep 100000");
    until(&home, &new, "bob-here");
    let text = screen(&home, &new);
    assert!(!text.contains("SECRET"), "another session's screen: {text}");
    assert!(text.contains("bob-here"), "{text}");
}

#[test]
fn issue10_8_pane_sizes_past_500_by_200_are_refused_clearly() {
    let home = Home::new();
    for (cols, rows) in [("1000", "1000"), ("501", "40"), ("120", "201"), ("1", "40")] {
        let (code, error, message) = home.error(&[
            "start", "--window", "0", "--pty", "--cols", cols, "--rows", rows, "--", "true",
        ]);
        assert_eq!((code, error.as_str()), (2, "bad_request"), "{cols}x{rows}");
        assert!(
            message.contains("--cols takes 2 to 500 and --rows 2 to 200"),
            "{message}"
        );
    }
    let id = home.start_with(
        &["--pty", "--cols", "500", "--rows", "200"],
        "exec sleep 1000",
    );
    let (code, error, message) = home.error(&["resize", &id, "--cols", "1000", "--rows", "1000"]);
    assert_eq!((code, error.as_str()), (2, "bad_request"));
    assert!(message.contains("refused"), "{message}");
    assert!(home.json(&["list"])["items"].as_array().unwrap().len() == 1);
}

#[test]
fn issue16_4_the_screen_of_a_300_mb_pane_answers_within_100_ms_even_after_a_restart() {
    let home = Home::new();
    let id = home.start_with(&["--pty"], "echo ready; exec sleep 100000");
    until(&home, &id, "ready");
    // A pty moves a few MB/s in a debug build, so the test writes the log that a `yes`
    // pane would have left: 300 MB, the newest megabyte of it `y` lines.
    let log = log_path(&home, &id);
    let mut file = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
    file.set_len(300_000_000 - (1 << 20)).unwrap();
    file.seek_end();
    file.write_all(&b"y\r\n".repeat((1 << 20) / 3)).unwrap();
    file.write_all(b"the last line").unwrap();
    drop(file);
    assert!(log_len(&log) > 300_000_000);
    let check = |text: &str| {
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 40, "{text}");
        assert_eq!(lines[39], "the last line");
        assert!(lines[..39].iter().all(|l| *l == "y"), "{text}");
    };
    let (first, reply) = timed(&home, &["read", &id, "--screen"]);
    check(reply["output"].as_str().unwrap());
    assert!(first < Duration::from_secs(2), "first read: {first:?}");
    // The first read after a restart has no screen kept: it is built from the log. The
    // best of three restarts must be within 100 ms (the machine may be busy), and none
    // may be slow.
    let mut best = Duration::MAX;
    for _ in 0..3 {
        home.kill_daemon();
        home.start_daemon();
        let (took, reply) = timed(&home, &["read", &id, "--screen"]);
        check(reply["output"].as_str().unwrap());
        assert!(took < Duration::from_secs(2), "after a restart: {took:?}");
        best = best.min(took);
        if best <= Duration::from_millis(100) {
            break;
        }
    }
    assert!(best <= Duration::from_millis(100), "best {best:?}");
}

trait SeekEnd {
    fn seek_end(&mut self);
}

impl SeekEnd for std::fs::File {
    fn seek_end(&mut self) {
        use std::io::Seek;
        self.seek(std::io::SeekFrom::End(0)).unwrap();
    }
}

#[test]
fn issue16_4_eight_largest_panes_give_their_memory_back_after_they_end_and_gc() {
    let home = Home::new()
        .with("BGWORK_RETAIN_S", "0")
        .with("BGWORK_MAX_RUNNING", "20");
    let pid = home.daemon_pid();
    // Fill the main and the alternate screen of each.
    let fill = "for s in main alt; do for i in $(seq 250); do printf '%0500d' $i; done; \
                printf '\\e[?1049h'; done; echo; echo filled; exec sleep 100000";
    let ids: Vec<String> = (0..8)
        .map(|_| home.start_with(&["--pty", "--cols", "500", "--rows", "200"], fill))
        .collect();
    let before = rss(pid);
    for id in &ids {
        until(&home, id, "filled");
        assert!(screen(&home, id).contains("filled"));
    }
    let running = rss(pid);
    for id in &ids {
        home.json(&["stop", id]);
        home.wait_end(id);
        assert!(
            screen(&home, id).contains("filled"),
            "an ended pane's screen"
        );
    }
    assert_eq!(home.json(&["gc"])["removed"], 8);
    let after = rss(pid);
    eprintln!("daemon rss: {before} before, {running} while read, {after} after gc");
    assert!(
        running < before + (64 << 20),
        "screens kept while running: {before} -> {running}"
    );
    assert!(
        after < before + (32 << 20),
        "memory kept after the panes ended: {before} -> {after}"
    );
}

#[test]
fn issue16_12_function_keys_insert_and_ctrl_backslash_reach_a_pane() {
    let home = Home::new();
    let id = home.start_with(&["--pty"], "stty -isig -echo; echo ready; exec cat -v");
    until(&home, &id, "ready");
    let mut args = vec!["send", id.as_str()];
    let keys = [
        "F1", "F2", "F3", "F4", "F5", "F6", "F7", "F8", "F9", "F10", "F11", "F12", "Insert", r"C-\",
    ];
    for key in &keys {
        args.extend(["--key", key]);
    }
    home.json(&args);
    home.json(&["send", &id, "END", "--key", "Enter"]);
    until(&home, &id, "END$");
    let text = home.json(&["read", &id, "--all"])["output"]
        .as_str()
        .unwrap()
        .to_string();
    let line = text.lines().find(|l| l.ends_with("END")).unwrap();
    assert_eq!(
        line,
        r"^[OP^[OQ^[OR^[OS^[[15~^[[17~^[[18~^[[19~^[[20~^[[21~^[[23~^[[24~^[[2~^\END"
    );
    let (code, error, message) = home.error(&["send", &id, "--key", "F13"]);
    assert_eq!((code, error.as_str()), (2, "bad_request"));
    assert!(message.contains("F1..F12"), "{message}");
}

#[test]
fn issue16_12_a_resized_panes_screen_is_the_same_after_a_daemon_restart() {
    let home = Home::new();
    let script = "printf 'a%.0s' $(seq 100); echo; printf 'b%.0s' $(seq 100); echo; \
                  echo before-resize; read x; \
                  printf 'c%.0s' $(seq 50); echo; echo after-resize; exec sleep 100000";
    let id = home.start_with(&["--pty", "--cols", "60", "--rows", "10"], script);
    until(&home, &id, "before-resize");
    // The screen is read at the first size, then kept and resized.
    assert!(screen(&home, &id).contains("before-resize"));
    home.json(&["resize", &id, "--cols", "30", "--rows", "10"]);
    home.json(&["send", &id, "--key", "Enter"]);
    until(&home, &id, "after-resize");
    let before = screen(&home, &id);
    assert!(before.contains("after-resize"), "{before}");
    assert!(
        before.lines().any(|l| l == "a".repeat(30)),
        "rows written at 60 columns keep their first 30: {before}"
    );
    home.kill_daemon();
    let after = screen(&home, &id);
    assert_eq!(after, before, "the screen rebuilt after a restart");
}

#[test]
fn issue16_8_an_incremental_read_never_splits_a_character_or_an_escape() {
    let home = Home::new();
    let gates = tempfile::tempdir().unwrap();
    let gate = |n: u32| gates.path().join(format!("gate{n}"));
    let script = format!(
        "printf 'caf\\xc3'; until [ -e {g1} ]; do sleep 0.02; done; \
         printf '\\xa9 ok\\n\\x1b[3'; until [ -e {g2} ]; do sleep 0.02; done; \
         printf '1mred\\x1b[0m\\n'; exec sleep 100000",
        g1 = gate(1).display(),
        g2 = gate(2).display()
    );
    let id = home.start(&script);
    let log = log_path(&home, &id);
    eventually(Duration::from_secs(20), || log_len(&log) == 4);
    let first = home.json(&["read", &id]);
    assert_eq!(first["output"], "caf", "no half character: {first}");
    assert_eq!(first["to"], 3);
    std::fs::write(gate(1), "").unwrap();
    eventually(Duration::from_secs(20), || log_len(&log) == 12);
    assert_eq!(home.json(&["read", &id])["output"], "\u{e9} ok\n");
    std::fs::write(gate(2), "").unwrap();
    eventually(Duration::from_secs(20), || log_len(&log) == 22);
    assert_eq!(home.json(&["read", &id])["output"], "red\n");
    // An ended job has nothing more to come: what is there is shown.
    let ended = home.start("printf 'cut \\xe2\\x9c'");
    home.wait_end(&ended);
    assert_eq!(home.json(&["read", &ended])["output"], "cut \u{fffd}");
}

#[test]
fn issue16_8_wait_until_matches_a_character_split_across_reads() {
    let home = Home::new();
    let gates = tempfile::tempdir().unwrap();
    let gate = gates.path().join("gate");
    let script = format!(
        "printf 'starting \\xe2\\x9c'; until [ -e {g} ]; do sleep 0.02; done; \
         printf '\\x93 READY\\n'; exec sleep 100000",
        g = gate.display()
    );
    let id = home.start(&script);
    let log = log_path(&home, &id);
    eventually(Duration::from_secs(20), || log_len(&log) == 11);
    assert_eq!(home.json(&["read", &id])["output"], "starting ");
    std::fs::write(&gate, "").unwrap();
    let reply = home
        .run(&[
            "--json",
            "wait",
            &id,
            "--until",
            "✓ READY",
            "--timeout",
            "20",
        ])
        .json();
    assert_eq!(reply["reason"], "matched", "{reply}");
    assert_eq!(reply["match"], "✓ READY");
}

/// Runs `bgwork run ARGS` with `input` on its stdin (then closed); returns the exit
/// code, stdout and how long it took.
fn run_with_stdin(home: &Home, args: &[&str], input: &[u8]) -> (i32, String, Duration) {
    let started = Instant::now();
    let mut child = home
        .command(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        started.elapsed(),
    )
}

#[test]
fn issue16_9_run_passes_the_callers_stdin_and_its_end() {
    let home = Home::new();
    let (code, out, took) = run_with_stdin(
        &home,
        &["run", "--timeout", "30", "--", "cat"],
        b"hello\nworld\n",
    );
    assert_eq!((code, out.as_str()), (0, "hello\nworld\n"));
    assert!(took < Duration::from_secs(20), "{took:?}");
    let (code, out, _) = run_with_stdin(
        &home,
        &["run", "--timeout", "30", "--", "read x; echo got:$x"],
        b"an answer\n",
    );
    assert_eq!((code, out.as_str()), (0, "got:an answer\n"));
    // A megabyte, written to a command that reads it only later, arrives whole.
    let input = vec![b'x'; 1 << 20];
    let (code, out, _) = run_with_stdin(
        &home,
        &["run", "--timeout", "30", "--", "sleep 1; wc -c"],
        &input,
    );
    assert_eq!((code, out.trim()), (0, "1048576"));
}

#[test]
fn issue16_9_run_with_stdin_from_dev_null_ends_at_once() {
    let home = Home::new();
    let started = Instant::now();
    // The harness gives every call a stdin of /dev/null.
    let run = home.run(&["run", "--timeout", "30", "--", "cat; read x; echo read:$?"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, "read:1\n"));
    assert!(started.elapsed() < Duration::from_secs(20));
    let run = home.run(&["--json", "run", "--timeout", "30", "--", "cat"]);
    assert_eq!(run.json()["outcome"], "ended");
}

#[test]
fn issue16_9_an_mcp_run_starts_with_its_stdin_closed() {
    let home = Home::new();
    let mut child = home
        .command(&["mcp"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut request = |id: u64, method: &str, params: Value| -> Value {
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(stdin, "{line}").unwrap();
        loop {
            let mut reply = String::new();
            assert!(
                stdout.read_line(&mut reply).unwrap() > 0,
                "the server hung up"
            );
            let reply: Value = serde_json::from_str(&reply).unwrap();
            if reply["id"] == id {
                return reply;
            }
        }
    };
    request(
        1,
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "t", "version": "1"}}),
    );
    let started = Instant::now();
    let reply = request(
        2,
        "tools/call",
        json!({"name": "run", "arguments": {"command": "cat; echo stdin-closed", "timeout_s": 30}}),
    );
    let result = &reply["result"]["structuredContent"];
    assert_eq!(result["outcome"], "ended", "{reply}");
    assert_eq!(result["output"], "stdin-closed\n");
    assert!(started.elapsed() < Duration::from_secs(20));
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_run_promoted_while_its_caller_keeps_stdin_open_takes_send() {
    let home = Home::new();
    let mut child = home
        .command(&[
            "--json",
            "run",
            "--timeout",
            "0.5",
            "--",
            "echo before; read x; echo after:$x; exit 4",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let held = child.stdin.take().unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(child.wait().unwrap().success());
    let reply: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(reply["outcome"], "promoted", "{reply}");
    let id = reply["id"].as_str().unwrap();
    home.json(&["send", id, r"typed\n"]);
    // The caller's pipe ends only now: its end would be the job's end of input.
    drop(held);
    let item = home.wait_end(id);
    assert_eq!(item["exit_code"], 4);
    assert_eq!(home.json(&["read", id])["output"], "after:typed\n");
}

#[test]
fn issue16_12_a_run_killed_at_the_limit_says_so_in_its_report() {
    let home = Home::new().with("BGWORK_MAX_RUNNING", "1");
    home.start("exec sleep 1000");
    let run = home.run(&["--json", "run", "--timeout", "0.3", "--", "exec sleep 1000"]);
    let reply = run.json();
    assert_eq!(reply["outcome"], "killed");
    let id = reply["id"].as_str().unwrap();
    let item = home.item(id);
    assert_eq!(item["end"], "stopped_by_agent");
    let report = item["report"].as_str().unwrap();
    assert_eq!(
        report,
        format!(
            "{id} was killed at its 0.3 s deadline: the session was at its limit of 1 running item"
        )
    );
    assert!(!report.contains("stopped by the agent"));
}

#[test]
fn a_run_streams_its_output_as_it_comes_and_stops_as_the_person_when_its_caller_goes() {
    let home = Home::new();
    let gates = tempfile::tempdir().unwrap();
    let gate = gates.path().join("gate");
    let script = format!(
        "echo first; until [ -e {g} ]; do sleep 0.02; done; echo second; exec sleep 100000",
        g = gate.display()
    );
    let mut child = home
        .command(&["run", "--timeout", "60", "--", &script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "first\n", "shown before the command ends");
    std::fs::write(&gate, "").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "second\n");
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    let listed = home.json(&["list", "--all"]);
    let id = listed["items"][0]["id"].as_str().unwrap().to_string();
    let item = home.wait_end(&id);
    assert_eq!(item["end"], "stopped_by_person", "{item}");
}

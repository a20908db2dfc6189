//! Issue 27: the fixed cost of a call. Each `bgwork` process starts without the dynamic
//! loader, and builds the parser of the one subcommand it runs; neither may change what
//! a user sees. A hook's turn boundary is one round trip to the daemon.

use crate::util::{hook_within, Home, BIN};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

/// The ELF type and whether a program header asks for an interpreter (`PT_INTERP`).
fn elf_kind(path: &str) -> (u16, bool) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF", "{path} is not an ELF file");
    let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36), u16_at(0x38));
    let interp = (0..phnum as usize).any(|i| {
        let at = phoff + i * phentsize as usize;
        u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) == 3
    });
    (u16_at(0x10), interp)
}

#[test]
fn issue27_1_the_binary_starts_without_the_dynamic_loader() {
    // A static executable (ET_EXEC, no interpreter): no loader, no shared libraries, no
    // relocations before `main`; and it runs on a host whatever its C library.
    let (kind, interp) = elf_kind(BIN);
    assert!(
        kind == 2 && !interp,
        "{BIN}: ELF type {kind}, interpreter {interp}: linked dynamic (scripts/link-gcc \
         found no static C library?)"
    );
    let home = Home::new();
    let version = home.run(&["--version"]);
    assert_eq!(version.code, 0, "{}", version.stderr);
    assert!(version.stdout.starts_with("bgwork "), "{}", version.stdout);
    // The daemon and the supervisor are the same binary: a job runs and ends as before.
    let id = home.start("echo static");
    let end = home.wait_end(&id);
    assert_eq!(end["end"], "succeeded", "{end}");
    let read = home.run(&["read", &id]);
    assert!(read.stdout.contains("static"), "{}", read.stdout);
}

#[test]
fn issue27_1_a_subcommand_built_only_when_invoked_keeps_its_options_help_and_manual() {
    let home = Home::new();
    // The global options reach the subcommand on either side of it.
    for args in [&["--json", "list"][..], &["list", "--json"][..]] {
        let run = home.run(args);
        assert_eq!(run.code, 0, "{args:?}: {}", run.stderr);
        assert!(run.json()["items"].is_array(), "{args:?}: {}", run.stdout);
    }
    let run = home.run(&["list", "--session", "elsewhere", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    // A nested subcommand's options, its help, and a usage error that names them.
    let help = home.run(&["monitor", "wait", "--help"]);
    assert!(help.stdout.contains("--until-port"), "{}", help.stdout);
    let wrong = home.run(&["monitor", "wait", "--until-prot", "x:1"]);
    assert_eq!(wrong.code, 2);
    assert!(wrong.stderr.contains("--until-port"), "{}", wrong.stderr);
    let hook = home.run(&["hook", "codex", "--no-such-option"]);
    assert_eq!(
        hook.code, 1,
        "a hook's bad command line is the person's error"
    );
    // The manual and the completion scripts carry every subcommand's options.
    let man = home.run(&["man"]).stdout;
    for option in [
        "until\\-output",
        "max\\-runtime",
        "wait\\-on\\-stop",
        "grep",
    ] {
        assert!(man.contains(option), "the manual lacks {option}");
    }
    for shell in ["bash", "zsh", "fish"] {
        let script = home.run(&["completions", shell]).stdout;
        for option in ["until-output", "max-runtime", "wait-on-stop", "no-redact"] {
            assert!(script.contains(option), "{shell} completions lack {option}");
        }
    }
}

/// A daemon slow to answer: on the home's socket, it takes one connection, answers each
/// request but `ack` after `delay` (a claim with one pending notice), and returns the
/// requests it saw.
fn slow_daemon(home: &Home, delay: Duration) -> std::thread::JoinHandle<Vec<Value>> {
    let listener = UnixListener::bind(home.socket()).unwrap();
    let socket = home.socket();
    std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut seen = Vec::new();
        for line in BufReader::new(&stream).lines() {
            let Ok(line) = line else { break };
            let request: Value = serde_json::from_str(&line).unwrap();
            let reply = match request["op"].as_str() {
                Some("notices") => json!({"notices": [{
                    "id": "ntc-1", "item": "bg-1", "end": "succeeded", "exit_code": 0,
                    "signal": null, "text": "bg-1 (make) succeeded", "tail": "built",
                    "created_at": "", "count": 1
                }]}),
                _ => json!({"ok": true, "message": "ok"}),
            };
            if request["op"] != "ack" {
                std::thread::sleep(delay);
            }
            seen.push(request);
            if (&stream)
                .write_all(format!("{reply}\n").as_bytes())
                .is_err()
            {
                break;
            }
        }
        drop(listener);
        let _ = std::fs::remove_file(socket);
        seen
    })
}

#[test]
fn issue27_1_a_hook_binds_and_claims_in_one_round_trip() {
    // With a daemon that takes 0.7 s a request, a hook that bound its session and then
    // claimed would pass its 1.25 s deadline and show nothing; one request that binds
    // and claims shows the notice, and still tells the daemon whose session it is.
    let home = Home::new();
    let daemon = slow_daemon(&home, Duration::from_millis(700));
    let mut command = home.command(&["hook", "claude-code"]);
    let event = json!({"hook_event_name": "PostToolUse", "session_id": "conv-1"});
    command.env_remove("BGWORK_SESSION");
    let output = hook_within(command, &event, Duration::from_secs(10));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stdout.contains("bg-1 (make) succeeded"),
        "the notice was not shown: {stdout:?}, stderr {stderr:?}"
    );
    let seen = daemon.join().unwrap();
    let ops: Vec<&str> = seen.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["notices", "ack"], "{seen:?}");
    assert_eq!(seen[0]["session"], "conv-1");
    assert_eq!(
        seen[0]["bind_harness"]["pid"],
        std::process::id(),
        "the claim binds the session to the hook's harness (this test): {seen:?}"
    );
}

#[test]
fn issue27_2_an_idle_daemon_leaves_its_database_alone() {
    // After copying the write-ahead log, the checkpoint thread begins it again with a
    // write of its own (so that a request's next write syncs nothing): that write must
    // not start another round, or an idle daemon would write its disk every second.
    let home = Home::new();
    let id = home.start("echo once");
    home.wait_end(&id);
    let wal = home.path().join("work.db-wal");
    let written = || std::fs::metadata(&wal).and_then(|m| m.modified()).ok();
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut last, mut since) = (written(), Instant::now());
    // Settled: untouched for longer than two of the thread's rounds (one a second).
    while since.elapsed() < Duration::from_millis(2500) {
        assert!(
            Instant::now() < deadline,
            "the idle daemon's log is still written after 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
        let now = written();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    // The home still answers and holds its record.
    assert_eq!(home.item(&id)["end"], "succeeded");
}

#[test]
fn issue27_3_a_megabyte_read_shows_the_same_text_in_every_reader() {
    // The text of a read is now made from the log's bytes in place and the reply's line
    // put in front of them: a read of more than a megabyte (plain lines, a token shape,
    // colored lines) shows each byte once, masked and made inert alike in the CLI's
    // frame, `--json` and `--raw`, and the cursor moves to the end.
    let home = Home::new();
    let token = format!("ghp_{}", "a1B2".repeat(9));
    let id = home.start(&format!(
        "yes 'a plain line of build output, sixty bytes or so, no token' | head -c 1200000; \
         echo 'pushed with {token} at last'; \
         yes \"$(printf '\\033[32mok\\033[0m done')\" | head -c 299999; echo end"
    ));
    home.wait_end(&id);
    let log = std::fs::read(home.path().join("jobs/1/output.log")).unwrap();
    assert!(log.len() > 1_500_000, "the job wrote {} bytes", log.len());
    let shown = String::from_utf8(log.clone())
        .unwrap()
        .replace(&token, "[secret github token]")
        .replace("\u{1b}[32m", "")
        .replace("\u{1b}[0m", "");
    let read = home.run(&["read", &id, "--max-bytes", "2000000"]);
    assert_eq!(read.code, 0, "{}", read.stderr);
    let (text, status) = read.stdout.rsplit_once("\n[").unwrap();
    assert!(
        text == shown.trim_end_matches('\n'),
        "the CLI's read differs from the log as shown ({} bytes against {})",
        text.len(),
        shown.len()
    );
    assert!(
        status.contains(&id) && !text.contains("a1B2a1B2"),
        "{status}"
    );
    let again = home.json(&["read", &id]);
    assert_eq!(again["output"], "", "the cursor stayed behind: {again}");
    let json = home.json(&["read", &id, "--all", "--max-bytes", "2000000"]);
    assert_eq!(json["output"].as_str().unwrap(), shown, "--json differs");
    assert_eq!(json["to"], log.len() as u64);
    let raw = home.run(&["read", &id, "--all", "--raw", "--max-bytes", "2000000"]);
    let raw_shown = String::from_utf8(log)
        .unwrap()
        .replace(&token, "[secret github token]");
    assert!(
        raw.raw_stdout == raw_shown.as_bytes(),
        "--raw differs from the log with its token masked ({} bytes against {})",
        raw.raw_stdout.len(),
        raw_shown.len()
    );
}

/// A daemon that never answers a `wait` (it keeps the connection) and answers every
/// other request at once; returns the ops of the other connections, once `n` came.
fn quiet_daemon(home: &Home, n: usize) -> std::thread::JoinHandle<Vec<String>> {
    let listener = UnixListener::bind(home.socket()).unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        let mut probes = Vec::new();
        while probes.len() < n {
            let (stream, _) = listener.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&stream).read_line(&mut line).unwrap();
            let request: Value = serde_json::from_str(&line).unwrap();
            let op = request["op"].as_str().unwrap_or_default().to_string();
            if op == "wait" {
                held.push(stream);
                continue;
            }
            let reply = json!({"ok": true, "message": "ok"});
            let _ = (&stream).write_all(format!("{reply}\n").as_bytes());
            probes.push(op);
        }
        probes
    })
}

#[test]
fn issue27_5_a_quiet_wait_checks_the_daemon_without_a_look_at_every_job() {
    // A quiet `wait` asks on a second connection whether the daemon still serves. Fifty
    // of them checking every ten seconds must not cost the daemon a walk of every job's
    // processes each (what `status` does): the check is a `ping`, which looks at nothing.
    let home = Home::new().with("BGWORK_ANSWER_TIMEOUT_MS", "200");
    let daemon = quiet_daemon(&home, 3);
    let mut wait = home
        .command(&["wait", "bg-1", "--until", "never", "--timeout", "60"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let probes = daemon.join().unwrap();
    let _ = wait.kill();
    let _ = wait.wait();
    assert_eq!(
        probes,
        ["ping", "ping", "ping"],
        "the checks asked for more"
    );
}

#[test]
fn issue27_5_a_wait_that_checks_often_still_ends_on_its_line_and_ping_answers() {
    // The real daemon answers the check: a wait that checks every 200 ms stays until
    // its line comes, and `ping` on the socket answers without starting anything.
    let home = Home::new().with("BGWORK_ANSWER_TIMEOUT_MS", "200");
    let gate = crate::util::Gate::new();
    let id = home.start(&gate.after_go("echo READY-LINE; sleep 30"));
    let mut wait = home
        .command(&["wait", &id, "--until", "READY-LINE", "--timeout", "60"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Quiet for longer than seven checks, through which it keeps waiting; then the
    // line comes.
    let quiet = Instant::now();
    while quiet.elapsed() < Duration::from_millis(1500) {
        assert!(
            wait.try_wait().unwrap().is_none(),
            "the wait gave up while quiet"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    gate.open();
    let output = crate::util::finish_within(wait, Duration::from_secs(30));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "the wait failed: {stdout}");
    assert!(stdout.contains("READY-LINE"), "{stdout}");
    let mut stream = std::os::unix::net::UnixStream::connect(home.socket()).unwrap();
    stream
        .write_all(b"{\"session\":\"default\",\"op\":\"ping\"}\n")
        .unwrap();
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).unwrap();
    let reply: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(reply["ok"], true, "{line}");
    assert_eq!(home.json(&["list"])["items"].as_array().unwrap().len(), 1);
    home.run(&["stop", &id]);
}

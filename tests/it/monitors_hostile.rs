//! Monitors and `wait --until` under hostile use (issue 16, items 3, 4, 5, 10, 11, 12;
//! issue 10, item 1 for monitor paths): unterminated lines, ends, sparse files, bursts,
//! rotation, restarts across the log cap, progress bars, relative paths, bad timeouts,
//! wall-clock jumps, files that exist for a moment, and the Stop hook.

use crate::util::{cpu_time, eventually, Home};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn monitor(home: &Home, args: &[&str]) -> String {
    let mut all = vec!["monitor"];
    all.extend_from_slice(args);
    home.json(&all)["id"].as_str().unwrap().to_string()
}

/// Waits for an item to end and returns it.
fn ended(home: &Home, id: &str) -> Value {
    let reply = home.run(&["--json", "wait", id, "--timeout", "60"]).json();
    assert_eq!(reply["reason"], "ended", "{id} did not end: {reply}");
    reply["items"][0].clone()
}

fn event_log(home: &Home, id: &str) -> String {
    home.json(&["read", id, "--all"])["output"]
        .as_str()
        .unwrap()
        .to_string()
}

fn sh(script: &str) {
    let status = Command::new("bash").args(["-c", script]).status().unwrap();
    assert!(status.success(), "{script}");
}

/// One request on the daemon's socket, as any client could send it; returns the reply.
fn raw_request(home: &Home, request: Value) -> Value {
    home.start_daemon();
    let mut stream = std::os::unix::net::UnixStream::connect(home.socket()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    writeln!(stream, "{request}").unwrap();
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap()
}

fn status_kib(pid: i32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn issue16_3_wait_on_output_matches_an_unterminated_last_line() {
    let home = Home::new();
    let job = home.start("echo booting; read x; printf 'READY> '; exec sleep 1000");
    let mon = monitor(&home, &["wait", "--until-output", &job, "READY"]);
    home.json(&["send", &job, r"\n"]);
    let item = ended(&home, &mon);
    assert_eq!(item["end"], "succeeded", "{item}");
    assert!(
        item["report"].as_str().unwrap().contains("matched: READY>"),
        "{item}"
    );
    // `wait --until` sees a prompt too.
    let prompt = home.start("read x; printf 'password: '; exec sleep 1000");
    home.json(&["send", &prompt, r"\n"]);
    let reply = home.json(&["wait", &prompt, "--until", "password:", "--timeout", "20"]);
    assert_eq!(reply["reason"], "matched", "{reply}");
}

#[test]
fn issue16_3_a_wait_on_output_fails_when_its_job_ends_without_a_match() {
    let home = Home::new();
    let job = home.start("echo nothing to see; read x; printf 'still nothing'");
    let mon = monitor(
        &home,
        &["wait", "--until-output", &job, "READY", "--notify"],
    );
    home.json(&["send", &job, r"\n"]);
    let item = ended(&home, &mon);
    assert_eq!(item["end"], "failed", "{item}");
    let report = item["report"].as_str().unwrap();
    assert!(
        report.contains(&format!("{job} ended without printing READY")),
        "{report}"
    );
    // It no longer holds one of the session's four monitor slots.
    for _ in 0..4 {
        monitor(&home, &["wait", "--until-file", "/no/such/file"]);
    }
}

#[test]
fn issue16_3_a_watch_of_an_item_ends_when_the_item_ends() {
    let home = Home::new();
    let job = home.start("read x; printf 'hit one\\nmiss\\nhit two'");
    let watch = monitor(&home, &["watch", "--output", &job, "--regex", "^hit"]);
    home.json(&["send", &job, r"\n"]);
    let item = ended(&home, &watch);
    assert_eq!(item["end"], "succeeded", "{item}");
    assert!(
        item["report"]
            .as_str()
            .unwrap()
            .contains(&format!("{job} ended; 2 lines matched")),
        "{item}"
    );
    assert_eq!(event_log(&home, &watch), "hit one\nhit two\n");
    // Watching what has already ended is refused, not left running.
    let (_, code, message) = home.error(&["monitor", "watch", "--output", &job]);
    assert_eq!(code, "not_running", "{message}");
}

#[test]
fn issue16_4_watches_of_a_sparsely_grown_file_do_not_stall_other_sessions() {
    let home = Home::new();
    let file = home.path().join("sparse.log");
    std::fs::write(&file, "start\n").unwrap();
    let path = file.to_str().unwrap();
    let watches: Vec<String> = (0..2)
        .map(|_| monitor(&home, &["watch", "--file", path, "--regex", "marker"]))
        .collect();
    // 20 GB of holes, then a line.
    sh(&format!(
        "truncate -s +20G {path} && echo 'marker after the hole' >> {path}"
    ));
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        let call = Instant::now();
        let list = home
            .command(&["--session", "someone-else", "--json", "list"])
            .output()
            .unwrap();
        assert!(list.status.success());
        assert!(
            call.elapsed() < Duration::from_secs(2),
            "another session's list took {:?}",
            call.elapsed()
        );
    }
    for watch in &watches {
        eventually(Duration::from_secs(20), || {
            event_log(&home, watch) == "marker after the hole\n"
        });
    }
}

#[test]
fn issue16_4_a_100_mb_burst_does_not_grow_the_daemon() {
    let home = Home::new();
    let job = home.start("read x; yes 'a line of a burst of output' | head -c 100000000");
    let daemon = home.daemon_pid();
    let watch = monitor(&home, &["watch", "--output", &job, "--regex", "burst"]);
    let before = status_kib(daemon, "VmHWM:");
    home.json(&["send", &job, r"\n"]);
    let item = ended(&home, &watch);
    assert_eq!(item["end"], "succeeded", "{item}");
    let peak = status_kib(daemon, "VmHWM:");
    assert!(
        peak < before + 8 * 1024,
        "the daemon's peak memory grew from {before} kB to {peak} kB"
    );
    let notices = home.json(&["notices", "--peek"]);
    let counted: u64 = notices["notices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["item"] == watch.as_str() && n["end"].is_null())
        .map(|n| n["count"].as_u64().unwrap())
        .sum();
    // 28-byte lines; the last, cut short, does not say "burst".
    assert_eq!(counted, 100_000_000 / 28, "every line once");
}

#[test]
fn issue16_5_a_watched_file_is_followed_across_rotation_and_truncation() {
    let home = Home::new();
    let file = home.path().join("app.log");
    let path = file.to_str().unwrap();
    std::fs::write(&file, "before the watch\n").unwrap();
    let watch = monitor(&home, &["watch", "--file", path]);
    let expect = |text: &str| {
        eventually(Duration::from_secs(20), || event_log(&home, &watch) == text);
    };
    sh(&format!("echo one >> {path}"));
    expect("one\n");
    // Rotation: the old file is finished, then the new one is read from its start.
    sh(&format!(
        "echo late >> {path}; mv {path} {path}.1; echo two > {path}"
    ));
    expect("one\nlate\ntwo\n");
    // Truncation: read again from the start.
    sh(&format!(": > {path}; echo three >> {path}"));
    expect("one\nlate\ntwo\nthree\n");
    // Truncated and at once written past where the watch was.
    sh(&format!("echo 'a much longer line four' > {path}"));
    expect("one\nlate\ntwo\nthree\na much longer line four\n");
    // Removed, then made again.
    sh(&format!("rm {path}; echo five > {path}"));
    expect("one\nlate\ntwo\nthree\na much longer line four\nfive\n");
}

#[test]
fn issue16_5_a_watch_resumed_after_a_restart_across_the_log_cap_records_no_line_twice() {
    let home = Home::new().with("BGWORK_LOG_CAP", "65536");
    let go = home.path().join("go");
    let done = home.path().join("phase-two-written");
    let job = home.start(&format!(
        "read a; seq -f 'n=%.0f' 1 50000; while [ ! -e {} ]; do sleep 0.02; done; \
         seq -f 'n=%.0f' 50001 400000; touch {}; exec sleep 1000",
        go.display(),
        done.display()
    ));
    let watch = monitor(
        &home,
        &["watch", "--output", &job, "--regex", "^n=[0-9]+000$"],
    );
    home.json(&["send", &job, r"\n"]);
    eventually(Duration::from_secs(30), || {
        event_log(&home, &watch).lines().count() == 50
    });
    home.kill_daemon();
    // Written while no daemon runs: the job's log cap releases most of it, and the
    // watch resumes from inside the released middle.
    std::fs::write(&go, "").unwrap();
    eventually(Duration::from_secs(30), || done.exists());
    eventually(Duration::from_secs(30), || {
        event_log(&home, &watch).lines().last() == Some("n=400000")
    });
    let numbers: Vec<u64> = event_log(&home, &watch)
        .lines()
        .map(|l| l.trim_start_matches("n=").parse().unwrap())
        .collect();
    assert!(
        numbers.windows(2).all(|w| w[0] < w[1]),
        "a line was recorded twice or out of order: {numbers:?}"
    );
    let first: Vec<u64> = (1..=50).map(|k| k * 1000).collect();
    assert_eq!(numbers[..50], first[..]);
    let notices = home.json(&["notices", "--peek"]);
    let counted: u64 = notices["notices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["count"].as_u64().unwrap())
        .sum();
    assert_eq!(counted, numbers.len() as u64, "{notices}");
}

#[test]
fn issue16_5_a_resumed_watch_reads_a_file_rotated_or_rewritten_while_the_daemon_was_down() {
    let home = Home::new();
    let file = home.path().join("app.log");
    let path = file.to_str().unwrap();
    std::fs::write(&file, "old\n").unwrap();
    let watch = monitor(&home, &["watch", "--file", path]);
    let expect = |text: &str| {
        eventually(Duration::from_secs(20), || event_log(&home, &watch) == text);
    };
    sh(&format!("echo one >> {path}"));
    expect("one\n");
    home.kill_daemon();
    sh(&format!("mv {path} {path}.1; echo two > {path}"));
    expect("one\ntwo\n");
    home.kill_daemon();
    // Truncated, then written past where the watch was.
    sh(&format!("echo 'three, longer than before' > {path}"));
    expect("one\ntwo\nthree, longer than before\n");
    home.kill_daemon();
    sh(&format!("echo four >> {path}"));
    expect("one\ntwo\nthree, longer than before\nfour\n");
}

#[test]
fn issue16_5_a_watch_event_log_is_capped_like_job_logs() {
    let home = Home::new().with("BGWORK_LOG_CAP", "1048576");
    let file = home.path().join("burst.log");
    std::fs::write(&file, "").unwrap();
    let watch = monitor(&home, &["watch", "--file", file.to_str().unwrap()]);
    // 32 MB of lines, every one of them an event.
    let line = "an event the watch records.....";
    let lines = 1_000_000;
    sh(&format!(
        "yes '{line}' | head -n {lines} >> {}",
        file.display()
    ));
    let total = lines * (line.len() as u64 + 1);
    eventually(Duration::from_secs(120), || {
        home.json(&["read", &watch, "--tail", "1"])["to"] == total
    });
    let log = home.json(&["read", &watch, "--all"]);
    let path = log["log_path"].as_str().unwrap();
    let meta = std::fs::metadata(path).unwrap();
    assert_eq!(meta.len(), total, "offsets never shift");
    assert!(
        meta.blocks() * 512 <= 3 << 20,
        "the event log holds {} bytes on disk",
        meta.blocks() * 512
    );
    assert!(log["dropped_bytes"].as_u64().unwrap() > 25_000_000, "{log}");
    let text = log["output"].as_str().unwrap();
    assert!(text.ends_with(&format!("{line}\n")), "the newest are kept");
}

#[test]
fn issue16_10_a_wait_on_progress_bar_output_does_not_burn_a_core() {
    let home = Home::new();
    // A progress bar: `\r`-rewritten frames, never a newline.
    let job = home.start(
        "frames=$(for i in $(seq 1 200); do printf '\\rprogress %d%% [##########          ]' $i; done); \
         while :; do printf '%s' \"$frames\"; sleep 0.01; done",
    );
    let daemon = home.daemon_pid();
    // Without a waiter, then with one, over the same span.
    let span = Duration::from_secs(4);
    let before = cpu_time(daemon);
    let start = Instant::now();
    while start.elapsed() < span {
        std::thread::sleep(Duration::from_millis(50));
    }
    let idle = cpu_time(daemon) - before;
    let before = cpu_time(daemon);
    let reply = home
        .run(&[
            "--json",
            "wait",
            &job,
            "--until",
            "NEVER SHOWN",
            "--timeout",
            "4",
        ])
        .json();
    let busy = cpu_time(daemon) - before;
    assert_eq!(reply["reason"], "timeout", "{reply}");
    assert!(
        busy < idle + span / 5,
        "the daemon used {busy:?} of CPU in {span:?} with one waiter ({idle:?} without)"
    );
    // And the waiter still sees a frame as soon as it is shown.
    let reply = home.json(&["wait", &job, "--until", "progress 200%", "--timeout", "20"]);
    assert_eq!(reply["reason"], "matched", "{reply}");
}

#[test]
fn issue16_11_relative_monitor_paths_resolve_against_the_callers_directory() {
    let home = Home::new();
    let here = tempfile::tempdir_in("/tmp").unwrap();
    let in_here = |args: &[&str]| -> Value {
        let mut all = vec!["--json", "monitor"];
        all.extend_from_slice(args);
        let out = home
            .command(&all)
            .current_dir(here.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // `tmp` exists in `/`, the daemon's directory, but not here.
    let wait = in_here(&["wait", "--until-file", "tmp"]);
    let wait_id = wait["id"].as_str().unwrap();
    let absolute = here.path().join("tmp");
    assert!(
        wait["command"]
            .as_str()
            .unwrap()
            .contains(absolute.to_str().unwrap()),
        "{wait}"
    );
    let watch = in_here(&["watch", "--file", "app.log"]);
    let watch_id = watch["id"].as_str().unwrap();
    std::fs::write(here.path().join("app.log"), "a line\n").unwrap();
    eventually(Duration::from_secs(20), || {
        event_log(&home, watch_id) == "a line\n"
    });
    assert_eq!(home.item(wait_id)["state"], "running");
    std::fs::create_dir(&absolute).unwrap();
    assert_eq!(ended(&home, wait_id)["end"], "succeeded");
    // The daemon never interprets a relative path.
    for (mode, path) in [("wait", "tmp"), ("watch", "app.log"), ("wait", "")] {
        let reply = raw_request(
            &home,
            serde_json::json!({
                "session": "test", "op": "monitor", "mode": mode,
                "condition": {"type": "file", "path": path}
            }),
        );
        assert_eq!(reply["error"]["code"], "bad_request", "{reply}");
    }
}

#[test]
fn issue16_12_timeouts_that_are_not_numbers_of_seconds_are_refused_everywhere() {
    let home = Home::new();
    let job = home.start("exec sleep 1000");
    let calls: Vec<Vec<&str>> = vec![
        vec!["wait", &job, "--timeout", "NaN"],
        vec!["wait", &job, "--timeout", "inf"],
        vec!["wait", &job, "--timeout=-1"],
        vec!["run", "--timeout", "NaN", "--", "true"],
        vec!["run", "--timeout", "1e9", "--", "true"],
        vec!["monitor", "wait", "--until-file", "/x", "--timeout", "NaN"],
        vec!["monitor", "wait", "--until-file", "/x", "--timeout=-inf"],
        vec!["notices", "--wait", "NaN"],
        vec!["notices", "--wait", "infinity"],
        vec!["stop", &job, "--grace", "NaN"],
        vec!["stop", &job, "--grace=-2"],
    ];
    for args in calls {
        let run = home.run(&args);
        assert_eq!(run.code, 2, "{args:?}: {}{}", run.stdout, run.stderr);
        assert!(
            run.stderr.contains("seconds"),
            "{args:?} says what it takes: {}",
            run.stderr
        );
    }
    assert_eq!(home.item(&job)["state"], "running");
    // Other clients are held to the same rule by the daemon.
    let requests = [
        serde_json::json!({"session": "test", "op": "wait", "ids": [job], "timeout_s": -1}),
        serde_json::json!({"session": "test", "op": "wait", "ids": [job], "timeout_s": 1e9}),
        serde_json::json!({"session": "test", "op": "notices", "wait_s": -0.5}),
        serde_json::json!({"session": "test", "op": "stop", "id": job, "grace_s": -1}),
        serde_json::json!({"session": "test", "op": "run", "command": "true", "timeout_s": -3}),
        serde_json::json!({"session": "test", "op": "monitor", "mode": "wait",
            "condition": {"type": "file", "path": "/x"}, "timeout_s": -1}),
    ];
    for request in requests {
        let reply = raw_request(&home, request.clone());
        assert_eq!(reply["error"]["code"], "bad_request", "{request} → {reply}");
    }
}

/// A shared library that moves the wall clock (CLOCK_REALTIME) by the number of seconds
/// written in `$BGWORK_TEST_SKEW`, and nothing else.
fn clock_shim(dir: &Path) -> std::path::PathBuf {
    let source = dir.join("skew.c");
    std::fs::write(
        &source,
        r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int r = real(id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        const char *path = getenv("BGWORK_TEST_SKEW");
        FILE *f = path ? fopen(path, "r") : NULL;
        long long skew = 0;
        if (f) { if (fscanf(f, "%lld", &skew) != 1) skew = 0; fclose(f); }
        ts->tv_sec += skew;
    }
    return r;
}
"#,
    )
    .unwrap();
    let library = dir.join("libskew.so");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(&source)
        .arg("-ldl")
        .status()
        .unwrap();
    assert!(built.success(), "cc could not build the clock shim");
    library
}

#[test]
fn issue16_12_monitor_deadlines_follow_the_monotonic_clock() {
    let shim_dir = tempfile::tempdir_in("/tmp").unwrap();
    let library = clock_shim(shim_dir.path());
    let skew = shim_dir.path().join("skew");
    std::fs::write(&skew, "0").unwrap();
    let home = Home::new()
        .with("LD_PRELOAD", library.to_str().unwrap())
        .with("BGWORK_TEST_SKEW", skew.to_str().unwrap());
    let created = Instant::now();
    let forward = monitor(
        &home,
        &["wait", "--until-file", "/no/such/file", "--timeout", "3"],
    );
    // The wall clock jumps two hours ahead: the deadline must not fire early.
    std::fs::write(&skew, "7200").unwrap();
    while created.elapsed() < Duration::from_millis(2000) {
        let item = home.item(&forward);
        // (A call slowed by a busy machine may come back after the real deadline.)
        assert!(
            item["state"] == "running" || created.elapsed() >= Duration::from_secs(3),
            "a wall-clock jump fired the deadline: {item}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Made while the clock is ahead, then the clock jumps back: it must not wait 2 h.
    let back_created = Instant::now();
    let back = monitor(
        &home,
        &["wait", "--until-file", "/no/such/file", "--timeout", "2"],
    );
    std::fs::write(&skew, "0").unwrap();
    for (id, since, timeout) in [(&forward, created, 3), (&back, back_created, 2)] {
        let item = ended(&home, id);
        assert_eq!(item["end"], "failed", "{item}");
        assert!(
            item["report"].as_str().unwrap().contains("timed out"),
            "{item}"
        );
        let took = since.elapsed();
        assert!(
            took >= Duration::from_secs(timeout) && took < Duration::from_secs(timeout + 8),
            "{id} timed out after {took:?}, not {timeout} s"
        );
    }
}

/// Whether a process holds an inotify instance that watches something.
fn has_inotify_watch(pid: i32) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        let inotify = std::fs::read_link(fd.path())
            .map(|l| l.to_string_lossy().contains("inotify"))
            .unwrap_or(false);
        let info = format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy());
        inotify
            && std::fs::read_to_string(info)
                .map(|i| i.contains("inotify wd:"))
                .unwrap_or(false)
    })
}

#[test]
fn issue16_12_until_file_catches_a_file_that_exists_for_a_moment() {
    let home = Home::new();
    let flag = home.path().join("flag");
    let mon = monitor(&home, &["wait", "--until-file", flag.to_str().unwrap()]);
    let daemon = home.daemon_pid();
    eventually(Duration::from_secs(20), || has_inotify_watch(daemon));
    sh(&format!("touch {0} && rm {0}", flag.display()));
    let item = ended(&home, &mon);
    assert_eq!(item["end"], "succeeded", "{item}");
    let report = item["report"].as_str().unwrap();
    assert!(
        report.contains("was created") || report.contains("exists"),
        "{item}"
    );
}

#[test]
fn issue16_12_the_stop_hook_waits_on_jobs_and_waits_but_never_on_watches() {
    let home = Home::new();
    let file = home.path().join("watched.log");
    let watch = monitor(&home, &["watch", "--file", file.to_str().unwrap()]);
    let stop_hook = || -> String {
        let event = serde_json::json!({"session_id": "x", "hook_event_name": "Stop"});
        let command = home.command(&["hook", "claude-code", "--wait-on-stop"]);
        let output = crate::util::hook_output(command, &event);
        assert!(output.status.success());
        String::from_utf8(output.stdout).unwrap()
    };
    assert_eq!(
        stop_hook(),
        "",
        "a watch never ends: the stop must not wait on it"
    );
    let wait = monitor(
        &home,
        &["wait", "--until-file", "/no/such/file", "--notify"],
    );
    let reply: Value = serde_json::from_str(&stop_hook()).unwrap();
    assert_eq!(reply["decision"], "block", "{reply}");
    let reason = reply["reason"].as_str().unwrap();
    assert!(reason.contains(&wait), "{reason}");
    assert!(!reason.contains(&watch), "{reason}");
}

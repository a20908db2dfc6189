//! Reading output: incremental cursors, ranges, stripping, binary bytes, the log cap.

use crate::util::Home;
use base64::Engine;

#[test]
fn each_byte_is_read_once_across_incremental_reads() {
    let home = Home::new();
    let id = home.start("echo one; read a; echo two; read b; echo three");
    let first = home.json(&["wait", &id, "--until", "one", "--timeout", "20"]);
    assert_eq!(first["reason"], "matched");
    let read = home.json(&["read", &id]);
    assert_eq!(read["output"], "one\n");
    assert_eq!(read["running"], true);
    let again = home.json(&["read", &id]);
    assert_eq!(again["output"], "", "nothing new: nothing returned");
    assert_eq!(
        again["running"], true,
        "empty output of a running job says it runs"
    );
    home.json(&["send", &id, r"go\n"]);
    home.json(&["wait", &id, "--until", "two", "--timeout", "20"]);
    assert_eq!(home.json(&["read", &id])["output"], "two\n");
    home.json(&["send", &id, r"go\n"]);
    home.wait_end(&id);
    let last = home.json(&["read", &id]);
    assert_eq!(last["output"], "three\n");
    assert_eq!(last["running"], false);
    assert_eq!(
        home.json(&["read", &id, "--all"])["output"],
        "one\ntwo\nthree\n"
    );
    assert_eq!(
        home.json(&["read", &id, "--from", "4"])["output"],
        "two\nthree\n"
    );
    assert_eq!(
        home.json(&["read", &id, "--tail", "1"])["output"],
        "three\n"
    );
}

#[test]
fn the_text_reply_says_when_a_running_job_has_nothing_new() {
    let home = Home::new();
    let id = home.start("exec sleep 1000");
    let run = home.run(&["read", &id]);
    assert_eq!(run.code, 0);
    assert!(
        run.stdout.contains("still running; no new output"),
        "{}",
        run.stdout
    );
}

#[test]
fn escapes_are_stripped_unless_raw_and_progress_bars_collapse() {
    let home = Home::new();
    let id = home.start(
        r"printf '\033[31mred\033[0m\n'; for p in 10 50 100; do printf '\r%3d%%' $p; done; echo",
    );
    home.wait_end(&id);
    assert_eq!(home.json(&["read", &id, "--all"])["output"], "red\n100%\n");
    let raw = home.json(&["read", &id, "--all", "--raw"]);
    assert!(raw["output"].as_str().unwrap().contains("\u{1b}[31m"));
}

#[test]
fn binary_output_round_trips_byte_exact_with_raw() {
    let home = Home::new();
    let id = home.start(r#"for i in $(seq 0 255); do printf "\\$(printf %03o $i)"; done"#);
    home.wait_end(&id);
    let expected: Vec<u8> = (0..=255u8).collect();
    let raw = home.run(&["read", &id, "--raw", "--all"]);
    assert_eq!(raw.code, 0, "{}", raw.stderr);
    assert_eq!(raw.raw_stdout, expected);
    let json = home.json(&["read", &id, "--raw", "--all"]);
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(json["output_base64"].as_str().unwrap())
        .unwrap();
    assert_eq!(decoded, expected);
    let text = home.json(&["read", &id, "--all"]);
    assert!(
        text["output"].as_str().unwrap().contains('\u{fffd}'),
        "invalid UTF-8 replaced"
    );
}

#[test]
fn stdout_and_stderr_interleave_in_write_order() {
    let home = Home::new();
    let id = home.start("echo 1; echo 2 >&2; echo 3; echo 4 >&2");
    home.wait_end(&id);
    assert_eq!(home.json(&["read", &id])["output"], "1\n2\n3\n4\n");
}

#[test]
fn the_log_keeps_its_head_and_newest_bytes_within_the_cap() {
    let home = Home::new().with("BGWORK_LOG_CAP", &(4 << 20).to_string());
    let id = home.start("echo FIRST; head -c 32M /dev/zero | tr '\\0' x; echo; echo LAST");
    home.wait_end(&id);
    let read = home.json(&["read", &id, "--all", "--max-bytes", "200000"]);
    let output = read["output"].as_str().unwrap();
    assert!(
        output.starts_with("FIRST\n") || output.contains("FIRST"),
        "head kept"
    );
    assert!(output.trim_end().ends_with("LAST"), "newest kept");
    assert!(
        read["dropped_bytes"].as_u64().unwrap() >= 26 << 20,
        "{}",
        read["dropped_bytes"]
    );
    assert!(read["clipped"].as_bool().unwrap());
    assert!(output.contains("output.log"), "the elision names the log");
    let log = home.path().join("jobs/1/output.log");
    use std::os::unix::fs::MetadataExt;
    let on_disk = std::fs::metadata(&log).unwrap().blocks() * 512;
    assert!(on_disk <= 6 << 20, "disk use {on_disk} stays near the cap");
}

#[test]
fn one_huge_line_is_kept_within_the_cap_and_reads_stay_bounded() {
    let home = Home::new().with("BGWORK_LOG_CAP", &(8 << 20).to_string());
    let id = home.start("head -c 100M /dev/zero | tr '\\0' a");
    home.wait_end(&id);
    let read = home.json(&["read", &id, "--max-bytes", "65536"]);
    let output = read["output"].as_str().unwrap();
    assert!(output.len() < 70_000, "reply bounded: {}", output.len());
    assert!(read["clipped"].as_bool().unwrap());
    assert_eq!(read["to"].as_u64().unwrap(), 100 << 20);
}

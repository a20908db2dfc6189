//! Figure: from a job's end to the exit of Claude Code's rewake hook
//! (`bgwork hook claude-code --rewake`), the moment Claude Code can wake the agent.

use super::{now_ns, percentile, row, table_head, write_samples, Home, Opts};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub fn exit_to_rewake(opts: &Opts, report: &mut String) {
    let n = if opts.smoke { 5 } else { 40 };
    let home = Home::new(opts, &[]);
    let dir = tempfile::tempdir().unwrap();
    let event = r#"{"session_id":"bench","hook_event_name":"Stop","stop_hook_active":false}"#;
    let mut bgwork = Vec::new();
    let mut floor = Vec::new();
    for i in 0..(n + 3) {
        let trigger = dir.path().join(format!("t{i}"));
        let stamp = dir.path().join(format!("b{i}"));
        let command = format!(
            "while [ ! -e {} ]; do sleep 0.002; done; date +%s%N > {}",
            trigger.display(),
            stamp.display()
        );
        home.start(&command, &["--notify"]);
        let mut hook = home
            .command(&["hook", "claude-code", "--rewake"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        hook.stdin
            .take()
            .unwrap()
            .write_all(event.as_bytes())
            .unwrap();
        // Read stderr as Claude Code does (the hook waits for its reader).
        let mut stderr = hook.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        waiting(&home);
        std::fs::write(&trigger, "").unwrap();
        let status = hook.wait().unwrap();
        let woke = now_ns();
        let text = reader.join().unwrap();
        assert_eq!(status.code(), Some(2), "{text}");
        let ended: u128 = std::fs::read_to_string(&stamp)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let floor_stamp = dir.path().join(format!("f{i}"));
        Command::new("sh")
            .args(["-c", &format!("date +%s%N > {}", floor_stamp.display())])
            .status()
            .unwrap();
        let floor_woke = now_ns();
        let floor_end: u128 = std::fs::read_to_string(&floor_stamp)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        if i >= 3 {
            bgwork.push(woke.saturating_sub(ended) as f64 / 1e6);
            floor.push(floor_woke.saturating_sub(floor_end) as f64 / 1e6);
        }
    }
    let _ = writeln!(report, "## 2b. Exit → rewake\n\nFrom the job's last instruction (a timestamp written just before it exits) to the exit (code 2, the notice on stderr) of `bgwork hook claude-code --rewake`, the Stop hook with `asyncRewake` that wakes an idle Claude Code session. Baseline: a parent's `waitpid` on a child doing the same. Target ≤ 50 ms.\n");
    table_head(report);
    row(report, "floor: parent wakes from waitpid", &floor, None);
    row(
        report,
        "**bgwork: rewake hook exits 2**",
        &bgwork,
        Some(&floor),
    );
    let met = percentile(&bgwork, 99.0) <= 50.0;
    let _ = writeln!(report, "\nTarget {}.\n", if met { "met" } else { "missed" });
    write_samples(opts, "rewake-bgwork", &bgwork);
    write_samples(opts, "rewake-floor", &floor);
}

/// Waits until the rewake hook holds its session's lock (it is waiting).
fn waiting(home: &Home) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_dir(home.dir.path())
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("rewake-"))
    {
        assert!(Instant::now() < deadline, "the rewake hook never waited");
        std::thread::sleep(Duration::from_millis(1));
    }
}

//! Figure 0: the fixed cost of a call, what every `bgwork` process pays before and
//! around its one request, beside the floors a shell offers.

use super::{median, note, now_ns, percentile, Home, Opts};
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// CPU time (user + system) of the children reaped since the last call, in ms.
fn children_cpu_ms() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN).unwrap();
    let ms = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1e3 + t.tv_usec() as f64 / 1e3;
    ms(usage.user_time()) + ms(usage.system_time())
}

/// Runs `command` to its end (stdin from `input`, output thrown away); its wall and CPU
/// time in ms.
fn measure(command: &mut Command, input: &Path) -> (f64, f64) {
    let cpu = children_cpu_ms();
    let began = Instant::now();
    let status = command
        .stdin(std::fs::File::open(input).unwrap())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    let wall = began.elapsed().as_secs_f64() * 1e3;
    assert!(status.success(), "{command:?} failed");
    (wall, children_cpu_ms() - cpu)
}

/// From the moment the caller is spawned to the job's first instruction (a timestamp it
/// writes), in ms: the job is `bash -c 'echo $EPOCHREALTIME > FILE'` either way.
fn to_running(mut caller: Command, stamp: &Path) -> f64 {
    let _ = std::fs::remove_file(stamp);
    let began = now_ns();
    let status = caller
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "{caller:?} failed");
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        match std::fs::read_to_string(stamp) {
            Ok(text) if text.ends_with('\n') => break text,
            _ if Instant::now() > deadline => panic!("the job of {caller:?} never ran"),
            _ => std::thread::sleep(Duration::from_micros(200)),
        }
    };
    let seconds: f64 = text.trim().parse().unwrap();
    (seconds * 1e9 - began as f64) / 1e6
}

struct Rows {
    report: String,
}

impl Rows {
    fn head(&mut self) {
        let _ = writeln!(
            self.report,
            "| what | median | p99 | ratio to baseline | target | runs |"
        );
        let _ = writeln!(self.report, "| --- | ---: | ---: | ---: | ---: | ---: |");
    }
    /// A row; with a baseline, the ratio of the medians and whether it meets `target`.
    fn row(&mut self, what: &str, samples: &[f64], base: Option<(&[f64], f64)>) -> bool {
        let (m, p) = (median(samples), percentile(samples, 99.0));
        let (ratio, target, met) = match base {
            Some((base, target)) => {
                let ratio = m / median(base);
                (
                    format!("{ratio:.2}×"),
                    format!("≤ {target}×"),
                    ratio <= target,
                )
            }
            None => ("—".into(), "—".into(), true),
        };
        let _ = writeln!(
            self.report,
            "| {what} | {m:.2} | {p:.2} | {ratio} | {target} | {} |",
            samples.len()
        );
        met
    }
}

pub fn fixed_cost(opts: &Opts, report: &mut String) {
    let n = if opts.smoke { 10 } else { 200 };
    let home = Home::new(opts, &[("BGWORK_MAX_RUNNING", "100000")]);
    let dir = tempfile::tempdir().unwrap();
    let nothing = dir.path().join("nothing");
    std::fs::write(&nothing, "").unwrap();
    // A hook event of a session with nothing pending.
    let event = dir.path().join("event.json");
    std::fs::write(
        &event,
        r#"{"session_id":"bench-hook","hook_event_name":"PostToolUse","tool_name":"Bash"}"#,
    )
    .unwrap();
    let (mut true_wall, mut true_cpu) = (Vec::new(), Vec::new());
    let (mut version_wall, mut version_cpu) = (Vec::new(), Vec::new());
    let (mut hook_true, mut hook_wall, mut hook_cpu) = (Vec::new(), Vec::new(), Vec::new());
    let (mut status_wall, mut status_cpu) = (Vec::new(), Vec::new());
    for i in 0..(n + 10) {
        let keep = i >= 10;
        let t = measure(&mut Command::new("/bin/true"), &nothing);
        let v = measure(
            home.command(&["--version"]).env_remove("BGWORK_SESSION"),
            &nothing,
        );
        let ht = measure(&mut Command::new("/bin/true"), &event);
        let h = measure(
            home.command(&["hook", "claude-code"])
                .env_remove("BGWORK_SESSION"),
            &event,
        );
        let s = measure(&mut home.command(&["status"]), &nothing);
        if keep {
            true_wall.push(t.0);
            true_cpu.push(t.1);
            version_wall.push(v.0);
            version_cpu.push(v.1);
            hook_true.push(ht.0);
            hook_wall.push(h.0);
            hook_cpu.push(h.1);
            status_wall.push(s.0);
            status_cpu.push(s.1);
        }
    }
    // Call → job running, against a shell that puts the same job in the background.
    let runs = if opts.smoke { 5 } else { 100 };
    let stamp = dir.path().join("stamp");
    let job = format!("echo $EPOCHREALTIME > {}", stamp.display());
    let (mut shell, mut start) = (Vec::new(), Vec::new());
    for i in 0..(runs + 5) {
        let mut floor = Command::new("bash");
        floor.args(["-c", &format!("bash -c '{job}' &")]);
        let f = to_running(floor, &stamp);
        let b = to_running(
            home.command(&["start", "--window", "0", "--", &job]),
            &stamp,
        );
        if i >= 5 {
            shell.push(f);
            start.push(b);
        }
    }
    let mut rows = Rows {
        report: String::new(),
    };
    let _ = writeln!(
        rows.report,
        "## 0. The fixed cost of a call\n\nWhat every `bgwork` process pays: the hook runs \
         after each tool call of an agent, and agents call the CLI from their shell tool. \
         CPU time is the children's user + system time (`getrusage`), robust to a busy \
         machine; wall time is the whole process, start to exit. The hook is `bgwork hook \
         claude-code` given a `PostToolUse` event of a session with nothing pending (its \
         baseline `/bin/true` gets the same stdin). Call → job running: from spawning the \
         caller to the job's first instruction (`echo $EPOCHREALTIME > FILE` run by bash, \
         polled every 0.2 ms), against `bash -c \"bash -c '…' &\"`.\n"
    );
    rows.head();
    rows.row("`/bin/true`, CPU ms", &true_cpu, None);
    let version = rows.row(
        "**`bgwork --version`, CPU ms**",
        &version_cpu,
        Some((&true_cpu, 1.3)),
    );
    rows.row("`/bin/true`, wall ms", &true_wall, None);
    rows.row(
        "`bgwork --version`, wall ms",
        &version_wall,
        Some((&true_wall, 1.3)),
    );
    rows.row("`/bin/true` < event, wall ms", &hook_true, None);
    let hook = rows.row(
        "**`bgwork hook claude-code` (`PostToolUse`, nothing pending), wall ms**",
        &hook_wall,
        Some((&hook_true, 2.0)),
    );
    rows.row("the hook, CPU ms", &hook_cpu, Some((&true_cpu, 2.0)));
    rows.row(
        "`bgwork status`, wall ms",
        &status_wall,
        Some((&true_wall, 2.0)),
    );
    rows.row(
        "`bgwork status`, CPU ms",
        &status_cpu,
        Some((&true_cpu, 2.0)),
    );
    rows.row(
        "floor: `bash -c \"bash -c '…' &\"` → running, ms",
        &shell,
        None,
    );
    let running = rows.row(
        "**`bgwork start --window 0` → running, ms**",
        &start,
        Some((&shell, 1.6)),
    );
    let missed: Vec<&str> = [
        (version, "`--version` CPU"),
        (hook, "the hook"),
        (running, "call → running"),
    ]
    .iter()
    .filter(|(met, _)| !met)
    .map(|(_, what)| *what)
    .collect();
    let _ = writeln!(
        rows.report,
        "\n{}\n",
        if missed.is_empty() {
            "Targets met.".to_string()
        } else {
            format!(
                "Target missed: {} (see the note at the end).",
                missed.join(", ")
            )
        }
    );
    if !missed.is_empty() {
        note(&format!(
            "**The fixed cost of a call** (missed: {}). `bgwork --version` costs {:.2} ms of \
             CPU against {:.2} ms for `/bin/true`; what is left is the C library's start \
             (its CPU-feature probes, trapped by the hypervisor here, which `/bin/true` pays \
             too), the Rust runtime's start and the pages of a 10 MB binary a call touches. \
             A start → running is {:.2} ms against {:.2} ms: the client's part is the \
             `status` row above, the rest the daemon's hand-over and the supervisor's \
             start of bash.",
            missed.join(", "),
            median(&version_cpu),
            median(&true_cpu),
            median(&start),
            median(&shell)
        ));
    }
    report.push_str(&rows.report);
}

//! Figure 7: the daemon's core under load. Jobs that print all the time, waiters on
//! patterns that never come, notice followers, a client paging through a 1 GiB log in
//! 16 MiB reads and another asking `status` every 100 ms; what the daemon costs and how
//! fast it answers meanwhile.

use super::*;

/// The sizes of one run.
struct Load {
    jobs: usize,
    waiters: usize,
    followers: usize,
    log_bytes: u64,
    seconds: u64,
}

pub fn core_under_load(opts: &Opts, report: &mut String) {
    let load = if opts.smoke {
        Load {
            jobs: 10,
            waiters: 5,
            followers: 2,
            log_bytes: 64 << 20,
            seconds: 3,
        }
    } else {
        Load {
            jobs: 100,
            waiters: 50,
            followers: 5,
            log_bytes: 1 << 30,
            seconds: 30,
        }
    };
    let cap = (load.log_bytes * 2).to_string();
    let home = Home::new(
        opts,
        &[("BGWORK_MAX_RUNNING", "100000"), ("BGWORK_LOG_CAP", &cap)],
    );
    // The big log first, written and ended before the load starts.
    let big = home.start(
        &format!("head -c {} /dev/zero | tr '\\0' x", load.log_bytes),
        &[],
    );
    let waited = home.json(&["wait", &big, "--timeout", "600"]);
    assert_eq!(waited["reason"], "ended", "the big log was written");
    let daemon = home.daemon_pid();

    let idle_before = cpu_ticks(daemon);
    std::thread::sleep(Duration::from_secs(1));
    let idle_ticks = cpu_ticks(daemon) - idle_before;

    // The same call with no load at all: the baseline of `status`.
    let status_idle: Vec<f64> = (0..15)
        .map(|_| time(|| quiet(&mut home.command(&["--json", "status"]))))
        .collect();

    // Each job prints a line every 10 ms without starting a process for it (a shell's
    // `sleep` would start 10,000 processes a second, a load on the machine rather than
    // on the daemon); perl is part of every Debian system.
    let ticker =
        "perl -e '$|=1; while (1) { print \"tick\\n\"; select(undef, undef, undef, 0.01) }'";
    let tickers: Vec<String> = (0..load.jobs).map(|_| home.start(ticker, &[])).collect();
    let mut clients: Vec<std::process::Child> = Vec::new();
    for i in 0..load.waiters {
        let id = &tickers[i % tickers.len()];
        let child = home
            .command(&["wait", id, "--until", "NEVER-PRINTED", "--timeout", "3600"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        clients.push(child);
    }
    for _ in 0..load.followers {
        let child = home
            .command(&["notices", "--follow", "--peek"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        clients.push(child);
    }
    std::thread::sleep(Duration::from_millis(500));

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pager = {
        let (stop, bin, dir, big) = (
            stop.clone(),
            home.bin.clone(),
            home.dir.path().to_path_buf(),
            big.clone(),
        );
        let page: u64 = 16 << 20;
        let total = load.log_bytes;
        std::thread::spawn(move || {
            let mut from = 0u64;
            let mut pages = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Big pages are built at a low priority: under this load one may take
                // longer than a client's usual patience.
                let status = Command::new(&bin)
                    .args(["--json", "read", &big, "--raw", "--from", &from.to_string()])
                    .args(["--max-bytes", &page.to_string()])
                    .env("BGWORK_HOME", &dir)
                    .env("BGWORK_SESSION", "bench")
                    .env("BGWORK_ANSWER_TIMEOUT_MS", "600000")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .unwrap();
                assert!(status.success(), "a 16 MiB page was read");
                pages += 1;
                from = (from + page) % total;
            }
            pages
        })
    };
    let began_ticks = cpu_ticks(daemon);
    let machine_began = machine_ticks();
    let began = Instant::now();
    let mut status_ms = Vec::new();
    let mut read_ms = Vec::new();
    let mut peak_rss = 0u64;
    let mut reader_from = 0u64;
    while began.elapsed() < Duration::from_secs(load.seconds) {
        status_ms.push(time(|| quiet(&mut home.command(&["--json", "status"]))));
        // One MiB of the big log, as an incremental read would take it.
        read_ms.push(time(|| {
            quiet(&mut home.command(&[
                "--json",
                "read",
                &big,
                "--from",
                &reader_from.to_string(),
                "--max-bytes",
                "1048576",
            ]))
        }));
        reader_from = (reader_from + (1 << 20)) % load.log_bytes;
        peak_rss = peak_rss.max(memory_kb(daemon, "VmRSS").unwrap_or(0));
        std::thread::sleep(Duration::from_millis(100));
    }
    let elapsed = began.elapsed().as_secs_f64();
    let busy_ticks = cpu_ticks(daemon) - began_ticks;
    let machine_busy = machine_busy_since(machine_began);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let pages = pager.join().unwrap();

    // The same load without the pager: what the ticking jobs, waiters and followers
    // alone cost the daemon.
    let quiet_began = cpu_ticks(daemon);
    let quiet_secs = (load.seconds / 3).max(2);
    std::thread::sleep(Duration::from_secs(quiet_secs));
    let quiet_ticks = cpu_ticks(daemon) - quiet_began;
    for mut child in clients {
        let _ = child.kill();
        let _ = child.wait();
    }
    // The jobs alone: output nobody waits on.
    std::thread::sleep(Duration::from_millis(500));
    let alone_began = cpu_ticks(daemon);
    std::thread::sleep(Duration::from_secs(quiet_secs));
    let alone_ticks = cpu_ticks(daemon) - alone_began;
    drop(home);

    let hz = 100.0;
    let cpu = |ticks: u64, secs: f64| ticks as f64 / hz / secs * 100.0;
    let quiet_cpu = cpu(quiet_ticks, quiet_secs as f64);
    let alone_cpu = cpu(alone_ticks, quiet_secs as f64);
    let _ = writeln!(
        report,
        "## 7. The core under load\n\n{} jobs each printing a line every 10 ms (perl, no process \
         started per line), {} `wait --until` \
         clients on patterns that never come, {} notice followers, one client reading 16 MiB \
         pages of a {} MiB log in a loop ({pages} pages in {elapsed:.0} s) and `status` every \
         100 ms. Targets: daemon CPU ≤ 2 % of a core for the jobs, waiters and followers; \
         `status` p99 ≤ 10 ms while the big reads run.\n",
        load.jobs,
        load.waiters,
        load.followers,
        load.log_bytes >> 20
    );
    let _ = writeln!(report, "| what | median | p99 | n |");
    let _ = writeln!(report, "| --- | ---: | ---: | ---: |");
    for (what, samples) in [
        (
            "`status` with no load (baseline, same run), ms",
            &status_idle,
        ),
        ("`status` while the pages are read, ms", &status_ms),
        ("`read` of 1 MiB while the pages are read, ms", &read_ms),
    ] {
        let _ = writeln!(
            report,
            "| {what} | {:.2} | {:.2} | {} |",
            median(samples),
            percentile(samples, 99.0),
            samples.len()
        );
    }
    let _ = writeln!(report, "\n| what | figure |\n| --- | ---: |");
    let _ = writeln!(
        report,
        "| daemon CPU, idle before the load | {:.2} % of a core |",
        cpu(idle_ticks, 1.0)
    );
    let _ = writeln!(
        report,
        "| daemon CPU, the jobs alone (output nobody waits on) | {alone_cpu:.2} % of a core |"
    );
    let _ = writeln!(
        report,
        "| daemon CPU, jobs + waiters + followers | {quiet_cpu:.2} % of a core |"
    );
    let _ = writeln!(
        report,
        "| what the waiters and followers add, over the jobs alone (same run) | {:.2} % of a core |",
        quiet_cpu - alone_cpu
    );
    let _ = writeln!(
        report,
        "| daemon CPU, all of it with the pager | {:.2} % of a core |",
        cpu(busy_ticks, elapsed)
    );
    let _ = writeln!(
        report,
        "| daemon RSS, peak during the load | {:.1} MB |",
        peak_rss as f64 / 1024.0
    );
    let _ = writeln!(
        report,
        "| the machine, busy during the load (all processes) | {machine_busy:.0} % of its cores |\n"
    );
    if quiet_cpu > 2.0 {
        note(&format!(
            "**Daemon CPU under load** ({quiet_cpu:.2} % of a core against 2 %; the jobs \
             alone {alone_cpu:.2} %): a job's supervisor reports its output every second when \
             nobody waits on it, every 250 ms while a `wait --until` does; here 50 waiters \
             each hold one chatty job at that pace, about 200 reports a second, each applied \
             by the connection's relay, which wakes the waiter that scans the new lines. \
             The rest is the work of each report (a socket read, the waiter's wake on \
             another thread, a read of the new bytes and their masking as a reader sees \
             them) on a machine the jobs keep busy."
        ));
    }
    if percentile(&status_ms, 99.0) > 10.0 {
        note(&format!(
            "**`status` p99 under load** ({:.2} ms against 10 ms): each call is a whole \
             process (exec, connect, JSON) on a 2-core machine that the load keeps {:.0} % \
             busy (100 jobs waking 10,000 times a second with their supervisors, the \
             pager); the call waits for a core more than for the daemon.",
            percentile(&status_ms, 99.0),
            machine_busy
        ));
    }
}

/// The machine's busy and total CPU ticks so far (`/proc/stat`).
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().sum();
    // idle and iowait
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// The share of the machine's CPU time that was busy since `then`, in percent.
fn machine_busy_since(then: (u64, u64)) -> f64 {
    let now = machine_ticks();
    let (busy, total) = (now.0 - then.0, now.1 - then.1);
    busy as f64 * 100.0 / total.max(1) as f64
}

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
            followers: 10,
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
    drop(home);

    let hz = 100.0;
    let cpu = |ticks: u64, secs: f64| ticks as f64 / hz / secs * 100.0;
    let quiet_cpu = cpu(quiet_ticks, quiet_secs as f64);
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
        "| daemon CPU, jobs + waiters + followers | {quiet_cpu:.2} % of a core |"
    );
    let _ = writeln!(
        report,
        "| daemon CPU, all of it with the pager | {:.2} % of a core |",
        cpu(busy_ticks, elapsed)
    );
    let _ = writeln!(
        report,
        "| daemon RSS, peak during the load | {:.1} MB |\n",
        peak_rss as f64 / 1024.0
    );
    if quiet_cpu > 2.0 {
        note(&format!(
            "**Daemon CPU under load** ({quiet_cpu:.2} % of a core against 2 %): every output \
             tick of a job still reaches the daemon as a progress message, which wakes the \
             waiters of that job (not the others). What would close it: supervisors that \
             report progress only to a daemon that asked for it (a waiter or a reader)."
        ));
    }
    if percentile(&status_ms, 99.0) > 10.0 {
        note(&format!(
            "**`status` p99 under load** ({:.2} ms against 10 ms): each call is a whole \
             process (exec, connect, JSON) on a 2-core machine shared with 100 busy jobs \
             and the pager; the daemon's own time for it is a small part.",
            percentile(&status_ms, 99.0)
        ));
    }
}

//! Figure 5: a thousand idle jobs at once, then thousands of short ones in sequence.

use super::*;

pub fn scale(opts: &Opts, report: &mut String) {
    let idle = if opts.smoke { 50 } else { 1000 };
    let idle_secs = if opts.smoke { 3 } else { 60 };
    let short = if opts.smoke { 200 } else { 10_000 };
    let home = Home::new(opts, &[("BGWORK_MAX_RUNNING", "100000")]);
    for _ in 0..idle {
        home.start("exec sleep 3600", &[]);
    }
    let items = home.json(&["list"]);
    let pids: Vec<i32> = items["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["pid"].as_i64())
        .map(|p| p as i32)
        .collect();
    let supervisors: Vec<i32> = pids.iter().map(|&p| parent_of(p)).collect();
    let daemon = home.daemon_pid();
    let daemon_rss = memory_kb(daemon, "VmRSS").unwrap_or(0) as f64 / 1024.0;
    let supervisor_rss: Vec<f64> = supervisors
        .iter()
        .filter_map(|&s| memory_kb(s, "VmRSS"))
        .map(|kb| kb as f64 / 1024.0)
        .collect();
    let sleep_rss: Vec<f64> = pids
        .iter()
        .filter_map(|&p| memory_kb(p, "VmRSS"))
        .map(|kb| kb as f64 / 1024.0)
        .collect();
    let private_mb = |all: &[i32]| -> Vec<f64> {
        all.iter()
            .filter_map(|&p| private_kb(p))
            .map(|kb| kb as f64 / 1024.0)
            .collect()
    };
    let (supervisor_uss, sleep_uss) = (private_mb(&supervisors), private_mb(&pids));
    let ticks = |all: &[i32]| all.iter().map(|&p| cpu_ticks(p)).sum::<u64>();
    let mut watched = supervisors.clone();
    watched.push(daemon);
    let before = ticks(&watched);
    std::thread::sleep(Duration::from_secs(idle_secs));
    let after = ticks(&watched);
    let hz = 100.0;
    let cpu_percent = (after - before) as f64 / hz / idle_secs as f64 * 100.0;
    let mut list_times = Vec::new();
    for _ in 0..10 {
        list_times.push(time(|| quiet(&mut home.command(&["--json", "list"]))));
    }
    let mut floor_list = Vec::new();
    for _ in 0..10 {
        floor_list.push(time(|| quiet(Command::new("ps").args(["-e"]))));
    }
    drop(home);

    let home = Home::new(opts, &[("BGWORK_MAX_RUNNING", "100000")]);
    let daemon = home.daemon_pid();
    home.start("true", &[]);
    let (fds_before, rss_before) = (fd_count(daemon), memory_kb(daemon, "VmRSS").unwrap_or(0));
    let began = Instant::now();
    for _ in 0..short {
        quiet(&mut home.command(&["start", "--window", "0", "--", "true"]));
    }
    let bgwork_rate = short as f64 / began.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline && !home.json(&["list"])["items"].as_array().unwrap().is_empty()
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let (fds_after, rss_after) = (fd_count(daemon), memory_kb(daemon, "VmRSS").unwrap_or(0));
    let began = Instant::now();
    for _ in 0..short.min(2000) {
        quiet(Command::new("sh").args(["-c", "true &"]));
    }
    let floor_rate = short.min(2000) as f64 / began.elapsed().as_secs_f64();

    let _ = writeln!(report, "## 5. Scale\n\n{idle} idle jobs (`sleep 3600`) at once, then {short} short jobs (`true`) in sequence. Targets: daemon ≤ 100 MB, each supervisor ≤ 2 MB, idle CPU ≈ 0.\n");
    let _ = writeln!(report, "| what | bgwork | baseline | ratio |");
    let _ = writeln!(report, "| --- | ---: | ---: | ---: |");
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let max = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
    let _ = writeln!(
        report,
        "| daemon RSS with {idle} jobs | {daemon_rss:.1} MB | — | — |"
    );
    let _ = writeln!(report, "| supervisor RSS, mean / max | {:.2} / {:.2} MB | the job's own `sleep`: {:.2} MB | {:.2}× |", mean(&supervisor_rss), max(&supervisor_rss), mean(&sleep_rss), mean(&supervisor_rss) / mean(&sleep_rss));
    let _ = writeln!(report, "| supervisor private memory (USS: not shared with other processes), mean | {:.2} MB | the `sleep`'s: {:.2} MB | {:.2}× |", mean(&supervisor_uss), mean(&sleep_uss), mean(&supervisor_uss) / mean(&sleep_uss));
    if mean(&supervisor_rss) > 2.0 {
        note(&format!(
            "**Supervisor memory** (RSS {:.2} MB against 2 MB). RSS counts the pages of the \
             shared binary and C library each supervisor maps; they are in memory once for all \
             supervisors. What a supervisor costs on its own is its private memory (USS), \
             {:.2} MB here, under the target. What would lower the RSS too: a supervisor built \
             as its own small binary (no async runtime, SQLite or MCP code mapped).",
            mean(&supervisor_rss),
            mean(&supervisor_uss)
        ));
    }
    let _ = writeln!(report, "| CPU of daemon + {idle} supervisors over {idle_secs} s idle | {cpu_percent:.3} % of a core | 0 | — |");
    let _ = writeln!(
        report,
        "| `bgwork list --json` of {idle} jobs, median | {:.1} ms | `ps -e`: {:.1} ms | {:.2}× |",
        median(&list_times),
        median(&floor_list),
        median(&list_times) / median(&floor_list)
    );
    let _ = writeln!(report, "| short jobs in sequence | {bgwork_rate:.0} jobs/s | `sh -c 'true &'`: {floor_rate:.0}/s | {:.2}× |", bgwork_rate / floor_rate);
    let _ = writeln!(
        report,
        "| daemon fds before → after {short} jobs | {fds_before} → {fds_after} | — | — |"
    );
    let _ = writeln!(
        report,
        "| daemon RSS before → after {short} jobs | {:.1} → {:.1} MB | — | — |\n",
        rss_before as f64 / 1024.0,
        rss_after as f64 / 1024.0
    );
}

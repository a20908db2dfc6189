//! Figure 8: what looking at jobs' processes costs `list` — 100 running jobs, each
//! listening on a TCP port, listed with port discovery on and off (`BGWORK_PORTS=0`),
//! the same jobs under daemons started one way, then the other, in alternating rounds.

use super::*;

pub fn port_discovery(opts: &Opts, report: &mut String) {
    let jobs = if opts.smoke { 10 } else { 100 };
    let rounds = if opts.smoke { 1 } else { 3 };
    let lists = if opts.smoke { 5 } else { 20 };
    let home = Home::new(opts, &[("BGWORK_MAX_RUNNING", "100000")]);
    let listener = "exec perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new(Listen => 5, \
                    LocalAddr => \"127.0.0.1:0\") or die; sleep 3600'";
    let mut ids = Vec::new();
    for n in 0..jobs {
        // Each command differs (`start` answers a running twin with that twin).
        ids.push(home.start(&format!("{listener} # {n}"), &[]));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let listening = || {
        home.json(&["list"])["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["listening"].as_array().is_some_and(|a| !a.is_empty()))
            .count()
    };
    while listening() < jobs && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let found = listening();
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        for (ports, samples) in [("1", &mut with), ("0", &mut without)] {
            // A daemon started with this setting takes the same jobs back.
            quiet(&mut home.command(&["shutdown"]));
            let mut first = home.command(&["--json", "list"]);
            quiet(first.env("BGWORK_PORTS", ports));
            for _ in 0..lists {
                samples.push(time(|| quiet(&mut home.command(&["--json", "list"]))));
            }
        }
    }
    drop(home);
    let _ = writeln!(report, "## 9. Port discovery\n\n`bgwork list --json` with {jobs} running jobs, each a process listening on a TCP port ({found} of them found listening), with the daemon looking for ports (the default) and without (`BGWORK_PORTS=0`); CPU time and memory are read either way. {rounds} alternating rounds of {lists} lists.\n");
    let _ = writeln!(report, "| what | median | p95 |");
    let _ = writeln!(report, "| --- | ---: | ---: |");
    let _ = writeln!(
        report,
        "| `list` with port discovery | {:.1} ms | {:.1} ms |",
        median(&with),
        percentile(&with, 95.0)
    );
    let _ = writeln!(
        report,
        "| `list` without port discovery | {:.1} ms | {:.1} ms |",
        median(&without),
        percentile(&without, 95.0)
    );
    let _ = writeln!(
        report,
        "| cost of discovery per `list` | {:.1} ms | — |\n",
        median(&with) - median(&without)
    );
}

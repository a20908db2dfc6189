//! One job lifecycle, three executors: each test below is written once and run on this
//! machine (`conformance::local::…`), on a Slurm cluster (`conformance::slurm::…`) and
//! on an ssh host (`conformance::ssh::…`). The Slurm runs need `BGWORK_TEST_SLURM=1`
//! and a cluster that answers (see `tests/it/slurm.rs`), the ssh runs
//! `BGWORK_TEST_SSH=1` and a host (see `tests/it/ssh.rs`); without them they say on
//! stderr that they did not run.
//!
//! What a user relies on whichever executor runs the work: the table of ends with the
//! job's own codes, incremental reads with no gap and no repeat, `wait` for any, all
//! or a pattern, one notice per end, a stop with its grace (a child that ignores TERM
//! included), a daemon killed and restarted with work running and ending meanwhile,
//! the per-session limit, and input sent to a job's stdin.

use crate::util::{eventually, Home};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

/// Where the work runs.
pub enum Exec {
    Local,
    Slurm {
        conf: String,
    },
    /// The test host (this machine, as another user): files the job and the test both
    /// use lie in `shared`, a folder that user may write in; the homes made are cleaned
    /// on the host when the test ends.
    Ssh {
        host: crate::ssh::Host,
        shared: tempfile::TempDir,
        homes: std::cell::RefCell<Vec<PathBuf>>,
    },
}

impl Exec {
    fn slurm(test: &str) -> Option<Exec> {
        crate::slurm::cluster(&format!("conformance::slurm::{test}"))
            .map(|conf| Exec::Slurm { conf })
    }

    fn ssh(test: &str) -> Option<Exec> {
        let host = crate::ssh::host(&format!("conformance::ssh::{test}"))?;
        let shared = tempfile::Builder::new()
            .prefix("bgw-ssh-shared")
            .tempdir_in("/tmp")
            .expect("a shared folder");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
        Some(Exec::Ssh {
            host,
            shared,
            homes: Default::default(),
        })
    }

    /// A home whose `start` runs work on this executor by default.
    fn home(&self) -> Home {
        match self {
            Exec::Local => Home::new(),
            Exec::Slurm { conf } => Home::new()
                .with("SLURM_CONF", conf)
                .with("BGWORK_EXECUTOR", "slurm"),
            Exec::Ssh { host, homes, .. } => {
                let home = Home::new()
                    .with("BGWORK_SSH_CONFIG", &host.config)
                    .with("BGWORK_EXECUTOR", &format!("ssh:{}", host.alias));
                homes.borrow_mut().push(home.path().to_path_buf());
                home
            }
        }
    }

    /// A file both the test and the job see: in the home (Slurm's nodes share it), or
    /// in the folder shared with the host's user.
    fn marker(&self, home: &Home, name: &str) -> PathBuf {
        match self {
            Exec::Local | Exec::Slurm { .. } => home.path().join(name),
            Exec::Ssh { shared, .. } => shared.path().join(name),
        }
    }

    /// Where the status files of the home's jobs are written.
    fn status_dir(&self, home: &Home) -> PathBuf {
        match self {
            Exec::Local | Exec::Slurm { .. } => home.path().join("jobs"),
            Exec::Ssh { host, .. } => crate::ssh::remote_jobs(host, home.path()),
        }
    }

    /// The setting that limits this executor's work per session.
    fn limit_setting(&self) -> &'static str {
        match self {
            Exec::Local | Exec::Ssh { .. } => "BGWORK_MAX_RUNNING",
            Exec::Slurm { .. } => "BGWORK_MAX_SLURM",
        }
    }

    /// How long a job may take to be running (Slurm schedules about once a second; a
    /// host's first job pays for the connection and copying bgwork there).
    fn patience(&self) -> Duration {
        match self {
            Exec::Local => Duration::from_secs(20),
            Exec::Slurm { .. } | Exec::Ssh { .. } => Duration::from_secs(60),
        }
    }

    /// Starts `command` with `options` (no window) and returns its id once the
    /// executor has started it; checks that it runs where it was meant to.
    fn start(&self, home: &Home, options: &[&str], command: &str) -> String {
        let mut args = vec!["start", "--window", "0"];
        args.extend_from_slice(options);
        args.extend_from_slice(&["--", command]);
        let reply = home.json(&args);
        match self {
            Exec::Local => assert!(reply["executor"].is_null(), "{reply}"),
            Exec::Slurm { .. } => assert_eq!(reply["executor"], "slurm", "{reply}"),
            Exec::Ssh { .. } => assert_eq!(reply["executor"], "ssh", "{reply}"),
        }
        let id = reply["id"].as_str().expect("an id").to_string();
        eventually(self.patience(), || {
            let state = home.item(&id)["state"].clone();
            state != "starting" && state != "queued"
        });
        id
    }

    fn wait_end(&self, home: &Home, id: &str) -> Value {
        let timeout = self.patience().as_secs().to_string();
        let reply = home
            .run(&["--json", "wait", id, "--timeout", &timeout])
            .json();
        assert_eq!(reply["reason"], "ended", "{id} did not end: {reply}");
        reply["items"][0].clone()
    }
}

impl Drop for Exec {
    fn drop(&mut self) {
        if let Exec::Ssh { host, homes, .. } = self {
            for home in homes.borrow().iter() {
                crate::ssh::clean_host(host, home);
            }
        }
    }
}

/// Each test once per executor.
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod local {
            $( #[test] fn $name() { super::$name(&super::Exec::Local) } )*
        }
        mod slurm {
            $(
                #[test]
                fn $name() {
                    if let Some(exec) = super::Exec::slurm(stringify!($name)) {
                        super::$name(&exec)
                    }
                }
            )*
        }
        mod ssh {
            $(
                #[test]
                fn $name() {
                    if let Some(exec) = super::Exec::ssh(stringify!($name)) {
                        super::$name(&exec)
                    }
                }
            )*
        }
    };
}

conformance!(
    ends_keep_the_jobs_own_codes,
    incremental_reads_have_no_gap_and_no_repeat,
    wait_for_any_all_and_a_pattern,
    each_end_fires_one_notice,
    stop_with_grace_ends_a_term_ignoring_child,
    a_killed_daemon_reattaches_and_settles_what_ended_meanwhile,
    the_session_limit_refuses_with_the_items_that_hold_it,
    send_reaches_stdin_in_order_and_end_of_input_closes_it,
    a_large_send_is_taken_whole,
);

/// A shell line that waits until the file `name` exists where both the test and the
/// job see it (`Exec::marker`).
fn until_file(exec: &Exec, home: &Home, name: &str) -> String {
    format!(
        "while [ ! -e '{}' ]; do sleep 0.05; done",
        exec.marker(home, name).display()
    )
}

fn touch(exec: &Exec, home: &Home, name: &str) {
    std::fs::write(exec.marker(home, name), b"").expect("touch");
}

fn ends_keep_the_jobs_own_codes(exec: &Exec) {
    let home = exec.home();
    let ok = exec.start(&home, &[], "echo hi; exit 0");
    let three = exec.start(&home, &[], "exit 3");
    let by_signal = exec.start(&home, &[], "kill -TERM $$");
    let by_code = exec.start(&home, &[], "exit 143");
    let item = exec.wait_end(&home, &ok);
    assert_eq!(item["end"], "succeeded", "{item}");
    assert_eq!(item["exit_code"], 0, "{item}");
    assert_eq!(
        item["report"],
        format!("{ok} finished successfully (exit 0)")
    );
    let item = exec.wait_end(&home, &three);
    assert_eq!(item["end"], "failed", "{item}");
    assert_eq!(item["exit_code"], 3, "{item}");
    assert_eq!(item["report"], format!("{three} FAILED (exit 3)"));
    let item = exec.wait_end(&home, &by_signal);
    assert_eq!(item["end"], "signaled", "{item}");
    assert_eq!(item["signal"], 15, "{item}");
    assert!(item["exit_code"].is_null(), "{item}");
    let item = exec.wait_end(&home, &by_code);
    assert_eq!(item["end"], "signaled", "{item}");
    assert_eq!(item["exit_code"], 143, "{item}");
}

fn incremental_reads_have_no_gap_and_no_repeat(exec: &Exec) {
    let home = exec.home();
    let id = exec.start(
        &home,
        &[],
        "for i in $(seq 1 400); do echo line-$i; sleep 0.005; done",
    );
    let mut seen = String::new();
    let mut reads = 0;
    let deadline = std::time::Instant::now() + exec.patience();
    loop {
        let ended = home.item(&id)["state"] == "ended";
        let read = home.json(&["read", &id]);
        seen.push_str(read["output"].as_str().unwrap_or_default());
        reads += 1;
        if ended && read["output"] == "" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{id} did not end");
    }
    let expected: String = (1..=400).map(|i| format!("line-{i}\n")).collect();
    assert_eq!(seen, expected, "after {reads} reads");
    assert!(reads > 2, "the job was read while it ran ({reads} reads)");
    assert_eq!(home.json(&["read", &id, "--all"])["output"], expected);
}

fn wait_for_any_all_and_a_pattern(exec: &Exec) {
    let home = exec.home();
    let pattern = exec.start(
        &home,
        &[],
        &format!(
            "echo starting; {}; echo READY; sleep 300",
            until_file(exec, &home, "ready")
        ),
    );
    let quick = exec.start(
        &home,
        &[],
        &format!("{}; exit 0", until_file(exec, &home, "quick")),
    );
    let slow = exec.start(
        &home,
        &[],
        &format!("{}; exit 3", until_file(exec, &home, "slow")),
    );
    let timeout = exec.patience().as_secs().to_string();

    // Nothing has come: a short wait says so.
    let nothing = home
        .run(&[
            "--json",
            "wait",
            &pattern,
            "--until",
            "^READ[Y]$",
            "--timeout",
            "0.5",
        ])
        .json();
    assert_eq!(nothing["reason"], "timeout", "{nothing}");
    touch(exec, &home, "ready");
    let matched = home.json(&[
        "wait",
        &pattern,
        "--until",
        "^READ[Y]$",
        "--timeout",
        &timeout,
    ]);
    assert_eq!(matched["reason"], "matched", "{matched}");
    assert_eq!(matched["items"][0]["state"], "running", "{matched}");

    touch(exec, &home, "quick");
    let any = home.json(&["wait", &quick, &slow, "--any", "--timeout", &timeout]);
    assert_eq!(any["reason"], "ended", "{any}");
    let ended: Vec<&str> = any["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["state"] == "ended")
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    assert_eq!(ended, vec![quick.as_str()], "{any}");

    touch(exec, &home, "slow");
    let run = home.run(&[
        "--json",
        "wait",
        &quick,
        &slow,
        "--all",
        "--timeout",
        &timeout,
    ]);
    let all = run.json();
    assert_eq!(all["reason"], "ended", "{all}");
    assert!(
        all["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["state"] == "ended"),
        "{all}"
    );
    assert_eq!(run.code, 1, "one of them failed: {all}");
    home.json(&["stop", &pattern]);
}

fn each_end_fires_one_notice(exec: &Exec) {
    let home = exec.home();
    let ids: Vec<String> = (0..3)
        .map(|i| {
            exec.start(
                &home,
                &["--notify"],
                &format!(
                    "echo building-{i}; echo 'error: number {i}'; exit {}",
                    i + 1
                ),
            )
        })
        .collect();
    let mut notices: Vec<Value> = Vec::new();
    let deadline = std::time::Instant::now() + exec.patience();
    while notices.len() < ids.len() {
        assert!(
            std::time::Instant::now() < deadline,
            "not every end was told: {notices:?}"
        );
        let reply = home.json(&["notices", "--wait", "5"]);
        notices.extend(reply["notices"].as_array().unwrap().iter().cloned());
    }
    assert_eq!(notices.len(), ids.len(), "{notices:?}");
    for (i, id) in ids.iter().enumerate() {
        let notice = notices
            .iter()
            .find(|n| n["item"] == id.as_str())
            .unwrap_or_else(|| panic!("no notice for {id}: {notices:?}"));
        assert_eq!(notice["end"], "failed", "{notice}");
        assert_eq!(notice["exit_code"], i as i64 + 1, "{notice}");
        let tail = notice["tail"].as_str().unwrap_or_default();
        assert!(tail.contains(&format!("error: number {i}")), "{notice}");
    }
    let again = home.json(&["notices", "--wait", "1"]);
    assert_eq!(again["notices"].as_array().unwrap().len(), 0, "{again}");
}

fn stop_with_grace_ends_a_term_ignoring_child(exec: &Exec) {
    let home = exec.home();
    let polite = exec.start(
        &home,
        &[],
        "trap 'echo bye; exit 7' TERM; echo up; while :; do sleep 0.1; done",
    );
    // The child ignores TERM and outlives its parent unless the whole tree is killed.
    let pid_file = exec.marker(&home, "child.pid");
    let stubborn = exec.start(
        &home,
        &[],
        &format!(
            "bash -c 'trap \"\" TERM; echo $$ > {}; while :; do sleep 0.1; done' & \
             trap '' TERM; echo up; wait",
            pid_file.display()
        ),
    );
    for id in [&polite, &stubborn] {
        eventually(exec.patience(), || {
            home.json(&["read", id, "--all"])["output"]
                .as_str()
                .is_some_and(|t| t.contains("up"))
        });
    }
    let stopped = home.json(&["stop", &polite]);
    assert_eq!(stopped["end"], "stopped_by_agent", "{stopped}");
    assert_eq!(
        stopped["exit_code"], 7,
        "the job's own exit on TERM: {stopped}"
    );
    let text = home.json(&["read", &polite, "--all"])["output"].clone();
    assert!(text.as_str().unwrap_or_default().contains("bye"), "{text}");

    let child: i32 = std::fs::read_to_string(&pid_file)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .expect("the child wrote its pid");
    assert!(crate::util::alive(child));
    let stopped = home.json(&["stop", &stubborn, "--grace", "1"]);
    assert_eq!(stopped["end"], "stopped_by_agent", "{stopped}");
    let report = stopped["report"].as_str().unwrap_or_default();
    assert!(report.contains("killed after 1 s"), "{stopped}");
    eventually(Duration::from_secs(10), || !crate::util::alive(child));
}

fn a_killed_daemon_reattaches_and_settles_what_ended_meanwhile(exec: &Exec) {
    let home = exec.home();
    let ends = exec.start(
        &home,
        &["--notify"],
        &format!(
            "echo one; {}; echo two; exit 7",
            until_file(exec, &home, "go")
        ),
    );
    let runs = exec.start(
        &home,
        &[],
        &format!(
            "echo first; {}; echo second; sleep 300",
            until_file(exec, &home, "go")
        ),
    );
    for (id, line) in [(&ends, "one\n"), (&runs, "first\n")] {
        eventually(exec.patience(), || {
            home.json(&["read", id, "--all"])["output"] == line
        });
        assert_eq!(home.json(&["read", id])["output"], line);
    }
    home.kill_daemon();
    touch(exec, &home, "go");
    // The first ends while no daemon runs.
    let status = exec.status_dir(&home);
    eventually(exec.patience(), || {
        std::fs::read_dir(&status)
            .map(|d| d.flatten().any(|e| e.path().join("status").exists()))
            .unwrap_or(false)
    });
    let item = home.item(&runs);
    assert_eq!(item["state"], "running", "{item}");
    // Its notice comes once (a `wait` that shows the end would deliver it too).
    let timeout = exec.patience().as_secs().to_string();
    let notices = home.json(&["notices", "--wait", &timeout]);
    let notices = notices["notices"].as_array().unwrap();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0]["item"], ends.as_str());
    assert_eq!(notices[0]["exit_code"], 7);
    assert_eq!(
        home.json(&["notices"])["notices"].as_array().unwrap().len(),
        0
    );
    let ended = exec.wait_end(&home, &ends);
    assert_eq!(ended["end"], "failed", "{ended}");
    assert_eq!(ended["exit_code"], 7, "{ended}");
    // The read cursors survived: only what came after the last read.
    assert_eq!(home.json(&["read", &ends])["output"], "two\n");
    eventually(exec.patience(), || {
        home.json(&["read", &runs, "--all"])["output"] == "first\nsecond\n"
    });
    assert_eq!(home.json(&["read", &runs])["output"], "second\n");
    let stopped = home.json(&["stop", &runs]);
    assert_eq!(stopped["end"], "stopped_by_agent", "{stopped}");
}

fn the_session_limit_refuses_with_the_items_that_hold_it(exec: &Exec) {
    let home = exec.home().with(exec.limit_setting(), "2");
    let first = exec.start(&home, &[], "exec sleep 300");
    let second = exec.start(&home, &[], "exec sleep 300");
    let (code, error, message) = home.error(&["start", "--window", "0", "--", "true"]);
    assert_eq!(code, 1);
    assert_eq!(error, "limit", "{message}");
    for id in [&first, &second] {
        assert!(message.contains(id.as_str()), "{message}");
    }
    // Another session has its own count.
    let other = home.run(&[
        "--session",
        "other",
        "--json",
        "start",
        "--window",
        "0",
        "--",
        "true",
    ]);
    assert_eq!(other.code, 0, "{}{}", other.stdout, other.stderr);
    home.json(&["stop", &first]);
    let third = exec.start(&home, &[], "exit 0");
    assert_eq!(exec.wait_end(&home, &third)["end"], "succeeded");
}

fn send_reaches_stdin_in_order_and_end_of_input_closes_it(exec: &Exec) {
    let home = exec.home();
    let id = exec.start(
        &home,
        &[],
        "while read -r line; do echo \"got:$line\"; done; echo done",
    );
    let mut expected = String::new();
    for i in 0..20 {
        let sent = home.json(&["send", &id, &format!("line {i}\\n")]);
        assert!(sent["error"].is_null(), "{sent}");
        expected.push_str(&format!("got:line {i}\n"));
    }
    eventually(exec.patience(), || {
        home.json(&["read", &id, "--all"])["output"] == expected.as_str()
    });
    home.json(&["send", &id, "--key", "C-d"]);
    let item = exec.wait_end(&home, &id);
    assert_eq!(item["end"], "succeeded", "{item}");
    expected.push_str("done\n");
    assert_eq!(home.json(&["read", &id, "--all"])["output"], expected);
}

fn a_large_send_is_taken_whole(exec: &Exec) {
    let home = exec.home();
    let id = exec.start(&home, &[], "wc -c");
    // Near the largest request a client may send (1 MiB, in JSON).
    let big = "a".repeat(900_000);
    let reply = crate::hostile::raw(
        &home,
        &serde_json::json!({"session": "test", "op": "send", "id": id, "text": big}),
    );
    assert_eq!(reply["ok"], true, "{reply}");
    home.json(&["send", &id, "--key", "C-d"]);
    let item = exec.wait_end(&home, &id);
    assert_eq!(item["end"], "succeeded", "{item}");
    let output = home.json(&["read", &id, "--all"])["output"].clone();
    assert_eq!(output.as_str().map(str::trim), Some("900000"), "{output}");
}

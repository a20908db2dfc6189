//! Jobs on a real Slurm cluster (issue 14): `start --on slurm`, queued then running,
//! output, ends with their codes, stops, Slurm's own ends, and a daemon restart.
//!
//! These run only with `BGWORK_TEST_SLURM=1` and a cluster that answers (`.ci/run`
//! starts one with `scripts/slurm-cluster start` and sets it); without it each test
//! says on stderr that it did not run and returns. With it, a cluster that does not
//! answer fails them.

use crate::util::{eventually, Home};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// The cluster's configuration, or `None` (the tests are not run) without
/// `BGWORK_TEST_SLURM=1`.
pub fn cluster(test: &str) -> Option<String> {
    if std::env::var("BGWORK_TEST_SLURM").as_deref() != Ok("1") {
        crate::util::not_run(
            test,
            "set BGWORK_TEST_SLURM=1 with a cluster up (scripts/slurm-cluster start)",
        );
        return None;
    }
    let conf = std::env::var("BGWORK_TEST_SLURM_CONF").unwrap_or_else(|_| {
        format!(
            "{}/target/slurm-cluster/slurm.conf",
            env!("CARGO_MANIFEST_DIR")
        )
    });
    let answer = Command::new("sinfo")
        .args(["-h", "-o", "%D"])
        .env("SLURM_CONF", &conf)
        .output()
        .expect("sinfo runs (apt-get install slurm-client)");
    assert!(
        answer.status.success(),
        "BGWORK_TEST_SLURM=1 but the cluster of {conf} does not answer: {}",
        String::from_utf8_lossy(&answer.stderr)
    );
    Some(conf)
}

fn home(conf: &str) -> Home {
    Home::new().with("SLURM_CONF", conf)
}

fn slurm(conf: &str, args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .env("SLURM_CONF", conf)
        .output()
        .expect("a Slurm command runs");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Starts a job on Slurm (no window) and returns its item as `start` answered.
fn start(home: &Home, options: &[&str], command: &str) -> Value {
    let mut args = vec!["start", "--window", "0", "--on", "slurm"];
    args.extend_from_slice(options);
    args.extend_from_slice(&["--", command]);
    home.json(&args)
}

fn wait_end(home: &Home, id: &str, timeout_s: u64) -> Value {
    let t = timeout_s.to_string();
    let reply = home.run(&["--json", "wait", id, "--timeout", &t]).json();
    assert_eq!(reply["reason"], "ended", "{id} did not end: {reply}");
    reply["items"][0].clone()
}

/// A job that was queued when its daemon died: it ended without running, saying why,
/// and Slurm no longer holds it in its queue.
fn assert_gone_with_the_daemon(conf: &str, item: &Value) {
    assert_eq!(item["end"], "spawn_failed", "{item}");
    let why = item["lost_reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("daemon stopped") && why.contains("start it again"),
        "{item}"
    );
    let job = &job_of(item);
    eventually(Duration::from_secs(20), || {
        slurm(conf, &["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"]).trim() != "PENDING"
    });
}

fn state(home: &Home, id: &str) -> String {
    home.item(id)["state"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// An item's id, as `start` or `list` gave it.
fn id_of(item: &Value) -> String {
    item["id"].as_str().unwrap().to_string()
}

/// An item's Slurm job id.
fn job_of(item: &Value) -> String {
    item["slurm_job_id"]
        .as_str()
        .expect("a Slurm job id")
        .to_string()
}

/// An item's job folder (where its log is).
fn folder_of(item: &Value) -> PathBuf {
    PathBuf::from(item["log_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Lets a job queued in the `held` partition (which is down) run: moved to `debug`.
fn release(conf: &str, job: &str) {
    slurm(
        conf,
        &[
            "scontrol",
            "update",
            &format!("JobId={job}"),
            "Partition=debug",
        ],
    );
}

/// The end's one-line report says `words`.
fn assert_report_says(ended: &Value, words: &str) {
    assert!(
        ended["report"].as_str().unwrap_or_default().contains(words),
        "{ended}"
    );
}

#[test]
fn issue14_slurm_job_is_queued_with_its_reason_then_runs_and_is_read() {
    let Some(conf) = cluster("issue14_slurm_job_is_queued_with_its_reason_then_runs_and_is_read")
    else {
        return;
    };
    let home = home(&conf);
    // The `held` partition is down: Slurm keeps the job queued until it is moved.
    let item = start(
        &home,
        &[
            "--partition",
            "held",
            "--nodes",
            "1",
            "--sbatch-arg=--comment=from-bgwork",
        ],
        "echo first; echo second",
    );
    let id = id_of(&item);
    assert_eq!(item["state"], "queued", "{item}");
    assert_eq!(item["executor"], "slurm");
    let job = job_of(&item);
    eventually(Duration::from_secs(20), || {
        home.item(&id)["queue_reason"] == "PartitionDown"
    });
    assert_eq!(state(&home, &id), "queued");
    let shown = slurm(&conf, &["scontrol", "show", "job", "-o", &job]);
    assert!(shown.contains("Comment=from-bgwork"), "{shown}");
    release(&conf, &job);
    let ended = wait_end(&home, &id, 60);
    assert_eq!(ended["end"], "succeeded", "{ended}");
    assert_eq!(ended["exit_code"], 0);
    let read = home.json(&["read", &id]);
    let text = read["output"].as_str().unwrap_or_default();
    assert!(text.contains("first\nsecond\n"), "{read}");
}

#[test]
fn issue14_slurm_ends_keep_the_jobs_own_codes() {
    let Some(conf) = cluster("issue14_slurm_ends_keep_the_jobs_own_codes") else {
        return;
    };
    let home = home(&conf);
    let ok = start(&home, &[], "echo fine")["id"]
        .as_str()
        .unwrap()
        .to_string();
    let failed = start(&home, &[], "echo bad; exit 3")["id"]
        .as_str()
        .unwrap()
        .to_string();
    let killed = start(&home, &[], "kill -9 $$")["id"]
        .as_str()
        .unwrap()
        .to_string();
    let ok = wait_end(&home, &ok, 60);
    assert_eq!(
        (ok["end"].clone(), ok["exit_code"].clone()),
        ("succeeded".into(), 0.into())
    );
    let failed = wait_end(&home, &failed, 60);
    assert_eq!(failed["end"], "failed", "{failed}");
    assert_eq!(failed["exit_code"], 3);
    let killed = wait_end(&home, &killed, 60);
    assert_eq!(killed["end"], "signaled", "{killed}");
    assert_eq!(killed["signal"], 9);
    assert!(killed["exit_code"].is_null(), "no invented code: {killed}");
}

#[test]
fn issue14_slurm_end_fires_one_notice() {
    let Some(conf) = cluster("issue14_slurm_end_fires_one_notice") else {
        return;
    };
    let home = home(&conf);
    let id = start(&home, &["--notify"], "echo done; exit 4")["id"]
        .as_str()
        .unwrap()
        .to_string();
    let reply = home.json(&["notices", "--wait", "60"]);
    let notices = reply["notices"].as_array().cloned().unwrap_or_default();
    assert_eq!(notices.len(), 1, "{reply}");
    let text = notices[0].to_string();
    assert!(text.contains(&id) && text.contains("exit 4"), "{reply}");
    let again = home.json(&["notices"]);
    assert!(
        again["notices"].as_array().is_none_or(|n| n.is_empty()),
        "{again}"
    );
}

#[test]
fn issue14_slurm_scancel_from_outside_is_stopped_by_person() {
    let Some(conf) = cluster("issue14_slurm_scancel_from_outside_is_stopped_by_person") else {
        return;
    };
    let home = home(&conf);
    let item = start(&home, &[], "echo up; sleep 300");
    let id = id_of(&item);
    let job = job_of(&item);
    eventually(Duration::from_secs(30), || state(&home, &id) == "running");
    slurm(&conf, &["scancel", &job]);
    let ended = wait_end(&home, &id, 60);
    assert_eq!(ended["end"], "stopped_by_person", "{ended}");
    assert_report_says(&ended, "scancel");
}

#[test]
fn issue14_slurm_queued_job_stopped_leaves_the_queue() {
    let Some(conf) = cluster("issue14_slurm_queued_job_stopped_leaves_the_queue") else {
        return;
    };
    let home = home(&conf);
    let item = start(&home, &["--partition", "held"], "echo never");
    let id = id_of(&item);
    let job = job_of(&item);
    let stopped = home.json(&["stop", &id]);
    assert_eq!(stopped["end"], "stopped_by_agent", "{stopped}");
    let queue = slurm(&conf, &["squeue", "-h", "-j", &job, "-o", "%T"]);
    assert!(!queue.contains("PENDING"), "still queued: {queue}");
}

#[test]
fn issue14_slurm_time_limit_ends_signaled_with_its_detail() {
    let Some(conf) = cluster("issue14_slurm_time_limit_ends_signaled_with_its_detail") else {
        return;
    };
    let home = home(&conf);
    // Slurm counts limits in minutes and checks them about every 30 s.
    let id = start(&home, &["--time", "0:05"], "echo t; sleep 600")["id"]
        .as_str()
        .unwrap()
        .to_string();
    let ended = wait_end(&home, &id, 150);
    assert_eq!(ended["end"], "signaled", "{ended}");
    assert_report_says(&ended, "time limit");
}

#[test]
fn issue14_slurm_daemon_killed_reconciles_every_state_and_submits_nothing_twice() {
    let Some(conf) =
        cluster("issue14_slurm_daemon_killed_reconciles_every_state_and_submits_nothing_twice")
    else {
        return;
    };
    let home = home(&conf);
    let queued = start(&home, &["--partition", "held"], "echo late");
    let running = start(&home, &[], "echo up; sleep 300");
    let quick = start(&home, &[], "sleep 2; exit 5");
    eventually(Duration::from_secs(30), || {
        state(&home, &id_of(&running)) == "running"
    });
    home.kill_daemon();
    // The quick one ends while no daemon runs.
    let folder = home.path().join("jobs");
    eventually(Duration::from_secs(60), || {
        std::fs::read_dir(&folder)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().join("status").exists())
                    .count()
                    >= 1
            })
            .unwrap_or(false)
    });
    let list = home.json(&["list", "--all"]);
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 3, "{list}");
    let find = |v: &Value| items.iter().find(|i| i["id"] == v["id"]).unwrap().clone();
    assert_eq!(find(&queued)["slurm_job_id"], queued["slurm_job_id"]);
    assert_eq!(find(&running)["state"], "running", "{list}");
    // The queued one lost its environment with the daemon (never written): it leaves
    // Slurm's queue and ends saying so (issue 22, item 6).
    let gone = wait_end(&home, &id_of(&queued), 30);
    assert_gone_with_the_daemon(&conf, &gone);
    let ended = wait_end(&home, &id_of(&quick), 30);
    assert_eq!(ended["end"], "failed", "{ended}");
    assert_eq!(ended["exit_code"], 5);
    // Each is one Slurm job, under its own name.
    for item in [&queued, &running, &quick] {
        let shown = slurm(
            &conf,
            &["squeue", "-h", "-t", "all", "-j", &job_of(item), "-o", "%j"],
        );
        let name = shown.trim().to_string();
        assert!(name.starts_with("bgw-"), "{shown}");
        let same = slurm(
            &conf,
            &["squeue", "-h", "-t", "all", "-n", &name, "-o", "%i"],
        );
        assert_eq!(
            same.split_whitespace().count(),
            1,
            "{name} submitted twice: {same}"
        );
    }
    let stopped = home.json(&["stop", &id_of(&running)]);
    assert_eq!(stopped["end"], "stopped_by_agent", "{stopped}");
}

#[test]
fn issue14_slurm_options_are_checked() {
    // Needs no cluster: bad values are refused before anything is submitted.
    let home = Home::new();
    let (_, code, message) = home.error(&["start", "--on", "moon", "--", "true"]);
    assert_eq!(code, "bad_request");
    assert!(message.contains("slurm"), "{message}");
    let (_, _, message) = home.error(&["start", "--on", "slurm", "--pty", "--", "bash"]);
    assert!(message.contains("pane"), "{message}");
    let (_, _, message) = home.error(&["start", "--on", "local", "--time", "5", "--", "true"]);
    assert!(message.contains("--on slurm"), "{message}");
    let (_, _, message) = home.error(&["start", "--on", "slurm", "--time", "1 h", "--", "true"]);
    assert!(message.contains("--time"), "{message}");
    let (_, _, message) = home.error(&[
        "start",
        "--on",
        "slurm",
        "--sbatch-arg=--job-name=mine",
        "--",
        "true",
    ]);
    assert!(message.contains("sets --job-name itself"), "{message}");
    let (_, _, message) = home.error(&["start", "--on", "slurm", "--gpus", "0", "--", "true"]);
    assert!(message.contains("--gpus takes 1 or more"), "{message}");
    // `run` stays on this machine whatever BGWORK_EXECUTOR says: no cluster is asked.
    let home = home.with("BGWORK_EXECUTOR", "slurm");
    let ran = home.json(&["run", "--", "echo here"]);
    assert_eq!(ran["exit_code"], 0, "{ran}");
}

#[test]
fn issue14_slurm_jobs_count_against_their_own_limit() {
    let Some(conf) = cluster("issue14_slurm_jobs_count_against_their_own_limit") else {
        return;
    };
    let home = home(&conf)
        .with("BGWORK_MAX_SLURM", "2")
        .with("BGWORK_MAX_RUNNING", "1");
    // Queued ones count: the cluster holds them for this session.
    start(&home, &["--partition", "held"], "echo one");
    start(&home, &["--partition", "held"], "echo two");
    let (_, code, message) = home.error(&[
        "start",
        "--window",
        "0",
        "--on",
        "slurm",
        "--partition",
        "held",
        "--",
        "echo three",
    ]);
    assert_eq!(code, "limit", "{message}");
    assert!(message.contains("Slurm"), "{message}");
    // This machine's limit is its own: a local job still starts.
    let local = home.json(&["start", "--window", "0", "--", "sleep 30"]);
    assert!(local["executor"].is_null(), "{local}");
}

#[test]
fn issue14_slurm_is_the_default_with_bgwork_executor_and_in_mcp() {
    let Some(conf) = cluster("issue14_slurm_is_the_default_with_bgwork_executor_and_in_mcp") else {
        return;
    };
    let home = home(&conf).with("BGWORK_EXECUTOR", "slurm");
    let item = home.json(&["start", "--window", "0", "--", "echo by default"]);
    assert_eq!(item["executor"], "slurm", "{item}");
    // `run` is a foreground command of this machine whatever the default.
    let ran = home.json(&["run", "--", "echo here"]);
    assert_eq!(ran["exit_code"], 0, "{ran}");
    let mut mcp = crate::mcp::Mcp::start(&home);
    let (error, started) = mcp.call(
        "start",
        serde_json::json!({"command": "echo from mcp", "on": "slurm", "window_ms": 0}),
    );
    assert!(!error, "{started}");
    assert_eq!(started["executor"], "slurm", "{started}");
    let id = started["id"].as_str().unwrap().to_string();
    let ended = wait_end(&home, &id, 60);
    assert_eq!(ended["end"], "succeeded", "{ended}");
}

#[test]
fn issue14_slurm_read_of_a_running_job_past_its_cap_skips_the_dropped_middle() {
    let Some(conf) =
        cluster("issue14_slurm_read_of_a_running_job_past_its_cap_skips_the_dropped_middle")
    else {
        return;
    };
    let home = home(&conf)
        .with("BGWORK_LOG_CAP", "65536")
        .with("BGWORK_LOG_HEAD", "1000");
    let id = start(
        &home,
        &[],
        "yes abcdefgh | head -c 3000000; echo; echo MARK; sleep 120",
    )["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut last = Value::Null;
    eventually(Duration::from_secs(60), || {
        last = home.json(&["read", &id, "--all"]);
        last["output"].as_str().is_some_and(|t| t.contains("MARK"))
    });
    assert_eq!(last["running"], true);
    // The figures come with the log's growth or the next look at the folder.
    eventually(Duration::from_secs(10), || {
        last = home.json(&["read", &id, "--all"]);
        last["dropped_bytes"].as_u64().unwrap_or(0) > 0
    });
    let output = last["output"].as_str().unwrap();
    assert!(
        !output.contains('\0'),
        "the dropped middle was read as zeros"
    );
    home.json(&["stop", &id]);
}

#[test]
fn issue14_slurm_commands_use_the_callers_slurm_conf_not_the_daemons() {
    let Some(conf) = cluster("issue14_slurm_commands_use_the_callers_slurm_conf_not_the_daemons")
    else {
        return;
    };
    let home = home(&conf);
    // The daemon starts with no SLURM_CONF: only the caller of `start` has it.
    let started = home
        .command(&["list"])
        .env_remove("SLURM_CONF")
        .output()
        .expect("bgwork list");
    assert!(started.status.success());
    let item = start(&home, &["--partition", "held"], "echo x");
    let id = id_of(&item);
    // scontrol works for the daemon too: the queue's reason comes from it.
    eventually(Duration::from_secs(20), || {
        home.item(&id)["queue_reason"] == "PartitionDown"
    });
    let stopped = home.json(&["stop", &id]);
    assert_eq!(stopped["end"], "stopped_by_agent", "{stopped}");
    let spec = folder_of(&stopped).join("spec.json");
    assert!(
        !spec.exists(),
        "the spec of a job that never ran is removed"
    );
}

#[test]
fn issue14_slurm_node_that_fails_under_a_job_ends_it_lost_node_failed() {
    let Some(conf) = cluster("issue14_slurm_node_that_fails_under_a_job_ends_it_lost_node_failed")
    else {
        return;
    };
    let cluster_dir = std::path::Path::new(&conf).parent().unwrap().to_path_buf();
    let home = home(&conf);
    // n3 is the `fragile` partition's alone: no other test's job runs there.
    let item = start(&home, &["--partition", "fragile"], "echo up; sleep 300");
    let id = id_of(&item);
    eventually(Duration::from_secs(30), || state(&home, &id) == "running");
    let folder = folder_of(&home.item(&id));
    // The node dies: its slurmd is killed and Slurm is told at once (rather than after
    // SlurmdTimeout).
    let slurmd = std::fs::read_to_string(cluster_dir.join("slurmd-n3.pid")).unwrap();
    let slurmd = slurmd.trim().to_string();
    assert!(Command::new("kill")
        .args(["-9", &slurmd])
        .status()
        .unwrap()
        .success());
    slurm(
        &conf,
        &[
            "scontrol",
            "update",
            "NodeName=n3",
            "State=DOWN",
            "Reason=bgwork-test",
        ],
    );
    let ended = wait_end(&home, &id, 60);
    // The supervisor still runs on this loopback "node": end it, and bring n3 back.
    let record = std::fs::read_to_string(folder.join("processes")).unwrap_or_default();
    for line in record.lines() {
        let mut words = line.split_whitespace();
        if let (Some("supervisor" | "job"), Some(pid)) = (words.next(), words.next()) {
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
    }
    let restarted = Command::new("/usr/sbin/slurmd")
        .args(["-f", &conf, "-N", "n3"])
        .status()
        .expect("slurmd restarts");
    assert!(restarted.success());
    // ReturnToService=2 may have taken it back already when slurmd registered.
    let _ = Command::new("scontrol")
        .args(["update", "NodeName=n3", "State=RESUME"])
        .env("SLURM_CONF", &conf)
        .output();
    eventually(Duration::from_secs(30), || {
        slurm(&conf, &["sinfo", "-h", "-n", "n3", "-o", "%t"]).trim() == "idle"
    });
    assert_eq!(ended["end"], "lost", "{ended}");
    assert_report_says(&ended, "node failed");
    assert!(
        ended["exit_code"].is_null() && ended["signal"].is_null(),
        "{ended}"
    );
}

/// A cluster of its own (folder, ports, munge), for a test that kills `slurmctld`
/// without disturbing the tests that share the main one; stopped when dropped.
struct PrivateCluster {
    dir: tempfile::TempDir,
    port: &'static str,
}

impl PrivateCluster {
    fn start(port: &'static str) -> PrivateCluster {
        let dir = tempfile::Builder::new()
            .prefix("bgw-slurm")
            .tempdir_in("/tmp")
            .expect("a folder for the cluster");
        let cluster = PrivateCluster { dir, port };
        cluster.script("start");
        cluster
    }

    fn script(&self, action: &str) {
        let out = Command::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/slurm-cluster"
        ))
        .arg(action)
        .env("BGWORK_SLURM_DIR", self.dir.path())
        .env("BGWORK_SLURM_PORT", self.port)
        .output()
        .expect("scripts/slurm-cluster runs");
        assert!(
            out.status.success(),
            "slurm-cluster {action}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn conf(&self) -> String {
        self.dir.path().join("slurm.conf").display().to_string()
    }

    /// Kills slurmctld with SIGKILL and waits until it is gone.
    fn kill_controller(&self) {
        let pid = std::fs::read_to_string(self.dir.path().join("slurmctld.pid")).unwrap();
        let pid: i32 = pid.trim().parse().unwrap();
        assert!(Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap()
            .success());
        eventually(Duration::from_secs(10), || !crate::util::alive(pid));
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = Command::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/slurm-cluster"
        ))
        .arg("stop")
        .env("BGWORK_SLURM_DIR", self.dir.path())
        .env("BGWORK_SLURM_PORT", self.port)
        .output();
    }
}

#[test]
fn issue14_slurmctld_killed_and_restarted_while_jobs_run_loses_nothing() {
    if cluster("issue14_slurmctld_killed_and_restarted_while_jobs_run_loses_nothing").is_none() {
        return;
    }
    let private = PrivateCluster::start("6947");
    let conf = private.conf();
    let home = home(&conf);
    let go = home.path().join("go");
    let wait_go = format!("while [ ! -e '{}' ]; do sleep 0.05; done", go.display());
    let queued = start(&home, &["--partition", "held"], "echo late");
    let ends = start(
        &home,
        &["--notify"],
        &format!("echo one; {wait_go}; echo two; exit 4"),
    );
    let runs = start(
        &home,
        &[],
        &format!("echo first; {wait_go}; echo second; sleep 300"),
    );
    for item in [&ends, &runs] {
        eventually(Duration::from_secs(30), || {
            state(&home, &id_of(item)) == "running"
        });
    }
    // Slurm saves its state a few seconds after a change (a controller killed before
    // that forgets the job, and bgwork then reports it lost, with why): wait until
    // the running jobs are in it.
    let running_at = std::time::SystemTime::now();
    eventually(Duration::from_secs(30), || {
        let saved = private.dir.path().join("state").join("job_state");
        std::fs::metadata(&saved)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t > running_at)
    });
    private.kill_controller();
    // While the controller is gone, one job ends and the other writes on.
    std::fs::write(&go, b"").unwrap();
    let ended = wait_end(&home, &id_of(&ends), 60);
    assert_eq!(ended["end"], "failed", "{ended}");
    assert_eq!(ended["exit_code"], 4, "{ended}");
    assert_eq!(
        home.json(&["read", &id_of(&ends), "--all"])["output"],
        "one\ntwo\n"
    );
    eventually(Duration::from_secs(30), || {
        home.json(&["read", &id_of(&runs), "--all"])["output"] == "first\nsecond\n"
    });
    assert_eq!(state(&home, &id_of(&runs)), "running");
    assert_eq!(state(&home, &id_of(&queued)), "queued");
    private.script("start");
    // Back: nothing was lost or ended wrongly, and the queue goes on.
    release(&conf, &job_of(&queued));
    let late = wait_end(&home, &id_of(&queued), 60);
    assert_eq!(late["end"], "succeeded", "{late}");
    assert_eq!(
        home.json(&["read", &id_of(&queued), "--all"])["output"],
        "late\n"
    );
    assert_eq!(state(&home, &id_of(&runs)), "running");
    let stopped = home.json(&["stop", &id_of(&runs)]);
    assert_eq!(stopped["end"], "stopped_by_agent", "{stopped}");
    let list = home.json(&["list", "--all"]);
    let notices = home.json(&["notices", "--peek"]);
    // The notice of the job that ended was delivered by the `wait` that showed it.
    assert_eq!(notices["notices"].as_array().unwrap().len(), 0, "{notices}");
    assert_eq!(list["items"].as_array().unwrap().len(), 3, "{list}");
}

#[test]
fn issue14_slurm_daemon_killed_with_ten_jobs_reconciles_all_and_submits_none_twice() {
    let Some(conf) =
        cluster("issue14_slurm_daemon_killed_with_ten_jobs_reconciles_all_and_submits_none_twice")
    else {
        return;
    };
    let home = home(&conf);
    let go = home.path().join("go");
    let wait_go = format!("while [ ! -e '{}' ]; do sleep 0.05; done", go.display());
    let queued: Vec<Value> = (0..3)
        .map(|i| start(&home, &["--partition", "held"], &format!("echo queued-{i}")))
        .collect();
    let running: Vec<Value> = (0..4)
        .map(|i| start(&home, &[], &format!("echo running-{i}; sleep 300")))
        .collect();
    let ending: Vec<Value> = (0..3)
        .map(|i| {
            start(
                &home,
                &["--notify"],
                &format!("echo ending-{i}; {wait_go}; exit {}", 10 + i),
            )
        })
        .collect();
    for item in running.iter().chain(&ending) {
        eventually(Duration::from_secs(60), || {
            state(&home, &id_of(item)) == "running"
        });
    }
    home.kill_daemon();
    std::fs::write(&go, b"").unwrap();
    // The three end while no daemon runs.
    let folders: Vec<PathBuf> = ending.iter().map(folder_of).collect();
    eventually(Duration::from_secs(60), || {
        folders.iter().all(|f| f.join("status").exists())
    });
    let list = home.json(&["list", "--all"]);
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 10, "{list}");
    let find = |v: &Value| items.iter().find(|i| i["id"] == v["id"]).unwrap().clone();
    for item in &queued {
        assert_eq!(find(item)["slurm_job_id"], item["slurm_job_id"], "{list}");
    }
    for item in &running {
        assert_eq!(find(item)["state"], "running", "{list}");
    }
    let notices = home.json(&["notices", "--wait", "30"]);
    let mut told: Vec<Value> = notices["notices"].as_array().unwrap().clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while told.len() < 3 && std::time::Instant::now() < deadline {
        let more = home.json(&["notices", "--wait", "5"]);
        told.extend(more["notices"].as_array().unwrap().iter().cloned());
    }
    assert_eq!(told.len(), 3, "one notice per end: {told:?}");
    for (i, item) in ending.iter().enumerate() {
        let ended = home.item(&id_of(item));
        assert_eq!(ended["end"], "failed", "{ended}");
        assert_eq!(ended["exit_code"], 10 + i as i64, "{ended}");
        assert!(told.iter().any(|n| n["item"] == item["id"]), "{told:?}");
    }
    // Each is one Slurm job under its own name: none was submitted again.
    for item in queued.iter().chain(&running).chain(&ending) {
        let name = slurm(
            &conf,
            &["squeue", "-h", "-t", "all", "-j", &job_of(item), "-o", "%j"],
        );
        let same = slurm(
            &conf,
            &["squeue", "-h", "-t", "all", "-n", name.trim(), "-o", "%i"],
        );
        assert_eq!(same.split_whitespace().count(), 1, "{name}: {same}");
    }
    // The queued ones lost their environment with the daemon: off the queue, saying so.
    for item in &queued {
        let gone = wait_end(&home, &id_of(item), 30);
        assert_gone_with_the_daemon(&conf, &gone);
    }
    for item in &running {
        let stopped = home.json(&["stop", &id_of(item)]);
        assert_eq!(stopped["end"], "stopped_by_agent", "{stopped}");
    }
}

#[test]
fn issue14_slurm_send_to_a_queued_job_is_refused_until_it_runs() {
    let Some(conf) = cluster("issue14_slurm_send_to_a_queued_job_is_refused_until_it_runs") else {
        return;
    };
    let home = home(&conf);
    let item = start(
        &home,
        &["--partition", "held"],
        "read -r line; echo \"got:$line\"",
    );
    let id = id_of(&item);
    let (code, error, message) = home.error(&["send", &id, "hello\\n"]);
    assert_eq!(code, 1, "{message}");
    assert!(!error.is_empty(), "{message}");
    assert!(message.contains("queue"), "{message}");
    release(&conf, &job_of(&item));
    eventually(Duration::from_secs(60), || state(&home, &id) == "running");
    home.json(&["send", &id, "hello\\n"]);
    let ended = wait_end(&home, &id, 60);
    assert_eq!(ended["end"], "succeeded", "{ended}");
    assert_eq!(home.json(&["read", &id, "--all"])["output"], "got:hello\n");
}

#[test]
fn issue14_slurm_jobs_that_end_at_once_all_end() {
    let Some(conf) = cluster("issue14_slurm_jobs_that_end_at_once_all_end") else {
        return;
    };
    // A supervisor under Slurm read its spec through a helper thread that did not block
    // SIGCHLD: a job that ended while that thread lived could have its end lost, and
    // its supervisor waited until stopped.
    let home = home(&conf);
    let ids: Vec<String> = (0..30)
        .map(|i| {
            start(&home, &[], &format!("exit {}", i % 3))["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    for (i, id) in ids.iter().enumerate() {
        let ended = wait_end(&home, id, 60);
        assert_eq!(ended["exit_code"], (i % 3) as i64, "{ended}");
    }
}

/// Every file under `dir` (following no link) whose bytes hold one of `values`.
fn files_holding(dir: &std::path::Path, values: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            found.extend(files_holding(&path, values));
        } else if kind.is_file() {
            let bytes = std::fs::read(&path).unwrap_or_default();
            for value in values {
                if bytes.windows(value.len()).any(|w| w == value.as_bytes()) {
                    found.push(format!("{} holds {value}", path.display()));
                }
            }
        }
    }
    found
}

/// Slurm's saved files of one job (`StateSaveLocation/hash.N/job.ID/`: its script and
/// `environment`).
fn slurm_state_of(conf: &str, job: &str) -> PathBuf {
    let state = std::path::Path::new(conf).parent().unwrap().join("state");
    let n: u64 = job.parse().unwrap();
    state
        .join(format!("hash.{}", n % 10))
        .join(format!("job.{job}"))
}

#[test]
fn issue22_6_slurm_no_file_holds_a_value_and_slurm_saves_none_of_the_callers() {
    let Some(conf) =
        cluster("issue22_6_slurm_no_file_holds_a_value_and_slurm_saves_none_of_the_callers")
    else {
        return;
    };
    // The daemon is started by this caller: the inherited value is in its environment
    // too, which sbatch used to run with.
    let home = home(&conf)
        .with("CALLER_INHERITED", "inherited-value-5678")
        .with("TOKEN", "secret-value-3456");
    home.start_daemon();
    let item = start(
        &home,
        &[
            "--partition",
            "held",
            "--env",
            "API_KEY=env-value-9012",
            "--secret",
            "TOKEN",
        ],
        // Checked by pieces: no value is in the command, which its record keeps.
        "case \"$API_KEY\" in env-*-9012) echo api-ok;; esac; \
         case \"$CALLER_INHERITED\" in inherited-*-5678) echo inherited-ok;; esac; \
         case \"$TOKEN\" in secret-*-3456) echo secret-ok;; esac; echo \"token=$TOKEN\"",
    );
    let id = id_of(&item);
    let job = job_of(&item);
    let values = [
        "inherited-value-5678",
        "secret-value-3456",
        "env-value-9012",
    ];
    // Queued: Slurm has saved the job, and the spec waits in the shared folder.
    let saved = slurm_state_of(&conf, &job);
    eventually(Duration::from_secs(20), || {
        saved.join("environment").exists()
    });
    let folder = folder_of(&item);
    assert!(folder.join("spec.json").exists());
    let held = files_holding(&saved, &values);
    assert!(held.is_empty(), "Slurm saved a caller's value: {held:?}");
    let environment = std::fs::read(saved.join("environment")).unwrap();
    let names: Vec<String> = environment
        .split(|b| *b == 0)
        .filter_map(|v| std::str::from_utf8(v).ok())
        .filter_map(|v| v.split_once('=').map(|(n, _)| n.to_string()))
        .filter(|n| !n.starts_with("SLURM_"))
        .collect();
    assert!(
        names.iter().all(|n| n == "PATH"),
        "sbatch ran with more than bgwork chose: {names:?}"
    );
    let held = files_holding(home.path(), &values);
    assert!(held.is_empty(), "a file holds a value in clear: {held:?}");
    // Let it run: the values reach the job all the same, and no file holds them after.
    release(&conf, &job);
    let ended = wait_end(&home, &id, 60);
    assert_eq!(ended["end"], "succeeded", "{ended}");
    assert_eq!(
        home.json(&["read", &id, "--all"])["output"],
        "api-ok\ninherited-ok\nsecret-ok\ntoken=[secret TOKEN]\n"
    );
    let held = files_holding(home.path(), &values);
    assert!(held.is_empty(), "a file holds a value in clear: {held:?}");
    let left: Vec<_> = std::fs::read_dir(&folder)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("handover") || n == "spec.json")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn issue22_6_slurm_job_queued_when_the_daemon_died_ends_saying_why() {
    let Some(conf) = cluster("issue22_6_slurm_job_queued_when_the_daemon_died_ends_saying_why")
    else {
        return;
    };
    let home = home(&conf);
    let item = start(&home, &["--partition", "held", "--notify"], "echo ran");
    let id = id_of(&item);
    home.kill_daemon();
    // A new daemon takes it back, without its values: off the queue, saying so.
    let ended = wait_end(&home, &id, 30);
    assert_gone_with_the_daemon(&conf, &ended);
    assert_eq!(home.json(&["read", &id, "--all"])["output"], "");
    let job = &job_of(&item);
    let shown = slurm(&conf, &["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"]);
    assert_eq!(shown.trim(), "CANCELLED", "{shown}");
}

#[test]
fn issue22_6_slurm_job_that_starts_while_no_daemon_runs_ends_saying_why() {
    let Some(conf) =
        cluster("issue22_6_slurm_job_that_starts_while_no_daemon_runs_ends_saying_why")
    else {
        return;
    };
    let home = home(&conf);
    let item = start(&home, &["--partition", "held"], "echo ran");
    let id = id_of(&item);
    let job = job_of(&item);
    let folder = folder_of(&item);
    home.kill_daemon();
    release(&conf, &job);
    // Its supervisor runs and asks for the job's values; nobody has them.
    eventually(Duration::from_secs(30), || {
        folder.join("handover-key.json").exists()
    });
    let ended = wait_end(&home, &id, 30);
    assert_eq!(ended["end"], "spawn_failed", "{ended}");
    let why = ended["lost_reason"].as_str().unwrap_or_default();
    assert!(why.contains("start it again"), "{ended}");
    assert_eq!(home.json(&["read", &id, "--all"])["output"], "");
}

#[test]
fn issue22_7_slurm_job_sees_slurms_own_variables_beside_the_callers() {
    let Some(conf) = cluster("issue22_7_slurm_job_sees_slurms_own_variables_beside_the_callers")
    else {
        return;
    };
    // A caller inside an allocation of its own: its SLURM_JOB_ID is not this job's.
    let home = home(&conf).with("SLURM_JOB_ID", "999");
    let cwd = tempfile::tempdir().unwrap();
    let cwd_text = cwd.path().display().to_string();
    let item = start(
        &home,
        &[
            "--cwd",
            &cwd_text,
            "--env",
            "ENVIRONMENT=mine",
            "--cpus",
            "2",
        ],
        "echo id=$SLURM_JOB_ID; echo nodes=$SLURM_JOB_NODELIST; echo cpus=$SLURM_CPUS_ON_NODE; \
         echo submit=$SLURM_SUBMIT_DIR; echo environment=$ENVIRONMENT; \
         echo prolog=$BGWORK_TEST_PROLOG",
    );
    let id = id_of(&item);
    let job = job_of(&item);
    let ended = wait_end(&home, &id, 60);
    assert_eq!(ended["end"], "succeeded", "{ended}");
    let output = home.json(&["read", &id, "--all"])["output"]
        .as_str()
        .unwrap()
        .to_string();
    let lines: Vec<&str> = output.lines().collect();
    assert_eq!(lines[0], format!("id={job}"), "{output}");
    let node = slurm(
        &conf,
        &["squeue", "-h", "-t", "all", "-j", &job, "-o", "%N"],
    );
    assert_eq!(lines[1], format!("nodes={}", node.trim()), "{output}");
    assert_eq!(lines[2], "cpus=2", "{output}");
    assert_eq!(lines[3], format!("submit={cwd_text}"), "{output}");
    // A name both set that is not Slurm's own of this job: the caller's.
    assert_eq!(lines[4], "environment=mine", "{output}");
    // What the site's task prolog exports (scripts/slurm-cluster sets one).
    assert_eq!(lines[5], format!("prolog=prolog-of-{job}"), "{output}");
}

#[test]
fn issue22_8_sbatch_arg_abbreviated_and_grouped_forms_are_refused() {
    // Needs no cluster: each form is refused before anything is submitted.
    let home = Home::new();
    for (arg, own) in [
        ("--job=evil", "--job-name"),
        ("-vJevil2", "--job-name"),
        ("--arr=0-2", "--array"),
        ("-a0-2", "--array"),
        ("--outp=/tmp/x", "--output"),
        ("--exp=ALL", "--export"),
        ("-vW", "--wait"),
    ] {
        let flag = format!("--sbatch-arg={arg}");
        let (_, code, message) = home.error(&["start", "--on", "slurm", &flag, "--", "true"]);
        assert_eq!(code, "bad_request", "{arg}");
        assert!(message.contains(arg), "{arg}: {message}");
        assert!(
            message.contains(&format!("sets {own} itself"))
                || message.contains(&format!("does not take {own}:"))
                || message.contains("ambiguous"),
            "{arg}: {message}"
        );
    }
    let (_, _, message) = home.error(&["start", "--on", "slurm", "--sbatch-arg=-J", "--", "true"]);
    assert!(message.contains("in the same argument"), "{message}");
}

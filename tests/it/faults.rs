//! Faults: broken status files, foreign supervisors, deleted logs, a full disk, stale
//! pids, and leaks under load.

use crate::util::{alive, eventually, processes_of, Home};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::time::Duration;

/// Starts a job, then kills the daemon and the job's supervisor (and so the job): the
/// record stays `running` with nobody behind it.
fn orphaned_record(home: &Home) -> (String, std::path::PathBuf) {
    let id = home.start("exec sleep 1000");
    let pid = home.item(&id)["pid"].as_i64().unwrap() as i32;
    let supervisor = parent_of(pid);
    home.kill_daemon();
    kill9(supervisor);
    eventually(Duration::from_secs(10), || {
        !alive(pid) && !alive(supervisor)
    });
    (id, home.path().join("jobs/1"))
}

#[test]
fn a_corrupt_status_file_settles_as_lost_with_the_reason() {
    let home = Home::new();
    let (id, job_dir) = orphaned_record(&home);
    std::fs::write(job_dir.join("status"), b"{\"protocol\":1,\"exit_co").unwrap();
    let item = home.item(&id);
    assert_eq!(item["end"], "lost");
    assert_eq!(item["exit_code"], serde_json::Value::Null);
    assert!(
        item["lost_reason"]
            .as_str()
            .unwrap()
            .contains("status file"),
        "{item}"
    );
}

#[test]
fn a_supervisor_of_another_protocol_is_refused_with_a_clear_reason() {
    let home = Home::new();
    let (id, job_dir) = orphaned_record(&home);
    let socket = job_dir.join("control.sock");
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket).unwrap();
    let fake = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut line = String::new();
        BufReader::new(&stream).read_line(&mut line).unwrap();
        let hello = "{\"ev\":\"hello\",\"protocol\":99,\"pid\":1,\"log_len\":0,\"dropped\":0,\"status\":null}\n";
        (&stream).write_all(hello.as_bytes()).unwrap();
        line
    });
    let item = home.item(&id);
    assert!(fake.join().unwrap().contains("hello"));
    assert_eq!(item["end"], "lost");
    let reason = item["lost_reason"].as_str().unwrap();
    assert!(reason.contains("protocol 99"), "{reason}");
}

#[test]
fn a_deleted_log_reads_as_empty_and_the_daemon_serves_on() {
    let home = Home::new();
    let id = home.start("echo hello");
    home.wait_end(&id);
    std::fs::remove_file(home.path().join("jobs/1/output.log")).unwrap();
    let read = home.json(&["read", &id, "--all"]);
    assert_eq!(read["output"], "");
    assert_eq!(read["running"], false);
    assert_eq!(home.json(&["wait", &id])["reason"], "ended");
}

#[test]
fn case20_a_stale_pid_in_a_record_never_signals_an_unrelated_process() {
    let home = Home::new();
    let (id, _) = orphaned_record(&home);
    let mut bystander = std::process::Command::new("sleep")
        .arg("1000")
        .spawn()
        .unwrap();
    let db = home.path().join("work.db");
    let mut store = bgwork::store::Store::open(&db, 0).unwrap();
    store.set_running(1, bystander.id() as i32).unwrap();
    drop(store);
    assert_eq!(home.item(&id)["end"], "lost");
    let reply = home.json(&["stop", &id]);
    assert_eq!(reply["end"], "lost");
    assert!(
        alive(bystander.id() as i32),
        "the bystander with the stale pid lives"
    );
    bystander.kill().unwrap();
    bystander.wait().unwrap();
}

#[test]
fn case18_a_full_disk_is_survived_and_recovered_from() {
    let home = Home::new().with("BGWORK_LOG_CAP", &(64 << 20).to_string());
    let Some(_disk) = crate::util::small_disk(&home) else {
        return;
    };
    // Not waited for while it starts: the disk may be full before its start is recorded
    // (it is recorded once space is freed, below).
    let started = home.json(&[
        "start",
        "--window",
        "0",
        "--",
        "echo start; head -c 8M /dev/zero | tr '\\0' x; echo; echo done",
    ]);
    let id = started["id"].as_str().unwrap().to_string();
    let log = home.path().join("jobs/1/output.log");
    eventually(Duration::from_secs(20), || {
        let list = home.run(&["--json", "list", "--all"]);
        assert_eq!(
            list.code, 0,
            "the daemon serves while the disk is full: {}",
            list.stderr
        );
        list.json()["items"][0]["state"] == "ended" || {
            // Free the space the output took, so that the job's end can be recorded.
            let _ = std::fs::OpenOptions::new()
                .write(true)
                .open(&log)
                .and_then(|f| f.set_len(0));
            false
        }
    });
    let item = home.item(&id);
    assert_eq!(
        item["end"], "succeeded",
        "the job itself was not harmed: {item}"
    );
    // The job's last bytes may have filled the disk again after the last truncation
    // above: space is freed once more, now that nothing writes, before work goes on.
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .and_then(|f| f.set_len(0));
    let after = home.start("echo after");
    assert_eq!(
        home.wait_end(&after)["end"],
        "succeeded",
        "the daemon works on"
    );
    home.json(&["shutdown", "--stop-work"]);
}

#[test]
fn case19_many_jobs_leak_no_descriptor_thread_or_process() {
    let home = Home::new().with("BGWORK_MAX_RUNNING", "500");
    home.wait_end(&home.start("true"));
    let daemon = home.daemon_pid();
    let count = |what: &str| {
        std::fs::read_dir(format!("/proc/{daemon}/{what}"))
            .unwrap()
            .count()
    };
    let (fds, threads) = (count("fd"), count("task"));
    let at_once: Vec<String> = (0..100).map(|_| home.start("sleep 0.3")).collect();
    for _ in 0..200 {
        home.start("true");
    }
    for id in &at_once {
        home.wait_end(id);
    }
    eventually(Duration::from_secs(30), || {
        home.json(&["list"])["items"] == serde_json::json!([])
    });
    eventually(Duration::from_secs(10), || {
        processes_of(home.path()).into_iter().all(|p| p == daemon)
    });
    eventually(Duration::from_secs(10), || count("fd") <= fds);
    assert!(
        count("task") <= threads + 2,
        "threads {threads} -> {}",
        count("task")
    );
    let zombies = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let after = stat.rsplit(')').next().unwrap_or("");
            let mut fields = after.split_whitespace();
            fields.next() == Some("Z") && fields.next() == Some(daemon.to_string().as_str())
        })
        .count();
    assert_eq!(zombies, 0, "every supervisor was reaped");
}

fn kill9(pid: i32) {
    std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
}

pub fn parent_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split(' ').nth(1).unwrap().parse().unwrap()
}

#[test]
fn issue26_v5_a_daemon_whose_home_is_removed_ends_with_its_work() {
    let home = Home::new();
    let id = home.start("sleep 300");
    let job = home.item(&id)["pid"].as_i64().unwrap() as i32;
    let daemon = home.daemon_pid();
    let before = processes_of(home.path());
    assert!(before.len() >= 2, "{before:?}");
    // A new home made at once at the same path, with a daemon of its own.
    remake_home(&home);
    let new = home.start("sleep 60");
    eventually(Duration::from_secs(30), || {
        !alive(daemon) && !alive(job) && before.iter().all(|&pid| !alive(pid))
    });
    // The old daemon left the new one's socket alone: the new home still answers.
    let listed = home.run(&["--json", "list"]);
    assert_eq!(listed.code, 0, "{}{}", listed.stdout, listed.stderr);
    assert_eq!(home.item(&new)["state"], "running");
}

#[test]
fn issue26_v7_a_supervisor_whose_home_was_removed_never_writes_into_a_new_one() {
    let home = Home::new();
    let gate = crate::util::Gate::new();
    // Ends (exit 7) once the gate opens; waits out a long back-off first when it fails.
    let old = home.start_with(&["--notify"], &gate.after_go("echo old-done; exit 7"));
    let waiter = home.start_with(&["--restart", "on-failure", "--backoff", "60s"], "exit 1");
    eventually(Duration::from_secs(20), || {
        home.item(&waiter)["state"] == "restarting"
    });
    let supervisors = crate::util::supervisors_of(home.daemon_pid());
    home.json(&["shutdown"]);
    // The home is removed while its work goes on, and a new one made in its place.
    remake_home(&home);
    let new = home.start_with(&["--notify"], "sleep 60; echo new-done");
    assert_eq!(new, old, "the new home gives the same id and folder");
    gate.open();
    // The old supervisors end (the back-off one too), writing nothing in the new folder.
    eventually(Duration::from_secs(30), || {
        supervisors.iter().all(|&pid| !alive(pid))
    });
    let item = home.item(&new);
    assert_eq!(item["state"], "running", "{item}");
    let folder = std::path::PathBuf::from(item["folder"].as_str().unwrap());
    assert!(
        !folder.join("status").exists() || {
            let status = std::fs::read_to_string(folder.join("status")).unwrap();
            !status.contains("\"exit_code\":7")
        }
    );
    // The new item still answers: it is stopped as asked.
    let stopped = home.run(&["stop", &new]);
    assert_eq!(stopped.code, 0, "{}{}", stopped.stdout, stopped.stderr);
    let log = std::fs::read_to_string(home.path().join("daemon.log")).unwrap_or_default();
    assert!(!log.contains("holds the status of"), "{log}");
}

#[test]
fn issue26_v9_a_run_whose_daemon_is_killed_names_the_job_that_goes_on() {
    let home = Home::new();
    let child = home
        .command(&["run", "--", "echo started; sleep 30"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut id = String::new();
    eventually(Duration::from_secs(20), || {
        let listed = home.json(&["list"]);
        id = listed["items"][0]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        listed["items"][0]["state"] == "running"
    });
    home.kill_daemon();
    let out = crate::util::finish_within(child, Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("during the run of {id}, which goes on"))
            && stderr.contains(&format!("bgwork wait {id}")),
        "{stderr}"
    );
    // It does: a new daemon took it back.
    assert_eq!(home.item(&id)["state"], "running");
    home.run(&["stop", &id]);
}

#[test]
fn issue26_v12_a_job_whose_folder_is_removed_ends_saying_why() {
    let home = Home::new();
    let plain = home.start_with(&["--notify"], "sleep 600");
    let policy = home.start_with(&["--restart", "on-failure"], "sleep 600");
    for id in [&plain, &policy] {
        let folder = home.item(id)["folder"].as_str().unwrap().to_string();
        std::fs::remove_dir_all(&folder).unwrap();
    }
    for id in [&plain, &policy] {
        let ended = home.wait_end(id);
        let report = ended["report"].as_str().unwrap_or_default();
        assert!(
            report.contains("was removed or replaced, so bgwork ended it"),
            "{report}"
        );
        assert!(!report.contains("while it waited"), "{report}");
    }
}

#[test]
fn issue26_v13_an_mcp_run_whose_daemon_is_killed_names_the_job_that_goes_on() {
    let home = Home::new();
    let mut mcp = crate::mcp::Mcp::start(&home);
    let call = std::thread::spawn(move || {
        let answer = mcp.call("run", serde_json::json!({"command": "echo hi; sleep 30"}));
        (answer, mcp)
    });
    let mut id = String::new();
    eventually(Duration::from_secs(20), || {
        let listed = home.json(&["list", "--all-sessions"]);
        id = listed["items"][0]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        listed["items"][0]["state"] == "running"
    });
    home.kill_daemon();
    let ((error, answer), _mcp) = call.join().unwrap();
    assert!(error, "{answer}");
    let text = answer.to_string();
    assert!(
        text.contains("during the run of") && text.contains("which goes on"),
        "{text}"
    );
    assert!(text.contains(&id), "{text}");
}

/// Removes the home with everything in it and makes an empty one at the same path.
fn remake_home(home: &Home) {
    std::fs::remove_dir_all(home.path()).unwrap();
    std::fs::create_dir(home.path()).unwrap();
    std::fs::set_permissions(
        home.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
}

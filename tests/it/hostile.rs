//! Findings of hostile testing (issue 10), each driven through the real binary the way it
//! was found: no command in the wrong folder, no invented end, no reused folder or
//! notice id, nothing of a job left behind, no output lost in silence.

use crate::util::{alive, eventually, Home, BIN};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Sends one request line on the socket and returns the reply.
pub(crate) fn raw(home: &Home, request: &Value) -> Value {
    home.start_daemon();
    let mut stream = UnixStream::connect(home.socket()).unwrap();
    let mut line = serde_json::to_vec(request).unwrap();
    line.push(b'\n');
    stream.write_all(&line).unwrap();
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply).unwrap();
    serde_json::from_str(&reply).unwrap_or_else(|e| panic!("{e}: {reply}"))
}

fn output_of(home: &Home, dir: &Path, args: &[&str]) -> String {
    let out = home.command(args).current_dir(dir).output().unwrap();
    assert!(out.status.success(), "{args:?}: {out:?}");
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    reply["output"].as_str().unwrap_or_default().to_string()
}

#[test]
fn issue10_1_a_relative_cwd_is_the_callers_folder_never_the_daemons() {
    let home = Home::new();
    let project = tempfile::tempdir_in("/tmp").unwrap();
    let project_path = project.path().canonicalize().unwrap();
    std::fs::create_dir(project_path.join("sub")).unwrap();
    let start = |cwd: Option<&str>| {
        let mut args = vec!["--json", "start", "--window", "5000"];
        if let Some(cwd) = cwd {
            args.extend(["--cwd", cwd]);
        }
        args.extend(["--", "pwd"]);
        output_of(&home, &project_path, &args)
    };
    let here = format!("{}\n", project_path.display());
    assert_eq!(start(Some(".")), here, "--cwd . is the caller's folder");
    assert_eq!(start(None), here, "no --cwd is the caller's folder");
    assert_eq!(
        start(Some("sub")),
        format!("{}/sub\n", project_path.display())
    );
    let before = home.json(&["list", "--all"])["items"]
        .as_array()
        .unwrap()
        .len();
    let reply = raw(
        &home,
        &json!({"session": "test", "op": "start", "command": "pwd", "cwd": "etc"}),
    );
    assert_eq!(reply["error"]["code"], "bad_request", "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("absolute"),
        "{reply}"
    );
    let after = home.json(&["list", "--all"])["items"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(before, after, "a refused start leaves no record");
}

#[test]
fn issue10_2_a_large_send_reaches_a_live_job_and_is_never_a_death() {
    let home = Home::new();
    let id = home.start("wc -c");
    let big = "a".repeat(400_000);
    let reply = raw(
        &home,
        &json!({"session": "test", "op": "send", "id": id, "text": big}),
    );
    assert_eq!(reply["ok"], true, "{reply}");
    let senders: Vec<_> = (0..12)
        .map(|_| {
            let socket = home.socket();
            let id = id.clone();
            std::thread::spawn(move || {
                let mut stream = UnixStream::connect(socket).unwrap();
                let request =
                    json!({"session": "test", "op": "send", "id": id, "text": "b".repeat(130_000)});
                let mut line = serde_json::to_vec(&request).unwrap();
                line.push(b'\n');
                stream.write_all(&line).unwrap();
                let mut reply = String::new();
                BufReader::new(stream).read_line(&mut reply).unwrap();
                serde_json::from_str::<Value>(&reply).unwrap()
            })
        })
        .collect();
    for sender in senders {
        let reply = sender.join().unwrap();
        assert_eq!(reply["ok"], true, "{reply}");
    }
    let item = home.item(&id);
    assert_eq!(item["state"], "running", "the job lives: {item}");
    home.json(&["send", &id, "", "--key", "C-d"]);
    let end = home.wait_end(&id);
    assert_eq!(end["end"], "succeeded", "{end}");
    let out = home.json(&["read", &id, "--all"]);
    assert_eq!(
        out["output"].as_str().unwrap().trim(),
        (400_000 + 12 * 130_000).to_string(),
        "every byte reached the job"
    );
}

#[test]
fn issue10_2_input_a_job_does_not_read_is_refused_plainly_and_the_job_lives() {
    let home = Home::new();
    let id = home.start("sleep 60");
    let mut refused = None;
    for _ in 0..40 {
        let reply = raw(
            &home,
            &json!({"session": "test", "op": "send", "id": id, "text": "z".repeat(900_000)}),
        );
        if reply.get("error").is_some() {
            refused = Some(reply);
            break;
        }
    }
    let refused = refused.expect("input past the bound is refused");
    // A bound (`limit`), not a refusal for good: the same input may be sent again.
    assert_eq!(refused["error"]["code"], "limit", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not reading its input"),
        "{refused}"
    );
    assert_eq!(home.item(&id)["state"], "running");
}

#[test]
fn issue10_3_a_paused_daemon_does_not_invent_spawn_failed() {
    let home = Home::new();
    let reply = home.json(&["start", "--window", "0", "--", "sleep 40"]);
    let id = reply["id"].as_str().unwrap().to_string();
    let daemon = home.daemon_pid();
    Command::new("kill")
        .args(["-STOP", &daemon.to_string()])
        .status()
        .unwrap();
    // The pause itself is the fault: longer than any launch deadline the daemon had.
    std::thread::sleep(Duration::from_millis(10_500));
    Command::new("kill")
        .args(["-CONT", &daemon.to_string()])
        .status()
        .unwrap();
    eventually(Duration::from_secs(20), || {
        home.item(&id)["state"] != "starting"
    });
    let item = home.item(&id);
    assert_eq!(item["state"], "running", "{item}");
    assert!(alive(item["pid"].as_i64().unwrap() as i32));
    let stopped = home.json(&["stop", &id, "--grace", "1"]);
    assert_eq!(stopped["end"], "stopped_by_agent", "{stopped}");
}

fn remove_database(home: &Home) {
    for name in ["work.db", "work.db-wal", "work.db-shm"] {
        let _ = std::fs::remove_file(home.path().join(name));
    }
}

fn supervisor_of(home: &Home, id: &str) -> i32 {
    let log = home.item(id)["log_path"].as_str().unwrap().to_string();
    let dir = Path::new(&log).parent().unwrap().to_path_buf();
    std::fs::read_to_string(dir.join("supervisor.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn issue10_4_a_lost_database_reuses_no_folder_and_invents_no_exit_code() {
    let home = Home::new();
    let first = home.start("exit 1");
    assert_eq!(home.wait_end(&first)["end"], "failed");
    let first_log = home.item(&first)["log_path"].as_str().unwrap().to_string();
    let daemon = home.daemon_pid();
    home.json(&["shutdown"]);
    eventually(Duration::from_secs(10), || !alive(daemon));
    remove_database(&home);
    let second = home.start("sleep 100");
    assert_ne!(second, first, "an id is never given twice in a home");
    let second_log = home.item(&second)["log_path"].as_str().unwrap().to_string();
    assert_ne!(
        Path::new(&second_log).parent(),
        Path::new(&first_log).parent(),
        "a job folder is never used twice"
    );
    Command::new("kill")
        .args(["-9", &supervisor_of(&home, &second).to_string()])
        .status()
        .unwrap();
    let end = home.wait_end(&second);
    assert_eq!(end["end"], "lost", "{end}");
    assert_eq!(end["exit_code"], Value::Null, "no invented code: {end}");
}

#[test]
fn issue10_4_running_work_is_taken_back_after_a_lost_database() {
    let home = Home::new();
    let id = home.start_with(&["--notify"], "echo hello; read x; exit 3");
    home.json(&["wait", &id, "--until", "hello", "--timeout", "20"]);
    home.kill_daemon();
    remove_database(&home);
    let item = home.item(&id);
    assert_eq!(item["state"], "running", "taken back: {item}");
    let log = std::fs::read_to_string(home.path().join("daemon.log")).unwrap();
    assert!(log.contains("took them back"), "said loudly: {log}");
    let next = home.start("true");
    assert_ne!(
        next, id,
        "a new id does not collide with the taken-back one"
    );
    home.json(&["send", &id, r"\n"]);
    let notices = home.json(&["notices", "--wait", "20"]);
    let notices = notices["notices"].as_array().unwrap();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0]["exit_code"], 3);
    assert_eq!(home.item(&id)["end"], "failed");
}

#[test]
fn issue10_4_a_corrupt_database_is_refused_and_kept() {
    let home = Home::new();
    home.wait_end(&home.start("true"));
    let daemon = home.daemon_pid();
    home.json(&["shutdown"]);
    eventually(Duration::from_secs(10), || !alive(daemon));
    let db = home.path().join("work.db");
    let _ = std::fs::remove_file(home.path().join("work.db-wal"));
    let mut bytes = std::fs::read(&db).unwrap();
    assert!(bytes.len() >= 4096);
    // Everything past the 100-byte header turned to noise: the file opens as a
    // database, its content does not hold.
    for (i, byte) in bytes.iter_mut().enumerate().skip(100) {
        *byte = (i * 7 % 251) as u8;
    }
    std::fs::write(&db, &bytes).unwrap();
    let run = home.run(&["list"]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("integrity") && run.stderr.contains("work.db"),
        "says what is wrong and where: {}",
        run.stderr
    );
    assert_eq!(
        std::fs::read(&db).unwrap(),
        bytes,
        "the file is kept as it was"
    );
}

#[test]
fn issue10_5_gc_keeps_undelivered_notices_and_notice_ids_are_never_reused() {
    let home = Home::new().with("BGWORK_RETAIN_S", "0");
    let mut seen = std::collections::HashSet::new();
    for round in 0..3 {
        let id = home.start_with(&["--notify"], &format!("exit {}", round + 1));
        eventually(Duration::from_secs(20), || {
            home.item(&id)["state"] == "ended"
        });
        home.json(&["gc"]);
        let notices = home.json(&["notices"]);
        let notices = notices["notices"].as_array().unwrap();
        assert_eq!(
            notices.len(),
            1,
            "gc kept the undelivered notice: {notices:?}"
        );
        assert_eq!(notices[0]["item"], id.as_str());
        let notice_id = notices[0]["id"].as_str().unwrap().to_string();
        assert!(seen.insert(notice_id.clone()), "{notice_id} given twice");
        home.json(&["gc"]);
    }
}

/// Pids of processes whose command line is exactly `args`.
fn pids_running(args: &[&str]) -> Vec<i32> {
    let wanted: Vec<u8> = args
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default() == wanted
                && alive(*pid)
        })
        .collect()
}

fn leftovers_after_a_supervisor_kill(home: &Home) -> (Vec<i32>, Vec<i32>) {
    // Numbers unique to this run, so that only this test's processes are looked at.
    let tag = format!(
        "{}.{}",
        5000 + std::process::id() % 1000,
        home.path().to_str().unwrap().len()
    );
    let names: Vec<String> = (1..=3).map(|n| format!("{n}{tag}")).collect();
    let command = format!(
        "env -i /bin/sleep {} & setsid env -i /bin/sleep {} & /bin/sleep {} & wait",
        names[0], names[1], names[2]
    );
    let id = home.start(&command);
    let mut pids = vec![];
    eventually(Duration::from_secs(10), || {
        pids = names
            .iter()
            .flat_map(|n| pids_running(&["/bin/sleep", n]))
            .collect();
        pids.len() == 3
    });
    Command::new("kill")
        .args(["-9", &supervisor_of(home, &id).to_string()])
        .status()
        .unwrap();
    let end = home.wait_end(&id);
    assert_eq!(end["end"], "lost", "{end}");
    let escaped = pids_running(&["/bin/sleep", &names[1]]);
    (pids, escaped)
}

#[test]
fn issue10_7_leftovers_of_a_killed_supervisor_are_swept_whole() {
    let home = Home::new();
    let (pids, _) = leftovers_after_a_supervisor_kill(&home);
    eventually(Duration::from_secs(10), || pids.iter().all(|&p| !alive(p)));
}

#[test]
fn issue10_7_without_a_cgroup_the_group_and_session_are_swept() {
    let home = Home::new().with("BGWORK_CGROUPS", "0");
    let (pids, escaped) = leftovers_after_a_supervisor_kill(&home);
    // The known limit: a process that left the job's session and cleared its
    // environment, with no cgroup to hold it, is out of reach.
    eventually(Duration::from_secs(10), || {
        pids.iter().all(|&p| !alive(p) || escaped.contains(&p))
    });
    for pid in escaped {
        let _ = Command::new("kill").arg(pid.to_string()).status();
    }
}

#[test]
fn issue10_9_output_lost_to_a_full_disk_is_counted_and_said() {
    let home = Home::new().with("BGWORK_LOG_CAP", &(64 << 20).to_string());
    let Some(_disk) = crate::util::small_disk(&home) else {
        return;
    };
    home.start_daemon();
    // Ballast that fills the disk now and frees it once the job has gone.
    let ballast = home.path().join("ballast");
    let df = Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(home.path())
        .output()
        .unwrap();
    let available: usize = String::from_utf8_lossy(&df.stdout)
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap();
    // Room for the job's record and half a MiB of its output, no more.
    std::fs::write(&ballast, vec![1u8; available.saturating_sub(640 << 10)]).unwrap();
    let id = home.start_with(
        &["--notify"],
        "echo start; head -c 2M /dev/zero | tr '\\0' x; echo; echo done",
    );
    let pid = home.item(&id)["pid"].as_i64().unwrap() as i32;
    eventually(Duration::from_secs(20), || !alive(pid));
    std::fs::remove_file(&ballast).unwrap();
    eventually(Duration::from_secs(30), || {
        home.item(&id)["state"] == "ended"
    });
    // Taken before the read, which shows the end and so delivers the notice.
    let notices = home.json(&["notices"]);
    assert!(
        notices["notices"][0]["text"]
            .as_str()
            .unwrap()
            .contains("disk full"),
        "{notices}"
    );
    let read = home.json(&["read", &id, "--all"]);
    assert!(read["dropped_bytes"].as_u64().unwrap() > 0, "{read}");
    assert!(
        read["output"]
            .as_str()
            .unwrap()
            .contains("could not be written: disk full"),
        "{read}"
    );
    let item = home.item(&id);
    assert!(
        item["report"].as_str().unwrap().contains("disk full"),
        "{item}"
    );
    let _ = BIN;
    home.json(&["shutdown", "--stop-work"]);
}

// Found by attacking the fixes above.

#[test]
fn a_daemon_started_inside_a_job_is_no_part_of_that_job() {
    let home = Home::new();
    let flag = home.path().join("go");
    let nested = home.start(&format!(
        "until [ -e {} ]; do sleep 0.05; done; {BIN} list >/dev/null 2>&1; exec sleep 300",
        flag.display()
    ));
    let first = home.daemon_pid();
    home.json(&["shutdown"]);
    eventually(Duration::from_secs(10), || !alive(first));
    std::fs::write(&flag, "").unwrap();
    // The job's own `bgwork list` starts the daemon that serves the home from now on.
    eventually(Duration::from_secs(20), || {
        std::fs::read_to_string(home.path().join("daemon.log"))
            .unwrap_or_default()
            .matches("serving")
            .count()
            >= 2
    });
    let daemon = home.daemon_pid();
    let other = home.start("exec sleep 301");
    let stopped = home.json(&["stop", &nested, "--grace", "1"]);
    assert_eq!(stopped["end"], "stopped_by_agent", "{stopped}");
    assert!(
        alive(daemon),
        "stopping the job left the daemon it started alive"
    );
    assert_eq!(home.daemon_pid(), daemon);
    assert_eq!(
        home.item(&other)["state"],
        "running",
        "other work untouched"
    );
}

#[test]
fn an_older_database_copied_back_does_not_block_new_work() {
    let home = Home::new();
    for _ in 0..2 {
        home.wait_end(&home.start("true"));
    }
    let daemon = home.daemon_pid();
    home.json(&["shutdown"]);
    eventually(Duration::from_secs(10), || !alive(daemon));
    let db = home.path().join("work.db");
    let saved = std::fs::read(&db).unwrap();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let id = home.start("true");
        home.wait_end(&id);
        ids.push(id);
    }
    let daemon = home.daemon_pid();
    home.json(&["shutdown"]);
    eventually(Duration::from_secs(10), || !alive(daemon));
    remove_database(&home);
    std::fs::write(&db, saved).unwrap();
    let next = home.start("true");
    assert!(!ids.contains(&next), "{next} was given before: {ids:?}");
    assert_eq!(home.wait_end(&next)["end"], "succeeded");
}

#[test]
fn a_refused_send_delivers_nothing_of_itself() {
    let home = Home::new();
    let flag = home.path().join("read-now");
    let out = home.path().join("received");
    let id = home.start(&format!(
        "until [ -e {} ]; do sleep 0.05; done; cat > {}",
        flag.display(),
        out.display()
    ));
    let mut taken = Vec::new();
    for letter in b'A'..=b'J' {
        let text = String::from(letter as char).repeat(900_000);
        let reply = raw(
            &home,
            &json!({"session": "test", "op": "send", "id": id, "text": text}),
        );
        if reply.get("error").is_none() {
            taken.push(text);
        }
    }
    assert!(taken.len() < 10, "the 8 MiB bound refused some");
    std::fs::write(&flag, "").unwrap();
    home.json(&["send", &id, "", "--key", "C-d"]);
    home.wait_end(&id);
    let received = std::fs::read_to_string(&out).unwrap();
    assert!(
        received == taken.concat(),
        "exactly the sends that were taken, whole and in order ({} bytes against {})",
        received.len(),
        taken.concat().len()
    );
}

#[test]
fn the_first_send_to_a_job_that_closed_its_stdin_says_so() {
    let home = Home::new();
    let id = home.start("exec 0<&-; exec sleep 30");
    let (_, code, message) = home.error(&["send", &id, "hello"]);
    assert_eq!(code, "no_input", "{message}");
}

#[test]
fn a_job_that_ends_on_a_full_disk_while_the_daemon_is_away_keeps_its_code() {
    let home = Home::new();
    let Some(_disk) = crate::util::small_disk(&home) else {
        return;
    };
    let flag = home.path().join("end-now");
    let id = home.start_with(
        &["--notify"],
        &format!(
            "until [ -e {} ]; do sleep 0.05; done; exit 5",
            flag.display()
        ),
    );
    let pid = home.item(&id)["pid"].as_i64().unwrap() as i32;
    let daemon = home.daemon_pid();
    home.json(&["shutdown"]);
    eventually(Duration::from_secs(10), || !alive(daemon));
    std::fs::write(&flag, "").unwrap();
    let ballast = home.path().join("ballast");
    let mut file = std::fs::File::create(&ballast).unwrap();
    while file.write_all(&[7u8; 64 << 10]).is_ok() {}
    drop(file);
    eventually(Duration::from_secs(20), || !alive(pid));
    std::fs::remove_file(&ballast).unwrap();
    let end = home.wait_end(&id);
    assert_eq!(end["end"], "failed", "{end}");
    assert_eq!(end["exit_code"], 5, "{end}");
    home.json(&["shutdown", "--stop-work"]);
}

#[test]
fn a_relative_home_is_the_callers_and_descriptors_are_not_inherited() {
    let base = tempfile::tempdir_in("/tmp").unwrap();
    let script = format!(
        "exec 7>{}/held; BGWORK_HOME=rel {BIN} list >/dev/null && BGWORK_HOME=rel {BIN} --json status",
        base.path().display()
    );
    let out = Command::new("bash")
        .args(["-c", &script])
        .current_dir(base.path())
        .env_remove("BGWORK_HOME")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    let home = base.path().join("rel");
    assert_eq!(status["home"], home.display().to_string(), "{status}");
    let daemon = status["pid"].as_i64().unwrap();
    let held = std::fs::read_link(format!("/proc/{daemon}/fd/7"))
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    assert!(
        !held.ends_with("/held"),
        "the daemon inherited fd 7: {held}"
    );
    let _ = Command::new(BIN)
        .args(["shutdown", "--stop-work"])
        .env("BGWORK_HOME", &home)
        .output();
}

// Found by attacking the merged whole.

/// The fault: 0.8 s after a call, the daemon is paused for 4 s, across both the end of
/// a 1.5 s job and a 3 s deadline.
fn pause_daemon_across_end_and_deadline(daemon: i32) {
    std::thread::sleep(Duration::from_millis(800));
    for (signal, then) in [("-STOP", 4000), ("-CONT", 0)] {
        Command::new("kill")
            .args([signal, &daemon.to_string()])
            .status()
            .unwrap();
        std::thread::sleep(Duration::from_millis(then));
    }
}

#[test]
fn a_deadline_never_wins_over_an_end_that_already_happened() {
    let home = Home::new();
    home.start_daemon();
    let daemon = home.daemon_pid();
    let run = home
        .command(&["run", "--timeout", "3", "--", "sleep 1.5; exit 5"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    pause_daemon_across_end_and_deadline(daemon);
    let out = run.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(5),
        "the end, not a promotion: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = home.start("sleep 1.5");
    let waiter = home
        .command(&["--json", "wait", &id, "--timeout", "3"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    pause_daemon_across_end_and_deadline(daemon);
    let out = waiter.wait_with_output().unwrap();
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["reason"], "ended", "{reply}");
}

#[test]
fn run_passes_the_commands_bytes_as_they_are_and_stops_when_its_reader_goes() {
    let home = Home::new();
    let data = home.path().join("data");
    let bytes: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&data, &bytes).unwrap();
    let out = home
        .command(&["run", "--", &format!("cat {}", data.display())])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(
        out.stdout == bytes,
        "byte-exact ({} of {} bytes)",
        out.stdout.len(),
        bytes.len()
    );
    let script = format!("'{BIN}' run --timeout 30 -- yes | head -n 2");
    let status = Command::new("bash")
        .args(["-c", &script])
        .env("BGWORK_HOME", home.path())
        .env("BGWORK_SESSION", &home.session)
        .status()
        .unwrap();
    assert!(status.success());
    let list = home.json(&["list", "--all"]);
    let yes = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["command"] == "yes")
        .cloned()
        .unwrap();
    let id = yes["id"].as_str().unwrap().to_string();
    eventually(Duration::from_secs(10), || {
        home.item(&id)["state"] == "ended"
    });
    assert_eq!(home.item(&id)["end"], "stopped_by_person");
}

#[test]
fn a_command_that_starts_with_a_dash_is_a_command_not_a_shell_option() {
    let home = Home::new();
    let id = home.start("-n foo");
    let end = home.wait_end(&id);
    assert_eq!(
        end["exit_code"], 127,
        "command not found, not bash's usage: {end}"
    );
}

#[test]
fn a_dead_warm_supervisor_does_not_fail_the_next_start() {
    let home = Home::new();
    home.wait_end(&home.start("true"));
    let daemon = home.daemon_pid();
    // The idle supervisor the daemon keeps for the next job.
    let mut warm = vec![];
    eventually(Duration::from_secs(10), || {
        warm = crate::util::supervisors_of(daemon);
        !warm.is_empty()
    });
    for pid in &warm {
        Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap();
    }
    let reply = home.json(&["start", "--", "echo hi"]);
    assert_eq!(reply["output"], "hi\n", "{reply}");
}

#[test]
fn shutdown_stop_work_stops_monitors_too() {
    let home = Home::new();
    let id = home.json(&["monitor", "wait", "--until-file", "/no/such/file/ever"])["id"]
        .as_str()
        .unwrap()
        .to_string();
    home.json(&["shutdown", "--stop-work"]);
    assert_eq!(home.item(&id)["state"], "ended", "{}", home.item(&id));
}

#[test]
fn restarts_of_the_daemon_do_not_move_ids_on() {
    let home = Home::new();
    for _ in 0..2 {
        home.start_daemon();
        let daemon = home.daemon_pid();
        home.json(&["shutdown"]);
        eventually(Duration::from_secs(10), || !alive(daemon));
    }
    assert_eq!(home.start("true"), "bg-1");
    let daemon = home.daemon_pid();
    home.json(&["shutdown"]);
    eventually(Duration::from_secs(10), || !alive(daemon));
    assert_eq!(home.start("true"), "bg-2");
}

#[test]
fn a_notice_that_could_not_be_printed_stays_pending() {
    let home = Home::new();
    let id = home.start_with(&["--notify"], "exit 3");
    eventually(Duration::from_secs(20), || {
        home.item(&id)["state"] == "ended"
    });
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let status = home.command(&["notices"]).stdout(full).status().unwrap();
    assert_eq!(status.code(), Some(1), "a pull that could not print fails");
    let notices = home.json(&["notices"]);
    assert_eq!(notices["notices"][0]["item"], id.as_str(), "{notices}");
}

#[test]
fn an_end_shown_by_a_reply_is_never_also_given_to_a_follower() {
    let home = Home::new();
    home.start_daemon();
    let out = home.path().join("followed");
    let mut follower = home
        .command(&["--json", "notices", "--follow"])
        .stdout(std::fs::File::create(&out).unwrap())
        .spawn()
        .unwrap();
    eventually(Duration::from_secs(10), || {
        crate::util::has_socket(follower.id() as i32)
    });
    let mut shown = Vec::new();
    for _ in 0..5 {
        let reply = home.json(&["start", "--notify", "--window", "5000", "--", "echo hi"]);
        assert_eq!(
            reply["state"], "ended",
            "the window showed the end: {reply}"
        );
        shown.push(reply["id"].as_str().unwrap().to_string());
    }
    // A notice nobody showed, which the follower must print.
    let marker = home.start_with(&["--notify"], "sleep 0.2");
    eventually(Duration::from_secs(20), || {
        std::fs::read_to_string(&out)
            .unwrap_or_default()
            .contains(&marker)
    });
    let followed = std::fs::read_to_string(&out).unwrap();
    let _ = follower.kill();
    let _ = follower.wait();
    for id in &shown {
        assert!(
            !followed.contains(&format!("\"item\":\"{id}\"")),
            "{id} was shown by its start and given to the follower too: {followed}"
        );
    }
}

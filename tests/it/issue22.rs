//! Issue 22, items 9, 10 and 12 to 16: servers that are not duplicates, the port a
//! port-in-use notice names, `run` on a full disk, the strip's port and cookie, a quiet
//! spell across a restart, and idle connections at the open-file cap.

use crate::util::{eventually, Home};
use serde_json::Value;
use std::time::{Duration, Instant};

const PATIENCE: Duration = Duration::from_secs(30);

/// A python server on an ephemeral port of `host`.
fn server(host: &str) -> String {
    format!("exec python3 -m http.server 0 --bind {host}")
}

/// Waits until `id` listens somewhere, and returns where.
fn listening_soon(home: &Home, id: &str) -> Vec<String> {
    let mut found = Vec::new();
    eventually(PATIENCE, || {
        found = home.item(id)["listening"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        !found.is_empty()
    });
    found
}

/// `bgwork --json start -- COMMAND` with `vars` added to the caller's environment.
fn start_with_env(home: &Home, vars: &[(&str, &str)], options: &[&str], command: &str) -> Value {
    let mut args = vec!["--json", "start"];
    args.extend_from_slice(options);
    args.extend_from_slice(&["--", command]);
    let mut call = home.command(&args);
    for (k, v) in vars {
        call.env(k, v);
    }
    let output = call.output().expect("run bgwork");
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).expect("a JSON reply")
}

#[test]
fn issue22_9_a_start_with_another_environment_is_another_server_also_after_a_restart() {
    let home = Home::new();
    let command = server("127.0.0.1");
    let first = start_with_env(
        &home,
        &[("PORT", "18801")],
        &["--env", "MODE=dev"],
        &command,
    );
    let first = first["id"].as_str().unwrap().to_string();
    listening_soon(&home, &first);

    // The caller's own environment is part of the job's identity.
    let other = start_with_env(
        &home,
        &[("PORT", "18802")],
        &["--env", "MODE=dev"],
        &command,
    );
    assert_ne!(
        other["id"],
        first.as_str(),
        "PORT=18802 is another server: {other}"
    );
    assert!(other.get("already_running").is_none(), "{other}");
    let twin = start_with_env(
        &home,
        &[("PORT", "18801")],
        &["--env", "MODE=dev"],
        &command,
    );
    assert_eq!(twin["id"], first.as_str(), "{twin}");
    assert_eq!(twin["already_running"], true);

    // After a restart the identity is still whole: another --env value is another
    // server, the same environment is the twin.
    home.kill_daemon();
    home.start_daemon();
    eventually(PATIENCE, || home.item(&first)["state"] == "running");
    let after = start_with_env(
        &home,
        &[("PORT", "18801")],
        &["--env", "MODE=prod"],
        &command,
    );
    assert_ne!(
        after["id"],
        first.as_str(),
        "MODE=prod is another server: {after}"
    );
    let caller = start_with_env(
        &home,
        &[("PORT", "18803")],
        &["--env", "MODE=dev"],
        &command,
    );
    assert_ne!(
        caller["id"],
        first.as_str(),
        "PORT=18803 is another server: {caller}"
    );
    let twin = start_with_env(
        &home,
        &[("PORT", "18801")],
        &["--env", "MODE=dev"],
        &command,
    );
    assert_eq!(twin["id"], first.as_str(), "{twin}");
    assert_eq!(twin["already_running"], true);

    // What is kept is a digest: no value is on disk.
    let job_json = std::fs::read_dir(home.path().join("jobs"))
        .unwrap()
        .flatten()
        .map(|e| std::fs::read_to_string(e.path().join("job.json")).unwrap_or_default())
        .collect::<String>();
    assert!(job_json.contains("env_digest"), "{job_json}");
    assert!(
        !job_json.contains("18801") && !job_json.contains("dev"),
        "{job_json}"
    );
}

/// Sends one HTTP/1.1 request to the strip; returns its status code.
fn http_status(port: u16, request: &str) -> u16 {
    crate::strip::http(port, request).0
}

fn ui(home: &Home) -> (u16, String) {
    let served = home.json(&["ui", "--no-open"]);
    let port = served["port"].as_u64().unwrap() as u16;
    let token = served["url"]
        .as_str()
        .unwrap()
        .split("token=")
        .nth(1)
        .unwrap()
        .to_string();
    (port, token)
}

#[test]
fn issue22_14_a_cookie_of_the_same_name_set_by_another_page_does_not_lock_the_strip_out() {
    let home = Home::new();
    let (port, token) = ui(&home);
    // A page on another port of 127.0.0.1 set `bgwork_token_PORT=x; Path=/api`: the
    // browser sends it first (the longer path), then the strip's own.
    let name = format!("bgwork_token_{port}");
    let request = format!(
        "GET /api/items HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
         Cookie: {name}=shadowed; {name}={token}\r\nConnection: close\r\n\r\n"
    );
    assert_eq!(http_status(port, &request), 200);
    // Only wrong values are still refused.
    let request = format!(
        "GET /api/items HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
         Cookie: {name}=shadowed; {name}=also-wrong\r\nConnection: close\r\n\r\n"
    );
    assert_eq!(http_status(port, &request), 401);
}

/// Pulls notices until one is about `id`; returns its text.
fn notice_of(home: &Home, id: &str) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let reply = home.json(&["notices"]);
        let found = reply["notices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["item"] == id)
            .cloned();
        if let Some(found) = found {
            return found["text"].as_str().unwrap().to_string();
        }
        assert!(Instant::now() < deadline, "no notice of {id}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn issue22_10_a_port_in_use_notice_names_the_port_and_holder_by_address() {
    let home = Home::new();
    // A log line's time of day is no port.
    let job = home.start("echo '07:15:29,411 ERROR [Errno 98] Address already in use'; sleep 30");
    let text = notice_of(&home, &job);
    assert!(
        !text.contains("port 29") && !text.contains("port 15"),
        "{text}"
    );
    assert!(text.contains("already in use"), "{text}");

    // A server on [::1]:P does not hold 127.0.0.1:P (nor the other way round).
    let Ok(six) = std::net::TcpListener::bind("[::1]:0") else {
        crate::util::not_run(
            &crate::util::this_test(),
            "no IPv6 loopback here: its half on addresses did not run",
        );
        return;
    };
    let port = six.local_addr().unwrap().port();
    let job = home.start(&format!(
        "echo 'bind 127.0.0.1:{port} failed: address already in use'; sleep 30"
    ));
    let text = notice_of(&home, &job);
    assert!(text.contains(&format!("port {port}")), "{text}");
    assert!(
        !text.contains(&format!("pid {}", std::process::id())),
        "the [::1] listener named as the holder of 127.0.0.1:{port}: {text}"
    );
    // The same address is named by its holder.
    let job = home.start(&format!(
        "echo 'listen tcp [::1]:{port}: bind: address already in use'; sleep 30"
    ));
    let text = notice_of(&home, &job);
    assert!(
        text.contains(&format!("pid {}", std::process::id())),
        "{text}"
    );
}

#[test]
fn issue22_13_a_strip_whose_port_was_taken_across_a_restart_moves_with_a_new_token() {
    let home = Home::new();
    let (port, token) = ui(&home);
    home.kill_daemon();
    // Another program (another user's, say) takes the port while the daemon is down.
    let squatter = std::net::TcpListener::bind(("127.0.0.1", port)).expect("take the port");
    home.start_daemon();
    let run = home.run(&["--json", "ui", "--no-open"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let served = run.json();
    let new_port = served["port"].as_u64().unwrap() as u16;
    assert_ne!(new_port, port);
    assert_eq!(served["moved_from"], port, "{served}");
    let new_token = served["url"]
        .as_str()
        .unwrap()
        .split("token=")
        .nth(1)
        .unwrap();
    assert_ne!(
        new_token, token,
        "the strip moved with the token an open page sends"
    );
    assert!(
        run.stderr.contains(&format!("moved from port {port}")) && run.stderr.contains("new token"),
        "{}",
        run.stderr
    );
    // The old token opens nothing on the new port; the new one does.
    let request = |token: &str| {
        format!(
            "GET /api/items HTTP/1.1\r\nHost: 127.0.0.1:{new_port}\r\n\
             X-Bgwork-Token: {token}\r\nConnection: close\r\n\r\n"
        )
    };
    assert_eq!(http_status(new_port, &request(&token)), 401);
    assert_eq!(http_status(new_port, &request(new_token)), 200);
    drop(squatter);
}

#[test]
fn issue22_12_run_on_a_full_disk_says_so_and_the_command_goes_on_to_its_own_end() {
    let home = Home::new();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let output = home
        .command(&["run", "--", "echo first; sleep 1; echo second; exit 3"])
        .stdout(full)
        .output()
        .expect("run bgwork");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(stderr.contains("promoted to the background"), "{stderr}");
    let id = stderr
        .split_whitespace()
        .find(|w| w.starts_with("bg-"))
        .expect("the id on stderr")
        .trim_end_matches(|c: char| !c.is_ascii_digit())
        .to_string();
    // The command was not stopped: it ends as itself.
    let ended = home.wait_end(&id);
    assert_eq!(ended["end"], "failed", "{ended}");
    assert_eq!(ended["exit_code"], 3);
    // What stdout could not take is still unread.
    let read = home.json(&["read", &id]);
    let text = read["output"].as_str().unwrap();
    assert!(text.contains("first") && text.contains("second"), "{read}");
}

#[test]
fn issue22_15_a_quiet_spell_that_passed_while_the_daemon_was_down_is_told_when_output_resumes() {
    let home = Home::new();
    let go = home.path().join("go");
    let command = format!(
        "echo before; while [ ! -e {} ]; do sleep 0.05; done; \
         while true; do echo after; sleep 0.3; done",
        go.display()
    );
    let id = home.start_with(&["--quiet-after", "2s"], &command);
    let log = home.json(&["read", &id])["log_path"]
        .as_str()
        .unwrap()
        .to_string();
    eventually(PATIENCE, || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("before"))
    });
    home.kill_daemon();
    // The spell of 2 s passes while no daemon runs.
    eventually(PATIENCE, || {
        std::fs::metadata(&log)
            .and_then(|m| m.modified())
            .is_ok_and(|at| at.elapsed().unwrap_or_default() > Duration::from_millis(2500))
    });
    home.start_daemon();
    // Output resumes at once, within the first second of the new daemon, and never
    // stops for 2 s again: the only quiet spell is the one that passed while down.
    std::fs::write(&go, "").unwrap();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let reply = home.json(&["notices"]);
        let quiet = reply["notices"].as_array().unwrap().iter().any(|n| {
            n["item"] == id.as_str() && n["text"].as_str().unwrap_or("").contains("printed nothing")
        });
        if quiet {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the quiet spell of {id} was never told"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn issue22_16_at_the_open_file_cap_an_idle_connection_gives_way_to_a_new_one() {
    let home = Home::new();
    // A hard limit of 256 open files, which the daemon cannot raise.
    let bin = crate::util::BIN;
    let mut command = std::process::Command::new("bash");
    command
        .arg("-c")
        .arg(format!("ulimit -n 256 && '{bin}' list >/dev/null"))
        .env("BGWORK_HOME", home.path())
        .env("BGWORK_SESSION", &home.session)
        .stdin(std::process::Stdio::null());
    for (k, v) in &home.env {
        command.env(k, v);
    }
    assert!(command.status().unwrap().success());
    let idle: Vec<std::os::unix::net::UnixStream> = (0..400)
        .map(|_| std::os::unix::net::UnixStream::connect(home.socket()).unwrap())
        .collect();
    let started = Instant::now();
    let status = home.run(&["--json", "status"]);
    assert_eq!(status.code, 0, "{}{}", status.stdout, status.stderr);
    assert!(started.elapsed() < Duration::from_secs(10));
    // And again: the daemon keeps serving new callers (each takes the slot of the
    // idle connection that gave way, which no other caller at the cap can take first).
    for _ in 0..5 {
        let list = home.run(&["list"]);
        assert_eq!(list.code, 0, "{}", list.stderr);
    }
    drop(idle);
}

#[test]
fn issue22_12_run_json_whose_reply_cannot_be_written_says_so() {
    let home = Home::new();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let output = home
        .command(&["--json", "run", "--", "echo a; exit 4"])
        .stdout(full)
        .output()
        .expect("run bgwork");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("could not be written") && stderr.contains("FAILED (exit 4)"),
        "{stderr}"
    );
}

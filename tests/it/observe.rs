//! Issue 15, items 2 to 4: what bgwork learns from a job's processes in /proc — the
//! ports they listen on, a start that repeats a running command, a port in use, quiet
//! spells, a run-time limit, CPU time and memory.

use crate::mcp::Mcp;
use crate::util::{eventually, Home};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const PATIENCE: Duration = Duration::from_secs(30);

/// A python server on an ephemeral port of `host`.
fn server(host: &str) -> String {
    format!("exec python3 -m http.server 0 --bind {host}")
}

/// The addresses item `id` listens on, as `list --json` gives them.
fn listening(home: &Home, id: &str) -> Vec<String> {
    home.item(id)["listening"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until `id` listens somewhere, and returns where.
fn listening_soon(home: &Home, id: &str) -> Vec<String> {
    let mut found = Vec::new();
    eventually(PATIENCE, || {
        found = listening(home, id);
        !found.is_empty()
    });
    found
}

fn port_of(address: &str) -> u16 {
    address.rsplit(':').next().unwrap().parse().unwrap()
}

/// Pulls notices until one satisfies `pick`; returns it.
fn notice_where(home: &Home, pick: impl Fn(&Value) -> bool) -> Value {
    let mut seen = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let reply = home.json(&["notices"]);
        seen.extend(reply["notices"].as_array().unwrap().iter().cloned());
        if let Some(found) = seen.iter().find(|n| pick(n)) {
            return found.clone();
        }
        assert!(Instant::now() < deadline, "no such notice; saw {seen:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The first notice of each of `ids`, pulled together (a pull takes every pending one).
fn first_notices(home: &Home, ids: &[&str]) -> Vec<Value> {
    let mut seen: Vec<Value> = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let reply = home.json(&["notices"]);
        seen.extend(reply["notices"].as_array().unwrap().iter().cloned());
        let firsts: Vec<Option<Value>> = ids
            .iter()
            .map(|id| seen.iter().find(|n| n["item"] == *id).cloned())
            .collect();
        if firsts.iter().all(Option::is_some) {
            return firsts.into_iter().flatten().collect();
        }
        assert!(
            Instant::now() < deadline,
            "not every notice came; saw {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every notice that arrives within `window`.
fn notices_for(home: &Home, window: Duration) -> Vec<Value> {
    let mut seen = Vec::new();
    let deadline = Instant::now() + window;
    while Instant::now() < deadline {
        let reply = home.json(&["notices"]);
        seen.extend(reply["notices"].as_array().unwrap().iter().cloned());
        std::thread::sleep(Duration::from_millis(50));
    }
    seen
}

fn ipv6_loopback() -> bool {
    std::net::TcpListener::bind("[::1]:0").is_ok()
}

#[test]
fn issue15_2_ports_of_a_python_server_show_in_list_read_and_mcp() {
    let home = Home::new();
    let id = home.start(&server("127.0.0.1"));
    let found = listening_soon(&home, &id);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("127.0.0.1:"), "{found:?}");
    let port = port_of(&found[0]);
    assert!(port > 0);
    // The port is the server's: it answers there.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    let text = home.run(&["list"]).stdout;
    let url = format!("listening: 127.0.0.1:{port} → http://127.0.0.1:{port}/");
    assert!(text.contains(&url), "{text}");
    let read = home.json(&["read", &id]);
    assert_eq!(read["listening"][0], format!("127.0.0.1:{port}"));
    assert!(home.run(&["read", &id]).stdout.contains(&url));

    if ipv6_loopback() {
        let six = home.start(&server("::1"));
        let found = listening_soon(&home, &six);
        assert!(found[0].starts_with("[::1]:"), "{found:?}");
    }

    let mut mcp = Mcp::start(&home);
    let (error, list) = mcp.call("list", json!({}));
    assert!(!error, "{list}");
    let item = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == id.as_str())
        .cloned()
        .expect("the server in the MCP list");
    assert_eq!(item["listening"][0], format!("127.0.0.1:{port}"));
    assert_eq!(item["urls"][0], format!("http://127.0.0.1:{port}/"));
    assert!(item["cpu_ms"].is_u64() && item["rss_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn issue15_2_a_duplicate_start_answers_with_the_running_item() {
    let home = Home::new();
    let command = server("127.0.0.1");
    let first = home.start(&command);
    let port = port_of(&listening_soon(&home, &first)[0]);

    let again = home.json(&["start", "--", &command]);
    assert_eq!(again["id"], first.as_str(), "{again}");
    assert_eq!(again["already_running"], true);
    assert_eq!(again["listening"][0], format!("127.0.0.1:{port}"));
    let text = home.run(&["start", "--", &command]);
    assert_eq!(text.code, 0);
    assert!(
        text.stdout.contains(&format!("already running as {first}")),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains(&format!("127.0.0.1:{port}")));
    let running = home.json(&["list"])["items"].as_array().unwrap().len();
    assert_eq!(running, 1, "no second job was started");

    // --allow-duplicate starts a second one; another folder is another command.
    let second = home.json(&["start", "--allow-duplicate", "--", &command]);
    assert_ne!(second["id"], first.as_str());
    assert!(second.get("already_running").is_none());
    let elsewhere = home.json(&["start", "--cwd", "/", "--", &command]);
    assert_ne!(elsewhere["id"], first.as_str());
    // Another value of an --env variable is another server.
    let env = home.json(&["start", "--env", "PORT=3001", "--", &command]);
    assert_ne!(env["id"], first.as_str());
    let port_of_env = listening_soon(&home, env["id"].as_str().unwrap());
    let same_env = home.json(&["start", "--env", "PORT=3001", "--", &command]);
    assert_eq!(same_env["id"], env["id"], "{port_of_env:?}");
    let other_value = home.json(&["start", "--env", "PORT=3002", "--", &command]);
    assert_ne!(other_value["id"], env["id"]);
    // Another session is another agent: its start is its own.
    let other = home.run(&["--session", "other", "--json", "start", "--", &command]);
    assert_ne!(other.json()["id"], Value::Null);
    assert!(other.json().get("already_running").is_none());

    // Identical commands that listen on no port are fan-out: each starts.
    let fan = home.start("sleep 300");
    let out = home.start("sleep 300");
    assert_ne!(fan, out);
    let mut mcp = Mcp::start(&home);
    let (_, started) = mcp.call("start", json!({"command": command, "window_ms": 0}));
    let sleeper = Value::String(first.clone());
    assert_eq!(started["id"], sleeper);
    let (error, twin) = mcp.call("start", json!({"command": command}));
    assert!(!error);
    assert_eq!(twin["id"], sleeper);
    assert_eq!(twin["already_running"], true);
    assert!(twin["message"]
        .as_str()
        .unwrap()
        .contains("already running"));
    let (_, allowed) = mcp.call(
        "start",
        json!({"command": command, "allow_duplicate": true, "window_ms": 0}),
    );
    assert_ne!(allowed["id"], sleeper);
}

#[test]
fn issue15_2_a_port_in_use_notice_names_the_holder() {
    let home = Home::new();
    let holder = home.start(&server("127.0.0.1"));
    let port = port_of(&listening_soon(&home, &holder)[0]);

    // Another session's copy of the server fails on the same port: its notice names
    // the item that holds it (the error line, Python's, names no port: the command does).
    let as_other = |args: &[&str]| {
        let mut all = vec!["--session", "other"];
        all.extend_from_slice(args);
        home.run(&all)
    };
    let copy = format!("python3 -m http.server {port} --bind 127.0.0.1");
    let started = as_other(&["--json", "start", "--", &copy]).json();
    let copy_id = started["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + PATIENCE;
    let notice = loop {
        let reply = as_other(&["--json", "notices"]).json();
        let found = reply["notices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["text"].as_str().unwrap_or("").contains("already in use"))
            .cloned();
        if let Some(found) = found {
            break found;
        }
        assert!(Instant::now() < deadline, "no port notice");
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = notice["text"].as_str().unwrap();
    assert!(text.starts_with(&copy_id), "{text}");
    assert!(
        text.contains(&format!("port {port}"))
            && text.contains(&format!("{holder} of session test")),
        "{text}"
    );
    assert!(notice["tail"]
        .as_str()
        .unwrap()
        .contains("Address already in use"));

    // A holder that is no bgwork work is named by its pid; a job that says it twice
    // gets one notice.
    let foreign = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let foreign_port = foreign.local_addr().unwrap().port();
    let line = format!("Error: listen EADDRINUSE: address already in use 127.0.0.1:{foreign_port}");
    let job = home.start(&format!("echo '{line}'; echo '{line}'; sleep 30"));
    let notice = notice_where(&home, |n| n["item"] == job.as_str());
    let text = notice["text"].as_str().unwrap();
    assert!(
        text.contains(&format!("pid {}", std::process::id())),
        "{text}"
    );
    let more = notices_for(&home, Duration::from_millis(800));
    assert!(
        more.iter().all(|n| n["item"] != job.as_str()),
        "one notice per job: {more:?}"
    );
}

#[test]
fn issue15_2_until_port_of_waits_for_the_port_an_item_opens() {
    let home = Home::new();
    let id = home.start(&format!("sleep 1; {}", server("127.0.0.1")));
    let monitor = home.json(&[
        "monitor",
        "wait",
        "--until-port",
        "--of",
        &id,
        "--timeout",
        "30",
    ]);
    let mon = monitor["id"].as_str().unwrap().to_string();
    let ended = home.wait_end(&mon);
    assert_eq!(ended["end"], "succeeded", "{ended}");
    let port = port_of(&listening(&home, &id)[0]);
    let report = ended["report"].as_str().unwrap();
    assert!(
        report.contains(&format!("{id} listens on 127.0.0.1:{port}")),
        "{report}"
    );

    // An item that ends without a port fails the wait; a bare --until-port is refused.
    let quiet = home.start("sleep 1");
    let monitor = home.json(&["monitor", "wait", "--until-port", "--of", &quiet]);
    let ended = home.wait_end(monitor["id"].as_str().unwrap());
    assert_eq!(ended["end"], "failed", "{ended}");
    let (code, _, message) = home.error(&["monitor", "wait", "--until-port"]);
    assert_eq!(code, 2);
    assert!(message.contains("--of ID"), "{message}");
}

#[test]
fn issue15_3_quiet_after_fires_once_per_spell_busy_or_idle() {
    let home = Home::new();
    let busy = "import time\nt = time.time()\nwhile time.time() - t < 4: pass";
    let command = format!("echo one; python3 -c '{busy}'; echo two; sleep 60");
    let id = home.start_with(&["--quiet-after", "1.5s"], &command);
    let mut spells: Vec<Value> = Vec::new();
    eventually(PATIENCE, || {
        let reply = home.json(&["notices"]);
        let notices = reply["notices"].as_array().unwrap().iter();
        spells.extend(notices.filter(|n| n["item"] == id.as_str()).cloned());
        spells.len() >= 2
    });
    let (first, second) = (&spells[0], &spells[1]);
    let text = first["text"].as_str().unwrap();
    assert!(text.contains("has printed nothing for 1s 500ms"), "{text}");
    assert!(text.contains("quiet and busy (cpu "), "{text}");
    assert!(first["tail"].as_str().unwrap().contains("one"));
    // Output resumes ("two"): a new spell, idle this time, with its own notice.
    let text = second["text"].as_str().unwrap();
    assert!(text.contains("quiet and idle (cpu 0%)"), "{text}");
    assert!(second["tail"].as_str().unwrap().contains("two"));
    // Once per spell: nothing more while it stays quiet.
    let more = notices_for(&home, Duration::from_secs(3));
    assert!(more.iter().all(|n| n["item"] != id.as_str()), "{more:?}");
}

#[test]
fn a_quiet_spell_is_counted_from_the_output_not_from_its_report() {
    // Found by a hostile tester: a job nobody waits on reports its output once a
    // second, and the spell was counted from the report, up to a second late (and a
    // spell shorter than that second plus the quiet time was never told).
    let home = Home::new();
    let id = home.start_with(
        &["--quiet-after", "2s"],
        "echo a; sleep 0.1; date +%s%N; sleep 30",
    );
    let reply = home.json(&["notices", "--wait", "20"]);
    let arrived = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let notices = reply["notices"].as_array().unwrap();
    assert_eq!(notices.len(), 1, "{reply}");
    assert!(notices[0]["text"]
        .as_str()
        .unwrap()
        .contains("printed nothing for 2s"));
    let printed: u64 = home.json(&["read", &id, "--from", "0"])["output"]
        .as_str()
        .unwrap()
        .lines()
        .nth(1)
        .expect("the time of the last line")
        .parse()
        .unwrap();
    let after = arrived.as_nanos() as f64 / 1e9 - printed as f64 / 1e9;
    assert!(
        (1.9..2.6).contains(&after),
        "the notice came {after:.2} s after the last output (quiet after 2 s)"
    );
    home.run(&["stop", &id]);
}

#[test]
fn issue15_3_a_pane_waiting_at_a_prompt_is_named_as_such() {
    let home = Home::new();
    let id = home.start_with(
        &["--pty", "--quiet-after", "1s"],
        "read -p 'Overwrite the file? ' answer; echo got $answer; sleep 60",
    );
    let repl = home.start_with(&["--pty", "--quiet-after", "1s"], "python3 -q");
    let sleeper = home.start_with(&["--pty", "--quiet-after", "1s"], "echo Loading:; sleep 60");
    let notices = first_notices(&home, &[&id, &repl, &sleeper]);
    let text = notices[0]["text"].as_str().unwrap();
    assert!(
        text.contains("waiting for input at a prompt: \"Overwrite the file?\""),
        "{text}"
    );
    // A REPL waits in poll on its terminal: a prompt too.
    let text = notices[1]["text"].as_str().unwrap();
    assert!(text.contains("at a prompt: \">>>\""), "{text}");
    // A line that ends in a colon over a process that sleeps on a timer is no prompt.
    let text = notices[2]["text"].as_str().unwrap();
    assert!(text.contains("quiet and idle"), "{text}");
}

#[test]
fn issue15_3_max_runtime_stops_with_ran_past_its_limit() {
    let home = Home::new();
    let id = home.start_with(&["--max-runtime", "1s", "--notify"], "sleep 100");
    // The agent did not ask for this stop: it hears of it.
    let notice = notice_where(&home, |n| n["item"] == id.as_str());
    assert!(notice["text"]
        .as_str()
        .unwrap()
        .contains("ran past its limit"));
    let ended = home.item(&id);
    assert_eq!(ended["end"], "stopped_by_agent", "{ended}");
    let report = ended["report"].as_str().unwrap();
    assert!(
        report.contains("ran past its limit (--max-runtime 1s)"),
        "{report}"
    );
    let (code, _, message) = home.error(&["start", "--max-runtime", "0", "--", "true"]);
    assert_eq!(code, 2);
    assert!(message.contains("--max-runtime"), "{message}");
    // Without --notify, no notice: its end is there for whoever looks.
    let unarmed = home.start_with(&["--max-runtime", "1s"], "sleep 100");
    let ended = home.wait_end(&unarmed);
    assert_eq!(ended["end"], "stopped_by_agent", "{ended}");
    let pending = home.json(&["notices", "--peek"]);
    assert!(
        pending["notices"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["item"] != unarmed.as_str()),
        "{pending}"
    );
}

#[test]
fn issue15_3_limits_survive_a_daemon_restart() {
    let home = Home::new();
    let limited = home.start_with(&["--max-runtime", "3s"], "sleep 100");
    let quiet = home.start_with(&["--quiet-after", "2s"], "echo hello; sleep 100");
    home.kill_daemon();
    // The next call starts a daemon, which takes both jobs back.
    let ended = home.wait_end(&limited);
    assert!(
        ended["report"]
            .as_str()
            .unwrap()
            .contains("ran past its limit"),
        "{ended}"
    );
    let started = humantime::parse_rfc3339(ended["started_at"].as_str().unwrap()).unwrap();
    let ended_at = humantime::parse_rfc3339(ended["ended_at"].as_str().unwrap()).unwrap();
    let ran = ended_at.duration_since(started).unwrap();
    assert!(
        ran < Duration::from_secs(10),
        "counted from its start: {ran:?}"
    );
    let notice = notice_where(&home, |n| n["item"] == quiet.as_str());
    assert!(notice["text"].as_str().unwrap().contains("quiet and idle"));
}

#[test]
fn issue15_4_cpu_and_memory_of_a_busy_job_and_its_peak_at_the_end() {
    let home = Home::new();
    let program = "import time\nx = bytearray(80_000_000)\nfor i in range(0, len(x), 4096): x[i] = 1\nt = time.time()\nwhile time.time() - t < 3: pass";
    let id = home.start(&format!("python3 -c '{program}'"));
    eventually(PATIENCE, || {
        let item = home.item(&id);
        item["cpu_ms"].as_u64().unwrap_or(0) > 300
            && item["rss_bytes"].as_u64().unwrap_or(0) > 70_000_000
    });
    let status = home.json(&["status"]);
    assert!(
        status["rss_bytes"].as_u64().unwrap() > 70_000_000,
        "{status}"
    );
    assert!(status["cpu_ms"].as_u64().unwrap() > 0);
    let read = home.json(&["read", &id]);
    assert!(read["rss_bytes"].as_u64().unwrap() > 70_000_000, "{read}");
    let text = home.run(&["list"]).stdout;
    assert!(text.contains("MiB"), "{text}");

    let ended = home.wait_end(&id);
    assert!(
        ended["peak_rss_bytes"].as_u64().unwrap() > 70_000_000,
        "{ended}"
    );
    assert!(ended["cpu_ms"].as_u64().unwrap() > 500, "{ended}");
    assert!(ended.get("rss_bytes").is_none());
    let report = ended["report"].as_str().unwrap();
    assert!(
        report.contains("; cpu ") && report.contains("peak memory"),
        "{report}"
    );
    // A quick command's report stays as it was.
    let quick = home.start("true");
    let ended = home.wait_end(&quick);
    assert_eq!(
        ended["report"],
        format!("{quick} finished successfully (exit 0)")
    );
    assert!(ended["peak_rss_bytes"].as_u64().is_some());
}

#[test]
fn issue15_4_a_job_of_200_processes_is_counted_whole_while_they_come_and_go() {
    let home = Home::new();
    let many = home.start("for i in $(seq 200); do sleep 120 & done; wait");
    let churn = home.start("while true; do /bin/true; done");
    eventually(PATIENCE, || {
        home.item(&many)["rss_bytes"].as_u64().unwrap_or(0) > 200 * 300_000
    });
    // Processes that exit while they are read never break a list.
    for _ in 0..20 {
        let item = home.item(&churn);
        assert_eq!(item["state"], "running");
        assert!(item["cpu_ms"].is_u64());
    }
    let started = Instant::now();
    home.json(&["list"]);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn issue15_4_a_job_that_rewrites_its_processes_record_is_not_shown_the_machine() {
    let home = Home::new();
    // The job names pid 1 (with its true start time) as its supervisor: reading the
    // tree under it would show every process of the machine as the job's. It does so
    // once its supervisor's own record is there (written as the job starts, it would
    // replace the job's).
    let id = home.start(
        "until grep -q '^job ' \"$BGWORK_JOB/processes\" 2>/dev/null; do sleep 0.05; done; \
         start=$(sed 's/.*) //' /proc/1/stat | cut -d' ' -f20); \
         echo \"supervisor 1 $start\" > \"$BGWORK_JOB/processes\"; echo rewritten; exec sleep 300",
    );
    eventually(PATIENCE, || {
        home.run(&["read", &id, "--all"])
            .stdout
            .contains("rewritten")
    });
    let item = home.item(&id);
    assert!(item.get("rss_bytes").is_none(), "{item}");
    assert!(item.get("cpu_ms").is_none(), "{item}");
}

#[test]
fn issue15_3_restart_keeps_the_limits() {
    let home = Home::new();
    let first = home.start_with(&["--max-runtime", "1s"], "sleep 100");
    home.wait_end(&first);
    let again = home.json(&["restart", &first, "--window", "0"]);
    let id = again["id"].as_str().unwrap().to_string();
    let ended = home.wait_end(&id);
    assert!(
        ended["report"]
            .as_str()
            .unwrap()
            .contains("ran past its limit"),
        "{ended}"
    );
}

#[test]
fn issue15_3_mcp_start_takes_quiet_after_and_max_runtime() {
    let home = Home::new();
    let mut mcp = Mcp::start(&home);
    let (error, quiet) = mcp.call(
        "start",
        json!({"command": "echo x; sleep 60", "quiet_after_s": 1, "window_ms": 0}),
    );
    assert!(!error, "{quiet}");
    let (_, limited) = mcp.call(
        "start",
        json!({"command": "sleep 60", "max_runtime_s": 1, "notify": true, "window_ms": 0}),
    );
    let mut seen: Vec<Value> = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    while seen.len() < 2 {
        assert!(Instant::now() < deadline, "notices: {seen:?}");
        let (_, list) = mcp.call("list", json!({}));
        seen.extend(list["notices"].as_array().unwrap().iter().cloned());
        std::thread::sleep(Duration::from_millis(100));
    }
    let text_of = |id: &Value| {
        seen.iter()
            .find(|n| n["item"] == *id)
            .map(|n| n["text"].as_str().unwrap().to_string())
            .unwrap_or_default()
    };
    assert!(text_of(&quiet["id"]).contains("quiet and idle"), "{seen:?}");
    assert!(
        text_of(&limited["id"]).contains("ran past its limit"),
        "{seen:?}"
    );
    let (error, refused) = mcp.call("start", json!({"command": "true", "quiet_after_s": 0.1}));
    assert!(error);
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("quiet_after_s"),
        "{refused}"
    );
}

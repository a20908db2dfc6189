//! The work strip (`bgwork ui`): its guard, tested over raw HTTP, and the page itself,
//! driven in Debian's Chromium by Playwright (`tests/browser/strip.py`).

use crate::util::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::Duration;

/// One browser at a time: two Chromiums on a 2-core machine slow each other past the
/// page's 1 s promise.
static BROWSER: Mutex<()> = Mutex::new(());

/// `bgwork ui --no-open --json`.
fn ui(home: &Home) -> Value {
    home.json(&["ui", "--no-open"])
}

fn token(url: &str) -> String {
    url.split("token=")
        .nth(1)
        .expect("a token in the URL")
        .to_string()
}

/// Sends one HTTP/1.1 request; returns the status code, the headers and the body.
pub(crate) fn http(port: u16, request: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to the strip");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {answer:?}"));
    (status, head.to_string(), body.to_string())
}

fn get(port: u16, path: &str, host: &str, extra: &str) -> (u16, String, String) {
    http(
        port,
        &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n"),
    )
}

fn post(port: u16, path: &str, host: &str, extra: &str, body: &str) -> (u16, String, String) {
    http(
        port,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Content-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

#[test]
fn the_strip_is_served_on_loopback_and_answers_only_with_its_token() {
    let home = Home::new();
    let served = ui(&home);
    let port = served["port"].as_u64().unwrap() as u16;
    let url = served["url"].as_str().unwrap();
    assert!(
        url.starts_with(&format!("http://127.0.0.1:{port}/?token=")),
        "{url}"
    );
    let token = token(url);
    let host = format!("127.0.0.1:{port}");
    // The token lives in a private file of the home.
    let file = home.path().join("http.token");
    let mode = std::fs::metadata(&file).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), token);

    // No token: 401, for the page and for its answers alike.
    assert_eq!(get(port, "/", &host, "").0, 401);
    assert_eq!(get(port, "/api/items", &host, "").0, 401);
    let wrong = "X-Bgwork-Token: 00\r\n";
    assert_eq!(get(port, "/api/items", &host, wrong).0, 401);
    assert_eq!(
        get(port, &format!("/?token={}", "0".repeat(64)), &host, "").0,
        401
    );

    // The first load with the token sets an HttpOnly, SameSite=Strict cookie and drops
    // the token from the address.
    let (status, head, _) = get(port, &format!("/?token={token}"), &host, "");
    assert_eq!(status, 303, "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("location: /\r\n"), "{head}");
    assert!(
        lower.contains(&format!("set-cookie: bgwork_token_{port}={token}")),
        "{head}"
    );
    assert!(
        lower.contains("httponly") && lower.contains("samesite=strict"),
        "{head}"
    );
    let cookie = format!("Cookie: bgwork_token_{port}={token}\r\n");
    let (status, head, body) = get(port, "/", &host, &cookie);
    assert_eq!(status, 200);
    assert!(body.contains("<title>bgwork"), "{body}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("content-security-policy: default-src 'none'; script-src 'self'"));
    assert!(!lower.contains("access-control-allow"), "no CORS: {head}");

    // A foreign Host (DNS rebinding) is refused even with the token.
    let (status, _, _) = get(port, "/api/items", "attacker.example:80", &cookie);
    assert_eq!(status, 403);
    let (status, _, _) = get(
        port,
        "/api/items",
        &format!("attacker.example:{port}"),
        &cookie,
    );
    assert_eq!(status, 403);
    assert_eq!(
        get(port, "/api/items", &format!("localhost:{port}"), &cookie).0,
        200
    );

    // A change sent with the cookie from another origin (or none) is refused; the page's
    // own origin is served.
    let id = home.start("sleep 600");
    let body = format!(r#"{{"session":"test","id":"{id}"}}"#);
    let evil = format!("{cookie}Origin: http://attacker.example\r\n");
    assert_eq!(post(port, "/api/stop", &host, &evil, &body).0, 403);
    assert_eq!(post(port, "/api/stop", &host, &cookie, &body).0, 403);
    assert_eq!(home.item(&id)["state"], "running", "nothing was stopped");
    let ours = format!("{cookie}Origin: http://127.0.0.1:{port}\r\n");
    let (status, _, answer) = post(port, "/api/stop", &host, &ours, &body);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(home.wait_end(&id)["end"], "stopped_by_person");

    // A second `ui` answers the same address; the daemon keeps serving the socket.
    let again = ui(&home);
    assert_eq!(again["port"], served["port"]);
    assert_eq!(again["already_serving"], true);
    assert_eq!(home.json(&["status"])["running"], 0);
}

#[test]
fn the_strip_answers_what_the_cli_answers_and_bad_requests_get_clear_errors() {
    let home = Home::new();
    let served = ui(&home);
    let port = served["port"].as_u64().unwrap() as u16;
    let token = token(served["url"].as_str().unwrap());
    let host = format!("127.0.0.1:{port}");
    let auth = format!("X-Bgwork-Token: {token}\r\n");
    let id = home.start("echo hello from the job");
    home.wait_end(&id);
    let (status, _, body) = get(port, "/api/items", &host, &auth);
    assert_eq!(status, 200);
    let list: Value = serde_json::from_str(&body).unwrap();
    let item = &list["items"][0];
    assert_eq!(item["id"], id.as_str());
    assert_eq!(item["session"], "test");
    assert_eq!(item["end"], "succeeded");
    // A range of the log, raw, as `read --raw --from` gives it.
    let (status, _, body) = get(
        port,
        &format!("/api/read?session=test&id={id}&from=0&to=100"),
        &host,
        &auth,
    );
    assert_eq!(status, 200, "{body}");
    let read: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(read["output_base64"], "aGVsbG8gZnJvbSB0aGUgam9iCg==");
    // Reading from the page moves no cursor of the agent's.
    assert_eq!(
        home.json(&["read", &id])["output"],
        "hello from the job\n",
        "the agent still has its unread output"
    );
    // Unknown ids, a pane action on a job, malformed bodies: clear errors, 4xx.
    let (status, _, body) = post(
        port,
        "/api/stop",
        &host,
        &auth,
        r#"{"session":"test","id":"bg-99"}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("bg-99"), "{body}");
    let (status, _, body) = post(
        port,
        "/api/close",
        &host,
        &auth,
        &format!(r#"{{"session":"test","id":"{id}"}}"#),
    );
    assert_eq!(status, 400);
    assert!(body.contains("is no pane"), "{body}");
    assert!(post(port, "/api/stop", &host, &auth, "{not json").0 >= 400);
    let (status, _, _) = get(port, "/api/output?session=test&id=bg-77", &host, &auth);
    assert_eq!(status, 400);
    // And the daemon still serves.
    assert_eq!(get(port, "/api/items", &host, &auth).0, 200);
}

#[test]
fn a_restarted_daemon_serves_the_strip_again_with_the_same_address_and_token() {
    let home = Home::new();
    let served = ui(&home);
    home.kill_daemon();
    home.start_daemon();
    let port = served["port"].as_u64().unwrap() as u16;
    let token = token(served["url"].as_str().unwrap());
    let auth = format!("X-Bgwork-Token: {token}\r\n");
    eventually(Duration::from_secs(10), || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let (status, _, _) = get(port, "/api/items", &format!("127.0.0.1:{port}"), &auth);
    assert_eq!(status, 200);
    assert_eq!(ui(&home)["url"], served["url"]);
}

#[test]
fn daemon_http_refuses_an_address_off_loopback() {
    let home = Home::new();
    let run = home.run(&["daemon", "--http", "0.0.0.0:8080"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("loopback only"), "{}", run.stderr);
}

/// Runs a scenario of `tests/browser/strip.py` against this home's strip.
pub fn browser(home: &Home, scenario: &str, extra: &[&str]) -> Value {
    let _one = BROWSER.lock().unwrap_or_else(|p| p.into_inner());
    let python = std::env::var("BGWORK_TEST_PYTHON").expect(
        "BGWORK_TEST_PYTHON names a Python with `playwright` (and Debian's chromium): \
         scripts/test makes one",
    );
    let url = ui(home)["url"].as_str().unwrap().to_string();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/strip.py");
    let mut command = std::process::Command::new(python);
    command
        .args([script, scenario, &url])
        .args(extra)
        .env("BGWORK_BIN", BIN)
        .env("BGWORK_HOME", home.path())
        .env("BGWORK_SESSION", &home.session);
    let output = command.output().expect("run the browser script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{scenario}: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn a_job_started_from_the_cli_appears_in_the_page_and_its_output_streams_in() {
    let home = Home::new();
    let seen = browser(&home, "appears", &[]);
    eprintln!("strip timing: {seen}");
    // The script waited at most 1 s for the row.
    assert!(seen["appear_ms"].as_f64().unwrap() < 1000.0, "{seen}");
    assert_eq!(seen["dialogs"], serde_json::json!([]));
    let id = seen["id"].as_str().unwrap();
    assert_eq!(home.item(id)["end"], "succeeded");
}

#[test]
fn stop_on_the_page_ends_the_job_as_the_person_and_the_agent_is_told_so() {
    let home = Home::new();
    let seen = browser(&home, "stop", &[]);
    let id = seen["id"].as_str().unwrap();
    let list = home.json(&["list", "--all", "--json"]);
    let item = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == id)
        .expect("the stopped job is listed")
        .clone();
    assert_eq!(item["end"], "stopped_by_person", "{item}");
    let notices = home.json(&["notices"]);
    let text = notices.to_string();
    assert!(text.contains("stopped by the person"), "{text}");
}

#[test]
fn a_panes_screen_shows_pythons_prompt_and_a_line_typed_in_the_page_is_answered() {
    let home = Home::new();
    let seen = browser(&home, "pane", &[]);
    assert!(
        seen["screen"].as_str().unwrap().contains("42 a\\b"),
        "{seen}"
    );
    let id = seen["id"].as_str().unwrap();
    // Close on the page hangs the pane up.
    assert_eq!(home.wait_end(id)["end"], "cancelled");
}

#[test]
fn markup_a_job_prints_is_shown_as_text_and_its_colours_as_colour() {
    let home = Home::new();
    let seen = browser(&home, "escapes", &[]);
    let text = seen["text"].as_str().unwrap();
    assert!(text.contains("<script>alert(1)</script>"), "{text}");
    assert!(text.contains("<img src=x onerror=alert(2)>"), "{text}");
    assert!(
        text.contains("red plain") && !text.contains("[31m"),
        "{text}"
    );
    assert_eq!(seen["red"], "rgb(204, 0, 0)");
    assert_eq!(seen["elements"], 0, "no element made from output");
    assert_eq!(seen["dialogs"], serde_json::json!([]), "no dialog opened");
}

#[test]
fn the_readme_screenshot_is_taken_of_real_work() {
    let home = Home::new();
    let out = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/strip.png");
    let seen = browser(&home, "screenshot", &[out]);
    let png = std::fs::read(out).expect("the screenshot");
    assert!(png.starts_with(b"\x89PNG") && png.len() > 20_000, "{seen}");
}

#[test]
fn ui_opens_the_page_without_putting_its_token_on_a_command_line() {
    let home = Home::new();
    let bin = home.path().join("fake-bin");
    std::fs::create_dir(&bin).unwrap();
    let said = home.path().join("xdg-open.args");
    let fake = bin.join("xdg-open");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\necho \"$@\" > {}.tmp && mv {0}.tmp {0}\n",
            said.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let output = home
        .command(&["ui"])
        .env("DISPLAY", ":0")
        .env("PATH", path)
        .output()
        .unwrap();
    assert!(output.status.success());
    let url = String::from_utf8_lossy(&output.stdout).trim().to_string();
    eventually(Duration::from_secs(10), || said.exists());
    let args = std::fs::read_to_string(&said).unwrap();
    assert!(
        !args.contains(&token(&url)),
        "the token is on xdg-open's command line: {args}"
    );
    let door = std::path::PathBuf::from(args.trim());
    let mode = std::fs::metadata(&door).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );
    assert!(std::fs::read_to_string(&door).unwrap().contains(&url));
}

#[test]
fn connections_past_the_cap_wait_and_the_daemon_keeps_serving_its_socket() {
    let home = Home::new();
    let served = ui(&home);
    let port = served["port"].as_u64().unwrap() as u16;
    // Idle connections from someone without the token (fewer than the kernel queues, so
    // none blocks): they hold the strip's slots, not the daemon.
    let idle: Vec<TcpStream> = (0..150)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    assert!(idle.len() > 64, "connected {}", idle.len());
    assert_eq!(
        home.json(&["status"])["running"],
        0,
        "the socket still answers"
    );
    let id = home.start("echo still serving");
    assert_eq!(home.wait_end(&id)["end"], "succeeded");
    drop(idle);
    let token = token(served["url"].as_str().unwrap());
    let auth = format!("X-Bgwork-Token: {token}\r\n");
    let mut status = 0;
    eventually(Duration::from_secs(10), || {
        status = get(port, "/api/items", &format!("127.0.0.1:{port}"), &auth).0;
        status == 200
    });
    assert_eq!(status, 200, "served again once the idle ones went");
}

#[test]
fn with_a_thousand_items_the_page_shows_them_in_pages_and_a_new_one_within_a_second() {
    // Starts with `--window 0` outrun the ends of `true` on a loaded machine.
    let home = Home::new().with("BGWORK_MAX_RUNNING", "1000");
    home.start_daemon();
    // A thousand ended jobs, started from four clients at once.
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..250 {
                    let run = home.run(&["start", "--window", "0", "--", "true"]);
                    assert_eq!(run.code, 0, "{}", run.stderr);
                }
            });
        }
    });
    eventually(Duration::from_secs(60), || {
        home.json(&["status"])["running"] == 0
    });
    let seen = browser(&home, "thousand", &[]);
    eprintln!("strip timing: {seen}");
    assert_eq!(seen["rows"], 200, "one page of rows: {seen}");
    assert!(
        seen["more"].as_str().unwrap().contains("800 not shown"),
        "{seen}"
    );
    assert!(seen["appear_ms"].as_f64().unwrap() < 1000.0, "{seen}");
}

/// The cookie the first load of a home's strip sets: `(name, value)`.
fn first_load_cookie(home: &Home) -> (String, String) {
    let served = ui(home);
    let port = served["port"].as_u64().unwrap() as u16;
    let token = token(served["url"].as_str().unwrap());
    let (status, head, _) = get(
        port,
        &format!("/?token={token}"),
        &format!("127.0.0.1:{port}"),
        "",
    );
    assert_eq!(status, 303, "{head}");
    let set = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("set-cookie: ")
                .map(str::to_string)
        })
        .expect("a cookie");
    let pair = set.split(';').next().unwrap();
    let (name, value) = pair.split_once('=').unwrap();
    (name.to_string(), value.to_string())
}

#[test]
fn the_strips_of_two_homes_keep_their_cookies_apart_in_one_browser() {
    // A browser sends the cookies of 127.0.0.1 to every port: the second strip's cookie
    // must not overwrite the first's (whose open page would be refused from then on).
    let (one, two) = (Home::new(), Home::new());
    let (name_one, token_one) = first_load_cookie(&one);
    let (name_two, token_two) = first_load_cookie(&two);
    assert_ne!(name_one, name_two, "one cookie name for two strips");
    assert_ne!(token_one, token_two, "each home has its own token");
    // The browser sends both; each strip finds its own.
    let both = format!("Cookie: {name_two}={token_two}; {name_one}={token_one}\r\n");
    for home in [&one, &two] {
        let port = ui(home)["port"].as_u64().unwrap() as u16;
        let (status, _, body) = get(port, "/api/items", &format!("127.0.0.1:{port}"), &both);
        assert_eq!(status, 200, "{body}");
    }
}

#[test]
fn another_users_connections_to_the_strip_are_closed_and_hold_none_of_its_slots() {
    let home = Home::new();
    let served = ui(&home);
    let port = served["port"].as_u64().unwrap() as u16;
    let token = token(served["url"].as_str().unwrap());
    let host = format!("127.0.0.1:{port}");
    // Another user of the machine opens more connections than the strip serves at once
    // and sends nothing (fewer than the kernel queues, so none blocks).
    let held: Vec<TcpStream> = crate::security_hostile::as_nobody(|| {
        (0..100)
            .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
            .collect()
    });
    assert!(held.len() > 64, "connected {}", held.len());
    // The person is served at once, not after the other user lets go.
    let auth = format!("X-Bgwork-Token: {token}\r\n");
    let began = std::time::Instant::now();
    let (status, _, body) = get(port, "/api/items", &host, &auth);
    assert_eq!(status, 200, "{body}");
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "{:?}",
        began.elapsed()
    );
    // Even with the token, the other user gets no answer: its connection is closed.
    let mut theirs = &held[0];
    theirs
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = theirs.write_all(
        format!("GET /api/items HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n")
            .as_bytes(),
    );
    let mut answer = Vec::new();
    let _ = theirs.read_to_end(&mut answer);
    assert!(
        !String::from_utf8_lossy(&answer).contains("200 OK"),
        "another user was served"
    );
}

#[test]
fn tabs_left_open_in_the_background_leave_the_browsers_connections_to_a_new_tab() {
    // Chromium opens at most six connections to one address and each tab following an
    // item holds two: a fourth tab never loaded while three others were open.
    let home = Home::new();
    let seen = browser(&home, "tabs", &[]);
    let first = seen["first"].as_str().unwrap();
    // The tab brought back went on where it stopped: nothing twice, nothing lost.
    assert_eq!(first.matches("tab 0").count(), 1, "{first}");
    assert_eq!(first.matches("after the gate").count(), 1, "{first}");
}

#[test]
fn a_restart_whose_page_goes_away_midway_still_starts_the_new_item() {
    let home = Home::new();
    let served = ui(&home);
    let port = served["port"].as_u64().unwrap() as u16;
    let token = token(served["url"].as_str().unwrap());
    // An item that takes its grace (5 s) to stop, so the restart is still stopping it
    // when the page goes.
    let told = home.path().join("told-to-stop");
    let id = home.start(&format!(
        "trap 'touch {}' TERM; while true; do sleep 0.1; done",
        told.display()
    ));
    let body = format!(r#"{{"session":"test","id":"{id}"}}"#);
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .write_all(
            format!(
                "POST /api/restart HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
                 X-Bgwork-Token: {token}\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .unwrap();
    eventually(Duration::from_secs(10), || told.exists());
    drop(stream);
    // The old item ends and the new one starts all the same.
    home.wait_end(&id);
    let mut items = Vec::new();
    eventually(Duration::from_secs(15), || {
        items = home.json(&["list", "--all", "--json"])["items"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        items.len() == 2
    });
    assert_eq!(items.len(), 2, "no new item: {items:?}");
    let new = items.iter().find(|i| i["id"] != id.as_str()).unwrap();
    let new = new["id"].as_str().unwrap();
    let mut state = Value::Null;
    eventually(Duration::from_secs(10), || {
        state = home.item(new)["state"].clone();
        state == "running"
    });
    assert_eq!(state, "running", "{new}");
    home.run(&["stop", "--grace", "0", new]);
}

#[test]
fn a_sub_agents_work_is_shown_under_its_parent_session() {
    let home = Home::new();
    let seen = browser(&home, "sessions", &[]);
    assert_eq!(
        seen["heads"],
        serde_json::json!(["session app", "sub-agent app/sub-1", "session app-2"]),
        "{seen}"
    );
}

#[test]
fn text_after_a_stray_escape_shows_while_the_job_waits() {
    // The page held back up to 255 characters after an ESC that started no escape,
    // until more output came (never, for a job waiting on its input).
    let home = Home::new();
    let seen = browser(&home, "stray", &[]);
    let text = seen["text"].as_str().unwrap();
    assert!(text.contains("stray  then the text"), "{text}");
    assert!(
        text.contains("]0;a title never ended\nthe line after"),
        "{text}"
    );
    assert!(
        text.ends_with("cut "),
        "the cut escape is not shown: {text:?}"
    );
}

#[test]
fn a_client_on_an_ipv6_socket_is_told_apart_by_its_user_too() {
    // Java and other dual-stack clients reach 127.0.0.1 from an IPv6 socket
    // (::ffff:127.0.0.1): the kernel lists them in tcp6, not tcp.
    let home = Home::new();
    let served = ui(&home);
    let port = served["port"].as_u64().unwrap() as u16;
    let token = token(served["url"].as_str().unwrap());
    let mapped: std::net::SocketAddr = format!("[::ffff:127.0.0.1]:{port}").parse().unwrap();
    let request = format!(
        "GET /api/items HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Bgwork-Token: {token}\r\n\
         Connection: close\r\n\r\n"
    );
    let ask = |mut stream: TcpStream| {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let _ = stream.write_all(request.as_bytes());
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    };
    let mine = ask(TcpStream::connect(mapped).expect("an IPv6 socket reaches 127.0.0.1"));
    assert!(mine.starts_with("HTTP/1.1 200"), "{mine}");
    let theirs = crate::security_hostile::as_nobody(|| TcpStream::connect(mapped).unwrap());
    let theirs = ask(theirs);
    assert!(
        !theirs.contains("200 OK"),
        "another user was served: {theirs}"
    );
}

#[test]
fn a_fifo_in_place_of_the_strips_port_file_does_not_hold_up_the_daemon() {
    let home = Home::new();
    nix::unistd::mkfifo(
        &home.path().join("http.port"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let id = home.start("echo served");
    assert_eq!(home.wait_end(&id)["end"], "succeeded");
}

#[test]
fn issue26_2_the_strip_lists_what_history_expects_of_running_work() {
    let home = Home::new();
    let served = ui(&home);
    let port = served["port"].as_u64().unwrap() as u16;
    let token = token(served["url"].as_str().unwrap());
    let host = format!("127.0.0.1:{port}");
    let auth = format!("X-Bgwork-Token: {token}\r\n");
    let flag = home.path().join("long");
    let command = format!("test -e {} && sleep 60; true", flag.display());
    home.json(&["run", "--", &command]);
    std::fs::write(&flag, "").unwrap();
    let id = home.start(&command);
    let (status, _, body) = get(port, "/api/items", &host, &auth);
    assert_eq!(status, 200);
    let list: Value = serde_json::from_str(&body).unwrap();
    let item = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == id.as_str())
        .cloned()
        .unwrap();
    assert!(
        item["expected"].as_str().unwrap().starts_with("usually "),
        "{item}"
    );
    assert!(
        item["progress"].as_str().unwrap().starts_with("running "),
        "{item}"
    );
}

#[test]
fn issue26_q5_the_strip_counts_waiting_items_apart_as_status_does() {
    let home = Home::new();
    let seen = browser(&home, "counts", &[]);
    assert_eq!(seen["status"]["running"], 3, "{seen}");
    assert_eq!(seen["status"]["waiting"], 5, "{seen}");
    let summary = seen["summary"].as_str().unwrap();
    assert!(
        summary.starts_with("3 running in 1 session · 5 waiting"),
        "{summary}"
    );
    let bar = seen["bar"].as_str().unwrap();
    assert!(bar.starts_with("3 running 0 min ago"), "{bar}");
}

#[test]
fn issue26_v6_a_restart_from_the_strip_gives_a_plain_environment_not_the_daemons() {
    // The daemon was started by a client whose environment holds a value of its own.
    let home = Home::new().with("FIRSTCLIENT", "first-client-value-1234");
    let served = ui(&home);
    let port = served["port"].as_u64().unwrap() as u16;
    let token = token(served["url"].as_str().unwrap());
    let started = home
        .command(&[
            "--json",
            "start",
            "--session",
            "other",
            "--",
            "echo \"first=[$FIRSTCLIENT] home=[$HOME] bgwork=[$BGWORK_HOME]\"; sleep 60",
        ])
        .env_remove("FIRSTCLIENT")
        .output()
        .unwrap();
    let started: Value = serde_json::from_slice(&started.stdout).unwrap();
    let id = started["id"].as_str().unwrap();
    let (status, _, body) = post(
        port,
        "/api/restart",
        &format!("127.0.0.1:{port}"),
        &format!("X-Bgwork-Token: {token}\r\n"),
        &format!(r#"{{"session":"other","id":"{id}"}}"#),
    );
    assert_eq!(status, 200, "{body}");
    let new: Value = serde_json::from_str(&body).unwrap();
    let new = new["id"].as_str().unwrap().to_string();
    let mut text = String::new();
    eventually(Duration::from_secs(10), || {
        text = home.json(&["read", &new, "--all", "--session", "other"])["output"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        text.contains("home=")
    });
    assert!(text.contains("first=[]"), "{text}");
    assert!(!text.contains("home=[]"), "{text}");
    // A `bgwork` call in it reaches this daemon, in its home.
    assert!(
        text.contains(&format!("bgwork=[{}]", home.path().display())),
        "{text}"
    );
    // An item started with --env values, a login variable among them, is refused there:
    // a click has none of them to give.
    let with_env = home.start_with(&["--env", "PATH=/usr/bin:/bin:/opt/own"], "sleep 60");
    let (status, _, body) = post(
        port,
        "/api/restart",
        &format!("127.0.0.1:{port}"),
        &format!("X-Bgwork-Token: {token}\r\n"),
        &format!(r#"{{"session":"test","id":"{with_env}"}}"#),
    );
    assert_ne!(status, 200, "{body}");
    assert!(
        body.contains("--env PATH") && body.contains("from a shell"),
        "{body}"
    );
    home.run(&["stop", &new, "--session", "other"]);
}

#[test]
fn issue26_v21_a_restart_from_the_strip_leaves_the_new_items_output_unread() {
    let home = Home::new();
    let served = ui(&home);
    let port = served["port"].as_u64().unwrap() as u16;
    let token = token(served["url"].as_str().unwrap());
    let id = home.start("echo first-line-of-the-run; sleep 60");
    let (status, _, body) = post(
        port,
        "/api/restart",
        &format!("127.0.0.1:{port}"),
        &format!("X-Bgwork-Token: {token}\r\n"),
        &format!(r#"{{"session":"test","id":"{id}"}}"#),
    );
    assert_eq!(status, 200, "{body}");
    let new: Value = serde_json::from_str(&body).unwrap();
    let new = new["id"].as_str().unwrap().to_string();
    // `--grep` does not move the read cursor.
    eventually(Duration::from_secs(10), || {
        home.run(&["read", &new, "--grep", "first-line"])
            .stdout
            .contains("first-line-of-the-run")
    });
    // The agent's first read of the new item has all it printed: the click read none.
    let read = home.json(&["read", &new]);
    let output = read["output"].as_str().unwrap_or_default();
    assert!(output.contains("first-line-of-the-run"), "{read}");
    home.run(&["stop", &new]);
}

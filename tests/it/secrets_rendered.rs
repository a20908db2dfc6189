//! Issue 22 item 2: a value split in the log by what a reader's rendering drops or
//! rewrites (colour codes from `grep --color=always`, the NULs of UTF-16, a `\r`
//! rewrite, backspaces, a cursor move) is masked in what each reader finally shows:
//! `read`, `--grep`, the start window, notice tails, `wait`, `--screen`, `--raw`, MCP
//! `output_base64` and the strip's routes.

use crate::mcp::Mcp;
use crate::util::{eventually, Home};
use base64::Engine;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const SECRET: &str = "hunter22-secret";

/// Every way a program or a terminal can put the value back together, one line each
/// (`h` joins a line already written with a later `\r` rewrite).
const SPLIT_JOB: &str = r#"A=${PW:0:6}; B=${PW:6}
printf 'a=%s\n' "$PW" | grep --color=always hunt
printf 'b=%s\n' "$PW" | iconv -t UTF-16LE
printf 'c=XXXXXX%s\rc=%s\n' "$B" "$A"
printf 'd=%sXX\b\b%s\n' "$A" "$B"
printf 'e=%sxxxxx\e[5D%s\n' "$A" "$B"
printf 'f=%s\e[1m' "$A"; sleep 0.3; printf '%s\e[0m\n' "$B"
printf 'g=%s\0%s\n' "$A" "$B"
printf 'h=XXXXXX%s' "$B"; sleep 0.3; printf '\rh=%s\n' "$A"
echo done"#;

/// What a terminal shows of `bytes` (an emulator of its own, not bgwork's renderer).
fn terminal(bytes: &[u8]) -> String {
    let mut parser = vt100::Parser::new(60, 200, 0);
    parser.process(bytes);
    parser.screen().contents()
}

/// `bytes` with escape sequences and control bytes dropped (a careless reader).
fn stripped(bytes: &[u8]) -> String {
    let escapes =
        regex::bytes::Regex::new(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|\][^\x07]*\x07|.)").unwrap();
    let text = escapes.replace_all(bytes, &b""[..]);
    let text: Vec<u8> = text
        .iter()
        .copied()
        .filter(|&b| b >= 0x20 || b == b'\n')
        .collect();
    String::from_utf8_lossy(&text).into_owned()
}

/// Asserts that `what` does not show the value (nor most of it).
fn assert_clean(what: &str, text: &str) {
    for piece in [SECRET, "hunter22"] {
        assert!(!text.contains(piece), "{what} shows {piece:?}:\n{text:?}");
    }
}

/// Asserts the same of raw bytes, read as they are, stripped, and on a terminal.
fn assert_clean_bytes(what: &str, bytes: &[u8]) {
    assert_clean(what, &String::from_utf8_lossy(bytes));
    assert_clean(&format!("{what} (stripped)"), &stripped(bytes));
    assert_clean(&format!("{what} (on a terminal)"), &terminal(bytes));
}

fn decode(base64: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(base64.as_str().unwrap_or(""))
        .unwrap()
}

/// The strip's address, and the header that carries its token.
fn strip(home: &Home) -> (u16, String) {
    let served = home.json(&["ui", "--no-open"]);
    let port = served["port"].as_u64().unwrap() as u16;
    let url = served["url"].as_str().unwrap();
    let token = url.split("token=").nth(1).unwrap();
    (port, format!("X-Bgwork-Token: {token}\r\n"))
}

/// The body of a GET on the strip (an event stream runs until its item ends).
fn strip_get(home: &Home, path: &str) -> String {
    let (port, auth) = strip(home);
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    answer
}

/// The bytes of every `output` event of the strip's stream of `id`, in order.
fn strip_stream_bytes(home: &Home, id: &str) -> Vec<u8> {
    let answer = strip_get(home, &format!("/api/output?session=test&id={id}&from=0"));
    assert!(answer.contains("event: end"), "{answer}");
    let mut bytes = Vec::new();
    for line in answer.lines() {
        if let Some(data) = line.strip_prefix("data: ") {
            if let Ok(event) = serde_json::from_str::<Value>(data) {
                bytes.extend(decode(&event["bytes"]));
            }
        }
    }
    bytes
}

#[test]
fn issue22_2_a_secret_split_by_the_rendering_reaches_no_reader() {
    let home = Home::new().with("PW", SECRET);
    let started = home.json(&[
        "start", "--secret", "PW", "--window", "10000", "--", SPLIT_JOB,
    ]);
    let window = started["output"].as_str().unwrap_or("");
    assert!(window.contains("done"), "{started}");
    assert_clean("the start window", window);
    assert!(window.contains("[secret PW]"), "{window}");
    // Another, whose end is told by a notice.
    let id = home.start_with(&["--secret", "PW", "--notify"], SPLIT_JOB);
    eventually(Duration::from_secs(20), || {
        home.item(&id)["state"] == "ended"
    });
    // (Before the read: a read that shows the end delivers its notice.)
    let mut notices = Value::Null;
    eventually(Duration::from_secs(20), || {
        notices = home.json(&["notices", "--peek"]);
        notices["notices"].as_array().is_some_and(|n| !n.is_empty())
    });
    assert_clean("the notice and its tail", &notices.to_string());

    let text = home.run(&["read", &id, "--all"]).stdout;
    assert_clean("read", &text);
    for line in ["a=", "b=", "c=", "d=", "e=", "f=", "g=", "h="] {
        assert!(
            text.lines()
                .any(|l| l.contains(line) && l.contains("[secret PW]")),
            "line {line} unmasked or lost:\n{text}"
        );
    }
    let grep = home.run(&["read", &id, "--grep", "="]).stdout;
    assert_clean("read --grep", &grep);
    assert!(grep.contains("[secret PW]"), "{grep}");

    let wait = home.run(&["wait", &id]).stdout;
    assert!(wait.contains("done"), "{wait}");
    assert_clean("wait", &wait);

    let raw = home.run(&["read", &id, "--raw", "--from", "0"]).raw_stdout;
    assert!(String::from_utf8_lossy(&raw).contains("done"));
    assert_clean_bytes("read --raw", &raw);
    let mut mcp = Mcp::start(&home);
    let (error, read) = mcp.call("read", json!({"id": id, "raw": true, "from": 0}));
    assert!(!error, "{read}");
    assert_clean_bytes("MCP output_base64", &decode(&read["output_base64"]));
    assert_clean("MCP read", &read.to_string());
    let streamed = strip_stream_bytes(&home, &id);
    assert_clean_bytes("the strip's stream", &streamed);
    let range = strip_get(
        &home,
        &format!("/api/read?session=test&id={id}&from=0&to=4096"),
    );
    let body: Value = serde_json::from_str(range.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_clean_bytes("the strip's read", &decode(&body["output_base64"]));
}

/// A pane's screen once it shows `done`.
fn screen_once_done(home: &Home, id: &str) -> String {
    let mut screen = String::new();
    eventually(Duration::from_secs(20), || {
        screen = home.json(&["read", id, "--screen"])["output"]
            .as_str()
            .unwrap()
            .to_string();
        screen.contains("done")
    });
    screen
}

#[test]
fn issue22_2_a_panes_screen_shows_no_secret_that_colours_or_cursor_moves_split() {
    let home = Home::new().with("PW", SECRET);
    let command = r#"A=${PW:0:6}; B=${PW:6}
printf 'x=%sxxxxx\e[5D%s\n' "$A" "$B"
printf 'y=%s\n' "$PW" | grep --color=always hunt
printf 'z=%s' "$A"; sleep 0.3; printf '\e[1m%s\e[0m\n' "$B"
echo done; sleep 30"#;
    let id = home.start_with(&["--pty", "--secret", "PW"], command);
    let screen = screen_once_done(&home, &id);
    assert_clean("read --screen", &screen);
    for line in ["x=", "y=", "z="] {
        assert!(
            screen
                .lines()
                .any(|l| l.contains(line) && l.contains("[secret PW]")),
            "line {line}:\n{screen}"
        );
    }
    let raw = home.run(&["read", &id, "--raw", "--from", "0"]).raw_stdout;
    assert_clean_bytes("a pane's raw bytes", &raw);
    assert_clean("a pane's read", &home.run(&["read", &id, "--all"]).stdout);
    let (port, auth) = strip(&home);
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let request = format!(
        "GET /api/screen?session=test&id={id} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}\r\n"
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&answer).contains("done") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert!(answer.contains("event: screen"), "{answer}");
    assert_clean("the strip's screen", &answer);
    home.run(&["stop", &id]);
}

#[test]
fn issue22_2_token_shapes_split_by_the_rendering_are_masked_in_raw_bytes_and_pages() {
    let home = Home::new();
    let token = format!("ghp_{}", "a1B2".repeat(9));
    let (head, tail) = token.split_at(10);
    let go = home.path().join("go");
    let command = format!(
        "printf 'one=%s\\e[31m%s\\e[0m\\n' {head} {tail}; \
         printf 'two=%s\\0%s\\n' {head} {tail}; \
         printf 'three=XXXXXXXXXX%s\\rthree=%s\\n' {tail} {head}; \
         printf 'four=%s\\e[1m' {head}; while [ ! -e {go} ]; do sleep 0.01; done; \
         printf '%s\\e[0m\\n'  {tail}; echo done",
        go = go.display()
    );
    let id = home.start(&command);
    // While the token's rest has not come, no raw page ends inside its start: pages
    // read one after another never put it together.
    let mut pages = Vec::new();
    let mut at = 0;
    eventually(Duration::from_secs(20), || {
        let page = home.json(&["read", &id, "--raw", "--from", &at.to_string()]);
        pages.extend(decode(&page["output_base64"]));
        at = page["to"].as_u64().unwrap();
        String::from_utf8_lossy(&pages).contains("three=")
    });
    assert!(!String::from_utf8_lossy(&pages).contains(head), "{pages:?}");
    std::fs::write(&go, "").unwrap();
    home.wait_end(&id);
    let page = home.json(&["read", &id, "--raw", "--from", &at.to_string()]);
    pages.extend(decode(&page["output_base64"]));
    let pages_text = String::from_utf8_lossy(&pages).into_owned();
    assert!(pages_text.contains("done"), "{pages_text:?}");
    for (what, bytes) in [
        ("raw pages", pages.clone()),
        (
            "read --raw",
            home.run(&["read", &id, "--raw", "--from", "0"]).raw_stdout,
        ),
        ("the strip's stream", strip_stream_bytes(&home, &id)),
    ] {
        for shown in [
            String::from_utf8_lossy(&bytes).into_owned(),
            stripped(&bytes),
            terminal(&bytes),
        ] {
            assert!(
                !shown.contains(&token),
                "{what} shows the token:\n{shown:?}"
            );
        }
        assert_eq!(
            terminal(&bytes).matches("[secret github token]").count(),
            4,
            "{what}: {:?}",
            terminal(&bytes)
        );
    }
    let mut mcp = Mcp::start(&home);
    let (error, read) = mcp.call("read", json!({"id": id, "raw": true, "from": 0}));
    assert!(!error, "{read}");
    let bytes = decode(&read["output_base64"]);
    assert!(!terminal(&bytes).contains(&token), "{read}");
    assert!(!stripped(&bytes).contains(&token), "{read}");
    assert!(!read.to_string().contains(&token), "{read}");
}

/// Found by attacking the merged whole: a terminal's saved cursor (`ESC 7`, `ESC 8`)
/// joined a value on a pane's screen.
#[test]
fn issue22_2_a_saved_cursor_joins_no_value_on_a_screen() {
    let home = Home::new().with("PW", SECRET);
    let command = r#"A=${PW:0:6}; B=${PW:6}
printf 's=\0337%sXXXX\0338\033[6C%s\n' "$A" "$B"
echo done; sleep 30"#;
    let id = home.start_with(&["--pty", "--secret", "PW"], command);
    let screen = screen_once_done(&home, &id);
    assert_clean("read --screen", &screen);
    assert!(
        screen
            .lines()
            .any(|l| l.contains("s=") && l.contains("[secret PW]")),
        "{screen}"
    );
    home.run(&["stop", &id]);
}

/// Found by attacking the merged whole: a token shape right after a letter or digit (a
/// URL-quoted `=` is `%3D`, a JSON string's `\n`) was not masked.
#[test]
fn issue22_2_a_token_after_a_letter_or_a_digit_is_masked() {
    let home = Home::new();
    let command = r#"G=ghp_abcdefghijklmnopqrstuvwxyz0123456789
echo "url=https://h/?a=1%26token%3D$G"
echo "{\"msg\":\"line\\n$G\"}"
echo "AWS_KEY%3DAKIAABCDEFGHIJ012345"
echo "x${G}x""#;
    let id = home.start_with(&[], command);
    eventually(Duration::from_secs(20), || {
        home.item(&id)["state"] == "ended"
    });
    let text = home.run(&["read", &id, "--all"]).stdout;
    assert!(!text.contains("abcdefghijklmnop"), "{text}");
    assert!(!text.contains("ABCDEFGHIJ012345"), "{text}");
    assert_eq!(text.matches("[secret").count(), 4, "{text}");
}

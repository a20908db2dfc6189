//! Issue 22: secrets that come back. Every matcher runs on the text a reader is shown
//! (item 1); a value's base64 at every alignment, its URL quoting and hex are masked
//! (item 3); overlapping values are masked as their union (item 4); a sub-agent's
//! report is masked whatever its size (item 5).

use crate::mcp::Mcp;
use crate::util::{eventually, Home};
use serde_json::{json, Value};
use std::time::Duration;

/// A token shape: `read` shows it as `[secret github token]`.
const TOKEN: &str = "ghp_Zq3vR8kLm2Xw9YtB4nHc7JpD1sFgA6eUoK0i";

/// Patterns that match only the token's own characters (or the start of one that is
/// still being written): with them, a binary search would recover the token.
const PROBES: [&str; 4] = [
    "token=ghp_[A-Za-z]",
    "ghp_Z",
    "[A-Za-z0-9]{30}",
    "partial=gh",
];

/// A job that prints the token on a line and the start of another on its unfinished
/// last line, then waits.
fn token_job(home: &Home) -> String {
    home.start(&format!(
        "echo 'token={TOKEN} ok'; printf 'partial=ghp_Ab'; exec sleep 60"
    ))
}

fn monitor(home: &Home, args: &[&str]) -> String {
    let mut all = vec!["monitor"];
    all.extend_from_slice(args);
    home.json(&all)["id"].as_str().unwrap().to_string()
}

#[test]
fn issue22_1_wait_until_matches_only_what_a_reader_is_shown() {
    let home = Home::new();
    let id = token_job(&home);
    // What a reader is shown matches, and the match is shown as a reader sees it.
    let shown = home.json(&["wait", &id, "--until", r"token=\[secret github token\] ok"]);
    assert_eq!(shown["reason"], "matched", "{shown}");
    assert_eq!(shown["match"], "token=[secret github token] ok", "{shown}");
    let partial = home.json(&["wait", &id, "--until", "^partial=", "--timeout", "20"]);
    assert_eq!(partial["match"], "partial=", "{partial}");
    for probe in PROBES {
        let reply = home
            .run(&["--json", "wait", &id, "--until", probe, "--timeout", "1"])
            .json();
        assert_eq!(reply["reason"], "timeout", "--until {probe:?}: {reply}");
        // Its tail is a reader's too: no token, nor the start of one being written.
        let tail = reply["tails"][&id].as_str().unwrap();
        assert!(tail.ends_with("partial=[secret token]"), "{reply}");
        assert!(!tail.contains("Zq3v") && !tail.contains("ghp_"), "{reply}");
    }

    let mut mcp = Mcp::start(&home);
    let (error, reply) = mcp.call(
        "wait",
        json!({"ids": [id], "until": r"token=\[secret github token\]", "timeout_s": 20}),
    );
    assert!(!error, "{reply}");
    assert_eq!(reply["reason"], "matched", "{reply}");
    for probe in PROBES {
        let (error, reply) = mcp.call("wait", json!({"ids": [id], "until": probe, "timeout_s": 1}));
        assert!(!error, "{reply}");
        assert_eq!(reply["reason"], "timeout", "MCP until {probe:?}: {reply}");
    }
    home.run(&["stop", &id]);
}

#[test]
fn issue22_1_monitor_waits_match_only_what_a_reader_is_shown() {
    let home = Home::new();
    let id = token_job(&home);
    let shown = monitor(
        &home,
        &[
            "wait",
            "--until-output",
            &id,
            r"token=\[secret github token\]",
        ],
    );
    let probes: Vec<String> = PROBES
        .iter()
        .map(|probe| {
            monitor(
                &home,
                &["wait", "--until-output", &id, probe, "--timeout", "1.5"],
            )
        })
        .take(3)
        .collect();
    let item = home.wait_end(&shown);
    assert_eq!(item["end"], "succeeded", "{item}");
    assert!(
        item["report"]
            .as_str()
            .unwrap()
            .contains("matched: token=[secret github token] ok"),
        "{item}"
    );
    for probe in probes {
        let item = home.wait_end(&probe);
        assert_eq!(item["end"], "failed", "a probe matched: {item}");
        assert!(!item["report"].to_string().contains("Zq3v"), "{item}");
    }
    home.run(&["stop", &id]);
}

#[test]
fn issue22_1_watches_and_grep_match_only_what_a_reader_is_shown() {
    let home = Home::new();
    let go = home.path().join("go");
    let key = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx7Zq\nAAKCAQhidden\n-----END RSA PRIVATE KEY-----";
    let command = format!(
        "while [ ! -e {} ]; do sleep 0.01; done; echo 'token={TOKEN} ok'; \
         printf '%s\\n' '{key}'; echo after",
        go.display()
    );
    let id = home.start(&command);
    let probe = monitor(
        &home,
        &[
            "watch",
            "--output",
            &id,
            "--regex",
            "ghp_[A-Za-z]|MIIE|AAKCAQ",
        ],
    );
    let shown = monitor(
        &home,
        &[
            "watch",
            "--output",
            &id,
            "--regex",
            "secret github token|after",
        ],
    );
    std::fs::write(&go, "").unwrap();
    home.wait_end(&id);
    let probe_item = home.wait_end(&probe);
    assert!(
        probe_item["report"]
            .as_str()
            .unwrap()
            .contains("0 lines matched"),
        "{probe_item}"
    );
    let shown_item = home.wait_end(&shown);
    assert!(
        shown_item["report"]
            .as_str()
            .unwrap()
            .contains("2 lines matched"),
        "{shown_item}"
    );
    let log = home.run(&["read", &shown, "--all"]).stdout;
    assert!(log.contains("token=[secret github token] ok"), "{log}");
    assert!(!log.contains("Zq3v"), "{log}");

    // read --grep finds the line as a reader is shown it, and nothing by the token.
    let found = home.json(&["read", &id, "--grep", r"token=\[secret github token\]"]);
    assert_eq!(found["matches"].as_array().unwrap().len(), 1, "{found}");
    for probe in ["ghp_Z", "MIIE", "AAKCAQ", "[A-Za-z0-9]{30}"] {
        let found = home.json(&["read", &id, "--grep", probe]);
        assert!(
            found["matches"].as_array().unwrap().is_empty(),
            "{probe}: {found}"
        );
    }
    let key_line = home.json(&["read", &id, "--grep", r"^\[secret private key\]$"]);
    // Each line of the key is shown as the marker, by `--grep` as by the scans.
    assert_eq!(
        key_line["matches"].as_array().unwrap().len(),
        4,
        "{key_line}"
    );
}

#[test]
fn issue22_1_the_port_in_use_scan_reads_what_a_reader_is_shown() {
    let home = Home::new();
    // The phrase inside a token is no phrase a reader sees; the phrase split by an
    // escape sequence is.
    let id = home.start(
        "echo 'x ghp_EADDRINUSEabcdefghijklmnopqrstuvwxyz012345 y'; \
         printf 'listen 127.0.0.1:18777: address already \\033[1min\\033[0m use\\n'; \
         exec sleep 60",
    );
    let mut notices: Vec<Value> = Vec::new();
    eventually(Duration::from_secs(20), || {
        let reply = home.json(&["notices"]);
        notices.extend(reply["notices"].as_array().cloned().unwrap_or_default());
        !notices.is_empty()
    });
    let notice = &notices[0];
    assert!(
        notice["text"].as_str().unwrap().contains("port 18777"),
        "{notice}"
    );
    assert_eq!(
        notice["tail"], "listen 127.0.0.1:18777: address already in use",
        "{notice}"
    );
    home.run(&["stop", &id]);
}

/// A password with characters every encoding changes (a space, `/`, `+`, `&`).
const PW: &str = "Tr0ub4dor&3 x/y+z";

#[test]
fn issue22_3_what_curl_base64_python_and_xxd_print_of_a_value_is_masked() {
    let home = Home::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let script = format!(
        r#"python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 & server=$!
for i in $(seq 200); do curl -s -o /dev/null http://127.0.0.1:{port}/ && break; sleep 0.05; done
for user in u us usr; do
  curl -sv -u "$user:$PW" -o /dev/null http://127.0.0.1:{port}/ 2>&1 | grep -i '^> authorization' | sed "s/^/auth[$user]: /"
done
kill $server
for pre in '' x xy; do printf '%s%s' "$pre" "$PW" | base64 -w0 | sed "s/^/b64[$pre]: /"; echo; done
for pre in '' x xy; do printf '%s%s' "$pre" "$PW" | basenc --base64url -w0 | sed "s/^/b64url[$pre]: /"; echo; done
python3 -c 'import os, urllib.parse as u
v = os.environ["PW"]
print("quote:", u.quote(v)); print("quote-strict:", u.quote(v, safe=""))
print("quote_plus:", u.quote_plus(v)); print("quote_plus-slash:", u.quote_plus(v, safe="/"))'
printf '%s' "$PW" | xxd -p | sed 's/^/hex: /'
printf '%s' "$PW" | xxd -p -u | sed 's/^/HEX: /'
echo end"#
    );
    let env = format!("PW={PW}");
    let id = home.start_with(&["--env", &env], &script);
    let item = home.wait_end(&id);
    assert_eq!(item["end"], "succeeded", "{item}");
    let text = home.run(&["read", &id, "--all"]).stdout;
    let labels = [
        "auth[u]",
        "auth[us]",
        "auth[usr]",
        "b64[]",
        "b64[x]",
        "b64[xy]",
        "b64url[]",
        "b64url[x]",
        "b64url[xy]",
        "quote",
        "quote-strict",
        "quote_plus",
        "quote_plus-slash",
        "hex",
        "HEX",
    ];
    for label in labels {
        let line = text
            .lines()
            .find(|line| line.starts_with(&format!("{label}: ")))
            .unwrap_or_else(|| panic!("no {label} line in:\n{text}"));
        assert!(
            line.contains("[secret PW]"),
            "{label} is not masked:\n{text}"
        );
        // What is left shown: the label, the encoded prefix (`Basic`, the user), and
        // at most a character or two on each side that mix in other bytes.
        let rest = line.replacen("[secret PW]", "", 1);
        let allowed = label.len() + 2 + if label.starts_with("auth") { 38 } else { 3 };
        assert!(rest.len() <= allowed, "{label} shows too much: {line}");
    }
    assert!(text.contains("\nend\n"), "{text}");
}

#[test]
fn issue22_4_overlapping_values_show_no_part_of_either() {
    let home = Home::new();
    let id = home.start_with(
        &["--env", "A=AAAAAAbbbbbb1234", "--env", "B=bbbbbb1234CCCCCC"],
        // Put together by the shell: a command line holding a value is refused.
        "echo 'x AAAAAA''bbbbbb1234CC''CCCC y'; echo 'a AAAAAA''bbbbbb1234 b bbbbbb''1234CCCCCC c'",
    );
    home.wait_end(&id);
    let text = home.run(&["read", &id, "--all"]).stdout;
    assert!(
        text.starts_with("x [secret A, B] y\na [secret A] b [secret B] c\n"),
        "{text}"
    );
}

/// The tail of the notice of a sub-agent that wrote its report with `write`.
fn report_notice(home: &Home, write: &str) -> String {
    let env = format!("TOKEN={PW}");
    let agent = home.json(&["agent", "start", "--env", &env, "--", write]);
    let id = agent["id"].as_str().unwrap().to_string();
    let mut notices = Value::Null;
    eventually(Duration::from_secs(60), || {
        notices = home.json(&["notices"]);
        notices["notices"].as_array().is_some_and(|n| !n.is_empty())
    });
    assert_eq!(notices["notices"][0]["item"], id.as_str(), "{notices}");
    notices["notices"][0]["tail"].as_str().unwrap().to_string()
}

#[test]
fn issue22_5_a_report_over_16_mib_reaches_the_parent_masked() {
    let home = Home::new();
    let tail = report_notice(
        &home,
        "{ head -c 17825792 /dev/zero | tr '\\0' x; echo; echo \"report: $TOKEN\"; } \
         > \"$BGWORK_REPORT\"",
    );
    assert!(tail.ends_with("report: [secret TOKEN]\n"), "{tail:.300}");
    assert!(!tail.contains(PW), "the report's notice shows the secret");
}

#[test]
fn issue22_5_a_report_cut_inside_a_token_shows_no_part_of_it() {
    let home = Home::new();
    // The notice shows the report's last 16 KiB, which begin 20 bytes into the token.
    let write = format!(
        "{{ printf '%s ' '{TOKEN}'; head -c {} /dev/zero | tr '\\0' y; }} > \"$BGWORK_REPORT\"",
        (16 << 10) + 20 - TOKEN.len() - 1
    );
    let tail = report_notice(&home, &write);
    assert!(tail.contains("yyyy"), "{tail:.300}");
    assert!(
        !tail.contains(&TOKEN[20..]),
        "the notice shows the token's end: {tail:.300}"
    );
    assert!(
        !tail.contains(&TOKEN[30..]),
        "the notice shows the token's end: {tail:.300}"
    );
}

#[test]
fn issue22_5_the_start_window_and_a_quiet_notice_show_no_start_of_a_token() {
    let home = Home::new();
    let started = home.json(&[
        "start",
        "--window",
        "3000",
        "--quiet-after",
        "1s",
        "--",
        "echo first; printf 'key=ghp_Ab'; exec sleep 60",
    ]);
    let output = started["output"].as_str().unwrap();
    assert!(output.starts_with("first\n"), "{started}");
    assert!(
        !output.contains("ghp_"),
        "the window shows a token's start: {started}"
    );
    let id = started["id"].as_str().unwrap().to_string();
    let mut notices: Vec<Value> = Vec::new();
    eventually(Duration::from_secs(20), || {
        let reply = home.json(&["notices"]);
        notices.extend(reply["notices"].as_array().cloned().unwrap_or_default());
        !notices.is_empty()
    });
    let tail = notices[0]["tail"].as_str().unwrap();
    assert!(tail.ends_with("key=[secret token]"), "{notices:?}");
    assert!(!tail.contains("ghp_"), "{notices:?}");
    home.run(&["stop", &id]);
}

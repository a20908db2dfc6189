//! Hostile tests of issue 15's features where they meet: secrets masking, `read --grep`,
//! port and quiet notices, guard rails, hooks.

use crate::util::Home;

/// A job that prints token shapes and a private key, and has ended.
fn tokens_job(home: &Home) -> String {
    let id = home.start(
        "echo ghp_abcdefghijklmnopqrstuvwxyz0123456789; \
         echo sk-abcdefghijklmnopqrstuvwx1234; \
         printf -- '-----BEGIN RSA PRIVATE KEY-----\\nMIIEabcdefKEYBODY\\n-----END RSA PRIVATE KEY-----\\n'; \
         echo after",
    );
    home.wait_end(&id);
    id
}

fn texts(reply: &serde_json::Value) -> String {
    reply["matches"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| {
            let mut all = vec![m["text"].as_str().unwrap_or_default().to_string()];
            for side in ["before", "after"] {
                for line in m[side].as_array().into_iter().flatten() {
                    all.push(line["text"].as_str().unwrap_or_default().to_string());
                }
            }
            all
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn hostile15_1_grep_shows_and_finds_no_token_shape() {
    let home = Home::new();
    let id = tokens_job(&home);
    // Every line shown (matches and context) has its tokens masked, as `read` does.
    let all = home.json(&["read", &id, "--grep", ".", "--context", "2"]);
    let shown = texts(&all);
    for token in ["ghp_abc", "sk-abc", "KEYBODY", "BEGIN RSA"] {
        assert!(!shown.contains(token), "grep shows {token}:\n{shown}");
    }
    assert!(shown.contains("[secret github token]"), "{shown}");
    assert!(shown.contains("after"), "{shown}");
    // A regex that matches only a hidden token finds nothing: a search is no oracle
    // that tells a token's characters one guess at a time.
    for guess in ["ghp_abc", "sk-abcdef", "KEYBODY"] {
        let reply = home.json(&["read", &id, "--grep", guess]);
        assert_eq!(reply["matches"], serde_json::json!([]), "{guess}: {reply}");
    }
    // The person may still see them.
    let plain = home.json(&["read", &id, "--grep", "ghp_abc", "--no-redact"]);
    assert!(texts(&plain).contains("ghp_abcdefghijklmnopqrstuvwxyz0123456789"));
}

#[test]
fn hostile15_2_port_in_use_notice_masks_token_shapes() {
    let home = Home::new();
    let id = home.start(
        "echo 'Error: listen EADDRINUSE: address already in use 127.0.0.1:47611 \
         sk-abcdefghijklmnopqrstuvwx1234'; sleep 30",
    );
    let shown = first_notices(&home);
    assert!(shown.contains("EADDRINUSE"), "{shown}");
    assert!(
        !shown.contains("sk-abcdef"),
        "the notice shows the token: {shown}"
    );
    assert!(shown.contains("[secret sk-"), "{shown}");
    home.run(&["stop", &id]);
}

#[test]
fn hostile15_3_grep_context_of_empty_lines_stays_within_max_bytes() {
    let home = Home::new();
    // 2,000 matches, each with 200 empty lines around it: 400 KB of log.
    let id = home.start("for i in $(seq 2000); do echo x; printf '%200s' '' | tr ' ' '\\n'; done");
    home.wait_end(&id);
    let run = home.run(&[
        "--json",
        "read",
        &id,
        "--grep",
        "x",
        "--context",
        "100",
        "--max-matches",
        "10000",
        "--max-bytes",
        "65536",
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    // Each empty line costs its fields: the reply stays near --max-bytes, and says
    // where to go on.
    assert!(
        run.stdout.len() < 4 * 65536,
        "a reply of {} bytes for --max-bytes 65536",
        run.stdout.len()
    );
    let reply = run.json();
    assert_eq!(reply["truncated"], true, "{}", &run.stdout[..200]);
    assert!(reply["next_from"].as_u64().is_some());
}

#[test]
fn hostile15_4_two_restarts_at_the_rate_limit_never_cost_a_running_item() {
    let home = Home::new().with("BGWORK_MAX_STARTS_PER_MINUTE", "3");
    // Each takes half a second to stop: both restarts pass the rate check before
    // either starts anything.
    let job = "trap 'sleep 0.5; exit 0' TERM; sleep 100 & wait";
    let a = home.start(job);
    let b = home.start(&format!("{job} # b"));
    let restarts: Vec<_> = [&a, &b]
        .iter()
        .map(|id| {
            home.command(&["--json", "restart", id, "--window", "0"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<_> = restarts
        .into_iter()
        .map(|child| child.wait_with_output().unwrap())
        .collect();
    // One restart may be refused by the rate (3 starts a minute), but then its item
    // still runs: two items run, whatever happened.
    let list = home.json(&["list"]);
    let running: Vec<_> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["state"] == "running" || i["state"] == "starting")
        .map(|i| i["id"].as_str().unwrap_or_default().to_string())
        .collect();
    let said: Vec<String> = outputs
        .iter()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .collect();
    assert_eq!(running.len(), 2, "running {running:?} after {said:?}");
    assert!(
        outputs.iter().any(|o| !o.status.success()),
        "the rate allowed both restarts: {said:?}"
    );
    for id in running {
        home.run(&["stop", &id]);
    }
}

#[test]
fn hostile15_5_grep_shows_no_token_cut_by_from_a_long_line_or_unfinished_output() {
    let home = Home::new();
    // A token at byte 8; a token across the 64 KiB piece boundary of a long line; an
    // unfinished token on the last line of a job that still runs.
    let id = home.start(
        "echo 'key ghp_abcdefghijklmnopqrstuvwxyz0123456789 end'; \
         printf 'x%.0s' $(seq 65510); echo ' ghp_bcdefghijklmnopqrstuvwxyz0123456789a tail'; \
         printf 'partial ghp_cdefghijklmnop'; sleep 30",
    );
    crate::util::eventually(std::time::Duration::from_secs(20), || {
        home.json(&["read", &id, "--grep", "partial"])["matches"]
            .as_array()
            .is_some_and(|m| !m.is_empty())
    });
    let from_inside = home.json(&["read", &id, "--grep", ".", "--from", "8"]);
    let all = home.json(&["read", &id, "--grep", "end|tail|partial"]);
    for (what, reply) in [("--from 8", from_inside), ("pieces", all)] {
        let shown = texts(&reply);
        for token in ["efghijklmnop", "cdefghijklmnop"] {
            assert!(!shown.contains(token), "{what} shows {token}: {shown:.300}");
        }
        assert!(shown.contains("[secret token]"), "{what}: {shown:.300}");
    }
    home.run(&["stop", &id]);
}

#[test]
fn hostile15_6_port_holder_of_another_session_is_named_without_its_token() {
    let home = Home::new();
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let server = format!("python3 -m http.server {port} --bind 127.0.0.1");
    let holder = home.json(&[
        "--session",
        "other",
        "start",
        "--window",
        "0",
        "--",
        &format!("GH=ghp_abcdefghijklmnopqrstuvwxyz0123456789 {server}"),
    ]);
    let holder = holder["id"].as_str().unwrap().to_string();
    crate::util::eventually(std::time::Duration::from_secs(20), || {
        let item = home.json(&["--session", "other", "list"]);
        item["items"][0]["listening"]
            .as_array()
            .is_some_and(|l| !l.is_empty())
    });
    let id = home.start(&format!("{server}; sleep 30"));
    let shown = first_notices(&home);
    assert!(shown.contains("of session other"), "{shown}");
    assert!(
        !shown.contains("ghp_abc"),
        "another session's token: {shown}"
    );
    home.run(&["stop", &id]);
    home.run(&["--session", "other", "stop", &holder]);
}

/// The session's first notices, taken (within 20 s), as JSON text.
fn first_notices(home: &Home) -> String {
    let mut notices = Vec::new();
    crate::util::eventually(std::time::Duration::from_secs(20), || {
        let reply = home.json(&["notices"]);
        notices.extend(reply["notices"].as_array().cloned().unwrap_or_default());
        !notices.is_empty()
    });
    serde_json::to_string(&notices).unwrap()
}

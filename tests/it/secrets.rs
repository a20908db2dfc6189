//! Issue 15 item 1: secrets never reach a reader or the disk in clear. A job's `--env`
//! and `--secret` values are masked in its log by its supervisor (also when a value is
//! split across two writes), so every reader (read, notices, wait, run, MCP, the hook)
//! sees `[secret NAME]`; token shapes are masked at every read unless `--no-redact`.

use crate::mcp::Mcp;
use crate::util::{eventually, Home};
use base64::Engine;
use serde_json::{json, Value};
use std::process::Stdio;
use std::time::Duration;

/// A secret with characters that URL-encoding and base64 change.
const SECRET: &str = "hunter2/very secret+42";
const FIRST_HALF: &str = "hunter2/very";

fn forms() -> Vec<String> {
    vec![
        SECRET.to_string(),
        FIRST_HALF.to_string(),
        base64::engine::general_purpose::STANDARD.encode(SECRET),
        "hunter2%2Fvery%20secret%2B42".to_string(),
    ]
}

/// Asserts that no form of the secret (nor its first half) is in `text`.
fn assert_clean(what: &str, text: &str) {
    for form in forms() {
        assert!(!text.contains(&form), "{what} shows {form:?}:\n{text}");
    }
}

fn log_of(home: &Home, id: &str, file: &str) -> Vec<u8> {
    let jobs = home.path().join("jobs");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&jobs).unwrap().flatten() {
        let record = std::fs::read_to_string(entry.path().join("job.json")).unwrap_or_default();
        let record: Value = serde_json::from_str(&record).unwrap_or(Value::Null);
        if record["id"] == id {
            found = std::fs::read(entry.path().join(file)).unwrap_or_default();
        }
    }
    found
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// A whole log read with `read --raw` in pages of 64 bytes, each from where the last
/// ended, until a page moves no further: the replies, in order.
fn raw_pages(home: &Home, id: &str) -> Vec<Value> {
    let (mut from, mut pages) = (0u64, Vec::new());
    loop {
        let page = home.json(&[
            "read",
            id,
            "--raw",
            "--from",
            &from.to_string(),
            "--max-bytes",
            "64",
        ]);
        let to = page["to"].as_u64().unwrap();
        pages.push(page);
        if to == from {
            return pages;
        }
        from = to;
    }
}

/// Feeds one hook event to `bgwork hook claude-code` for `session`; returns its output.
fn hook(home: &Home, session: &str) -> String {
    let mut command = home.command(&["hook", "claude-code"]);
    command.env_remove("BGWORK_SESSION");
    let event =
        json!({"session_id": session, "hook_event_name": "UserPromptSubmit", "prompt": "next?"});
    let output = crate::util::hook_output(command, &event);
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The job prints the secret's first half in the same write as `before`, waits for the
/// test's go, then prints its second half and the secret's encoded forms.
fn split_job(go: &std::path::Path) -> String {
    format!(
        "printf 'before\\nleak: {FIRST_HALF}'; while [ ! -e {go} ]; do sleep 0.01; done; \
         printf ' secret+42 after\\n'; echo \"whole: $TOKEN\"; \
         printf '%s' \"$TOKEN\" | base64; jq -rn --arg v \"$TOKEN\" '$v|@uri'; echo done",
        go = go.display()
    )
}

#[test]
fn issue15_1_an_env_secret_split_across_two_writes_reaches_no_reader_and_no_disk() {
    let session = "secret-session";
    let mut home = Home::new();
    home.session = session.to_string();
    let go = home.path().join("go");
    let env = format!("TOKEN={SECRET}");
    let id = home.start_with(&["--notify", "--env", &env], &split_job(&go));
    // `before` was in the same write as the first half: once a reader sees it, the
    // supervisor has taken that write in, and the half must not be shown.
    let mut seen = String::new();
    eventually(Duration::from_secs(20), || {
        seen.push_str(home.json(&["read", &id])["output"].as_str().unwrap());
        seen.contains("before")
    });
    assert_clean("a read while the half waits", &seen);
    std::fs::write(&go, "").unwrap();
    // The end's notice (not taken by a wait) carries the tail.
    let mut notices = Value::Null;
    eventually(Duration::from_secs(20), || {
        notices = home.json(&["notices", "--peek"]);
        notices["notices"].as_array().is_some_and(|n| !n.is_empty())
    });
    let tail = notices["notices"][0]["tail"].as_str().unwrap().to_string();
    assert!(tail.contains("done"), "{notices}");
    assert_clean("the notice's tail", &notices.to_string());
    assert!(tail.contains("whole: [secret TOKEN]"), "{tail}");
    // The hook delivers the same notice as context.
    let context = hook(&home, session);
    assert!(context.contains("[secret TOKEN]"), "{context}");
    assert_clean("the hook's context", &context);

    let text = home.run(&["read", &id, "--all"]).stdout;
    assert!(
        text.contains("leak: [secret TOKEN] after\nwhole: [secret TOKEN]\n[secret TOKEN]\n[secret TOKEN]\ndone"),
        "{text}"
    );
    let json = home.json(&["read", &id, "--all"]);
    assert_clean("read --json", &json.to_string());
    let raw = home.json(&["read", &id, "--raw", "--from", "0"]);
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(raw["output_base64"].as_str().unwrap())
        .unwrap();
    assert_clean("read --raw", &String::from_utf8_lossy(&bytes));
    assert_clean("read --raw --json", &raw.to_string());
    // A wait on the ended job repeats its end and last lines.
    let wait = home.run(&["wait", &id]);
    assert!(wait.stdout.contains("done"), "{}", wait.stdout);
    assert_clean("wait", &wait.stdout);
    // The log on disk holds the masked text only, and no raw copy is kept.
    let log = log_of(&home, &id, "output.log");
    assert!(contains(&log, "[secret TOKEN]"));
    assert_clean("the log on disk", &String::from_utf8_lossy(&log));
    assert!(log_of(&home, &id, "output.raw.log").is_empty());
    // Its offsets are those of the masked text.
    assert_eq!(json["to"].as_u64().unwrap(), log.len() as u64);
    // Nor is the value recorded anywhere in the home.
    let mut files = vec![home.path().join("work.db")];
    for entry in std::fs::read_dir(home.path().join("jobs"))
        .unwrap()
        .flatten()
    {
        for file in std::fs::read_dir(entry.path()).unwrap().flatten() {
            files.push(file.path());
        }
    }
    for file in files {
        let bytes = std::fs::read(&file).unwrap_or_default();
        assert!(
            !contains(&bytes, SECRET),
            "{} holds the secret",
            file.display()
        );
    }
}

#[test]
fn issue15_1_wait_until_and_run_and_mcp_show_the_secret_masked() {
    let home = Home::new();
    let env = format!("TOKEN={SECRET}");
    let go = home.path().join("go");
    let command = format!(
        "echo \"login with $TOKEN\"; while [ ! -e {} ]; do sleep 0.01; done",
        go.display()
    );
    let id = home.start_with(&["--env", &env], &command);
    let wait = home.json(&["wait", &id, "--until", "login", "--timeout", "20"]);
    assert_eq!(wait["reason"], "matched", "{wait}");
    assert_eq!(wait["match"], "login with [secret TOKEN]", "{wait}");
    std::fs::write(&go, "").unwrap();
    home.wait_end(&id);

    let run = home.run(&["run", "--env", &env, "--", "echo \"run: $TOKEN\""]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("run: [secret TOKEN]"), "{}", run.stdout);
    assert_clean("run's stream", &run.stdout);

    let mut mcp = Mcp::start(&home);
    let (error, read) = mcp.call("read", json!({"id": id, "all": true}));
    assert!(!error, "{read}");
    assert!(
        read["output"].as_str().unwrap().contains("[secret TOKEN]"),
        "{read}"
    );
    assert_clean("MCP read", &read.to_string());
    // A model cannot ask to see token shapes.
    let (error, _) = mcp.call("read", json!({"id": id, "no_redact": true}));
    assert!(error, "no_redact is the person's, not the model's");
}

#[test]
fn issue15_1_mcp_secrets_come_from_the_servers_environment() {
    let home = Home::new().with("MCP_TOKEN", SECRET);
    let mut mcp = Mcp::start(&home);
    let (error, started) = mcp.call(
        "start",
        json!({"command": "echo \"mcp: $MCP_TOKEN\"", "secrets": ["MCP_TOKEN"], "window_ms": 5000}),
    );
    assert!(!error, "{started}");
    assert!(
        started["output"]
            .as_str()
            .unwrap()
            .contains("mcp: [secret MCP_TOKEN]"),
        "{started}"
    );
    assert_clean("MCP start", &started.to_string());
    let (error, ran) = mcp.call(
        "run",
        json!({"command": "echo \"again: $MCP_TOKEN\"", "secrets": ["MCP_TOKEN"]}),
    );
    assert!(!error, "{ran}");
    assert!(
        ran.to_string().contains("again: [secret MCP_TOKEN]"),
        "{ran}"
    );
    assert_clean("MCP run", &ran.to_string());
    let (error, refused) = mcp.call(
        "start",
        json!({"command": "true", "secrets": ["NOT_IN_THE_SERVERS_ENV"]}),
    );
    assert!(error, "{refused}");
    assert!(
        refused.to_string().contains("NOT_IN_THE_SERVERS_ENV"),
        "{refused}"
    );
}

#[test]
fn issue15_1_a_secret_from_the_callers_environment_is_masked_and_short_ones_refused() {
    let home = Home::new().with("DEPLOY_KEY", SECRET).with("PIN", "ab");
    let id = home.start_with(&["--secret", "DEPLOY_KEY"], "echo \"key=$DEPLOY_KEY\"");
    home.wait_end(&id);
    let text = home.run(&["read", &id, "--all"]).stdout;
    assert!(text.contains("key=[secret DEPLOY_KEY]"), "{text}");
    assert_clean("read", &text);
    // The name is recorded, the value never.
    assert_eq!(home.item(&id)["env_names"], json!(["DEPLOY_KEY"]));

    let (code, kind, message) = home.error(&["start", "--secret", "PIN", "--", "true"]);
    assert_eq!((code, kind.as_str()), (2, "bad_request"));
    assert!(message.contains("shorter than 4 bytes"), "{message}");
    let (_, _, message) = home.error(&["start", "--secret", "NOT_SET_ANYWHERE", "--", "true"]);
    assert!(message.contains("--secret NOT_SET_ANYWHERE"), "{message}");
    // Short --env values (a port, a flag) are not secrets: left as they are.
    let id = home.start_with(&["--env", "PORT=3000"], "echo \"port $PORT\"");
    home.wait_end(&id);
    assert!(home
        .run(&["read", &id, "--all"])
        .stdout
        .contains("port 3000"));
}

#[test]
fn issue15_1_pages_of_a_read_never_cut_a_secret_and_keep_raw_log_keeps_it_on_disk() {
    let home = Home::new();
    let env = format!("TOKEN={SECRET}");
    // The secret straddles byte 64, where the first 64-byte page ends.
    let command = format!("printf '%s' {}; echo \"$TOKEN\"; echo end", "x".repeat(55));
    let id = home.start_with(&["--env", &env, "--keep-raw-log"], &command);
    home.wait_end(&id);
    let mut all = Vec::new();
    for page in raw_pages(&home, &id) {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(page["output_base64"].as_str().unwrap())
            .unwrap();
        assert_clean("a page", &String::from_utf8_lossy(&bytes));
        all.extend_from_slice(&bytes);
    }
    let all = String::from_utf8(all).unwrap();
    assert_eq!(all, format!("{}[secret TOKEN]\nend\n", "x".repeat(55)));
    for max in ["64", "80"] {
        let text = home.run(&["read", &id, "--all", "--max-bytes", max]).stdout;
        assert_clean("a clipped read", &text);
    }
    // --keep-raw-log: the unmasked bytes are on disk beside the masked log.
    let raw = log_of(&home, &id, "output.raw.log");
    assert!(contains(&raw, SECRET), "{}", String::from_utf8_lossy(&raw));
    assert_clean(
        "the log",
        &String::from_utf8_lossy(&log_of(&home, &id, "output.log")),
    );
}

#[test]
fn issue15_1_token_shapes_are_masked_by_default_and_shown_with_no_redact() {
    let home = Home::new();
    let token = format!("ghp_{}", "a1B2".repeat(9));
    let command = format!("echo 'token: {token}'; echo AKIAABCDEFGHIJKLMNOP");
    let id = home.start_with(&["--notify"], &command);
    let mut notices = Value::Null;
    eventually(Duration::from_secs(20), || {
        notices = home.json(&["notices"]);
        notices["notices"].as_array().is_some_and(|n| !n.is_empty())
    });
    assert!(!notices.to_string().contains(&token), "{notices}");
    let text = home.run(&["read", &id, "--all"]).stdout;
    assert!(text.contains("token: [secret github token]"), "{text}");
    assert!(text.contains("[secret AKIA…]"), "{text}");
    assert!(!text.contains(&token));
    let shown = home.run(&["read", &id, "--all", "--no-redact"]).stdout;
    assert!(shown.contains(&token), "{shown}");
    assert!(shown.contains("AKIAABCDEFGHIJKLMNOP"), "{shown}");
    let raw = home.json(&["read", &id, "--raw", "--from", "0"]);
    assert!(!raw.to_string().contains(&token), "{raw}");
    // The disk keeps what the job wrote: shapes are masked at reading.
    assert!(contains(&log_of(&home, &id, "output.log"), &token));
}

#[test]
fn issue15_1_a_job_without_secrets_is_byte_exact() {
    let home = Home::new();
    let data = home.path().join("data.bin");
    let bytes: Vec<u8> = (0..200_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&data, &bytes).unwrap();
    let id = home.start_with(&[], &format!("cat {}", data.display()));
    home.wait_end(&id);
    let raw = home.json(&["read", &id, "--raw", "--from", "0"]);
    let read = base64::engine::general_purpose::STANDARD
        .decode(raw["output_base64"].as_str().unwrap())
        .unwrap();
    assert_eq!(read, bytes);
    assert_eq!(log_of(&home, &id, "output.log"), bytes);
}

#[test]
fn issue15_1_a_pane_with_a_secret_shows_it_masked() {
    let home = Home::new();
    let env = format!("TOKEN={SECRET}");
    let id = home.start_with(&["--pty", "--env", &env], "echo \"pane: $TOKEN\"; echo fin");
    home.wait_end(&id);
    let text = home.run(&["read", &id, "--all"]).stdout;
    assert!(text.contains("pane: [secret TOKEN]"), "{text}");
    assert_clean("a pane's read", &text);
    let screen = home.run(&["read", &id, "--screen"]).stdout;
    assert_clean("a pane's screen", &screen);
    assert_clean(
        "a pane's log",
        &String::from_utf8_lossy(&log_of(&home, &id, "output.log")),
    );
}

#[test]
fn issue15_1_after_a_daemon_restart_the_log_stays_masked() {
    let home = Home::new();
    let env = format!("TOKEN={SECRET}");
    let go = home.path().join("go");
    let command = format!(
        "echo \"a: $TOKEN\"; while [ ! -e {} ]; do sleep 0.01; done; printf 'b: %s\\n' \"$TOKEN\"",
        go.display()
    );
    let id = home.start_with(&["--env", &env], &command);
    eventually(Duration::from_secs(20), || {
        home.run(&["read", &id, "--all"]).stdout.contains("a: ")
    });
    home.kill_daemon();
    home.start_daemon();
    std::fs::write(&go, "").unwrap();
    home.wait_end(&id);
    let text = home.run(&["read", &id, "--all"]).stdout;
    assert!(
        text.contains("a: [secret TOKEN]\nb: [secret TOKEN]"),
        "{text}"
    );
    assert_clean("a read after a restart", &text);
}

#[test]
fn issue15_1_a_token_cut_by_a_page_or_a_write_is_not_shown_in_pieces() {
    let home = Home::new();
    let body = "a1B2".repeat(9);
    let token = format!("ghp_{body}");
    // Pages of 64 bytes: the token straddles the first page's end.
    let command = format!("printf '%s ' {}; echo {token}; echo end", "x".repeat(49));
    let id = home.start_with(&[], &command);
    home.wait_end(&id);
    let pages: Vec<String> = raw_pages(&home, &id)
        .iter()
        .map(|page| page["output"].as_str().unwrap().to_string())
        .collect();
    for page in &pages {
        assert!(!page.contains("a1B2a1B2"), "{pages:?}");
    }
    assert_eq!(
        pages.concat(),
        format!("{} [secret github token]\nend\n", "x".repeat(49))
    );
    // A read that starts inside the token shows its rest as one marker.
    let inside = home.json(&["read", &id, "--from", "60"]);
    assert_eq!(inside["output"], "[secret token]\nend\n", "{inside}");

    // The elided middle of a clipped read cuts no token either.
    for command in [
        format!(
            "printf '%s ' {}; echo {token} {}",
            "x".repeat(20),
            "y".repeat(100)
        ),
        format!("printf '%s ' {}; echo {token}", "x".repeat(100)),
    ] {
        let id = home.start_with(&[], &command);
        home.wait_end(&id);
        let text = home
            .run(&["read", &id, "--all", "--max-bytes", "64"])
            .stdout;
        assert!(text.contains("bytes not shown"), "{text}");
        assert!(
            !text.contains("a1B2a1B2") && !text.contains("ghp_"),
            "{text}"
        );
    }

    // A running job wrote half a token: reads by cursor show neither half.
    let go = home.path().join("go");
    let command = format!(
        "printf 'key: ghp_{}'; while [ ! -e {} ]; do sleep 0.01; done; printf '{}\\n'",
        &body[..12],
        go.display(),
        &body[12..]
    );
    let id = home.start_with(&[], &command);
    let mut seen = String::new();
    eventually(Duration::from_secs(20), || {
        seen.push_str(home.json(&["read", &id])["output"].as_str().unwrap());
        seen.contains("key: ")
    });
    std::fs::write(&go, "").unwrap();
    home.wait_end(&id);
    seen.push_str(home.json(&["read", &id])["output"].as_str().unwrap());
    assert_eq!(seen, "key: [secret github token]\n");
}

#[test]
fn issue15_1_run_streams_no_half_of_a_token_written_in_two_parts() {
    use std::io::Read;
    let home = Home::new();
    let body = "a1B2".repeat(9);
    let go = home.path().join("go");
    let command = format!(
        "printf 'k: ghp_{}'; while [ ! -e {} ]; do sleep 0.01; done; printf '{}\\n'",
        &body[..12],
        go.display(),
        &body[12..]
    );
    let mut child = home
        .command(&["run", "--timeout", "30", "--", &command])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let (sender, received) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        let mut all = Vec::new();
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
            let _ = sender.send(String::from_utf8_lossy(&all).into_owned());
        }
        String::from_utf8_lossy(&all).into_owned()
    });
    // Once `k: ` was streamed, the half token had been written with it.
    let mut so_far = String::new();
    while !so_far.contains("k: ") {
        so_far = received
            .recv_timeout(Duration::from_secs(20))
            .expect("run streams its first output");
    }
    std::fs::write(&go, "").unwrap();
    assert!(child.wait().unwrap().success());
    let all = reader.join().unwrap();
    assert!(!so_far.contains("ghp_"), "{so_far}");
    assert!(all.contains("k: [secret github token]\n"), "{all}");
    assert!(!all.contains(&body[..8]), "{all}");
}

#[test]
fn issue15_1_a_private_key_read_in_small_pages_shows_no_line_of_it() {
    let home = Home::new();
    let key_file = home.path().join("key.pem");
    let mut key = String::from("before\n-----BEGIN PRIVATE KEY-----\n");
    for line in 0..40 {
        key.push_str(&format!("KEYBODY{line:02}{}\n", "Qx7".repeat(18)));
    }
    key.push_str("-----END PRIVATE KEY-----\nafter\n");
    std::fs::write(&key_file, &key).unwrap();
    let id = home.start_with(&[], &format!("cat {}", key_file.display()));
    home.wait_end(&id);
    for raw in [true, false] {
        let mut from = 0u64;
        let mut shown = String::new();
        loop {
            let from_text = from.to_string();
            let mut args = vec!["read", &id, "--from", &from_text, "--max-bytes", "64"];
            if raw {
                args.push("--raw");
            }
            let page = home.json(&args);
            let output = page["output"].as_str().unwrap();
            assert!(
                !output.contains("KEYBODY"),
                "raw {raw}, from {from}: {output}"
            );
            shown.push_str(output);
            let to = page["to"].as_u64().unwrap();
            if to == from || !raw {
                // A text read goes to the end at once (clipped): one is enough.
                break;
            }
            from = to;
        }
        assert!(
            shown.contains("before") && shown.contains("after"),
            "{shown}"
        );
    }
    // Text reads starting anywhere inside the key show none of it.
    for from in [100u64, 700, 1500, 2000] {
        let page = home.json(&[
            "read",
            &id,
            "--from",
            &from.to_string(),
            "--max-bytes",
            "64",
        ]);
        let output = page["output"].as_str().unwrap();
        assert!(!output.contains("KEYBODY"), "from {from}: {output}");
    }
}

#[test]
fn issue15_1_a_secret_in_every_line_at_full_speed_is_masked_every_time() {
    let home = Home::new();
    let env = format!("TOKEN={SECRET}");
    // 60,000 lines as fast as awk writes them: the secret crosses many pipe reads.
    let command = "awk -v t=\"$TOKEN\" 'BEGIN { for (i = 0; i < 60000; i++) \
                   printf \"%d %s %s\\n\", i, t, substr(\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\", 1, i % 31) }'";
    let id = home.start_with(&["--env", &env], command);
    home.wait_end(&id);
    let log = String::from_utf8(log_of(&home, &id, "output.log")).unwrap();
    assert_eq!(log.lines().count(), 60_000);
    assert_eq!(log.matches("[secret TOKEN]").count(), 60_000);
    assert_clean("the log", &log);
}

#[test]
fn issue15_1_thousands_of_secrets_are_masked_and_too_many_refused() {
    let home = Home::new();
    let values: Vec<String> = (0..3000).map(|i| format!("value-{i:05}-of-many")).collect();
    let mut args: Vec<String> = Vec::new();
    for (i, value) in values.iter().enumerate() {
        args.push("--env".into());
        args.push(format!("S{i}={value}"));
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let id = home.start_with(
        &refs,
        // Put together by the shell: a command line holding a value is refused.
        "echo \"$S0 $S1234 $S2999\"; echo value-00042\"\"-of-many",
    );
    home.wait_end(&id);
    let text = home.run(&["read", &id, "--all"]).stdout;
    assert!(
        text.contains("[secret S0] [secret S1234] [secret S2999]\n[secret S42]"),
        "{text}"
    );
    let mut args = vec!["start".to_string()];
    for i in 0..10_001 {
        args.push("--env".into());
        args.push(format!("V{i}=value-{i:06}"));
    }
    args.extend(["--".into(), "true".into()]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (_, kind, message) = home.error(&refs);
    assert_eq!(kind, "bad_request");
    assert!(message.contains("at most 10000"), "{message}");
}

#[test]
fn issue15_1_restart_masks_a_short_secret_again() {
    let home = Home::new().with("PIN6", "4x9q2z");
    let id = home.start_with(&["--secret", "PIN6"], "echo \"pin $PIN6\"");
    home.wait_end(&id);
    assert!(home
        .run(&["read", &id, "--all"])
        .stdout
        .contains("pin [secret PIN6]"));
    let again = home.json(&["restart", &id, "--window", "0"]);
    let again = again["id"].as_str().unwrap().to_string();
    home.wait_end(&again);
    let text = home.run(&["read", &again, "--all"]).stdout;
    assert!(text.contains("pin [secret PIN6]"), "{text}");
    assert!(!text.contains("4x9q2z"), "{text}");
}

#[test]
fn issue15_1_a_log_of_many_unclosed_private_keys_reads_in_linear_time() {
    let home = Home::new();
    let file = home.path().join("keys.txt");
    let line = "-----BEGIN PRIVATE KEY----- sk-abc123abc123abc123abc123\n";
    std::fs::write(&file, line.repeat(20_000)).unwrap();
    let id = home.start_with(&[], &format!("cat {}", file.display()));
    home.wait_end(&id);
    let began = std::time::Instant::now();
    let read = home.json(&["read", &id, "--all", "--max-bytes", "4000000"]);
    assert_eq!(read["output"], "[secret private key]");
    assert!(
        began.elapsed() < Duration::from_secs(30),
        "{:?}",
        began.elapsed()
    );
}

#[test]
fn issue15_1_a_long_repetitive_secret_does_not_hold_up_its_job() {
    let home = Home::new().with("LONG_SECRET", &"ab".repeat(4096));
    let began = std::time::Instant::now();
    let id = home.start_with(
        &["--secret", "LONG_SECRET"],
        "yes abababab | tr -d '\\n' | head -c 1000000; echo; echo \"$LONG_SECRET\"",
    );
    home.wait_end(&id);
    assert!(
        began.elapsed() < Duration::from_secs(20),
        "{:?}",
        began.elapsed()
    );
    let text = home
        .run(&["read", &id, "--all", "--max-bytes", "100000"])
        .stdout;
    assert!(text.contains("[secret LONG_SECRET]"), "{}", &text[..200]);
    assert!(!text.contains(&"ab".repeat(4096)), "{}", &text[..200]);
    assert!(
        text.contains("\n[secret LONG_SECRET]\n"),
        "{}",
        &text[text.len() - 200..]
    );
    let (_, _, message) = home.error(&[
        "start",
        "--env",
        &format!("HUGE={}", "x".repeat(9000)),
        "--secret",
        "HUGE",
        "--",
        "true",
    ]);
    assert!(message.contains("up to 8192 bytes"), "{message}");
}

#[test]
fn issue15_1_a_job_that_ends_in_the_middle_of_its_secret_shows_no_part_of_it() {
    let home = Home::new();
    let env = format!("TOKEN={SECRET}");
    let id = home.start_with(&["--env", &env], &format!("printf 'cut: {FIRST_HALF}'"));
    home.wait_end(&id);
    let text = home.run(&["read", &id, "--all"]).stdout;
    assert!(text.starts_with("cut: [secret TOKEN]"), "{text}");
    assert_clean("a read", &text);
    // Stopped while the start of the secret was held back: the same.
    let id = home.start_with(
        &["--env", &env],
        &format!("printf 'stopped: {FIRST_HALF}'; exec sleep 100"),
    );
    eventually(Duration::from_secs(20), || {
        log_of(&home, &id, "output.log").starts_with(b"stopped: ")
    });
    home.json(&["stop", &id]);
    let text = home.run(&["read", &id, "--all"]).stdout;
    assert!(text.starts_with("stopped: [secret TOKEN]"), "{text}");
    assert_clean("a read", &text);
}

#[test]
fn issue15_1_a_sub_agents_report_reaches_its_parent_masked() {
    let home = Home::new();
    let env = format!("TOKEN={SECRET}");
    let agent = home.json(&[
        "agent",
        "start",
        "--env",
        &env,
        "--",
        "printf 'report: %s\\n' \"$TOKEN\" > \"$BGWORK_REPORT\"",
    ]);
    let id = agent["id"].as_str().unwrap().to_string();
    let mut notices = Value::Null;
    eventually(Duration::from_secs(20), || {
        notices = home.json(&["notices"]);
        notices["notices"].as_array().is_some_and(|n| !n.is_empty())
    });
    let tail = notices["notices"][0]["tail"].as_str().unwrap();
    assert_eq!(notices["notices"][0]["item"], id.as_str(), "{notices}");
    assert!(tail.contains("report: [secret TOKEN]"), "{notices}");
    assert_clean("the report's notice", &notices.to_string());
    let item = home.item(&id);
    assert_clean("the sub-agent's item", &item.to_string());
}

#[test]
fn a_secret_written_into_the_command_or_the_name_is_refused_not_recorded() {
    // Found by a hostile tester: `start --secret TOK -- "echo $TOK"` (the shell expands
    // it) put the value in the command, shown by `list` and kept in `job.json`.
    let home = Home::new().with("DEPLOY_KEY", SECRET);
    for args in [
        vec![
            "start",
            "--secret",
            "DEPLOY_KEY",
            "--",
            &format!("echo {SECRET}"),
        ],
        vec![
            "start",
            "--secret",
            "DEPLOY_KEY",
            "--name",
            SECRET,
            "--",
            "true",
        ],
    ] {
        let (code, kind, message) = home.error(&args);
        assert_eq!((code, kind.as_str()), (2, "bad_request"), "{message}");
        assert!(message.contains("secret DEPLOY_KEY"), "{message}");
        assert!(!message.contains(SECRET), "{message}");
    }
    let listed = home.run(&["list", "--all"]).stdout;
    assert!(!listed.contains(SECRET), "{listed}");
    assert_clean("list", &listed);
}

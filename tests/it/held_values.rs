//! A value that is masked in the output may not be in what is recorded and shown of an
//! item (its command line, `--name`, an `--after` pattern) in any form the output masks.

use crate::util::Home;
use base64::Engine;

const PW: &str = "hunter2-Very-Secret-99";

fn refused(home: &Home, args: &[&str]) -> String {
    let mut all = vec!["start", "--window", "0"];
    all.extend_from_slice(args);
    let run = home.run(&all);
    assert_eq!(run.code, 2, "started: {}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("nothing was started") && !run.stderr.contains(PW),
        "{}",
        run.stderr
    );
    run.stderr
}

#[test]
fn issue26_s1_an_encoded_secret_in_a_command_line_name_or_pattern_is_refused() {
    let home = Home::new().with("PW", PW);
    let b64 = base64::engine::general_purpose::STANDARD.encode(PW);
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("user:{PW}"));
    let hex: String = PW.bytes().map(|b| format!("{b:02x}")).collect();
    let url = "EnvValue/98765%20x";
    for command in [
        format!("echo curl -H 'Authorization: Basic {basic}' https://x"),
        format!("echo {hex} | xxd -r -p"),
        format!("echo {b64} | base64 -d"),
    ] {
        let why = refused(&home, &["--secret", "PW", "--", &command]);
        assert!(why.contains("command line"), "{why}");
    }
    let why = refused(
        &home,
        &["--env", "E=EnvValue/98765 x", "--", &format!("echo {url}")],
    );
    assert!(why.contains("command line"), "{why}");
    let why = refused(&home, &["--secret", "PW", "--name", &b64, "--", "true"]);
    assert!(why.contains("--name"), "{why}");
    // The awaited item's secret, base64 in an output pattern.
    let awaited = home.start_with(&["--secret", "PW"], "sleep 5; echo \"$PW\" | base64");
    let why = refused(
        &home,
        &[
            "--after",
            &format!("{awaited}:output {b64}"),
            "--",
            "echo matched",
        ],
    );
    assert!(why.contains("--after output pattern"), "{why}");
    let after = std::fs::read_dir(home.path().join("jobs")).unwrap().count();
    assert_eq!(after, 1, "only the awaited job has a folder");
    // Nothing of it was kept.
    let listed = home.json(&["list", "--all"]).to_string();
    assert!(
        !listed.contains(&b64) && !listed.contains(&basic),
        "{listed}"
    );
    // A command naming the variable starts.
    home.start_with(&["--secret", "PW"], "echo \"$PW\" | base64 >/dev/null");
}

#[test]
fn issue26_v2_a_secret_in_regex_syntax_or_an_awaited_env_value_in_a_pattern_is_refused() {
    let home = Home::new().with("PW", PW);
    let awaited = home.start_with(&["--secret", "PW"], "sleep 30");
    let escaped = PW.replace('-', "\\-");
    let dotted = PW.replacen('n', ".", 1);
    let classed = PW.replace("99", "[0-9]{2}");
    for pattern in [
        escaped,
        dotted,
        classed,
        format!("(?i){}", PW.to_uppercase()),
    ] {
        let why = refused(
            &home,
            &[
                "--after",
                &format!("{awaited}:output {pattern}"),
                "--",
                "true",
            ],
        );
        assert!(why.contains("--after output pattern"), "{pattern}: {why}");
        assert!(why.contains("secret PW"), "{why}");
    }
    // An --env value of the awaited item, long enough to be masked, given again.
    let token = "EnvToken-0123456789";
    let other = home.start_with(&["--env", &format!("TOKEN={token}")], "sleep 30");
    let why = refused(
        &home,
        &[
            "--env",
            &format!("TOKEN={token}"),
            "--after",
            &format!("{other}:output token {}", token.replace('-', ".")),
            "--",
            "true",
        ],
    );
    assert!(why.contains("--env TOKEN"), "{why}");
    // A pattern of the value's shape only, or of the text around it, is no value.
    for pattern in ["\\w+-\\w+-\\w+-\\d+", "ready", ".*"] {
        let waiting = home.start_with(
            &[
                "--env",
                &format!("TOKEN={token}"),
                "--after",
                &format!("{awaited}:output {pattern}"),
            ],
            "true",
        );
        home.json(&["stop", &waiting]);
    }
    let listed = home.json(&["list", "--all"]).to_string();
    assert!(!listed.contains("hunter"), "{listed}");
    assert!(!listed.contains("unter"), "{listed}");
}

#[test]
fn issue26_v8_a_secret_spelled_in_any_script_or_in_classes_or_stars_is_refused() {
    let ru = "пароль секрет";
    let punct = "!@#$%^&*()+=";
    let pw = "hunter2xyz";
    let home = Home::new()
        .with("RU", ru)
        .with("PUN", punct)
        .with("PW2", pw);
    let awaited = home.start_with(
        &["--secret", "RU", "--secret", "PUN", "--secret", "PW2"],
        "sleep 30",
    );
    let padded = format!("{}hunt.r2xyz", "(a*b*)".repeat(300));
    for pattern in [
        "(?i)ПАРОЛЬ СЕКРЕТ",
        "пар.ль секрет",
        "пароль\\sсекрет",
        "[!]@#\\$%\\^&\\*\\(\\)\\+=",
        "[hi][uv][no][tu][ef][rs][23][xy][yz][za]",
        "h*u*n*t*e*r*2*x*y*z*",
        "\\w*unter2xyz",
        "hunter2\\b{start}xyz",
        "(hunter2)xyz",
        "(hunt)(er2x)(yz)",
        "(hunter2|zz)xyz",
        "(?:hunter2)+xyz",
        "(?i)(HUNTER2)XYZ",
        "hz?z?uz?z?nz?z?tz?z?ez?z?rz?z?2z?z?xz?z?yz?z?z",
        "h(?:q)?(?:q)?(?:q)?u(?:q)?(?:q)?(?:q)?n(?:q)?(?:q)?(?:q)?ter2xyz",
        "hunter2\\b{end-half}xyz",
        padded.as_str(),
    ] {
        let run = home.run(&[
            "start",
            "--window",
            "0",
            "--after",
            &format!("{awaited}:output {pattern}"),
            "--",
            "true",
        ]);
        assert_eq!(run.code, 2, "{pattern} was taken: {}", run.stdout);
        assert!(
            run.stderr.contains("--after output pattern"),
            "{}",
            run.stderr
        );
    }
    // The shape alone is no value: it waits.
    for pattern in [
        "\\w+",
        "[[:alpha:]]+ [[:alpha:]]+",
        "\\S+",
        "ready",
        "h\\w+",
        "\\w+2\\w+",
    ] {
        let run = home.run(&[
            "start",
            "--window",
            "0",
            "--after",
            &format!("{awaited}:output {pattern}"),
            "--",
            "true",
        ]);
        assert_eq!(run.code, 0, "{pattern}: {}", run.stderr);
    }
    let listed = home.json(&["list", "--all"]).to_string();
    assert!(
        !listed.contains("unter") && !listed.contains("ароль"),
        "{listed}"
    );
}

#[test]
fn issue26_v20_many_intricate_patterns_are_answered_and_the_daemon_keeps_serving() {
    let home = Home::new()
        .with("S1", "hunter2secret")
        .with("S2", "abcdefgh2secret")
        .with("S3", "zyxwvuts9secret");
    let awaited = home.start_with(
        &["--secret", "S1", "--secret", "S2", "--secret", "S3"],
        "sleep 30",
    );
    let pattern = "[a-z0-9]".repeat(500);
    let mut args = vec!["start".to_string(), "--window".into(), "0".into()];
    for _ in 0..16 {
        args.push("--after".into());
        args.push(format!("{awaited}:output {pattern}"));
    }
    args.extend(["--".into(), "true".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // Answered (taken or refused), not left to the client's deadline.
    let out = crate::util::output_within(home.command(&args), std::time::Duration::from_secs(20));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("did not answer"), "{stderr}");
    assert_eq!(home.run(&["list"]).code, 0);
}

#[test]
fn issue26_v22_two_thirds_of_a_value_in_one_pattern_or_split_across_patterns_and_the_name_is_refused(
) {
    let home = Home::new().with("PW3", "hunter2secret");
    let awaited = home.start_with(&["--secret", "PW3"], "sleep 30");
    let after = |pattern: &str| format!("{awaited}:output {pattern}");
    let refusals: Vec<Vec<String>> = vec![
        // Most of it in one pattern, as text or in regex syntax.
        vec!["--after".into(), after("hunter2se")],
        vec!["--after".into(), after("(?i)HUNTER2SE")],
        vec!["--after".into(), after("hunt.r2sec")],
        // Split across two patterns, across a pattern and the name, in runs of three.
        vec![
            "--after".into(),
            after("hunt"),
            "--after".into(),
            after("er2sec"),
        ],
        vec![
            "--name".into(),
            "hunter2".into(),
            "--after".into(),
            after("secret"),
        ],
        vec![
            "--after".into(),
            after("hun"),
            "--after".into(),
            after("ter"),
            "--after".into(),
            after("2se"),
            "--after".into(),
            after("cret"),
        ],
        vec!["--after".into(), after("(hu|zz)(nt|yy)(er|ww)2secret")],
        // Its characters in order with others between them, as a reader sees them.
        vec!["--after".into(), after("h.u.n.t.e.r.2.s.e.c")],
        vec!["--after".into(), after("H-U-N-T-E-R 2 S E")],
        vec![
            "--secret".into(),
            "PW3".into(),
            "--name".into(),
            "h_u_n_t_e_r_2_s_e".into(),
        ],
        // Wide classes that each hold its character, alternations of two-character
        // chunks with a shorter filler.
        vec![
            "--after".into(),
            after("[hX-Z][uX-Z][nX-Z][tX-Z][eX-Z][rX-Z][2X-Z][sX-Z][eX-Z][cX-Z]"),
        ],
        vec![
            "--after".into(),
            after("(?:hu|x)(?:nt|x)(?:er|x)(?:2s|x)(?:ec|x)(?:re|x)t"),
        ],
        // An encoded form, changed a little or split.
        vec!["--after".into(), after("[a]HVudGVyMnNlY3JldA==")],
        vec![
            "--after".into(),
            after("aHVudGVy"),
            "--after".into(),
            after("MnNlY3JldA=="),
        ],
        vec!["--after".into(), after("68756e7465723273656372657[4]")],
        // Greedy fillers between classes, classes of the character and its others,
        // escapes nested deeper than 64 groups.
        vec![
            "--after".into(),
            after("[hZ][uZ].*[nZ][tZ].*[eZ][rZ].*[2Z][sZ].*[eZ][cZ].*[rZ][eZ].*[tZ]"),
        ],
        vec![
            "--after".into(),
            after("[ahiou][bhnuv][agnou][agmtu][eflrx][ekrsy][0246][flstz][eflrx][cdjpv]"),
        ],
        vec![
            "--after".into(),
            after(&format!(
                "{}\\x68\\x75\\x6e\\x74\\x65\\x72\\x32\\x73\\x65\\x63{}",
                "(?:".repeat(70),
                ")".repeat(70)
            )),
        ],
        // A group named as the check's own, empty groups between classes, comments,
        // group names, and most of an encoded form or an escaped spelling in the name.
        vec![
            "--after".into(),
            after("[hWXY][uWXY][nWXY][tWXY][eWXY][rWXY][2-9][sWXY][eWXY][cWXY][rWXY](?P<p0>)"),
        ],
        vec![
            "--after".into(),
            after(
                &"hunter2se"
                    .chars()
                    .map(|c| format!("[{c}WXY]{}", "()".repeat(119)))
                    .collect::<String>(),
            ),
        ],
        vec![
            "--after".into(),
            after("(?x)ready # h-u-n-t-e-r-2-s-e-c-r-e-t"),
        ],
        vec!["--after".into(), after("(?P<h_u_n_t_e_r_2_s_e_c_r_e_t>ready)")],
        vec![
            "--secret".into(),
            "PW3".into(),
            "--name".into(),
            "68756e746572327365637265".into(),
        ],
        vec![
            "--secret".into(),
            "PW3".into(),
            "--name".into(),
            "%68%75%6e%74%65%72%32%73%65%63".into(),
        ],
        // The command line and the name with every character escaped.
        vec![
            "--secret".into(),
            "PW3".into(),
            "--name".into(),
            "\\u0068\\u0075\\u006e\\u0074\\u0065\\u0072\\u0032\\u0073\\u0065\\u0063\\u0072\\u0065\\u0074".into(),
        ],
    ];
    for args in &refusals {
        let mut all = vec!["start", "--window", "0"];
        all.extend(args.iter().map(String::as_str));
        all.extend(["--", "true"]);
        let run = home.run(&all);
        assert_eq!(run.code, 2, "{args:?} was taken: {}", run.stdout);
        assert!(
            (run.stderr.contains("spell") || run.stderr.contains("holds the value"))
                && run.stderr.contains("PW3"),
            "{args:?}: {}",
            run.stderr
        );
    }
    // A part of it too short to show it (under two thirds), and ordinary patterns, wait.
    for pattern in [
        "hunt",
        "secret",
        "hunter2s",
        "ready",
        "error: .*",
        "listening on port \\d+",
        "h\\w+",
    ] {
        let started = std::time::Instant::now();
        let run = home.run(&[
            "start",
            "--window",
            "0",
            "--after",
            &after(pattern),
            "--",
            "true",
        ]);
        assert_eq!(run.code, 0, "{pattern}: {}", run.stderr);
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
    let listed = home.json(&["list", "--all"]).to_string();
    assert!(!listed.contains("hunter2se"), "{listed}");
}

#[test]
fn issue26_v26_a_refusal_for_the_new_items_own_value_says_why_and_long_fields_are_answered_at_once()
{
    let home = Home::new();
    let awaited = home.start("echo Uvicorn running on http://0.0.0.0:8000; sleep 30");
    let run = home.run(&[
        "start",
        "--window",
        "0",
        "--env",
        "BIND=http://0.0.0.0:8000",
        "--after",
        &format!("{awaited}:output Uvicorn running on http://0\\.0\\.0\\.0:8000"),
        "--",
        "true",
    ]);
    assert_eq!(run.code, 2, "{}", run.stdout);
    // Its own value is masked in its own output only: no advice to match the mask.
    assert!(
        run.stderr.contains("listing would show it") && !run.stderr.contains("could never"),
        "{}",
        run.stderr
    );
    // A value of 30,000 characters beside a pattern of 29,000 of them: refused for the
    // pattern's length at once, the daemon free for the next call.
    let long: String = (0..30_000)
        .map(|i| char::from(b'a' + ((i * 7 + i / 26) % 26) as u8))
        .collect();
    let started = std::time::Instant::now();
    let run = home.run(&[
        "start",
        "--window",
        "0",
        "--env",
        &format!("SV={long}"),
        "--after",
        &format!("{awaited}:output {}", &long[..29_000]),
        "--",
        "true",
    ]);
    assert_eq!(run.code, 2, "{}", run.stdout);
    assert!(run.stderr.contains("bytes long"), "{}", run.stderr);
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    // So is a name of that length.
    let run = home.run(&[
        "start",
        "--window",
        "0",
        "--env",
        &format!("SV={long}"),
        "--name",
        &long[..29_000],
        "--",
        "true",
    ]);
    assert_eq!(run.code, 2, "{}", run.stdout);
    assert!(run.stderr.contains("--name is"), "{}", run.stderr);
    home.run(&["stop", &awaited]);
}

#[test]
fn issue26_v28_long_values_and_other_scripts_with_ordinary_patterns_wait() {
    // A JSON credential of 2 KB, on one line and in lines, and a Cyrillic value.
    let key: String = (0..2100)
        .map(|i| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[(i * 7 + i / 36) % 36]))
        .collect();
    let json_one_line = format!("{{\"type\":\"service_account\",\"private_key\":\"{key}\"}}");
    let home = Home::new()
        .with("CREDS", &json_one_line)
        .with("RU", "пароль-секрет")
        .with(
            "JWT",
            &format!("eyJhbGciOiJSUzI1NiJ9.{}.SflKxwRJSMeKKF2QT4fw", &key[..240]),
        );
    let awaited = home.start("sleep 30");
    for (env, patterns) in [
        (
            "CREDS",
            vec!["Listening on port \\d+", "compiled successfully"],
        ),
        ("RU", vec!["\\p{Cyrillic}+-\\p{Cyrillic}+", "[а-я]+-[а-я]+"]),
        (
            "JWT",
            vec![
                "^\\[?\\d{4}-\\d{2}-\\d{2}[T ]\\d{2}:\\d{2}:\\d{2}(?:\\.\\d+)?\\s+INFO\\s+Started UserService in \\d+",
                "^\\[?\\d{4}-\\d{2}-\\d{2}[T ]\\d{2}:\\d{2}:\\d{2}(?:\\.\\d+)?\\s+INFO\\s+Started OrderService in \\d+",
                "^\\[?\\d{4}-\\d{2}-\\d{2}[T ]\\d{2}:\\d{2}:\\d{2}(?:\\.\\d+)?\\s+INFO\\s+Started BillingService in \\d+",
            ],
        ),
    ] {
        let mut args = vec![
            "start".to_string(),
            "--window".into(),
            "0".into(),
            "--secret".into(),
            env.into(),
            "--name".into(),
            "api server (staging)".into(),
        ];
        for pattern in patterns {
            args.push("--after".into());
            args.push(format!("{awaited}:output {pattern}"));
        }
        args.extend(["--".into(), "true".into()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = home.run(&args);
        assert_eq!(run.code, 0, "{env}: {}", run.stderr);
    }
    home.run(&["stop", &awaited]);
}

/// What the home keeps on disk, as text: the database and its write-ahead log.
fn kept(home: &Home) -> String {
    ["work.db", "work.db-wal"]
        .iter()
        .filter_map(|f| std::fs::read(home.path().join(f)).ok())
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .collect()
}

#[test]
fn issue26_v29_a_monitors_regex_or_name_that_shows_the_watched_items_secret_is_refused() {
    let home = Home::new().with("PW", PW);
    let watched = home.start_with(&["--secret", "PW"], "echo \"$PW\"; sleep 30");
    for args in [
        vec!["monitor", "watch", "--output", &watched, "--regex", PW],
        vec![
            "monitor",
            "wait",
            "--until-output",
            &watched,
            "token hunt.r2-Very-Secret",
        ],
        vec![
            "monitor", "watch", "--output", &watched, "--regex", "y", "--name", PW,
        ],
        vec!["monitor", "wait", "--until-end", &watched, "--name", PW],
    ] {
        let run = home.run(&args);
        assert_eq!(run.code, 2, "{args:?} made a monitor: {}", run.stdout);
        assert!(
            run.stderr.contains("nothing was started") && !run.stderr.contains(PW),
            "{}",
            run.stderr
        );
        assert!(
            run.stderr.contains("monitor's --regex") || run.stderr.contains("--name"),
            "{}",
            run.stderr
        );
    }
    // A name as long as no start's may be.
    let long = "n".repeat(5000);
    let (code, _, message) =
        home.error(&["monitor", "watch", "--output", &watched, "--name", &long]);
    assert_eq!(code, 2, "{message}");
    assert!(message.contains("at most 4096"), "{message}");
    // An ordinary monitor of the same item is made.
    let made = home.json(&["monitor", "watch", "--output", &watched, "--regex", "ready"]);
    assert_eq!(made["kind"], "monitor", "{made}");
    let listed = home.json(&["list", "--all"]).to_string();
    assert!(!listed.contains(PW), "{listed}");
    assert!(!kept(&home).contains(PW), "a value is in work.db");
}

#[test]
fn issue26_v30_a_folder_env_name_or_host_that_holds_a_secret_is_refused() {
    let home = Home::new().with("PW", PW);
    let folder = home.path().join(format!("w-{PW}"));
    std::fs::create_dir_all(&folder).unwrap();
    let why = refused(
        &home,
        &[
            "--secret",
            "PW",
            "--cwd",
            folder.to_str().unwrap(),
            "--",
            "pwd",
        ],
    );
    assert!(why.contains("folder (--cwd)"), "{why}");
    let why = refused(
        &home,
        &["--secret", "PW", "--env", &format!("X{PW}=1"), "--", "true"],
    );
    assert!(why.contains("--env names"), "{why}");
    let why = refused(
        &home,
        &["--secret", "PW", "--on", &format!("ssh:{PW}"), "--", "true"],
    );
    assert!(why.contains("ssh host"), "{why}");
    assert!(
        !home.path().join("jobs").exists()
            || std::fs::read_dir(home.path().join("jobs")).unwrap().count() == 0
    );
    let listed = home.json(&["list", "--all"]).to_string();
    assert!(!listed.contains(PW), "{listed}");
    assert!(!kept(&home).contains(PW), "a value is in work.db");
}

#[test]
fn issue26_v31_token_shapes_in_a_name_or_an_awaited_pattern_are_listed_masked() {
    let home = Home::new();
    let token = format!("ghp_{}", "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3z5A");
    let awaited = home.start_with(&[], "sleep 30");
    let waiting = home.start_with(
        &[
            "--name",
            &format!("deploy {token}"),
            "--after",
            &format!("{awaited}:output {token}"),
        ],
        "true",
    );
    let item = home.item(&waiting);
    let shown = item.to_string();
    assert!(!shown.contains(&token), "{shown}");
    assert!(
        item["name"].as_str().unwrap().starts_with("deploy "),
        "{item}"
    );
    assert!(
        item["waiting_for"]
            .as_str()
            .unwrap()
            .contains("waiting for"),
        "{item}"
    );
    let text = home.run(&["list"]).stdout;
    assert!(!text.contains(&token), "{text}");
}

#[test]
fn issue26_v38_a_folder_given_through_a_link_to_a_secrets_folder_is_refused() {
    let home = Home::new().with("PW", PW);
    let folder = home.path().join(format!("e-{PW}"));
    std::fs::create_dir_all(&folder).unwrap();
    let link = home.path().join("lnk");
    std::os::unix::fs::symlink(&folder, &link).unwrap();
    let why = refused(
        &home,
        &[
            "--secret",
            "PW",
            "--cwd",
            link.to_str().unwrap(),
            "--",
            "true",
        ],
    );
    assert!(why.contains("folder (--cwd)"), "{why}");
    let listed = home.json(&["list", "--all"]).to_string();
    assert!(!listed.contains(PW), "{listed}");
    assert!(!kept(&home).contains(PW), "a value is in work.db");
}

#[test]
fn issue26_v39_a_failed_starts_report_masks_the_token_its_folder_quotes() {
    let home = Home::new();
    let token = format!("ghp_{}", "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3z5A");
    // Refused as it could not start (the caller's own folder in the words), and kept.
    let cwd = format!("/nonexist/{token}");
    let run = home.run(&["start", "--window", "0", "--cwd", &cwd, "--", "true"]);
    assert_ne!(run.code, 0, "{}", run.stdout);
    let item = home.item("bg-1");
    assert_eq!(item["end"], "spawn_failed", "{item}");
    let listed = home.json(&["list", "--all"]).to_string();
    assert!(!listed.contains(&token), "{listed}");
    assert!(listed.contains("[secret github token]"), "{listed}");
}

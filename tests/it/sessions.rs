//! Sessions own their work; limits and the refusal that lists what runs.

use crate::util::Home;

#[test]
fn another_session_sees_none_of_this_sessions_work() {
    let home = Home::new();
    let id = home.start("exec sleep 1000");
    let other = |args: &[&str]| {
        let mut all = vec!["--session", "intruder", "--json"];
        all.extend_from_slice(args);
        home.run(&all)
    };
    assert_eq!(
        other(&["list", "--all"]).json()["items"],
        serde_json::json!([])
    );
    for args in [
        vec!["read", &id],
        vec!["stop", &id],
        vec!["send", &id, "x"],
        vec!["wait", &id],
    ] {
        let run = other(&args);
        assert_eq!(run.code, 1, "{args:?}");
        assert_eq!(run.json()["error"]["code"], "unknown_id", "{args:?}");
    }
    assert_eq!(home.item(&id)["state"], "running");
}

#[test]
fn starting_past_the_limit_is_refused_with_what_runs() {
    let home = Home::new().with("BGWORK_MAX_RUNNING", "3");
    let ids: Vec<String> = (0..3).map(|_| home.start("exec sleep 1000")).collect();
    let (code, error, message) = home.error(&["start", "--", "true"]);
    assert_eq!(code, 1);
    assert_eq!(error, "limit");
    for id in &ids {
        assert!(message.contains(id.as_str()), "{message}");
    }
    let run = home.run(&[
        "--session",
        "other",
        "--json",
        "start",
        "--window",
        "0",
        "--",
        "true",
    ]);
    assert_eq!(run.code, 0, "the limit is per session");
    home.json(&["stop", &ids[0]]);
    home.start("true");
}

#[test]
fn ids_are_never_reused_and_unknown_ids_are_clear() {
    let home = Home::new().with("BGWORK_RETAIN_S", "0");
    let first = home.start("true");
    home.wait_end(&first);
    home.json(&["dismiss", &first]);
    assert_eq!(home.json(&["gc"])["removed"], 1);
    assert_eq!(
        home.json(&["list", "--all"])["items"],
        serde_json::json!([])
    );
    let second = home.start("true");
    assert_eq!((first.as_str(), second.as_str()), ("bg-1", "bg-2"));
    let (code, error, message) = home.error(&["read", "bg-99"]);
    assert_eq!((code, error.as_str()), (1, "unknown_id"));
    assert!(message.contains("bgwork list"), "{message}");
}

#[test]
fn send_to_an_ended_job_or_with_a_bad_escape_is_refused_clearly() {
    let home = Home::new();
    let id = home.start("true");
    home.wait_end(&id);
    let (_, error, _) = home.error(&["send", &id, "hello"]);
    assert_eq!(error, "not_running");
    let live = home.start("exec cat");
    let (code, error, message) = home.error(&["send", &live, r"\xZZ"]);
    assert_eq!((code, error.as_str()), (2, "bad_request"));
    assert!(message.contains("hex"), "{message}");
}

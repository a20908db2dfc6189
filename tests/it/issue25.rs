//! Issue 25, what a newcomer met: ids typed without their dash, a pane resized to fewer
//! rows, the Install lines of the README, where an item's folder is.

use crate::util::Home;

#[test]
fn issue25_an_id_typed_without_its_dash_is_answered_with_the_one_meant() {
    let home = Home::new();
    let id = home.start("sleep 30");
    assert_eq!(id, "bg-1");
    for args in [
        vec!["read", "bg1"],
        vec!["stop", "BG-1"],
        vec!["wait", "bg_1", "--timeout", "1"],
        vec!["send", "1", "x"],
        vec!["read", "bg01"],
    ] {
        let run = home.run(&args);
        assert_ne!(run.code, 0, "{args:?}");
        assert!(
            run.stderr.contains("did you mean bg-1?"),
            "{args:?}: {}",
            run.stderr
        );
    }
    // No suggestion of an id that does not exist either.
    let run = home.run(&["read", "bg7"]);
    assert!(!run.stderr.contains("did you mean"), "{}", run.stderr);
    assert!(run.stderr.contains("no item bg7"), "{}", run.stderr);
    // The item was not touched by any of them.
    assert_eq!(home.item("bg-1")["state"], "running");
}

#[test]
fn issue25_a_pane_resized_to_fewer_rows_keeps_the_cursors_row_and_scrolls() {
    let home = Home::new();
    let id = home.start_with(
        &["--pty", "--cols", "80", "--rows", "30"],
        "for i in $(seq 1 25); do echo line-$i; done; printf 'prompt> '; sleep 60",
    );
    let reply = home
        .run(&[
            "--json",
            "wait",
            &id,
            "--until",
            "prompt>",
            "--timeout",
            "20",
        ])
        .json();
    assert_eq!(reply["reason"], "matched", "{reply}");
    home.json(&["resize", &id, "--cols", "80", "--rows", "10"]);
    let screen = home.json(&["read", &id, "--screen"])["output"]
        .as_str()
        .unwrap()
        .to_string();
    let lines: Vec<&str> = screen.lines().map(str::trim_end).collect();
    // As a terminal does: the newest rows and the prompt stay, the oldest scroll away.
    assert!(lines.contains(&"prompt>"), "{screen}");
    assert!(
        lines.contains(&"line-25") && lines.contains(&"line-17"),
        "{screen}"
    );
    assert!(!lines.contains(&"line-1"), "{screen}");
    assert!(lines.len() <= 10, "{screen}");
}

#[test]
fn issue25_the_readmes_install_lines_work_as_written_in_a_fresh_home() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let install = readme
        .split("## Install")
        .nth(1)
        .expect("an Install section");
    let block = install.split("```").nth(1).expect("a code block");
    let home = tempfile::tempdir().unwrap();
    let bin = home.path().join(".cargo/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let comment = regex::Regex::new(r"\s+#\s.*$").unwrap();
    let mut ran = 0;
    for line in block.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let line = comment.replace(line, "");
        if line.starts_with("cargo install") {
            // What `cargo install` puts in place (building it again takes minutes).
            std::os::unix::fs::symlink(crate::util::BIN, bin.join("bgwork")).unwrap();
            continue;
        }
        let output = std::process::Command::new("bash")
            .args(["-c", &line])
            .env_clear()
            .env("HOME", home.path())
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "`{line}` failed in a fresh HOME: {output:?}"
        );
        ran += 1;
    }
    assert!(ran >= 2, "{block}");
    // `man bgwork` finds the page, and a new interactive bash completes `bgwork`.
    let man = std::process::Command::new("man")
        .args(["-w", "bgwork"])
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", &path)
        .output()
        .unwrap();
    let found = String::from_utf8_lossy(&man.stdout);
    assert!(
        man.status.success() && found.starts_with(&home.path().display().to_string()),
        "man does not find the page: {man:?}"
    );
    let bash = std::process::Command::new("bash")
        .args(["-i", "-c", "complete -p bgwork"])
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", &path)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let complete = String::from_utf8_lossy(&bash.stdout);
    assert!(complete.contains("_bgwork"), "no completion: {bash:?}");
}

#[test]
fn issue25_list_and_read_say_where_an_items_folder_is() {
    let home = Home::new();
    // Another session's job takes the first folder: this session's bg-1 is in another.
    let other = home.run(&["--session", "other", "--json", "start", "--", "echo other"]);
    assert_eq!(other.code, 0, "{}", other.stderr);
    let id = home.start("echo mine");
    home.wait_end(&id);
    let item = home.item(&id);
    let folder = item["folder"]
        .as_str()
        .expect("a folder in list --json")
        .to_string();
    let described =
        std::fs::read_to_string(std::path::Path::new(&folder).join("job.json")).unwrap();
    assert!(
        described.contains("\"id\":\"bg-1\"") && described.contains("echo mine"),
        "{described}"
    );
    assert!(
        !folder.ends_with("/1"),
        "{folder}: the first folder is the other session's"
    );
    let read = home.json(&["read", &id]);
    assert_eq!(read["folder"], folder.as_str(), "{read}");
}

#[test]
fn issue25_the_strip_shows_failed_runs_by_default_marks_them_in_the_feed_and_has_a_readable_chart()
{
    let home = Home::new();
    let seen = crate::strip::browser(&home, "failures", &[]);
    let ids: Vec<&str> = seen["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let (bad, fine, live) = (ids[0], ids[1], ids[2]);
    assert_eq!(seen["tab"], "Now", "{seen}");
    let shown: Vec<&str> = seen["shown"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(shown.contains(&bad) && shown.contains(&live), "{seen}");
    assert!(
        !shown.contains(&fine),
        "a run that succeeded is not in the default tab: {seen}"
    );
    assert_eq!(seen["failed_class"], "failed", "{seen}");
    assert!(
        seen["failed_text"].as_str().unwrap().contains('✗'),
        "{seen}"
    );
    assert!(seen["fine_class"].is_null(), "{seen}");
    assert!(seen["chart"]["height"].as_f64().unwrap() >= 150.0, "{seen}");
    let labels = seen["labels"].to_string();
    assert!(
        labels.contains("60 min ago") && labels.contains("now"),
        "{seen}"
    );
}

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

//! `bgwork demo`: a short guided run on real jobs in a throw-away home — start, read,
//! wait, notices and stop — printing each command before what it prints.

use super::commands::Cli;
use super::execute;
use crate::wire::WireError;
use clap::Parser;
use std::process::ExitCode;

pub fn run() -> Result<ExitCode, WireError> {
    let home = tempfile::Builder::new()
        .prefix("bgwork-demo-")
        .tempdir()
        .map_err(|e| WireError::internal(format!("could not make a demo home: {e}")))?;
    // SAFETY: the demo runs on the main thread before any other thread exists.
    unsafe {
        std::env::set_var("BGWORK_HOME", home.path());
        std::env::set_var("BGWORK_SESSION", "demo");
    }
    println!(
        "bgwork demo — a throw-away home in {}\n",
        home.path().display()
    );
    let steps: &[(&str, &[&str])] = &[
        (
            "An agent starts a build it does not want to wait for. The call returns at once\n\
             with the id and the first second of output; --notify arms one notice for its end.",
            &["start", "--notify", "--name", "build", "--", "for i in 1 2 3 4 5 6; do echo \"compiling module $i\"; sleep 0.5; done; echo 'build ok'"],
        ),
        (
            "A dev server, and a test run that will fail.",
            &["start", "--name", "dev-server", "--window", "300", "--", "echo 'listening on :8080'; while true; do echo 'GET / 200'; sleep 0.3; done"],
        ),
        ("", &["start", "--notify", "--name", "tests", "--window", "0", "--", "sleep 1; echo 'test_login ... FAILED'; echo '1 failed, 41 passed'; exit 3"]),
        ("What runs now:", &["list"]),
        (
            "Reading is incremental: each read returns only what is new since the last one.",
            &["read", "bg-2"],
        ),
        ("", &["wait", "bg-2", "--until", "GET", "--timeout", "5"]),
        ("", &["read", "bg-2", "--tail", "2"]),
        (
            "The agent keeps working. At its next turn boundary the harness hands it the\n\
             notices of work that ended, with the end and the last lines — no polling.\n\
             (Here the harness blocks until the first one arrives.)",
            &["notices", "--wait", "10"],
        ),
        ("", &["notices", "--wait", "10"]),
        (
            "A notice is delivered once: asking again finds nothing new.",
            &["notices"],
        ),
        (
            "Stopping asks first: TERM to the whole process tree, KILL after the grace.",
            &["stop", "bg-2", "--grace", "2"],
        ),
        ("Every record stays readable after it ends:", &["list", "--all"]),
        ("Running work would survive this; --stop-work stops it first.", &["shutdown", "--stop-work"]),
    ];
    for (say, args) in steps {
        if !say.is_empty() {
            println!("{say}");
        }
        println!("$ bgwork {}", shell_words(args));
        let cli = Cli::try_parse_from(std::iter::once("bgwork").chain(args.iter().copied()))
            .map_err(|e| WireError::internal(e.to_string()))?;
        let _ = execute(cli);
        println!();
    }
    println!(
        "That was bgwork. `bgwork ui` shows every session's work in a browser; `bgwork --help` \
         lists every command."
    );
    Ok(ExitCode::SUCCESS)
}

fn shell_words(args: &[&str]) -> String {
    args.iter()
        .map(|a| {
            if a.chars()
                .any(|c| c.is_whitespace() || "'\"$;|&".contains(c))
            {
                format!("'{}'", a.replace('\'', r"'\''"))
            } else {
                a.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

//! The daemon's inner rules, each kept in one place (issue 23; issue 22 item 17): one
//! admission for every path that starts an item, whatever executor runs its other
//! work. Slurm work here is held in the queue of a stand-in Slurm (`sbatch`, `squeue`,
//! `scontrol` and `scancel` as small scripts on the caller's PATH), so no cluster is
//! needed: the daemon runs a job's Slurm commands with the PATH of its caller.

use crate::util::{eventually, Home};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

/// A stand-in for Slurm's client commands: `sbatch` queues a job for ever (`PENDING`)
/// until `scancel` cancels it.
struct FakeSlurm {
    dir: tempfile::TempDir,
}

impl FakeSlurm {
    fn new() -> FakeSlurm {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().display().to_string();
        let scripts = [
            (
                "sbatch",
                format!(
                    r#"#!/bin/sh
name=""
for a in "$@"; do case "$a" in --job-name=*) name="${{a#--job-name=}}";; esac; done
n=$(( $(cat {state}/jobs 2>/dev/null | wc -l) + 4200 ))
echo "$n|$name" >> {state}/jobs
echo "$n"
"#
                ),
            ),
            (
                "squeue",
                format!(
                    r#"#!/bin/sh
[ -f {state}/jobs ] || exit 0
while IFS='|' read -r id name; do
  if [ -e {state}/cancelled.$id ]; then echo "$id|$name|CANCELLED|None";
  else echo "$id|$name|PENDING|Resources"; fi
done < {state}/jobs
"#
                ),
            ),
            (
                "scontrol",
                format!(
                    r#"#!/bin/sh
id="$4"
name=$(grep "^$id|" {state}/jobs | cut -d'|' -f2)
if [ -e {state}/cancelled.$id ]; then s=CANCELLED; else s=PENDING; fi
echo "JobId=$id JobName=$name JobState=$s Reason=None ExitCode=0:0"
"#
                ),
            ),
            (
                "scancel",
                format!("#!/bin/sh\ntouch {state}/cancelled.$1\n"),
            ),
        ];
        for (name, text) in scripts {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        FakeSlurm { dir }
    }

    /// A PATH with the stand-in first.
    fn path(&self) -> String {
        format!(
            "{}:{}",
            self.dir.path().display(),
            std::env::var("PATH").unwrap_or_default()
        )
    }

    fn submitted(&self) -> usize {
        std::fs::read_to_string(self.dir.path().join("jobs"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }
}

/// A home whose calls (and so their Slurm commands) find the stand-in Slurm first.
fn home_with(slurm: &FakeSlurm, max_running: &str) -> Home {
    Home::new()
        .with("PATH", &slurm.path())
        .with("BGWORK_MAX_RUNNING", max_running)
}

/// Starts a job on the stand-in Slurm and waits until `list` shows it queued there.
fn queue_on_slurm(home: &Home, slurm: &FakeSlurm) -> String {
    let reply = home.json(&[
        "start",
        "--window",
        "0",
        "--on",
        "slurm",
        "--",
        "echo queued",
    ]);
    let id = reply["id"].as_str().unwrap().to_string();
    assert_eq!(reply["executor"], "slurm", "{reply}");
    eventually(Duration::from_secs(20), || {
        home.item(&id)["queue_reason"] == "Resources"
    });
    assert_eq!(slurm.submitted(), 1);
    id
}

#[test]
fn issue22_17_a_session_with_queued_slurm_work_still_gets_its_monitors() {
    let slurm = FakeSlurm::new();
    let home = home_with(&slurm, "1");
    queue_on_slurm(&home, &slurm);
    // Slurm work counts against its own limit, in `monitor` as in `start`: this
    // machine's one slot is free.
    let target = tempfile::tempdir().unwrap();
    let file = target.path().join("ready");
    let file = file.display().to_string();
    let monitor = home.json(&["monitor", "wait", "--until-file", &file]);
    assert_eq!(monitor["kind"], "monitor", "{monitor}");
    // And the slot is then taken, by the monitor, for a local start.
    let (_, code, message) = home.error(&["start", "--window", "0", "--", "sleep 30"]);
    assert_eq!(code, "limit", "{message}");
}

#[test]
fn issue22_17_a_run_at_its_deadline_is_promoted_beside_queued_slurm_work() {
    let slurm = FakeSlurm::new();
    let home = home_with(&slurm, "1");
    queue_on_slurm(&home, &slurm);
    let run = home.run(&["--json", "run", "--timeout", "0.3", "--", "exec sleep 1000"]);
    let reply = run.json();
    assert_eq!(reply["outcome"], "promoted", "{reply}");
    assert_eq!(reply["state"], "running", "{reply}");
}

#[test]
fn issue23_1_a_queued_slurm_job_refuses_input_and_keys_and_stops_off_the_queue() {
    let slurm = FakeSlurm::new();
    let home = home_with(&slurm, "4");
    let id = queue_on_slurm(&home, &slurm);
    // Input to a queued job is refused, never dropped; so is a key (C-c, C-d), which
    // would otherwise wait in the job's folder and reach it the moment it starts.
    let (_, code, message) = home.error(&["send", &id, "hello"]);
    assert_eq!(code, "no_input", "{message}");
    assert!(message.contains("queue"), "{message}");
    for key in ["C-c", "C-d"] {
        let (_, code, message) = home.error(&["send", &id, "--key", key]);
        assert_eq!(code, "no_input", "{key}: {message}");
        assert!(message.contains("queue"), "{message}");
    }
    let job_dir = Path::new(home.item(&id)["log_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    let left = std::fs::read_dir(job_dir.join("commands")).map_or(0, |d| d.count());
    assert_eq!(left, 0, "a command was left for the queued job");
    // A stop takes it off the queue.
    home.json(&["stop", &id]);
    eventually(Duration::from_secs(20), || {
        home.item(&id)["state"] == "ended"
    });
    assert!(Path::new(&slurm.dir.path().join("cancelled.4200")).exists());
}

/// The Rust files under `dir`, recursively.
fn sources(dir: &Path, found: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|x| x == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn issue23_7_only_wire_derives_serialize_but_the_slurm_executors_own_file() {
    // ARCHITECTURE.md's invariant: bgwork's own JSON shapes are `wire`'s; the one other
    // are the Slurm executor's own files (`slurm.json`, the hand-over's).
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let allowed = [
        root.join("src/executor/slurm/mod.rs"),
        root.join("src/executor/slurm/handover.rs"),
    ];
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    let mut outside = Vec::new();
    for file in files {
        if file.starts_with(root.join("src/wire")) || allowed.contains(&file) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let derives = line.contains("derive(")
                && line
                    .split(|c: char| !c.is_alphanumeric() && c != '_')
                    .any(|word| word == "Serialize");
            if derives {
                outside.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        outside.is_empty(),
        "Serialize derived outside wire (define the shape in src/wire/, or say in \
         ARCHITECTURE.md why not):\n{}",
        outside.join("\n")
    );
}

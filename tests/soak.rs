//! The soak (RELIABILITY cases 8–13 under churn): jobs start, print, exit with various
//! codes and are stopped while the daemon is SIGKILLed at random moments. Afterwards the
//! database passes `PRAGMA integrity_check`, every job has exactly the end and code it
//! really had, every armed notice was delivered once, and no process is left.
//!
//! Size: `SOAK_JOBS` (default 50) and `SOAK_KILLS` (default 20); `scripts/soak` runs a
//! larger one.

#[path = "it/util.rs"]
mod util;

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use util::{alive, eventually, processes_of, Home};

/// What a job of the soak is made to do.
#[derive(Clone, Copy, Debug)]
enum Plan {
    Exit(i32),
    Signal,
    Stop,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

/// Calls the CLI until the daemon answers (it may have been killed mid-call). Only for
/// calls that may be repeated: a `start` goes through [`call_once`].
fn call(home: &Home, args: &[&str]) -> Result<Value, Value> {
    for _ in 0..500 {
        match call_once(home, args) {
            Err(reply) if unanswered(&reply) => std::thread::sleep(Duration::from_millis(20)),
            result => return result,
        }
    }
    panic!("the daemon never answered {args:?}");
}

fn call_once(home: &Home, args: &[&str]) -> Result<Value, Value> {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let run = home.run(&all);
    match serde_json::from_str::<Value>(&run.stdout) {
        Ok(reply) if run.code == 0 || reply.get("reason").is_some() => Ok(reply),
        Ok(reply) => Err(reply),
        Err(_) => Err(serde_json::json!({"error": {"code": "unavailable"}})),
    }
}

fn unanswered(reply: &Value) -> bool {
    matches!(
        reply["error"]["code"].as_str(),
        Some("unavailable" | "internal")
    )
}

fn daemon_pid(home: &Home) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(home.path().join("daemon.lock"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    (alive(pid) && String::from_utf8_lossy(&cmdline).contains("daemon")).then_some(pid)
}

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn soak_under_random_daemon_kills() {
    let n_jobs = setting("SOAK_JOBS", 50);
    let n_kills = setting("SOAK_KILLS", 20);
    let home = Arc::new(
        Home::new()
            .with("BGWORK_MAX_RUNNING", "10000")
            .with("BGWORK_LINGER_MS", "200"),
    );
    call(&home, &["list"]).unwrap();

    let kills = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let killer = {
        let (home, kills, done) = (home.clone(), kills.clone(), done.clone());
        std::thread::spawn(move || {
            let mut rng = Rng(7);
            while kills.load(Ordering::SeqCst) < n_kills && !done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(10 + rng.next(70)));
                if let Some(pid) = daemon_pid(&home) {
                    let _ = std::process::Command::new("kill")
                        .args(["-9", &pid.to_string()])
                        .status();
                    kills.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
    };

    let mut rng = Rng(42);
    let mut plans: BTreeMap<String, Plan> = BTreeMap::new();
    let mut delivered: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut interrupted_starts = 0;
    let collect = |delivered: &mut BTreeMap<String, Vec<String>>| {
        let reply = call(&home, &["notices"]).unwrap();
        for notice in reply["notices"].as_array().unwrap() {
            let item = notice["item"].as_str().unwrap().to_string();
            delivered
                .entry(item)
                .or_default()
                .push(notice["id"].as_str().unwrap().to_string());
        }
    };
    for i in 0..n_jobs {
        let plan = match i % 10 {
            4 | 9 => Plan::Stop,
            7 => Plan::Signal,
            _ => Plan::Exit((i % 4) as i32),
        };
        let pause = format!("sleep 0.{}", rng.next(9) + 1);
        let command = match plan {
            Plan::Exit(code) => format!("{pause}; echo out-{i}; exit {code}"),
            Plan::Signal => format!("{pause}; echo out-{i}; kill -TERM $$"),
            Plan::Stop => format!("echo out-{i}; exec sleep 60"),
        };
        for attempt in 0.. {
            let name = format!("soak-{i}-{attempt}");
            let args = [
                "start", "--notify", "--window", "0", "--name", &name, "--", &command,
            ];
            match call_once(&home, &args) {
                Ok(reply) => {
                    plans.insert(reply["id"].as_str().unwrap().to_string(), plan);
                    break;
                }
                Err(reply) => assert!(unanswered(&reply), "start refused: {reply}"),
            }
            // The daemon died mid-start: did the record get made, and did it run? A new
            // daemon has reconciled it by the time it answers.
            let list = call(&home, &["list", "--all"]).unwrap();
            let record = list["items"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["name"] == name.as_str())
                .cloned();
            match record {
                Some(record) if !record["pid"].is_null() => {
                    plans.insert(record["id"].as_str().unwrap().to_string(), plan);
                    break;
                }
                _ => interrupted_starts += 1,
            }
        }
        if rng.next(4) == 0 {
            collect(&mut delivered);
        }
    }
    for (id, plan) in &plans {
        if matches!(plan, Plan::Stop) {
            let reply = call(&home, &["stop", id, "--grace", "1"]).unwrap();
            if reply["state"] != "ended" {
                eventually(Duration::from_secs(30), || {
                    call(&home, &["list", "--all"]).unwrap()["items"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|r| r["id"] == id.as_str() && r["state"] == "ended")
                });
            }
        }
    }
    // Let the killer finish its kills while the last jobs end; stop it after a minute.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while kills.load(Ordering::SeqCst) < n_kills && std::time::Instant::now() < deadline {
        call(&home, &["list"]).unwrap();
    }
    done.store(true, Ordering::SeqCst);
    killer.join().unwrap();
    eventually(Duration::from_secs(60), || {
        call(&home, &["list"]).unwrap()["items"] == serde_json::json!([])
    });
    collect(&mut delivered);
    collect(&mut delivered);

    let list = call(&home, &["list", "--all"]).unwrap();
    let records = list["items"].as_array().unwrap();
    let ids: BTreeSet<&str> = records.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), records.len(), "ids are unique");
    let (mut ends_checked, mut lost, mut notices) = (0, 0, 0);
    let mut duplicates = 0;
    for record in records {
        let id = record["id"].as_str().unwrap();
        assert_eq!(record["state"], "ended", "{record}");
        let unique: BTreeSet<&String> = delivered
            .get(id)
            .map(|v| v.iter().collect())
            .unwrap_or_default();
        duplicates += delivered.get(id).map_or(0, |v| v.len()) - unique.len();
        let Some(plan) = plans.get(id) else {
            // A start the daemon died in before the job ran: lost, its notice once.
            assert_eq!(record["end"], "lost", "{record}");
            assert!(record["pid"].is_null());
            assert_eq!(unique.len(), 1, "{id}: the lost notice, once");
            continue;
        };
        if record["end"] == "lost" {
            lost += 1;
        }
        match plan {
            Plan::Exit(0) => assert_eq!(record["end"], "succeeded", "{record}"),
            Plan::Exit(code) => {
                assert_eq!(record["end"], "failed", "{record}");
                assert_eq!(record["exit_code"], *code, "{record}");
            }
            Plan::Signal => {
                assert_eq!(record["end"], "signaled", "{record}");
                assert_eq!(record["signal"], 15, "{record}");
            }
            Plan::Stop => assert_eq!(record["end"], "stopped_by_agent", "{record}"),
        }
        let expected = if matches!(plan, Plan::Stop) { 0 } else { 1 };
        assert_eq!(
            unique.len(),
            expected,
            "{id} ({plan:?}): notices {unique:?}"
        );
        notices += unique.len();
        let output = call(&home, &["read", id, "--all"]).unwrap();
        assert!(
            output["output"].as_str().unwrap().contains("out-"),
            "{id} kept its output"
        );
        ends_checked += 1;
    }
    let daemon = daemon_pid(&home);
    eventually(Duration::from_secs(10), || {
        processes_of(home.path())
            .into_iter()
            .all(|p| Some(p) == daemon)
    });
    call(&home, &["shutdown"]).unwrap();
    eventually(Duration::from_secs(10), || daemon_pid(&home).is_none());
    let store = bgwork::store::Store::open(&home.path().join("work.db"), 0).unwrap();
    assert_eq!(store.integrity_check().unwrap(), "ok");
    assert_eq!(lost, 0, "no job that ran was lost");
    println!(
        "soak: {} jobs, {} daemon kills, {ends_checked} ends checked, {notices} notices delivered \
         ({duplicates} repeated deliveries), {lost} lost, {interrupted_starts} starts interrupted",
        plans.len(),
        kills.load(Ordering::SeqCst)
    );
}

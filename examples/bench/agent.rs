//! Figure 6: what each way of dispatching a long command costs an agent.

use super::{Home, Opts};
use serde_json::Value;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// One way for an agent to dispatch the suite.
type Strategy = fn(&Home, &Costs) -> Tally;

/// The scenario of the reference lesson, scaled down tenfold: a 4 s test suite, three
/// independent edits, then a report; a model turn is 0.8 s and an edit 0.5 s.
struct Costs {
    turn: Duration,
    edit: Duration,
    suite: &'static str,
}

#[derive(Default)]
struct Tally {
    calls: u32,
    empty_polls: u32,
    reads: u32,
    bytes: usize,
    wall_ms: f64,
}

pub fn agent_cost(opts: &Opts, report: &mut String) {
    let scale = if opts.smoke { 0.25 } else { 1.0 };
    let costs = Costs {
        turn: Duration::from_secs_f64(0.8 * scale),
        edit: Duration::from_secs_f64(0.5 * scale),
        suite: if opts.smoke {
            "sleep 1; for i in $(seq 41); do echo \"test_$i PASSED\"; done; echo '42 passed'"
        } else {
            "sleep 4; for i in $(seq 41); do echo \"test_$i PASSED\"; done; echo '42 passed'"
        },
    };
    let strategies: [(&str, Strategy); 4] = [
        ("blocking (`run`, then the edits)", blocking),
        ("background + polling `read`", polling),
        (
            "notice without output (end only), then a read",
            notice_then_read,
        ),
        ("**bgwork: notice with end and tail**", notice_with_tail),
    ];
    let mut results = Vec::new();
    for (name, strategy) in strategies {
        let home = Home::new(opts, &[]);
        let began = Instant::now();
        let mut tally = strategy(&home, &costs);
        tally.wall_ms = began.elapsed().as_secs_f64() * 1000.0;
        results.push((name, tally));
    }
    let _ = writeln!(report, "## 6. Agent cost\n\nThe scenario of the reference lesson scaled down tenfold{}: a 4 s test suite, three edits that do not depend on it (0.5 s each), then a report; every model turn costs 0.8 s (simulated), every bgwork call is real. Counted: tool calls the model makes, empty polls (a read that finds the job still running), bytes of tool results returned to the model.\n", if opts.smoke { " (and by four again in --smoke)" } else { "" });
    let _ = writeln!(
        report,
        "| strategy | wall s | tool calls | empty polls | read calls | bytes to the model |"
    );
    let _ = writeln!(report, "| --- | ---: | ---: | ---: | ---: | ---: |");
    for (name, t) in &results {
        let _ = writeln!(
            report,
            "| {name} | {:.1} | {} | {} | {} | {} |",
            t.wall_ms / 1000.0,
            t.calls,
            t.empty_polls,
            t.reads,
            t.bytes
        );
    }
    let bg = &results[3].1;
    let _ = writeln!(
        report,
        "\nTarget (the bgwork strategy needs no poll and no separate read call): {}.\n",
        if bg.empty_polls == 0 && bg.reads == 0 {
            "met"
        } else {
            "missed"
        }
    );
}

fn tool(home: &Home, tally: &mut Tally, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let output = home.run(&all);
    tally.calls += 1;
    tally.bytes += output.stdout.len();
    serde_json::from_slice(&output.stdout).unwrap_or_default()
}

fn edits(costs: &Costs, tally: &mut Tally) {
    for _ in 0..3 {
        std::thread::sleep(costs.turn + costs.edit);
        tally.calls += 1;
        tally.bytes += 40; // "edited CHANGELOG.md" and the like
    }
}

fn blocking(home: &Home, costs: &Costs) -> Tally {
    let mut tally = Tally::default();
    std::thread::sleep(costs.turn);
    tool(
        home,
        &mut tally,
        &["run", "--timeout", "60", "--", costs.suite],
    );
    edits(costs, &mut tally);
    std::thread::sleep(costs.turn);
    tally
}

fn polling(home: &Home, costs: &Costs) -> Tally {
    let mut tally = Tally::default();
    std::thread::sleep(costs.turn);
    let id = tool(
        home,
        &mut tally,
        &["start", "--window", "0", "--", costs.suite],
    )["id"]
        .as_str()
        .unwrap()
        .to_string();
    edits(costs, &mut tally);
    loop {
        std::thread::sleep(costs.turn);
        let read = tool(home, &mut tally, &["read", &id]);
        tally.reads += 1;
        if read["running"] == false {
            break;
        }
        tally.empty_polls += 1;
    }
    std::thread::sleep(costs.turn);
    tally
}

/// The harness holds the model until a notice arrives (no tool call), then the model
/// takes a turn with it.
fn await_notice(home: &Home, tally: &mut Tally, with_tail: bool) -> Value {
    let notices = home.json(&["notices", "--wait", "60"]);
    let mut notice = notices["notices"][0].clone();
    if !with_tail {
        notice["tail"] = Value::String(String::new());
    }
    tally.bytes += notice.to_string().len();
    notice
}

fn notice_then_read(home: &Home, costs: &Costs) -> Tally {
    let mut tally = Tally::default();
    std::thread::sleep(costs.turn);
    let id = tool(
        home,
        &mut tally,
        &["start", "--notify", "--window", "0", "--", costs.suite],
    )["id"]
        .as_str()
        .unwrap()
        .to_string();
    edits(costs, &mut tally);
    await_notice(home, &mut tally, false);
    std::thread::sleep(costs.turn);
    tool(home, &mut tally, &["read", &id]);
    tally.reads += 1;
    std::thread::sleep(costs.turn);
    tally
}

fn notice_with_tail(home: &Home, costs: &Costs) -> Tally {
    let mut tally = Tally::default();
    std::thread::sleep(costs.turn);
    tool(
        home,
        &mut tally,
        &["start", "--notify", "--window", "0", "--", costs.suite],
    );
    edits(costs, &mut tally);
    let notice = await_notice(home, &mut tally, true);
    assert!(notice["tail"].as_str().unwrap_or("").contains("42 passed"));
    std::thread::sleep(costs.turn);
    tally
}

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
    auto_scenarios(opts, &costs, scale, report);
}

/// One of the lesson's scenarios: a command, the independent edits there are to do
/// while it runs, and the model's use of its output after them.
struct Scenario {
    name: &'static str,
    command: String,
    edits: u32,
}

/// How the model dispatches the command of a scenario.
#[derive(Clone, Copy, PartialEq)]
enum Dispatch {
    Block,
    Background,
    Auto,
}

/// `run --timeout auto` against always blocking and always backgrounding, in the
/// lesson's three scenarios (scaled tenfold, as above), after one earlier run of the
/// same command (the history `auto` decides by). Backgrounding costs what the lesson
/// says it costs: the result has to be taken in (a `wait` call, a turn) after the
/// independent work.
fn auto_scenarios(opts: &Opts, costs: &Costs, scale: f64, report: &mut String) {
    let suite = 4.0 * scale;
    let quick = 0.5 * scale;
    // The lesson's break-even plus a margin (15 s), scaled as the rest.
    let threshold = format!("{}", 1.5 * scale);
    let scenarios = [
        Scenario {
            name: "the default run: the suite, three independent edits",
            command: format!("sleep {suite}; echo '42 passed'"),
            edits: 3,
        },
        Scenario {
            name: "the 5 s command, one independent edit",
            command: format!("sleep {quick}; echo 'lint clean'"),
            edits: 1,
        },
        Scenario {
            name: "the follow-up needs the output (the suite, no edits)",
            command: format!("sleep {suite}; echo '42 passed'"),
            edits: 0,
        },
    ];
    let _ = writeln!(report, "### `run --timeout auto`\n\nThe lesson's scenarios with the same costs (suite {suite} s, the \"5 s\" command {quick} s, a turn {:.1} s, an edit {:.1} s), the auto threshold scaled to {threshold} s (`BGWORK_AUTO_BACKGROUND_S`), after one earlier run of the command in the same folder. Backgrounding is `start --notify`, the edits, then a `wait` for the result; blocking is `run`, then the edits. Wall time of the agent, seconds (median of 3).\n", costs.turn.as_secs_f64(), costs.edit.as_secs_f64());
    let _ = writeln!(
        report,
        "| scenario | always block | always background | `--timeout auto` (chose) | auto vs the better |"
    );
    let _ = writeln!(report, "| --- | ---: | ---: | ---: | ---: |");
    let mut met = true;
    for scenario in &scenarios {
        let mut walls = Vec::new();
        let mut chose = String::new();
        for dispatch in [Dispatch::Block, Dispatch::Background, Dispatch::Auto] {
            let mut runs = Vec::new();
            for _ in 0..3 {
                let home = Home::new(opts, &[("BGWORK_AUTO_BACKGROUND_S", &threshold)]);
                // The earlier run that history keeps.
                home.json(&["run", "--timeout", "60", "--", &scenario.command]);
                let began = Instant::now();
                let reply = dispatch_scenario(&home, costs, scenario, dispatch);
                runs.push(began.elapsed().as_secs_f64());
                if dispatch == Dispatch::Auto {
                    chose = match reply["outcome"].as_str() {
                        Some("promoted") => "background".into(),
                        _ => "foreground".into(),
                    };
                }
            }
            runs.sort_by(|a, b| a.partial_cmp(b).unwrap());
            walls.push(runs[1]);
        }
        let better = walls[0].min(walls[1]);
        let ratio = walls[2] / better - 1.0;
        met &= ratio <= 0.05;
        let _ = writeln!(
            report,
            "| {} | {:.2} | {:.2} | {:.2} ({chose}) | {:+.1} % |",
            scenario.name,
            walls[0],
            walls[1],
            walls[2],
            ratio * 100.0
        );
    }
    let _ = writeln!(
        report,
        "\nTarget (`--timeout auto` within 5 % of the better of the two in each scenario): {}.\n",
        if met { "met" } else { "missed" }
    );
    if !met {
        super::note("agent cost: `--timeout auto` was more than 5 % slower than the better of always blocking and always backgrounding in a scenario");
    }
}

/// The model's turns for one scenario; returns the reply of its dispatch.
fn dispatch_scenario(home: &Home, costs: &Costs, scenario: &Scenario, dispatch: Dispatch) -> Value {
    let mut tally = Tally::default();
    std::thread::sleep(costs.turn);
    let reply = match dispatch {
        Dispatch::Block => tool(
            home,
            &mut tally,
            &["run", "--timeout", "60", "--", &scenario.command],
        ),
        Dispatch::Background => tool(
            home,
            &mut tally,
            &[
                "start",
                "--notify",
                "--window",
                "0",
                "--",
                &scenario.command,
            ],
        ),
        Dispatch::Auto => tool(
            home,
            &mut tally,
            &["run", "--timeout", "auto", "--", &scenario.command],
        ),
    };
    for _ in 0..scenario.edits {
        std::thread::sleep(costs.turn + costs.edit);
    }
    let backgrounded = match dispatch {
        Dispatch::Block => false,
        Dispatch::Background => true,
        Dispatch::Auto => reply["outcome"] == "promoted",
    };
    if backgrounded {
        // The result is taken in: a turn, and a wait for what is not there yet.
        std::thread::sleep(costs.turn);
        let id = reply["id"].as_str().unwrap_or_default().to_string();
        tool(home, &mut tally, &["wait", &id, "--timeout", "60"]);
    }
    std::thread::sleep(costs.turn);
    reply
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

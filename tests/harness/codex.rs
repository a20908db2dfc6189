//! Codex CLI (`codex exec`) with a model provider on the scripted server, the hooks of
//! docs/harnesses.md in `~/.codex/hooks.json` and bgwork's MCP server in
//! `~/.codex/config.toml`, as docs/harnesses.md tells a user.

use crate::server::{ModelServer, Step};
use crate::setup::{installed, World, CODEX};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

const SECRET: &str = "hunter2-codex-51ab09";

fn world(test: &str, server: &ModelServer) -> Option<(World, PathBuf)> {
    let codex = installed(test, CODEX)?;
    let mut world = World::new();
    world.write(
        "home/.codex/hooks.json",
        &crate::documented_snippet("codex"),
    );
    world.write(
        "home/.codex/config.toml",
        &format!(
            r#"model = "gpt-5.1-codex"
model_provider = "scripted"

[model_providers.scripted]
name = "scripted model"
base_url = "{}/v1"
wire_api = "responses"
env_key = "SCRIPTED_API_KEY"

{}"#,
            server.url(),
            // As docs/harnesses.md says: the variables `secrets` names, in `env_vars` too.
            crate::documented_snippet("codex-mcp")
                .replace(r#""XDG_DATA_HOME"]"#, r#""XDG_DATA_HOME", "DEPLOY_TOKEN"]"#)
        ),
    );
    world.env = vec![
        ("SCRIPTED_API_KEY".into(), "sk-scripted-test-key".into()),
        ("BGWORK_SESSION".into(), "shop".into()),
        ("DEPLOY_TOKEN".into(), SECRET.into()),
    ];
    Some((world, codex))
}

fn shell(cmd: &str) -> Step {
    Step::Call {
        name: "exec_command".into(),
        namespace: None,
        args: json!({"cmd": cmd}),
    }
}

fn mcp(tool: &str, args: Value) -> Step {
    Step::Call {
        name: tool.into(),
        namespace: Some("mcp__bgwork".into()),
        args,
    }
}

fn exec(world: &World, codex: &Path, prompt: &str) -> crate::setup::Finished {
    exec_with(world, codex, &[prompt])
}

fn exec_with(world: &World, codex: &Path, rest: &[&str]) -> crate::setup::Finished {
    let mut args = vec![
        "exec",
        "--skip-git-repo-check",
        // As root the sandbox cannot start; a user's own `bgwork` needs its home
        // outside the workspace anyway.
        "--dangerously-bypass-approvals-and-sandbox",
        // A user trusts a new hook once in the TUI's `/hooks`; `exec` runs only
        // trusted hooks, and this is how automation trusts them.
        "--dangerously-bypass-hook-trust",
    ];
    args.extend_from_slice(rest);
    world.run(world.command(codex, &args), Duration::from_secs(120))
}

#[test]
fn issue25_1_codex_shell_start_notice_once_and_secret_never_sent() {
    let server = ModelServer::start(crate::setup::shell_round_script(shell, "shell-marker"));
    let Some((world, codex)) = world("codex_shell", &server) else {
        return;
    };
    let finished = exec(&world, &codex, "start the deploy in the background");
    server.save("codex_shell");
    finished.expect_ok();
    crate::setup::assert_shell_round(&server, "end-shell-marker", SECRET);
}

#[test]
fn issue25_3_codex_mcp_tools_listed_start_read_wait_stop_and_notice_once() {
    let server = ModelServer::start(crate::setup::mcp_round_script(mcp, shell));
    let Some((world, codex)) = world("codex_mcp", &server) else {
        return;
    };
    let finished = exec(&world, &codex, "start a quick job through bgwork's tools");
    server.save("codex_mcp");
    finished.expect_ok();
    // The tools as Codex offers them: one namespace, each tool with its description and
    // schema.
    let tools = server.at(0).body["tools"].clone();
    let namespace = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "mcp__bgwork")
        .unwrap_or_else(|| panic!("no mcp__bgwork namespace: {tools}"));
    let names: Vec<&str> = namespace["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    for tool in [
        "start", "run", "list", "read", "wait", "stop", "notices", "send", "monitor",
    ] {
        assert!(names.contains(&tool), "{tool} not offered: {names:?}");
    }
    let start = namespace["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "start")
        .unwrap();
    assert!(start["description"]
        .as_str()
        .unwrap()
        .contains("background"));
    assert_eq!(start["parameters"]["required"], json!(["command"]));
    crate::setup::assert_mcp_round(&server, SECRET);
}

#[test]
fn issue25_5_codex_goes_on_under_a_stopped_daemon() {
    crate::setup::goes_on_under_a_stopped_daemon(
        "codex_stopped_daemon",
        shell,
        world,
        Duration::from_secs(30),
        |world, codex| exec(world, codex, "say something"),
    );
}

#[test]
fn issue25_2_codex_cannot_wake_an_idle_session_the_next_prompt_gets_the_end() {
    crate::setup::idle_session_gets_the_end_at_the_next_prompt(
        "codex_idle",
        shell,
        world,
        |world, codex| exec(world, codex, "start the job"),
        |world, codex| exec_with(world, codex, &["resume", "--last", "what happened?"]),
    );
}

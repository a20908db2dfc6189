//! Gemini CLI (`gemini -p`) against the scripted server as its base URL, with the hooks
//! of docs/harnesses.md and bgwork's MCP server in `~/.gemini/settings.json`.

use crate::server::{ModelServer, Step};
use crate::setup::{installed, World, GEMINI};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

const SECRET: &str = "hunter2-gemini-0c77e1";

fn world(test: &str, server: &ModelServer) -> Option<(World, PathBuf)> {
    let gemini = installed(test, GEMINI)?;
    let mut world = World::new();
    let mut settings: Value = serde_json::from_str(&crate::documented_snippet("gemini")).unwrap();
    let mcp: Value = serde_json::from_str(&crate::documented_snippet("gemini-mcp")).unwrap();
    settings["mcpServers"] = mcp["mcpServers"].clone();
    // As docs/harnesses.md says: a variable MCP `start` names in `secrets` is given to
    // the server by name (Gemini keeps variables named like secrets from MCP servers).
    settings["mcpServers"]["bgwork"]["env"] = json!({"DEPLOY_TOKEN": "$DEPLOY_TOKEN"});
    // What a user's first interactive run asks and keeps: sign in with an API key.
    settings["security"] = json!({"auth": {"selectedType": "gemini-api-key"}});
    world.write("home/.gemini/settings.json", &settings.to_string());
    world.env = vec![
        ("GEMINI_API_KEY".into(), "scripted-test-key".into()),
        ("GOOGLE_GEMINI_BASE_URL".into(), server.url()),
        ("GEMINI_CLI_TRUST_WORKSPACE".into(), "true".into()),
        ("BGWORK_SESSION".into(), "shop".into()),
        ("DEPLOY_TOKEN".into(), SECRET.into()),
    ];
    Some((world, gemini))
}

fn shell(command: &str) -> Step {
    crate::server::call("run_shell_command", json!({"command": command}))
}

fn prompt(world: &World, gemini: &Path, prompt: &str) -> crate::setup::Finished {
    prompt_with(world, gemini, &["-p", prompt])
}

fn prompt_with(world: &World, gemini: &Path, rest: &[&str]) -> crate::setup::Finished {
    let mut args = vec!["--approval-mode", "yolo"];
    args.extend_from_slice(rest);
    world.run(world.command(gemini, &args), Duration::from_secs(150))
}

#[test]
fn issue25_1_gemini_shell_start_notice_once_and_secret_never_sent() {
    let server = ModelServer::start(crate::setup::shell_round_script(shell, "shell-marker"));
    let Some((world, gemini)) = world("gemini_shell", &server) else {
        return;
    };
    let finished = prompt(&world, &gemini, "start the deploy in the background");
    server.save("gemini_shell");
    finished.expect_ok();
    crate::setup::assert_shell_round(&server, "end-shell-marker", SECRET);
}

fn mcp(tool: &str, args: Value) -> Step {
    crate::server::call(&format!("mcp_bgwork_{tool}"), args)
}

#[test]
fn issue25_3_gemini_mcp_tools_listed_start_read_wait_stop_and_notice_once() {
    let server = ModelServer::start(crate::setup::mcp_round_script(mcp, shell));
    let Some((world, gemini)) = world("gemini_mcp", &server) else {
        return;
    };
    let finished = prompt(&world, &gemini, "start a quick job through bgwork's tools");
    server.save("gemini_mcp");
    finished.expect_ok();
    // The tools as Gemini declares them: `mcp_bgwork_NAME`, with description and schema.
    let declared: Vec<Value> = server.at(0).body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| {
            t["functionDeclarations"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    for tool in [
        "start", "run", "list", "read", "wait", "stop", "notices", "send", "monitor",
    ] {
        let name = format!("mcp_bgwork_{tool}");
        assert!(
            declared.iter().any(|d| d["name"] == name),
            "{name} not declared"
        );
    }
    let start = declared
        .iter()
        .find(|d| d["name"] == "mcp_bgwork_start")
        .unwrap();
    assert!(start["description"]
        .as_str()
        .unwrap()
        .contains("background"));
    let schema = if start["parametersJsonSchema"].is_object() {
        &start["parametersJsonSchema"]
    } else {
        &start["parameters"]
    };
    assert_eq!(schema["required"], json!(["command"]), "{start}");
    crate::setup::assert_mcp_round(&server, SECRET);
}

#[test]
fn issue25_5_gemini_goes_on_under_a_stopped_daemon() {
    crate::setup::goes_on_under_a_stopped_daemon(
        "gemini_stopped_daemon",
        shell,
        world,
        Duration::from_secs(40),
        |world, gemini| prompt(world, gemini, "say something"),
    );
}

#[test]
fn issue25_2_gemini_cannot_wake_an_idle_session_the_next_prompt_gets_the_end() {
    crate::setup::idle_session_gets_the_end_at_the_next_prompt(
        "gemini_idle",
        shell,
        world,
        |world, gemini| prompt(world, gemini, "start the job"),
        |world, gemini| {
            prompt_with(
                world,
                gemini,
                &["--resume", "latest", "-p", "what happened?"],
            )
        },
    );
}

//! Daemon messages, written for the command line, reworded in terms of tools.

use super::arguments::option_name;
use crate::wire::{self, WireError};
use serde_json::Value;

/// An error as the object of docs/contract.md §10, its message in terms of tools.
pub fn error_object(error: &WireError) -> Value {
    let mut error = error.clone();
    error.message = for_model(&error.message);
    serde_json::to_value(wire::ErrorReply { error }).unwrap_or_default()
}

/// A daemon message written for the command line, in terms of MCP tools: `` `bgwork
/// list --all` `` becomes "the `list` tool with `all: true`", `--grace` `grace_s`.
pub fn for_model(message: &str) -> String {
    use std::sync::OnceLock;
    static COMMAND: OnceLock<regex::Regex> = OnceLock::new();
    static OPTION: OnceLock<regex::Regex> = OnceLock::new();
    let command = COMMAND.get_or_init(|| {
        regex::Regex::new(r"`bgwork ([a-z]+)( start)?([^`]*)`").expect("a valid pattern")
    });
    // A quoted span first (one that gives options is said as arguments, its quotes
    // kept once), then an option named outside any quotes.
    let option = OPTION
        .get_or_init(|| regex::Regex::new(r"`([^`]*)`|--([a-z][a-z-]*)").expect("a valid pattern"));
    let text = command.replace_all(message, |caps: &regex::Captures| {
        let tool = match (&caps[1], caps.get(2).is_some()) {
            ("agent", true) => "agent_start".to_string(),
            (name, _) => name.to_string(),
        };
        let words: Vec<&str> = caps[3].split_whitespace().collect();
        let mut arguments = Vec::new();
        // Every `--env K=V` of the command goes into the one `env` object.
        let mut env = Vec::new();
        let mut index = 0;
        while index < words.len() {
            let word = words[index];
            index += 1;
            let value = words.get(index).filter(|next| !next.starts_with("--"));
            match word.strip_prefix("--") {
                Some("") => break,
                Some("env") => {
                    let (name, text) = value
                        .and_then(|v| v.split_once('='))
                        .unwrap_or(("NAME", "VALUE"));
                    if env.is_empty() {
                        // Its place among the arguments, filled in below.
                        arguments.push(String::new());
                    }
                    env.push(format!("\"{name}\": \"{text}\""));
                    index += 1;
                }
                Some(flag) => {
                    let flag = option_name(flag);
                    match value {
                        Some(value) => {
                            arguments.push(format!("{flag}: {value}"));
                            index += 1;
                        }
                        None => arguments.push(format!("{flag}: true")),
                    }
                }
                None if word.contains('-') && word.len() < 12 => {
                    arguments.push(format!("id: {word}"))
                }
                None => {}
            }
        }
        if let Some(place) = arguments.iter_mut().find(|a| a.is_empty()) {
            *place = format!("env: {{{}}}", env.join(", "));
        }
        match arguments.as_slice() {
            [] => format!("the `{tool}` tool"),
            args => format!("the `{tool}` tool with `{}`", args.join(", ")),
        }
    });
    option
        .replace_all(&text, |caps: &regex::Captures| match caps.get(1) {
            Some(span) if span.as_str().starts_with("--") => {
                format!("`{}`", options_as_arguments(span.as_str()))
            }
            Some(_) => caps[0].to_string(),
            None => format!("`{}`", option_name(&caps[2])),
        })
        .into_owned()
}

/// `--restart on-failure --max-restarts 3` as a tool's arguments:
/// `restart: on-failure, max_restarts: 3`.
fn options_as_arguments(span: &str) -> String {
    let mut arguments: Vec<String> = Vec::new();
    for word in span.split_whitespace() {
        match word.strip_prefix("--") {
            Some(flag) if !flag.is_empty() => {
                arguments.push(format!("{}: true", option_name(flag)))
            }
            _ => match arguments.last_mut() {
                Some(last) if last.ends_with(": true") => {
                    last.truncate(last.len() - "true".len());
                    last.push_str(word);
                }
                Some(last) => {
                    last.push(' ');
                    last.push_str(word);
                }
                None => arguments.push(word.to_string()),
            },
        }
    }
    arguments.join(", ")
}

#[cfg(test)]
mod tests {
    use super::for_model;

    #[test]
    fn messages_for_the_command_line_speak_of_tools() {
        assert_eq!(
            for_model("no item bg-9 in this session: `bgwork list --all` shows the ids it has"),
            "no item bg-9 in this session: the `list` tool with `all: true` shows the ids it has"
        );
        assert_eq!(
            for_model("give it again (`bgwork restart bg-1 --env WHO=VALUE`)"),
            "give it again (the `restart` tool with `id: bg-1, env: {\"WHO\": \"VALUE\"}`)"
        );
        // Two values, one object: a second `env` key would replace the first.
        assert_eq!(
            for_model("(`bgwork restart bg-1 --env A=VALUE --env B=VALUE`)"),
            "(the `restart` tool with `id: bg-1, env: {\"A\": \"VALUE\", \"B\": \"VALUE\"}`)"
        );
        assert_eq!(
            for_model("--grace takes seconds; `bgwork stop bg-2` first"),
            "`grace_s` takes seconds; the `stop` tool with `id: bg-2` first"
        );
        assert_eq!(
            for_model("`bgwork agent start -- x`"),
            "the `agent_start` tool"
        );
        // A quoted option is said once, as the tool's argument (issue 26 item 9).
        assert_eq!(
            for_model("the one there is, is `--restart on-failure`; or --pty"),
            "the one there is, is `restart: on-failure`; or `pty`"
        );
        assert_eq!(
            for_model("use `--allow-duplicate` or `--max-restarts 3 --backoff 1s..5s`"),
            "use `allow_duplicate: true` or `max_restarts: 3, backoff: 1s..5s`"
        );
    }
}

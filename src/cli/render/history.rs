//! `history` as text: each command of a folder with its usual time and its last ends.

use super::terminal::inert;
use crate::wire::{self, End};
use std::borrow::Cow;

/// How many commands `history`'s text shows, and how much of each (`--json` has all).
const HISTORY_SHOWN: usize = 50;
const HISTORY_COMMAND_SHOWN: usize = 300;

/// `history`: each command of the folder with its median, p90 and last ends (the session
/// of a run named when it is not the caller's, whose ids are another session's).
pub(super) fn history_text(reply: &wire::HistoryReply, session: &str) -> String {
    if reply.commands.is_empty() {
        return match &reply.command {
            Some(command) => format!(
                "no history of `{}` in {}: `bgwork history --cwd {}` lists the commands \
                 run there",
                inert(&cut(command, HISTORY_COMMAND_SHOWN)),
                inert(&reply.cwd),
                inert(&reply.cwd)
            ),
            None => format!(
                "no history in {}: a job or pane that ends there is kept",
                inert(&reply.cwd)
            ),
        };
    }
    let mut lines = vec![format!("in {}", inert(&reply.cwd))];
    for command in reply.commands.iter().take(HISTORY_SHOWN) {
        let ms = |ms: Option<u64>| {
            ms.map(crate::history::human_ms)
                .unwrap_or_else(|| "-".into())
        };
        lines.push(format!(
            "{}\n  {}; median {}, p90 {}",
            inert(&cut(&command.command, HISTORY_COMMAND_SHOWN)),
            inert(&command.expected),
            ms(command.median_ms),
            ms(command.p90_ms)
        ));
        let ends: Vec<String> = command
            .last
            .iter()
            .take(crate::history::RECENT)
            .map(|run| {
                let end = match (run.end, run.exit_code, run.signal) {
                    (_, _, Some(signal)) => format!("{} (sig {signal})", wire::name_of(&run.end)),
                    (End::Succeeded | End::Failed, Some(code), None) => {
                        format!("{} ({code})", wire::name_of(&run.end))
                    }
                    _ => wire::name_of(&run.end),
                };
                let whose = match run.session == session {
                    true => String::new(),
                    false => format!(" of session {}", inert(&run.session)),
                };
                format!("{}{whose} {end} in {}", inert(&run.id), ms(run.duration_ms))
            })
            .collect();
        lines.push(format!("  last: {}", ends.join(", ")));
    }
    let past_shown = reply.commands.len().saturating_sub(HISTORY_SHOWN);
    let more = past_shown as u64 + reply.more_commands;
    if more > 0 {
        // `--json` lists the most recent 200; older ones are asked for one by one.
        let json = match reply.more_commands {
            0 => "`--json` all".to_string(),
            _ => format!("`--json` the {} most recent", reply.commands.len()),
        };
        lines.push(format!(
            "{more} more commands, run less recently: `bgwork history -- CMD` shows one, {json}"
        ));
    }
    lines.join("\n")
}

/// `text` cut to at most `max` bytes (on a character boundary), with "…" when cut.
fn cut(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}…", &text[..end]))
}

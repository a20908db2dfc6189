//! Work that waits for work (`start --after ID[:COND]`, contract §14): the condition a
//! waiting item waits for, as callers write it and as the socket carries it, and the
//! description of a waiting item kept in its folder (`after.json`) and handed to the
//! process that keeps its start's arguments (`bgwork keep`).

use super::StartArgs;
use serde::{Deserialize, Serialize};

/// The most `--after` conditions one start takes.
pub const MAX_AFTER: usize = 16;
/// The longest `output RE` pattern.
pub const MAX_PATTERN: usize = 4096;

/// One condition of a waiting item: the item it waits for and what must happen.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct After {
    /// The awaited item, as the caller's session addresses it (`bg-3`, `sub-1/bg-2`).
    pub id: String,
    #[serde(flatten)]
    pub until: Until,
}

/// What the awaited item must do.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "until", rename_all = "snake_case")]
pub enum Until {
    /// It ends `succeeded` (the default).
    Succeeded,
    /// It ends, however.
    Ended,
    /// A line of its output, as readers are shown it (masked), matches the regex.
    Output { regex: String },
    /// Its processes listen on a TCP port.
    Port,
}

impl After {
    /// Reads `ID[:COND]`: COND is `succeeded` (the default), `ended`, `output RE` or
    /// `port`. Whether the regex compiles is the daemon's to check.
    pub fn parse(text: &str) -> Result<After, String> {
        let text = text.trim();
        let (id, cond) = match text.split_once(':') {
            Some((id, cond)) => (id.trim(), Some(cond)),
            None => (text, None),
        };
        if id.is_empty() {
            return Err(format!(
                "--after {text:?} names no item: give ID[:COND], e.g. bg-3 or \
                 'bg-3:output ready'"
            ));
        }
        let until = match cond.map(str::trim_start) {
            None => Until::Succeeded,
            Some(cond) => match cond.trim_end() {
                "succeeded" => Until::Succeeded,
                "ended" => Until::Ended,
                "port" => Until::Port,
                _ => match cond.strip_prefix("output") {
                    Some(rest) if rest.starts_with([' ', '\t']) && !rest.trim().is_empty() => {
                        Until::Output {
                            regex: rest.trim().to_string(),
                        }
                    }
                    Some(_) => {
                        return Err(format!(
                            "--after {text:?}: `output` needs a pattern after a space, e.g. \
                             '{id}:output listening on'"
                        ))
                    }
                    None => return Err(bad_cond(text, id)),
                },
            },
        };
        Ok(After {
            id: id.to_string(),
            until,
        })
    }

    /// What a waiting item waits for in words: `bg-3 to succeed`.
    pub fn describe(&self, id: &str) -> String {
        match &self.until {
            Until::Succeeded => format!("{id} to succeed"),
            Until::Ended => format!("{id} to end"),
            Until::Output { regex } => format!("{id} to print /{regex}/"),
            Until::Port => format!("{id} to listen on a TCP port"),
        }
    }
}

fn bad_cond(text: &str, id: &str) -> String {
    format!(
        "--after {text:?}: the condition after `:` is one of `succeeded` (the default), \
         `ended`, `output RE` or `port`, e.g. {id}:ended"
    )
}

/// One condition as a waiting item keeps it: the awaited record's row (its identity;
/// an id is only how a session addresses it) with the id shown.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Awaited {
    pub row: i64,
    pub id: String,
    #[serde(flatten)]
    pub until: Until,
}

/// `after.json` in a waiting item's folder: what it waits for (no value of its
/// environment: those are kept by `bgwork keep` only).
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct AfterFile {
    pub owner: String,
    pub awaited: Vec<Awaited>,
}

/// What the daemon hands `bgwork keep` on its stdin, and what it answers with.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Kept {
    /// The waiting item it keeps for (`session/id@started`).
    pub owner: String,
    pub args: StartArgs,
}

/// A request to `bgwork keep` on its socket: give the arguments, or give them and go.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KeepRequest {
    Get,
    Done,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_condition() {
        let of = |t: &str| After::parse(t).map(|a| a.until);
        assert_eq!(of("bg-3"), Ok(Until::Succeeded));
        assert_eq!(of("bg-3:succeeded"), Ok(Until::Succeeded));
        assert_eq!(of("bg-3:ended"), Ok(Until::Ended));
        assert_eq!(of("bg-3:port"), Ok(Until::Port));
        assert_eq!(
            of("bg-3:output ready: [0-9]+"),
            Ok(Until::Output {
                regex: "ready: [0-9]+".into()
            })
        );
        assert_eq!(After::parse("sub-1/bg-2:ended").unwrap().id, "sub-1/bg-2");
        assert!(of("bg-3:output").is_err());
        assert!(of("bg-3:outputx").is_err());
        assert!(of("bg-3:finished").is_err());
        assert!(of(":ended").is_err());
    }
}

//! Daemon replies made short for a model: fields it rarely needs left out unless
//! `verbose`, what it needs spelled out, and `history` and `list` kept within bounds.

use serde_json::Value;

/// Item fields a model rarely needs; `verbose` keeps them.
const VERBOSE_FIELDS: [&str; 5] = ["log_path", "folder", "env_names", "cwd", "session"];

/// Adds what a model needs spelled out: the URL of each address an item listens on,
/// and, for a `start` answered with the running item, what happened.
pub fn annotate(reply: &mut Value) {
    fn annotate_item(item: &mut Value) {
        let Value::Object(fields) = item else {
            return;
        };
        let urls: Vec<Value> = match fields.get("listening") {
            Some(Value::Array(addresses)) => addresses
                .iter()
                .filter_map(Value::as_str)
                .map(|a| Value::String(crate::observe::url_of(a)))
                .collect(),
            _ => Vec::new(),
        };
        if !urls.is_empty() {
            fields.insert("urls".into(), Value::Array(urls));
        }
        if fields.get("already_running") == Some(&Value::Bool(true)) {
            let id = fields.get("id").and_then(Value::as_str).unwrap_or("?");
            let message = format!(
                "already running as {id}: no new job was started (`allow_duplicate: true` starts another)"
            );
            fields.insert("message".into(), Value::String(message));
        }
    }
    annotate_item(reply);
    if let Some(Value::Array(items)) = reply.get_mut("items") {
        items.iter_mut().for_each(annotate_item);
    }
}

/// Adds to a `start` result of work that runs on, in one line, where its output is and
/// how its end will reach the model (a notice, or only a `wait`).
pub fn annotate_start(reply: &mut Value) {
    let Value::Object(fields) = reply else {
        return;
    };
    let state = fields.get("state").and_then(Value::as_str);
    let running = matches!(
        state,
        Some("running" | "starting" | "queued" | "restarting")
    );
    let id = fields.get("id").and_then(Value::as_str).unwrap_or("?");
    if state == Some("waiting") {
        let next = format!(
            "{id} runs nothing until then (`waiting_for`); it starts by itself, and if it can \
             no longer start it ends cancelled with a notice saying why; `stop` {id} cancels it"
        );
        fields.insert("next".into(), Value::String(next));
        return;
    }
    if !running || fields.contains_key("message") {
        return;
    }
    let restarts = fields.contains_key("restart");
    let next = if fields.get("notify") == Some(&Value::Bool(true)) {
        format!("{id} runs on: `read` {id} shows its output; its end will come once as a notice, with no polling")
    } else if restarts {
        format!("{id} runs on, started again when it fails: `read` {id} shows its output, `list` its restarts; a notice comes only if it gives up (notify was not set)")
    } else {
        format!("{id} runs on: `read` {id} shows its output, `wait` {id} waits for its end (notify was not set: no notice of its end will come; one still comes if it runs far past its usual time)")
    };
    fields.insert("next".into(), Value::String(next));
}

/// Makes a reply short for a model: each item (a reply that is one, or the `items` of
/// one) loses [`VERBOSE_FIELDS`] and its empty fields.
pub fn slim(reply: &mut Value) {
    fn slim_item(item: &mut Value) {
        if let Value::Object(fields) = item {
            if fields.contains_key("id") && fields.contains_key("state") {
                for key in VERBOSE_FIELDS {
                    fields.remove(key);
                }
                fields.retain(|_, value| !value.is_null());
            }
        }
    }
    slim_item(reply);
    if let Some(Value::Array(items)) = reply.get_mut("items") {
        items.iter_mut().for_each(slim_item);
    }
    // A history names the newest few ends of each command.
    if let Some(Value::Array(commands)) = reply.get_mut("commands") {
        for command in commands {
            if let Some(Value::Array(last)) = command.get_mut("last") {
                last.truncate(crate::history::RECENT);
            }
        }
    }
}

/// The most bytes of commands a `history` result carries: a model's context is no place
/// for a whole folder's history.
pub const MCP_HISTORY_BYTES: usize = 32 << 10;

/// Keeps a `history` result within [`MCP_HISTORY_BYTES`]: the most recently run
/// commands first, as many as fit (always one), and how many were left out and how to
/// ask for one of them.
pub fn bound_history(reply: &mut Value) {
    let Some(Value::Array(commands)) = reply.get_mut("commands") else {
        return;
    };
    let left_out = keep_within(commands, MCP_HISTORY_BYTES)
        + reply
            .get("more_commands")
            .and_then(Value::as_u64)
            .unwrap_or(0) as usize;
    if let Some(fields) = reply.as_object_mut() {
        fields.remove("more_commands");
    }
    if left_out == 0 {
        return;
    }
    reply["left_out"] = left_out.into();
    reply["more"] = format!(
        "{left_out} less recently run commands were left out to keep this short: ask for one \
         with \"command\""
    )
    .into();
}

/// Keeps the first entries of a result whose JSON fits in `bytes` (always one); says
/// how many were left out.
fn keep_within(entries: &mut Vec<Value>, bytes: usize) -> usize {
    let mut used = 0;
    let mut kept = 0;
    for entry in entries.iter() {
        used += serde_json::to_string(entry).map_or(0, |text| text.len() + 1);
        if kept > 0 && used > bytes {
            break;
        }
        kept += 1;
    }
    let left_out = entries.len() - kept;
    entries.truncate(kept);
    left_out
}

/// The most bytes of one text field of a listed item (its command, name, what it
/// waits for) an MCP `list` shows.
pub const MCP_LIST_FIELD_BYTES: usize = 1 << 10;
/// The most bytes of items an MCP `list` result carries.
pub const MCP_LIST_BYTES: usize = 32 << 10;

/// Keeps a `list` result short: each item's long text fields cut at
/// [`MCP_LIST_FIELD_BYTES`] (saying how much was left out), then as many items as fit
/// in [`MCP_LIST_BYTES`] (always one), with `left_out` and `more` saying the rest.
pub fn bound_list(reply: &mut Value) {
    let Some(Value::Array(items)) = reply.get_mut("items") else {
        return;
    };
    for item in items.iter_mut() {
        for field in ["command", "name", "waiting_for", "report", "expected"] {
            let Some(Value::String(text)) = item.get_mut(field) else {
                continue;
            };
            if text.len() <= MCP_LIST_FIELD_BYTES {
                continue;
            }
            let mut cut = MCP_LIST_FIELD_BYTES;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            let left = text.len() - cut;
            text.truncate(cut);
            text.push_str(&format!(
                "… ({left} more bytes left out: `bgwork list --json` shows it whole)"
            ));
        }
    }
    let left_out = keep_within(items, MCP_LIST_BYTES);
    if left_out == 0 {
        return;
    }
    reply["left_out"] = left_out.into();
    reply["more"] = format!(
        "{left_out} more items were left out to keep this short: `bgwork list --json` has \
         them all"
    )
    .into();
}

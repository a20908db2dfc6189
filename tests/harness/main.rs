//! bgwork inside the real harnesses: Claude Code, Codex CLI and Gemini CLI, installed
//! from npm at pinned versions (`setup.rs`), each driven by a scripted model on loopback
//! (`server.rs`) whose request log shows exactly what reached the model.

mod claude;
mod codex;
mod gemini;
mod server;
mod setup;

/// The configuration snippet of docs/harnesses.md marked `<!-- tested: NAME -->`: the
/// tests install what the page tells a user to write.
pub fn documented_snippet(name: &str) -> String {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/harnesses.md")).unwrap();
    let marker = format!("<!-- tested: {name} -->");
    let after = &page[page.find(&marker).unwrap_or_else(|| panic!("no {marker}"))..];
    let start = after.find("```").unwrap();
    let body = &after[start..];
    let body = &body[body.find('\n').unwrap() + 1..];
    body[..body.find("```").unwrap()].to_string()
}

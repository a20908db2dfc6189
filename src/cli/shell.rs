//! Turning the arguments after `--` into the one shell line a job runs.
//!
//! One argument is a shell command line, run as it is (`bash -c ARG`). Several are an
//! exact argument list: each is quoted for bash, so the recorded command is a faithful,
//! copy-pasteable line and the job receives exactly those arguments.

/// The shell line for the arguments after `--`.
pub fn command_line(args: &[String]) -> String {
    match args {
        [one] => one.clone(),
        [first, rest @ ..] => {
            // The first word is the program: a word bash would read as an assignment
            // (`A=1`) or a keyword (`if`, `!`) is quoted so that it is run as a name.
            let program = if first.contains('=') || KEYWORDS.contains(&first.as_str()) {
                format!("'{}'", first.replace('\'', r"'\''"))
            } else {
                quote(first)
            };
            let mut line = program;
            for arg in rest {
                line.push(' ');
                line.push_str(&quote(arg));
            }
            line
        }
        [] => String::new(),
    }
}

/// Words bash reads as syntax in the place of a command.
const KEYWORDS: &[&str] = &[
    "!", "[[", "]]", "{", "}", "case", "coproc", "do", "done", "elif", "else", "esac", "fi", "for",
    "function", "if", "in", "select", "then", "time", "until", "while",
];

/// One argument quoted for bash: as it is when it holds only safe characters,
/// `'…'` when it holds no control character, else `$'…'` (so a newline or an escape
/// stays visible and the line stays one line).
pub fn quote(arg: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_-./=:,+@".contains(c);
    if !arg.is_empty() && arg.chars().all(safe) && !arg.starts_with('=') {
        return arg.to_string();
    }
    if !arg.chars().any(char::is_control) {
        return format!("'{}'", arg.replace('\'', r"'\''"));
    }
    let mut out = String::from("$'");
    for c in arg.chars() {
        match c {
            '\\' => out.push_str(r"\\"),
            '\'' => out.push_str(r"\'"),
            '\n' => out.push_str(r"\n"),
            '\t' => out.push_str(r"\t"),
            '\r' => out.push_str(r"\r"),
            '\x1b' => out.push_str(r"\E"),
            c if c.is_control() && (c as u32) < 0x100 => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_keeps_each_argument_whole() {
        assert_eq!(quote("plain-word_1.txt"), "plain-word_1.txt");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("$HOME"), "'$HOME'");
        assert_eq!(quote("*.rs"), "'*.rs'");
        assert_eq!(quote("a\nb"), r"$'a\nb'");
        assert_eq!(quote("\\'\n"), r"$'\\\'\n'");
        assert_eq!(command_line(&["echo hi; ls".into()]), "echo hi; ls");
        assert_eq!(command_line(&["A=1".into(), "x=y".into()]), "'A=1' x=y");
        assert_eq!(command_line(&["if".into(), "x".into()]), "'if' x");
        assert_eq!(
            command_line(&["printf".into(), "[%s]\\n".into(), "a b".into()]),
            r"printf '[%s]\n' 'a b'"
        );
    }
}

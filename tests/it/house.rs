//! The daemon's inner rules, each kept in one place (issue 23; issue 22 item 17): one
//! admission for every path that starts an item, whatever executor runs its other
//! work. Slurm work here is held in the queue of a stand-in Slurm (`sbatch`, `squeue`,
//! `scontrol` and `scancel` as small scripts on the caller's PATH), so no cluster is
//! needed: the daemon runs a job's Slurm commands with the PATH of its caller.

use crate::util::{eventually, Home};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

/// A stand-in for Slurm's client commands: `sbatch` queues a job for ever (`PENDING`)
/// until `scancel` cancels it.
struct FakeSlurm {
    dir: tempfile::TempDir,
}

impl FakeSlurm {
    fn new() -> FakeSlurm {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().display().to_string();
        let scripts = [
            (
                "sbatch",
                format!(
                    r#"#!/bin/sh
name=""
for a in "$@"; do case "$a" in --job-name=*) name="${{a#--job-name=}}";; esac; done
n=$(( $(cat {state}/jobs 2>/dev/null | wc -l) + 4200 ))
echo "$n|$name" >> {state}/jobs
echo "$n"
"#
                ),
            ),
            (
                "squeue",
                format!(
                    r#"#!/bin/sh
[ -f {state}/jobs ] || exit 0
while IFS='|' read -r id name; do
  if [ -e {state}/cancelled.$id ]; then echo "$id|$name|CANCELLED|None";
  else echo "$id|$name|PENDING|Resources"; fi
done < {state}/jobs
"#
                ),
            ),
            (
                "scontrol",
                format!(
                    r#"#!/bin/sh
id="$4"
name=$(grep "^$id|" {state}/jobs | cut -d'|' -f2)
if [ -e {state}/cancelled.$id ]; then s=CANCELLED; else s=PENDING; fi
echo "JobId=$id JobName=$name JobState=$s Reason=None ExitCode=0:0"
"#
                ),
            ),
            (
                "scancel",
                format!("#!/bin/sh\ntouch {state}/cancelled.$1\n"),
            ),
        ];
        for (name, text) in scripts {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        FakeSlurm { dir }
    }

    /// A PATH with the stand-in first.
    fn path(&self) -> String {
        format!(
            "{}:{}",
            self.dir.path().display(),
            std::env::var("PATH").unwrap_or_default()
        )
    }

    fn submitted(&self) -> usize {
        std::fs::read_to_string(self.dir.path().join("jobs"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }
}

/// A home whose calls (and so their Slurm commands) find the stand-in Slurm first.
fn home_with(slurm: &FakeSlurm, max_running: &str) -> Home {
    Home::new()
        .with("PATH", &slurm.path())
        .with("BGWORK_MAX_RUNNING", max_running)
}

/// Starts a job on the stand-in Slurm and waits until `list` shows it queued there.
fn queue_on_slurm(home: &Home, slurm: &FakeSlurm) -> String {
    let reply = home.json(&[
        "start",
        "--window",
        "0",
        "--on",
        "slurm",
        "--",
        "echo queued",
    ]);
    let id = reply["id"].as_str().unwrap().to_string();
    assert_eq!(reply["executor"], "slurm", "{reply}");
    eventually(Duration::from_secs(20), || {
        home.item(&id)["queue_reason"] == "Resources"
    });
    assert_eq!(slurm.submitted(), 1);
    id
}

#[test]
fn issue22_17_a_session_with_queued_slurm_work_still_gets_its_monitors() {
    let slurm = FakeSlurm::new();
    let home = home_with(&slurm, "1");
    queue_on_slurm(&home, &slurm);
    // Slurm work counts against its own limit, in `monitor` as in `start`: this
    // machine's one slot is free.
    let target = tempfile::tempdir().unwrap();
    let file = target.path().join("ready");
    let file = file.display().to_string();
    let monitor = home.json(&["monitor", "wait", "--until-file", &file]);
    assert_eq!(monitor["kind"], "monitor", "{monitor}");
    // And the slot is then taken, by the monitor, for a local start.
    let (_, code, message) = home.error(&["start", "--window", "0", "--", "sleep 30"]);
    assert_eq!(code, "limit", "{message}");
}

#[test]
fn issue22_17_a_run_at_its_deadline_is_promoted_beside_queued_slurm_work() {
    let slurm = FakeSlurm::new();
    let home = home_with(&slurm, "1");
    queue_on_slurm(&home, &slurm);
    let run = home.run(&["--json", "run", "--timeout", "0.3", "--", "exec sleep 1000"]);
    let reply = run.json();
    assert_eq!(reply["outcome"], "promoted", "{reply}");
    assert_eq!(reply["state"], "running", "{reply}");
}

#[test]
fn issue23_1_a_queued_slurm_job_refuses_input_and_keys_and_stops_off_the_queue() {
    let slurm = FakeSlurm::new();
    let home = home_with(&slurm, "4");
    let id = queue_on_slurm(&home, &slurm);
    // Input to a queued job is refused, never dropped; so is a key (C-c, C-d), which
    // would otherwise wait in the job's folder and reach it the moment it starts.
    let (_, code, message) = home.error(&["send", &id, "hello"]);
    assert_eq!(code, "no_input", "{message}");
    assert!(message.contains("queue"), "{message}");
    for key in ["C-c", "C-d"] {
        let (_, code, message) = home.error(&["send", &id, "--key", key]);
        assert_eq!(code, "no_input", "{key}: {message}");
        assert!(message.contains("queue"), "{message}");
    }
    let job_dir = Path::new(home.item(&id)["log_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    let left = std::fs::read_dir(job_dir.join("commands")).map_or(0, |d| d.count());
    assert_eq!(left, 0, "a command was left for the queued job");
    // A stop takes it off the queue.
    home.json(&["stop", &id]);
    eventually(Duration::from_secs(20), || {
        home.item(&id)["state"] == "ended"
    });
    assert!(Path::new(&slurm.dir.path().join("cancelled.4200")).exists());
}

/// The Rust files under `dir`, recursively.
fn sources(dir: &Path, found: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|x| x == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn issue23_7_only_wire_derives_serialize_but_the_slurm_executors_own_file() {
    // ARCHITECTURE.md's invariant: bgwork's own JSON shapes are `wire`'s; the one other
    // are the Slurm executor's own files (`slurm.json`, the hand-over's).
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let allowed = [
        root.join("src/executor/slurm/mod.rs"),
        root.join("src/executor/slurm/handover.rs"),
    ];
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    let mut outside = Vec::new();
    for file in files {
        if file.starts_with(root.join("src/wire")) || allowed.contains(&file) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let derives = line.contains("derive(")
                && line
                    .split(|c: char| !c.is_alphanumeric() && c != '_')
                    .any(|word| word == "Serialize");
            if derives {
                outside.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        outside.is_empty(),
        "Serialize derived outside wire (define the shape in src/wire/, or say in \
         ARCHITECTURE.md why not):\n{}",
        outside.join("\n")
    );
}

#[test]
fn issue23_6_no_import_loop_between_top_level_modules() {
    // ARCHITECTURE.md: no module imports one that imports it back, directly or round a
    // longer ring; a piece two modules share lives in the one that owns it.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let loops = import_loops(&root, &[]);
    assert!(
        loops.is_empty(),
        "import loops between top-level modules of src/ (move the shared piece to the \
         module that owns it):\n{}",
        loops.join("\n")
    );
}

#[test]
fn issue24_5_no_import_loop_between_the_files_of_one_folder() {
    // The same rule one level down: the modules of one folder (`executor/ssh/`'s
    // `deploy`, `link`, `relay`, …) import no sibling that imports them back.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut folders = Vec::new();
    module_folders(&root, &root, &mut folders);
    assert!(
        folders.iter().any(|f| f == &["executor", "ssh"]),
        "executor/ssh/ is among the folders checked: {folders:?}"
    );
    let loops: Vec<String> = folders
        .iter()
        .flat_map(|folder| {
            import_loops(&root, folder)
                .into_iter()
                .map(move |ring| format!("in src/{}/: {ring}", folder.join("/")))
        })
        .collect();
    assert!(
        loops.is_empty(),
        "import loops between the modules of one folder (move the shared piece to the \
         module that owns it):\n{}",
        loops.join("\n")
    );
}

/// The module folders under `dir` (each as its path of module names from `src`).
fn module_folders(src: &Path, dir: &Path, found: &mut Vec<Vec<String>>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            let relative = path.strip_prefix(src).unwrap();
            found.push(
                relative
                    .iter()
                    .map(|p| p.to_string_lossy().into_owned())
                    .collect(),
            );
            module_folders(src, &path, found);
        }
    }
}

/// Every ring of imports between the modules directly in `folder` (a path of module
/// names; none: the crate root) of the crate at `src`, each as its modules and, for
/// each import in the ring, where it is first made. A module's own folder root
/// (`mod.rs`) is its parent, not one of the ring's modules.
fn import_loops(src: &Path, folder: &[String]) -> Vec<String> {
    let dir = folder
        .iter()
        .fold(src.to_path_buf(), |dir, part| dir.join(part));
    let mut files = Vec::new();
    sources(&dir, &mut files);
    let top: std::collections::BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let name = match entry.path().is_dir() {
                true => name,
                false => name.strip_suffix(".rs")?.to_string(),
            };
            let root_file =
                name == "mod" || (folder.is_empty() && (name == "lib" || name == "main"));
            (!root_file).then_some(name)
        })
        .collect();
    // (importer, imported) → the first place the import is made.
    let mut edges = std::collections::BTreeMap::<(String, String), String>::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap();
        let mut parts: Vec<String> = relative
            .with_extension("")
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if parts.last().is_some_and(|p| p == "mod") {
            parts.pop();
        }
        if parts == ["lib"] || parts == ["main"] || parts.len() <= folder.len() {
            continue;
        }
        let own = &parts[folder.len()];
        let text = std::fs::read_to_string(&file).unwrap();
        for (path, line) in imports(&text, &parts) {
            let Some(imported) = path.strip_prefix(folder).and_then(|rest| rest.first()) else {
                continue;
            };
            if imported != own && top.contains(imported) {
                edges
                    .entry((own.clone(), imported.clone()))
                    .or_insert_with(|| format!("{}:{line}", relative.display()));
            }
        }
    }
    let reaches = |from: &str, to: &str| {
        let mut seen = std::collections::BTreeSet::new();
        let mut next = vec![from.to_string()];
        while let Some(module) = next.pop() {
            for ((a, b), _) in edges.range((module.clone(), String::new())..) {
                if *a != module {
                    break;
                }
                if b == to {
                    return true;
                }
                if seen.insert(b.clone()) {
                    next.push(b.clone());
                }
            }
        }
        false
    };
    let mut rings: Vec<Vec<&String>> = Vec::new();
    for module in &top {
        if rings.iter().any(|ring| ring.contains(&module)) || !reaches(module, module) {
            continue;
        }
        let ring: Vec<&String> = top
            .iter()
            .filter(|other| *other == module || (reaches(module, other) && reaches(other, module)))
            .collect();
        rings.push(ring);
    }
    rings
        .iter()
        .map(|ring| {
            let imports: Vec<String> = edges
                .iter()
                .filter(|((a, b), _)| ring.contains(&a) && ring.contains(&b))
                .map(|((a, b), at)| format!("  {a} -> {b} ({at})"))
                .collect();
            let names: Vec<&str> = ring.iter().map(|m| m.as_str()).collect();
            format!("{}:\n{}", names.join(" <-> "), imports.join("\n"))
        })
        .collect()
}

/// A token of Rust code, as far as paths need: a word, `::`, or another character.
#[derive(Debug, PartialEq)]
enum Token {
    Word(String),
    Path,
    Punct(char),
}

/// The paths of the crate a file of the module `module` (its names from the crate
/// root) names, made absolute (`crate::a::b`, `super::…` and `self::…` resolved, each
/// name of a `{…}` group its own path), each with its line. Comments, strings and
/// character literals are not code, and an inline `mod NAME { … }` adds a level for
/// the `super::` and `self::` inside it.
fn imports(text: &str, module: &[String]) -> Vec<(Vec<String>, usize)> {
    let tokens = tokens(text);
    let word = |k: usize| match tokens.get(k) {
        Some((Token::Word(w), _)) => Some(w.as_str()),
        _ => None,
    };
    let is = |k: usize, token: Token| tokens.get(k).is_some_and(|(t, _)| *t == token);
    let (mut found, mut braces, mut inline) = (Vec::new(), 0usize, Vec::<(usize, String)>::new());
    for (k, (token, line)) in tokens.iter().enumerate() {
        let here = || -> Vec<String> {
            let mut path = module.to_vec();
            path.extend(inline.iter().map(|(_, name)| name.clone()));
            path
        };
        let base_and_rest = match token {
            Token::Punct('{') => {
                braces += 1;
                if k >= 2 && word(k - 2) == Some("mod") {
                    if let Some(name) = word(k - 1) {
                        inline.push((braces, name.to_string()));
                    }
                }
                None
            }
            Token::Punct('}') => {
                if inline.last().is_some_and(|(at, _)| *at == braces) {
                    inline.pop();
                }
                braces = braces.saturating_sub(1);
                None
            }
            Token::Word(w)
                if w == "crate"
                    && is(k + 1, Token::Path)
                    && (k == 0 || !is(k - 1, Token::Punct('$'))) =>
            {
                Some((Vec::new(), k + 2))
            }
            Token::Word(w)
                if w == "self" && is(k + 1, Token::Path) && (k == 0 || !is(k - 1, Token::Path)) =>
            {
                Some((here(), k + 2))
            }
            Token::Word(w) if w == "super" && (k == 0 || !is(k - 1, Token::Path)) => {
                let mut climbed = 0;
                let mut at = k;
                while word(at) == Some("super") && is(at + 1, Token::Path) {
                    climbed += 1;
                    at += 2;
                }
                let path = here();
                (climbed > 0 && climbed <= path.len())
                    .then(|| (path[..path.len() - climbed].to_vec(), at))
            }
            _ => None,
        };
        let Some((base, at)) = base_and_rest else {
            continue;
        };
        for rest in path_tree(&tokens, at).0 {
            let mut path = base.clone();
            path.extend(rest);
            found.push((path, *line));
        }
    }
    found
}

/// The paths a use tree from the token at `k` names (`a::b`, `a::{b, c::d}`, `*`:
/// none beyond its prefix), and the token after it.
fn path_tree(tokens: &[(Token, usize)], k: usize) -> (Vec<Vec<String>>, usize) {
    match tokens.get(k) {
        Some((Token::Word(w), _)) => match tokens.get(k + 1) {
            Some((Token::Path, _)) => {
                let (rests, end) = path_tree(tokens, k + 2);
                let paths = match rests.is_empty() {
                    true => vec![vec![w.clone()]],
                    false => rests
                        .into_iter()
                        .map(|rest| std::iter::once(w.clone()).chain(rest).collect())
                        .collect(),
                };
                (paths, end)
            }
            _ => (vec![vec![w.clone()]], k + 1),
        },
        Some((Token::Punct('{'), _)) => {
            let (mut paths, mut at) = (Vec::new(), k + 1);
            loop {
                match tokens.get(at) {
                    None => return (paths, at),
                    Some((Token::Punct('}'), _)) => return (paths, at + 1),
                    Some((Token::Punct(','), _)) => at += 1,
                    Some(_) => {
                        let (more, end) = path_tree(tokens, at);
                        paths.extend(more);
                        // Past what the item adds (`as NAME`, a `*`).
                        at = end.max(at + 1);
                        while let Some((token, _)) = tokens.get(at) {
                            if matches!(token, Token::Punct(',') | Token::Punct('}')) {
                                break;
                            }
                            at += 1;
                        }
                    }
                }
            }
        }
        _ => (Vec::new(), k + 1),
    }
}

/// The tokens of Rust code with their lines, comments, strings (raw ones too) and
/// character literals left out.
fn tokens(text: &str) -> Vec<(Token, usize)> {
    let chars: Vec<char> = text.chars().collect();
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let (mut tokens, mut line, mut i) = (Vec::new(), 1, 0);
    // Moves `i` past `end`, counting lines; to the end of the text when it is absent.
    let skip_to = |i: &mut usize, line: &mut usize, end: &str| {
        let end: Vec<char> = end.chars().collect();
        while *i < chars.len() && !chars[*i..].starts_with(&end) {
            *line += usize::from(chars[*i] == '\n');
            *i += 1;
        }
        *i = (*i + end.len()).min(chars.len());
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c == '/' && next == Some('/') {
            skip_to(&mut i, &mut line, "\n");
            line += 1;
        } else if c == '/' && next == Some('*') {
            let mut nesting = 0;
            while i < chars.len() {
                if chars[i..].starts_with(&['/', '*']) {
                    nesting += 1;
                    i += 2;
                } else if chars[i..].starts_with(&['*', '/']) {
                    nesting -= 1;
                    i += 2;
                    if nesting == 0 {
                        break;
                    }
                } else {
                    line += usize::from(chars[i] == '\n');
                    i += 1;
                }
            }
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                line += usize::from(chars[i] == '\n');
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{1b}'), or a lifetime ('a).
            if next == Some('\\') {
                i += 3;
                skip_to(&mut i, &mut line, "'");
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else if ident(c) {
            let start = i;
            while i < chars.len() && ident(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            // A raw string: r"…", r#"…"#, br"…".
            let hashes = chars[i..].iter().take_while(|&&c| c == '#').count();
            if (word == "r" || word == "br") && chars.get(i + hashes) == Some(&'"') {
                i += hashes + 1;
                skip_to(&mut i, &mut line, &format!("\"{}", "#".repeat(hashes)));
            } else {
                tokens.push((Token::Word(word), line));
            }
        } else if c == ':' && next == Some(':') {
            tokens.push((Token::Path, line));
            i += 2;
        } else {
            if !c.is_whitespace() {
                tokens.push((Token::Punct(c), line));
            }
            i += 1;
        }
    }
    tokens
}

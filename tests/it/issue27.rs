//! Issue 27: the fixed cost of a call. Each `bgwork` process starts without the dynamic
//! loader, and builds the parser of the one subcommand it runs; neither may change what
//! a user sees.

use crate::util::{Home, BIN};

/// The ELF type and whether a program header asks for an interpreter (`PT_INTERP`).
fn elf_kind(path: &str) -> (u16, bool) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF", "{path} is not an ELF file");
    let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36), u16_at(0x38));
    let interp = (0..phnum as usize).any(|i| {
        let at = phoff + i * phentsize as usize;
        u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) == 3
    });
    (u16_at(0x10), interp)
}

#[test]
fn issue27_1_the_binary_starts_without_the_dynamic_loader() {
    // A static executable (ET_EXEC, no interpreter): no loader, no shared libraries, no
    // relocations before `main`; and it runs on a host whatever its C library.
    let (kind, interp) = elf_kind(BIN);
    assert!(
        kind == 2 && !interp,
        "{BIN}: ELF type {kind}, interpreter {interp}: linked dynamic (scripts/link-gcc \
         found no static C library?)"
    );
    let home = Home::new();
    let version = home.run(&["--version"]);
    assert_eq!(version.code, 0, "{}", version.stderr);
    assert!(version.stdout.starts_with("bgwork "), "{}", version.stdout);
    // The daemon and the supervisor are the same binary: a job runs and ends as before.
    let id = home.start("echo static");
    let end = home.wait_end(&id);
    assert_eq!(end["end"], "succeeded", "{end}");
    let read = home.run(&["read", &id]);
    assert!(read.stdout.contains("static"), "{}", read.stdout);
}

#[test]
fn issue27_1_a_subcommand_built_only_when_invoked_keeps_its_options_help_and_manual() {
    let home = Home::new();
    // The global options reach the subcommand on either side of it.
    for args in [&["--json", "list"][..], &["list", "--json"][..]] {
        let run = home.run(args);
        assert_eq!(run.code, 0, "{args:?}: {}", run.stderr);
        assert!(run.json()["items"].is_array(), "{args:?}: {}", run.stdout);
    }
    let run = home.run(&["list", "--session", "elsewhere", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    // A nested subcommand's options, its help, and a usage error that names them.
    let help = home.run(&["monitor", "wait", "--help"]);
    assert!(help.stdout.contains("--until-port"), "{}", help.stdout);
    let wrong = home.run(&["monitor", "wait", "--until-prot", "x:1"]);
    assert_eq!(wrong.code, 2);
    assert!(wrong.stderr.contains("--until-port"), "{}", wrong.stderr);
    let hook = home.run(&["hook", "codex", "--no-such-option"]);
    assert_eq!(
        hook.code, 1,
        "a hook's bad command line is the person's error"
    );
    // The manual and the completion scripts carry every subcommand's options.
    let man = home.run(&["man"]).stdout;
    for option in [
        "until\\-output",
        "max\\-runtime",
        "wait\\-on\\-stop",
        "grep",
    ] {
        assert!(man.contains(option), "the manual lacks {option}");
    }
    for shell in ["bash", "zsh", "fish"] {
        let script = home.run(&["completions", shell]).stdout;
        for option in ["until-output", "max-runtime", "wait-on-stop", "no-redact"] {
            assert!(script.contains(option), "{shell} completions lack {option}");
        }
    }
}

//! The `bgwork` binary: everything lives in the library.

fn main() -> std::process::ExitCode {
    bgwork::cli::main()
}

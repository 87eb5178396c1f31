#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    switchboard::cli::main()
}

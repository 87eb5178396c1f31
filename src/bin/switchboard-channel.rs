//! The channel plugin as an executable of its own: `switchboard channel` hands itself over
//! to it when it is installed beside `switchboard` (see `cli::channel_main`).

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    switchboard::cli::channel_main()
}

//! `switchboard channel` and `switchboard-channel`: the MCP channel plugin for one agent
//! session (DESIGN.md §5).

use std::process::ExitCode;

use clap::{Args, Parser};

use super::{ConfigArg, block_on};
use crate::agents::channel;
use crate::config::{DaemonUrl, Settings};
use crate::ids::AgentName;
use crate::telemetry;

#[derive(Debug, Args)]
pub struct ChannelArgs {
    /// The agent this session speaks for (an `[agents.NAME]` table).
    #[arg(long)]
    pub agent: String,
    /// The name the agent session knows this MCP server by (the key in `.mcp.json`, or
    /// `claude mcp add NAME`): Claude Code calls its tools `mcp__NAME__reply` and so on,
    /// and the plugin names them so to the model.
    #[arg(long, default_value = channel::DEFAULT_SERVER_NAME)]
    pub server_name: String,
    /// The folder downloaded attachments are saved in. Default:
    /// `$XDG_STATE_HOME/switchboard/inbox/AGENT`, else `~/.local/state/switchboard/inbox/AGENT`.
    #[arg(long, value_name = "DIR")]
    pub inbox: Option<std::path::PathBuf>,
    /// How much the inbox may hold, in MB; its oldest files are removed to make room.
    #[arg(long, value_name = "MB", default_value_t = channel::inbox::DEFAULT_INBOX_MAX_MB)]
    pub inbox_max_mb: u64,
    /// Where the daemon is, as `https://HOST:PORT` (or `http://` on loopback); give it once
    /// per replica, in the order to try them. Replaces `api.daemon`; default: `api.listen`.
    #[arg(long = "daemon", value_name = "URL")]
    pub daemons: Vec<String>,
    #[command(flatten)]
    pub config: ConfigArg,
}

/// `switchboard-channel`: the channel plugin as an executable of its own.
#[derive(Debug, Parser)]
#[command(
    name = "switchboard-channel",
    version,
    about = "The switchboard MCP channel plugin for one agent session"
)]
struct ChannelCli {
    #[command(flatten)]
    args: ChannelArgs,
}

/// The executable `switchboard channel` hands itself over to, installed beside it.
const CHANNEL_EXECUTABLE: &str = "switchboard-channel";

/// The main of `switchboard-channel`.
pub fn channel_main() -> ExitCode {
    let cli = ChannelCli::parse();
    block_on(run_channel(cli.args))
}

/// The plugin and the daemon are executables of their own, each built from its own code
/// alone: a process keeps resident most of the code its executable maps, and a plugin runs
/// as long as its agent session (one per session) while the daemon runs for good. Mapped
/// from `switchboard-channel`, a plugin keeps about 2.7 MiB less resident; without the
/// plugin (the MCP server and its types), the daemon's code is 1.3 MB smaller and it keeps
/// about 0.6 MiB less resident (see docs/performance.md). So `switchboard channel` becomes
/// `switchboard-channel`, installed beside it (same arguments, same process). Returns only
/// when it could not, saying why.
pub(super) fn hand_over_to_channel_executable() -> anyhow::Error {
    use std::os::unix::process::CommandExt;
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            return anyhow::anyhow!(
                "cannot tell where this executable is ({e}), to run {CHANNEL_EXECUTABLE}"
            );
        }
    };
    let sibling = exe.with_file_name(CHANNEL_EXECUTABLE);
    if !sibling.is_file() {
        return anyhow::anyhow!(
            "`switchboard channel` runs {CHANNEL_EXECUTABLE}, which is not installed beside {}: install both \
             executables (README, Install), or configure the agent session to run {CHANNEL_EXECUTABLE} itself",
            exe.display()
        );
    }
    // `exec` returns only when it failed.
    let error = std::process::Command::new(&sibling).args(std::env::args_os().skip(2)).exec();
    anyhow::anyhow!("could not start {}: {error}", sibling.display())
}

/// `switchboard channel`: the MCP channel plugin for one agent session.
async fn run_channel(args: ChannelArgs) -> anyhow::Result<()> {
    let mut settings = Settings::load(&args.config.config)?;
    if !args.daemons.is_empty() {
        let plaintext_allowed = settings.api.plaintext_beyond_loopback;
        settings.api.daemon = args
            .daemons
            .iter()
            .map(|text| {
                DaemonUrl::parse(text, plaintext_allowed)
                    .map_err(|problem| anyhow::anyhow!("--daemon: {problem}"))
            })
            .collect::<anyhow::Result<_>>()?;
    }
    let agent = AgentName::parse(&args.agent).map_err(anyhow::Error::msg)?;
    let secret = settings.agent_secret(&agent)?;
    let server_name = channel::parse_server_name(&args.server_name).map_err(anyhow::Error::msg)?;
    telemetry::init(settings.log.format, &settings.log.filter, vec![secret.expose().to_owned()])?;
    let dir = match args.inbox {
        Some(dir) => dir,
        None => channel::inbox::default_dir(&agent).ok_or_else(|| {
            anyhow::anyhow!("neither XDG_STATE_HOME nor HOME is set: name the inbox folder with --inbox DIR")
        })?,
    };
    let inbox = channel::inbox::Inbox::new(dir, args.inbox_max_mb.saturating_mul(1024 * 1024))
        .map_err(|e| anyhow::anyhow!("--inbox: {e}"))?;
    channel::run(settings, agent, server_name, inbox).await
}

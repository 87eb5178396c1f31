//! The daemon under demonstration: `switchboard run` as a child process of the demo, the
//! same binary and command as in production, with its log in the demo's directory.
//!
//! A child rather than a task of the demo's own runtime: the last step kills it with
//! SIGKILL, which only a process can really suffer, and a process of its own keeps the
//! daemon's log, signal handling, ledger lock and metrics recorder exactly as they are in
//! production, apart from the demo's narration.

use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::time::Instant;

use crate::app::reported_api_address;
use crate::config::API_LISTEN_ENV;

/// A loaded machine may take a while to start a debug build.
const START_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// How much of the daemon's log a failure shows.
const LOG_TAIL_LINES: usize = 30;

pub struct DemoDaemon {
    config: PathBuf,
    /// Every start appends to it, so the log of the killed daemon stays readable.
    log: PathBuf,
    /// Where the local API listens, as the first start reported it (the configuration says
    /// port 0); a restart keeps it, so the agents' clients find the daemon again.
    api: Option<SocketAddr>,
    /// The secrets, given to the daemon only.
    env: Vec<(String, String)>,
    /// The running daemon, if any.
    child: Option<Child>,
}

impl DemoDaemon {
    pub fn new(config: PathBuf, log: PathBuf, env: Vec<(String, String)>) -> Self {
        Self { config, log, api: None, env, child: None }
    }

    /// The local API's address, once the daemon has reported it.
    pub fn api_addr(&self) -> Option<SocketAddr> {
        self.api
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts `switchboard run` and waits until it reports where its local API listens.
    pub async fn start(&mut self) -> anyhow::Result<u32> {
        let log =
            OpenOptions::new().create(true).append(true).open(&self.log).context("opening the daemon log")?;
        // Only what this start writes: the log keeps the earlier starts' lines.
        let earlier = log.metadata().context("reading the daemon log's size")?.len();
        let exe = std::env::current_exe().context("finding the switchboard binary")?;
        let mut command = Command::new(exe);
        // The demo's daemon reads the demo's file alone: an override meant for a real
        // deployment (a Docker image sets the ledger's path) would point it elsewhere.
        for name in crate::config::environment_overrides() {
            command.env_remove(name);
        }
        if let Some(api) = self.api {
            command.env(API_LISTEN_ENV, api.to_string());
        }
        let child = command
            .args(["run", "--config"])
            .arg(&self.config)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting `switchboard run`")?;
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(api) = self.reported_since(earlier) {
                self.api = Some(api);
                return Ok(pid);
            }
            if let Some(status) = self.child.as_mut().and_then(|child| child.try_wait().ok().flatten()) {
                self.child = None;
                anyhow::bail!("the daemon exited during start-up ({status}):\n{}", self.log_tail());
            }
            if Instant::now() > deadline {
                anyhow::bail!("the daemon did not listen within {START_TIMEOUT:?}:\n{}", self.log_tail());
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// SIGKILL: no chance to finish anything.
    pub fn kill9(&mut self) -> anyhow::Result<u32> {
        let mut child = self.child.take().context("the daemon is not running")?;
        let pid = child.id();
        child.kill().context("kill -9")?;
        child.wait().context("reaping the killed daemon")?;
        Ok(pid)
    }

    /// SIGTERM, then waits for the daemon to stop by itself.
    pub async fn stop(&mut self) -> anyhow::Result<ExitStatus> {
        let mut child = self.child.take().context("the daemon is not running")?;
        signal(&child, Signal::SIGTERM)?;
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                anyhow::bail!("the daemon did not stop within {STOP_TIMEOUT:?} of SIGTERM");
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// The address a start reported in the log after its first `earlier` bytes.
    fn reported_since(&self, earlier: u64) -> Option<SocketAddr> {
        let log = std::fs::read(&self.log).ok()?;
        let this_start = log.get(usize::try_from(earlier).ok()?..)?;
        reported_api_address(&String::from_utf8_lossy(this_start))
    }

    /// The last lines of the daemon's log, for a failure report.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
    }
}

fn signal(child: &Child, signal: Signal) -> anyhow::Result<()> {
    let pid = i32::try_from(child.id()).context("a pid that fits an i32")?;
    kill(Pid::from_raw(pid), signal).with_context(|| format!("sending {signal} to the daemon"))
}

impl Drop for DemoDaemon {
    fn drop(&mut self) {
        // Never leave a daemon behind, whatever stopped the demo.
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

//! Files through the whole path (issue 22): a 20 MB attachment from the fake Bot API through
//! the daemon and a real `switchboard channel` into the agent's inbox (`download_attachment`),
//! and a 50 MB file the other way, from the agent's machine through the plugin and the daemon
//! to the fake's `sendDocument` (`reply` with `files`). Both are Telegram's limits.
//!
//! For each, the time of the tool call and the peak resident memory each process added
//! while it ran: `/proc/<pid>/clear_refs` resets the peak (VmHWM) to the current
//! resident set just before the call, and VmHWM after it less VmRSS before it is the
//! growth. The goal is under 8 MiB for each process: a file is streamed, never held.
//!
//! Run it with `cargo bench --bench media`.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use sha2::{Digest, Sha256};
use support::agents::{WAIT, owner, plugin_builder, trace_id};
use support::daemon::{OWNER_CHAT, TestDaemon, default_routes};
use support::mcp::ChannelClient;
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram};

const DOWNLOAD_BYTES: usize = 20 * 1024 * 1024;
const UPLOAD_BYTES: usize = 50 * 1024 * 1024;

/// The goal for each process's peak growth during a transfer.
const GOAL_KIB: u64 = 8 * 1024;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(7) as u8).collect()
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("reading /proc/<pid>/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Peak-memory bookkeeping of one process over one transfer.
struct Peak {
    pid: u32,
    before_kib: u64,
}

impl Peak {
    fn start(pid: u32) -> Self {
        // "5" resets VmHWM to the current RSS (proc(5), clear_refs).
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("resetting the peak RSS");
        Self { pid, before_kib: status_kib(pid, "VmRSS:") }
    }

    fn growth_kib(&self) -> u64 {
        status_kib(self.pid, "VmHWM:").saturating_sub(self.before_kib)
    }
}

struct Measured {
    what: &'static str,
    bytes: usize,
    elapsed: Duration,
    daemon_kib: u64,
    plugin_kib: u64,
}

fn report(measured: &[Measured]) {
    println!(
        "\nfiles through the whole path (peak RSS growth during the call; goal < {} MiB each)",
        GOAL_KIB / 1024
    );
    for m in measured {
        let mib_per_s = m.bytes as f64 / (1024.0 * 1024.0) / m.elapsed.as_secs_f64();
        let verdict = |kib: u64| if kib < GOAL_KIB { "ok" } else { "OVER" };
        println!(
            "  {:<28} {:>5} MiB in {:>6.0} ms ({:>5.0} MiB/s)   daemon +{:.1} MiB ({})   plugin +{:.1} MiB ({})",
            m.what,
            m.bytes / (1024 * 1024),
            m.elapsed.as_secs_f64() * 1000.0,
            mib_per_s,
            m.daemon_kib as f64 / 1024.0,
            verdict(m.daemon_kib),
            m.plugin_kib as f64 / 1024.0,
            verdict(m.plugin_kib),
        );
    }
}

async fn connected_plugin(daemon: &TestDaemon, state_home: &Path) -> ChannelClient {
    let plugin = plugin_builder(daemon, "orchestrator")
        .env("XDG_STATE_HOME", state_home.display().to_string())
        .env("RUST_LOG", "warn,switchboard=info")
        .start()
        .await
        .expect("the channel plugin starts");
    plugin
        .wait_for_stderr("channel::forwarder: connected to the switchboard daemon", WAIT)
        .await
        .expect("connects");
    plugin
}

async fn download(fake: &FakeTelegram, daemon: &TestDaemon, plugin: &ChannelClient) -> Measured {
    let bytes = pattern(DOWNLOAD_BYTES);
    let digest = hex::encode(Sha256::digest(&bytes));
    fake.add_file("bench-download", bytes);
    fake.push_document_file(
        ChatSpec::private(OWNER_CHAT),
        owner(),
        "bench-download",
        "big.bin",
        DOWNLOAD_BYTES as u64,
    );
    let pushed = plugin.wait_for_notifications(1, WAIT).await.expect("the document arrives");
    let trace = trace_id(&pushed[0]);
    let (daemon_peak, plugin_peak) = (Peak::start(daemon.pid().unwrap()), Peak::start(plugin.pid().unwrap()));
    let started = Instant::now();
    let (is_error, answer) =
        plugin.call_tool("download_attachment", json!({"trace_id": trace})).await.expect("the tool answers");
    let elapsed = started.elapsed();
    assert!(!is_error, "{answer}");
    let measured = Measured {
        what: "download (download_attachment)",
        bytes: DOWNLOAD_BYTES,
        elapsed,
        daemon_kib: daemon_peak.growth_kib(),
        plugin_kib: plugin_peak.growth_kib(),
    };
    let path = answer.rsplit(' ').next().unwrap();
    assert_eq!(hex::encode(Sha256::digest(std::fs::read(path).unwrap())), digest, "the file arrived whole");
    measured
}

async fn upload(fake: &FakeTelegram, daemon: &TestDaemon, plugin: &ChannelClient, dir: &Path) -> Measured {
    let bytes = pattern(UPLOAD_BYTES);
    let digest = hex::encode(Sha256::digest(&bytes));
    let file = dir.join("big.bin");
    std::fs::write(&file, bytes).unwrap();
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "send me the big file");
    let pushed = plugin.wait_for_notifications(2, WAIT).await.expect("the message arrives");
    let trace = trace_id(&pushed[1]);
    let (daemon_peak, plugin_peak) = (Peak::start(daemon.pid().unwrap()), Peak::start(plugin.pid().unwrap()));
    let started = Instant::now();
    let (is_error, answer) = plugin
        .call_tool("reply", json!({"text": "here", "trace_id": trace, "files": [file.display().to_string()]}))
        .await
        .expect("the tool answers");
    let elapsed = started.elapsed();
    assert!(!is_error, "{answer}");
    let measured = Measured {
        what: "upload (reply with files)",
        bytes: UPLOAD_BYTES,
        elapsed,
        daemon_kib: daemon_peak.growth_kib(),
        plugin_kib: plugin_peak.growth_kib(),
    };
    let uploads = fake.uploads();
    assert_eq!((uploads[0].len as usize, uploads[0].sha256.as_str()), (UPLOAD_BYTES, digest.as_str()));
    measured
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    runtime.block_on(async {
        let fake = FakeTelegram::start().await;
        let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
        let state_home = tempfile::tempdir().unwrap();
        let plugin = connected_plugin(&daemon, state_home.path()).await;
        let measured = [
            download(&fake, &daemon, &plugin).await,
            upload(&fake, &daemon, &plugin, state_home.path()).await,
        ];
        report(&measured);
    });
}

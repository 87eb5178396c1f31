//! The local API over TLS (`[api] tls`), as a plugin on another machine meets it: the real
//! daemon serving a certificate its test CA signed, the real `switchboard channel` trusting
//! that CA (`api.ca`), and the refusals around them.

mod support;

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use serde_json::json;
use support::agents::*;
use support::daemon::*;
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram};

/// A CA of the test's own, and a certificate it signed for the daemon on loopback.
struct TestCertificates {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    /// A key that belongs to no certificate here.
    stray_key: PathBuf,
    /// The CA, to sign renewals with.
    issuer: Issuer<'static, KeyPair>,
}

impl TestCertificates {
    fn write_into(dir: &Path) -> Self {
        let mut ca_params = CertificateParams::new(Vec::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate().unwrap();
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let write = |name: &str, pem: String| {
            let path = dir.join(name);
            std::fs::write(&path, pem).unwrap();
            path
        };
        let (daemon, daemon_key) = daemon_certificate(&issuer, None);
        Self {
            ca: write("ca.pem", ca.pem()),
            cert: write("daemon.pem", daemon.pem()),
            key: write("daemon.key", daemon_key.serialize_pem()),
            stray_key: write("stray.key", KeyPair::generate().unwrap().serialize_pem()),
            issuer,
        }
    }

    /// A new certificate from the same CA, with a key of its own, as a renewal is; valid
    /// until the start of `expiry_year`.
    fn renewal(&self, expiry_year: i32) -> (rcgen::Certificate, KeyPair) {
        daemon_certificate(&self.issuer, Some(expiry_year))
    }
}

fn daemon_certificate(
    issuer: &Issuer<'static, KeyPair>,
    expiry_year: Option<i32>,
) -> (rcgen::Certificate, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    if let Some(year) = expiry_year {
        params.not_after = rcgen::date_time_ymd(year, 1, 1);
    }
    (params.signed_by(&key, issuer).unwrap(), key)
}

/// A daemon configured with `api` lines added to its `[api]` table, not started.
fn configure_with_api(fake: &FakeTelegram, api: &str) -> TestDaemon {
    let daemon = TestDaemon::configure(&fake.api_url(), "", &default_routes(), &[]);
    let config = std::fs::read_to_string(daemon.config_path()).unwrap();
    std::fs::write(daemon.config_path(), config.replacen("[api]\n", &format!("[api]\n{api}\n"), 1)).unwrap();
    daemon
}

fn tls_lines(certs: &TestCertificates, key: &Path) -> String {
    format!("tls = {{ cert = \"{}\", key = \"{}\" }}", certs.cert.display(), key.display())
}

/// A daemon serving `certs`' certificate, started, whose plugins trust the test CA.
fn launched_trusting_its_ca(fake: &FakeTelegram, certs: &TestCertificates) -> TestDaemon {
    let mut daemon = configure_with_api(
        fake,
        &format!("{}\nca = \"{}\"", tls_lines(certs, &certs.key), certs.ca.display()),
    );
    daemon.launch();
    daemon
}

/// An HTTPS client that trusts the test CA only.
fn https_client(certs: &TestCertificates) -> reqwest::Client {
    https_client_showing(certs, None)
}

/// An HTTPS client that trusts the test CA only and shows `identity`, if any.
fn https_client_showing(certs: &TestCertificates, identity: Option<reqwest::Identity>) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&certs.ca).unwrap()).unwrap();
    let mut builder = reqwest::Client::builder()
        .no_proxy()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .tls_info(true);
    if let Some(identity) = identity {
        builder = builder.identity(identity);
    }
    builder.timeout(WAIT).build().unwrap()
}

#[tokio::test]
async fn a_plugin_that_trusts_the_daemons_ca_carries_a_message_and_its_reply_over_tls() {
    let fake = FakeTelegram::start().await;
    let dir = tempfile::tempdir().unwrap();
    let certs = TestCertificates::write_into(dir.path());
    let daemon = launched_trusting_its_ca(&fake, &certs);
    let orchestrator = session(&daemon, "orchestrator").await;
    assert!(
        orchestrator.stderr().contains(&format!("https://{}", daemon.api_addr())),
        "the plugin goes to the daemon over https: {}",
        orchestrator.stderr()
    );

    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "over TLS?");
    let pushed = orchestrator.wait_for_notifications(1, WAIT).await.unwrap();
    assert_eq!(pushed[0].content, "over TLS?");
    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": "over TLS."})).await.unwrap();
    assert!(!is_error, "{text}");
    let sent = fake.wait_for_sent(1, WAIT).await;
    assert_eq!((sent[0].chat_id, sent[0].text.as_str()), (OWNER_CHAT, "over TLS."));

    // The operator's routes are served over TLS too, and plain HTTP gets nothing.
    let https = https_client(&certs);
    let ready = https.get(format!("https://{}/readyz", daemon.api_addr())).send().await.unwrap();
    assert!(ready.status().is_success(), "{:?}", ready.status());
    let plain = reqwest::Client::builder().no_proxy().timeout(WAIT).build().unwrap();
    let refused = plain.get(format!("http://{}/readyz", daemon.api_addr())).send().await;
    assert!(refused.is_err() || !refused.unwrap().status().is_success(), "plain HTTP must not be served");

    // The container health check asks over TLS on its own.
    let health = daemon.subcommand("healthcheck").output().unwrap();
    assert!(health.status.success(), "{}", String::from_utf8_lossy(&health.stderr));
}

/// The agent machine's file as docs/local-api.md gives it: where the daemon is, which CA
/// to trust, and the agent's table; no `[telegram]`, no routes. Its plugin connects over
/// TLS and carries a message and its reply.
#[tokio::test]
async fn a_plugin_on_an_agent_machine_needs_only_the_daemons_address_and_its_agent() {
    let fake = FakeTelegram::start().await;
    let dir = tempfile::tempdir().unwrap();
    let certs = TestCertificates::write_into(dir.path());
    let daemon = launched_trusting_its_ca(&fake, &certs);
    let agent_machine = dir.path().join("agent-machine.toml");
    std::fs::write(
        &agent_machine,
        format!(
            "[api]\ndaemon = [\"https://{}\"]\nca = \"{}\"\n\n\
             [agents.orchestrator]\ntoken_env = \"SB_TEST_ORCHESTRATOR_SECRET\"\n",
            daemon.api_addr(),
            certs.ca.display()
        ),
    )
    .unwrap();
    let orchestrator = support::mcp::ChannelClient::builder(&agent_machine, "orchestrator")
        .env("SB_TEST_ORCHESTRATOR_SECRET", ORCHESTRATOR_SECRET)
        .start()
        .await
        .expect("the plugin starts from the agent machine's file");
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "from afar?");
    let pushed = orchestrator.wait_for_notifications(1, WAIT).await.unwrap();
    assert_eq!(pushed[0].content, "from afar?");
    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": "from afar."})).await.unwrap();
    assert!(!is_error, "{text}");
    assert_eq!(fake.wait_for_sent(1, WAIT).await[0].text, "from afar.");
}

/// Starts `agent`'s plugin beside `daemon` and checks that a certificate keeps it from ever
/// connecting: it says so, its reply is refused at once (the daemon read no request, so the
/// outcome is known: not sent), nothing reaches Telegram, and the daemon logs the handshake.
async fn assert_a_certificate_keeps_the_plugin_out(daemon: &TestDaemon, fake: &FakeTelegram, agent: &str) {
    let plugin = plugin(daemon, agent).await;
    let why = plugin.wait_for_stderr("not reachable", WAIT).await.unwrap();
    assert!(why.to_lowercase().contains("certificate"), "the plugin says a certificate is why: {why}");
    assert!(!plugin.stderr().contains("connected to the switchboard daemon"), "{}", plugin.stderr());
    let asked = std::time::Instant::now();
    let (is_error, text) = plugin.call_tool("reply", json!({"text": "hello?"})).await.unwrap();
    assert!(is_error, "nothing can be answered without the daemon: {text}");
    assert!(
        asked.elapsed() < WAIT,
        "refused at once, not waited on as an unknown outcome: {:?}",
        asked.elapsed()
    );
    assert!(fake.sent_messages().is_empty());
    daemon.wait_for_log("TLS handshake on the local API failed", WAIT).await;
}

#[tokio::test]
async fn a_plugin_that_does_not_trust_the_certificate_never_connects() {
    let fake = FakeTelegram::start().await;
    let dir = tempfile::tempdir().unwrap();
    let certs = TestCertificates::write_into(dir.path());
    // No `api.ca`: the system's roots do not know the test CA.
    let mut daemon = configure_with_api(&fake, &tls_lines(&certs, &certs.key));
    daemon.launch();
    assert_a_certificate_keeps_the_plugin_out(&daemon, &fake, "worker").await;
}

#[tokio::test]
async fn a_certificate_the_daemon_cannot_serve_stops_it_before_it_listens() {
    let fake = FakeTelegram::start().await;
    let dir = tempfile::tempdir().unwrap();
    let certs = TestCertificates::write_into(dir.path());
    let missing = dir.path().join("missing.pem");
    for (key, says) in [(&certs.stray_key, "does not fit"), (&missing, "api.tls.key")] {
        let daemon = configure_with_api(&fake, &tls_lines(&certs, key));
        for command in ["check", "run"] {
            let output = daemon.subcommand(command).output().unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(!output.status.success(), "{command} with {}: {stderr}", key.display());
            assert!(stderr.contains(says), "{command} names what is wrong ({says}): {stderr}");
        }
    }
}

#[tokio::test]
async fn a_plugin_given_several_daemons_uses_the_one_that_listens() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    // Nothing listens on the first address (a replica standing by binds nothing).
    let nobody = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let worker = plugin_builder(&daemon, "worker")
        .arg("--daemon")
        .arg(format!("http://{nobody}"))
        .arg("--daemon")
        .arg(format!("http://{}", daemon.api_addr()))
        .start()
        .await
        .unwrap();
    worker.wait_for_stderr("connected to the switchboard daemon", WAIT).await.unwrap();
    assert!(worker.stderr().contains("trying the next address"), "{}", worker.stderr());

    fake.push_topic_text(ChatSpec::forum(FORUM_CHAT, "Ops forum"), OPS_TOPIC, owner(), "which daemon?");
    worker.wait_for_notifications(1, WAIT).await.unwrap();
    let (is_error, text) = worker.call_tool("reply", json!({"text": "the one that listens"})).await.unwrap();
    assert!(!is_error, "{text}");
    assert_eq!(fake.wait_for_sent(1, WAIT).await[0].text, "the one that listens");
}

#[tokio::test]
async fn a_daemon_address_that_would_send_the_secret_in_the_clear_is_refused() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::configure(&fake.api_url(), "", &default_routes(), &[]);
    let output = std::process::Command::new(BIN)
        .args(["channel", "--agent", "worker", "--config"])
        .arg(daemon.config_path())
        .args(["--daemon", "http://sb-1.internal:7797"])
        .env("SB_TEST_WORKER_SECRET", WORKER_SECRET)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "a plugin told to send its secret in the clear must not start: {stderr}"
    );
    assert!(stderr.contains("--daemon") && stderr.contains("plain http"), "{stderr}");
}

#[tokio::test]
async fn a_renewed_certificate_is_served_after_sighup_and_one_that_cannot_be_served_is_refused() {
    let fake = FakeTelegram::start().await;
    let dir = tempfile::tempdir().unwrap();
    let certs = TestCertificates::write_into(dir.path());
    let daemon = launched_trusting_its_ca(&fake, &certs);
    let orchestrator = session(&daemon, "orchestrator").await;
    let https = https_client(&certs);
    // The certificate a new connection is shown (a client of its own, so none is reused).
    let served = || async {
        let answer =
            https_client(&certs).get(format!("https://{}/readyz", daemon.api_addr())).send().await.unwrap();
        assert!(answer.status().is_success(), "{:?}", answer.status());
        let tls = answer.extensions().get::<reqwest::tls::TlsInfo>().expect("TLS information");
        tls.peer_certificate().expect("the daemon's certificate").to_vec()
    };
    let first = served().await;

    // The renewal is written over the files the daemon serves, as certbot's deploy step
    // would, and announced with SIGHUP.
    let (renewed, renewed_key) = certs.renewal(2040);
    std::fs::write(&certs.cert, renewed.pem()).unwrap();
    std::fs::write(&certs.key, renewed_key.serialize_pem()).unwrap();
    daemon.signal("HUP");
    daemon.wait_for_log("serves the renewed certificate", WAIT).await;
    let now_served = served().await;
    assert_ne!(now_served, first, "a new connection is shown the renewed certificate");
    assert_eq!(now_served, renewed.der().to_vec());

    // The session goes on: a message and its reply, over whichever connection the plugin uses.
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "still there?");
    let pushed = orchestrator.wait_for_notifications(1, WAIT).await.unwrap();
    assert_eq!(pushed[0].content, "still there?");
    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": "still here."})).await.unwrap();
    assert!(!is_error, "{text}");
    assert_eq!(fake.wait_for_sent(1, WAIT).await[0].text, "still here.");

    // A renewal caught half written (a new certificate beside the old key) is refused, and
    // the running certificate is still served.
    let (half, _) = certs.renewal(2041);
    std::fs::write(&certs.cert, half.pem()).unwrap();
    daemon.signal("HUP");
    daemon.wait_for_log("was not read again", WAIT).await;
    assert!(daemon.logs().contains("does not fit"), "the daemon says what is wrong: {}", daemon.logs());
    assert_eq!(served().await, renewed.der().to_vec(), "the running certificate stays");

    let metrics = https
        .get(format!("https://{}/metrics", daemon.api_addr()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // When the served certificate expires: the renewal's 1 January 2040 (00:00 UTC).
    assert!(
        metrics.lines().any(|line| line.starts_with("switchboard_api_certificate_expires_at_seconds")
            && line.split_whitespace().last().and_then(|v| v.parse::<f64>().ok()) == Some(2_208_988_800.0)),
        "{metrics}"
    );
    for result in ["renewed", "refused"] {
        assert!(
            metrics.lines().any(|line| line.starts_with("switchboard_api_certificate_reads_total")
                && line.contains(&format!("result=\"{result}\""))
                && line.ends_with(" 1")),
            "one read {result}: {metrics}"
        );
    }
}

/// A CA for clients, of the test's own, and certificates for plugins: one it signed, and
/// one another CA signed.
struct ClientCertificates {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    stray_cert: PathBuf,
    stray_key: PathBuf,
}

impl ClientCertificates {
    fn write_into(dir: &Path) -> Self {
        let write = |name: &str, pem: String| {
            let path = dir.join(name);
            std::fs::write(&path, pem).unwrap();
            path
        };
        let (ca, issuer) = client_ca();
        let (cert, key) = client_certificate(&issuer);
        let (_, stray_issuer) = client_ca();
        let (stray_cert, stray_key) = client_certificate(&stray_issuer);
        Self {
            ca: write("clients-ca.pem", ca.pem()),
            cert: write("plugin.pem", cert.pem()),
            key: write("plugin.key", key.serialize_pem()),
            stray_cert: write("stray-plugin.pem", stray_cert.pem()),
            stray_key: write("stray-plugin.key", stray_key.serialize_pem()),
        }
    }

    fn identity(cert: &Path, key: &Path) -> reqwest::Identity {
        let mut pem = std::fs::read(cert).unwrap();
        pem.extend(std::fs::read(key).unwrap());
        reqwest::Identity::from_pem(&pem).unwrap()
    }
}

fn client_ca() -> (rcgen::Certificate, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().unwrap();
    let ca = params.self_signed(&key).unwrap();
    (ca, Issuer::new(params, key))
}

fn client_certificate(issuer: &Issuer<'static, KeyPair>) -> (rcgen::Certificate, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::new()).unwrap();
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    (params.signed_by(&key, issuer).unwrap(), key)
}

/// `[api]` lines for a daemon serving `certs` that requires certificates `clients`' CA
/// signed, trusted by its plugins (`api.ca`).
fn mutual_tls_lines(certs: &TestCertificates, clients: &ClientCertificates) -> String {
    format!(
        "tls = {{ cert = \"{}\", key = \"{}\", client_ca = \"{}\" }}\nca = \"{}\"",
        certs.cert.display(),
        certs.key.display(),
        clients.ca.display(),
        certs.ca.display()
    )
}

#[tokio::test]
async fn a_plugin_showing_the_client_certificate_the_daemon_requires_carries_a_message_and_its_reply() {
    let fake = FakeTelegram::start().await;
    let dir = tempfile::tempdir().unwrap();
    let certs = TestCertificates::write_into(dir.path());
    let clients = ClientCertificates::write_into(dir.path());
    let mut daemon = configure_with_api(
        &fake,
        &format!(
            "{}\nclient_cert = \"{}\"\nclient_key = \"{}\"",
            mutual_tls_lines(&certs, &clients),
            clients.cert.display(),
            clients.key.display()
        ),
    );
    daemon.launch();
    let orchestrator = session(&daemon, "orchestrator").await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "with a client certificate?");
    orchestrator.wait_for_notifications(1, WAIT).await.unwrap();
    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": "with one."})).await.unwrap();
    assert!(!is_error, "{text}");
    let sent = fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].text, "with one.");

    // Nothing of the API answers a connection without a certificate the clients' CA signed.
    let readyz = format!("https://{}/readyz", daemon.api_addr());
    let client = |identity| https_client_showing(&certs, identity);
    assert!(client(None).get(&readyz).send().await.is_err(), "no certificate, no answer");
    let stray = ClientCertificates::identity(&clients.stray_cert, &clients.stray_key);
    assert!(client(Some(stray)).get(&readyz).send().await.is_err(), "another CA's certificate, no answer");
    let shown = ClientCertificates::identity(&clients.cert, &clients.key);
    let ready = client(Some(shown)).get(&readyz).send().await.unwrap();
    assert!(ready.status().is_success(), "{:?}", ready.status());

    // `healthcheck --config` shows the configured certificate too.
    let health = daemon.subcommand("healthcheck").output().unwrap();
    assert!(health.status.success(), "{}", String::from_utf8_lossy(&health.stderr));
}

#[tokio::test]
async fn a_plugin_without_the_client_certificate_the_daemon_requires_never_connects() {
    let fake = FakeTelegram::start().await;
    let dir = tempfile::tempdir().unwrap();
    let certs = TestCertificates::write_into(dir.path());
    let clients = ClientCertificates::write_into(dir.path());
    let mut daemon = configure_with_api(&fake, &mutual_tls_lines(&certs, &clients));
    daemon.launch();
    // Under TLS 1.3 the plugin learns it from the daemon's first answer, an alert, after it
    // sent its request; still the daemon read none.
    assert_a_certificate_keeps_the_plugin_out(&daemon, &fake, "worker").await;

    // The healthcheck has no certificate to show either, and says where to ask instead.
    let health = daemon.subcommand("healthcheck").output().unwrap();
    assert!(!health.status.success());
    let said = String::from_utf8_lossy(&health.stderr);
    assert!(said.contains("api.health_listen") && said.contains("client_ca"), "{said}");
}

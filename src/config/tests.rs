use std::time::Duration;

use super::settings::*;
use super::validate::*;
use super::*;

#[test]
fn the_listen_override_is_named_like_every_override() {
    assert_eq!(API_LISTEN_ENV, format!("{ENV_PREFIX}{ENV_SEPARATOR}API{ENV_SEPARATOR}LISTEN"));
}
use std::io::Write;

const MINIMAL: &str = r#"
[telegram]
token_env = "SB_TEST_TOKEN"

[agents.orchestrator]
token_env = "SB_TEST_ORCH"

[[routes]]
name = "dm"
chat_id = 42
agent = "orchestrator"
"#;

fn load_str(text: &str) -> Result<Settings, ConfigError> {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    Settings::load(file.path())
}

fn load_under(text: &str, vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    let vars = vars.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned()));
    Settings::load_under(file.path(), vars.collect::<Vec<_>>().into_iter())
}

/// A list key from the environment is its comma-separated items, wherever it stands: one
/// item is a list of one, stray commas and spaces are nothing, an empty value clears what
/// the file lists. A scalar that looks like a number is a number only where one is wanted.
/// A bad override is blamed on the environment, which the operator reads for it, not on
/// the file, which reads fine alone.
#[test]
fn an_override_the_file_does_not_take_is_blamed_on_the_environment() {
    for (name, value) in [("SWITCHBOARD__BOGUS__X", "1"), ("SWITCHBOARD__TELEGRAM__ALLOWED_USERS", "abc")] {
        let e = load_under(MINIMAL, &[(name, value)]).unwrap_err();
        assert!(e.problem.contains("environment") && e.problem.contains(name), "{name}: {e}");
    }
    // A fault in the file itself is the file's.
    let broken = MINIMAL.replace("[telegram]", "[telegram]\nbogus = 1");
    let e = load_under(&broken, &[("SWITCHBOARD__TELEGRAM__POLL_TIMEOUT_SECS", "5")]).unwrap_err();
    assert!(!e.problem.contains("environment"), "{e}");
}

#[test]
fn lists_from_the_environment_are_their_comma_separated_items() {
    let listing = MINIMAL.replace("[telegram]", "[telegram]\nallowed_users = [5, 6]");
    let one = load_under(&listing, &[("SWITCHBOARD__TELEGRAM__ALLOWED_USERS", "111")]).unwrap();
    assert_eq!(one.telegram.allowed_users, [111]);
    let stray = load_under(&listing, &[("SWITCHBOARD__TELEGRAM__ALLOWED_USERS", " 111, 222,")]).unwrap();
    assert_eq!(stray.telegram.allowed_users, [111, 222]);
    let cleared = load_under(&listing, &[("SWITCHBOARD__TELEGRAM__ALLOWED_USERS", "")]).unwrap();
    assert!(cleared.telegram.allowed_users.is_empty());

    let agent = load_under(
        MINIMAL,
        &[
            ("SWITCHBOARD__AGENTS__ORCHESTRATOR__ALIASES", "boss"),
            ("SWITCHBOARD__AGENTS__ORCHESTRATOR__DISPLAY_NAME", "42"),
            ("SWITCHBOARD__API__DAEMON", "https://switchboard.example:7797"),
            ("SWITCHBOARD__HANDOFFS__MAX_DEPTH", "3"),
        ],
    )
    .unwrap();
    let orchestrator = &agent.agents[&AgentName::parse("orchestrator").unwrap()];
    assert_eq!(orchestrator.aliases, ["boss"]);
    assert_eq!(orchestrator.display_name.as_deref(), Some("42"));
    assert_eq!(agent.api.daemon.len(), 1);
    assert_eq!(agent.handoffs.max_depth, 3);

    let wrong = load_under(MINIMAL, &[("SWITCHBOARD__TELEGRAM__ALLOWED_USERS", "111,bob")]).unwrap_err();
    assert!(wrong.key.contains("allowed_users"), "{wrong}");
}

#[test]
fn minimal_file_gets_defaults() {
    let settings = load_str(MINIMAL).unwrap();
    assert_eq!(settings.telegram.api_url.as_str(), "https://api.telegram.org/");
    assert_eq!(settings.telegram.poll_timeout, Duration::from_secs(10));
    assert_eq!(settings.telegram.unauthorized_exit, Duration::from_secs(300));
    assert_eq!(settings.api.listen.to_string(), "127.0.0.1:7797");
    assert_eq!(settings.storage.synchronous, Synchronous::Normal);
    assert_eq!(settings.routes.routes().len(), 1);
}

#[test]
fn the_example_file_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/switchboard.example.toml");
    let settings = Settings::load(&path).unwrap();
    assert_eq!(settings.routes.routes().len(), 4);
    assert_eq!(settings.rooms.len(), 1);
}

fn problem(text: &str) -> ConfigError {
    load_str(text).expect_err("configuration should be refused")
}

#[test]
fn typing_is_on_for_two_minutes_by_default_and_the_ack_reaction_must_be_telegrams() {
    let outbound = load_str(MINIMAL).unwrap().outbound;
    assert_eq!((outbound.typing, outbound.ack_reaction), (Some(Duration::from_secs(120)), None));
    let with = |outbound: &str| format!("[outbound]\n{outbound}\n{MINIMAL}");
    let set = load_str(&with("typing_max_secs = 30\nack_reaction = \"👀\"")).unwrap().outbound;
    assert_eq!((set.typing, set.ack_reaction), (Some(Duration::from_secs(30)), Some("👀")));
    assert_eq!(load_str(&with("typing = false")).unwrap().outbound.typing, None);
    let e = problem(&with("ack_reaction = \"🦀\""));
    assert!(e.key == "outbound.ack_reaction" && e.to_string().contains("👍"), "{e}");
    assert_eq!(problem(&with("typing_max_secs = 0")).key, "outbound.typing_max_secs");
}

#[test]
fn pacing_is_bounded_to_what_a_reply_can_wait_for() {
    let with = |outbound: &str| format!("[outbound]\n{outbound}\n{MINIMAL}");
    let set = load_str(&with("private_chat_interval_ms = 60000\nglobal_per_sec = 1000")).unwrap().outbound;
    assert_eq!((set.pacing.private, set.pacing.overall_per_sec), (Duration::from_secs(60), 1000));
    for (key, line) in [
        ("outbound.private_chat_interval_ms", "private_chat_interval_ms = 10000000000000000"),
        ("outbound.group_chat_interval_ms", "group_chat_interval_ms = 60001"),
        ("outbound.global_per_sec", "global_per_sec = 1001"),
    ] {
        let e = problem(&with(line));
        assert!(e.key == key && e.problem.contains("at most"), "{line}: {e}");
    }
}

#[test]
fn retention_is_off_by_default_hourly_when_set_and_at_least_a_day() {
    assert_eq!(load_str(MINIMAL).unwrap().storage.retain, None);
    let with = |storage: &str| format!("[storage]\n{storage}\n{MINIMAL}");
    let retain = load_str(&with("retain_days = 90")).unwrap().storage.retain;
    assert_eq!(retain, Some(Retention { days: 90, every: Duration::from_secs(3600) }));
    let e = problem(&with("retain_days = 0"));
    assert_eq!(e.key, "storage.retain_days");
    assert!(e.problem.contains("at least 1"), "{e}");
    assert!(load_str(&with("retain_days = -3")).is_err());
    // The schedule's date arithmetic has limits: a value past a century is refused.
    let century = load_str(&with("retain_days = 36525")).unwrap().storage.retain;
    assert_eq!(century.map(|r| r.days), Some(36_525));
    for too_long in ["36526", "4294967295"] {
        let e = problem(&with(&format!("retain_days = {too_long}")));
        assert_eq!(e.key, "storage.retain_days", "{too_long}");
    }
    let quick = load_str(&with("retain_days = 1\nretention_interval_secs = 1")).unwrap().storage.retain;
    assert_eq!(quick.map(|r| r.every), Some(Duration::from_secs(1)));
    // An interval without retain_days would read as pruning that never happens.
    let e = problem(&with("retention_interval_secs = 600"));
    assert_eq!(e.key, "storage.retention_interval_secs");
    assert!(e.problem.contains("storage.retain_days"), "{e}");
}

#[test]
fn a_postgres_url_selects_postgresql_with_a_lease_and_a_replica_name() {
    let with = |storage: &str| format!("[storage]\n{storage}\n{MINIMAL}");
    let sqlite = load_str(MINIMAL).unwrap().storage.database;
    assert_eq!(sqlite, Database::Sqlite("switchboard.db".into()));

    let url = "postgres://switchboard:s3cret@db.internal:5432/bot";
    let Database::Postgres(postgres) =
        load_str(&with(&format!("database = \"{url}\""))).unwrap().storage.database
    else {
        panic!("a postgres:// URL is PostgreSQL")
    };
    assert_eq!(postgres.url, url);
    assert_eq!(postgres.lease.duration(), Duration::from_secs(10), "the issue's default lease");
    assert!(postgres.replica.ends_with(&std::process::id().to_string()), "{}", postgres.replica);
    let shown = Database::Postgres(postgres.clone());
    assert_eq!(shown.to_string(), "postgres://switchboard:***@db.internal:5432/bot");
    assert!(!format!("{postgres:?}").contains("s3cret"), "{postgres:?}");
    assert_eq!(crate::config::postgres_password(url).as_deref(), Some("s3cret"));
    // The driver takes a password in the query too: hidden there as well.
    let in_query = "postgres://app@db/x?sslmode=disable&password=s3cr%40t";
    let shown = Database::Postgres(PostgresLedger { url: in_query.into(), ..postgres.clone() }).to_string();
    assert!(!shown.contains("s3cr") && shown.contains("sslmode=disable"), "{shown}");
    assert_eq!(crate::config::postgres_password(in_query).as_deref(), Some("s3cr@t"));
    assert_eq!(crate::config::postgres_password("postgres://app@db/x"), None);

    let set =
        load_str(&with("database = \"postgresql://db/bot\"\nreplica = \"eu-1\"\nlease_secs = 4")).unwrap();
    let Database::Postgres(postgres) = set.storage.database else { panic!("postgresql:// too") };
    assert_eq!((postgres.replica.as_str(), postgres.lease.duration()), ("eu-1", Duration::from_secs(4)));

    assert_eq!(problem(&with("database = \"postgres://db\"\nlease_secs = 0")).key, "storage.lease_secs");
    assert_eq!(problem(&with("database = \"postgres://db\"\nreplica = \" \"")).key, "storage.replica");
    assert_eq!(problem(&with("database = \"postgres://\"")).key, "storage.database");
    let e = problem(&with("database = \"ledger.db\"\nlease_secs = 5"));
    assert!(e.key == "storage.lease_secs" && e.problem.contains("PostgreSQL"), "{e}");
    assert_eq!(problem(&with("database = \"\"")).key, "storage.database");
}

#[test]
fn syntax_errors_name_the_line() {
    let e = problem("[telegram]\ntoken_env = \"X\"\napi_url = \n");
    assert_eq!(e.key, "(syntax)");
    assert!(e.problem.contains("line 3"), "{e}");
}

#[test]
fn unknown_agent_in_a_route_is_named() {
    let e = problem(&MINIMAL.replace("agent = \"orchestrator\"", "agent = \"ghost\""));
    assert_eq!(e.key, "routes[0].agent");
    assert!(e.problem.contains("'ghost'") && e.problem.contains("orchestrator"), "{e}");
}

#[test]
fn route_without_agent_is_refused() {
    let e = problem(&MINIMAL.replace("agent = \"orchestrator\"", ""));
    assert_eq!(e.key, "routes[0].agent");
}

#[test]
fn duplicate_routes_are_refused() {
    let text = format!("{MINIMAL}\n[[routes]]\nname = \"dm2\"\nchat_id = 42\nagent = \"orchestrator\"\n");
    let e = problem(&text);
    assert_eq!(e.key, "routes[1]");
    assert!(e.problem.contains("'dm'") && e.problem.contains("'dm2'"), "{e}");
}

#[test]
fn two_default_routes_are_refused() {
    let text = format!(
        "{MINIMAL}\n[[routes]]\nname = \"a\"\nagent = \"orchestrator\"\n[[routes]]\nname = \"b\"\nagent = \"orchestrator\"\n"
    );
    assert_eq!(problem(&text).key, "routes[2]");
}

#[test]
fn thread_without_chat_is_refused() {
    let e = problem(&MINIMAL.replace("chat_id = 42", "thread_id = 7"));
    assert_eq!(e.key, "routes[0].thread_id");
}

#[test]
fn bad_api_url_is_refused() {
    let e = problem(&MINIMAL.replace("[telegram]", "[telegram]\napi_url = \"not a url\""));
    assert_eq!(e.key, "telegram.api_url");
    let e = problem(&MINIMAL.replace("[telegram]", "[telegram]\napi_url = \"ftp://example.org\""));
    assert_eq!(e.key, "telegram.api_url");
}

#[test]
fn unknown_keys_are_refused() {
    let e = problem(&MINIMAL.replace("chat_id = 42", "chat_id = 42\nchat-id = 43"));
    assert!(e.problem.contains("chat-id"), "{e}");
}

#[test]
fn wrong_types_name_the_key() {
    let e = problem(&MINIMAL.replace("[telegram]", "[telegram]\npoll_timeout_secs = \"soon\""));
    assert!(e.to_string().contains("poll_timeout_secs"), "{e}");
}

fn with_api(api: &str) -> String {
    MINIMAL.replace("[telegram]", &format!("[api]\n{api}\n[telegram]"))
}

#[test]
fn the_local_api_leaves_loopback_only_with_tls_or_the_operators_word() {
    assert_eq!(load_str(MINIMAL).unwrap().warnings(), []);
    assert_eq!(load_str(&with_api("listen = \"[::1]:7797\"")).unwrap().warnings(), []);
    for open in ["0.0.0.0:7797", "192.168.1.5:7797", "[::]:7797"] {
        let e = problem(&with_api(&format!("listen = \"{open}\"")));
        assert_eq!(e.key, "api.listen", "{open}");
        assert!(e.problem.contains(open) && e.problem.contains("api.tls"), "{e}");

        let tls = with_api(&format!("listen = \"{open}\"\ntls = {{ cert = \"a.pem\", key = \"k.pem\" }}"));
        let settings = load_str(&tls).unwrap();
        assert_eq!(settings.warnings(), [], "{open}");
        assert_eq!(
            settings.api.tls,
            Some(ApiTls { cert: "a.pem".into(), key: "k.pem".into(), client_ca: None })
        );

        let private = with_api(&format!("listen = \"{open}\"\nplaintext_beyond_loopback = true"));
        let warnings = load_str(&private).unwrap().warnings();
        assert_eq!(warnings.len(), 1, "{open}");
        assert_eq!(warnings[0].key, "api.listen");
        assert!(
            warnings[0].problem.contains(open) && warnings[0].problem.contains("no TLS"),
            "{}",
            warnings[0]
        );
    }
}

#[test]
fn a_word_that_is_none_of_a_keys_values_is_refused_naming_them() {
    let extra = MINIMAL.replace("[telegram]", "[storage]\nsynchronous = \"extra\"\n[telegram]");
    let e = problem(&extra);
    assert_eq!(e.key, "storage.synchronous", "{e}");
    assert!(e.problem.contains("\"normal\" or \"full\"") && e.problem.contains("extra"), "{e}");
    let xml = MINIMAL.replace("[telegram]", "[log]\nformat = \"xml\"\n[telegram]");
    let e = problem(&xml);
    assert!(e.problem.contains("\"text\" or \"json\""), "{e}");
    let full = MINIMAL.replace("[telegram]", "[storage]\nsynchronous = \"full\"\n[telegram]");
    assert_eq!(load_str(&full).unwrap().storage.synchronous, Synchronous::Full);
}

#[test]
fn a_route_for_the_general_topic_is_refused_with_what_to_do() {
    let general = MINIMAL.replace("chat_id = 42", "chat_id = -100500\nthread_id = 1");
    let e = problem(&general);
    assert_eq!(e.key, "routes[0].thread_id", "{e}");
    assert!(e.problem.contains("General") && e.problem.contains("leave out"), "{e}");
    let topic = MINIMAL.replace("chat_id = 42", "chat_id = -100500\nthread_id = 2");
    assert!(load_str(&topic).is_ok());
}

#[test]
fn mention_only_is_for_a_route_with_one_agent() {
    let single = MINIMAL.replace("agent = \"orchestrator\"", "agent = \"orchestrator\"\nmention_only = true");
    let settings = load_str(&single).unwrap();
    assert!(settings.routes.routes()[0].mention_only);
    let room =
        MINIMAL.replace("agent = \"orchestrator\"", "agents = [\"orchestrator\"]\nmention_only = true");
    let e = problem(&room);
    assert_eq!(e.key, "routes[0].mention_only", "{e}");
    assert!(e.problem.contains("room"), "{e}");
}

#[test]
fn a_catch_all_route_open_to_every_sender_is_warned_about() {
    let catch_all = format!("{MINIMAL}\n[[routes]]\nname = \"fallback\"\nagent = \"orchestrator\"\n");
    let warnings = load_str(&catch_all).unwrap().warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].key, "telegram.allowed_users");
    assert!(warnings[0].problem.contains("fallback"), "names the route: {}", warnings[0]);

    let allowlisted = catch_all.replace("[telegram]", "[telegram]\nallowed_users = [42]");
    assert_eq!(load_str(&allowlisted).unwrap().warnings(), [], "only the listed senders get through");
    assert_eq!(load_str(MINIMAL).unwrap().warnings(), [], "routes that name their chats");
}

#[test]
fn the_health_address_is_an_address_of_its_own_and_healthcheck_asks_there() {
    let settings = load_str(MINIMAL).unwrap();
    assert_eq!(settings.api.health_listen, None);
    assert_eq!(settings.api.health_url(), settings.api.own_url(), "the local API's, by default");

    let settings = load_str(&with_api("health_listen = \"0.0.0.0:7798\"")).unwrap();
    assert_eq!(settings.api.health_listen, Some("0.0.0.0:7798".parse().unwrap()));
    assert_eq!(settings.warnings(), [], "beyond loopback without TLS: it carries no secret");
    assert_eq!(settings.api.health_url().to_string(), "http://127.0.0.1:7798", "asked on loopback");

    let e = problem(&with_api("health_listen = \"localhost\""));
    assert_eq!(e.key, "api.health_listen");
    assert!(e.problem.contains("localhost"), "{e}");
    let e = problem(&with_api("listen = \"127.0.0.1:7797\"\nhealth_listen = \"127.0.0.1:7797\""));
    assert_eq!(e.key, "api.health_listen");
    assert!(e.problem.contains("api.listen"), "{e}");
    // An unspecified address takes the port on every address: the second bind would fail.
    for (listen, health) in [
        ("127.0.0.1:7797", "0.0.0.0:7797"),
        ("0.0.0.0:7797", "127.0.0.1:7797"),
        ("127.0.0.1:7797", "[::]:7797"),
    ] {
        let api =
            format!("listen = \"{listen}\"\nhealth_listen = \"{health}\"\nplaintext_beyond_loopback = true");
        let e = problem(&with_api(&api));
        assert_eq!(e.key, "api.health_listen", "{listen} and {health}: {e}");
    }
    // Other ports, two loopback addresses, or port 0 (a free port each) bind side by side.
    for (listen, health) in [
        ("127.0.0.1:7797", "0.0.0.0:7798"),
        ("127.0.0.1:7797", "127.0.0.2:7797"),
        ("127.0.0.1:0", "0.0.0.0:0"),
    ] {
        let settings = load_str(&with_api(&format!("listen = \"{listen}\"\nhealth_listen = \"{health}\"")));
        assert!(settings.is_ok(), "{listen} and {health}: {settings:?}");
    }
}

#[test]
fn a_client_certificate_needs_both_files_and_client_ca_a_file() {
    let settings = load_str(&with_api(
        "tls = { cert = \"a.pem\", key = \"k.pem\", client_ca = \"clients.pem\" }\nclient_cert = \"p.pem\"\nclient_key = \"p.key\"",
    ))
    .unwrap();
    assert_eq!(settings.api.tls.unwrap().client_ca, Some("clients.pem".into()));
    assert_eq!(
        settings.api.client_identity,
        Some(ClientIdentity { cert: "p.pem".into(), key: "p.key".into() })
    );
    assert_eq!(problem(&with_api("client_cert = \"p.pem\"")).key, "api.client_key");
    assert_eq!(problem(&with_api("client_key = \"p.key\"")).key, "api.client_cert");
    assert_eq!(problem(&with_api("client_cert = \" \"\nclient_key = \"p.key\"")).key, "api.client_cert");
    assert_eq!(
        problem(&with_api("tls = { cert = \"a.pem\", key = \"k.pem\", client_ca = \"\" }")).key,
        "api.tls.client_ca"
    );
}

#[test]
fn api_tls_needs_both_files() {
    assert!(problem(&with_api("tls = { cert = \"a.pem\" }")).to_string().contains("key"));
    let e = problem(&with_api("tls = { cert = \"\", key = \"k.pem\" }"));
    assert_eq!(e.key, "api.tls.cert");
    assert_eq!(problem(&with_api("ca = \" \"")).key, "api.ca");
}

#[test]
fn plugins_reach_the_daemon_where_it_listens_unless_told_otherwise() {
    let urls = |api: &str| -> Vec<String> {
        load_str(&with_api(api)).unwrap().api.daemon_urls().iter().map(ToString::to_string).collect()
    };
    assert_eq!(urls("listen = \"127.0.0.1:7797\""), ["http://127.0.0.1:7797"]);
    // A wildcard listens on loopback too, which is where a plugin beside it asks.
    assert_eq!(
        urls("listen = \"0.0.0.0:7797\"\nplaintext_beyond_loopback = true"),
        ["http://127.0.0.1:7797"]
    );
    assert_eq!(urls("listen = \"[::]:7797\"\nplaintext_beyond_loopback = true"), ["http://[::1]:7797"]);
    assert_eq!(
        urls("listen = \"0.0.0.0:7797\"\ntls = { cert = \"a.pem\", key = \"k.pem\" }"),
        ["https://127.0.0.1:7797"]
    );
    assert_eq!(
        urls("daemon = [\"https://sb-1.internal:7797\", \"https://sb-2.internal:7797/\"]"),
        ["https://sb-1.internal:7797", "https://sb-2.internal:7797"]
    );
    assert_eq!(urls("daemon = [\"http://localhost:7797\"]"), ["http://localhost:7797"]);
}

#[test]
fn a_daemon_beside_its_plugin_is_asked_on_loopback_when_it_listens_on_a_wildcard() {
    let ask = |listen: &str, tls| DaemonUrl::beside(listen.parse().unwrap(), tls).to_string();
    assert_eq!(ask("0.0.0.0:7797", false), "http://127.0.0.1:7797");
    assert_eq!(ask("[::]:7797", false), "http://[::1]:7797");
    assert_eq!(ask("127.0.0.1:7797", true), "https://127.0.0.1:7797");
    assert_eq!(ask("10.0.0.5:8080", false), "http://10.0.0.5:8080");
}

#[test]
fn a_daemon_address_a_plugin_cannot_use_safely_is_refused() {
    for (given, says) in [
        ("sb-1.internal:7797", "https://"),
        ("https://", "not a URL"),
        ("ftp://sb-1.internal:7797", "scheme"),
        ("https://sb-1.internal:7797/api", "more than"),
        ("https://user@sb-1.internal:7797", "more than"),
        ("http://sb-1.internal:7797", "plain http beyond loopback"),
        ("http://10.0.0.5:7797", "plain http beyond loopback"),
    ] {
        let e = problem(&with_api(&format!("daemon = [\"{given}\"]")));
        assert_eq!(e.key, "api.daemon", "{given}");
        assert!(e.problem.contains(says), "{given}: {e}");
    }
    let private = with_api("daemon = [\"http://10.0.0.5:7797\"]\nplaintext_beyond_loopback = true");
    assert_eq!(load_str(&private).unwrap().api.daemon_urls()[0].to_string(), "http://10.0.0.5:7797");
}

#[test]
fn agents_sharing_a_secret_are_refused_naming_both_keys_but_not_the_value() {
    let path = Path::new("switchboard.toml");
    let (orch, worker) = (AgentName::parse("orch").unwrap(), AgentName::parse("worker").unwrap());
    let (one, other) = (Secret::new("s3cret-value-1".into()), Secret::new("s3cret-value-2".into()));

    let distinct = [(&orch, "ORCH", &one), (&worker, "WORKER", &other)];
    assert_eq!(check_distinct_secrets(path, &distinct), Ok(()));

    let same_value = [(&orch, "ORCH", &one), (&worker, "WORKER", &one.clone())];
    let e = check_distinct_secrets(path, &same_value).unwrap_err();
    assert_eq!(e.key, "agents.worker.token_env");
    assert!(e.problem.contains("agents.orch.token_env") && e.problem.contains("same secret"), "{e}");
    assert!(!e.to_string().contains("s3cret"), "the value is never shown: {e}");

    let same_variable = [(&orch, "SHARED", &one), (&worker, "SHARED", &one.clone())];
    let e = check_distinct_secrets(path, &same_variable).unwrap_err();
    assert_eq!(e.key, "agents.worker.token_env");
    assert!(e.problem.contains("agents.orch.token_env") && e.problem.contains("SHARED"), "{e}");
    assert!(!e.to_string().contains("s3cret"), "{e}");
}

const ROOM: &str = r#"
[telegram]
token_env = "SB_TEST_TOKEN"

[agents.builder]
token_env = "SB_TEST_BUILDER"
display_name = "Builder"
aliases = ["bob", "@bobby"]

[agents.reviewer]
token_env = "SB_TEST_REVIEWER"

[[routes]]
name = "dev-room"
chat_id = -1001
agents = ["builder", "reviewer"]
"#;

#[test]
fn a_room_route_takes_its_agents_in_order_and_the_room_defaults() {
    let settings = load_str(ROOM).unwrap();
    let route = &settings.routes.routes()[0];
    assert!(route.is_room());
    assert_eq!(route.agent(), None);
    let room = &settings.rooms[&route.name];
    let names: Vec<&str> = room.roster.members().iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["builder", "reviewer"]);
    assert_eq!((room.chat_id, room.thread_id), (-1001, None));
    assert_eq!(room.roster.first().display_name(), "Builder");
    assert_eq!(room.roster.members()[0].aliases, ["bob", "bobby"], "a leading @ is forgiven");
    assert_eq!(room.roster.members()[1].display_name(), "reviewer");
    assert_eq!(room.limits, RoomLimits::default());
    assert_eq!(room.limits.cascade_limit.get(), 10);
    assert_eq!(room.limits.max_iters, 50);
    assert_eq!(room.limits.speaker_timeout, Duration::from_secs(600));
}

#[test]
fn a_room_route_may_override_the_room_defaults() {
    let text = ROOM.replace(
        "[[routes]]",
        "[rooms]\ncascade_limit = 4\ngroup_max_iters = 30\nspeaker_timeout_secs = 120\n\n[[routes]]",
    ) + "cascade_limit = 2\nspeaker_timeout_secs = 5\n";
    let settings = load_str(&text).unwrap();
    assert_eq!(settings.room_defaults.cascade_limit.get(), 4);
    let room = settings.rooms.values().next().unwrap();
    assert_eq!(room.limits.cascade_limit.get(), 2);
    assert_eq!(room.limits.max_iters, 30, "from [rooms]");
    assert_eq!(room.limits.speaker_timeout, Duration::from_secs(5));
    for (configured, told) in [("0", 50), ("-3", 50), ("7", 7)] {
        let text = ROOM.replace("agents = [", &format!("group_max_iters = {configured}\nagents = ["));
        assert_eq!(load_str(&text).unwrap().rooms.values().next().unwrap().limits.max_iters, told);
    }
}

#[test]
fn room_configuration_errors_name_the_key() {
    let cases = [
        (ROOM.replace("agents = [", "agent = \"builder\"\nagents = ["), "routes[0].agents", "both"),
        (ROOM.replace("[\"builder\", \"reviewer\"]", "[]"), "routes[0].agents", "at least one agent"),
        (ROOM.replace("\"reviewer\"]", "\"builder\"]"), "routes[0].agents", "listed twice"),
        (ROOM.replace("\"reviewer\"]", "\"ghost\"]"), "routes[0].agents", "unknown agent 'ghost'"),
        (ROOM.replace("\"bob\"", "\"reviewer\""), "routes[0].agents", "name of agent 'reviewer'"),
        (
            ROOM.replace("display_name = \"Builder\"", "display_name = \"Reviewer\""),
            "routes[0].agents",
            "same room",
        ),
        (ROOM.replace("\"bob\"", "\"bob smith\""), "agents.builder.aliases", "cannot be mentioned"),
        (
            ROOM.replace("display_name = \"Builder\"", "display_name = \" \""),
            "agents.builder.display_name",
            "empty",
        ),
        (ROOM.replace("chat_id = -1001\n", ""), "routes[0].chat_id", "needs a chat_id"),
        (
            ROOM.replace("agents = [", "cascade_limit = 0\nagents = ["),
            "routes[0].cascade_limit",
            "at least 1",
        ),
        (
            ROOM.replace("agents = [", "speaker_timeout_secs = 0\nagents = ["),
            "routes[0].speaker_timeout_secs",
            "at least 1",
        ),
        (
            ROOM.replace("[[routes]]", "[rooms]\ncascade_limit = 0\n[[routes]]"),
            "rooms.cascade_limit",
            "at least 1",
        ),
        (
            ROOM.replace("agents = [\"builder\", \"reviewer\"]", "agent = \"builder\"\ncascade_limit = 3"),
            "routes[0].cascade_limit",
            "not a room",
        ),
        (ROOM.replace("agents = [\"builder\", \"reviewer\"]", ""), "routes[0].agent", "names no agent"),
    ];
    for (text, key, says) in cases {
        let e = problem(&text);
        assert_eq!(e.key, key, "{e}");
        assert!(e.problem.contains(says), "{says:?} not in: {e}");
    }
}

fn with_webhook(webhook: &str) -> String {
    MINIMAL.replace(
        "token_env = \"SB_TEST_TOKEN\"",
        &format!("token_env = \"SB_TEST_TOKEN\"\nwebhook = {webhook}"),
    )
}

#[test]
fn a_webhook_takes_an_https_url_with_a_path_and_a_listen_address() {
    assert!(load_str(MINIMAL).unwrap().telegram.webhook.is_none(), "absent: polling");
    let settings = load_str(&with_webhook(
        r#"{ public_url = "https://bot.example.org/telegram/hook", listen = "0.0.0.0:8443" }"#,
    ))
    .unwrap();
    let webhook = settings.telegram.webhook.unwrap();
    assert_eq!(webhook.path(), "/telegram/hook");
    assert_eq!(webhook.listen.to_string(), "0.0.0.0:8443");
    assert_eq!(webhook.secret_env, "SWITCHBOARD_WEBHOOK_SECRET");
}

#[test]
fn a_bad_webhook_names_its_key() {
    let cases = [
        (
            r#"{ public_url = "http://bot.example.org/hook", listen = "0.0.0.0:8443" }"#,
            "telegram.webhook.public_url",
        ),
        (
            r#"{ public_url = "https://bot.example.org/", listen = "0.0.0.0:8443" }"#,
            "telegram.webhook.public_url",
        ),
        (r#"{ public_url = "not a url", listen = "0.0.0.0:8443" }"#, "telegram.webhook.public_url"),
        (r#"{ public_url = "https://bot.example.org/hook", listen = "8443" }"#, "telegram.webhook.listen"),
        (
            r#"{ public_url = "https://bot.example.org/hook", listen = "0.0.0.0:8443", secret_env = "no-such name" }"#,
            "telegram.webhook.secret_env",
        ),
    ];
    for (webhook, key) in cases {
        assert_eq!(problem(&with_webhook(webhook)).key, key, "{webhook}");
    }
    let e = problem(&with_webhook(r#"{ public_url = "https://bot.example.org/hook" }"#));
    assert!(e.key.starts_with("telegram.webhook"), "{e}");
}

#[test]
fn a_webhook_secret_must_be_one_telegram_accepts_and_set() {
    assert!(is_webhook_secret("abc_DEF-123"));
    assert!(is_webhook_secret(&"x".repeat(256)));
    for refused in ["", "has space", "slash/", "é", &"x".repeat(257)] {
        assert!(!is_webhook_secret(refused), "{refused:?}");
    }
    let unset = with_webhook(
        r#"{ public_url = "https://b.example/h", listen = "0.0.0.0:8443", secret_env = "SB_TEST_SURELY_UNSET" }"#,
    );
    let settings = load_str(&unset).unwrap();
    let e = settings.webhook_secret(settings.telegram.webhook.as_ref().unwrap()).unwrap_err();
    assert_eq!(e.key, "telegram.webhook.secret_env");
    assert!(e.problem.contains("SB_TEST_SURELY_UNSET is not set"), "{e}");
    // HOME holds a path: its slashes are not allowed.
    let home = with_webhook(
        r#"{ public_url = "https://b.example/h", listen = "0.0.0.0:8443", secret_env = "HOME" }"#,
    );
    let settings = load_str(&home).unwrap();
    let e = settings.webhook_secret(settings.telegram.webhook.as_ref().unwrap()).unwrap_err();
    assert!(e.problem.contains("not a secret Telegram accepts"), "{e}");
    assert!(!e.problem.contains(&std::env::var("HOME").unwrap()), "the value is never shown: {e}");
}

#[test]
fn missing_secret_names_the_variable() {
    let settings = load_str(&MINIMAL.replace("SB_TEST_TOKEN", "SB_TEST_SURELY_UNSET")).unwrap();
    let e = settings.daemon_secrets().unwrap_err();
    assert_eq!(e.key, "telegram.token_env");
    assert!(e.problem.contains("SB_TEST_SURELY_UNSET is not set"), "{e}");
}

#[test]
fn a_permission_relay_takes_its_route_chat_and_defaults_its_timeout() {
    let text = MINIMAL.replace(
        "[[routes]]",
        "[agents.orchestrator.permissions]\nroute = \"dm\"\napprovers = [7]\n\n[[routes]]",
    );
    let settings = load_str(&text).unwrap();
    let relay = settings.agents.values().next().unwrap().permissions.clone().unwrap();
    assert_eq!((relay.route.as_str(), relay.chat_id, relay.thread_id), ("dm", 42, None));
    assert_eq!(relay.approvers, [7]);
    assert_eq!(relay.timeout, Duration::from_secs(DEFAULT_PERMISSION_TIMEOUT_SECS));
    assert!(load_str(MINIMAL).unwrap().agents.values().all(|agent| agent.permissions.is_none()));
}

#[test]
fn a_bad_permission_relay_names_its_key() {
    let relay = |body: &str| {
        MINIMAL.replace("[[routes]]", &format!("[agents.orchestrator.permissions]\n{body}\n\n[[routes]]"))
    };
    let cases = [
        (relay("route = \"nowhere\"\napprovers = [7]"), "agents.orchestrator.permissions.route", "nowhere"),
        (relay("route = \"dm\"\napprovers = []"), "agents.orchestrator.permissions.approvers", "empty"),
        (relay("route = \"dm\""), "agents.orchestrator.permissions.approvers", "empty"),
        (
            relay("route = \"dm\"\napprovers = [7]\ntimeout_secs = 0"),
            "agents.orchestrator.permissions.timeout_secs",
            "at least 1",
        ),
        (
            relay("route = \"dm\"\napprovers = [7]\ntimeout_secs = 99999999"),
            "agents.orchestrator.permissions.timeout_secs",
            "at most",
        ),
    ];
    for (text, key, says) in cases {
        let e = problem(&text);
        assert_eq!(e.key, key, "{e}");
        assert!(e.problem.contains(says), "{says:?} not in: {e}");
    }
}

#[test]
fn the_operator_table_names_a_chat_route_and_someone_to_answer() {
    let with = |body: &str| format!("{MINIMAL}\n[operator]\n{body}\n");
    let settings = load_str(&with("route = \"dm\"\noperators = [9]")).unwrap();
    let operator = settings.operator.unwrap();
    assert_eq!((operator.route.as_str(), operator.chat_id, operator.operators), ("dm", 42, vec![9]));
    assert!(load_str(MINIMAL).unwrap().operator.is_none());
    for (body, key, says) in [
        ("route = \"dm\"", "operator.operators", "empty"),
        ("route = \"elsewhere\"\noperators = [9]", "operator.route", "elsewhere"),
    ] {
        let e = problem(&with(body));
        assert_eq!(e.key, key, "{e}");
        assert!(e.problem.contains(says), "{says:?} not in: {e}");
    }
}

/// A setting in seconds is added to a clock somewhere: one near `u64::MAX` would overflow
/// it and crash the daemon (a room's speaker timeout at every start, kept in the ledger),
/// so each is refused past a year, naming the key.
#[test]
fn settings_in_seconds_are_refused_past_a_year() {
    let huge = "9223372036854775807";
    for (key, text) in [
        (
            "telegram.send_timeout_secs",
            MINIMAL.replace("[telegram]\n", &format!("[telegram]\nsend_timeout_secs = {huge}\n")),
        ),
        (
            "telegram.unauthorized_exit_secs",
            MINIMAL.replace("[telegram]\n", &format!("[telegram]\nunauthorized_exit_secs = {huge}\n")),
        ),
        ("outbound.typing_max_secs", format!("[outbound]\ntyping_max_secs = {huge}\n{MINIMAL}")),
        ("rooms.speaker_timeout_secs", format!("[rooms]\nspeaker_timeout_secs = {huge}\n{MINIMAL}")),
    ] {
        let e = problem(&text);
        assert!(e.key == key && e.problem.contains("at most"), "{key}: {e}");
    }
    let a_day = format!("[rooms]\nspeaker_timeout_secs = 86400\n{MINIMAL}");
    assert!(load_str(&a_day).is_ok());
}

/// A poll that does not wait would ask Telegram again at once, all the time; an empty log
/// filter would silence every line of the daemon's, errors included.
#[test]
fn a_poll_that_does_not_wait_and_an_empty_log_filter_are_refused() {
    let no_wait = MINIMAL.replace("[telegram]\n", "[telegram]\npoll_timeout_secs = 0\n");
    assert_eq!(problem(&no_wait).key, "telegram.poll_timeout_secs");
    let silent = format!("[log]\nfilter = \" \"\n{MINIMAL}");
    assert_eq!(problem(&silent).key, "log.filter");
}

/// Agents are told apart case-blind where a name is written (a handoff's target, a
/// mention), so `Worker` and `worker` would take each other's messages; an environment
/// override's key, lowercased, would quietly declare the second.
#[test]
fn agents_whose_names_differ_only_in_case_are_refused() {
    let text = MINIMAL.replace(
        "[agents.orchestrator]\ntoken_env = \"SB_TEST_ORCH\"\n",
        "[agents.orchestrator]\ntoken_env = \"SB_TEST_ORCH\"\n\n[agents.Worker]\ntoken_env = \"SB_W1\"\n\n[agents.worker]\ntoken_env = \"SB_W2\"\n",
    );
    let e = problem(&text);
    assert!(e.to_string().contains("Worker") && e.to_string().contains("worker"), "{e}");
    assert!(e.problem.contains("case"), "{e}");
}

#[test]
fn a_replica_is_named_after_its_host_and_pid_or_replica_when_the_host_has_no_name() {
    use super::validate::replica_name;
    assert_eq!(replica_name(Some("vm-7\n".into()), 42), "vm-7-42");
    assert_eq!(replica_name(Some(" ".into()), 42), "replica-42");
    assert_eq!(replica_name(None, 42), "replica-42");
}

#[test]
fn the_session_heartbeat_is_forty_seconds_unless_set() {
    let settings = load_str(MINIMAL).unwrap();
    assert_eq!(settings.api.session_heartbeat, Duration::from_secs(40));
    let settings = load_str(&with_api("session_heartbeat_secs = 5")).unwrap();
    assert_eq!(settings.api.session_heartbeat, Duration::from_secs(5));
    let e = problem(&with_api("session_heartbeat_secs = 0"));
    assert_eq!(e.key, "api.session_heartbeat_secs");
}

//! The daemon's local API refuses requests without the agent's own secret.

mod support;

use support::daemon::*;
use switchboard::agents::api::wire::{ApiError, ErrorCode};
use switchboard::fake_bot_api::FakeTelegram;

#[tokio::test]
async fn requests_without_the_agents_own_secret_are_refused() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let http = reqwest::Client::new();
    let url = |agent: &str, route: &str| format!("http://{}/v1/agents/{agent}/{route}", daemon.api_addr());

    let attempts = [
        ("orchestrator", None),
        ("orchestrator", Some("wrong-secret")),
        ("orchestrator", Some(WORKER_SECRET)),
        ("ghost", Some(ORCHESTRATOR_SECRET)),
    ];
    for (agent, secret) in attempts {
        for route in ["pending", "session"] {
            let mut request = http.get(url(agent, route));
            if let Some(secret) = secret {
                request = request.bearer_auth(secret);
            }
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 401, "{agent} with {secret:?} on {route}");
            let error: ApiError = response.json().await.unwrap();
            assert_eq!(error.code, ErrorCode::Unauthorized);
        }
        let response =
            http.post(url(agent, "reply")).json(&serde_json::json!({"text": "hi"})).send().await.unwrap();
        assert_eq!(response.status(), 401);
    }

    // The right secret without the live session's token is not enough: tool calls are
    // bound to the session that reads the agent's stream.
    let unbound =
        http.get(url("orchestrator", "pending")).bearer_auth(ORCHESTRATOR_SECRET).send().await.unwrap();
    assert_eq!(unbound.status(), 409);
    assert_eq!(unbound.json::<ApiError>().await.unwrap().code, ErrorCode::SessionConflict);
    let bad_body = http
        .post(url("orchestrator", "reply"))
        .bearer_auth(ORCHESTRATOR_SECRET)
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(bad_body.status(), 400);
    assert_eq!(bad_body.json::<ApiError>().await.unwrap().code, ErrorCode::BadRequest);

    // A body far over the limit is read to its end and refused in the API's shape, so the
    // client, still writing it, reads the refusal rather than a reset connection.
    let huge = serde_json::json!({"text": "x".repeat(12 * 1024 * 1024), "request_id": "req_huge"});
    let oversized = http
        .post(url("orchestrator", "reply"))
        .bearer_auth(ORCHESTRATOR_SECRET)
        .json(&huge)
        .send()
        .await
        .expect("the refusal is read, not a broken connection");
    assert_eq!(oversized.status(), 400);
    assert_eq!(oversized.json::<ApiError>().await.unwrap().code, ErrorCode::BadRequest);
    assert!(fake.sent_messages().is_empty());
}

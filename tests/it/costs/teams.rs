//! Teams through the key API: an administrator puts owners in a team and sets its budget; a
//! member reads it, a non-member gets 404; the budget covers its members' calls from the
//! moment they join, and no longer once they leave.

use std::time::{Duration, Instant};

use serde_json::json;

use super::price_table;
use crate::budgets::{admin, admin_port, stream_chat, Fixture, Setup};

#[tokio::test(flavor = "multi_thread")]
async fn an_administrator_makes_a_team_and_its_budget_covers_its_members_only() {
    let fx = Fixture::start().await;
    let (_dir, prices) =
        price_table("[[price]]\nmodel = \"m\"\nfrom = \"2000-01-01\"\ninput = 1\noutput = 1\n");
    let pricing = format!("file = \"{}\"", prices.display());
    let port = admin_port();
    let gw = fx.gateway(&Setup {
        admin_port: Some(port),
        pricing: &pricing,
        ..Setup::default()
    });
    let root = fx.token("root", "chat plain portcullis:admin");
    let (dana, erin) = (
        fx.token("dana", "chat plain"),
        fx.token("erin", "chat plain"),
    );
    // Only an administrator sets teams and team budgets.
    let (status, _) = admin(
        port,
        &dana,
        "PUT",
        "/v1/owners/dana/team",
        Some(json!({"team": "x"})),
    );
    assert_eq!(status, 403);
    let (status, body) = admin(
        port,
        &root,
        "PUT",
        "/v1/owners/dana/team",
        Some(json!({"team": "red"})),
    );
    assert_eq!(
        (status, body),
        (200, json!({"owner": "dana", "team": "red"}))
    );
    let budget = json!({"budget": {"requests_per_day": 1, "cost_per_day": 2.5}});
    let (status, _) = admin(
        port,
        &dana,
        "PUT",
        "/v1/teams/red/budget",
        Some(budget.clone()),
    );
    assert_eq!(status, 403);
    let (status, body) = admin(port, &root, "PUT", "/v1/teams/red/budget", Some(budget));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["budget"],
        json!({"requests_per_day": 1, "cost_per_day": 2.5})
    );
    // A member reads its team's budget; a non-member learns nothing.
    let (status, body) = admin(port, &dana, "GET", "/v1/teams/red/budget", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["used"]["cost_per_day"], 0, "{body}");
    let (status, body) = admin(port, &erin, "GET", "/v1/teams/red/budget", None);
    assert_eq!((status, body["error"].as_str()), (404, Some("not_found")));
    let (status, body) = admin(port, &dana, "GET", "/v1/owners/dana/team", None);
    assert_eq!((status, body["team"].as_str()), (200, Some("red")));
    // Bad bodies are 400s naming what is wrong.
    let (status, body) = admin(
        port,
        &root,
        "PUT",
        "/v1/owners/dana/team",
        Some(json!({"team": 5})),
    );
    assert_eq!(status, 400, "{body}");
    let (status, body) = admin(
        port,
        &root,
        "PUT",
        "/v1/owners/dana/team",
        Some(json!({"team": ""})),
    );
    assert_eq!(status, 400, "{body}");
    // A team's usage is for administrators.
    let (status, _) = admin(port, &dana, "GET", "/v1/usage?team=red", None);
    assert_eq!(status, 403);
    // The team's one request a day: dana's first call passes, its second is refused naming
    // the team; erin (no team) is not limited.
    let within = |token: &str, want: u16| {
        let start = Instant::now();
        loop {
            let (status, _, body) =
                tokio::task::block_in_place(|| stream_chat(gw.port, token, Some(9)));
            if status == want {
                return body;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{status}: {}",
                String::from_utf8_lossy(&body)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    within(&dana, 200);
    let refused = within(&dana, 429);
    let refused: serde_json::Value = serde_json::from_slice(&refused).unwrap();
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains("team \"red\"") && message.contains("requests_per_day"),
        "{message}"
    );
    within(&erin, 200);
    within(&erin, 200);
    // Out of the team, dana is no longer held by its budget.
    let (status, body) = admin(
        port,
        &root,
        "PUT",
        "/v1/owners/dana/team",
        Some(json!({"team": null})),
    );
    assert_eq!(
        (status, body["team"].clone()),
        (200, serde_json::Value::Null)
    );
    within(&dana, 200);
}

//! What owners and administrators may do: create, list, use and revoke; no escalation; the
//! admin scope, and `admin_subjects` narrowing who it makes an administrator.

use serde_json::{json, Value};
use testkit::cli;

use super::{ids, Admin};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_creates_lists_uses_and_revokes_a_key() {
    let a = Admin::start("").await;
    let alice = a.token("alice", "infer chatx");

    let (status, made) = a.create(
        &alice,
        json!({"name": "ci-bot", "scopes": ["infer"], "expires_in": "90d"}),
    );
    assert_eq!(status, 201, "{made}");
    let key = made["key"].as_str().unwrap().to_string();
    let id = made["id"].as_str().unwrap().to_string();
    assert_eq!(key.split('.').next().unwrap(), format!("ak_{id}"));
    assert_eq!(made["owner"], "alice");
    assert_eq!(made["name"], "ci-bot");
    assert_eq!(made["scopes"], json!(["infer"]));
    let created = made["created"].as_str().unwrap();
    assert!(created.ends_with('Z') && created.len() == 20, "{created}");
    assert!(made["expires"].as_str().unwrap() > created);

    // The key works on the data plane at once, with its scopes only.
    assert_eq!(a.use_key(&key), 200);

    let (status, list) = a.list(&alice, "");
    assert_eq!(status, 200);
    assert_eq!(ids(&list), std::slice::from_ref(&id));
    let listed = &list["keys"][0];
    assert_eq!(listed["revoked"], Value::Null);
    assert_eq!(listed["owner"], "alice");
    let secret = key.split('.').nth(1).unwrap();
    assert!(
        !list.to_string().contains(secret),
        "a listing shows the secret"
    );
    assert!(listed.get("key").is_none());

    // Revoked through the API: this gateway drops it from its cache at once.
    assert_eq!(a.revoke(&alice, &id), 204);
    assert_eq!(a.use_key(&key), 401);
    assert_eq!(a.revoke(&alice, &id), 204, "revoking twice is not an error");
    let (_, list) = a.list(&alice, "");
    assert!(list["keys"][0]["revoked"].as_str().is_some());

    // The CLI sees the owner; the metrics count one of each event; the log names the key.
    let out = cli(&a.gw.config, &["keys", "list"]);
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(
        listing.contains("OWNER") && listing.contains("alice"),
        "{listing}"
    );
    let metrics = a.gw.metrics();
    assert!(
        metrics.contains("portcullis_key_events_total{event=\"created\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("portcullis_key_events_total{event=\"revoked\"} 1"),
        "{metrics}"
    );
    let log = a.access_log();
    let events: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["key_event"].is_string())
        .collect();
    assert_eq!(events.len(), 2, "{log}");
    assert_eq!(events[0]["key_event"], "created");
    assert_eq!(events[1]["key_event"], "revoked");
    for e in &events {
        assert_eq!(e["key_id"], id.as_str());
        assert_eq!(e["principal_id"], "alice");
        assert_eq!(e["service"], "_admin");
    }
    assert!(!log.contains(secret), "the access log shows a secret");
    // The CLI's create and revoke go to the same file.
    let (cli_key, cli_id) = a.gw.create_key("infer", &["--owner", "alice"]);
    a.gw.revoke(&cli_id);
    let log = a.access_log();
    let cli_events: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["service"] == "_cli")
        .collect();
    assert_eq!(cli_events.len(), 2, "{log}");
    assert_eq!(cli_events[0]["key_event"], "created");
    assert_eq!(cli_events[1]["key_event"], "revoked");
    assert_eq!(cli_events[1]["key_id"], cli_id.as_str());
    assert!(!log.contains(cli_key.split('.').nth(1).unwrap()));
    assert!(
        !a.gw.log().contains(secret),
        "the gateway log shows a secret"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_see_only_their_keys_and_cannot_escalate_while_an_admin_manages_all() {
    let a = Admin::start("").await;
    let alice = a.token("alice", "infer");
    let bob = a.token("bob", "infer chatx");
    let admin = a.token("root", "portcullis:admin");

    let (status, err) = a.create(&alice, json!({"name": "x", "scopes": ["chatx"]}));
    assert_eq!(status, 403, "{err}");
    assert_eq!(err["error"], "forbidden");
    assert!(err["message"].as_str().unwrap().contains("chatx"));

    let (_, alices) = a.create(&alice, json!({"name": "a", "scopes": ["infer"]}));
    let (_, bobs) = a.create(&bob, json!({"name": "b", "scopes": ["infer", "chatx"]}));
    let alice_id = alices["id"].as_str().unwrap();
    let bob_id = bobs["id"].as_str().unwrap();

    assert_eq!(ids(&a.list(&bob, "").1), [bob_id]);
    assert_eq!(a.list(&bob, "?owner=alice").0, 403);
    assert_eq!(ids(&a.list(&bob, "?owner=bob").1), [bob_id]);
    // Another owner's key is not found, and stays usable.
    assert_eq!(a.revoke(&bob, alice_id), 404);
    assert_eq!(a.use_key(alices["key"].as_str().unwrap()), 200);
    assert_eq!(a.revoke(&bob, "0123456789abcdef"), 404);
    assert_eq!(a.revoke(&bob, "not-a-key-id"), 404);

    // The admin scope sees everything, filters by owner, revokes anyone's key, and may grant
    // scopes it does not hold itself.
    let (status, all) = a.list(&admin, "");
    assert_eq!(status, 200);
    let mut all = ids(&all);
    all.sort();
    let mut both = vec![alice_id.to_string(), bob_id.to_string()];
    both.sort();
    assert_eq!(all, both);
    assert_eq!(ids(&a.list(&admin, "?owner=alice").1), [alice_id]);
    assert_eq!(
        ids(&a.list(&admin, "?owner=nobody").1),
        Vec::<String>::new()
    );
    assert_eq!(a.revoke(&admin, alice_id), 204);
    assert_eq!(a.use_key(alices["key"].as_str().unwrap()), 401);
    let (status, made) = a.create(&admin, json!({"name": "ops", "scopes": ["chatx"]}));
    assert_eq!(status, 201);
    assert_eq!(made["owner"], "root");
}

/// An issuer that grants any scope asked for hands `admin_scope` to anyone who asks: with
/// `admin_subjects`, the scope makes an administrator only of a listed `sub`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_admin_subjects_only_a_listed_sub_holding_the_admin_scope_is_an_administrator() {
    let a = Admin::start("admin_subjects = [\"root\"]").await;
    let alice = a.token("alice", "infer");
    let mallory = a.token("mallory", "infer portcullis:admin");
    let root_without_scope = a.token("root", "infer");
    let root = a.token("root", "portcullis:admin");
    let (status, alices) = a.create(&alice, json!({"name": "a", "scopes": ["infer"]}));
    assert_eq!(status, 201, "{alices}");
    let alice_id = alices["id"].as_str().unwrap();

    // Mallory holds the admin scope but is not listed: a user like any other.
    let (status, list) = a.list(&mallory, "");
    assert_eq!((status, ids(&list)), (200, Vec::<String>::new()));
    assert_eq!(a.list(&mallory, "?owner=alice").0, 403);
    assert_eq!(a.revoke(&mallory, alice_id), 404);
    assert_eq!(a.use_key(alices["key"].as_str().unwrap()), 200);
    let (status, err) = a.create(&mallory, json!({"name": "m", "scopes": ["chatx"]}));
    assert_eq!((status, &err["error"]), (403, &json!("forbidden")), "{err}");
    // Listed, but without the scope: not an administrator either.
    assert_eq!(a.list(&root_without_scope, "?owner=alice").0, 403);

    // Listed and holding the scope.
    assert_eq!(ids(&a.list(&root, "?owner=alice").1), [alice_id]);
    assert_eq!(a.revoke(&root, alice_id), 204);
    assert_eq!(a.use_key(alices["key"].as_str().unwrap()), 401);
}

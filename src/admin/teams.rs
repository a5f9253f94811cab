//! Teams on the key API: `PUT /v1/owners/{sub}/team` puts an owner in a team or takes it out
//! (administrators; `GET` tells an owner its own team), and `GET`/`PUT
//! /v1/teams/{team}/budget` read (a member or an administrator) and set (an administrator) the
//! budget that covers all the team's owners' keys and JWT calls. A non-member reading a team's
//! budget learns nothing, not even that the team exists: 404.

use serde_json::{json, Value};

use super::budgets::{budget_body, owner_in_path, subject_json};
use super::reply::{store_failed, Reply};
use super::KeyEvent;
use crate::auth::Principal;
use crate::store::{Budget, Store, Subject, WindowStarts};
use crate::time::unix_now;

/// The longest team name, in characters.
const MAX_TEAM: usize = 128;

/// A team name from a path or a body: non-empty printable text, at most `MAX_TEAM` characters.
fn team_name(name: &str) -> Result<&str, String> {
    let printable = !name.is_empty() && !name.chars().any(char::is_control);
    if !printable || name.chars().count() > MAX_TEAM {
        return Err(format!(
            "a team must be non-empty printable text of at most {MAX_TEAM} characters"
        ));
    }
    Ok(name)
}

/// `GET /v1/owners/{sub}/team`: the caller's own team, or anyone's for an administrator.
pub(crate) async fn get_member(
    store: &dyn Store,
    caller: &Principal,
    is_admin: bool,
    raw_owner: &str,
) -> Reply {
    let owner = match owner_in_path(raw_owner) {
        Ok(owner) => owner,
        Err(message) => return Reply::error(400, "bad_request", Some(message)),
    };
    if !is_admin && owner != *caller.id {
        let message = "only an administrator may read another owner's team";
        return Reply::error(403, "forbidden", Some(message));
    }
    match store.owner_team(&owner).await {
        Ok(team) => member_reply(&owner, team.as_deref()),
        Err(e) => store_failed("read an owner's team", &e),
    }
}

/// `PUT /v1/owners/{sub}/team` with `{"team": "…" | null}`: administrators only.
pub(crate) async fn put_member(
    store: &dyn Store,
    is_admin: bool,
    raw_owner: &str,
    body: &[u8],
) -> (Reply, Option<KeyEvent>) {
    let owner = match owner_in_path(raw_owner) {
        Ok(owner) => owner,
        Err(message) => return (Reply::error(400, "bad_request", Some(message)), None),
    };
    if !is_admin {
        let message = "only an administrator may put an owner in a team";
        return (Reply::error(403, "forbidden", Some(message)), None);
    }
    let team = match team_body(body) {
        Ok(team) => team,
        Err(message) => return (Reply::error(400, "bad_request", Some(&message)), None),
    };
    if let Err(e) = store.set_owner_team(&owner, team.as_deref()).await {
        return (store_failed("set an owner's team", &e), None);
    }
    let event = KeyEvent {
        event: "team",
        key_id: None,
        budget_owner: None,
        team: Some(team.clone()),
        member: Some(owner.clone()),
        budget: None,
    };
    (member_reply(&owner, team.as_deref()), Some(event))
}

fn member_reply(owner: &str, team: Option<&str>) -> Reply {
    let body = json!({"owner": owner, "team": team});
    Reply::json(200, serde_json::to_vec(&body).unwrap_or_default())
}

/// The body of a `PUT /v1/owners/{sub}/team`: exactly `{"team": "…" | null}`.
fn team_body(body: &[u8]) -> Result<Option<String>, String> {
    const SHAPE: &str = "the body must be a JSON object: {\"team\": \"…\" or null}";
    let Ok(Value::Object(mut fields)) = serde_json::from_slice::<Value>(body) else {
        return Err(SHAPE.into());
    };
    if let Some(other) = fields.keys().find(|k| *k != "team") {
        let shown: String = other.chars().take(64).collect();
        return Err(format!("unknown field {shown:?}: only team is accepted"));
    }
    match fields.remove("team") {
        Some(Value::Null) => Ok(None),
        Some(Value::String(team)) => Ok(Some(team_name(&team)?.to_owned())),
        _ => Err(SHAPE.into()),
    }
}

/// `GET /v1/teams/{team}/budget`: a member's own team, or any team for an administrator.
pub(crate) async fn get_budget(
    store: &dyn Store,
    caller: &Principal,
    is_admin: bool,
    raw_team: &str,
) -> Reply {
    let team = match decoded_team(raw_team) {
        Ok(team) => team,
        Err(message) => return Reply::error(400, "bad_request", Some(&message)),
    };
    if !is_admin {
        match store.owner_team(&caller.id).await {
            Ok(own) if own.as_deref() == Some(&team) => {}
            Ok(_) => return Reply::error(404, "not_found", None),
            Err(e) => return store_failed("read an owner's team", &e),
        }
    }
    let budget = match store.team_budget(&team).await {
        Ok(budget) => budget.unwrap_or_default(),
        Err(e) => return store_failed("read a team's budget", &e),
    };
    budget_reply(store, &team, &budget).await
}

/// `PUT /v1/teams/{team}/budget` with `{"budget": {…} | null}`: administrators only.
pub(crate) async fn put_budget(
    store: &dyn Store,
    is_admin: bool,
    raw_team: &str,
    body: &[u8],
) -> (Reply, Option<KeyEvent>) {
    let team = match decoded_team(raw_team) {
        Ok(team) => team,
        Err(message) => return (Reply::error(400, "bad_request", Some(&message)), None),
    };
    if !is_admin {
        let message = "only an administrator may set a team's budget";
        return (Reply::error(403, "forbidden", Some(message)), None);
    }
    let budget = match budget_body(body) {
        Ok(budget) => budget,
        Err(message) => return (Reply::error(400, "bad_request", Some(&message)), None),
    };
    if let Err(e) = store.set_team_budget(&team, &budget).await {
        return (store_failed("set a team's budget", &e), None);
    }
    let event = KeyEvent {
        event: "budget",
        key_id: None,
        budget_owner: None,
        team: Some(Some(team.clone())),
        member: None,
        budget: Some((!budget.is_empty()).then_some(budget)),
    };
    (budget_reply(store, &team, &budget).await, Some(event))
}

/// The `{team}` of a path, percent-decoded and checked as a team name.
fn decoded_team(raw: &str) -> Result<String, String> {
    let team = owner_in_path(raw).map_err(|_| {
        "the team in the path must be non-empty printable text, percent-encoded".to_string()
    })?;
    team_name(&team)?;
    Ok(team)
}

async fn budget_reply(store: &dyn Store, team: &str, budget: &Budget) -> Reply {
    let starts = WindowStarts::at(unix_now());
    let used = match store
        .window_usage(&Subject::Team(team.to_string()), starts)
        .await
    {
        Ok(used) => used,
        Err(e) => return store_failed("read a team's usage", &e),
    };
    let body = subject_json(budget, &used, starts);
    Reply::json(200, serde_json::to_vec(&body).unwrap_or_default())
}

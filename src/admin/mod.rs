//! The key-management API for the console, on its own listener (`[admin]`), and the reference
//! console page. One request, top to bottom: route → CORS preflight → authenticate (JWTs only)
//! → rate limit per `sub` → the key operation, budget (`budgets`), team (`teams`) or usage
//! report (`usage`) →
//! CORS and common headers → record (access log, metrics). `retention` deletes keys revoked
//! long ago, in the background.

mod budgets;
mod console;
mod cors;
mod keys;
mod paging;
mod reply;
mod retention;
mod teams;
mod usage;

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use http::Method;
use pingora::apps::{HttpPersistentSettings, HttpServerApp, ReusedHttpStream};
use pingora::protocols::http::ServerSession;
use pingora::server::ShutdownWatch;

use crate::auth::api_keys::KeyEvictor;
use crate::auth::jwt::JwtVerifier;
use crate::auth::token::{self, Bearer, ShapeError};
use crate::auth::{AuthFailure, Principal};
use crate::config::{AdminSettings, Config};
use crate::limits::rate::Limiter;
use crate::observe::access_log::AccessLog;
use crate::observe::metrics::Metrics;
use crate::proxy::RequestId;
use crate::store::{Budget, Store};
use pingora::http::ResponseHeader;
use reply::Reply;
pub(crate) use retention::Retention;

/// The metrics and access-log label of every admin request.
const SERVICE_LABEL: &str = "_admin";

/// Served at `GET /openapi.json`: the API of docs/console-and-key-api.md, for clients and the
/// schema tests.
const OPENAPI: &str = include_str!("openapi.json");

pub(crate) struct AdminApp {
    settings: AdminSettings,
    jwt: Arc<JwtVerifier>,
    store: Arc<dyn Store>,
    /// Drops a key revoked here from this gateway's cache at once (other gateways learn of it
    /// through the revocation push, or within `cache_ttl_seconds`).
    evictor: KeyEvictor,
    metrics: Arc<Metrics>,
    access_log: AccessLog,
    console: Option<console::Console>,
    /// `requests_per_minute` per `sub`: creates and revokes write to the store, and even
    /// listings read it, so one signed-in user cannot keep it busy for everyone.
    limiter: Limiter,
}

/// What the key API needs from the rest of the gateway.
pub(crate) struct AdminDeps {
    pub jwt: Arc<JwtVerifier>,
    pub store: Arc<dyn Store>,
    pub evictor: KeyEvictor,
    pub metrics: Arc<Metrics>,
    pub access_log: AccessLog,
}

/// The route a request names: known before authentication, so 404 and 405 need no token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route<'a> {
    OpenApi,
    Console(console::Asset),
    /// `/console` without the slash: redirected, so relative URLs in the page resolve.
    ConsoleRoot,
    Keys,
    Key(&'a str),
    /// `/v1/owners/{sub}/budget`, the `sub` as sent (percent-encoded).
    OwnerBudget(&'a str),
    /// `/v1/owners/{sub}/team`, the `sub` as sent.
    OwnerTeam(&'a str),
    /// `/v1/teams/{team}/budget`, the team as sent.
    TeamBudget(&'a str),
    Usage,
    NotFound,
}

/// What the request did to a key or a budget, for the access log and
/// `portcullis_key_events_total`.
pub(crate) struct KeyEvent {
    /// `created`, `revoked`, `budget` or `team`.
    pub event: &'static str,
    /// The key concerned; none for an owner's or a team's budget.
    pub key_id: Option<String>,
    /// The owner whose budget changed.
    pub budget_owner: Option<String>,
    /// The team whose budget changed, or the team an owner was put in (`Some(None)`: none).
    pub team: Option<Option<String>>,
    /// The owner put in a team or taken out.
    pub member: Option<String>,
    /// On a budget change and a create with a budget: the budget now set (`Some(None)`: none).
    pub budget: Option<Option<Budget>>,
}

impl KeyEvent {
    fn key(event: &'static str, key_id: String) -> KeyEvent {
        KeyEvent {
            event,
            key_id: Some(key_id),
            budget_owner: None,
            team: None,
            member: None,
            budget: None,
        }
    }
}

impl AdminApp {
    pub(crate) fn new(settings: AdminSettings, config: &Config, deps: AdminDeps) -> AdminApp {
        let console = settings
            .console
            .then(|| console::Console::new(&settings, config));
        let limiter = Limiter::per_minute(settings.requests_per_minute);
        AdminApp {
            limiter,
            settings,
            jwt: deps.jwt,
            store: deps.store,
            evictor: deps.evictor,
            metrics: deps.metrics,
            access_log: deps.access_log,
            console,
        }
    }

    fn route<'a>(&self, path: &'a str) -> Route<'a> {
        match path {
            "/openapi.json" => Route::OpenApi,
            "/v1/keys" => Route::Keys,
            "/v1/usage" => Route::Usage,
            _ => {
                if let Some(id) = path.strip_prefix("/v1/keys/") {
                    return Route::Key(id);
                }
                // `{prefix}{id}{suffix}` with one segment for the id.
                let one = |prefix: &str, suffix: &str| {
                    (path.strip_prefix(prefix))
                        .and_then(|rest| rest.strip_suffix(suffix))
                        .filter(|id| !id.contains('/'))
                };
                if let Some(owner) = one("/v1/owners/", "/budget") {
                    return Route::OwnerBudget(owner);
                }
                if let Some(owner) = one("/v1/owners/", "/team") {
                    return Route::OwnerTeam(owner);
                }
                if let Some(team) = one("/v1/teams/", "/budget") {
                    return Route::TeamBudget(team);
                }
                match (&self.console, path) {
                    (Some(_), "/console") => Route::ConsoleRoot,
                    (Some(_), _) => {
                        console::Asset::at(path).map_or(Route::NotFound, Route::Console)
                    }
                    (None, _) => Route::NotFound,
                }
            }
        }
    }

    /// The methods a route answers, as sent in `Allow` and a CORS preflight.
    fn allowed(route: Route<'_>) -> &'static str {
        match route {
            Route::Keys => "GET, POST, OPTIONS",
            Route::Key(_) => "DELETE, PATCH, OPTIONS",
            Route::OwnerBudget(_) | Route::OwnerTeam(_) | Route::TeamBudget(_) => {
                "GET, PUT, OPTIONS"
            }
            Route::Usage => "GET, OPTIONS",
            _ => "GET, HEAD",
        }
    }

    async fn handle(
        &self,
        session: &mut ServerSession,
        principal: &mut Option<Arc<Principal>>,
        auth_failure: &mut Option<AuthFailure>,
        event: &mut Option<KeyEvent>,
    ) -> Reply {
        let path = session.req_header().uri.path().to_owned();
        let method = session.req_header().method.clone();
        let route = self.route(&path);
        let head = method == Method::HEAD;
        match route {
            Route::NotFound => return Reply::error(404, "not_found", None),
            Route::OpenApi if method == Method::GET || head => {
                return Reply::static_body(200, "application/json", OPENAPI.as_bytes());
            }
            Route::ConsoleRoot if method == Method::GET || head => {
                return Reply::redirect("/console/");
            }
            Route::Console(asset) if method == Method::GET || head => {
                return self.console.as_ref().expect("routed").serve(asset);
            }
            Route::OpenApi | Route::ConsoleRoot | Route::Console(_) => {
                return Reply::method_not_allowed(Self::allowed(route));
            }
            Route::Keys
            | Route::Key(_)
            | Route::OwnerBudget(_)
            | Route::OwnerTeam(_)
            | Route::TeamBudget(_)
            | Route::Usage => {}
        }
        if method == Method::OPTIONS {
            return cors::preflight(
                &self.settings.allowed_origins,
                session.req_header(),
                Self::allowed(route),
            );
        }
        let allowed = match route {
            Route::Keys => method == Method::GET || method == Method::POST,
            Route::Usage => method == Method::GET,
            Route::OwnerBudget(_) | Route::OwnerTeam(_) | Route::TeamBudget(_) => {
                method == Method::GET || method == Method::PUT
            }
            _ => method == Method::DELETE || method == Method::PATCH,
        };
        if !allowed {
            return Reply::method_not_allowed(Self::allowed(route));
        }
        let caller = match self.authenticate(session).await {
            Ok(p) => p,
            Err(Refusal::Unauthorized(why)) => {
                *auth_failure = Some(why);
                return Reply::unauthorized();
            }
            Err(Refusal::ApiKey) => {
                return Reply::error(
                    403,
                    "forbidden",
                    Some("API keys cannot manage keys: use a login token from the console"),
                );
            }
        };
        *principal = Some(caller.clone());
        if let Err(retry_after) = self.limiter.check(&caller) {
            return Reply::rate_limited(retry_after);
        }
        let is_admin = self.is_admin(&caller);
        if route == Route::Usage {
            let query = session.req_header().uri.query();
            return usage::report(&*self.store, &caller, is_admin, query).await;
        }
        let ops = keys::Ops {
            store: &*self.store,
            evictor: &self.evictor,
            caller: &caller,
            is_admin,
            max_keys_per_owner: self.settings.max_keys_per_owner,
        };
        let (reply, happened) = match route {
            Route::Keys if method == Method::POST => match reply::read_body(session).await {
                Ok(body) => ops.create(&body).await,
                Err(reply) => (reply, None),
            },
            Route::Keys => (ops.list(session.req_header().uri.query()).await, None),
            Route::Key(id) if method == Method::PATCH => match reply::read_body(session).await {
                Ok(body) => ops.set_budget(id, &body).await,
                Err(reply) => (reply, None),
            },
            Route::Key(id) => ops.revoke(id).await,
            Route::OwnerBudget(owner) if method == Method::PUT => {
                match reply::read_body(session).await {
                    Ok(body) => budgets::put_owner(&*self.store, is_admin, owner, &body).await,
                    Err(reply) => (reply, None),
                }
            }
            Route::OwnerBudget(owner) => (
                budgets::get_owner(&*self.store, &caller, is_admin, owner).await,
                None,
            ),
            Route::OwnerTeam(owner) if method == Method::PUT => {
                match reply::read_body(session).await {
                    Ok(body) => teams::put_member(&*self.store, is_admin, owner, &body).await,
                    Err(reply) => (reply, None),
                }
            }
            Route::OwnerTeam(owner) => (
                teams::get_member(&*self.store, &caller, is_admin, owner).await,
                None,
            ),
            Route::TeamBudget(team) if method == Method::PUT => {
                match reply::read_body(session).await {
                    Ok(body) => teams::put_budget(&*self.store, is_admin, team, &body).await,
                    Err(reply) => (reply, None),
                }
            }
            Route::TeamBudget(team) => (
                teams::get_budget(&*self.store, &caller, is_admin, team).await,
                None,
            ),
            _ => unreachable!("other routes answered above"),
        };
        if let Some(e) = &happened {
            self.metrics.key_event(e.event);
        }
        *event = happened;
        reply
    }

    /// `admin_scope`, and a `sub` of `admin_subjects` when that is set: an issuer that grants
    /// whatever scope is asked for then cannot make every user an administrator.
    fn is_admin(&self, caller: &Principal) -> bool {
        caller.has_scope(&self.settings.admin_scope)
            && (self.settings.admin_subjects.as_ref())
                .is_none_or(|subjects| subjects.iter().any(|s| **s == *caller.id))
    }

    /// JWTs only, verified exactly as on the data plane; an API key is refused outright, so
    /// a leaked key can never mint more keys.
    async fn authenticate(&self, session: &ServerSession) -> Result<Arc<Principal>, Refusal> {
        match token::bearer(&session.req_header().headers) {
            Err(ShapeError::Missing) => Err(Refusal::Unauthorized(AuthFailure::Missing)),
            Err(ShapeError::Malformed) => Err(Refusal::Unauthorized(AuthFailure::Malformed)),
            Ok(Bearer::ApiKey { .. }) => Err(Refusal::ApiKey),
            Ok(Bearer::Jwt(jwt)) => self
                .jwt
                .verify(jwt)
                .await
                .ok_or(Refusal::Unauthorized(AuthFailure::Jwt)),
        }
    }
}

enum Refusal {
    Unauthorized(AuthFailure),
    ApiKey,
}

/// Pingora's `ServeHttp` would do, but it writes header names in its own case: this writes
/// the head as the data plane does, so the 401s of both are the same bytes.
#[async_trait]
impl HttpServerApp for AdminApp {
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        match session.read_request().await {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => {
                log::debug!("admin: cannot read a request: {e}");
                return None;
            }
        }
        session.set_keepalive((!*shutdown.borrow()).then_some(60));
        let (head, body) = self.respond(&mut session).await?;
        let has_body = !body.is_empty();
        if let Err(e) = session.write_response_header(Box::new(head)).await {
            log::debug!("admin: cannot answer: {e}");
            return None;
        }
        if has_body {
            if let Err(e) = session.write_response_body(Bytes::from(body), true).await {
                log::debug!("admin: cannot answer: {e}");
                return None;
            }
        }
        let persistent = HttpPersistentSettings::for_session(&session);
        match session.finish().await {
            Ok(stream) => stream.map(|s| ReusedHttpStream::from_reusable_stream(s, persistent)),
            Err(e) => {
                log::debug!("admin: cannot finish a response: {e}");
                None
            }
        }
    }
}

impl AdminApp {
    /// One request: its answer, recorded in the metrics and the access log.
    async fn respond(&self, session: &mut ServerSession) -> Option<(ResponseHeader, Vec<u8>)> {
        let start = Instant::now();
        let request_id = RequestId::from_client_or_new(
            session
                .req_header()
                .headers
                .get("x-request-id")
                .map(|v| v.as_bytes()),
        );
        let (mut principal, mut auth_failure, mut event) = (None, None, None);
        let reply = self
            .handle(session, &mut principal, &mut auth_failure, &mut event)
            .await;
        // Like the data plane: every 401 closes (all alike, and guessing costs a connection),
        // and a body left unread (too large, cut short) must not be read as a request.
        if reply.close || auth_failure.is_some() {
            session.set_keepalive(None);
        }
        let origin = cors::allowed_origin(&self.settings.allowed_origins, session.req_header());
        let head = session.req_header().method == Method::HEAD;
        let parts = reply.into_parts(request_id.as_str(), origin, head);
        let status = parts.as_ref().map_or(500, |(h, _)| h.status.as_u16());
        self.metrics.record(
            SERVICE_LABEL,
            &session.req_header().method,
            status,
            start.elapsed(),
            None,
            auth_failure,
        );
        if self.access_log.enabled() {
            let line = reply::log_line(
                session,
                request_id.as_str(),
                status,
                start,
                principal.as_deref(),
                auth_failure,
                event.as_ref(),
            );
            // Promptly: a key event is looked for as soon as its answer is in.
            if !self.access_log.log_promptly(&line) {
                self.metrics.access_log_dropped();
            }
        }
        parts
            .map_err(|e| log::error!("admin: cannot build a response: {e}"))
            .ok()
    }
}

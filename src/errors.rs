//! The one place that maps every response the gateway writes itself to a status and a JSON body.

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;

/// Every response the gateway answers on its own, never one relayed from an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatewayError {
    BadRequest(Malformed),
    /// A chat or embeddings body refused by validation; the message naming the field is
    /// given to `respond_with_message`.
    InvalidBody,
    Unauthorized,
    Forbidden,
    /// A caller with a token budget called an endpoint the gateway does not meter (or a
    /// Responses request in the background); the message names the path.
    EndpointNotMetered,
    /// `[pricing] unpriced = "refuse"`: a caller with a cost budget named a model no price
    /// applies to; the message names the model.
    ModelUnpriced,
    NotFound,
    MethodNotAllowed,
    /// A body the gateway reads whole did not arrive within `buffered_body_timeout_seconds`.
    RequestTimeout,
    PayloadTooLarge,
    /// Over a service's rate limit; the seconds until the window ends go in `Retry-After`.
    RateLimited(u64),
    /// The key's or its owner's budget has no room for the request; the seconds until the
    /// window ends go in `Retry-After`, the window's name in the message.
    BudgetExceeded(u64),
    /// The caller has a budget but its counters could not be seeded from the ledger yet (the
    /// key store did not answer at start-up): nothing is decided on unseeded counters.
    BudgetUnavailable,
    BadGateway,
    /// The memory for bodies read whole (`buffered_bodies_max_bytes`) is taken; with
    /// `Retry-After`.
    Overloaded,
    GatewayTimeout,
    Internal,
}

/// Why a request is malformed; told to the client, since it is the client's own input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    DotSegment,
    EmptySegment,
    EncodedSeparator,
    Backslash,
    ControlCharacter,
    ContentLength,
    HeadersTooLarge,
    Framing,
}

/// The allowed methods, as sent in `Allow` with a 405.
pub(crate) const ALLOWED_METHODS: &str = "GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS";

/// `Retry-After` of a 503 overloaded: held bodies finish or time out within seconds.
const OVERLOADED_RETRY_AFTER: u64 = 1;

impl GatewayError {
    pub fn status(self) -> u16 {
        match self {
            GatewayError::BadRequest(_) | GatewayError::InvalidBody => 400,
            GatewayError::Unauthorized => 401,
            GatewayError::Forbidden
            | GatewayError::EndpointNotMetered
            | GatewayError::ModelUnpriced => 403,
            GatewayError::NotFound => 404,
            GatewayError::MethodNotAllowed => 405,
            GatewayError::RequestTimeout => 408,
            GatewayError::PayloadTooLarge => 413,
            GatewayError::RateLimited(_) | GatewayError::BudgetExceeded(_) => 429,
            GatewayError::BadGateway => 502,
            GatewayError::Overloaded | GatewayError::BudgetUnavailable => 503,
            GatewayError::GatewayTimeout => 504,
            GatewayError::Internal => 500,
        }
    }

    /// The JSON body. Built from static parts so an error costs no formatting;
    /// the 401 body is fixed byte for byte (docs/reference.md).
    pub fn body(self) -> Bytes {
        Bytes::from_static(match self {
            GatewayError::BadRequest(Malformed::DotSegment) => {
                br#"{"error":"bad_request","message":"path contains a dot segment"}"#
            }
            GatewayError::BadRequest(Malformed::EmptySegment) => {
                br#"{"error":"bad_request","message":"path contains an empty segment"}"#
            }
            GatewayError::BadRequest(Malformed::EncodedSeparator) => {
                br#"{"error":"bad_request","message":"path contains an encoded slash or backslash"}"#
            }
            GatewayError::BadRequest(Malformed::Backslash) => {
                br#"{"error":"bad_request","message":"path contains a backslash"}"#
            }
            GatewayError::BadRequest(Malformed::ControlCharacter) => {
                br#"{"error":"bad_request","message":"path contains a control character"}"#
            }
            GatewayError::BadRequest(Malformed::ContentLength) => {
                br#"{"error":"bad_request","message":"invalid content-length"}"#
            }
            GatewayError::BadRequest(Malformed::HeadersTooLarge) => {
                br#"{"error":"bad_request","message":"request headers too large"}"#
            }
            GatewayError::BadRequest(Malformed::Framing) => {
                br#"{"error":"bad_request","message":"malformed request"}"#
            }
            GatewayError::InvalidBody => {
                br#"{"error":"bad_request","message":"invalid request body"}"#
            }
            GatewayError::Unauthorized => br#"{"error":"unauthorized"}"#,
            GatewayError::Forbidden => {
                br#"{"error":"forbidden","message":"the token lacks the scope this service requires"}"#
            }
            GatewayError::EndpointNotMetered => {
                br#"{"error":"endpoint_not_metered","message":"the gateway does not meter this endpoint, and the caller has a token budget"}"#
            }
            GatewayError::ModelUnpriced => {
                br#"{"error":"model_unpriced","message":"no price applies to this model, and the caller has a cost budget"}"#
            }
            GatewayError::NotFound => br#"{"error":"not_found"}"#,
            GatewayError::MethodNotAllowed => {
                br#"{"error":"method_not_allowed","message":"allowed: GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS"}"#
            }
            GatewayError::RequestTimeout => {
                br#"{"error":"request_timeout","message":"the request body did not arrive in time"}"#
            }
            GatewayError::PayloadTooLarge => {
                br#"{"error":"payload_too_large","message":"request body exceeds the configured limit"}"#
            }
            GatewayError::RateLimited(_) => {
                br#"{"error":"rate_limited","message":"too many requests for this service; see Retry-After"}"#
            }
            GatewayError::BudgetExceeded(_) => {
                br#"{"error":"budget_exceeded","message":"the budget for this window is spent; see Retry-After"}"#
            }
            GatewayError::BadGateway => {
                br#"{"error":"bad_gateway","message":"the upstream refused, reset or sent an invalid response"}"#
            }
            GatewayError::Overloaded => {
                br#"{"error":"overloaded","message":"the gateway is holding as many request bodies as it may; see Retry-After"}"#
            }
            GatewayError::BudgetUnavailable => {
                br#"{"error":"budget_unavailable","message":"the caller's budget cannot be checked until the key store answers; see Retry-After"}"#
            }
            GatewayError::GatewayTimeout => {
                br#"{"error":"gateway_timeout","message":"the upstream did not answer in time"}"#
            }
            GatewayError::Internal => br#"{"error":"internal_error"}"#,
        })
    }

    /// Maps a Pingora failure raised while proxying to the error the client sees.
    /// `None` means the client is gone and nothing should be written.
    pub fn from_proxy_error(e: &pingora::Error) -> Option<GatewayError> {
        use pingora::{ErrorSource, ErrorType::*};
        match e.etype() {
            HTTPStatus(408) => return Some(GatewayError::RequestTimeout),
            HTTPStatus(413) => return Some(GatewayError::PayloadTooLarge),
            HTTPStatus(503) => return Some(GatewayError::Overloaded),
            HTTPStatus(400) => return Some(GatewayError::BadRequest(Malformed::Framing)),
            _ => {}
        }
        match e.esource() {
            ErrorSource::Upstream => Some(match e.etype() {
                ConnectTimedout | ReadTimedout | WriteTimedout => GatewayError::GatewayTimeout,
                _ => GatewayError::BadGateway,
            }),
            ErrorSource::Downstream => match e.etype() {
                ReadError | WriteError | ConnectionClosed | ReadTimedout | WriteTimedout => None,
                _ => Some(GatewayError::BadRequest(Malformed::Framing)),
            },
            ErrorSource::Internal | ErrorSource::Unset => Some(match e.etype() {
                // Pingora classes connect failures as internal when no byte was exchanged.
                ConnectTimedout => GatewayError::GatewayTimeout,
                ConnectRefused | ConnectNoRoute | ConnectError | ConnectionClosed => {
                    GatewayError::BadGateway
                }
                _ => GatewayError::Internal,
            }),
        }
    }

    /// The error code of `body()`, for a body built with a message of the moment.
    fn code(self) -> &'static str {
        match self {
            GatewayError::BadRequest(_) | GatewayError::InvalidBody => "bad_request",
            GatewayError::Unauthorized => "unauthorized",
            GatewayError::Forbidden => "forbidden",
            GatewayError::EndpointNotMetered => "endpoint_not_metered",
            GatewayError::ModelUnpriced => "model_unpriced",
            GatewayError::NotFound => "not_found",
            GatewayError::MethodNotAllowed => "method_not_allowed",
            GatewayError::RequestTimeout => "request_timeout",
            GatewayError::PayloadTooLarge => "payload_too_large",
            GatewayError::RateLimited(_) => "rate_limited",
            GatewayError::BudgetExceeded(_) => "budget_exceeded",
            GatewayError::BadGateway => "bad_gateway",
            GatewayError::Overloaded => "overloaded",
            GatewayError::BudgetUnavailable => "budget_unavailable",
            GatewayError::GatewayTimeout => "gateway_timeout",
            GatewayError::Internal => "internal_error",
        }
    }

    /// Writes the response with the headers every local response carries.
    pub async fn respond(
        self,
        session: &mut Session,
        request_id: &str,
        head_only: bool,
    ) -> pingora::Result<()> {
        self.respond_with_message(session, request_id, head_only, None)
            .await
    }

    /// As `respond`, with `message` (about the client's own input) instead of the fixed one.
    /// Never for a 401, whose body is pinned.
    pub async fn respond_with_message(
        self,
        session: &mut Session,
        request_id: &str,
        head_only: bool,
        message: Option<&str>,
    ) -> pingora::Result<()> {
        self.respond_with(session, request_id, head_only, message, |_| Ok(()))
            .await
    }

    /// As `respond_with_message`, with headers of the moment added by `extra`.
    pub async fn respond_with(
        self,
        session: &mut Session,
        request_id: &str,
        head_only: bool,
        message: Option<&str>,
        extra: impl FnOnce(&mut ResponseHeader) -> pingora::Result<()>,
    ) -> pingora::Result<()> {
        let body = match message {
            Some(message) if self != GatewayError::Unauthorized => Bytes::from(
                serde_json::json!({ "error": self.code(), "message": message }).to_string(),
            ),
            _ => self.body(),
        };
        let mut header = ResponseHeader::build(self.status(), Some(5))?;
        header.insert_header("content-type", "application/json")?;
        header.insert_header("content-length", body.len())?;
        header.insert_header("x-request-id", request_id)?;
        header.insert_header("cache-control", "no-store")?;
        match self {
            // Byte-identical for every failure: no error= attribute, so the reason stays hidden
            // (docs/reference.md).
            GatewayError::Unauthorized => header.insert_header("www-authenticate", "Bearer")?,
            GatewayError::MethodNotAllowed => header.insert_header("allow", ALLOWED_METHODS)?,
            GatewayError::RateLimited(seconds) | GatewayError::BudgetExceeded(seconds) => {
                header.insert_header("retry-after", seconds)?
            }
            GatewayError::Overloaded | GatewayError::BudgetUnavailable => {
                header.insert_header("retry-after", OVERLOADED_RETRY_AFTER)?
            }
            _ => {}
        }
        extra(&mut header)?;
        write_local(session, header, body, head_only).await
    }
}

/// Writes a complete response the gateway produced itself.
pub(crate) async fn write_local(
    session: &mut Session,
    header: ResponseHeader,
    body: Bytes,
    head_only: bool,
) -> pingora::Result<()> {
    session
        .write_response_header(Box::new(header), head_only)
        .await?;
    if !head_only {
        session.write_response_body(Some(body), true).await?;
    }
    Ok(())
}

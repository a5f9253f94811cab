//! What one request carries from hook to hook, and its id.

use std::sync::Arc;
use std::time::Instant;

use pingora::proxy::Session;
use rand::RngCore;

use crate::api::{Endpoint, Exchange};
use crate::auth::{AuthFailure, Principal};

/// `X-Request-Id`, kept inline: no allocation per request.
pub(crate) struct RequestId {
    buf: [u8; RequestId::MAX],
    len: u8,
}

impl RequestId {
    pub(crate) const MAX: usize = 128;

    /// The client's id if well formed (1–128 of `A-Za-z0-9._-`), else a fresh random one.
    pub(crate) fn from_client_or_new(client: Option<&[u8]>) -> RequestId {
        let mut id = RequestId {
            buf: [0; RequestId::MAX],
            len: 0,
        };
        match client {
            Some(v) if RequestId::well_formed(v) => {
                id.buf[..v.len()].copy_from_slice(v);
                id.len = v.len() as u8;
            }
            _ => {
                let mut random = [0u8; 16];
                rand::thread_rng().fill_bytes(&mut random);
                const HEX: &[u8; 16] = b"0123456789abcdef";
                for (i, b) in random.iter().enumerate() {
                    id.buf[2 * i] = HEX[(b >> 4) as usize];
                    id.buf[2 * i + 1] = HEX[(b & 0xf) as usize];
                }
                id.len = 32;
            }
        }
        id
    }

    pub(crate) fn well_formed(v: &[u8]) -> bool {
        (1..=RequestId::MAX).contains(&v.len())
            && v.iter()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    }

    pub(crate) fn as_str(&self) -> &str {
        // Only ASCII is ever stored.
        std::str::from_utf8(&self.buf[..self.len as usize]).unwrap_or_default()
    }
}

/// What one request carries from hook to hook, grouped by the step that fills it in.
pub(crate) struct RequestCtx {
    // Before step 1.
    pub start: Instant,
    pub request_id: RequestId,
    // 1. Validate.
    /// The target is `/healthz`: labelled `_local` whatever its answer.
    pub health: bool,
    /// Where, in the raw request target, the part forwarded to the upstream begins.
    pub forward_from: usize,
    /// Request body bytes so far (chunked bodies declare no length).
    pub body_bytes: u64,
    // 2. Authenticate.
    pub principal: Option<Arc<Principal>>,
    pub auth_failure: Option<AuthFailure>,
    // 3. Route.
    /// The matched service.
    pub route: Option<super::RouteId>,
    // 4. Authorise.
    /// A call on an endpoint of the service's `api`: its body is read (step 5).
    pub endpoint: Option<Endpoint>,
    /// Which budgets apply to the caller, looked up once when it is authorised
    /// (`Budgets::standing`): none, requests only, or tokens or cost.
    pub budget_class: Option<bool>,
    /// A budget of the caller's limits cost (`[pricing] unpriced = "refuse"` applies).
    pub cost_budgeted: bool,
    /// The caller's owner's team when the request was made, for the ledger.
    pub team: Option<Arc<str>>,
    // 5. Body.
    /// The call on an endpoint the gateway reads, and its body; boxed, as most requests have
    /// none.
    pub body: Option<Box<super::body::Body>>,
    // 6. Budget.
    /// The caller's budgets were checked (once per request).
    pub budget_decided: bool,
    /// What the request reserved of its budgets, settled when it ends.
    pub budget: Option<Box<crate::limits::budgets::Reservation>>,
    /// Why a held body's request was refused for its budget, for the 429 (or 503).
    pub budget_refusal: Option<super::budget::BudgetStop>,
    // 7. Upstream.
    /// The replica the request is with (counted in flight while held).
    pub replica: Option<crate::replicas::Chosen>,
    /// Replicas already tried by this request (bit i = replica i): each is tried once.
    pub tried: u64,
    /// Bytes of the request may have reached a replica (an error came after connecting): a
    /// retry may only go back to that replica, never to another.
    pub reached_replica: bool,
    // 8. Rewrite.
    pub upstream_sent: Option<Instant>,
    // 9. Respond.
    pub upstream_ttfb: Option<std::time::Duration>,
    pub streaming: bool,
    /// Status of a response the gateway wrote itself.
    pub local_status: Option<u16>,
    /// The gateway refused the request after its head went upstream but before its body did
    /// (a held body's 400, 403, 408, 413, 429 or 503): not a request of the ledger's, and its
    /// `requests_per_day` comes back.
    pub refused_held: bool,
    // 10. Record.
    /// What the request cost, once its usage is settled.
    pub cost: Option<crate::metering::Cost>,
}

impl RequestCtx {
    /// The call on an endpoint the gateway reads, if this is one.
    pub(crate) fn exchange(&self) -> Option<&Exchange> {
        self.body.as_ref().map(|b| &b.exchange)
    }

    pub(crate) fn exchange_mut(&mut self) -> Option<&mut Exchange> {
        self.body.as_mut().map(|b| &mut b.exchange)
    }
}

impl Default for RequestCtx {
    fn default() -> RequestCtx {
        RequestCtx {
            start: Instant::now(),
            request_id: RequestId::from_client_or_new(None),
            health: false,
            forward_from: 0,
            body_bytes: 0,
            principal: None,
            auth_failure: None,
            route: None,
            endpoint: None,
            budget_class: None,
            cost_budgeted: false,
            team: None,
            body: None,
            budget_decided: false,
            budget: None,
            budget_refusal: None,
            replica: None,
            tried: 0,
            reached_replica: false,
            upstream_sent: None,
            upstream_ttfb: None,
            streaming: false,
            local_status: None,
            refused_held: false,
            cost: None,
        }
    }
}

/// The request's clock and id: new_ctx already drew a random id; the client's replaces it
/// only if it sent a well-formed one.
pub(crate) fn begin(session: &Session, ctx: &mut RequestCtx) {
    ctx.start = Instant::now();
    if let Some(client_id) = session
        .req_header()
        .headers
        .get(&super::headers::X_REQUEST_ID)
    {
        ctx.request_id = RequestId::from_client_or_new(Some(client_id.as_bytes()));
    }
}

#[cfg(test)]
mod tests {
    use super::RequestId;

    #[test]
    fn keeps_well_formed_client_ids_and_replaces_the_rest() {
        assert_eq!(
            RequestId::from_client_or_new(Some(b"abc-1.2_3")).as_str(),
            "abc-1.2_3"
        );
        let long = [b'a'; 129];
        for bad in [&b""[..], b"has space", b"semi;colon", &long] {
            let id = RequestId::from_client_or_new(Some(bad));
            assert_eq!(id.as_str().len(), 32);
            assert_ne!(id.as_str().as_bytes(), bad);
        }
        let max = [b'z'; 128];
        assert_eq!(
            RequestId::from_client_or_new(Some(&max)).as_str().len(),
            128
        );
    }
}

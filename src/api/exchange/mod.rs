//! One call on an endpoint the gateway reads, from the API's side: the proxy hands it each
//! phase in turn, in the manner of Pingora's `HttpModule` filters, and it knows what the
//! phase means for the endpoint's dialect.
//!
//! - the request body, complete (`plan`): checked, the model policy's edit planned, what the
//!   budget needs noted;
//! - the upstream's request head (`upstream_head`): the codings its answer may come in;
//! - the response head (`response_head`) and each chunk (`response_chunk`): usage read on the
//!   side, and the usage the gateway asked for taken out of the client's stream;
//! - the end (`settle`): what the call is charged.

mod metered;
mod translated;

use pingora::http::{RequestHeader, ResponseHeader};
use pingora::Result;

pub(crate) use metered::Charged;
use metered::Metered;
pub use translated::Bridge;
use translated::Translated;

use super::{plan_capped, BodyError, CapRule, Edit, Endpoint, Models, Pair, USAGE_MAX_GROWTH};
use crate::errors::GatewayError;

pub(crate) struct Exchange {
    endpoint: Endpoint,
    /// The model after the policy, as the ledger and the access log keep it.
    model: Option<String>,
    /// Set when the body was refused; told to the client in the 400 (or 403).
    error: Option<BodyError>,
    /// How a refused body is answered: 400, or 403 for a background Responses request.
    refused_as: GatewayError,
    /// The response's usage, read as it passes.
    metered: Metered,
    /// What the budgets need once the body is checked: its size, and the completion tokens
    /// it may use as it states them.
    ask: Option<(u64, Option<u64>)>,
    /// With `balance = "prefix_affinity"`: the hash of the conversation's start.
    pub(crate) affinity_key: Option<u64>,
    /// The caller has a token budget: a body stating no completion cap gets the budgets' one.
    capped: bool,
    /// A call translated to another API's endpoint (`translate`).
    translated: Option<Box<Translated>>,
}

impl Exchange {
    /// A call on `endpoint`; `capped`: by a caller with a token budget; `translate`: sent
    /// upstream as another API's endpoint.
    pub(crate) fn new(endpoint: Endpoint, capped: bool, translate: Option<Pair>) -> Exchange {
        Exchange {
            endpoint,
            model: None,
            error: None,
            refused_as: GatewayError::InvalidBody,
            metered: Metered::default(),
            ask: None,
            affinity_key: None,
            capped,
            translated: translate.map(|pair| Box::new(Translated::new(pair))),
        }
    }

    /// How a translated call ended, as `portcullis_translations_total` counts it: `ok`,
    /// `refused`, `upstream_error` or `cut`; `None` when the call is not translated.
    pub(crate) fn translation_result(&self, status: u16, failed: bool) -> Option<&'static str> {
        let translated = self.translated.as_ref()?;
        Some(if self.error.is_some() {
            "refused"
        } else if translated.was_cut() || (failed && (200..300).contains(&status)) {
            "cut"
        } else if !(200..300).contains(&status) {
            "upstream_error"
        } else {
            "ok"
        })
    }

    /// The pair the call is translated by, if it is.
    pub(crate) fn translation(&self) -> Option<Pair> {
        self.translated.as_ref().map(|t| t.pair())
    }

    /// The checked (and edited) body in the upstream's dialect; `None` when it cannot be
    /// translated (the reason kept for the 400).
    pub(crate) fn translate_request(&mut self, body: &[u8]) -> Option<Vec<u8>> {
        let translated = self.translated.as_mut()?;
        match translated.request(body) {
            Ok(converted) => Some(converted),
            Err(e) => {
                self.error = Some(e);
                None
            }
        }
    }

    /// The most bytes the gateway may add to a body of this endpoint: the model policy's
    /// edit, `stream_options` on the endpoints that report usage on request, a budget's cap.
    pub(crate) fn max_growth(&self, models: &Models, cap: Option<&CapRule>) -> usize {
        let usage = match self.endpoint.spec().usage_on_request {
            true => USAGE_MAX_GROWTH,
            false => 0,
        };
        models.max_growth() + usage + cap.map_or(0, CapRule::max_growth)
    }

    /// The request body, complete: checks it and keeps its model. The edit the policy
    /// makes, if any, or None when the body is refused (the reason kept for the answer).
    pub(crate) fn plan<'m>(
        &mut self,
        body: &[u8],
        models: &'m Models,
        cap: Option<&'m CapRule>,
    ) -> Option<Option<Edit<'m>>> {
        let cap = cap.filter(|_| self.capped);
        match plan_capped(self.endpoint, body, models, cap) {
            // Generated server-side and fetched by calls the gateway does not meter.
            Ok(plan) if plan.background && self.capped => {
                self.refused_as = GatewayError::EndpointNotMetered;
                self.error = Some(BodyError::new(
                    "a background response is not metered by the gateway, and this caller has \
                     a token budget: send it without \"background\": true"
                        .into(),
                ));
                None
            }
            Ok(plan) => {
                // The access log is the name's only reader: only what it shows is copied.
                self.model = plan.model.map(|m| kept_model(&m).to_owned());
                // A translated call's answer is the upstream's endpoint's, and its usage is
                // taken in as the answer is converted, never stripped.
                // The converter asks the upstream for usage in its own dialect, and gives the
                // client only what it asked for: the client's body keeps its `stream_options`.
                let (usage_at, usage_edit) = match self.translation() {
                    Some(pair) => (pair.target().spec().usage, None),
                    None => (self.endpoint.spec().usage, plan.usage),
                };
                (self.metered).request_read(body.len(), usage_edit.is_some(), usage_at);
                self.ask = Some((body.len() as u64, plan.completion_cap));
                Some(Edit::merge(plan.edit, usage_edit))
            }
            Err(e) => {
                self.error = Some(e);
                None
            }
        }
    }

    /// What the budgets need once the body is checked: its size and its completion cap.
    pub(crate) fn ask(&self) -> Option<(u64, Option<u64>)> {
        self.ask
    }

    /// A budgeted call's worst case: what a successful answer whose usage goes unread is
    /// charged.
    pub(crate) fn charge_if_unread(&mut self, prompt: u64, completion: u64) {
        self.metered.charge_if_unread(prompt, completion);
    }

    /// The model after the policy, as the access log shows it.
    pub(crate) fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// Why the body was refused, and how that is answered.
    pub(crate) fn refusal(&self) -> Option<(GatewayError, &BodyError)> {
        self.error.as_ref().map(|e| (self.refused_as, e))
    }

    /// The upstream's request head: the codings its answer may come in.
    pub(crate) fn upstream_head(&self, upstream: &mut RequestHeader) -> Result<()> {
        self.metered.limit_codings(upstream)?;
        if self.translated.is_some() {
            // Converted from its first byte: the answer must come as it is.
            upstream.insert_header(http::header::ACCEPT_ENCODING, "identity")?;
        }
        Ok(())
    }

    /// The response head, as the upstream sent it; `client`: the client's HTTP version.
    pub(crate) fn response_head(
        &mut self,
        response: &mut ResponseHeader,
        event_stream: bool,
        client: http::Version,
    ) -> Result<()> {
        (self.metered).response_started(response, event_stream, client)?;
        match &mut self.translated {
            Some(translated) => translated.head(response, event_stream, client),
            None => Ok(()),
        }
    }

    /// Each chunk of the answer, as it passes.
    pub(crate) fn response_chunk(&mut self, body: &mut Option<bytes::Bytes>, end: bool) {
        // Usage is read from the upstream's bytes, before they are converted.
        self.metered.response_chunk(body, end);
        if let Some(translated) = &mut self.translated {
            translated.chunk(body, end);
        }
    }

    /// The upstream failed once the answer had started: what ends a translated stream in
    /// the client dialect's error form.
    pub(crate) fn upstream_failed(&mut self) -> Option<bytes::Bytes> {
        self.translated.as_mut()?.upstream_failed()
    }

    /// The call is over: settles its charge (`status` as sent, `cut` when it ended in an
    /// error). `Some(reason)` when its usage went unread.
    pub(crate) fn settle(&mut self, status: u16, cut: bool) -> Option<&'static str> {
        self.metered.settle(status, cut)
    }

    /// The answer is metered and its usage has not come yet.
    pub(crate) fn usage_pending(&self) -> bool {
        self.metered.usage_pending()
    }

    /// What the call was charged, once settled.
    pub(crate) fn charged(&self) -> Option<&Charged> {
        self.metered.charged()
    }
}

/// The answer's bytes change on the way (usage taken out, a dialect converted): its
/// `Content-Length` goes; it is chunked to an HTTP/1.1 client, delimited by the close to an
/// HTTP/1.0 one, framed by HTTP/2 itself.
fn length_changes(response: &mut ResponseHeader, client: http::Version) -> Result<()> {
    if response
        .remove_header(&http::header::CONTENT_LENGTH)
        .is_some()
    {
        if client == http::Version::HTTP_11 {
            response.insert_header(http::header::TRANSFER_ENCODING, "chunked")?;
        } else {
            response.remove_header(&http::header::TRANSFER_ENCODING);
        }
    }
    Ok(())
}

/// The most bytes of a model name the ledger and the access log keep.
const MAX_MODEL: usize = 256;

/// A model name as the gateway keeps it: at most 256 bytes, cut on a character boundary.
fn kept_model(name: &str) -> &str {
    if name.len() <= MAX_MODEL {
        return name;
    }
    let mut end = MAX_MODEL;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

#[cfg(test)]
mod tests {
    use super::kept_model as model_name;

    #[test]
    fn model_names_are_cut_to_256_bytes_on_a_character_boundary() {
        assert_eq!(model_name("gpt-4o"), "gpt-4o");
        assert_eq!(model_name(&"m".repeat(5 << 20)), "m".repeat(256));
        // 3-byte characters: 85 of them fit, the 86th would end at byte 258.
        assert_eq!(model_name(&"€".repeat(1000)), "€".repeat(85));
        assert_eq!(
            model_name(&format!("{}é", "a".repeat(255))),
            "a".repeat(255)
        );
    }
}

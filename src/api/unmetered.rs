//! No free generation (checked in the proxy's step 4, authorise): on an `api` service, a
//! caller with a token budget may call only what the gateway meters (the endpoints whose
//! bodies it reads), the model lists, and the paths the service lists in `unmetered_paths`.
//! Anything else could generate tokens the budget never sees (`/batches`, vLLM's
//! `/invocations`, a Responses result fetched later), so it is refused with
//! `403 endpoint_not_metered` naming the path.

use http::Method;

/// Whether a request the gateway does not meter may go through for a budgeted caller.
pub(crate) fn allowed(unmetered_paths: &[String], method: &Method, forward: &[u8]) -> bool {
    let path = path_of(forward);
    if (method == Method::GET || method == Method::HEAD) && is_model_list(path) {
        return true;
    }
    unmetered_paths.iter().any(|listed| {
        let listed = listed.as_bytes();
        path.starts_with(listed) && matches!(path.get(listed.len()), None | Some(b'/'))
    })
}

/// The 403's message: the forwarded path (without its query, which may carry anything), cut
/// short. The path itself was checked by the router: no control characters.
pub(crate) fn refusal_message(forward: &[u8]) -> String {
    let path = String::from_utf8_lossy(path_of(forward));
    let shown: String = path.chars().take(256).collect();
    format!(
        "{shown} is not metered by the gateway, and this caller has a token budget: only \
         endpoints whose usage is read, model lists and the service's unmetered_paths are allowed"
    )
}

fn path_of(forward: &[u8]) -> &[u8] {
    let end = forward
        .iter()
        .position(|&b| b == b'?')
        .unwrap_or(forward.len());
    &forward[..end]
}

/// `…/models` or `…/models/<id>`: listing or describing models generates nothing.
fn is_model_list(path: &[u8]) -> bool {
    let path = path.strip_suffix(b"/").unwrap_or(path);
    let mut segments = path.rsplit(|&b| b == b'/');
    let last = segments.next().unwrap_or_default();
    let before = segments.next().unwrap_or_default();
    last.eq_ignore_ascii_case(b"models") || before.eq_ignore_ascii_case(b"models")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_model_lists_and_listed_paths_pass() {
        let listed = vec!["/v1/files".to_string()];
        let get = Method::GET;
        let post = Method::POST;
        assert!(allowed(&[], &get, b"/v1/models"));
        assert!(allowed(&[], &get, b"/v1/models/gpt-4o?x=1"));
        assert!(!allowed(&[], &post, b"/v1/models"));
        assert!(!allowed(&[], &post, b"/v1/batches"));
        assert!(!allowed(&[], &post, b"/invocations"));
        assert!(!allowed(&[], &get, b"/v1/responses/resp_1"));
        assert!(allowed(&listed, &post, b"/v1/files"));
        assert!(allowed(&listed, &get, b"/v1/files/abc/content?x"));
        assert!(!allowed(&listed, &post, b"/v1/filesystem"));
        let message = refusal_message(b"/v1/batches?secret=1");
        assert!(
            message.starts_with("/v1/batches is not metered"),
            "{message}"
        );
        assert!(!message.contains("secret"));
    }
}

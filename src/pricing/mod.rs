//! Cost in currency: a dated price table (`[pricing] file`) turns a request's token counts
//! into an exact amount. Tokens are what the upstream reports; prices change on dates the
//! table states, per model, optionally per service, so a cost is the same whenever and
//! wherever it is computed. A model without an applicable price is *unpriced*, never free.
//!
//! `table`: the table and its lookup; `live`: the table in use, reloaded on SIGHUP; `money`:
//! amounts as text and JSON; `litellm`: `prices import`; `decimal`: exact decimal text.

mod decimal;
pub(crate) mod litellm;
mod live;
pub(crate) mod money;
mod table;

pub use live::{Pricing, Unpriced};
pub(crate) use live::{PricingReload, PricingSettings};
pub use table::{Price, Prices, Tokens};

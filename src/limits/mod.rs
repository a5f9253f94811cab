//! What a caller may use: rate limits (`rate/`, requests per minute) and budgets
//! (`budgets/`, tokens and requests per hour, day and month), each per process or shared by
//! a fleet through the one Redis connection a process keeps (`redis.rs`).

pub(crate) mod budgets;
pub(crate) mod rate;
mod redis;

pub(crate) use redis::{escape_id, SharedRedis};

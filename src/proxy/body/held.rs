//! A body held back until it is complete (the hold path of `exchange.rs`). Its buffer grows as
//! the body arrives, each byte of capacity reserved from the shared [`MemoryPool`] before it is
//! allocated; the policy's edit is made where the body lies, in room kept for it, never in a
//! copy. It goes to Pingora as `Bytes` that own the buffer and its reservation, so the pool
//! gets the bytes back when Pingora drops them (once written upstream), not at request end.

use std::sync::Arc;

use bytes::Bytes;

use super::pool::{Claim, MemoryPool};
use crate::api::Edit;
use crate::auth::Principal;
use crate::errors::GatewayError;

/// The first allocation for a body of unknown length: about what one read brings.
const FIRST: usize = 64 * 1024;

pub(crate) struct Held {
    buf: Vec<u8>,
    /// Always the buffer's capacity: what is allocated is what is counted.
    reservation: Claim,
    /// The most the body may be: `max_buffered_body_bytes`, or less when its length was
    /// declared.
    max: usize,
    /// Room kept for the policy's edit (`Models::max_growth`).
    headroom: usize,
}

impl Held {
    /// Room for a first read's worth of the body: the rest is reserved as it arrives, never
    /// from a declared length alone (a head that declares 8 MiB and sends nothing holds
    /// 64 KiB, not 8 MiB).
    pub(crate) fn new(
        pool: &Arc<MemoryPool>,
        caller: Option<&Arc<Principal>>,
        declared: Option<usize>,
        max: usize,
        headroom: usize,
    ) -> Result<Held, GatewayError> {
        let max = match declared {
            Some(len) if len > max => return Err(GatewayError::PayloadTooLarge),
            Some(len) => len,
            None => max,
        };
        let capacity = FIRST.min(max + headroom);
        let reservation =
            (pool.reserve(caller, capacity as u64)).ok_or(GatewayError::Overloaded)?;
        Ok(Held {
            buf: Vec::with_capacity(capacity),
            reservation,
            max,
            headroom,
        })
    }

    /// Appends a chunk: 413 past `max`, 503 when the pool cannot cover the room it needs.
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Result<(), GatewayError> {
        let len = self.buf.len() + chunk.len();
        if len > self.max {
            return Err(GatewayError::PayloadTooLarge);
        }
        if len > self.buf.capacity() {
            // Doubling keeps the copies few; the cap keeps a body that fits from reserving
            // more than the largest allowed body needs.
            let capacity = (2 * self.buf.capacity()).clamp(len, self.max + self.headroom);
            self.grow_to(capacity)?;
        }
        self.buf.extend_from_slice(chunk);
        Ok(())
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Makes the policy's edit in the buffer itself.
    pub(crate) fn edit(&mut self, edit: &Edit<'_>) -> Result<(), GatewayError> {
        let len = self.buf.len() + edit.growth();
        if len > self.buf.capacity() {
            self.grow_to(len)?;
        }
        edit.apply_in_place(&mut self.buf);
        Ok(())
    }

    /// The body for Pingora to send; the reservation ends when Pingora drops it.
    pub(crate) fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self)
    }

    fn grow_to(&mut self, capacity: usize) -> Result<(), GatewayError> {
        let more = capacity - self.buf.capacity();
        if !self.reservation.grow(more as u64) {
            return Err(GatewayError::Overloaded);
        }
        self.buf.reserve_exact(capacity - self.buf.len());
        Ok(())
    }
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{self, Endpoint, Models};

    #[test]
    fn a_held_body_reserves_its_capacity_and_gives_it_back_with_its_bytes() {
        let pool = MemoryPool::new(1 << 20);
        let mut held = Held::new(&pool, None, None, 300_000, 20).unwrap();
        assert_eq!(pool.used(), FIRST as u64);
        let chunk = vec![b' '; 50_000];
        for _ in 0..5 {
            held.push(&chunk).unwrap();
            assert_eq!(pool.used(), held.buf.capacity() as u64);
        }
        // Doubled from 64 KiB, then capped at the limit plus the headroom.
        assert_eq!(held.buf.capacity(), 256 * 1024);
        held.push(&chunk).unwrap();
        assert_eq!(held.buf.capacity(), 300_020);
        assert_eq!(
            held.push(b"x"),
            Err(GatewayError::PayloadTooLarge),
            "past max_buffered_body_bytes"
        );
        let bytes = held.into_bytes();
        let copy = bytes.clone();
        drop(bytes);
        assert_eq!(pool.used(), 300_020, "Pingora still holds a copy");
        assert_eq!(copy.len(), 300_000);
        drop(copy);
        assert_eq!(pool.used(), 0);
    }

    #[test]
    fn a_body_the_budget_cannot_cover_is_refused_as_overloaded() {
        let pool = MemoryPool::new(100_000);
        // A declared length reserves nothing by itself: a first read's worth, then what
        // arrives, up to the declared length.
        let mut declared = Held::new(&pool, None, Some(90_000), 1 << 20, 0).unwrap();
        assert_eq!(pool.used(), FIRST as u64);
        assert!(matches!(
            Held::new(&pool, None, None, 1 << 20, 0),
            Err(GatewayError::Overloaded)
        ));
        declared.push(&[b' '; 90_000]).unwrap();
        assert_eq!(pool.used(), 90_000, "grown to the declared length, no more");
        assert!(matches!(
            Held::new(&pool, None, Some(2 << 20), 1 << 20, 0),
            Err(GatewayError::PayloadTooLarge)
        ));
        drop(declared);
        let mut chunked = Held::new(&pool, None, None, 1 << 20, 0).unwrap();
        chunked.push(&[b' '; 60_000]).unwrap();
        assert_eq!(chunked.push(&[b' '; 60_000]), Err(GatewayError::Overloaded));
        assert_eq!(pool.used(), FIRST as u64, "a refused growth takes nothing");
    }

    #[test]
    fn the_edit_is_made_in_place_within_the_headroom() {
        let models = Models::new(Some("default-model".into()), []);
        let body = br#"{"messages":[{"role":"user"}]}"#;
        let pool = MemoryPool::new(1 << 20);
        let room = models.max_growth();
        let mut held = Held::new(&pool, None, Some(body.len()), 1 << 20, room).unwrap();
        held.push(body).unwrap();
        let reserved = pool.used();
        let plan = api::plan(Endpoint::Chat, body, &models).unwrap();
        held.edit(&plan.edit.unwrap()).unwrap();
        assert_eq!(pool.used(), reserved, "the edit needed no more room");
        assert_eq!(
            held.bytes(),
            br#"{"model":"default-model","messages":[{"role":"user"}]}"#
        );
    }
}

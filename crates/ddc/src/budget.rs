//! The server-wide memory budget: the bytes requests may hold in memory at once (bodies read
//! whole, objects read from storage, answers while they are sent). It lives below the HTTP
//! layer so that storage charges what it reads *before* it reads it: a ref's object, and each
//! object a presence check resolves. A read the budget cannot hold fails with [`NoRoom`]
//! (429 at the HTTP edge, which the editor retries) instead of the server running out of
//! memory.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget could not give the bytes asked for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the server's memory budget cannot hold {bytes} more bytes now")]
pub struct NoRoom {
    pub bytes: usize,
}

/// Bytes held in memory at once, server-wide.
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    permits: Arc<Semaphore>,
    total: usize,
}

impl MemoryBudget {
    pub fn new(bytes: u32) -> MemoryBudget {
        MemoryBudget { permits: Arc::new(Semaphore::new(bytes as usize)), total: bytes as usize }
    }

    /// The whole budget, held or not.
    pub fn total(&self) -> usize {
        self.total
    }

    /// What the budget could ever give a request that already holds `held` of it: the rest,
    /// however busy the server. A need past it is refused for good (413), not for now (429).
    pub fn room_beside(&self, held: usize) -> usize {
        self.total.saturating_sub(held)
    }

    /// What is left of the budget.
    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }

    fn permit(&self, bytes: usize) -> Result<OwnedSemaphorePermit, NoRoom> {
        let n = u32::try_from(bytes).map_err(|_| NoRoom { bytes })?;
        self.permits.clone().try_acquire_many_owned(n).map_err(|_| NoRoom { bytes })
    }
}

/// A share of the memory budget, given back when dropped: one permit, however many times it
/// grew.
#[derive(Debug, Default)]
pub struct Held(Option<OwnedSemaphorePermit>);

impl Held {
    /// A share of `bytes` taken from `budget`.
    pub fn take(budget: &MemoryBudget, bytes: usize) -> Result<Held, NoRoom> {
        Ok(Held(Some(budget.permit(bytes)?)))
    }

    /// The bytes this share holds.
    pub fn bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |p| p.num_permits())
    }

    /// Takes `bytes` more from `budget` into this share.
    pub fn grow(&mut self, budget: &MemoryBudget, bytes: usize) -> Result<(), NoRoom> {
        self.join(Held::take(budget, bytes)?);
        Ok(())
    }

    /// Adds `other` (taken from the same budget) to this share.
    pub fn join(&mut self, other: Held) {
        match (self.0.as_mut(), other.0) {
            (Some(held), Some(more)) => held.merge(more),
            (None, more) => self.0 = more,
            (Some(_), None) => {}
        }
    }

    /// Makes this share exactly `bytes`: gives back what it holds beyond, or takes what it
    /// lacks from `budget` (a refused growth takes nothing).
    pub fn resize(&mut self, budget: &MemoryBudget, bytes: usize) -> Result<(), NoRoom> {
        let holds = self.bytes();
        match self.0.as_mut() {
            Some(permit) if holds > bytes => drop(permit.split(holds - bytes)),
            _ if holds < bytes => self.grow(budget, bytes - holds)?,
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_resizes_both_ways() {
        let budget = MemoryBudget::new(100);
        let mut held = Held::default();
        held.resize(&budget, 30).unwrap();
        assert_eq!(budget.available(), 70);
        held.resize(&budget, 10).unwrap();
        assert_eq!((budget.available(), held.bytes()), (90, 10));
        assert_eq!(held.resize(&budget, 200), Err(NoRoom { bytes: 190 }));
        assert_eq!(budget.available(), 90, "a refused growth takes nothing");
        drop(held);
        assert_eq!(budget.available(), 100);
    }

    #[test]
    fn joined_shares_go_back_together() {
        let budget = MemoryBudget::new(100);
        let mut held = Held::default();
        held.join(Held::take(&budget, 40).unwrap());
        held.join(Held::take(&budget, 25).unwrap());
        held.join(Held::default());
        assert_eq!((budget.available(), held.bytes()), (35, 65));
        assert!(Held::take(&budget, 36).is_err());
        drop(held);
        assert_eq!((budget.available(), budget.total()), (100, 100));
    }
}

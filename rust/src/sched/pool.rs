//! KV pages and request slots handed out to owners (vox_serve/core/page_pool.py): the same free
//! lists in the same order, so both runtimes give a request the same page and slot ids.

use std::collections::HashMap;
use std::hash::Hash;

fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1).div_euclid(b)
}

/// Pages `0 .. num_reserved` are never handed out (page 0 is the null page padded rows write).
/// Freed pages go on a LIFO free list; the lowest ids go out first.
#[derive(Debug, Clone)]
pub struct PagePool<K: Eq + Hash + Copy> {
    pub num_pages: usize,
    pub page_size: i64,
    num_reserved: usize,
    free: Vec<i32>,
    owned: HashMap<K, Vec<i32>>,
}

impl<K: Eq + Hash + Copy> PagePool<K> {
    pub fn new(num_pages: usize, page_size: i64) -> PagePool<K> {
        let num_reserved = 1.min(num_pages);
        let free = (num_reserved..num_pages).rev().map(|p| p as i32).collect();
        PagePool { num_pages, page_size, num_reserved, free, owned: HashMap::new() }
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    pub fn num_usable(&self) -> usize {
        self.num_pages - self.num_reserved
    }

    pub fn num_tokens_capacity(&self, owner: K) -> i64 {
        self.owned.get(&owner).map_or(0, Vec::len) as i64 * self.page_size
    }

    /// Extra pages `owner` needs to hold `num_tokens` tokens in all.
    pub fn pages_needed(&self, owner: K, num_tokens: i64) -> i64 {
        let have = self.owned.get(&owner).map_or(0, Vec::len) as i64;
        (ceil_div(num_tokens, self.page_size) - have).max(0)
    }

    pub fn can_reserve(&self, owner: K, num_tokens: i64) -> bool {
        self.pages_needed(owner, num_tokens) <= self.free.len() as i64
    }

    /// Grow `owner`'s pages to hold `num_tokens`; the new pages (registers the owner even when
    /// none is needed). The caller checked `can_reserve`.
    pub fn reserve(&mut self, owner: K, num_tokens: i64) -> Vec<i32> {
        let needed = self.pages_needed(owner, num_tokens) as usize;
        assert!(needed <= self.free.len(), "reserve past the free pages");
        let new: Vec<i32> = (0..needed).map(|_| self.free.pop().unwrap()).collect();
        self.owned.entry(owner).or_default().extend_from_slice(&new);
        new
    }

    /// One more page for each (existing) owner, in order: the pages successive reserves would give.
    pub fn extend_each(&mut self, owners: &[K]) -> Vec<i32> {
        assert!(owners.len() <= self.free.len(), "extend_each past the free pages");
        let mut pages = Vec::with_capacity(owners.len());
        for owner in owners {
            let page = self.free.pop().unwrap();
            self.owned.get_mut(owner).expect("extend_each: an owner without pages").push(page);
            pages.push(page);
        }
        pages
    }

    /// Return all of `owner`'s pages (its first page is the next handed out); unknown: 0.
    pub fn free(&mut self, owner: K) -> usize {
        match self.owned.remove(&owner) {
            None => 0,
            Some(owned) => {
                let n = owned.len();
                self.free.extend(owned.into_iter().rev());
                n
            }
        }
    }

    /// The first broken invariant, if any (free and owned pages disjoint, nothing lost).
    pub fn check(&self) -> Result<(), String> {
        let mut seen = vec![false; self.num_pages];
        let owned = self.owned.values().flatten();
        for &page in self.free.iter().chain(owned) {
            let p = page as usize;
            if p < self.num_reserved || p >= self.num_pages {
                return Err(format!("page {page} is reserved or out of range"));
            }
            if seen[p] {
                return Err(format!("page {page} is both free and owned, or owned twice"));
            }
            seen[p] = true;
        }
        let count = seen.iter().filter(|&&s| s).count();
        if count != self.num_usable() {
            return Err(format!("{} of {} usable pages are neither free nor owned", self.num_usable() - count,
                               self.num_usable()));
        }
        Ok(())
    }
}

/// Request slots `0 .. num_slots`, one per owner, lowest first, LIFO on release.
#[derive(Debug, Clone)]
pub struct SlotPool<K: Eq + Hash + Copy> {
    free: Vec<usize>,
    slots: HashMap<K, usize>,
}

impl<K: Eq + Hash + Copy> SlotPool<K> {
    pub fn new(num_slots: usize) -> SlotPool<K> {
        SlotPool { free: (0..num_slots).rev().collect(), slots: HashMap::new() }
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    pub fn can_acquire(&self) -> bool {
        !self.free.is_empty()
    }

    pub fn acquire(&mut self, owner: K) -> usize {
        if let Some(&slot) = self.slots.get(&owner) {
            return slot;
        }
        let slot = self.free.pop().expect("acquire without a free slot");
        self.slots.insert(owner, slot);
        slot
    }

    pub fn release(&mut self, owner: K) -> bool {
        match self.slots.remove(&owner) {
            None => false,
            Some(slot) => {
                self.free.push(slot);
                true
            }
        }
    }

    pub fn num_held(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_go_out_lowest_first_and_come_back_in_order() {
        let mut pool: PagePool<u32> = PagePool::new(6, 4);
        assert_eq!(pool.reserve(1, 9), vec![1, 2, 3]);
        assert_eq!(pool.extend_each(&[1]), vec![4]);
        assert_eq!(pool.free(1), 4);
        assert_eq!(pool.reserve(2, 1), vec![1]);
        pool.check().unwrap();
        assert_eq!(pool.pages_needed(2, 4), 0);
        assert_eq!(pool.pages_needed(2, 5), 1);
    }

    #[test]
    fn slots_are_reused_last_in_first_out() {
        let mut pool: SlotPool<u32> = SlotPool::new(3);
        assert_eq!((pool.acquire(7), pool.acquire(8)), (0, 1));
        pool.release(7);
        assert_eq!(pool.acquire(9), 0);
    }
}

//! Page ownership (placement across nodes). Every node's data table is a run of
//! pages (see [`crate::classes`]); which worker node holds a page, and for which class, is one
//! 64-bit *page word* per page in the node's page table ([`PAGE_REGION`]). A writer claims a
//! whole page — a block of entries of one class — with one CAS on that word, on its own node or
//! on another, and then hands out the page's entries itself without further round trips (the
//! two-level allocation of FUSEE). A page goes back to the pool by a CAS from the claimed word
//! to the free word, only when none of its entries is in use or awaiting expiry.
//!
//! ```text
//! page word:  63        56..45            44..39      38..0
//!             claimed   claimer node      class       generation
//! ```
//! The free word of a page is its generation alone, so a zeroed table is all free. Every claim
//! increments the generation: a CAS that expects a page word seen earlier fails if the page was
//! claimed and released in between (no ABA).

use nessie_fabric::{Endpoint, FabricError, NodeId, RegionId, RemoteAddr};

/// Region holding a node's page table: one word per page of its data table.
pub const PAGE_REGION: RegionId = 2;
/// Most page words one READ of the page table fetches while looking for a free page.
pub const PAGE_SCAN_CHUNK: u64 = 512;
/// Most CAS attempts one search for a free page makes before giving up (the table is contended).
pub const MAX_CLAIM_ATTEMPTS: u32 = 64;

const CLAIMED: u64 = 1 << 63;
const NODE_SHIFT: u32 = 45;
const NODE_MASK: u64 = (1 << 12) - 1;
const CLASS_SHIFT: u32 = 39;
const CLASS_MASK: u64 = (1 << 6) - 1;
const GEN_MASK: u64 = (1 << 39) - 1;

/// One page word, decoded.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PageWord(pub u64);

impl PageWord {
    /// The free word of a page at `generation`.
    pub fn free(generation: u64) -> Self {
        Self(generation & GEN_MASK)
    }

    /// The word of a page claimed by `node` for `class`, one generation after `prev`.
    pub fn claimed_after(prev: PageWord, node: NodeId, class: u8) -> Self {
        assert!((node as u64) <= NODE_MASK && (class as u64) <= CLASS_MASK);
        let generation = (prev.generation() + 1) & GEN_MASK;
        Self(CLAIMED | (node as u64) << NODE_SHIFT | (class as u64) << CLASS_SHIFT | generation)
    }

    pub fn is_claimed(self) -> bool {
        self.0 & CLAIMED != 0
    }

    /// The node whose workers allocate from this page (meaningful only if claimed).
    pub fn claimer(self) -> NodeId {
        ((self.0 >> NODE_SHIFT) & NODE_MASK) as NodeId
    }

    /// The class the page serves (meaningful only if claimed).
    pub fn class(self) -> u8 {
        ((self.0 >> CLASS_SHIFT) & CLASS_MASK) as u8
    }

    pub fn generation(self) -> u64 {
        self.0 & GEN_MASK
    }
}

/// A page this node holds: where it is and the word that proves the claim.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub host: NodeId,
    pub page: u64,
    pub word: PageWord,
}

fn word_addr(host: NodeId, page: u64) -> RemoteAddr {
    RemoteAddr::new(host, PAGE_REGION, page * 8)
}

/// Claim a free page of `host`'s table (of `pages` pages) for `class`, looking from page `from`
/// onwards and wrapping around, but only while more than `keep` free pages remain in view (the
/// reserve for deletes). `Ok(None)` if no page may be claimed, or if [`MAX_CLAIM_ATTEMPTS`]
/// CASes all lost to other claimers.
pub fn claim_free_page<E: Endpoint>(
    ep: &mut E,
    host: NodeId,
    pages: u64,
    class: u8,
    from: u64,
    keep: u64,
) -> Result<Option<Claim>, FabricError> {
    let mut attempts = 0;
    // Free pages seen and not yet tried, oldest first.
    let mut seen_free: std::collections::VecDeque<(u64, PageWord)> = Default::default();
    let mut buf = vec![0u8; (PAGE_SCAN_CHUNK.min(pages) * 8) as usize];
    let mut scanned = 0;
    while scanned < pages {
        let start = (from + scanned) % pages;
        let n = PAGE_SCAN_CHUNK.min(pages - start).min(pages - scanned);
        let chunk = &mut buf[..(n * 8) as usize];
        ep.read(word_addr(host, start), chunk)?;
        for (i, w) in chunk.chunks_exact(8).enumerate() {
            let word = PageWord(u64::from_le_bytes(w.try_into().unwrap()));
            if !word.is_claimed() {
                seen_free.push_back((start + i as u64, word));
            }
            while seen_free.len() as u64 > keep {
                let (page, seen) = seen_free.pop_front().expect("non-empty");
                let want = PageWord::claimed_after(seen, ep.node(), class);
                if ep.compare_and_swap(word_addr(host, page), seen.0, want.0)? == seen.0 {
                    return Ok(Some(Claim {
                        host,
                        page,
                        word: want,
                    }));
                }
                attempts += 1;
                if attempts >= MAX_CLAIM_ATTEMPTS {
                    return Ok(None);
                }
            }
        }
        scanned += n;
    }
    Ok(None)
}

/// Give a claimed page back. Returns false (and changes nothing) if the page word is no longer
/// `claim.word`, which would mean another node took the page from us: a broken invariant the
/// caller must report.
pub fn release_page<E: Endpoint>(ep: &mut E, claim: &Claim) -> Result<bool, FabricError> {
    debug_assert!(claim.word.is_claimed());
    let free = PageWord::free(claim.word.generation());
    let found = ep.compare_and_swap(word_addr(claim.host, claim.page), claim.word.0, free.0)?;
    Ok(found == claim.word.0)
}

/// Every page word of `host`'s table, for `nessie status` and for tests.
pub fn read_table<E: Endpoint>(
    ep: &mut E,
    host: NodeId,
    pages: u64,
) -> Result<Vec<PageWord>, FabricError> {
    let mut words = Vec::with_capacity(pages as usize);
    let mut buf = vec![0u8; (PAGE_SCAN_CHUNK.min(pages) * 8) as usize];
    let mut start = 0;
    while start < pages {
        let n = PAGE_SCAN_CHUNK.min(pages - start);
        let chunk = &mut buf[..(n * 8) as usize];
        ep.read(word_addr(host, start), chunk)?;
        words.extend(
            chunk
                .chunks_exact(8)
                .map(|w| PageWord(u64::from_le_bytes(w.try_into().unwrap()))),
        );
        start += n;
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nessie_fabric::inproc::InProcFabric;
    use std::sync::Arc;

    /// Two nodes, each with an index, a data and a page table of `pages` words.
    fn fabric(pages: u64) -> Arc<InProcFabric> {
        let node = vec![8, 8, pages * 8];
        InProcFabric::new(&[node.clone(), node], None).unwrap()
    }

    #[test]
    fn page_words_round_trip() {
        let w = PageWord::claimed_after(PageWord::free(41), 4095, 63);
        assert!(w.is_claimed());
        assert_eq!((w.claimer(), w.class(), w.generation()), (4095, 63, 42));
        let f = PageWord::free(w.generation());
        assert!(!f.is_claimed());
        assert_eq!(f.generation(), 42);
        assert_eq!(PageWord(0), PageWord::free(0), "zeroed memory is free");
        let wrapped = PageWord::claimed_after(PageWord::free(GEN_MASK), 1, 1);
        assert_eq!(
            wrapped.generation(),
            0,
            "the generation wraps inside its field"
        );
        assert_eq!(wrapped.claimer(), 1);
    }

    #[test]
    fn claims_take_free_pages_and_releases_return_them() {
        let f = fabric(4);
        let mut a = f.endpoint(0);
        let mut b = f.endpoint(1);
        let c1 = claim_free_page(&mut a, 1, 4, 3, 2, 0).unwrap().unwrap();
        assert_eq!((c1.host, c1.page), (1, 2), "the search starts at the hint");
        let c2 = claim_free_page(&mut b, 1, 4, 5, 2, 0).unwrap().unwrap();
        assert_eq!(c2.page, 3);
        let c3 = claim_free_page(&mut b, 1, 4, 5, 2, 0).unwrap().unwrap();
        assert_eq!(c3.page, 0, "the search wraps around");
        let table = read_table(&mut a, 1, 4).unwrap();
        assert_eq!((table[2].claimer(), table[2].class()), (0, 3));
        assert_eq!((table[3].claimer(), table[3].class()), (1, 5));
        assert!(!table[1].is_claimed());
        claim_free_page(&mut a, 1, 4, 0, 0, 0).unwrap().unwrap();
        assert_eq!(
            claim_free_page(&mut a, 1, 4, 0, 0, 0).unwrap(),
            None,
            "all claimed"
        );

        assert!(release_page(&mut a, &c1).unwrap());
        assert!(
            !release_page(&mut a, &c1).unwrap(),
            "a stale claim cannot release"
        );
        let again = claim_free_page(&mut b, 1, 4, 7, 0, 0).unwrap().unwrap();
        assert_eq!(again.page, 2);
        assert_eq!(again.word.generation(), 2, "the generation moved on");
    }

    #[test]
    fn the_last_free_pages_are_kept_for_whoever_may_take_them() {
        let f = fabric(3);
        let mut ep = f.endpoint(0);
        assert!(claim_free_page(&mut ep, 0, 3, 1, 0, 1).unwrap().is_some());
        assert!(claim_free_page(&mut ep, 0, 3, 1, 0, 1).unwrap().is_some());
        assert_eq!(
            claim_free_page(&mut ep, 0, 3, 1, 0, 1).unwrap(),
            None,
            "one page is kept back"
        );
        assert!(claim_free_page(&mut ep, 0, 3, 1, 0, 0).unwrap().is_some());
    }

    #[test]
    fn tables_larger_than_one_scan_chunk_are_searched_whole() {
        let pages = PAGE_SCAN_CHUNK * 2 + 3;
        let f = fabric(pages);
        let mut ep = f.endpoint(0);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..pages {
            let c = claim_free_page(&mut ep, 0, pages, 1, 7, 0)
                .unwrap()
                .unwrap();
            assert!(seen.insert(c.page), "page {} claimed twice", c.page);
        }
        assert_eq!(claim_free_page(&mut ep, 0, pages, 1, 7, 0).unwrap(), None);
        assert_eq!(read_table(&mut ep, 0, pages).unwrap().len(), pages as usize);
    }

    #[test]
    fn concurrent_claimers_never_share_a_page() {
        let pages = 200;
        let f = fabric(pages);
        let threads: Vec<_> = (0..4u16)
            .map(|t| {
                let mut ep = f.endpoint(t % 2);
                std::thread::spawn(move || {
                    let mut mine = Vec::new();
                    while let Some(c) = claim_free_page(&mut ep, 1, pages, t as u8, 0, 0).unwrap() {
                        mine.push(c);
                    }
                    mine
                })
            })
            .collect();
        let claims: Vec<Claim> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        let mut pages_taken: Vec<u64> = claims.iter().map(|c| c.page).collect();
        pages_taken.sort();
        pages_taken.dedup();
        assert_eq!(pages_taken.len(), claims.len(), "a page was claimed twice");
        let table = read_table(&mut f.endpoint(0), 1, pages).unwrap();
        for c in &claims {
            assert_eq!(
                table[c.page as usize], c.word,
                "the table holds the winner's word"
            );
        }
    }
}

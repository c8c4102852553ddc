//! MIGRATE (Appendix A.1.4): free one of a key's candidate ITEs by moving the entry in it to
//! one of that entry's own alternative candidates, recursively up to a configured depth.
//!
//! Step 2 reads the source: empty (freed concurrently) or now holding the migrating key means
//! there is nothing to do; an invalid DTE means a write is in progress (abort). Step 4 picks the
//! first alternative candidate of the moved key that is not on the migration path (the
//! migrating key's own candidates and every source so far, so chains never cycle). We prefer
//! an alternative that is already empty and recurse into the first one only when all are
//! occupied; the paper always takes the first alternative, but PUT fills candidates in order,
//! so an entry sitting in its second candidate usually finds its first one still occupied and
//! chains grow long even at a load factor of 0.4. A recursive MIGRATE empties the chosen
//! destination when needed. Step 5 copies the entry into a new, invalid
//! local DTE whose previous version is the source ITE (so GETs meeting the copy still find the
//! value). Step 6 CASes the copy into the destination; Step 7 CASes the source to empty — if
//! that fails, the copy is taken out of the destination again (and recycled if we managed to).
//! Step 8 sets the copy valid and Step 9 recycles the source's DTE.
//!
//! The paper always takes the first candidate as the source; when that source has no
//! destination off the path we try the next candidate rather than fail the PUT.

use nessie_fabric::Endpoint;
use nessie_store::index::{KeyHashes, Slot};
use nessie_store::Ite;

use super::access::Want;
use super::{Abort, Attempt, CdClient};
use crate::error::Error;
use crate::hooks::HookPoint;

impl<E: Endpoint> CdClient<E> {
    /// Make room among `key`'s candidates (PUT Step 2.4).
    pub(crate) fn migrate_for(&mut self, key: &[u8], h: &mut KeyHashes<'_>) -> Attempt<()> {
        let index = self.view.index.clone();
        let candidates = h.all(&index);
        for &src in &candidates {
            let mut path = candidates.clone();
            match self.migrate(src, key, &mut path, 0) {
                Err(Abort::NoDestination) => continue,
                r => return r,
            }
        }
        Err(Abort::Fatal(Error::IndexFull {
            depth: self.cfg.max_migrate_depth,
        }))
    }

    /// Empty `src` (one of the candidates of `key`) by moving its entry elsewhere.
    fn migrate(&mut self, src: Slot, key: &[u8], path: &mut Vec<Slot>, depth: u8) -> Attempt<()> {
        if depth > self.cfg.max_migrate_depth {
            return Err(Abort::Fatal(Error::IndexFull {
                depth: self.cfg.max_migrate_depth,
            }));
        }
        let d = self.deadline(); // Step 0
        let index = self.view.index.clone();

        // Step 2: read the source.
        let (src_ite, t) = self.read_ite(src)?;
        self.check(&d)?;
        if src_ite.is_empty() {
            return Ok(()); // 2.1: freed concurrently
        }
        let f = self.fetch(src_ite, t, &d, key, Want::ValueIfValid)?;
        if f.key_matches {
            return Ok(()); // 2.3: the key itself landed here concurrently
        }
        if !f.meta.valid {
            return Err(Abort::Concurrent("migrate source is being written")); // 2.4
        }
        let moved_key = self.view.dte.key(&self.buf, &f.meta).to_vec();
        let moved_value = self.value_of(&f);
        let filter = index.ite.filter(src_ite);

        // Steps 3 and 4: the destination, off the migration path: the first empty alternative
        // if there is one, else the first alternative (emptied by a recursive MIGRATE).
        path.push(src);
        let mut hs = index.hashes(&moved_key);
        let alternatives: Vec<Slot> = (0..index.n)
            .map(|i| hs.slot(&index, i))
            .filter(|s| !path.contains(s))
            .collect();
        if alternatives.is_empty() {
            return Err(Abort::NoDestination);
        }
        let mut dst = None;
        for &alt in &alternatives {
            self.check(&d)?;
            let (ite, _) = self.read_ite(alt)?;
            if ite.is_empty() {
                dst = Some(alt);
                break;
            }
        }
        self.check(&d)?;
        let dst = match dst {
            Some(s) => s,
            None => {
                let s = alternatives[0];
                self.migrate(s, &moved_key, path, depth + 1)?; // 4.2
                s
            }
        };

        // Step 5: an invalid local copy whose previous version is the source.
        let (copy, idx, _) = self.write_new_dte(filter, src_ite, &moved_key, Some(&moved_value))?;
        if let Err(e) = self.check(&d) {
            self.table.release_unpublished(idx);
            return Err(e);
        }
        // Step 6: publish the copy in the (empty) destination.
        if !self.cas_ite(dst, Ite::EMPTY, copy)? {
            self.table.release_unpublished(idx);
            return Err(Abort::Concurrent("migrate destination changed"));
        }
        self.hook(HookPoint::MigrateAfterDstCas);

        // Step 7: empty the source; on failure take the copy back out of the destination.
        let moved = match self.check(&d) {
            Ok(()) if self.cas_ite(src, src_ite, Ite::EMPTY)? => Ok(()),
            Ok(()) => Err(Abort::Concurrent("migrate source changed")),
            Err(e) => Err(e),
        };
        if let Err(e) = moved {
            if self.cas_ite(dst, copy, Ite::EMPTY)? {
                self.recycle(copy);
            }
            return Err(e);
        }

        // Steps 8 and 9.
        self.set_valid(copy)?;
        self.stats.migrations += 1;
        if depth > 0 {
            self.stats.recursive_migrations += 1;
        }
        self.recycle(src_ite);
        Ok(())
    }
}

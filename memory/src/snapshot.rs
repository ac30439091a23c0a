//! Named snapshots (slime's TensorBackuper: `actor`, `ref`, `rollout_actor`): CPU copies of the
//! regions with some tags, restorable into the same regions by name.
//!
//! Policy: snapshotting or restoring a paused region is an error (`Paused`), as is a region
//! borrowed by a view (`Borrowed`). Taking a snapshot under an existing name replaces it and
//! reuses its buffers when the regions match (no fresh page faults). Restoring a snapshot whose
//! region was freed is a `StaleSnapshot` error. All checks happen before any byte moves.

use std::sync::Arc;

use crate::error::{MemoryError, Result};
use crate::manager::MemoryManager;
use crate::region::RegionCell;
use crate::sys::{self, Mapping};
use crate::tag::Tag;

/// One region's copy inside a snapshot.
#[derive(Debug)]
pub(crate) struct Entry {
    id: u64,
    tag: Tag,
    buf: Mapping,
}

/// A named set of region copies.
#[derive(Debug)]
pub(crate) struct Snapshot {
    tags: Vec<Tag>,
    entries: Vec<Entry>,
}

impl Snapshot {
    pub(crate) fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.buf.len() as u64).sum()
    }
}

/// What `list_snapshots` shows about one snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Its name.
    pub name: String,
    /// The tags it was taken of.
    pub tags: Vec<Tag>,
    /// Number of regions copied.
    pub regions: usize,
    /// CPU bytes it holds.
    pub bytes: u64,
}

impl MemoryManager {
    /// Copies every region with one of `tags` into the snapshot `name` (replacing an older one).
    /// Fails if no region has those tags, or one is paused or borrowed.
    pub fn snapshot(&self, name: &str, tags: &[Tag]) -> Result<SnapshotInfo> {
        if name.is_empty() {
            return Err(MemoryError::InvalidArgument(
                "snapshot name is empty".into(),
            ));
        }
        let mut st = self.inner.lock();
        let cells = st.select(tags);
        if cells.is_empty() {
            let names: Vec<String> = tags.iter().map(Tag::to_string).collect();
            return Err(MemoryError::InvalidArgument(format!(
                "snapshot `{name}`: no region has tag(s) [{}]; allocate them first",
                names.join(", ")
            )));
        }
        let locks = exclusive_resident(&cells, "snapshotting it")?;
        let mut old = st
            .snapshots
            .remove(name)
            .map(|s| s.entries)
            .unwrap_or_default();
        let mut entries = Vec::with_capacity(cells.len());
        for c in &cells {
            let len = c.map.len();
            let reuse = old.iter().position(|e| e.id == c.id && e.buf.len() == len);
            let buf = match reuse {
                Some(i) => old.swap_remove(i).buf,
                None => Mapping::anonymous(len)?,
            };
            // SAFETY: we hold the region's write lock (no views), and `buf` is ours alone.
            unsafe { sys::copy(&buf, &c.map, len) };
            entries.push(Entry {
                id: c.id,
                tag: c.spec.tag.clone(),
                buf,
            });
        }
        drop(locks);
        let snap = Snapshot {
            tags: tags.to_vec(),
            entries,
        };
        let info = info(name, &snap);
        st.snapshots.insert(name.to_string(), snap);
        Ok(info)
    }

    /// Copies snapshot `name` back into its regions (same addresses). Errors: unknown name, a
    /// freed region, a paused or borrowed region.
    pub fn restore(&self, name: &str) -> Result<SnapshotInfo> {
        let st = self.inner.lock();
        let snap = st
            .snapshots
            .get(name)
            .ok_or_else(|| MemoryError::UnknownSnapshot {
                name: name.to_string(),
                known: st.snapshots.keys().cloned().collect::<Vec<_>>().join(", "),
            })?;
        let mut cells = Vec::with_capacity(snap.entries.len());
        for e in &snap.entries {
            let cell = st
                .regions
                .get(&e.id)
                .ok_or_else(|| MemoryError::StaleSnapshot {
                    name: name.to_string(),
                    id: e.id,
                    tag: e.tag.to_string(),
                })?;
            cells.push(Arc::clone(cell));
        }
        let locks = exclusive_resident(&cells, "restoring a snapshot into it")?;
        for (c, e) in cells.iter().zip(&snap.entries) {
            // SAFETY: we hold the region's write lock; the snapshot buffer is only written by
            // `snapshot`, which needs the manager lock we hold.
            unsafe { sys::copy(&c.map, &e.buf, c.map.len()) };
        }
        drop(locks);
        Ok(info(name, snap))
    }

    /// Frees snapshot `name`; unknown names are an error.
    pub fn drop_snapshot(&self, name: &str) -> Result<()> {
        let mut st = self.inner.lock();
        if st.snapshots.remove(name).is_none() {
            return Err(MemoryError::UnknownSnapshot {
                name: name.to_string(),
                known: st.snapshots.keys().cloned().collect::<Vec<_>>().join(", "),
            });
        }
        Ok(())
    }

    /// All snapshots, by name.
    pub fn list_snapshots(&self) -> Vec<SnapshotInfo> {
        let st = self.inner.lock();
        st.snapshots.iter().map(|(n, s)| info(n, s)).collect()
    }
}

fn info(name: &str, s: &Snapshot) -> SnapshotInfo {
    SnapshotInfo {
        name: name.to_string(),
        tags: s.tags.clone(),
        regions: s.entries.len(),
        bytes: s.bytes(),
    }
}

/// Write-locks every cell and checks it is resident.
fn exclusive_resident<'a>(
    cells: &'a [Arc<RegionCell>],
    action: &'static str,
) -> Result<Vec<std::sync::RwLockWriteGuard<'a, crate::region::Residency>>> {
    let mut locks = Vec::with_capacity(cells.len());
    for c in cells {
        let g = c.lock_exclusive()?;
        if g.paused {
            return Err(MemoryError::Paused {
                id: c.id,
                tag: c.spec.tag.to_string(),
                action,
            });
        }
        locks.push(g);
    }
    Ok(locks)
}

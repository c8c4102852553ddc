//! The cluster view: what every client and server of a cluster derives from its geometry (the
//! index placement, the DTE layout, the size classes). Every mode's clients share one; it is
//! built once per cluster by `nessie_deploy::Plan`.

use std::sync::Arc;

use nessie_fabric::NodeId;
use nessie_store::classes::{DteField, SizeClasses};
use nessie_store::classtable::ClassTable;
use nessie_store::dte::DteLayout;
use nessie_store::index::Index;
use nessie_store::Geometry;

use crate::error::Error;

/// What every client of a cluster shares: the geometry and what is derived from it.
#[derive(Clone, Debug)]
pub struct ClusterView {
    pub geometry: Geometry,
    pub index: Index,
    pub dte: DteLayout,
    pub classes: Arc<SizeClasses>,
    /// How an ITE's DTE field names a class and slot.
    pub field: DteField,
    /// Bytes of one node's data table (every DTE an ITE names lies within it).
    pub data_table_bytes: u64,
}

impl ClusterView {
    /// The view with the decoupled index (Nessie's).
    pub fn new(geometry: Geometry) -> Result<Self, Error> {
        let (ite, dte) = geometry
            .validate()
            .map_err(|e| Error::Config(e.to_string()))?;
        let index = Index::new(&geometry, ite);
        Self::with_index(geometry, index, dte)
    }

    /// The view with the coupled index (a key's entries on its owner: the baselines SD, HY
    /// and Pilaf).
    pub fn coupled(geometry: Geometry) -> Result<Self, Error> {
        let (ite, dte) = geometry
            .validate()
            .map_err(|e| Error::Config(e.to_string()))?;
        let index = Index::new_coupled(&geometry, ite).map_err(|e| Error::Config(e.to_string()))?;
        Self::with_index(geometry, index, dte)
    }

    /// The view of `geometry` with the given index placement.
    pub fn with_index(geometry: Geometry, index: Index, dte: DteLayout) -> Result<Self, Error> {
        let config = |e: nessie_store::GeometryError| Error::Config(e.to_string());
        let classes = Arc::new(geometry.classes().map_err(config)?);
        Ok(Self {
            data_table_bytes: geometry.data_pages_per_node() * classes.page_bytes(),
            classes,
            field: geometry.dte_field().map_err(config)?,
            index,
            geometry,
            dte,
        })
    }

    /// Whether `ite`, a present word, names a DTE that exists: a node of the cluster, a size
    /// class, and a slot that lies within that node's data table. Checked before an ITE is
    /// installed by a CAS.
    pub fn names_a_dte(&self, ite: nessie_store::Ite) -> bool {
        let l = &self.index.ite;
        let (class, slot) = self.field.decode(l.dte(ite));
        (l.dti(ite) as u64) < self.geometry.nodes as u64
            && (class as usize) < self.classes.len()
            && self.classes.offset(class, slot) + self.classes.entry_size(class)
                <= self.data_table_bytes
    }

    /// The data table allocator of `node`, shared by the node's client workers. With the
    /// coupled index (SD, HY) the owner's server writes every DTE, and keeps it on its node.
    pub fn class_table(&self, node: NodeId, clock_margin_ns: u64) -> ClassTable {
        let t = ClassTable::new(
            node,
            self.geometry.nodes as usize,
            self.classes.clone(),
            self.geometry.data_pages_per_node(),
            clock_margin_ns,
        );
        match self.index.placement {
            nessie_store::index::Placement::Decoupled => t,
            nessie_store::index::Placement::Coupled => t.local_only(),
        }
    }
}

//! The protocol's optimisations as command-line switches (all on by default), shared by
//! `nessie up` and `nessie bench`: for experiments, and for tests that race with each one off.

use nessie_protocols::Optimizations;

#[derive(clap::Args, Debug, Clone, Default)]
pub struct OptimizationArgs {
    /// Turn off filter bits.
    #[arg(long)]
    pub no_filter_bits: bool,
    /// Turn off the cache.
    #[arg(long)]
    pub no_cache: bool,
    /// Turn off previous versions.
    #[arg(long)]
    pub no_previous_versions: bool,
    /// Turn off multi-read.
    #[arg(long)]
    pub no_multi_read: bool,
}

impl OptimizationArgs {
    pub fn optimizations(&self) -> Optimizations {
        Optimizations {
            filter_bits: !self.no_filter_bits,
            cache: !self.no_cache,
            previous_versions: !self.no_previous_versions,
            multi_read: !self.no_multi_read,
        }
    }
}

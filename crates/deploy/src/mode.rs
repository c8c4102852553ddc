//! Which protocol a cluster runs.

use nessie_baselines::{hy, sd};
use nessie_protocols::{ConfigError, ProtocolConfig, RetryPolicy};

/// Which protocol a cluster runs (fixed per cluster: SD and HY need the coupled index and the
/// request/response regions).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Nessie: client-driven, decoupled index.
    #[default]
    Cd,
    /// NessieSD: server-driven, coupled index, `server_threads` polling threads per node.
    Sd { server_threads: u16 },
    /// NessieHY: client-driven GET, server-driven PUT/DELETE, coupled index.
    Hy { server_threads: u16 },
    /// Pilaf: client-driven GET verified by CRC64, server-driven PUT/DELETE into the owner's
    /// own hash table and extents (`nessie_baselines::pilaf`).
    Pilaf { server_threads: u16 },
}

impl Mode {
    /// Where a key's index entries live in this mode.
    pub fn placement(&self) -> nessie_store::index::Placement {
        match self {
            Mode::Cd => nessie_store::index::Placement::Decoupled,
            // Pilaf uses the coupled index's owner hash to route keys to nodes.
            Mode::Sd { .. } | Mode::Hy { .. } | Mode::Pilaf { .. } => {
                nessie_store::index::Placement::Coupled
            }
        }
    }

    /// Server threads per node (0 for CD).
    pub fn server_threads(&self) -> u16 {
        match *self {
            Mode::Cd => 0,
            Mode::Sd { server_threads }
            | Mode::Hy { server_threads }
            | Mode::Pilaf { server_threads } => server_threads,
        }
    }

    /// The protocol configuration the server threads execute with: the mode's, with the
    /// server's non-sleeping retries ([`RetryPolicy::SERVER`]).
    pub fn server_config(&self, cfg: &ProtocolConfig) -> ProtocolConfig {
        let mode_cfg = match self {
            Mode::Hy { .. } => hy::hy_config(cfg),
            // Every DTE a server touches is local, so a cache would never be consulted.
            _ => ProtocolConfig {
                cache_entries: 0,
                ..cfg.clone()
            },
        };
        ProtocolConfig {
            retry: RetryPolicy::SERVER,
            ..mode_cfg
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Mode::Cd => "cd",
            Mode::Sd { .. } => "sd",
            Mode::Hy { .. } => "hy",
            Mode::Pilaf { .. } => "pilaf",
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let t = self.server_threads();
        if *self != Mode::Cd && !(1..=sd::MAX_SERVER_THREADS).contains(&t) {
            return Err(ConfigError::ServerThreads {
                got: t,
                max: sd::MAX_SERVER_THREADS,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nessie_protocols::Optimizations;

    /// Server threads never sleep long on a conflict (every slot they serve would wait), and
    /// keep at least the clients' patience; the rest of the configuration is the mode's.
    #[test]
    fn server_threads_retry_without_sleeping() {
        let cfg = ProtocolConfig::default();
        for mode in [
            Mode::Sd { server_threads: 2 },
            Mode::Hy { server_threads: 2 },
        ] {
            let s = mode.server_config(&cfg);
            assert!(s.retry.max_backoff_ns <= 10_000, "{mode:?}");
            let patience = |r: RetryPolicy| r.max_attempts as u64 * r.max_backoff_ns;
            assert!(patience(s.retry) >= patience(cfg.retry) / 10, "{mode:?}");
            assert_eq!((s.cache_entries, s.expiry_ns), (0, cfg.expiry_ns));
        }
        let hy = Mode::Hy { server_threads: 1 }.server_config(&cfg);
        assert_eq!(hy.optimizations, Optimizations::NONE);
    }

    #[test]
    fn server_threads_out_of_range_are_refused_by_name() {
        assert!(Mode::Cd.validate().is_ok());
        let e = Mode::Sd { server_threads: 0 }.validate().unwrap_err();
        assert!(e.to_string().contains("server_threads = 0"), "{e}");
        let over = sd::MAX_SERVER_THREADS + 1;
        let e = Mode::Pilaf {
            server_threads: over,
        }
        .validate()
        .unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("1..={}", sd::MAX_SERVER_THREADS)),
            "{e}"
        );
    }
}

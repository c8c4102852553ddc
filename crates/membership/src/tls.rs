//! TLS for the etcd client: the CA that signed etcd's server certificate, and this client's
//! own certificate and key when etcd asks for one (`--client-cert-auth`).
//!
//! Files are PEM, as etcd's own flags take them (`--trusted-ca-file`, `--cert-file`,
//! `--key-file`). The private key must be readable by its owner only: a key others can read
//! is refused, as ssh refuses one, rather than used.
//!
//! Without a CA file, an `https://` etcd is checked against the public roots ureq carries
//! (webpki-roots); a client certificate needs the CA file, since a private CA is the usual
//! case there.

use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Largest PEM file read (a CA bundle of a few hundred certificates fits well).
pub const MAX_PEM_BYTES: u64 = 1 << 20;

/// Where the TLS material is. All `None`: the public roots, no client certificate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificates to trust for etcd's server certificate.
    pub ca: Option<PathBuf>,
    /// PEM certificate chain this client presents.
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`, mode 0600 or stricter, owned by this user (or root).
    pub key: Option<PathBuf>,
}

/// What is wrong with a set of TLS files, and which setting it is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsProblem {
    /// The setting: `etcd` (the URL), `etcd_ca`, `etcd_cert` or `etcd_key`.
    pub field: &'static str,
    pub why: String,
}

impl std::fmt::Display for TlsProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "membership.{}: {}", self.field, self.why)
    }
}

impl TlsFiles {
    /// Whether any file is given (then the URL must be `https://`).
    pub fn any(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some()
    }

    /// Check what can be checked without reading a file: the URL is `https://` when any file
    /// is given, every path is absolute (nodes and tools start in other directories) and
    /// UTF-8 (`cluster.toml` is text), a certificate comes with its key and the CA.
    pub fn check_shape(&self, url: &str) -> Result<(), TlsProblem> {
        let problem = |field, why: String| Err(TlsProblem { field, why });
        for (field, path) in [
            ("etcd_ca", &self.ca),
            ("etcd_cert", &self.cert),
            ("etcd_key", &self.key),
        ] {
            let Some(p) = path else { continue };
            if p.to_str().is_none() {
                return problem(field, format!("{} is not UTF-8", p.display()));
            }
            if !p.is_absolute() {
                return problem(field, format!("{} is not an absolute path", p.display()));
            }
        }
        if self.any() && !url.starts_with("https://") {
            return problem(
                "etcd",
                format!("TLS files are given, but {url} is not https://"),
            );
        }
        match (&self.cert, &self.key) {
            (Some(_), None) => problem(
                "etcd_key",
                "a client certificate needs its key (--etcd-key)".into(),
            ),
            (None, Some(_)) => problem(
                "etcd_cert",
                "a client key needs its certificate (--etcd-cert)".into(),
            ),
            (Some(_), Some(_)) if self.ca.is_none() => problem(
                "etcd_ca",
                "a client certificate needs the CA that signed etcd's server certificate \
                 too (--etcd-ca)"
                    .into(),
            ),
            _ => Ok(()),
        }
    }

    /// The rustls configuration these files make, or why they make none (naming the setting
    /// and the file). Called only when [`TlsFiles::any`].
    pub fn client_config(&self, url: &str) -> Result<Arc<rustls::ClientConfig>, TlsProblem> {
        self.check_shape(url)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsProblem {
                field: "etcd",
                why: format!("TLS setup: {e}"),
            })?;
        // check_shape: a certificate comes with the CA, so without one there are no files at
        // all, and the caller keeps ureq's own configuration (the public roots).
        let Some(ca) = &self.ca else {
            return Err(TlsProblem {
                field: "etcd_ca",
                why: "no TLS files to make a configuration of".into(),
            });
        };
        let in_ca = |why: String| TlsProblem {
            field: "etcd_ca",
            why,
        };
        let mut roots = rustls::RootCertStore::empty();
        let (added, ignored) = roots.add_parsable_certificates(certificates(ca).map_err(in_ca)?);
        if added == 0 {
            return Err(in_ca(format!(
                "{}: none of its {ignored} certificates is usable as a CA",
                ca.display()
            )));
        }
        let builder = builder.with_root_certificates(roots);
        let config = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let chain = certificates(cert).map_err(|why| TlsProblem {
                    field: "etcd_cert",
                    why,
                })?;
                let key_der = private_key(key).map_err(|why| TlsProblem {
                    field: "etcd_key",
                    why,
                })?;
                builder
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|e| TlsProblem {
                        field: "etcd_key",
                        why: format!("{} does not go with {}: {e}", key.display(), cert.display()),
                    })?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(Arc::new(config))
    }
}

/// The bytes of the regular file `path`, read through one open file (what is checked is
/// what is read), at most [`MAX_PEM_BYTES`]; with `private`, the file must also belong to
/// this user or root and be unreadable by group and others.
fn read_pem(path: &Path, private: bool) -> Result<Vec<u8>, String> {
    let named = |e: std::io::Error| format!("{}: {e}", path.display());
    let file = std::fs::File::open(path).map_err(named)?;
    let meta = file.metadata().map_err(named)?;
    if !meta.is_file() {
        return Err(format!("{}: not a regular file", path.display()));
    }
    if private {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me && meta.uid() != 0 {
            return Err(format!(
                "{}: a private key owned by another user (uid {}); it must be yours",
                path.display(),
                meta.uid()
            ));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(format!(
                "{}: a private key others can read (mode {:04o}); chmod 600 it",
                path.display(),
                meta.mode() & 0o7777
            ));
        }
    }
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(named)?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(format!(
            "{}: more than {MAX_PEM_BYTES} bytes, too large for a PEM file",
            path.display()
        ));
    }
    Ok(bytes)
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read_pem(path, false)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: not PEM certificates: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{}: no certificate in it (expected PEM, -----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(&read_pem(path, true)?).map_err(|e| {
        format!(
            "{}: no unencrypted PEM private key in it ({e}; an encrypted key is not supported)",
            path.display()
        )
    })
}

/// A throwaway PKI made with the `openssl` command, for tests of etcd over TLS: a CA, etcd's
/// server certificate for 127.0.0.1, and a client certificate. Removed on drop.
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    use super::TlsFiles;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    pub struct Pki {
        pub dir: PathBuf,
        /// What a client uses: the CA, its certificate and key (mode 0600).
        pub client: TlsFiles,
    }

    impl Drop for Pki {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    impl Pki {
        /// Make it in `dir` (emptied first); panics if `openssl` fails.
        pub fn make(dir: &Path) -> Pki {
            let _ = std::fs::remove_dir_all(dir);
            std::fs::create_dir_all(dir).unwrap();
            // etcd 3.4's gateway dials etcd itself with the server certificate: both uses.
            let server = "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
                          extendedKeyUsage=serverAuth,clientAuth\n";
            let client = "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n";
            make_certs(dir, "ca", &[("server", server), ("client", client)]);
            Pki {
                dir: dir.to_path_buf(),
                client: TlsFiles {
                    ca: Some(dir.join("ca.pem")),
                    cert: Some(dir.join("client.pem")),
                    key: Some(dir.join("client.key")),
                },
            }
        }

        /// Another CA, which signed nothing of this PKI's: its certificate.
        pub fn stranger_ca(&self) -> Option<PathBuf> {
            make_certs(&self.dir, "stranger", &[]);
            Some(self.dir.join("stranger.pem"))
        }

        /// etcd's flags to serve TLS with this PKI and require client certificates.
        pub fn etcd_args(&self) -> Vec<String> {
            let f = |n: &str| self.dir.join(n).to_string_lossy().into_owned();
            vec![
                "--cert-file".into(),
                f("server.pem"),
                "--key-file".into(),
                f("server.key"),
                "--trusted-ca-file".into(),
                f("ca.pem"),
                "--client-cert-auth".into(),
            ]
        }
    }

    /// Run `openssl ARGS` in `dir`; it must succeed.
    fn openssl(dir: &Path, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl (apt-get install openssl)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// In `dir`: CA `ca`.pem/.key, and for each (name, extensions) a key (mode 0600) and a
    /// certificate that CA signs.
    fn make_certs(dir: &Path, ca: &str, leaves: &[(&str, &str)]) {
        const EC: [&str; 5] = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let (ca_key, ca_pem, ca_subj) = (
            format!("{ca}.key"),
            format!("{ca}.pem"),
            format!("/CN={ca}"),
        );
        let mut args = vec!["req", "-x509"];
        args.extend(EC);
        args.extend([
            "-keyout", &ca_key, "-out", &ca_pem, "-days", "1", "-subj", &ca_subj,
        ]);
        openssl(dir, &args);
        for (name, ext) in leaves {
            let (key, csr, pem, extf, subj) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.pem"),
                format!("{name}.ext"),
                format!("/CN={name}"),
            );
            std::fs::write(dir.join(&extf), ext).unwrap();
            let mut args = vec!["req"];
            args.extend(EC);
            args.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
            openssl(dir, &args);
            openssl(
                dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    &ca_pem,
                    "-CAkey",
                    &ca_key,
                    "-CAcreateserial",
                    "-out",
                    &pem,
                    "-days",
                    "1",
                    "-extfile",
                    &extf,
                ],
            );
            std::fs::set_permissions(
                dir.join(&key),
                std::os::unix::fs::PermissionsExt::from_mode(0o600),
            )
            .unwrap();
        }
    }
}

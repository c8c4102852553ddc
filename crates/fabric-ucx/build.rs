//! Compiles the C shim (csrc/shim.c) against UCX, found with pkg-config (`ucx.pc`, shipped by
//! Debian/Ubuntu's `libucx-dev`).

fn main() {
    println!("cargo:rerun-if-changed=csrc/shim.c");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let ucx = match pkg_config::Config::new()
        .atleast_version("1.12")
        .probe("ucx")
    {
        Ok(lib) => lib,
        Err(e) => panic!(
            "UCX (ucp) development files not found via pkg-config: {e}\n\
             install them with `apt-get install libucx-dev` (Debian/Ubuntu)"
        ),
    };
    let mut build = cc::Build::new();
    build
        .file("csrc/shim.c")
        .warnings(true)
        .flag_if_supported("-Wextra")
        .opt_level(2);
    for p in &ucx.include_paths {
        build.include(p);
    }
    build.compile("nessie_ucx_shim");
}

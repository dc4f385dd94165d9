//! `include/tinynn.h` is what cbindgen makes of this crate now: a change to the C API that is
//! not regenerated into the committed header fails here. To regenerate:
//! `TINYNN_WRITE_HEADER=1 cargo test -p tinynn-capi --test header`.

use std::path::Path;

#[test]
fn the_committed_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).unwrap();
    let bindings = cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen reads the crate");
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let fresh = String::from_utf8(fresh).unwrap();
    let path = dir.join("include/tinynn.h");
    if std::env::var_os("TINYNN_WRITE_HEADER").is_some() {
        std::fs::write(&path, &fresh).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "include/tinynn.h is stale: run TINYNN_WRITE_HEADER=1 cargo test -p tinynn-capi --test header"
    );
}

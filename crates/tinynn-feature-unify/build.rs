//! Empty: the crate's build dependencies exist only to unify the host crates' features (see
//! `Cargo.toml`).
fn main() {}

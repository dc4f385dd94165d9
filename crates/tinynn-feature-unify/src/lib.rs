//! No code: this crate exists for its dependency list (see its `Cargo.toml`). Depending on it
//! makes a separately built artifact (the C library, the Python extension, `tnn` with MPI)
//! resolve the shared dependencies with the same features as the workspace's test build, so
//! cargo reuses those compiled crates instead of building every tinynn library again.

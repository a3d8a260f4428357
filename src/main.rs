//! The `eqfuse` command line; all work happens in the library.
fn main() {}

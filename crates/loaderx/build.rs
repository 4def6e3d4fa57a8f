//! Compiles the SIGBUS-safe copy (`src/guard.c`) used for memory-mapped reads.

fn main() {
    println!("cargo:rerun-if-changed=src/guard.c");
    if std::env::var("CARGO_CFG_UNIX").is_ok() {
        cc::Build::new()
            .file("src/guard.c")
            .warnings(true)
            .compile("loaderx_guard");
    }
}

//! The `tollgate` binary.

fn main() {
    println!("tollgate {}", env!("CARGO_PKG_VERSION"));
}

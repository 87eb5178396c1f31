//! Rebuilds the crate when a migration changes: `sqlx::migrate!` embeds the migrations
//! at compile time, and Cargo does not otherwise know they are inputs.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}

//! The pure rules: plain data in, decisions out. Nothing here touches a socket, a
//! database or the clock, so every rule is a unit test away.

pub mod albums;
pub mod commands;
pub mod dates;
pub mod guard;
pub mod leadership;
pub mod media;
pub mod nul;
pub mod pacing;
pub mod permissions;
pub mod resolver;
pub mod retention;
pub mod revisions;
pub mod routes;
pub mod sessions;
pub mod turns;

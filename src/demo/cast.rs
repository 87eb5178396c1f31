//! The demo's people and chats, as the fake Telegram shows them.

use crate::fake_bot_api::{ChatSpec, UserSpec};

const OLGA_ID: i64 = 111_222_333;
const PRIYA_ID: i64 = 222_333_444;
pub const OLGA_USERNAME: &str = "olga";
/// Olga's direct line with the bot: a private chat's id is its user's.
pub const OWNER_DM_ID: i64 = OLGA_ID;
pub const OPS_GROUP_ID: i64 = -4_000_111;
pub const DEV_ROOM_ID: i64 = -1_004_000_222_333;
pub const DEV_ROOM_TITLE: &str = "Dev room";

pub fn olga() -> UserSpec {
    UserSpec::new(OLGA_ID, "Olga").with_username(OLGA_USERNAME)
}

pub fn priya() -> UserSpec {
    UserSpec::new(PRIYA_ID, "Priya").with_username("priya")
}

/// Olga's direct line with the bot.
pub fn owner_dm() -> ChatSpec {
    ChatSpec::private_with(&olga())
}

/// A team group.
pub fn ops_group() -> ChatSpec {
    ChatSpec::group(OPS_GROUP_ID, "Ops team")
}

/// A group room: Olga with the builder and the reviewer.
pub fn dev_room() -> ChatSpec {
    ChatSpec::supergroup(DEV_ROOM_ID, DEV_ROOM_TITLE)
}

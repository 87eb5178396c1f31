//! One reply at a time in each conversation (a chat, or a topic of a forum), so that the
//! parts of one reply are never interleaved with another's in the chat (DESIGN.md §17:
//! in order per chat). The pacer spaces the sends; this orders the replies.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

/// A chat and its topic.
pub(super) type Conversation = (i64, Option<i32>);

/// Conversations with a reply on its way, each with the lock the next reply waits on.
#[derive(Clone, Default)]
pub(super) struct Turns {
    slots: Arc<Mutex<HashMap<Conversation, Arc<tokio::sync::Mutex<()>>>>>,
}

/// Taking [`Turns`] scans them for slots nobody holds or waits on (left by a wait given up)
/// once there are more than this many.
const FORGET_ABOVE: usize = 64;

/// A conversation's turn: until dropped, no other reply to it is sent.
pub(super) struct Turn {
    guard: Option<OwnedMutexGuard<()>>,
    slot: Arc<tokio::sync::Mutex<()>>,
    conversation: Conversation,
    turns: Turns,
}

impl Turns {
    /// Waits for `conversation`'s turn: for the replies to it that came first.
    pub(super) async fn take(&self, conversation: Conversation) -> Turn {
        let slot = {
            let mut slots = self.slots();
            if slots.len() > FORGET_ABOVE {
                slots.retain(|_, slot| Arc::strong_count(slot) > 1);
            }
            Arc::clone(slots.entry(conversation).or_default())
        };
        let guard = Arc::clone(&slot).lock_owned().await;
        Turn { guard: Some(guard), slot, conversation, turns: self.clone() }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<Conversation, Arc<tokio::sync::Mutex<()>>>> {
        self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    #[cfg(test)]
    fn held(&self) -> usize {
        self.slots().len()
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut slots = self.turns.slots();
        // Nobody else holds or waits on it (clones are made under this lock): forget it.
        if Arc::strong_count(&self.slot) == 2 {
            slots.remove(&self.conversation);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn replies_to_one_conversation_take_turns_and_others_do_not_wait() {
        let turns = Turns::default();
        let first = turns.take((1, None)).await;
        let second = tokio::spawn({
            let turns = turns.clone();
            async move { turns.take((1, None)).await }
        });
        // Another chat, and another topic of the same chat, go at once.
        let other_chat = turns.take((2, None)).await;
        let other_topic = turns.take((1, Some(7))).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!second.is_finished(), "the second reply to chat 1 waits for the first");
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(5), second).await.unwrap().unwrap();
        drop((second, other_chat, other_topic));
        assert_eq!(turns.held(), 0, "a conversation nobody sends to is forgotten");
    }
}

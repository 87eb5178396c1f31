//! A bounded memory of ids seen lately, for what a session or a plugin must recognise
//! again without keeping everything it ever saw.

use std::collections::{HashSet, VecDeque};

/// The newest `KEPT` distinct ids inserted, the oldest forgotten first.
#[derive(Debug, Default)]
pub(crate) struct RecentIds<const KEPT: usize> {
    order: VecDeque<String>,
    members: HashSet<String>,
}

impl<const KEPT: usize> RecentIds<KEPT> {
    /// Remembers `id`; true when it was not remembered already.
    pub(crate) fn insert(&mut self, id: &str) -> bool {
        if !self.members.insert(id.to_owned()) {
            return false;
        }
        self.order.push_back(id.to_owned());
        if self.order.len() > KEPT
            && let Some(oldest) = self.order.pop_front()
        {
            self.members.remove(&oldest);
        }
        true
    }

    pub(crate) fn contains(&self, id: &str) -> bool {
        self.members.contains(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_are_kept_and_the_oldest_forgotten_first() {
        let mut recent = RecentIds::<2>::default();
        assert!(recent.insert("a"));
        assert!(!recent.insert("a"), "already remembered");
        assert!(recent.insert("b"));
        assert!(recent.insert("c"));
        assert!(!recent.contains("a"), "the oldest went first");
        assert!(recent.contains("b") && recent.contains("c"));
        assert!(recent.insert("a"), "forgotten, so new again");
    }
}

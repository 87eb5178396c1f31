//! The demo's voice: one line per thing that happened, with who did it, and a checked claim
//! (`✓`, or `✗` and the demo fails) for everything it says the system did.

use std::fmt::Display;

/// A claim that did not hold: the demo stops and exits non-zero.
#[derive(Debug, thiserror::Error)]
#[error("the demo's claim did not hold: {0}")]
pub struct Broken(pub String);

pub fn title(text: &str) {
    println!("{text}");
}

pub fn step(number: &str, title: &str) {
    println!();
    println!("── {number}. {title}");
}

/// One thing that happened, told by `who` (Telegram, the ledger, an agent, …).
pub fn said(who: &str, what: impl Display) {
    println!("  {who:<13} {what}");
}

/// A further line of what `said` told.
pub fn more(what: impl Display) {
    println!("  {:<13}   {what}", "");
}

/// Checks a claim against the ledger or the fake: `✓ claim` when it holds, else the demo
/// fails with what was found instead.
pub fn check(holds: bool, claim: &str, found: impl FnOnce() -> String) -> Result<(), Broken> {
    if holds {
        println!("  ✓ {claim}");
        Ok(())
    } else {
        let found = found();
        println!("  ✗ {claim}: {found}");
        Err(Broken(format!("{claim}: {found}")))
    }
}

/// The first line of a long text, cut for one line of narration.
pub fn gist(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() <= max {
        line.to_owned()
    } else {
        format!("{}…", line.chars().take(max).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gist_keeps_the_first_line_and_cuts_it() {
        assert_eq!(gist("one\ntwo", 10), "one");
        assert_eq!(gist("abcdefghijkl", 5), "abcde…");
        assert!(check(false, "a claim", || "something else".into()).is_err());
        assert!(check(true, "a claim", String::new).is_ok());
    }
}

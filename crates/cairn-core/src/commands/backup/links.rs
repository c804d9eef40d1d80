//! Hard links: a file with several links is read once; the walker's other links to it wait
//! for that read and take its chunk list.

use std::collections::HashMap;
use std::sync::Mutex;

use super::pending::Slot;
use cairn_format::tree::Chunk;

enum LinkState {
    /// Being read; these slots wait for the content.
    Reading(Vec<Slot>),
    /// Read (`None`: it could not be).
    Done(Option<Vec<Chunk>>),
}

/// What the walker does with a hard-linked file.
pub(super) enum Claim {
    /// The first link seen: read it.
    Read,
    /// Another link is being read; its content will fill the slot.
    Waiting,
    /// Another link was read already.
    Done(Option<Vec<Chunk>>),
}

/// Hard-linked files of one backup, by `(device, inode)`.
#[derive(Default)]
pub(super) struct Links(Mutex<HashMap<(u64, u64), LinkState>>);

impl Links {
    /// Looks a link up; `wait` makes the slot to fill when another link is being read.
    pub fn claim(&self, key: (u64, u64), wait: impl FnOnce() -> Slot) -> Claim {
        let mut map = self.0.lock().expect("links lock");
        match map.get_mut(&key) {
            None => {
                map.insert(key, LinkState::Reading(Vec::new()));
                Claim::Read
            }
            Some(LinkState::Reading(waiting)) => {
                waiting.push(wait());
                Claim::Waiting
            }
            Some(LinkState::Done(content)) => Claim::Done(content.clone()),
        }
    }

    /// Records the content read for `key`; returns the slots that waited for it.
    pub fn finish(&self, key: (u64, u64), content: Option<Vec<Chunk>>) -> Vec<Slot> {
        match self.0.lock().expect("links lock").insert(key, LinkState::Done(content)) {
            Some(LinkState::Reading(waiting)) => waiting,
            _ => Vec::new(),
        }
    }
}

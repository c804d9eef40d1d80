//! What each role may do to each kind of object (FORMAT.md §15): the one place the rules live.

pub use cairn_format::protocol::{Kind, Op};

use crate::tokens::Role;

/// What the server does with a request a role may make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Do it.
    Allow,
    /// Store it only if no object of that name exists; if one does, the request is answered as
    /// done without writing (a content-addressed object of the same name holds the same bytes).
    IfAbsentElseDone,
    /// Store it only if no object of that name exists; refuse otherwise.
    IfAbsent,
    /// A new lock: stored only if absent, and recorded as the token's own.
    NewLock,
    /// Delete a lock only if the token wrote it.
    OwnLock,
    /// Refuse, saying why.
    Deny(String),
}

/// The rule for `role` doing `op` to an object of `kind` (`None` for a listing or create).
pub fn rule(role: Role, op: Op, kind: Option<Kind>) -> Rule {
    use Kind::*;
    let article = if role == Role::Append || role == Role::Admin { "an" } else { "a" };
    let deny = |what: &str| Rule::Deny(format!("{article} {} token may not {what}", role.name()));
    match (op, kind) {
        (Op::Read | Op::List, _) => Rule::Allow,
        (Op::Create, _) if role == Role::Read => deny("create a repository"),
        (Op::Create, _) => Rule::Allow,
        (Op::Write | Op::Delete, None) => Rule::Deny("not an object".into()),
        // An admin may replace anything; a content-addressed object's name is still checked.
        (_, Some(_)) if role == Role::Admin => Rule::Allow,
        (Op::Write, Some(Lock)) => Rule::NewLock,
        (Op::Delete, Some(Lock)) => Rule::OwnLock,
        (_, Some(kind)) if role == Role::Read => deny(&format!("{} {}", op.name(), kind.describe())),
        // Append from here on.
        (Op::Write, Some(Key | Pack | Index | Snapshot)) => Rule::IfAbsentElseDone,
        (Op::Write, Some(Config)) => Rule::IfAbsent,
        (Op::Write | Op::Delete, Some(Hint)) => Rule::Allow,
        (Op::Write, Some(Deletion)) => deny("write a deletion manifest (it would let a prune delete packs)"),
        (Op::Delete, Some(kind)) => deny(&format!("delete {} (it carries history)", kind.describe())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_admin_deletes_history() {
        for kind in Kind::ALL {
            assert_eq!(rule(Role::Admin, Op::Delete, Some(kind)), Rule::Allow);
            assert_eq!(rule(Role::Admin, Op::Write, Some(kind)), Rule::Allow);
            for role in [Role::Read, Role::Append] {
                assert_eq!(rule(role, Op::Read, Some(kind)), Rule::Allow);
                let delete = rule(role, Op::Delete, Some(kind));
                let write = rule(role, Op::Write, Some(kind));
                match kind {
                    Kind::Lock => assert_eq!((delete, write), (Rule::OwnLock, Rule::NewLock)),
                    Kind::Hint if role == Role::Append => assert_eq!((delete, write), (Rule::Allow, Rule::Allow)),
                    _ if role == Role::Read => {
                        assert!(matches!(delete, Rule::Deny(_)) && matches!(write, Rule::Deny(_)), "{kind:?}")
                    }
                    Kind::Config => assert!(matches!(delete, Rule::Deny(_)) && write == Rule::IfAbsent),
                    Kind::Deletion => assert!(matches!(delete, Rule::Deny(_)) && matches!(write, Rule::Deny(_))),
                    _ => assert!(matches!(delete, Rule::Deny(_)) && write == Rule::IfAbsentElseDone, "{kind:?}"),
                }
            }
        }
        assert!(matches!(rule(Role::Read, Op::Create, None), Rule::Deny(_)));
        assert_eq!(rule(Role::Append, Op::Create, None), Rule::Allow);
    }
}

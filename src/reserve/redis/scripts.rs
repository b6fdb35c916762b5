//! Script assembly: each script's source is `lua/lib.lua` followed by its
//! own file (and, for a call sent alone, a one-line driver), so every
//! script carries the same helpers.

use redis::Script;

/// Source of `lua/lib.lua`, the helpers every script starts with.
pub const LIB_LUA: &str = include_str!("../../../lua/lib.lua");
/// Source of the reserve script for a call sent alone (library included;
/// the same `reserve(KEYS, ARGV)` as in [`BATCH_LUA`], without the batch
/// driver's per-item bookkeeping).
pub const RESERVE_LUA: &str = concat!(
    include_str!("../../../lua/lib.lua"),
    "\n",
    include_str!("../../../lua/reserve.lua"),
    "\nlocal reply = reserve(KEYS, ARGV)\nflush()\nreturn words(reply)\n"
);
/// Source of the settle script for a call sent alone (library included).
pub const SETTLE_LUA: &str = concat!(
    include_str!("../../../lua/lib.lua"),
    "\n",
    include_str!("../../../lua/settle.lua"),
    "\nlocal reply = settle(KEYS, ARGV)\nflush()\nreturn words(reply)\n"
);
/// Source of the batch script: the library, `reserve(KEYS, ARGV)`,
/// `settle(KEYS, ARGV)` and the driver that runs a batch of them in order
/// (see `src/reserve/redis/batch.rs`).
pub const BATCH_LUA: &str = concat!(
    include_str!("../../../lua/lib.lua"),
    "\n",
    include_str!("../../../lua/reserve.lua"),
    "\n",
    include_str!("../../../lua/settle.lua"),
    "\n",
    include_str!("../../../lua/batch.lua")
);
/// Source of the extend script (library included).
pub const EXTEND_LUA: &str = concat!(
    include_str!("../../../lua/lib.lua"),
    "\n",
    include_str!("../../../lua/extend.lua")
);
/// Source of the renew script (library included).
pub const RENEW_LUA: &str = concat!(
    include_str!("../../../lua/lib.lua"),
    "\n",
    include_str!("../../../lua/renew.lua")
);
/// Source of the lower script (library included).
pub const LOWER_LUA: &str = concat!(
    include_str!("../../../lua/lib.lua"),
    "\n",
    include_str!("../../../lua/lower.lua")
);
/// Source of the inspect script (library included).
pub const INSPECT_LUA: &str = concat!(
    include_str!("../../../lua/lib.lua"),
    "\n",
    include_str!("../../../lua/inspect.lua")
);

pub(super) struct Scripts {
    pub(super) extend: Script,
    pub(super) renew: Script,
    pub(super) inspect: Script,
    pub(super) lower: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Self {
            extend: Script::new(EXTEND_LUA),
            renew: Script::new(RENEW_LUA),
            inspect: Script::new(INSPECT_LUA),
            lower: Script::new(LOWER_LUA),
        }
    }
}

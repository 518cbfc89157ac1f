//! The scheduler: places weights, assigns every graph node a backend with a
//! reason, cuts the graph into splits with the copies between them, plans
//! each backend's arena, and runs the result. It never computes anything
//! itself: kernels belong to backends.

mod assign;
mod exec;
mod memory;
mod offload;
mod placement;
mod virtual_backend;

pub use assign::{assign, split, Assigned, Copy, NodeReason, Split};
pub use exec::{Backends, CopyTimes, Error, Homes, RunProfile, Schedule};
pub use memory::{plan_memory, MemoryPlan, ARENA_ALIGN};
pub use offload::{CostModel, Mode, OffloadOp, OffloadPolicy, OffloadWhy, PolicyError, Work, OFFLOAD_MIN_BATCH};
pub use placement::{
    layer_of, moe_overrides, CopyKind, HeadCopy, Override, Placement, PlacementRules, RuleError, StagedCopy,
    WeightPlace, WeightReason,
};
pub use virtual_backend::{Supports, VirtualBackend};

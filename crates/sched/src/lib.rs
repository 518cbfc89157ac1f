//! The scheduler: places weights, assigns every graph node a backend with a
//! reason, cuts the graph into splits with the copies between them, plans
//! each backend's arena, and runs the result. It never computes anything
//! itself: kernels belong to backends.

mod assign;
mod exec;
mod memory;
mod placement;
mod virtual_backend;

pub use assign::{assign, split, Assigned, Copy, NodeReason, Split, OFFLOAD_MIN_BATCH};
pub use exec::{Backends, Error, RunProfile, Schedule};
pub use memory::{plan_memory, MemoryPlan, ARENA_ALIGN};
pub use placement::{layer_of, HeadCopy, Override, Placement, PlacementRules, RuleError, WeightPlace, WeightReason};
pub use virtual_backend::{Supports, VirtualBackend};

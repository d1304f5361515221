//! The five scenarios of issue 6. Each one starts its own server, measures every approach on
//! it, and returns its results with a Markdown section and the targets it judges.

pub mod contention;
pub mod deadlines;
pub mod memory;
pub mod scaling;
pub mod throughput;

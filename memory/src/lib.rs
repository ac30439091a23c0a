//! Tandem's memory layer: tagged regions that pause (free physical memory, keep the address)
//! and resume bit-exact, named snapshots, and one ledger per device.

//! Workers started through Slurm: one `srun` step per worker, on the node the job file names
//! for its role and rank. `srun` is the child this controller watches: its exit is the
//! worker's (`--kill-on-bad-exit`), killing it ends the remote task, and its stderr (in the
//! worker's log) names the node. Inside an allocation (`salloc`, `sbatch`) the steps run in
//! it; outside one each `srun` asks for its own. The run token travels in the environment
//! (`--export=ALL`, Slurm's signed RPC), never on the command line.

use crate::worker::WorkerSpec;
use std::net::IpAddr;
use std::path::Path;
use std::process::Command;
use tandem_control::Role;

/// Where and how `srun` starts the workers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlurmOptions {
    /// The node of each engine rank (one name: every rank there; empty: Slurm chooses).
    pub engine_nodes: Vec<String>,
    /// The node of each trainer rank, as for engines.
    pub trainer_nodes: Vec<String>,
    /// `--partition`, if set.
    pub partition: Option<String>,
    /// Extra `srun` arguments, before the command.
    pub srun_args: Vec<String>,
}

impl SlurmOptions {
    /// The node `role` rank `rank` runs on, if the job file names one. A rank past the list
    /// (the drafter trainer after the policy's ranks) goes to the last node named.
    pub fn node(&self, role: Role, rank: u32) -> Option<&str> {
        let nodes = match role {
            Role::Engine => &self.engine_nodes,
            Role::Trainer => &self.trainer_nodes,
        };
        nodes
            .get(rank as usize)
            .or(nodes.last())
            .map(String::as_str)
    }

    /// `srun ... <exe>` for the worker of `spec`; the caller adds the worker's arguments.
    pub fn command(&self, spec: &WorkerSpec, exe: &Path) -> Command {
        let mut cmd = Command::new("srun");
        cmd.args([
            "--nodes=1",
            "--ntasks=1",
            "--kill-on-bad-exit=1",
            "--export=ALL",
        ])
        .arg(format!("--job-name=tandem-{}-{}", spec.role, spec.rank))
        // A worker's threads share one task: no CPU binding that would pin it to one core.
        .arg("--cpu-bind=none")
        // Inside an allocation, a restarted engine starts while the one it replaces still
        // serves (the `checkpoint` bridge health-checks the new one first): steps share.
        .arg("--overlap");
        if let Some(node) = self.node(spec.role, spec.rank) {
            cmd.arg(format!("--nodelist={node}"));
        }
        if let Some(p) = &self.partition {
            cmd.arg(format!("--partition={p}"));
        }
        cmd.args(&self.srun_args).arg(exe);
        cmd
    }
}

/// The address of this machine that routes to `nodes` (their `NodeAddr` from `scontrol show
/// node`): what workers there dial when the job says `advertise = "auto"` — inside an
/// `sbatch` script the controller runs on whichever node Slurm gave the batch step.
pub fn advertise_toward(nodes: &[String]) -> Result<IpAddr, String> {
    let Some(node) = nodes.first() else {
        return Err(
            "advertise = \"auto\" needs the nodes named (engine_nodes, trainer_nodes)".into(),
        );
    };
    let out = Command::new("scontrol")
        .args(["show", "node", "--oneliner", node])
        .output()
        .map_err(|e| format!("running `scontrol show node {node}`: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let addr = text
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("NodeAddr="))
        .filter(|_| out.status.success())
        .ok_or_else(|| {
            format!(
                "`scontrol show node {node}` names no NodeAddr: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })?;
    let ip = super::resolve(addr)
        .ok_or_else(|| format!("node {node}'s NodeAddr `{addr}` does not resolve"))?;
    super::route_toward(ip).map_err(|e| format!("node {node} ({ip}): {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_past_the_list_take_the_last_node_and_an_empty_list_none() {
        let o = SlurmOptions {
            engine_nodes: vec!["n1".into(), "n2".into()],
            trainer_nodes: vec!["n3".into()],
            ..SlurmOptions::default()
        };
        assert_eq!(o.node(Role::Engine, 0), Some("n1"));
        assert_eq!(o.node(Role::Engine, 1), Some("n2"));
        assert_eq!(o.node(Role::Engine, 5), Some("n2"));
        assert_eq!(o.node(Role::Trainer, 1), Some("n3"));
        assert_eq!(SlurmOptions::default().node(Role::Trainer, 0), None);
    }
}

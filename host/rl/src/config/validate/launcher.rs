//! `[launcher]`: the kind and what it needs (`slurm` and `ray`: an advertised address workers
//! can route to, a node list per role of one name or one per rank — Ray's are node IPs —,
//! Ray's bundle resources), settings of one kind under another, and what a placement across
//! hosts rules out: colocated ranks on different nodes, and a bridge that maps the trainer's
//! memory into the engines (`ipc`), which needs one host.

use super::issues::Issues;
use crate::config::{JobFile, LauncherKind, LauncherSection, PlacementMode, RayStrategy};
use std::collections::BTreeSet;
use std::net::IpAddr;
use tandem_plugin_api::UpdateKind;
use tandem_runtime::registry::Registry;

/// The checks; the launcher as `tandem check` prints it.
pub(super) fn check(issues: &mut Issues<'_>, j: &JobFile, registry: &Registry) -> String {
    let l = &j.launcher;
    if let Some(a) = l.advertise.as_ref().filter(|a| *a != "auto") {
        match a.parse::<IpAddr>() {
            Err(_) => issues.at(
                "launcher.advertise",
                format!("`{a}` is not an IP address"),
                "the address of this machine the workers dial, e.g. \"10.0.0.5\", or \"auto\" (slurm: the one that routes to the nodes)",
            ),
            Ok(ip)
                if l.kind != LauncherKind::Local && (ip.is_loopback() || ip.is_unspecified()) =>
            {
                issues.at(
                    "launcher.advertise",
                    format!("{ip} cannot be reached from other nodes"),
                    "give an address of this machine on the network the nodes share",
                )
            }
            Ok(_) => {}
        }
    }
    let slurm_keys = [
        ("launcher.partition", l.partition.is_some()),
        ("launcher.srun_args", !l.srun_args.is_empty()),
    ];
    let ray_keys = [
        ("launcher.address", l.address.is_some()),
        ("launcher.strategy", l.strategy != RayStrategy::default()),
        ("launcher.resources", !l.resources.is_empty()),
        ("launcher.python", l.python.is_some()),
    ];
    let foreign = |issues: &mut Issues<'_>, keys: &[(&str, bool)], of: &str| {
        for (key, set) in keys {
            if *set {
                issues.at(
                    key,
                    format!(
                        "is a {of} setting, but launcher.kind is `{}`",
                        kind_name(l.kind)
                    ),
                    format!("set launcher.kind = \"{}\" or remove it", of.to_lowercase()),
                );
            }
        }
    };
    match l.kind {
        LauncherKind::Local => {
            foreign(issues, &slurm_keys, "Slurm");
            foreign(issues, &ray_keys, "Ray");
            for (key, set) in [
                ("launcher.engine_nodes", !l.engine_nodes.is_empty()),
                ("launcher.trainer_nodes", !l.trainer_nodes.is_empty()),
            ] {
                if set {
                    issues.at(
                        key,
                        "places ranks on nodes, but launcher.kind is `local`",
                        "set launcher.kind = \"slurm\" or \"ray\", or remove it",
                    );
                }
            }
            if l.advertise.as_deref() == Some("auto") {
                issues.at(
                    "launcher.advertise",
                    "\"auto\" is for launcher.kind = \"slurm\" or \"ray\" (the route to the nodes)",
                    "give this machine's address, or remove it (loopback)",
                );
            }
            return "local (workers are children of the controller)".into();
        }
        LauncherKind::Slurm => foreign(issues, &ray_keys, "Ray"),
        LauncherKind::Ray => {
            foreign(issues, &slurm_keys, "Slurm");
            for (key, nodes) in [
                ("launcher.engine_nodes", &l.engine_nodes),
                ("launcher.trainer_nodes", &l.trainer_nodes),
            ] {
                if let Some(bad) = nodes.iter().find(|n| n.parse::<IpAddr>().is_err()) {
                    issues.at(
                        key,
                        format!("`{bad}` is not a node IP"),
                        "Ray places a rank on a node by its IP (its `node:<ip>` resource), e.g. \"10.0.0.7\"",
                    );
                }
            }
            if let Some((name, v)) = l.resources.iter().find(|(_, v)| v.is_nan() || **v <= 0.0) {
                issues.at(
                    "launcher.resources",
                    format!("`{name}` = {v} is not a positive amount"),
                    "each rank's bundle reserves what it names, e.g. { CPU = 1, GPU = 1 }",
                );
            }
        }
    }
    if l.advertise.as_deref() == Some("auto")
        && l.engine_nodes.is_empty()
        && l.trainer_nodes.is_empty()
    {
        let ray_head =
            l.kind == LauncherKind::Ray && l.address.as_deref().is_some_and(|a| a != "auto");
        if !ray_head {
            issues.at(
                "launcher.advertise",
                "\"auto\" finds the address that routes to the nodes, but none are named",
                "name engine_nodes / trainer_nodes, or give this machine's address",
            );
        }
    }
    if l.advertise.is_none() {
        issues.at(
            "launcher.advertise",
            format!("is required with launcher.kind = \"{}\"", kind_name(l.kind)),
            "the address of this machine the nodes dial, e.g. \"10.0.0.5\", or \"auto\"",
        );
    }
    let (engines, trainers) = (j.engine.ranks, j.trainer.ranks);
    for (key, nodes, ranks, role) in [
        ("launcher.engine_nodes", &l.engine_nodes, engines, "engine"),
        (
            "launcher.trainer_nodes",
            &l.trainer_nodes,
            trainers,
            "trainer",
        ),
    ] {
        if nodes.len() > 1 && nodes.len() != ranks as usize {
            issues.at(
                key,
                format!("names {} nodes for {ranks} {role} ranks", nodes.len()),
                "name one node for all of them, or one per rank",
            );
        }
    }
    let node = |nodes: &[String], rank: u32| nodes.get(rank as usize).or(nodes.last()).cloned();
    if j.placement.mode == PlacementMode::Colocate {
        for r in 0..engines.min(trainers) {
            let (e, t) = (node(&l.engine_nodes, r), node(&l.trainer_nodes, r));
            // Ray places unnamed bundles where its strategy says; only STRICT_PACK keeps a
            // colocated pair on one node.
            let ray_may_split =
                l.kind == LauncherKind::Ray && e.is_none() && l.strategy != RayStrategy::StrictPack;
            if e != t || ray_may_split {
                issues.at(
                    "launcher.engine_nodes",
                    format!(
                        "colocated engine rank {r} and trainer rank {r} are on different nodes ({} and {})",
                        e.as_deref().unwrap_or("any"),
                        t.as_deref().unwrap_or("any")
                    ),
                    "put them on one node, or set placement.mode = \"disaggregated\"",
                );
            }
        }
    }
    let named: BTreeSet<Option<String>> = (0..engines)
        .map(|r| node(&l.engine_nodes, r))
        .chain((0..trainers).map(|r| node(&l.trainer_nodes, r)))
        .collect();
    let one_host = (named.len() == 1 && !named.contains(&None))
        || (l.kind == LauncherKind::Ray && l.strategy == RayStrategy::StrictPack);
    let bridge = j.bridge.plugin.get_ref();
    let maps_memory = crate::bridge::resolve(registry, bridge, &j.bridge.options)
        .is_ok_and(|c| c.apply == UpdateKind::SharedRegion);
    if maps_memory && !one_host {
        issues.push(
            super::bridge::plugin_key(issues.job),
            Some(j.bridge.plugin.span()),
            format!(
                "bridge `{bridge}` maps the trainer's weights into the engines, which needs one host, but the [launcher] puts the ranks on {}",
                hosts(l, &named)
            ),
            "use `checkpoint` (a path every node reads) or `broadcast` (tcp between hosts)".into(),
        );
    }
    describe(l)
}

/// `n1 and n2`, `n1 and any node`.
fn hosts(l: &LauncherSection, named: &BTreeSet<Option<String>>) -> String {
    let names: Vec<&str> = named
        .iter()
        .map(|n| n.as_deref().unwrap_or("any node"))
        .collect();
    match names.as_slice() {
        [one] => format!("{one} ({} may choose several)", chooser(l.kind)),
        _ => names.join(" and "),
    }
}

fn kind_name(k: LauncherKind) -> &'static str {
    match k {
        LauncherKind::Local => "local",
        LauncherKind::Slurm => "slurm",
        LauncherKind::Ray => "ray",
    }
}

fn chooser(k: LauncherKind) -> &'static str {
    match k {
        LauncherKind::Ray => "Ray",
        _ => "Slurm",
    }
}

/// `slurm: engines on n1, trainers on n2; workers dial 10.0.0.5`, or for Ray
/// `ray (STRICT_SPREAD, {CPU=1} per rank, cluster auto): engines on ..., ...`.
fn describe(l: &LauncherSection) -> String {
    let list = |nodes: &[String]| {
        if nodes.is_empty() {
            format!("nodes {} chooses", chooser(l.kind))
        } else {
            nodes.join(", ")
        }
    };
    let head = match l.kind {
        LauncherKind::Ray => {
            let res: Vec<String> = l
                .ray_resources()
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            format!(
                "ray ({}, {{{}}} per rank, cluster {})",
                l.strategy.as_str(),
                res.join(", "),
                l.address.as_deref().unwrap_or("auto")
            )
        }
        _ => "slurm".into(),
    };
    format!(
        "{head}: engines on {}, trainers on {}; workers dial {}",
        list(&l.engine_nodes),
        list(&l.trainer_nodes),
        l.advertise.as_deref().unwrap_or("?")
    )
}

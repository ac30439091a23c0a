//! `tandem check`: a valid job resolves to a plan; each kind of bad job file gets one line with
//! the file, the key path and (where known) line:column, and exit code 2.

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::common::*;
use std::path::Path;

const VALID: &str = r#"
[run]
name = "fixture-job"
steps = 3

[placement]
mode = "colocate"
train_frac = 0.4
infer_frac = 0.4

[model]
path = "model"
init_preset = "tiny"

[engine]
plugin = "fixture-alpha"

[trainer]
plugin = "fixture-beta"

[bridge]
mode = "checkpoint"
"#;

fn check(job: &str, json: bool) -> (std::process::Output, tempfile::TempDir, tempfile::TempDir) {
    let plugins = plugin_dir(&[
        (&cdylib("fixture_alpha"), "libtandem_fixture_alpha.so"),
        (&cdylib("fixture_beta"), "libtandem_fixture_beta.so"),
    ]);
    let jobs = tempfile::tempdir().unwrap();
    let path = jobs.path().join("job.toml");
    std::fs::write(&path, job).unwrap();
    let mut cmd = tandem();
    cmd.arg("check")
        .arg(&path)
        .arg("--plugin-dir")
        .arg(plugins.path());
    if json {
        cmd.arg("--json");
    }
    (run(&mut cmd), plugins, jobs)
}

fn one_error(out: &std::process::Output) -> String {
    assert_eq!(out.status.code(), Some(2), "{}", stderr(out));
    let errors = error_lines(out);
    assert_eq!(errors.len(), 1, "{}", stderr(out));
    errors[0].clone()
}

#[test]
fn valid_job_resolves_to_a_plan() {
    let (out, _p, jobs) = check(VALID, true);
    assert!(out.status.success(), "{}", stderr(&out));
    let plan: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(plan["engine"]["component"], "fixture-alpha");
    assert_eq!(plan["trainer"]["plugin"], "fixture-beta");
    assert_eq!(plan["bridge"]["export"], "checkpoint_dir");
    assert_eq!(plan["bridge"]["apply"], "checkpoint_dir");
    assert_eq!(plan["bridge"]["plugin"], "bridges");
    assert_eq!(plan["placement"]["mode"], "colocate");
    assert_eq!(plan["engine"]["ranks"][0]["device"], "cpu");
    assert_eq!(plan["trainer"]["caps"]["update_kinds"][0], "checkpoint_dir");
    let out_dir = plan["output_dir"].as_str().unwrap();
    assert!(
        Path::new(out_dir).starts_with(jobs.path()),
        "relative to the job file: {out_dir}"
    );
}

#[test]
fn unknown_key_names_file_line_and_key() {
    let job = VALID.replace("steps = 3", "steps = 3\nstepz = 4");
    let (out, _p, jobs) = check(&job, false);
    let line = one_error(&out);
    let file = jobs.path().join("job.toml").display().to_string();
    assert!(line.contains(&format!("{file}:5:1")), "{line}");
    assert!(line.contains("unknown field `stepz`"), "{line}");
}

#[test]
fn wrong_type_names_the_key_path() {
    let job = VALID.replace("steps = 3", "steps = \"three\"");
    let (out, _p, _j) = check(&job, false);
    let line = one_error(&out);
    assert!(line.contains(":4:9: run.steps:"), "{line}");
    assert!(line.contains("invalid type"), "{line}");
}

#[test]
fn colocated_fractions_over_budget_are_refused() {
    let job = VALID.replace("infer_frac = 0.4", "infer_frac = 0.55");
    let (out, _p, _j) = check(&job, false);
    let line = one_error(&out);
    assert!(line.contains(":8:14: placement.train_frac:"), "{line}");
    assert!(line.contains("= 1.05 > 1.0 in colocate mode"), "{line}");
    // Disaggregated placement has no shared budget.
    let job = job.replace("mode = \"colocate\"", "mode = \"disaggregated\"");
    let (out, _p, _j) = check(&job, false);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn unknown_plugin_lists_the_known_ones() {
    let job = VALID.replace("plugin = \"fixture-alpha\"", "plugin = \"sglang-typo\"");
    let (out, _p, _j) = check(&job, false);
    let line = one_error(&out);
    assert!(
        line.contains("engine.plugin: unknown engine plugin `sglang-typo`"),
        "{line}"
    );
    assert!(
        line.contains("known engines: fixture-alpha, fixture-beta"),
        "{line}"
    );
}

#[test]
fn bridge_mode_not_declared_by_the_components_is_refused() {
    let job = VALID.replace("mode = \"checkpoint\"", "mode = \"ipc\"");
    let (out, _p, _j) = check(&job, false);
    assert_eq!(out.status.code(), Some(2));
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 2, "trainer and engine: {}", stderr(&out));
    assert!(
        errors[0].contains("bridge `ipc` needs the trainer to export shared_region updates, which trainer `fixture-beta`"),
        "{}",
        errors[0]
    );
    assert!(
        errors[1].contains("bridge `ipc` needs the engine to apply shared_region updates, which engine `fixture-alpha` does not declare (it declares: checkpoint_dir)"),
        "{}",
        errors[1]
    );
    let job = VALID.replace("mode = \"checkpoint\"", "mode = \"carrier-pigeon\"");
    let (out, _p, _j) = check(&job, false);
    let line = one_error(&out);
    assert!(
        line.contains("bridge.mode: no loaded plugin provides the bridge `carrier-pigeon`")
            && line.contains("loaded bridges: broadcast, checkpoint, ipc, lora"),
        "{line}"
    );
}

#[test]
fn toml_syntax_error_is_one_line_with_position() {
    let (out, _p, _j) = check("[run\nname = 1", false);
    let line = one_error(&out);
    assert!(line.contains("job.toml:1:"), "{line}");
}

#[test]
fn missing_job_file_is_one_line() {
    let out = run(tandem().args(["check", "/nonexistent/job.toml"]));
    let line = one_error(&out);
    assert!(
        line.contains("/nonexistent/job.toml: cannot read job file"),
        "{line}"
    );
}

#[test]
fn bad_task_settings_are_one_line_naming_the_key() {
    let job = format!("{VALID}\n[task]\nkind = \"chess\"\n");
    let (out, _p, _j) = check(&job, false);
    let line = one_error(&out);
    assert!(
        line.contains("task.kind: no plugin provides the environment `chess`")
            && line.contains("arithmetic")
            && line.contains("word_problems"),
        "{line}"
    );
    let job = format!("{VALID}\n[task]\nkind = \"arithmetic\"\n[task.options]\nmax_operand = 0\n");
    let (out, _p, _j) = check(&job, false);
    let line = one_error(&out);
    assert!(line.contains("task.options.max_operand"), "{line}");
    let job = VALID.replace("[bridge]", "[algorithm]\ngroup_size = 1\n\n[bridge]");
    let (out, _p, _j) = check(&job, false);
    let line = one_error(&out);
    assert!(
        line.contains("algorithm.group_size") && line.contains("at least 2"),
        "{line}"
    );
}

/// The valid job on the native engine and trainer, colocated or disaggregated.
fn native(colocated: bool) -> String {
    let j = VALID
        .replace("fixture-alpha", "native")
        .replace("fixture-beta", "native");
    if colocated {
        j
    } else {
        j.replace("mode = \"colocate\"", "mode = \"disaggregated\"")
    }
}

/// `job` is refused (exit 2) with an error line containing `want`.
fn assert_refused(job: &str, want: &str) {
    let (out, _p, _j) = check(job, false);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let errors = error_lines(&out);
    assert!(
        errors.iter().any(|e| e.contains(want)),
        "{want}: {errors:?}"
    );
}

#[test]
fn launcher_settings_and_what_two_hosts_rule_out_are_one_line_each() {
    let base = native(false);
    let slurm = "\n[launcher]\nkind = \"slurm\"\nadvertise = \"10.0.0.5\"\nengine_nodes = [\"n1\"]\ntrainer_nodes = [\"n2\"]\n";
    // Engine on n1, trainer on n2: the plan names the nodes and picks tcp between them.
    let (out, _p, _j) = check(&format!("{base}{slurm}"), false);
    assert!(out.status.success(), "{}", stderr(&out));
    let plan = stdout(&out);
    assert!(
        plan.contains("launcher   slurm: engines on n1, trainers on n2; workers dial 10.0.0.5"),
        "{plan}"
    );
    assert!(plan.contains("pair0 [1, 0]: tcp"), "{plan}");
    // ipc maps the trainer's memory into the engines: one host only.
    let ipc = base.replace("mode = \"checkpoint\"", "mode = \"ipc\"");
    let line = one_error(&check(&format!("{ipc}{slurm}"), false).0);
    assert!(
        line.contains("bridge.mode: bridge `ipc` maps the trainer's weights into the engines, which needs one host, but the [launcher] puts the ranks on n1 and n2")
            && line.contains("use `checkpoint`"),
        "{line}"
    );
    // ... and the same job with both on n1, or with the local launcher, is valid.
    let (out, _p, _j) = check(&format!("{ipc}{}", slurm.replace("n2", "n1")), false);
    assert!(out.status.success(), "{}", stderr(&out));
    let (out, _p, _j) = check(&ipc, false);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("launcher   local"),
        "{}",
        stdout(&out)
    );
    for (bad, want) in [
        (
            slurm.replace("advertise = \"10.0.0.5\"\n", ""),
            "launcher.advertise: is required with launcher.kind = \"slurm\"",
        ),
        (
            slurm.replace("10.0.0.5", "127.0.0.1"),
            "launcher.advertise: 127.0.0.1 cannot be reached from other nodes",
        ),
        (
            slurm.replace("10.0.0.5", "head-node"),
            "launcher.advertise: `head-node` is not an IP address",
        ),
        (
            slurm.replace("kind = \"slurm\"", "kind = \"local\""),
            "launcher.engine_nodes: places ranks on nodes, but launcher.kind is `local`",
        ),
        (
            slurm.replace("[\"n1\"]", "[\"n1\", \"n3\"]"),
            "launcher.engine_nodes: names 2 nodes for 1 engine ranks",
        ),
        (
            format!("{slurm}strategy = \"SPREAD\"\n"),
            "launcher.strategy: is a Ray setting, but launcher.kind is `slurm`",
        ),
    ] {
        assert_refused(&format!("{base}{bad}"), want);
    }
    // Colocated ranks share a device: one node.
    let colocated = native(true);
    let line = one_error(&check(&format!("{colocated}{slurm}"), false).0);
    assert!(
        line.contains("launcher.engine_nodes: colocated engine rank 0 and trainer rank 0 are on different nodes (n1 and n2)"),
        "{line}"
    );
}

#[test]
fn ray_launcher_settings_are_checked_and_its_placement_shown_in_the_plan() {
    let base = native(false);
    let ray = "\n[launcher]\nkind = \"ray\"\naddress = \"10.0.0.1:6379\"\nstrategy = \"STRICT_SPREAD\"\nresources = { CPU = 2 }\nadvertise = \"10.0.0.5\"\nengine_nodes = [\"10.0.0.1\"]\ntrainer_nodes = [\"10.0.0.2\"]\n";
    let (out, _p, _j) = check(&format!("{base}{ray}"), false);
    assert!(out.status.success(), "{}", stderr(&out));
    let plan = stdout(&out);
    assert!(
        plan.contains("launcher   ray (STRICT_SPREAD, {CPU=2} per rank, cluster 10.0.0.1:6379): engines on 10.0.0.1, trainers on 10.0.0.2; workers dial 10.0.0.5"),
        "{plan}"
    );
    assert!(plan.contains("pair0 [1, 0]: tcp"), "{plan}");
    // ipc across Ray nodes: refused; with STRICT_PACK (one node) and no pins: valid.
    let ipc = base.replace("mode = \"checkpoint\"", "mode = \"ipc\"");
    let line = one_error(&check(&format!("{ipc}{ray}"), false).0);
    assert!(
        line.contains("bridge `ipc` maps the trainer's weights into the engines, which needs one host, but the [launcher] puts the ranks on 10.0.0.1 and 10.0.0.2"),
        "{line}"
    );
    let packed = ray.replace("STRICT_SPREAD", "STRICT_PACK").replace(
        "engine_nodes = [\"10.0.0.1\"]\ntrainer_nodes = [\"10.0.0.2\"]\n",
        "",
    );
    let (out, _p, _j) = check(&format!("{ipc}{packed}"), false);
    assert!(out.status.success(), "{}", stderr(&out));
    // Colocated pairs with unpinned bundles may be split by any other strategy.
    let colocated = native(true);
    let unpinned = ray.replace(
        "engine_nodes = [\"10.0.0.1\"]\ntrainer_nodes = [\"10.0.0.2\"]\n",
        "",
    );
    let line = one_error(&check(&format!("{colocated}{unpinned}"), false).0);
    assert!(
        line.contains(
            "colocated engine rank 0 and trainer rank 0 are on different nodes (any and any)"
        ),
        "{line}"
    );
    for (bad, want) in [
        (
            ray.replace("[\"10.0.0.1\"]", "[\"head\"]"),
            "launcher.engine_nodes: `head` is not a node IP",
        ),
        (
            ray.replace("CPU = 2", "CPU = 0"),
            "launcher.resources: `CPU` = 0 is not a positive amount",
        ),
        (
            ray.replace("STRICT_SPREAD", "SIDEWAYS"),
            "launcher.strategy",
        ),
        (
            format!("{ray}partition = \"gpu\"\n"),
            "launcher.partition: is a Slurm setting, but launcher.kind is `ray`",
        ),
        (
            ray.replace("advertise = \"10.0.0.5\"\n", ""),
            "launcher.advertise: is required with launcher.kind = \"ray\"",
        ),
        (
            ray.replace("kind = \"ray\"", "kind = \"local\""),
            "launcher.address: is a Ray setting, but launcher.kind is `local`",
        ),
    ] {
        assert_refused(&format!("{base}{bad}"), want);
    }
}

#[test]
fn launch_sbatch_prints_the_allocation_and_refuses_a_local_job() {
    let base = native(false);
    let jobs = tempfile::tempdir().unwrap();
    let local = jobs.path().join("local.toml");
    std::fs::write(&local, &base).unwrap();
    let out = run(tandem().args(["launch", "--sbatch"]).arg(&local));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 1, "{}", stderr(&out));
    assert!(
        errors[0].contains("`tandem launch --sbatch` needs [launcher] kind = \"slurm\""),
        "{}",
        errors[0]
    );
    let slurm = jobs.path().join("slurm.toml");
    std::fs::write(
        &slurm,
        format!(
            "{base}\n[launcher]\nkind = \"slurm\"\nadvertise = \"auto\"\nengine_nodes = [\"n1\"]\ntrainer_nodes = [\"n2\"]\npartition = \"gpu\"\n"
        ),
    )
    .unwrap();
    let out = run(tandem().args(["launch", "--sbatch"]).arg(&slurm));
    assert!(out.status.success(), "{}", stderr(&out));
    let script = stdout(&out);
    for line in [
        "#!/bin/bash",
        "#SBATCH --ntasks=2",
        "#SBATCH --nodes=2",
        "#SBATCH --nodelist=n1,n2",
        "#SBATCH --partition=gpu",
    ] {
        assert!(script.lines().any(|l| l == line), "{line}: {script}");
    }
    let exec = script.lines().last().unwrap();
    assert!(
        exec.starts_with("exec '") && exec.ends_with(&format!(" run '{}'", slurm.display())),
        "{exec}"
    );
    // --out never overwrites.
    let out = run(tandem()
        .args(["launch", "--sbatch"])
        .arg(&slurm)
        .arg("--out")
        .arg(&local));
    assert!(!out.status.success());
    let errors = error_lines(&out);
    assert!(
        errors.len() == 1 && errors[0].contains("File exists"),
        "{}",
        stderr(&out)
    );
    assert!(std::fs::read_to_string(&local).unwrap() == base);
}

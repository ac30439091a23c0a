//! `[placement.cpus]`: each role's workers run on the cores the job names (the worker pins
//! every thread before it builds its component, and says so in its log); a core this machine
//! does not let Tandem use is one line from `tandem check`.

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::common::rl::*;

/// A job of `o` whose `[placement]` gains `cpus` (TOML of `[placement.cpus]`).
fn pinned_job(t: &Scratch, o: &JobOpts, cpus: &str) -> std::path::PathBuf {
    let path = t.job(o);
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("[model]", &format!("[placement.cpus]\n{cpus}\n\n[model]"));
    std::fs::write(&path, &text).unwrap();
    path
}

#[test]
fn each_roles_workers_run_on_the_cores_the_job_names() {
    let allowed = tandem_runtime::worker::allowed_cpus();
    let (engine, trainer) = (allowed[0], *allowed.last().unwrap());
    let t = Scratch::new();
    let job = pinned_job(
        &t,
        &JobOpts::default(),
        &format!("engine = [{engine}]\ntrainer = [{trainer}]"),
    );
    let out = t.tandem(&["check", job.to_str().unwrap()]);
    assert!(out.status.success(), "{}", out.stderr_text());
    assert!(
        out.stdout_text()
            .contains(&format!("engine workers pinned to CPUs [{engine}]")),
        "{}",
        out.stdout_text()
    );
    let out = t.run(&job, &[]);
    assert!(out.status.success(), "{}", out.stderr_text());
    for (name, cpu) in [("engine", engine), ("trainer", trainer)] {
        let log = std::fs::read_to_string(t.dir.join(format!("run/logs/{name}-0.log"))).unwrap();
        assert!(
            log.contains(&format!("{name} rank 0 pinned to CPUs [{cpu}]")),
            "{name}: {log}"
        );
    }
}

#[test]
fn a_core_tandem_may_not_use_is_one_line_from_check() {
    let t = Scratch::new();
    let job = pinned_job(&t, &JobOpts::default(), "engine = [100000]");
    let out = t.tandem(&["check", job.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr_text());
    let lines = crate::common::error_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("placement.cpus.engine") && lines[0].contains("CPU 100000"),
        "{}",
        lines[0]
    );
}

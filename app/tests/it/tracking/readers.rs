//! TensorBoard and W&B, read back by their own packages: every numeric field of every
//! `metrics.jsonl` line at its step, once, after a `--resume` that runs steps again; the job
//! file as TensorBoard text; the W&B config as the resolved plan and one W&B run across the
//! resume.

use super::*;

/// Two steps with a checkpoint each and an evaluation before training (a step-0 line), then
/// `--resume` to step 3: step 2's figures are sent again, the first attempt's replaced.
fn run_and_resume(t: &Scratch, logging: &str) {
    let o = JobOpts {
        steps: 2,
        save_every: 1,
        extra_sections: "[eval]\nevery = 1\nproblems = 8\n".into(),
        ..JobOpts::default()
    };
    let job = job_with_logging(t, &o, logging);
    let out = t.run(&job, &[]);
    assert!(out.status.success(), "{}", out.stderr_text());
    let out = t.tandem(&["run", "--resume", "run", "--steps", "3"]);
    assert!(out.status.success(), "{}", out.stderr_text());
    assert_eq!(steps_of(&t.metrics()), [0, 1, 2, 3]);
    assert!(
        tracking_warnings(t).is_empty(),
        "{:?}",
        tracking_warnings(t)
    );
}

#[test]
#[ignore = "needs the trackers' Python (scripts/setup-track.sh); run by .ci/run"]
fn tensorboard_reads_every_metric_of_every_step_once_across_a_resume() {
    let t = Scratch::new();
    run_and_resume(&t, "[logging]\ntensorboard = true\n");
    let dir = t.dir.join("run/tensorboard");
    let read = read_back(&["tensorboard", dir.to_str().unwrap()]);
    let tb = &read["scalars"];
    let mut checked = 0;
    for line in t.metrics() {
        let step = line["step"].as_u64().unwrap();
        for (name, value) in scalars(&line) {
            let points: Vec<&serde_json::Value> = tb[&name]
                .as_array()
                .unwrap_or_else(|| panic!("TensorBoard has no `{name}`"))
                .iter()
                .filter(|p| p[0].as_u64() == Some(step))
                .collect();
            assert_eq!(points.len(), 1, "`{name}` at step {step}: {points:?}");
            // TensorBoard keeps an f32; serde_json's float parsing may be one ulp off.
            let got = points[0][1].as_f64().unwrap();
            let want = f64::from(value as f32);
            assert!(
                (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                "`{name}` at step {step}: {got} vs {want}"
            );
            checked += 1;
        }
    }
    assert!(checked > 100, "only {checked} figures");
    assert_eq!(read["texts"], serde_json::json!(["job"]));
}

#[test]
#[ignore = "needs the trackers' Python (scripts/setup-track.sh); run by .ci/run"]
fn wandb_offline_records_hold_every_step_and_the_plan_across_a_resume() {
    let t = Scratch::new();
    run_and_resume(
        &t,
        "[logging.wandb]\nproject = \"tandem-test\"\nmode = \"offline\"\n",
    );
    let read = read_back(&["wandb", t.dir.join("run").to_str().unwrap()]);
    let runs = read["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "one offline directory per process: {read}");
    let id = tracking_state(&t.dir.join("run"))["targets"]["wandb -/tandem-test"]["run_id"].clone();
    assert!(id.is_string(), "{id}");
    assert!(
        runs.iter().all(|r| r["id"] == id),
        "the resume continues the W&B run {id}"
    );
    // The config is the resolved plan.
    assert_eq!(
        runs[0]["config"]["algorithm"]["group_size"], 4,
        "{}",
        runs[0]["config"]
    );
    assert_eq!(runs[0]["config"]["name"], "test");
    let rows: Vec<&serde_json::Value> = runs
        .iter()
        .flat_map(|r| r["history"].as_array().unwrap())
        .collect();
    for line in t.metrics() {
        let step = line["step"].as_u64().unwrap();
        // The last row of the step: the resumed run's, where a step was sent twice.
        let row = rows
            .iter()
            .rev()
            .find(|r| r["step"].as_u64() == Some(step))
            .unwrap_or_else(|| panic!("no W&B row at step {step}"));
        for (name, value) in scalars(&line) {
            assert_eq!(row[&name].as_f64(), Some(value), "`{name}` at step {step}");
        }
    }
}

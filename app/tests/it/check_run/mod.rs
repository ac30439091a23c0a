//! `tandem check` makes every check `tandem run` makes before it starts anything: for a table
//! of bad jobs (each the quickstart, as `golden/quickstart-50.toml` freezes it, with one change) both commands exit 2 with the
//! same first error line, which points at the offending key (`job.toml:LINE:COL: key.path`),
//! and `tandem run` created neither the run directory nor the model.

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::common::*;
use std::path::Path;

mod cases;

use cases::CASES;

/// The quickstart as frozen for the golden run (`golden/quickstart-50.toml`: the shipped
/// example's settings may change, the bad jobs' anchors must not) with its model under
/// `dir/model` (absent) and the given edits.
fn job_text(edits: &[(&str, &str)]) -> String {
    let frozen = workspace_root().join("app/tests/it/golden/quickstart-50.toml");
    let quickstart = std::fs::read_to_string(frozen).unwrap();
    let mut text = quickstart.replace("path = \"../models/tiny-arith\"", "path = \"MODEL\"");
    assert_ne!(text, quickstart, "the quickstart's model path moved");
    for (from, to) in edits {
        assert!(
            text.contains(from),
            "the quickstart no longer contains {from:?}"
        );
        text = text.replacen(from, to, 1);
    }
    text
}

/// 1-based number of the first line of `text` containing `needle`.
fn line_number(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .map(|i| i + 1)
        .unwrap_or_else(|| panic!("{needle:?} is not in the job:\n{text}"))
}

/// Writes the job into `dir` (model path `dir/model`) and returns its path.
fn write_job(dir: &Path, text: &str) -> std::path::PathBuf {
    let model = dir.join("model");
    let path = dir.join("job.toml");
    std::fs::write(&path, text.replace("MODEL", model.to_str().unwrap())).unwrap();
    path
}

/// A plugin directory with the fixture engine `fixture-alpha` (declares `checkpoint_dir`
/// updates only).
fn fixtures() -> tempfile::TempDir {
    plugin_dir(&[(&cdylib("fixture_alpha"), "libtandem_fixture_alpha.so")])
}

fn first_error(out: &std::process::Output) -> String {
    error_lines(out)
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no error line:\n{}", stderr(out)))
}

#[test]
fn check_and_run_refuse_each_bad_job_at_its_key_before_creating_anything() {
    let plugins = fixtures();
    for case in CASES {
        let dir = tempfile::tempdir().unwrap();
        let text = job_text(case.edits);
        let job = write_job(dir.path(), &text);
        let line = line_number(&text, case.line_of);

        let out = run(tandem()
            .arg("check")
            .arg(&job)
            .arg("--plugin-dir")
            .arg(plugins.path()));
        assert_eq!(
            out.status.code(),
            Some(2),
            "{}: check\n{}",
            case.name,
            stderr(&out)
        );
        let checked = first_error(&out);
        let want = format!("job.toml:{line}:");
        assert!(
            checked.contains(&want) && checked.contains(&format!(": {}: ", case.key)),
            "{}: expected `{want}` and key `{}` in\n{checked}",
            case.name,
            case.key
        );

        let run_dir = dir.path().join("run");
        let out = run(tandem()
            .arg("run")
            .arg(&job)
            .arg("--output-dir")
            .arg(&run_dir)
            .arg("--plugin-dir")
            .arg(plugins.path()));
        assert_eq!(
            out.status.code(),
            Some(2),
            "{}: run\n{}",
            case.name,
            stderr(&out)
        );
        assert_eq!(first_error(&out), checked, "{}: same first line", case.name);
        assert!(!run_dir.exists(), "{}: run created the run dir", case.name);
        assert!(
            !dir.path().join("model").exists(),
            "{}: run created the model",
            case.name
        );
    }
}

#[test]
fn a_directory_init_preset_cannot_fill_is_refused_before_anything_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let text = job_text(&[]);
    let job = write_job(dir.path(), &text);
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    std::fs::write(model.join("notes.txt"), "not a model").unwrap();
    let out = run(tandem().arg("check").arg(&job));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let line = first_error(&out);
    let want = format!("job.toml:{}:", line_number(&text, "path = \"MODEL\""));
    assert!(
        line.contains(&want) && line.contains(": model.path: "),
        "{line}"
    );
    assert!(line.contains("holds no model"), "{line}");
    let run_dir = dir.path().join("run");
    let out = run(tandem()
        .arg("run")
        .arg(&job)
        .arg("--output-dir")
        .arg(&run_dir));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(first_error(&out), line);
    assert!(!run_dir.exists());
    assert!(!model.join("config.json").exists());
}

#[test]
fn every_problem_is_reported_in_file_order() {
    let dir = tempfile::tempdir().unwrap();
    let text = job_text(&[
        ("max_batch = 64", "max_batch = 0"),
        ("temperature = 1.0", "temperature = -1.0"),
        (
            "mode = \"ipc\"",
            "mode = \"ipc\"\n\n[bridge.options]\nrestart = true",
        ),
    ]);
    let job = write_job(dir.path(), &text);
    let out = run(tandem().arg("check").arg(&job));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let errors = error_lines(&out);
    let keys: Vec<&str> = [
        "engine.options.max_batch",
        "bridge.options.restart",
        "algorithm.temperature",
    ]
    .into_iter()
    .collect();
    assert_eq!(errors.len(), keys.len(), "{}", stderr(&out));
    for (e, key) in errors.iter().zip(keys) {
        assert!(e.contains(&format!(": {key}: ")), "{key} in {e}");
    }
}

/// Prompts + `max_tokens` longer than the engine holds with its options (`max_seq_len`, as
/// the engine's plugin answers for them) are refused at `algorithm.max_tokens`, with the
/// longest prompt's length; the same job with room for them checks.
#[test]
fn sequences_longer_than_the_engine_holds_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    init_model("tiny", 0, &dir.path().join("model"));
    let text = job_text(&[("max_seq_len = 64", "max_seq_len = 6")]);
    let job = write_job(dir.path(), &text);
    let out = run(tandem().arg("check").arg(&job));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let line = first_error(&out);
    let at = line_number(&text, "max_tokens = ");
    assert!(
        line.contains(&format!("job.toml:{at}:")) && line.contains(": algorithm.max_tokens: "),
        "{line}"
    );
    assert!(
        line.contains("exceeds the 6 tokens engine `native` holds") && line.contains("max_seq_len"),
        "{line}"
    );
    let fits = write_job(dir.path(), &job_text(&[]));
    let out = run(tandem().arg("check").arg(&fits));
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn the_valid_quickstart_still_checks() {
    let dir = tempfile::tempdir().unwrap();
    let job = write_job(dir.path(), &job_text(&[]));
    let out = run(tandem().arg("check").arg(&job));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("job `quickstart` is valid"),
        "{}",
        stdout(&out)
    );
    // And the shipped examples themselves.
    for example in [
        "quickstart",
        "quickstart-ppo",
        "broadcast",
        "quickstart-spec",
        "drafter",
    ] {
        let out = run(tandem()
            .arg("check")
            .arg(workspace_root().join(format!("examples/{example}.toml"))));
        assert!(out.status.success(), "{example}: {}", stderr(&out));
    }
}

//! A dataset's data position through `--resume`, and bad data from `tandem check`.

use super::*;

/// Four steps straight, and two steps then `--resume --steps 4`, ask the dataset for the same
/// items in the same order (its epochs reshuffled from the seed: 40 rows, 6 prompts a step,
/// so the run crosses into a second epoch).
#[test]
fn resume_continues_at_the_same_data_position() {
    let t = Scratch::new();
    let o = JobOpts {
        steps: 4,
        save_every: 2,
        prompts: 6,
        group: 2,
        ..JobOpts::default()
    };
    let job = dataset_job(&t, &o, "{ verifier = \"exact\" }", "");
    let (straight, split) = (t.dir.join("straight"), t.dir.join("split"));
    for (dir, extra) in [(&straight, &[][..]), (&split, &["--steps", "2"][..])] {
        let mut args = vec!["--output-dir", dir.to_str().unwrap()];
        args.extend(extra);
        let out = t.run(&job, &args);
        assert!(out.status.success(), "{}", out.stderr_text());
    }
    let out = t.tandem(&["run", "--resume", split.to_str().unwrap(), "--steps", "4"]);
    assert!(out.status.success(), "{}", out.stderr_text());
    let items = |dir: &Path| env_events(dir, "items");
    let (a, b) = (items(&straight), items(&split));
    assert_eq!(a.len(), 4, "{a:?}");
    assert_eq!(a, b, "the resumed run saw other items");
    let ids: Vec<&str> = a.iter().flat_map(|(_, d)| d.split(' ')).collect();
    assert_eq!(ids.len(), 24);
    let distinct: std::collections::BTreeSet<&str> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), 24, "no row twice within an epoch: {ids:?}");
}

/// Each bad dataset is one `error:` line from `tandem check` naming what is wrong, and
/// nothing is created.
#[test]
fn bad_data_is_one_line_from_tandem_check() {
    let t = Scratch::new();
    let o = JobOpts::default();
    let cases: &[(&str, &str, &str)] = &[
        ("data.jsonl", "", "missing"),
        (
            "data.jsonl",
            "{\"prompt\": \"Q: 1+1=? A:\", \"answer\": \"2\"}\n{oops\n",
            "line 2",
        ),
        (
            "data.jsonl",
            "{\"question\": \"Q\", \"answer\": \"2\"}\n",
            "prompt",
        ),
        (
            "data.jsonl",
            "{\"prompt\": 5, \"answer\": \"2\"}\n",
            "prompt",
        ),
        ("data.parquet", "not a parquet file", "data.parquet"),
        ("data.jsonl", "\n", "has no rows"),
        ("data.jsonl", "OVERLAP", "overlaps training"),
    ];
    for (i, (file, content, want)) in cases.iter().enumerate() {
        let job = dataset_job(&t, &o, "{ verifier = \"exact\" }", "");
        let text = std::fs::read_to_string(&job).unwrap();
        std::fs::remove_file(t.dir.join("data.jsonl")).unwrap();
        let mut text = text.replace("data.jsonl", file);
        if *content == "OVERLAP" {
            // The held-out file repeats a training row's prompt.
            let rows = super::rows(4);
            std::fs::write(t.dir.join(file), &rows).unwrap();
            std::fs::write(t.dir.join("held.jsonl"), rows.lines().next().unwrap()).unwrap();
            text = text.replace(
                "path = \"data.jsonl\"",
                "held_out = \"held.jsonl\"\npath = \"data.jsonl\"",
            );
        } else if *want != "missing" {
            std::fs::write(t.dir.join(file), content).unwrap();
        }
        std::fs::write(&job, text).unwrap();
        let out = t.tandem(&["check", job.to_str().unwrap()]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "case {i}: {}",
            out.stderr_text()
        );
        let errors = crate::common::error_lines(&out);
        assert_eq!(errors.len(), 1, "case {i}: {}", out.stderr_text());
        let line = errors[0].to_lowercase();
        let want = if *want == "missing" {
            "data.jsonl"
        } else {
            *want
        };
        assert!(line.contains(want), "case {i}: {line}");
        assert!(line.contains("environment"), "case {i}: at its key: {line}");
        let _ = std::fs::remove_file(t.dir.join(file));
    }
    assert!(!t.dir.join("run").exists(), "nothing was created");
}

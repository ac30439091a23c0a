//! Option parsing and validation at exact keys, and the launch command line.

#![allow(clippy::unwrap_used)]
use super::*;
use tandem_plugin_support::server_engine::testing::model_with_positions;

fn keys(json: &str, world: u32) -> Vec<String> {
    SglangOptions::problems_of(json, world)
        .iter()
        .map(|p| p.key.to_string())
        .collect()
}

#[test]
fn defaults_parse_and_launch_on_loopback() {
    let o = SglangOptions::parse("", 1).unwrap();
    assert!(!o.attach());
    assert_eq!(o.keep_mode, KeepMode::Retract);
    assert_eq!(o.flush_retries, 60);
    let a = o.server_args(Path::new("/m"), 9000, 2, 0).join(" ");
    assert!(
        a.starts_with("--model-path /m --host 127.0.0.1 --port 9000"),
        "{a}"
    );
    assert!(a.contains("--skip-server-warmup --weight-version 0"), "{a}");
    assert!(
        a.contains("--random-seed 2") && !a.contains("memory-saver"),
        "{a}"
    );
}

#[test]
fn url_and_urls_are_exclusive_and_checked() {
    assert_eq!(
        keys(r#"{"url": "http://a:1", "urls": ["http://a:1"]}"#, 1),
        ["urls"]
    );
    assert_eq!(keys(r#"{"url": "a:1"}"#, 1), ["url"]);
    assert_eq!(keys(r#"{"url": "http://a:1"}"#, 2), ["url"]);
    assert_eq!(keys(r#"{"urls": ["http://a:1"]}"#, 2), ["urls"]);
    assert_eq!(keys(r#"{"urls": ["http://a:1", "b"]}"#, 2), ["urls[1]"]);
    assert_eq!(
        keys(r#"{"url": "http://a:1", "python": "p"}"#, 1),
        ["python"]
    );
    let o = SglangOptions::parse(r#"{"urls": ["http://a:1/", "http://b:2"]}"#, 2).unwrap();
    assert_eq!(o.url_of(0).as_deref(), Some("http://a:1"));
    assert_eq!(o.url_of(1).as_deref(), Some("http://b:2"));
}

#[test]
fn public_bind_and_lora_options_are_refused_at_their_keys() {
    assert_eq!(keys(r#"{"host": "0.0.0.0"}"#, 1), ["host"]);
    assert!(keys(r#"{"host": "0.0.0.0", "allow_public_bind": true}"#, 1).is_empty());
    assert_eq!(
        keys(
            r#"{"max_lora_rank": 8, "lora_target_modules": ["q_proj"]}"#,
            1
        ),
        ["max_lora_rank", "lora_target_modules"]
    );
    assert_eq!(keys(r#"{"keep_mode": "freeze"}"#, 1), ["keep_mode"]);
    assert_eq!(keys(r#"{"flush_retry": 3}"#, 1), ["flush_retry"]);
    assert_eq!(
        keys(r#"{"request_timeout_s": 0}"#, 1),
        ["request_timeout_s"]
    );
}

#[test]
fn memory_saver_lora_and_key_flags() {
    let o = SglangOptions::parse(
        r#"{"enable_memory_saver": true, "enable_lora": true, "max_lora_rank": 8,
            "lora_target_modules": ["q_proj", "v_proj"], "api_key": "k"}"#,
        1,
    )
    .unwrap();
    let a = o.server_args(Path::new("/m"), 1, 0, 3).join(" ");
    assert!(
        a.contains("--enable-memory-saver --enable-weights-cpu-backup"),
        "{a}"
    );
    assert!(
        a.contains("--enable-lora --max-lora-rank 8 --lora-target-modules q_proj v_proj"),
        "{a}"
    );
    assert!(
        a.contains("--api-key k") && a.contains("--weight-version 3"),
        "{a}"
    );
    assert!(
        o.server_env()
            .contains(&("SGLANG_RETURN_ORIGINAL_LOGPROB".into(), "1".into()))
    );
}

#[test]
fn the_python_option_and_command_name_their_origin() {
    let o = SglangOptions::parse(r#"{"python": "/venv/bin/python"}"#, 1).unwrap();
    let l = o.launcher().unwrap();
    assert_eq!(l.args, ["-m", "sglang.launch_server"]);
    assert_eq!(l.origin, "the `python` option");
    let o = SglangOptions::parse(r#"{"command": ["sglang", "serve"]}"#, 1).unwrap();
    assert_eq!(o.launcher().unwrap().program, "sglang");
}

#[test]
fn it_says_lora_digests_and_its_longest_sequence_as_its_options_do() {
    let m = model_with_positions(128).unwrap();
    let launched = SglangOptions::parse("{}", 1).unwrap().caps(&m);
    assert_eq!(
        launched.update_kinds.as_slice(),
        &[UpdateKind::CheckpointDir]
    );
    assert_eq!(launched.max_seq_len, 128, "the model's positions");
    assert!(launched.reports_digest && !launched.restarts_on_checkpoint);
    let opts = r#"{"url": "http://127.0.0.1:30000", "enable_lora": true}"#;
    let attached = SglangOptions::parse(opts, 1).unwrap().caps(&m);
    assert_eq!(
        attached.update_kinds.as_slice(),
        &[UpdateKind::Adapter, UpdateKind::CheckpointDir]
    );
    assert!(
        attached.reports_digest,
        "the plugin digests every update's files before the server loads them"
    );
    assert_eq!(
        attached.max_seq_len, 0,
        "an attached server's context is its own"
    );
}

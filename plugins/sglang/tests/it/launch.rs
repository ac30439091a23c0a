//! Launch mode without SGLang (it cannot run on this CPU machine): the plugin's supervision
//! with a stand-in `command`. A server that exits while starting, or never answers
//! `/health_generate`, is one error carrying its log's tail; the log is
//! `<run_dir>/logs/sglang-<rank>.log`. Needs `cargo build -p tandem-plugin-sglang`.

use tandem_conformance::{EngineHarness, EngineSetup, Source};

/// A model directory (launch mode checks for `config.json`).
fn model() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tandem-sglang-launch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.join("config.json"), "{}").unwrap_or_else(|e| panic!("{e}"));
    dir
}

fn start(options: serde_json::Value) -> String {
    let setup = EngineSetup::new(Source::built("tandem_sglang"), "sglang", model());
    match EngineHarness::new(setup.options(&options.to_string())) {
        Ok(_) => panic!("a stand-in started as a server"),
        Err(f) => f.to_string(),
    }
}

#[test]
fn a_server_that_exits_while_starting_is_one_line_with_its_log_tail() {
    // `sh -c SCRIPT` takes the server flags as $0 $1 …: the script sees them and fails.
    let script =
        r#"echo "args: $*" >&2; echo "RuntimeError: no CUDA GPUs are available" >&2; exit 3"#;
    let f = start(serde_json::json!({"command": ["sh", "-c", script]}));
    assert!(f.contains("exited during start-up (exit status: 3)"), "{f}");
    assert!(
        f.contains("RuntimeError: no CUDA GPUs are available"),
        "{f}"
    );
    assert!(f.contains("sglang-0.log"), "{f}");
}

#[test]
fn a_server_that_never_gets_healthy_times_out_and_is_stopped() {
    let f = start(serde_json::json!({
        "command": ["sh", "-c", "echo loading weights >&2; exec sleep 600"],
        "health_timeout_s": 1,
    }));
    assert!(f.contains("GET /health_generate not 200 after 1 s"), "{f}");
    assert!(f.contains("loading weights"), "{f}");
    let pid = f
        .split("server (pid ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .unwrap_or_else(|| panic!("no pid in {f}"));
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "server {pid} still runs"
    );
}

#[test]
fn a_taken_port_is_refused_before_launching() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let port = taken.local_addr().map(|a| a.port()).unwrap_or_default();
    let f = start(serde_json::json!({"command": ["true"], "port": port}));
    assert!(
        f.contains(&format!("port 127.0.0.1:{port} is taken")),
        "{f}"
    );
}

#[test]
fn validate_config_reports_each_problem_at_its_key() {
    use tandem_plugin_api::{ComponentConfig, ComponentKind, RResult};
    let module = Source::built("tandem_sglang")
        .load()
        .unwrap_or_else(|e| panic!("{e}"));
    let validate = module
        .validate_config()
        .unwrap_or_else(|| panic!("no validate_config"));
    let config = |options: &str, world_size: u32| ComponentConfig {
        component: "sglang".into(),
        model_path: "".into(),
        options_json: options.into(),
        rank: 0,
        world_size,
        device: "cpu".into(),
        run_dir: "".into(),
    };
    let keys = |options: &str, world_size: u32| -> Vec<String> {
        match validate(ComponentKind::Engine, config(options, world_size)) {
            RResult::ROk(p) => p.iter().map(|p| p.key.to_string()).collect(),
            RResult::RErr(e) => panic!("{e}"),
        }
    };
    let both = r#"{"url": "http://127.0.0.1:1", "urls": ["http://127.0.0.1:1"]}"#;
    assert_eq!(keys(both, 1), ["urls"]);
    assert_eq!(keys(r#"{"urls": ["http://127.0.0.1:1"]}"#, 2), ["urls"]);
    assert_eq!(
        keys(r#"{"url": "http://h:1", "host": "0.0.0.0"}"#, 1),
        ["host"]
    );
    assert_eq!(
        keys(r#"{"url": "http://h:1", "max_lora_rank": 8}"#, 1),
        ["max_lora_rank"]
    );
    assert!(
        keys(
            r#"{"url": "http://h:1", "enable_lora": true, "max_lora_rank": 8}"#,
            1
        )
        .is_empty()
    );
    assert_eq!(keys(r#"{"url": "http://h:1", "pause": "x"}"#, 1), ["pause"]);
}

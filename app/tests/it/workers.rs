//! Controller ↔ worker over the control plane, with real worker processes (`tandem worker`)
//! loading the fixture plugin libraries: calls across the process boundary, plugin errors as
//! error replies, constructor errors, a worker killed mid-call, a stuck worker, wrong tokens.

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::path::Path;
use std::time::Duration;
use tandem_control::{self as control, ControlError, Role};
use tandem_plugin_api::{ErrorCode, GenerateRequest, RVec, SamplingParams};
use tandem_runtime::RuntimeError;
use tandem_runtime::launch::{CallTimeouts, LaunchOptions, LocalLauncher, RemoteEngine, TOKEN_ENV};
use tandem_runtime::worker::WorkerSpec;

fn fixtures() -> tempfile::TempDir {
    plugin_dir(&[
        (&cdylib("fixture_alpha"), "libtandem_fixture_alpha.so"),
        (&cdylib("fixture_beta"), "libtandem_fixture_beta.so"),
    ])
}

fn spec(role: Role, rank: u32, component: &str, options: &str, plugins: &Path) -> WorkerSpec {
    WorkerSpec {
        role,
        rank,
        world_size: 2,
        component: component.into(),
        model_path: "".into(),
        options_json: options.into(),
        device: "cpu".into(),
        run_dir: "".into(),
        plugin_dirs: vec![plugins.to_path_buf()],
        transport: None,
        cpus: Vec::new(),
    }
}

fn launcher(run_dir: &Path) -> LocalLauncher {
    let mut opts = LaunchOptions::new(run_dir);
    opts.exe = Some(env!("CARGO_BIN_EXE_tandem").into());
    opts.startup_timeout = Duration::from_secs(20);
    opts.timeouts = CallTimeouts {
        quick: Duration::from_secs(10),
        long: Duration::from_secs(20),
    };
    LocalLauncher::new(opts).expect("launcher")
}

fn request(prompts: &[&[u32]]) -> GenerateRequest {
    GenerateRequest {
        prompts: prompts.iter().map(|p| RVec::from(p.to_vec())).collect(),
        sampling: SamplingParams::default(),
        adapter: None.into(),
    }
}

fn tokens(engine: &RemoteEngine, prompts: &[&[u32]]) -> Result<Vec<Vec<u32>>, RuntimeError> {
    let r = engine.generate(request(prompts))?;
    Ok(r.completions.iter().map(|c| c.tokens.to_vec()).collect())
}

fn signal(pid: u32, sig: Signal) {
    kill(Pid::from_raw(pid as i32), sig).expect("signal the worker");
}

fn is_running(pid: u32) -> bool {
    // A reaped process is gone from /proc; an unreaped one would be a zombie ("Z").
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

/// Bytes waiting unread in the TCP sockets of `pid` (`rx_queue` of `/proc/PID/net/tcp{,6}`
/// for the socket inodes among its descriptors).
fn unread_socket_bytes(pid: u32) -> u64 {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
                })
                .collect()
        })
        .unwrap_or_default();
    let mut unread = 0;
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for fields in text
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
        {
            if fields.len() > 9 && inodes.iter().any(|i| i == fields[9]) {
                let rx = fields[4].split(':').nth(1).unwrap_or("0");
                unread += u64::from_str_radix(rx, 16).unwrap_or(0);
            }
        }
    }
    unread
}

/// Whether every thread of `pid` is in the stopped state (`T` in `/proc/PID/task/TID/stat`).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                == Some("T")
        })
    })
}

/// Whether a live process has `arg` on its command line.
fn running_with_arg(arg: &Path) -> bool {
    let arg = arg.as_os_str().as_encoded_bytes();
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        let pid = e.file_name().to_string_lossy().parse::<u32>();
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        pid.is_ok_and(is_running) && cmdline.split(|&b| b == 0).any(|a| a == arg)
    })
}

#[test]
fn engines_generate_across_the_process_boundary_and_survive_plugin_errors() {
    let (plugins, rundir) = (fixtures(), tempfile::tempdir().unwrap());
    let mut l = launcher(rundir.path());
    let specs = [
        spec(Role::Engine, 0, "fixture-alpha", "{}", plugins.path()),
        spec(Role::Engine, 1, "fixture-beta", "{}", plugins.path()),
    ];
    let engines = l.spawn_engines(&specs).expect("engines start");
    assert_ne!(engines[0].pid(), engines[1].pid());
    assert_ne!(engines[0].pid(), std::process::id());
    assert_eq!(
        tokens(&engines[0], &[&[1, 2, 3], &[7]]).unwrap(),
        [vec![1001, 1002, 1003], vec![1007]]
    );
    // fixture-beta answers with its own offset: the rank-1 process loaded the other library.
    let beta = tokens(&engines[1], &[&[1]]).unwrap();
    assert_ne!(beta, [vec![1001]]);
    assert!(engines[0].health().unwrap().ready);

    // An operation the fixture does not implement is an error reply; the worker lives on.
    let err = engines[0]
        .pause_generation(tandem_plugin_api::PauseMode::Abort)
        .unwrap_err();
    match &err {
        RuntimeError::Plugin { context, source } => {
            assert_eq!(source.code, ErrorCode::NotSupported, "{err}");
            assert!(context.starts_with("engine rank 0 (pid "), "{err}");
            assert!(context.ends_with("`pause_generation`"), "{err}");
        }
        other => panic!("expected a plugin error, got {other}"),
    }
    assert_eq!(tokens(&engines[0], &[&[5]]).unwrap(), [vec![1005]]);

    // Concurrent calls on one engine are answered to the right callers.
    let first = &engines[0];
    std::thread::scope(|s| {
        let calls: Vec<_> = (0..8u32)
            .map(|i| s.spawn(move || tokens(first, &[&[i]]).unwrap()))
            .collect();
        for (i, c) in calls.into_iter().enumerate() {
            assert_eq!(c.join().unwrap(), [vec![1000 + i as u32]]);
        }
    });

    let pids: Vec<u32> = engines.iter().map(RemoteEngine::pid).collect();
    let log = std::fs::read_to_string(engines[0].log_path()).unwrap();
    assert!(log.contains("engine rank 0"), "{log}");
    l.shutdown(Duration::from_secs(10)).expect("clean shutdown");
    assert!(pids.iter().all(|&p| !is_running(p)));
    let err = engines[0].health().unwrap_err().to_string();
    assert!(err.contains("the worker was shut down"), "{err}");
}

#[test]
fn trainer_worker_serves_the_trainer_trait() {
    let (plugins, rundir) = (fixtures(), tempfile::tempdir().unwrap());
    let mut l = launcher(rundir.path());
    let specs = [spec(
        Role::Trainer,
        0,
        "fixture-alpha",
        "{}",
        plugins.path(),
    )];
    let trainer = l.spawn_trainers(&specs).expect("trainer starts").remove(0);
    let info = trainer.init().unwrap();
    assert_eq!(info.weight_version, 0);
    let err = trainer.snapshot("actor").unwrap_err();
    assert!(
        matches!(&err, RuntimeError::Plugin { source, .. } if source.code == ErrorCode::NotSupported),
        "{err}"
    );
    assert!(err.to_string().contains("trainer rank 0"), "{err}");
    trainer.stats().unwrap();
    // Dropping the launcher stops its workers; the handles say so instead of reporting a death.
    drop(l);
    let text = trainer.stats().unwrap_err().to_string();
    assert!(text.contains("the launcher was shut down"), "{text}");
    assert!(!is_running(trainer.pid()));
}

#[test]
fn constructor_failures_surface_as_one_clear_error() {
    let (plugins, rundir) = (fixtures(), tempfile::tempdir().unwrap());
    let mut l = launcher(rundir.path());
    let bad = [spec(
        Role::Engine,
        0,
        "fixture-alpha",
        r#"{"behaviour":"error"}"#,
        plugins.path(),
    )];
    let err = l.spawn_engines(&bad).err().expect("constructor error");
    let text = err.to_string();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.starts_with("engine rank 0 (pid "), "{text}");
    assert!(
        text.contains("failed to start: constructing engine `fixture-alpha`"),
        "{text}"
    );
    assert!(
        text.contains("was told to fail in its constructor [invalid_input]"),
        "{text}"
    );
    assert!(text.contains("(help: set behaviour = \"ok\")"), "{text}");
    assert_eq!(err.exit_code(), 2);

    let panics = [spec(
        Role::Engine,
        1,
        "fixture-alpha",
        r#"{"behaviour":"panic"}"#,
        plugins.path(),
    )];
    let text = l.spawn_engines(&panics).err().expect("panic").to_string();
    assert!(
        text.contains("told to panic in its constructor [panicked]"),
        "{text}"
    );

    // One bad worker fails its whole batch: the good one started with it is stopped.
    let batch = [
        spec(Role::Engine, 5, "fixture-alpha", "{}", plugins.path()),
        spec(
            Role::Engine,
            6,
            "fixture-alpha",
            r#"{"behaviour":"error"}"#,
            plugins.path(),
        ),
    ];
    let text = l
        .spawn_engines(&batch)
        .err()
        .expect("batch fails")
        .to_string();
    assert!(text.starts_with("engine rank 6 "), "{text}");
    assert!(!running_with_arg(
        &rundir.path().join("workers/engine-5.json")
    ));

    let unknown = [spec(
        Role::Trainer,
        0,
        "no-such-trainer",
        "{}",
        plugins.path(),
    )];
    let text = l
        .spawn_trainers(&unknown)
        .err()
        .expect("unknown")
        .to_string();
    assert!(
        text.contains("no plugin provides the trainer `no-such-trainer`"),
        "{text}"
    );

    // A process that dies before it ever connects is reported with its status and log tail.
    let mut opts = LaunchOptions::new(rundir.path().join("false"));
    opts.exe = Some("/bin/false".into());
    let mut l = LocalLauncher::new(opts).unwrap();
    let good = [spec(Role::Engine, 0, "fixture-alpha", "{}", plugins.path())];
    let text = l.spawn_engines(&good).err().expect("dies").to_string();
    assert!(
        text.contains("failed to start: the worker exited with status 1"),
        "{text}"
    );
}

#[test]
fn a_killed_worker_fails_the_call_in_flight_and_the_next_call() {
    let (plugins, rundir) = (fixtures(), tempfile::tempdir().unwrap());
    let mut l = launcher(rundir.path());
    let specs = [spec(Role::Engine, 0, "fixture-alpha", "{}", plugins.path())];
    let engine = l.spawn_engines(&specs).unwrap().remove(0);
    assert_eq!(tokens(&engine, &[&[1]]).unwrap(), [vec![1001]]);
    // Freeze the worker and wait until every thread of it is stopped (a reader thread woken by
    // the signal but not yet scheduled would still take bytes already queued), then wait until
    // the next call's request sits unread in its socket (the call is in flight), and kill it.
    signal(engine.pid(), Signal::SIGSTOP);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !all_threads_stopped(engine.pid()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker never stopped"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let in_flight = std::thread::scope(|s| {
        let call = s.spawn(|| tokens(&engine, &[&[2]]));
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while unread_socket_bytes(engine.pid()) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the call never reached the worker"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        signal(engine.pid(), Signal::SIGKILL);
        call.join().unwrap()
    });
    for err in [in_flight.unwrap_err(), engine.health().unwrap_err()] {
        let text = err.to_string();
        assert!(text.starts_with("engine rank 0 (pid "), "{text}");
        assert!(
            text.contains("the worker was killed by signal 9 (SIGKILL)"),
            "{text}"
        );
        assert!(
            text.contains(&engine.log_path().display().to_string()),
            "{text}"
        );
        // The log tail is quoted (the worker logged its connection at info level).
        assert!(
            text.contains("\n  | ") && text.contains("connected to"),
            "{text}"
        );
        assert!(
            !text.contains("no answer"),
            "failed by timeout, not by death: {text}"
        );
    }
    assert!(engine.dead_reason().is_some());
    assert!(!is_running(engine.pid()));
    // The rank can be started again (recovery restarts the worker).
    let again = l.spawn_engines(&specs).unwrap().remove(0);
    assert_ne!(again.pid(), engine.pid());
    assert_eq!(tokens(&again, &[&[3]]).unwrap(), [vec![1003]]);
}

#[test]
fn a_worker_exits_when_its_parent_dies() {
    let (plugins, rundir) = (fixtures(), tempfile::tempdir().unwrap());
    let server = control::ControlServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let spec_path = rundir.path().join("engine-0.json");
    spec(Role::Engine, 0, "fixture-alpha", "{}", plugins.path())
        .write(&spec_path)
        .unwrap();
    // A parent shell that starts the worker in the background and exits when told to.
    let script = r#""$0" worker --role engine --rank 0 --control "$1" --token-env "$2" --spec "$3" & read _; exit 0"#;
    let mut parent = std::process::Command::new("sh")
        .args(["-c", script, env!("CARGO_BIN_EXE_tandem")])
        .arg(server.connect_addr().to_string())
        .arg(TOKEN_ENV)
        .arg(&spec_path)
        .env(TOKEN_ENV, server.token())
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut conn = server
        .claim(Role::Engine, 0, Duration::from_secs(20))
        .expect("the worker connects");
    // Wait for its first frame after the hello (`Ready`): it is serving now.
    use std::io::{Read, Write};
    conn.stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut len = [0u8; 4];
    conn.stream.read_exact(&mut len).unwrap();
    let mut ready = vec![0u8; u32::from_be_bytes(len) as usize];
    conn.stream.read_exact(&mut ready).unwrap();
    parent.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(parent.wait().unwrap().success());
    // The orphaned worker exits by itself, which closes its end of the connection.
    let mut rest = Vec::new();
    conn.stream
        .read_to_end(&mut rest)
        .expect("the orphaned worker exits (EOF) instead of serving on");
}

#[test]
fn a_stuck_worker_times_out_and_a_late_reply_is_dropped() {
    let (plugins, rundir) = (fixtures(), tempfile::tempdir().unwrap());
    let mut l = launcher(rundir.path());
    let specs = [spec(Role::Engine, 0, "fixture-alpha", "{}", plugins.path())];
    let mut engine = l.spawn_engines(&specs).unwrap().remove(0);
    engine.set_timeouts(CallTimeouts {
        quick: Duration::from_millis(500),
        long: Duration::from_secs(20),
    });
    signal(engine.pid(), Signal::SIGSTOP);
    let text = engine.health().unwrap_err().to_string();
    assert!(text.contains("engine rank 0 (pid"), "{text}");
    assert!(
        text.contains("no answer to `health` within 0.5 s"),
        "{text}"
    );
    signal(engine.pid(), Signal::SIGCONT);
    // The late reply to `health` must not be mistaken for the answer to `generate`.
    assert_eq!(tokens(&engine, &[&[9]]).unwrap(), [vec![1009]]);
    assert!(engine.health().unwrap().ready);
    l.shutdown(Duration::from_secs(10)).expect("clean shutdown");
}

#[test]
fn peers_without_the_run_token_are_rejected() {
    let (plugins, rundir) = (fixtures(), tempfile::tempdir().unwrap());
    let mut l = launcher(rundir.path());
    let addr = l.control_addr();
    let err =
        control::connect(addr, "guess", Role::Engine, 0, 0, Duration::from_secs(5)).unwrap_err();
    assert!(
        matches!(&err, ControlError::Rejected { reason, .. } if reason == "wrong run token"),
        "{err}"
    );

    // A real worker process with the wrong token: refused, exits non-zero, says why.
    let spec_path = rundir.path().join("stray.json");
    spec(Role::Engine, 0, "fixture-alpha", "{}", plugins.path())
        .write(&spec_path)
        .unwrap();
    let out = run(tandem()
        .args(["worker", "--role", "engine", "--rank", "0", "--control"])
        .arg(addr.to_string())
        .args(["--token-env", TOKEN_ENV, "--spec"])
        .arg(&spec_path)
        .env(TOKEN_ENV, "0".repeat(64)));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let lines = error_lines(&out);
    assert_eq!(lines.len(), 1, "{}", stderr(&out));
    assert!(
        lines[0].contains("rejected this worker: wrong run token"),
        "{}",
        lines[0]
    );
    assert_eq!(l.rejected_peers(), 2);

    // The rejected peers left no trace: the real rank 0 starts and serves.
    let engine = l.spawn_engines(&[spec(Role::Engine, 0, "fixture-alpha", "{}", plugins.path())]);
    assert_eq!(tokens(&engine.unwrap()[0], &[&[4]]).unwrap(), [vec![1004]]);
}

//! What the options of every server engine share: the bind address (loopback unless
//! `allow_public_bind`), `python` xor `command`, timeouts of at least a second, the launcher
//! check `validate_config` runs, and where a launched server logs. Each check is a
//! [`ConfigProblem`] at its exact key.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{ComponentKind, ConfigProblem};

use super::Dialect;
use super::launch::{COMMAND_ORIGIN, Launcher};

/// The launch options every server engine has.
#[derive(Debug, Clone, Copy)]
pub struct LaunchOptions<'a> {
    /// Bind address.
    pub host: &'a str,
    /// Whether a non-loopback `host` is allowed.
    pub allow_public_bind: bool,
    /// The `python` option.
    pub python: Option<&'a str>,
    /// The `command` option.
    pub command: Option<&'a [String]>,
}

/// Why binding to a public address is refused (after "refusing to bind NAME to IP: ") and
/// how to fix it.
#[derive(Debug, Clone, Copy)]
pub struct PublicBind<'a> {
    /// The risk, e.g. "its dev-mode routes have no authentication".
    pub why: &'a str,
    /// The fix.
    pub help: &'a str,
}

/// Problems of the bind address and the launcher options, in that order.
pub fn launch_problems(
    dialect: &Dialect,
    o: LaunchOptions<'_>,
    public: PublicBind<'_>,
) -> Vec<ConfigProblem> {
    let mut p = Vec::new();
    match o.host.parse::<IpAddr>() {
        Err(_) => p.push(
            ConfigProblem::new("host", format!("`{}` is not an IP address", o.host))
                .with_help("use 127.0.0.1 (or a private address with allow_public_bind = true)"),
        ),
        Ok(ip) if !ip.is_loopback() && !o.allow_public_bind => p.push(
            ConfigProblem::new(
                "host",
                format!(
                    "refusing to bind {} to {ip}: {}",
                    dialect.display, public.why
                ),
            )
            .with_help(public.help),
        ),
        Ok(_) => {}
    }
    if o.python.is_some() && o.command.is_some() {
        p.push(
            ConfigProblem::new("command", "give either `python` or `command`, not both")
                .with_help("remove one of them"),
        );
    }
    if o.command.is_some_and(<[String]>::is_empty) {
        p.push(
            ConfigProblem::new("command", "`command` is empty").with_help(format!(
                "e.g. command = [\"{}\", \"serve\"], or remove it",
                dialect.component
            )),
        );
    }
    p
}

/// A problem for each `(key, seconds)` below one second.
pub fn timeout_problems(timeouts: &[(&str, u64)]) -> Vec<ConfigProblem> {
    timeouts
        .iter()
        .filter(|(_, v)| *v == 0)
        .map(|(key, _)| ConfigProblem::new(*key, "must be at least 1 (seconds)"))
        .collect()
}

/// `validate_config`'s check of the launcher: one problem at `python` when no interpreter
/// was found or the one named does not exist (a bare name is looked up on PATH at spawn).
pub fn launcher_problems(dialect: &Dialect, launcher: Result<Launcher>) -> Vec<ConfigProblem> {
    match launcher {
        Err(e) => {
            let prefix = format!("engine `{}`: ", dialect.component);
            let message = e.message.as_str();
            let message = message.strip_prefix(&prefix).unwrap_or(message);
            vec![ConfigProblem::new("python", message).with_help(e.help)]
        }
        Ok(l)
            if l.origin != COMMAND_ORIGIN
                && l.program.contains('/')
                && !Path::new(&l.program).is_file() =>
        {
            vec![
                ConfigProblem::new(
                    "python",
                    format!("Python `{}` (from {}) does not exist", l.program, l.origin),
                )
                .with_help(crate::python::SETUP_HELP),
            ]
        }
        Ok(_) => Vec::new(),
    }
}

/// The one problem of a configuration naming a component `plugin` does not have (`None`
/// when `kind` / `component` is this plugin's engine).
pub fn wrong_component(
    dialect: &Dialect,
    kind: ComponentKind,
    component: &str,
) -> Option<ConfigProblem> {
    (kind != ComponentKind::Engine || component != dialect.component).then(|| {
        ConfigProblem::new(
            "",
            format!(
                "plugin `{}` has no {} `{component}`",
                dialect.component,
                kind.as_str()
            ),
        )
    })
}

/// `<run_dir>/logs/<component>-<rank>.log` (run dir empty: the system temp dir).
pub fn log_path(component: &str, run_dir: &str, rank: u32) -> PathBuf {
    let base = if run_dir.is_empty() {
        std::env::temp_dir().join(format!("tandem-{component}"))
    } else {
        PathBuf::from(run_dir)
    };
    base.join("logs").join(format!("{component}-{rank}.log"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIALECT: Dialect = Dialect::new("x", "X", "X 1.0");

    fn keys(p: &[ConfigProblem]) -> Vec<&str> {
        p.iter().map(|p| p.key.as_str()).collect()
    }

    #[test]
    fn bind_and_launcher_problems_are_at_their_keys() {
        let public = PublicBind {
            why: "open",
            help: "bind to 127.0.0.1",
        };
        let cmd = vec![];
        let o = LaunchOptions {
            host: "0.0.0.0",
            allow_public_bind: false,
            python: Some("p"),
            command: Some(&cmd),
        };
        let p = launch_problems(&DIALECT, o, public);
        assert_eq!(keys(&p), ["host", "command", "command"]);
        assert!(
            p[0].message.contains("refusing to bind X to 0.0.0.0: open"),
            "{}",
            p[0]
        );
        let o = LaunchOptions {
            host: "::1",
            allow_public_bind: false,
            python: None,
            command: None,
        };
        assert!(launch_problems(&DIALECT, o, public).is_empty());
        let o = LaunchOptions {
            host: "10.0.0.1",
            allow_public_bind: true,
            ..o
        };
        assert!(launch_problems(&DIALECT, o, public).is_empty());
        assert_eq!(keys(&timeout_problems(&[("a_s", 0), ("b_s", 1)])), ["a_s"]);
    }

    #[test]
    fn a_missing_interpreter_path_is_a_problem_at_python() {
        let l = |program: &str, origin: &str| Launcher {
            program: program.into(),
            args: Vec::new(),
            origin: origin.into(),
        };
        let p = launcher_problems(
            &DIALECT,
            Ok(l("/nonexistent/python", "the `python` option")),
        );
        assert_eq!(keys(&p), ["python"]);
        assert!(p[0].message.contains("does not exist"), "{}", p[0]);
        assert!(launcher_problems(&DIALECT, Ok(l("/nonexistent/x", COMMAND_ORIGIN))).is_empty());
        assert!(launcher_problems(&DIALECT, Ok(l("python3", "$TANDEM_PYTHON"))).is_empty());
        assert!(wrong_component(&DIALECT, ComponentKind::Engine, "x").is_none());
        assert!(wrong_component(&DIALECT, ComponentKind::Engine, "y").is_some());
    }

    #[test]
    fn logs_go_under_the_run_dir() {
        assert_eq!(log_path("x", "/r", 2), Path::new("/r/logs/x-2.log"));
    }
}

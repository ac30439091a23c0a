//! The trainer's `init_preset` / `init_seed` options through the plugin's root module (the
//! path the host takes): model creation, validation at the option's key, refusals.
use std::path::{Path, PathBuf};

use crate::NativePlugin;
use tandem_conformance::{Source, TrainerHarness, TrainerSetup};
use tandem_native_core::buffer::VecProvider;
use tandem_native_core::init::{Preset, init_preset};
use tandem_plugin_api::sdk::module_of;
use tandem_plugin_api::{ComponentConfig, ComponentKind, ConfigProblem};

const FILES: [&str; 5] = [
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
];

/// Constructs and initialises the trainer; its error detail when that fails.
fn trainer(model: &Path, options: &str) -> Result<TrainerHarness, String> {
    let setup = TrainerSetup::new(Source::Module(module_of::<NativePlugin>()), "native", model);
    TrainerHarness::new(setup.options(options)).map_err(|f| f.detail)
}

fn refused(model: &Path, options: &str) -> String {
    match trainer(model, options) {
        Ok(_) => panic!("the trainer was constructed with {options}"),
        Err(e) => e,
    }
}

fn validate(model: &Path, options: &str) -> Vec<ConfigProblem> {
    let module = module_of::<NativePlugin>();
    let validate = module.validate_config().expect("level-2 plugin");
    let config = ComponentConfig {
        component: "native".into(),
        model_path: model.display().to_string().into(),
        options_json: options.into(),
        rank: 0,
        world_size: 1,
        device: "cpu".into(),
        run_dir: "".into(),
    };
    validate(ComponentKind::Trainer, config)
        .into_result()
        .expect("validate_config answers")
        .into_iter()
        .collect()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("listing")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn tiny_preset_is_written_into_a_missing_dir_bit_for_bit() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model: PathBuf = tmp.path().join("new/model");
    let options = r#"{"init_preset": "tiny", "init_seed": 11}"#;
    assert!(validate(&model, options).is_empty());
    let h = trainer(&model, options).expect("trainer over a missing dir");
    assert!(h.info.total_params > 1_000_000, "{:?}", h.info);
    drop(h);
    let want = tmp.path().join("want");
    init_preset(Preset::Tiny, &want, 11, &mut VecProvider::new()).expect("init_preset");
    assert_eq!(names(&model), names(&want));
    for f in FILES {
        let (a, b) = (std::fs::read(model.join(f)), std::fs::read(want.join(f)));
        assert!(
            a.expect(f) == b.expect(f),
            "{f} differs from init_preset(Tiny, 11)"
        );
    }
    // No staging directory is left beside it.
    assert_eq!(names(&tmp.path().join("new")), ["model"]);

    // An existing model wins: the options are ignored (a different seed changes nothing).
    let before = std::fs::read(model.join("model.safetensors")).expect("weights");
    let other = r#"{"init_preset": "small", "init_seed": 12}"#;
    assert!(validate(&model, other).is_empty());
    trainer(&model, other).expect("trainer over the existing model");
    let after = std::fs::read(model.join("model.safetensors")).expect("weights");
    assert!(before == after, "an existing model was rewritten");
}

#[test]
fn an_empty_dir_takes_the_preset() {
    let tmp = tempfile::tempdir().expect("tempdir");
    trainer(tmp.path(), r#"{"init_preset": "tiny"}"#).expect("trainer over an empty dir");
    for f in FILES {
        assert!(tmp.path().join(f).is_file(), "{f}");
    }
}

#[test]
fn an_unknown_preset_is_one_problem_at_its_key() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model = tmp.path().join("m");
    let problems = validate(&model, r#"{"init_preset": "huge"}"#);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].key.as_str(), "init_preset");
    assert!(problems[0].message.contains("huge"), "{problems:?}");
    assert!(
        problems[0].help.contains("tiny, small, big"),
        "{problems:?}"
    );
    let e = refused(&model, r#"{"init_preset": "huge"}"#);
    assert!(
        e.contains("init_preset") && e.contains("invalid_input"),
        "{e}"
    );
    assert!(!model.exists(), "a refused preset created the directory");
}

#[test]
fn a_non_empty_dir_without_config_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::write(tmp.path().join("notes.txt"), "mine").expect("write");
    let options = r#"{"init_preset": "tiny"}"#;
    let problems = validate(tmp.path(), options);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].key.as_str(), "init_preset");
    let e = refused(tmp.path(), options);
    let dir = tmp.path().display().to_string();
    assert!(e.contains(&dir) && e.contains("invalid_input"), "{e}");
    assert!(!e.contains('\n'), "{e}");
    assert_eq!(names(tmp.path()), ["notes.txt"]);
}

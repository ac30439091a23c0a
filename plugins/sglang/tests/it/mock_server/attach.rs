//! Attach mode on a server that serves another model: the job's model is loaded into it at
//! start (`/update_weights_from_disk` at the served version); a server that cannot load it is
//! one error line and the engine does not start.

use super::*;

/// A stand-in whose `/model_info` names `/other`; `load` answers the first load.
fn serving_another(load: Option<Reply>) -> Mock {
    let mut load = load;
    Mock::start(Box::new(move |_, path, _| match path {
        "/model_info" => Some(Reply::Json(
            200,
            json!({"model_path": "/other", "weight_version": "0"}),
        )),
        "/update_weights_from_disk" => load.take(),
        _ => None,
    }))
}

#[test]
fn attaching_loads_the_jobs_model_into_a_server_that_serves_another() {
    let mock = serving_another(None);
    let _h = engine(&mock, "");
    assert_eq!(
        calls(&mock),
        want(&[(
            "/update_weights_from_disk",
            json!({"model_path": "/nonexistent", "weight_version": "0"})
        )])
    );

    let refusal = json!({"success": false, "message": "no such directory: /nonexistent"});
    let mock = serving_another(Some(Reply::Json(400, refusal)));
    let failure = match EngineHarness::new(setup(&mock, "")) {
        Ok(_) => panic!("started on a server that could not load the job's model"),
        Err(f) => f.to_string(),
    };
    assert!(
        failure.contains("serves /other, not the job's model /nonexistent")
            && failure.contains("no such directory"),
        "{failure}"
    );
}

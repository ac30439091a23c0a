//! Engine check of the hidden-state and drafter calls (API level 3): an engine that declares
//! `hidden_states` at level 3 computes well-formed, deterministic features and refuses layers
//! it does not have; any other engine answers `NotSupported`. A drafter that cannot be loaded
//! is refused and the engine keeps serving.

use super::EngineHarness;
use crate::expect::{not_supported, ok, refused};
use crate::harness::{Failure, Outcome};
use tandem_plugin_api::{FeatureRoute, HiddenStatesRequest, ROption, RVec, api_level};

fn request(h: &EngineHarness, layers: &[u32]) -> HiddenStatesRequest {
    HiddenStatesRequest {
        sequences: h
            .setup
            .prompts
            .iter()
            .map(|p| p.iter().copied().collect())
            .collect(),
        layers: RVec::from(layers.to_vec()),
        adapter: ROption::RNone,
        route: FeatureRoute::Inline,
    }
}

/// `hidden_states` as declared; `load_drafter` of a missing directory refused, serving on.
pub fn hidden_states_as_declared(h: &mut EngineHarness) -> Outcome {
    let declared = h.decl.caps.hidden_states && h.api_level >= api_level::HIDDEN;
    if !declared {
        not_supported(h.engine.hidden_states(request(h, &[0])), "hidden_states")?;
    } else {
        let rule = "hidden_states computes one row per token, the same twice";
        let a = ok(
            h.engine.hidden_states(request(h, &[0])),
            rule,
            "hidden_states",
        )?;
        let b = ok(
            h.engine.hidden_states(request(h, &[0])),
            rule,
            "hidden_states",
        )?;
        let tokens: usize = h.setup.prompts.iter().map(Vec::len).sum();
        if a.rows as usize != tokens
            || a.width == 0
            || a.features.len() != tokens * a.width as usize
        {
            return Err(Failure::new(
                rule,
                format!(
                    "{tokens} tokens gave {} rows of width {} and {} values",
                    a.rows,
                    a.width,
                    a.features.len()
                ),
            ));
        }
        if a.features != b.features || a.features.iter().any(|x| !x.is_finite()) {
            return Err(Failure::new(
                rule,
                "two calls differ, or a value is not finite",
            ));
        }
        let two = ok(
            h.engine.hidden_states(request(h, &[0, 0])),
            rule,
            "hidden_states",
        )?;
        if two.width != 2 * a.width {
            return Err(Failure::new(
                "a row holds every requested layer",
                format!("one layer: width {}, two layers: {}", a.width, two.width),
            ));
        }
        refused(
            h.engine.hidden_states(request(h, &[1_000_000])),
            "a layer the model does not have is refused",
            "hidden_states(layer 1000000)",
        )?;
    }
    let missing = h.setup.model.join("no-such-drafter");
    let r = h.engine.load_drafter(missing.display().to_string().into());
    if declared {
        refused(
            r,
            "a drafter that cannot load is refused",
            "load_drafter(missing)",
        )?;
    } else {
        not_supported(r, "load_drafter")?;
    }
    h.generate("the engine keeps serving after a refused drafter")
        .map(drop)
}

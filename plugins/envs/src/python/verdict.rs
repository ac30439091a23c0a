//! What the user's code answered for one sample, and the [`Reward`] it becomes: a finite
//! value inside the declared range is `ok`; `None` is `not_applicable`; a raise, a NaN or an
//! infinity, a value out of range, or no answer at all (a timeout, a dead worker, a list of the
//! wrong length) is `failed` with the reason. Never a silent 0.

use serde_json::Value;
use tandem_plugin_api::Reward;

/// One sample's answer from a worker.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// A finite value and its (finite) components.
    Value {
        /// The reward.
        value: f64,
        /// Named components, in the order given.
        components: Vec<(String, f64)>,
    },
    /// The code returned `None`.
    NotApplicable,
    /// The code returned a NaN or an infinity (as the worker wrote it).
    NonFinite(String),
    /// The code raised (`Type: message`), or returned something that is not a reward.
    Error(String),
}

impl Entry {
    /// Parses the worker's entry object.
    pub(crate) fn from_json(v: &Value) -> Result<Entry, String> {
        if let Some(e) = v.get("error") {
            return Ok(Entry::Error(e.as_str().unwrap_or("error").to_string()));
        }
        if v.get("none").is_some() {
            return Ok(Entry::NotApplicable);
        }
        if let Some(n) = v.get("nonfinite") {
            return Ok(Entry::NonFinite(n.as_str().unwrap_or("nan").to_string()));
        }
        let Some(value) = v.get("value").and_then(Value::as_f64) else {
            return Err(format!("the worker answered an unreadable entry {v}"));
        };
        let components = v
            .get("components")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, x)| Some((k.clone(), x.as_f64()?)))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Entry::Value { value, components })
    }
}

/// Formats a range bound without a trailing `.0`.
fn bound(x: f64) -> String {
    format!("{x}")
}

/// The reward of one outcome; `range` is the declared `[min, max]` of `ok` values, `what` names
/// the code (``Python reward `m:f` ``) at the head of every reason.
pub fn reward(outcome: Result<Entry, String>, range: (f64, f64), what: &str) -> Reward {
    match outcome {
        Err(reason) => Reward::failed(format!("{what}: {reason}")),
        Ok(Entry::Error(e)) => Reward::failed(format!("{what} raised {e}")),
        Ok(Entry::NonFinite(v)) => Reward::failed(format!("{what} returned {v}")),
        Ok(Entry::NotApplicable) => Reward::not_applicable(format!("{what} returned None")),
        Ok(Entry::Value { value, components }) => {
            let (lo, hi) = range;
            if !(lo..=hi).contains(&value) {
                return Reward::failed(format!(
                    "{what} returned {value}, outside the declared reward range [{}, {}] \
                     (set `reward_range` if that is intended)",
                    bound(lo),
                    bound(hi)
                ));
            }
            // A value inside the range can still round out of it as f32; keep it inside.
            let v32 = (value as f32).clamp(lo as f32, hi as f32);
            components
                .iter()
                .fold(Reward::ok(v32), |r, (name, x)| r.with_component(name, *x))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;
    use tandem_plugin_api::RewardStatus;

    fn of(v: Value) -> Reward {
        reward(Entry::from_json(&v), (0.0, 1.0), "f")
    }

    #[test]
    fn every_non_value_is_a_failure_or_not_applicable_never_zero() {
        let ok = of(json!({"value": 0.5, "components": {"acc": 1.0}}));
        assert_eq!((ok.status, ok.value), (RewardStatus::Ok, 0.5));
        assert_eq!(ok.components[0].name.as_str(), "acc");
        let out = of(json!({"value": 1.5, "components": {}}));
        assert_eq!(out.status, RewardStatus::Failed);
        assert!(
            out.reason
                .contains("outside the declared reward range [0, 1]"),
            "{}",
            out.reason
        );
        let nan = of(json!({"nonfinite": "nan"}));
        assert_eq!(nan.status, RewardStatus::Failed);
        assert_eq!(nan.reason.as_str(), "f returned nan");
        let raised = of(json!({"error": "ValueError: boom"}));
        assert_eq!(raised.reason.as_str(), "f raised ValueError: boom");
        assert_eq!(
            of(json!({"none": true})).status,
            RewardStatus::NotApplicable
        );
        let garbage = of(json!({"what": 1}));
        assert_eq!(garbage.status, RewardStatus::Failed);
    }
}

//! The bad jobs: each the quickstart with one change, the key its error names.

/// One bad job: `(what is replaced, by what)` edits of the quickstart, the key path the error
/// must name, and a text on the offending key's line (the expected line number is its line
/// in the edited job).
pub(super) struct Case {
    pub name: &'static str,
    pub edits: &'static [(&'static str, &'static str)],
    pub key: &'static str,
    pub line_of: &'static str,
}

pub(super) const CASES: &[Case] = &[
    Case {
        name: "unknown [engine.options] key",
        edits: &[("max_batch = 64", "max_bach = 64")],
        key: "engine.options.max_bach",
        line_of: "max_bach = 64",
    },
    Case {
        name: "wrong type of a native engine option",
        edits: &[("max_seq_len = 64", "max_seq_len = \"64\"")],
        key: "engine.options.max_seq_len",
        line_of: "max_seq_len = \"64\"",
    },
    Case {
        name: "out-of-range engine option",
        edits: &[("max_batch = 64", "max_batch = 0")],
        key: "engine.options.max_batch",
        line_of: "max_batch = 0",
    },
    Case {
        name: "unknown [trainer.options] key",
        edits: &[(
            "[bridge]\n",
            "[trainer.options]\nweight_decai = 0.1\n\n[bridge]\n",
        )],
        key: "trainer.options.weight_decai",
        line_of: "weight_decai",
    },
    Case {
        name: "bad LoRA target, nested with an index",
        edits: &[
            ("mode = \"ipc\"", "mode = \"lora\""),
            (
                "[bridge]\n",
                "[trainer.options.lora]\nrank = 8\nalpha = 16\ntargets = [\"q_proj\", \"qkv\"]\n\n[bridge]\n",
            ),
        ],
        key: "trainer.options.lora.targets[1]",
        line_of: "targets = ",
    },
    Case {
        name: "unknown [bridge.options] key",
        edits: &[(
            "mode = \"ipc\"",
            "mode = \"ipc\"\n\n[bridge.options]\nrestrt = true",
        )],
        key: "bridge.options.restrt",
        line_of: "restrt = true",
    },
    Case {
        name: "bad `restart` value",
        edits: &[(
            "mode = \"ipc\"",
            "mode = \"checkpoint\"\n\n[bridge.options]\nrestart = \"yes\"",
        )],
        key: "bridge.options.restart",
        line_of: "restart = \"yes\"",
    },
    Case {
        name: "bridge no loaded plugin provides",
        edits: &[("mode = \"ipc\"", "mode = \"zip\"")],
        key: "bridge.mode",
        line_of: "mode = \"zip\"",
    },
    Case {
        name: "bridge mode the engine does not declare",
        edits: &[(
            "[engine]\nplugin = \"native\"\n\n[engine.options]\nmax_batch = 64\nmax_seq_len = 64\n",
            "[engine]\nplugin = \"fixture-alpha\"\n",
        )],
        key: "bridge.mode",
        line_of: "mode = \"ipc\"",
    },
    Case {
        name: "lora bridge with a trainer that fine-tunes every weight",
        edits: &[("mode = \"ipc\"", "mode = \"lora\"")],
        key: "bridge.mode",
        line_of: "mode = \"lora\"",
    },
    Case {
        name: "ipc bridge with a trainer that trains LoRA",
        edits: &[(
            "[bridge]\n",
            "[trainer.options.lora]\nrank = 8\nalpha = 16\n\n[bridge]\n",
        )],
        key: "bridge.mode",
        line_of: "mode = \"ipc\"",
    },
    Case {
        name: "checkpoint bridge with a trainer that trains LoRA",
        edits: &[
            ("mode = \"ipc\"", "mode = \"checkpoint\""),
            (
                "[bridge]\n",
                "[trainer.options.lora]\nrank = 8\nalpha = 16\n\n[bridge]\n",
            ),
        ],
        key: "bridge.mode",
        line_of: "mode = \"checkpoint\"",
    },
    Case {
        name: "verify with a trainer that computes no digests",
        edits: &[
            (
                "[bridge]\n",
                "[trainer.options]\ndigest = false\n\n[bridge]\n",
            ),
            ("mode = \"ipc\"", "mode = \"ipc\"\nverify = true"),
        ],
        key: "bridge.verify",
        line_of: "verify = true",
    },
    Case {
        name: "[trainer] ranks = 2 for native",
        edits: &[(
            "[trainer]\nplugin = \"native\"\n",
            "[trainer]\nplugin = \"native\"\nranks = 2\n",
        )],
        key: "trainer.ranks",
        line_of: "ranks = 2",
    },
    Case {
        name: "temperature = -1",
        edits: &[("temperature = 1.0", "temperature = -1.0")],
        key: "algorithm.temperature",
        line_of: "temperature = -1.0",
    },
    Case {
        name: "learning_rate = 0",
        edits: &[("learning_rate = 0.0003", "learning_rate = 0.0")],
        key: "algorithm.learning_rate",
        line_of: "learning_rate = 0.0",
    },
    Case {
        name: "negative clip_eps",
        edits: &[("clip_eps = 0.2", "clip_eps = -0.2")],
        key: "algorithm.clip_eps",
        line_of: "clip_eps = -0.2",
    },
    Case {
        name: "clip_high beside clip_eps",
        edits: &[("clip_eps = 0.2", "clip_eps = 0.2\nclip_high = 0.28")],
        key: "algorithm.clip_high",
        line_of: "clip_high = 0.28",
    },
    Case {
        name: "clip_low = 1",
        edits: &[("clip_eps = 0.2", "clip_low = 1.0")],
        key: "algorithm.clip_low",
        line_of: "clip_low = 1.0",
    },
    Case {
        name: "negative clip_high",
        edits: &[("clip_eps = 0.2", "clip_high = -0.1")],
        key: "algorithm.clip_high",
        line_of: "clip_high = -0.1",
    },
    Case {
        name: "unknown loss_agg",
        edits: &[("kl_coef = 0.0", "kl_coef = 0.0\nloss_agg = \"sum\"")],
        key: "algorithm.loss_agg",
        line_of: "loss_agg = ",
    },
    Case {
        name: "unknown ratio",
        edits: &[("kl_coef = 0.0", "kl_coef = 0.0\nratio = \"group\"")],
        key: "algorithm.ratio",
        line_of: "ratio = ",
    },
    Case {
        name: "unknown kl_estimator",
        edits: &[("kl_coef = 0.0", "kl_coef = 0.0\nkl_estimator = \"k2\"")],
        key: "algorithm.kl_estimator",
        line_of: "kl_estimator = ",
    },
    Case {
        name: "unknown kl_in",
        edits: &[("kl_coef = 0.0", "kl_coef = 0.1\nkl_in = \"advantage\"")],
        key: "algorithm.kl_in",
        line_of: "kl_in = ",
    },
    Case {
        name: "kl_in = reward without a KL coefficient",
        edits: &[("kl_coef = 0.0", "kl_coef = 0.0\nkl_in = \"reward\"")],
        key: "algorithm.kl_in",
        line_of: "kl_in = ",
    },
    Case {
        name: "unknown scale_rewards",
        edits: &[("kl_coef = 0.0", "kl_coef = 0.0\nscale_rewards = \"std\"")],
        key: "algorithm.scale_rewards",
        line_of: "scale_rewards = ",
    },
    Case {
        name: "dynamic_sampling not a bool",
        edits: &[("kl_coef = 0.0", "kl_coef = 0.0\ndynamic_sampling = \"yes\"")],
        key: "algorithm.dynamic_sampling",
        line_of: "dynamic_sampling = ",
    },
    Case {
        name: "max_sampling_rounds = 0",
        edits: &[(
            "kl_coef = 0.0",
            "kl_coef = 0.0\ndynamic_sampling = true\nmax_sampling_rounds = 0",
        )],
        key: "algorithm.max_sampling_rounds",
        line_of: "max_sampling_rounds = 0",
    },
    Case {
        name: "dynamic sampling beside the bubble's drafter",
        edits: &[(
            "kl_coef = 0.0",
            "kl_coef = 0.0\ndynamic_sampling = true\n\n[drafter]\nenabled = true",
        )],
        key: "algorithm.dynamic_sampling",
        line_of: "dynamic_sampling = true",
    },
    Case {
        name: "train_steps_per_rollout = 0",
        edits: &[(
            "kl_coef = 0.0",
            "kl_coef = 0.0\ntrain_steps_per_rollout = 0",
        )],
        key: "algorithm.train_steps_per_rollout",
        line_of: "train_steps_per_rollout = 0",
    },
    Case {
        name: "PPO without a critic",
        edits: &[("name = \"grpo\"", "name = \"ppo\"")],
        key: "algorithm.name",
        line_of: "name = \"ppo\"",
    },
    Case {
        name: "a critic without PPO",
        edits: &[(
            "[bridge]\n",
            "[critic]\nplugin = \"native\" # the critic\n\n[bridge]\n",
        )],
        key: "critic.plugin",
        line_of: "# the critic",
    },
    Case {
        name: "a critic that cannot be a value model",
        edits: &[
            ("name = \"grpo\"", "name = \"ppo\""),
            (
                "[bridge]\n",
                "[critic]\nplugin = \"native-drafter\"\n\n[bridge]\n",
            ),
        ],
        key: "critic.plugin",
        line_of: "plugin = \"native-drafter\"",
    },
    Case {
        name: "PPO's gamma out of range",
        edits: &[
            ("name = \"grpo\"", "name = \"ppo\"\ngamma = 1.5"),
            ("[bridge]\n", "[critic]\nplugin = \"native\"\n\n[bridge]\n"),
        ],
        key: "algorithm.gamma",
        line_of: "gamma = 1.5",
    },
    Case {
        name: "transport timeout of 0",
        edits: &[("[task]\n", "[transport]\ntimeout_secs = 0.0\n\n[task]\n")],
        key: "transport.timeout_secs",
        line_of: "timeout_secs = 0.0",
    },
    Case {
        name: "model.path missing without init_preset",
        edits: &[("init_preset = \"tiny\"\n", "")],
        key: "model.path",
        line_of: "path = \"MODEL\"",
    },
    Case {
        name: "bad task option",
        edits: &[("max_operand = 3", "max_operand = 0")],
        key: "task.options.max_operand",
        line_of: "max_operand = 0",
    },
];

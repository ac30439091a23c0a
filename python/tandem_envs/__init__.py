"""Python environments and rewards shipped with Tandem (embedded in the binary by the `envs`
plugin and put on the workers' sys.path, after the job's own directories).

- `tandem_envs.reasoning_gym_env:ReasoningGym`: a mix of reasoning-gym tasks as an environment.
- `tandem_envs.math_verify_reward:compute_score`: a verl-signature reward over math-verify.
"""

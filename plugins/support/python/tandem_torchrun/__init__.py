"""What every torchrun trainer worker of Tandem shares (the fsdp and megatron plugins).

- ``rank``: the rank loop — rank 0 holds the plugin's control channel, every rank runs each
  operation, any rank's exception becomes the one reply.
- ``channel``: the framed JSON channel to the plugin.
- ``loss``: the policy and SFT losses (the native trainer's definition, in torch).
- ``batch``: right-padded batches and their completion masks.
- ``files``: the run-directory file contract (twin of ``tandem_plugin_api::files``): state file, versions, publication, weights digest.
- ``export``: an export's version directory (staged, published) and the ``st256`` digest of the tensors as they are written.
- ``state``: the init/offload guard, actor/ref snapshots, memory tags, stats (the base class of the workers' trainers).

The plugin library embeds this package and writes it beside its own worker package.
"""

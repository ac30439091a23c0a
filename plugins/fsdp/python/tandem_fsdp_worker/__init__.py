"""Tandem's `fsdp` trainer worker: one process per rank under torchrun, driven by the
`fsdp` plugin (libtandem_fsdp.so) over a framed JSON channel. See plugins/fsdp/NOTES.md."""

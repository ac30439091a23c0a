"""Entry point of one rank: ``python -m tandem_megatron_worker`` under torchrun (the rank loop
of ``tandem_torchrun.rank`` around ``MegatronTrainer``)."""

from tandem_torchrun.rank import main

from .trainer import MegatronTrainer

if __name__ == "__main__":
    try:
        main(MegatronTrainer)
    except KeyboardInterrupt:
        raise SystemExit(130)

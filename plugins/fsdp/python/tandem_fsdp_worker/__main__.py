"""Entry point of one rank: ``python -m tandem_fsdp_worker`` under torchrun (the rank loop of
``tandem_torchrun.rank`` around ``FsdpTrainer``)."""

from tandem_torchrun.rank import main

from .trainer import FsdpTrainer

if __name__ == "__main__":
    try:
        main(FsdpTrainer)
    except KeyboardInterrupt:
        raise SystemExit(130)

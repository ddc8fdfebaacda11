"""``python -m genrm_sim``: the same entry point as the ``genrm-sim`` console script."""

from genrm_sim.cli import main

main()

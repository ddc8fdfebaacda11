"""``python -m genrm_gateway``: the same entry point as the ``genrm-gateway`` console script."""

from genrm_gateway.cli import main

main()

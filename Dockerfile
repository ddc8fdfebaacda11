# syntax=docker/dockerfile:1.7
# Images of genrm-operator: `docker build --target <operator|gateway|sim|engine> .` (see `make images`).
#
# Every image installs the project with the same pinned set CI tests with (constraints.txt), from one
# wheel built once, into a virtualenv that is copied whole: one small layer, no compiler, no pip cache.

# The base of the operator, gateway and simulator images: any Debian-like image whose python3 is 3.11
# with venv (hack/images.sh makes one with debootstrap where this one cannot be pulled).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# The engine image adds the gateway package to SGLang, of the release the simulator and the tests
# follow (engine/genrm_sim/sglang_contract.json; tests/contract checks the tag).
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.23

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# The CA bundle of a TLS-intercepting proxy, mounted by the builder for this stage's pip only (hack/images.sh).
ARG PIP_CERT
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY operator/ operator/
COPY gateway/ gateway/
COPY contract/ contract/
COPY engine/ engine/
# python3 and the virtualenv's own pip: a Debian base has neither `python` nor a system pip.
RUN python3 -m venv /opt/genrm \
 && /opt/genrm/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/genrm/bin/pip install -c constraints.txt /wheels/*.whl

FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --gid 10001 genrm \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin genrm
COPY --from=build /opt/genrm /opt/genrm
ENV PATH=/opt/genrm/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /tmp

# The Kubernetes operator (the Helm chart's Deployment).
FROM runtime AS operator
EXPOSE 8080 8081
ENTRYPOINT ["genrm-operator"]

# The sidecar of every judge pod; its preStop hook is `genrm-gateway drain --wait`.
FROM runtime AS gateway
EXPOSE 8000
ENTRYPOINT ["genrm-gateway"]
CMD ["serve"]

# The SGLang-compatible simulator, for clusters without GPUs.
FROM runtime AS sim
EXPOSE 30000
ENTRYPOINT ["genrm-sim"]

# SGLang plus the project's gateway package. The engine container's preStop hook needs only
# python3 (already in the image); genrm-gateway lives in its own virtualenv so SGLang's
# dependencies stay untouched, and is linked onto PATH for drains run by hand.
FROM ${SGLANG_IMAGE} AS engine
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY constraints.txt /tmp/genrm/constraints.txt
COPY --from=build /wheels/ /tmp/genrm/wheels/
RUN python3 -m venv /opt/genrm \
 && /opt/genrm/bin/pip install -c /tmp/genrm/constraints.txt /tmp/genrm/wheels/*.whl \
 && ln -s /opt/genrm/bin/genrm-gateway /usr/local/bin/genrm-gateway \
 && rm -rf /tmp/genrm \
 && groupadd --gid 10001 genrm \
 && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/genrm --shell /usr/sbin/nologin genrm
ENV HOME=/home/genrm
USER 10001:10001
ENTRYPOINT ["python3", "-m", "sglang.launch_server"]

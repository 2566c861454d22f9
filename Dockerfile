# Worker image for docker-compose.yml: `nebula-mq worker --role ROLE --config FILE`.
FROM python:3.11-slim
WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1
COPY pyproject.toml README.md ./
COPY nebula_mq ./nebula_mq
COPY workers ./workers
COPY broker ./broker
RUN pip install ".[train]"
ENTRYPOINT []
CMD ["nebula-mq", "--help"]

# The operator image: `docker build -t inferentia-operator:0.2.0 .`, then push it where your
# nodes pull from. The operator runs it, and so do its models' pods: the artefact fetch and
# upload (boto3, the [s3] extra) and the batching front end.
# Build stage: the project and its dependencies as wheels.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[s3]'

# Final stage: the wheels installed, nothing to build with, a non-root user.
FROM python:3.11-slim
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels 'inferentia-operator[s3]' \
    && pip uninstall --yes pip setuptools wheel
# The chart runs it with a read-only root filesystem: no bytecode to write.
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 65532:65532
ENTRYPOINT ["inferentia-operator"]
CMD ["run"]

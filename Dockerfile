# One image for every gpufrac component: `gpufrac scheduler`, `gpufrac webhook`, `gpufrac agent`.
# Build: docker build -t gpufrac:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m pip install --no-cache-dir --upgrade pip \
 && python -m pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
COPY --from=build /wheels /wheels
RUN python -m pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# The scheduler and webhook run as this user; the node agent's DaemonSet runs privileged as root.
USER 65532:65532
ENTRYPOINT ["gpufrac"]
CMD ["--help"]

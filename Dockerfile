# Two images from one file:
#   service: the API and the analysis worker (no torch, no GPU)
#   runner:  the GPU agent that executes workloads (CUDA build of torch from the base image)
# Build: docker compose build   (see docs/service.md)
# Both copy the whole build context; .dockerignore keeps it to the product (every package that
# pyproject.toml lists, their data, the demo bundles): tests/service/test_image_tree.py checks it.

FROM python:3.11-slim AS service
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY . .
RUN pip install '.[fast,s3]' && useradd --uid 10001 --create-home cptrace \
    && mkdir -p /data && chown cptrace /data
USER cptrace
VOLUME ["/data"]
EXPOSE 8000
CMD ["cptrace", "serve", "--host", "0.0.0.0", "--port", "8000", "--data-dir", "/data", "--no-worker"]

# The runner needs CUDA torch and, for nsys captures, Nsight Systems on the host image.
FROM pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime AS runner
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY . .
RUN pip install '.[runner]'
CMD ["cptrace", "agent", "--server", "http://api:8000", "--gpus", "2"]

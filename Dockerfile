# The audit-ledger service image: the same set-up a developer runs (scripts/setup.sh).
FROM python:3.11-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends nodejs npm git \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . .
RUN scripts/setup.sh
EXPOSE 8080
CMD [".venv/bin/audit-ledger", "serve"]

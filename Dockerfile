# syntax=docker/dockerfile:1

# ---- build ----
FROM rust:1-slim-bookworm AS build
WORKDIR /src
# Dependencies first, so source edits do not rebuild them.
COPY Cargo.toml Cargo.lock ./
COPY benches benches
RUN mkdir -p src/bin && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && echo 'fn main() {}' > src/bin/switchboard-channel.rs \
    && cargo build --release --locked \
    && rm -rf src
COPY src src
COPY migrations migrations
RUN touch src/main.rs src/lib.rs src/bin/switchboard-channel.rs && cargo build --release --locked --bins

# ---- run ----
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/switchboard --create-home switchboard
COPY --from=build /src/target/release/switchboard /usr/local/bin/switchboard
# The channel plugin on its own: `switchboard channel` runs it when it is beside it.
COPY --from=build /src/target/release/switchboard-channel /usr/local/bin/switchboard-channel
COPY config/switchboard.example.toml /etc/switchboard/switchboard.toml
# The ledger lives here; mount a volume so it survives the container.
VOLUME ["/var/lib/switchboard"]
WORKDIR /var/lib/switchboard
USER switchboard
ENV SWITCHBOARD__STORAGE__DATABASE=/var/lib/switchboard/switchboard.db
ENV SWITCHBOARD__STORAGE__UPLOADS_DIR=/var/lib/switchboard/uploads
EXPOSE 7797
# Ready: the ledger takes writes and Telegram serves the poller (GET /readyz). The image
# has no curl: the binary asks its own daemon, at the address the configuration (and its
# SWITCHBOARD__API__LISTEN override) names.
HEALTHCHECK --interval=30s --timeout=15s --start-period=30s --retries=3 \
    CMD ["/usr/local/bin/switchboard", "healthcheck", "--config", "/etc/switchboard/switchboard.toml"]
ENTRYPOINT ["/usr/local/bin/switchboard"]
CMD ["run", "--config", "/etc/switchboard/switchboard.toml"]

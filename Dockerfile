# syntax=docker/dockerfile:1
#
# The DaemonSet's image for `docker buildx`, multi-platform:
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     -t REGISTRY/linkerd-cni-ebpf:v0.1.0 --push .
#
# It holds the same two files as the image `cargo xtask image` builds, built by the same task
# (`cargo xtask dist`): the agent on PATH and the plugin where the installer copies it from.
# `cargo xtask image` is the reference build (no Docker needed, reproducible: the same digest
# for every build of a commit); this file gives the same file layout, but buildx writes its own
# config, so not the same digest.
#
# Both platforms are built on the build machine's own platform (BUILDPLATFORM) and
# cross-compiled, as `cargo xtask image` does; nothing runs under emulation.

ARG RUST_VERSION=1.95

# Debian's toolchain for the eBPF object and for std of the static targets, the cross
# toolchain, bpf-linker (`cargo xtask setup --build-only`: only what building needs).
FROM --platform=$BUILDPLATFORM rust:${RUST_VERSION}-bookworm AS toolchain
WORKDIR /src
COPY . .
RUN cargo xtask setup --build-only

# One build per target platform, cross-compiled on the build platform.
FROM toolchain AS build
ARG TARGETARCH
RUN cargo xtask dist --arch "${TARGETARCH}" --out /rootfs

# Nothing but the two static binaries: no shell, no libraries.
FROM scratch
COPY --from=build /rootfs/ /
ENV PATH=/usr/local/bin:/usr/bin:/bin
ENTRYPOINT ["linkerd-cni-agent"]
CMD ["run"]
LABEL org.opencontainers.image.title="linkerd-cni-ebpf" \
      org.opencontainers.image.description="linkerd-cni in eBPF mode: the node agent (also the installer) and the CNI plugin" \
      org.opencontainers.image.source="https://github.com/linkerd/linkerd-cni-ebpf" \
      org.opencontainers.image.licenses="Apache-2.0"

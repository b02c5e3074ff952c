# meshca's container image, for machines with a container daemon or
# builder (BuildKit, buildah):
#
#   docker build --build-arg VERSION="$(git describe --tags --always --dirty)" -t meshca .
#
# Without one, `make image` (hack/image) writes an image of the same files
# to _out/meshca-image.tar, reproducibly, with go-containerregistry. Both
# are FROM scratch and hold only /meshca (static: CGO_ENABLED=0), the
# nonroot user and group 65532 in /etc/passwd and /etc/group, and /tmp
# (1777). No shell, no package manager and no CA certificates: meshca's
# peers are in-cluster or given with their roots (the apiserver's from the
# service account or kubeconfig; Vault's and cfssl's by --vault-ca-file and
# --cfssl-tls-ca-file, or a mounted bundle named by SSL_CERT_FILE).

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=dev
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The flags of hack/image's build (build.go), so both images hold the
# same binary for the same Go release and VERSION.
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -buildvcs=false -ldflags "-s -w -X main.version=${VERSION}" -o /rootfs/meshca ./cmd/meshca
# The rest of hack/image's root filesystem (rootfs.go), owned by 0:0.
RUN mkdir -p /rootfs/etc /rootfs/tmp && chmod 1777 /rootfs/tmp && \
    printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin' > /rootfs/etc/passwd && \
    printf '%s\n' 'root:x:0:' 'nonroot:x:65532:' > /rootfs/etc/group && \
    chmod 0644 /rootfs/etc/passwd /rootfs/etc/group && chmod 0755 /rootfs/meshca

# The HSM variant (make image-hsm; docs/layout.md): the pkcs11 upstream
# needs cgo, so meshca is linked to glibc and the image holds the dynamic
# loader and the libraries the binary names, from Debian 12 (glibc 2.36,
# the oldest a vendor's PKCS#11 module may need). Built on and for the
# target's own platform (cgo does not cross-compile here):
#
#   docker build --target hsm --build-arg VERSION=... -t meshca-hsm .
FROM golang:${GO_VERSION}-bookworm AS build-hsm
ARG VERSION=dev
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# hack/image's hsm variant's flags (variant.go), so both images hold the
# same binary.
RUN CGO_ENABLED=1 go build -trimpath -buildvcs=false -tags pkcs11,netgo,osusergo \
    -ldflags "-s -w -X main.version=${VERSION}" -o /rootfs/meshca ./cmd/meshca
RUN mkdir -p /rootfs/etc /rootfs/tmp && chmod 1777 /rootfs/tmp && \
    printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin' > /rootfs/etc/passwd && \
    printf '%s\n' 'root:x:0:' 'nonroot:x:65532:' > /rootfs/etc/group && \
    chmod 0644 /rootfs/etc/passwd /rootfs/etc/group && chmod 0755 /rootfs/meshca
# The loader and every library the binary needs, at the paths it names.
RUN for f in $(ldd /rootfs/meshca | sed -n 's/.*=> \(\/[^ ]*\).*/\1/p;t;s/^[[:space:]]*\(\/[^ ]*\).*/\1/p'); do \
      mkdir -p "/rootfs$(dirname "$f")" && cp -L "$f" "/rootfs$f" && chmod 0755 "/rootfs$f"; \
    done

FROM scratch AS hsm
ARG VERSION=dev
COPY --from=build-hsm /rootfs/ /
# The vendor's PKCS#11 module and what it needs beyond libc go here.
ENV LD_LIBRARY_PATH=/opt/hsm/lib
USER 65532:65532
WORKDIR /
EXPOSE 15012 15014
LABEL org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/meshca/meshca"
ENTRYPOINT ["/meshca"]
CMD ["serve"]

# The default image, static: the last stage, what a plain docker build makes.
FROM scratch
ARG VERSION=dev
COPY --from=build /rootfs/ /
USER 65532:65532
WORKDIR /
EXPOSE 15012 15014
LABEL org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/meshca/meshca"
ENTRYPOINT ["/meshca"]
CMD ["serve"]

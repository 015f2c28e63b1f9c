# One image with every command: /ingester, /pusher, /standalone and the
# /shardctl CLI (the chart picks one with `command`). Static binaries on distroless, run as
# its non-root user.
#   make docker-image     # docker build -t ghcr.io/shardpilot/shardpilot:<release> .
#   make image            # the same image without docker (hack/image.sh), an OCI archive
FROM golang:1.26.8-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The copy has no .git for Go to read the revision from: make docker-image passes it.
ARG REVISION=unknown
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/shardpilot/shardpilot/internal/version.revision=${REVISION}" -o /out/ ./cmd/ingester ./cmd/pusher ./cmd/standalone ./cmd/shardctl

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ingester /out/pusher /out/standalone /out/shardctl /
USER 65532:65532
EXPOSE 15010 15012 15014 15015 15017
ENTRYPOINT ["/pusher"]

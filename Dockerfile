# The sluice image: a static binary and the CA bundle (so that rediss:// to
# a managed Redis verifies its certificate), nothing else, run as a
# non-root user. It copies a binary built outside, so that the image needs
# no base image from a registry; scripts/container builds the binary and
# the image, then runs it. By hand:
#
#   CGO_ENABLED=0 go build -trimpath -o sluice ./cmd/sluice
#   cp /etc/ssl/certs/ca-certificates.crt .
#   podman build -t localhost/sluice:dev .
FROM scratch
COPY sluice /usr/local/bin/sluice
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
# 65532: the conventional "nonroot" id; the image has no /etc/passwd.
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/sluice"]
# Listen on every interface: inside a container, loopback is unreachable.
CMD ["serve", "--http", ":8080", "--grpc", ":8081"]

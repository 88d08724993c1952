// Package monitoring holds the tests of sluice's operations files: the
// Prometheus alerting rules (deploy/prometheus/alerts.yaml) and the
// Grafana dashboard (deploy/grafana/sluice.json), checked against the
// metrics the service registers; the Dockerfile, the compose example and
// the Kubernetes example, parsed and their shape checked. It is a module
// of its own so that Prometheus, whose parsers the tests use, stays out of
// the library's go.mod.
package monitoring

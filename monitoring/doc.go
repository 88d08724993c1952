// Package monitoring holds the tests of sluice's monitoring files: the
// Prometheus alerting rules (deploy/prometheus/alerts.yaml) and the
// Grafana dashboard (deploy/grafana/sluice.json). It is a module of its
// own so that Prometheus, whose parsers the tests use, stays out of the
// library's go.mod.
package monitoring

// Package monitoring holds the tests of sluice's operations files: the
// Prometheus alerting rules (deploy/prometheus/alerts.yaml) and the
// Grafana dashboard (deploy/grafana/sluice.json), checked against the
// metrics the service registers, and each alert on a count made to fire
// by its first event on a real service, scraped before and after it and
// evaluated with Prometheus's PromQL engine; the Dockerfile, the compose example and
// the Kubernetes example, parsed and their shape checked. It is a module
// of its own so that Prometheus, whose parsers the tests use, stays out of
// the library's go.mod.
package monitoring

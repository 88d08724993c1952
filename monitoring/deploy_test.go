package monitoring

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice/server/config"
)

// The deployment examples are parsed and their shape checked here; they
// are not run (scripts/container runs the image).

// node is a YAML document read loosely, walked with get.
type node = map[string]any

func get[T any](t *testing.T, v any, path ...any) T {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(node)
			if !ok {
				t.Fatalf("%v: not a mapping at %q", path, k)
			}
			v = m[k]
		case int:
			s, ok := v.([]any)
			if !ok || k >= len(s) {
				t.Fatalf("%v: no item %d", path, k)
			}
			v = s[k]
		}
	}
	out, ok := v.(T)
	if !ok {
		t.Fatalf("%v: %T, want %T", path, v, out)
	}
	return out
}

func readYAML(t *testing.T, file string) []node {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var docs []node
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for {
		var d node
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		docs = append(docs, d)
	}
}

func strs(t *testing.T, v any) []string {
	t.Helper()
	var out []string
	for _, s := range v.([]any) {
		out = append(out, s.(string))
	}
	return out
}

// flagValue returns the value after flag in args.
func flagValue(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

func TestDockerfile(t *testing.T) {
	raw, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var from, user, entry string
	var copies []string
	for line := range strings.Lines(string(raw)) {
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch f[0] {
		case "FROM":
			from = f[1]
		case "USER":
			user = f[1]
		case "COPY":
			copies = append(copies, f[len(f)-1])
		case "ENTRYPOINT":
			entry = strings.Join(f[1:], " ")
		}
	}
	if from != "scratch" {
		t.Errorf("FROM %s, want scratch", from)
	}
	if u, _, _ := strings.Cut(user, ":"); u == "" || u == "0" || u == "root" {
		t.Errorf("USER %q: want a non-root user", user)
	}
	if !slices.Contains(copies, "/etc/ssl/certs/ca-certificates.crt") {
		t.Errorf("no CA bundle copied (COPY targets %v)", copies)
	}
	if !strings.Contains(entry, "sluice") {
		t.Errorf("ENTRYPOINT %s", entry)
	}
}

// TestCompose: sluice, Redis and Envoy; sluice's configuration loads;
// Envoy's rate limit filter has a timeout and asks sluice's gRPC port in
// the domain sluice's configuration answers.
func TestCompose(t *testing.T) {
	const dir = "../deploy/compose"
	c := readYAML(t, filepath.Join(dir, "compose.yaml"))[0]
	for _, s := range []string{"redis", "sluice", "envoy"} {
		get[node](t, c, "services", s)
	}
	args := strs(t, get[[]any](t, c, "services", "sluice", "command"))
	if got := flagValue(args, "--redis"); !strings.HasPrefix(got, "redis://redis:") {
		t.Errorf("sluice --redis %q: want the redis service", got)
	}
	grpcPort := strings.TrimPrefix(flagValue(args, "--grpc"), ":")
	mounts := map[string]string{} // container path: file
	for _, svc := range []string{"sluice", "envoy"} {
		for _, v := range strs(t, get[[]any](t, c, "services", svc, "volumes")) {
			parts := strings.Split(v, ":")
			mounts[parts[1]] = filepath.Join(dir, parts[0])
		}
	}
	cfgFile, ok := mounts[flagValue(args, "--config")]
	if !ok {
		t.Fatalf("sluice's --config %q is not mounted", flagValue(args, "--config"))
	}
	cfg, err := config.Load(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	envoyArgs := strs(t, get[[]any](t, c, "services", "envoy", "command"))
	envoy := readYAML(t, mounts[flagValue(envoyArgs, "-c")])[0]
	checkEnvoy(t, envoy)
	hcm := get[node](t, envoy, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config")
	var rl node
	for _, f := range get[[]any](t, hcm, "http_filters") {
		if f.(node)["name"] == "envoy.filters.http.ratelimit" {
			rl = get[node](t, f, "typed_config")
		}
	}
	if rl == nil {
		t.Fatal("envoy.yaml has no rate limit filter")
	}
	if get[string](t, rl, "timeout") == "" {
		t.Error("the rate limit filter has no timeout")
	}
	if _, ok := rl["enable_x_ratelimit_headers"]; ok {
		t.Error("enable_x_ratelimit_headers is set: Envoy would add a second X-RateLimit-Reset beside sluice's (README)")
	}
	// Envoy's rate limit filter asks nothing for a route without a
	// cluster (a direct_response): every route must send to one.
	for _, vh := range get[[]any](t, hcm, "route_config", "virtual_hosts") {
		for _, r := range get[[]any](t, vh, "routes") {
			if _, ok := r.(node)["route"]; !ok {
				t.Errorf("route %v does not send to a cluster: the rate limit filter would never ask sluice", r.(node)["match"])
			}
		}
	}
	if d := get[string](t, rl, "domain"); !slices.Contains(cfg.Domains(), d) {
		t.Errorf("envoy asks domain %q; sluice answers %v", d, cfg.Domains())
	}
	cluster := get[string](t, rl, "rate_limit_service", "grpc_service", "envoy_grpc", "cluster_name")
	for _, cl := range get[[]any](t, envoy, "static_resources", "clusters") {
		if cl.(node)["name"] != cluster {
			continue
		}
		addr := get[node](t, cl, "load_assignment", "endpoints", 0, "lb_endpoints", 0, "endpoint", "address", "socket_address")
		if port, _ := strconv.Atoi(grpcPort); addr["address"] != "sluice" || addr["port_value"] != port {
			t.Errorf("cluster %s points at %v:%v, want sluice:%s", cluster, addr["address"], addr["port_value"], grpcPort)
		}
		get[node](t, cl, "typed_extension_protocol_options") // gRPC needs HTTP/2
		return
	}
	t.Errorf("no cluster %q", cluster)
}

// checkEnvoy reads an Envoy bootstrap with Envoy's own API definitions
// (go-control-plane), typed configs included, and validates it with their
// rules.
func checkEnvoy(t *testing.T, doc node) {
	t.Helper()
	raw, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(raw, &b); err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Errorf("envoy.yaml: %v", err)
	}
}

// TestKubernetes: a ConfigMap whose configuration loads, mounted where the
// Deployment's --config reads it; a non-root pod with probes on /healthz
// and /readyz; a Service with both ports.
func TestKubernetes(t *testing.T) {
	docs := readYAML(t, "../deploy/kubernetes/sluice.yaml")
	byKind := map[string]node{}
	for _, d := range docs {
		byKind[get[string](t, d, "kind")] = d
	}
	for _, k := range []string{"ConfigMap", "Deployment", "Service"} {
		if byKind[k] == nil {
			t.Fatalf("no %s", k)
		}
	}
	cm := byKind["ConfigMap"]
	pod := get[node](t, byKind["Deployment"], "spec", "template", "spec")
	if get[bool](t, pod, "securityContext", "runAsNonRoot") != true {
		t.Error("pod may run as root")
	}
	ctr := get[node](t, pod, "containers", 0)
	args := strs(t, get[[]any](t, ctr, "args"))
	mount := get[node](t, ctr, "volumeMounts", 0)
	dir, file := filepath.Split(flagValue(args, "--config"))
	if filepath.Clean(dir) != get[string](t, mount, "mountPath") {
		t.Errorf("--config %s is not under the mount %s", flagValue(args, "--config"), mount["mountPath"])
	}
	if _, err := config.Parse(file, []byte(get[string](t, cm, "data", file))); err != nil {
		t.Errorf("the ConfigMap's %s: %v", file, err)
	}
	if p := get[string](t, ctr, "livenessProbe", "httpGet", "path"); p != "/healthz" {
		t.Errorf("liveness probe %s", p)
	}
	if p := get[string](t, ctr, "readinessProbe", "httpGet", "path"); p != "/readyz" {
		t.Errorf("readiness probe %s", p)
	}
	var ports []int
	for _, p := range get[[]any](t, byKind["Service"], "spec", "ports") {
		ports = append(ports, get[int](t, p, "port"))
	}
	if !slices.Contains(ports, 8080) || !slices.Contains(ports, 8081) {
		t.Errorf("service ports %v, want 8080 and 8081", ports)
	}
}

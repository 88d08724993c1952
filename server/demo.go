package server

import (
	_ "embed"

	"github.com/sluicehq/sluice/server/config"
)

//go:embed demo.yaml
var demoYAML []byte

// DemoConfig is the configuration `sluice serve` runs with no --config: one
// policy per algorithm, all 5 requests per 10 seconds, so the dashboard's
// Burst 10 shows denials.
func DemoConfig() *config.Config {
	cfg, err := config.Parse("demo.yaml", demoYAML)
	if err != nil { // the file is embedded and tested: this cannot happen
		panic(err)
	}
	return cfg
}

package redisstore

import (
	"embed"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"sluice"
)

//go:embed scripts/*.lua
var scriptFS embed.FS

// scriptFiles names each algorithm's Lua file, indexed by sluice.Algorithm.
var scriptFiles = []string{
	sluice.GCRA:                 "gcra.lua",
	sluice.TokenBucket:          "token_bucket.lua",
	sluice.LeakyBucket:          "leaky_bucket.lua",
	sluice.FixedWindow:          "fixed_window.lua",
	sluice.SlidingWindowLog:     "sliding_window_log.lua",
	sluice.SlidingWindowCounter: "sliding_window_counter.lua",
}

// Scripts are composed once at init: common.lua holds the helpers and entry
// points, each algorithm file registers its functions, and a final return
// picks the entry point. One script per algorithm keeps each script small;
// the TakeAll script holds all six.
var (
	oneScripts  = make([]*redis.Script, len(scriptFiles))
	takeAllLua  *redis.Script
	scriptTexts = make([]string, len(scriptFiles)) // the one-key sources, for tests
)

func init() {
	common := mustRead("common.lua")
	var all strings.Builder
	all.WriteString(common)
	for a, name := range scriptFiles {
		body := mustRead(name)
		scriptTexts[a] = common + "\n" + body + "\nreturn take_one()\n"
		oneScripts[a] = redis.NewScript(scriptTexts[a])
		all.WriteString("\n")
		all.WriteString(body)
	}
	all.WriteString("\nreturn take_all()\n")
	takeAllLua = redis.NewScript(all.String())
}

func mustRead(name string) string {
	b, err := scriptFS.ReadFile("scripts/" + name)
	if err != nil {
		panic(fmt.Sprintf("redisstore: embedded script %s: %v", name, err)) // a build defect, not a runtime input
	}
	return string(b)
}

package redisstore

import (
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice"
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

// replyLen is the length of each algorithm's take/peek reply: allowed,
// remaining, retry and reset, plus a token where a refund needs one.
var replyLen = []int{
	sluice.GCRA:                 4,
	sluice.TokenBucket:          4,
	sluice.LeakyBucket:          4,
	sluice.FixedWindow:          5,
	sluice.SlidingWindowLog:     5,
	sluice.SlidingWindowCounter: 5,
}

// script is a Lua script and the SHA-1 digest EVALSHA names it by.
type script struct {
	src string
	sha any // a string, boxed once: the argument of every EVALSHA
}

func newScript(src string) *script {
	sum := sha1.Sum([]byte(src))
	return &script{src: src, sha: hex.EncodeToString(sum[:])}
}

// Each algorithm's file, after now.lua (the clock every script reads), is
// its one-key script: every EVALSHA
// runs the whole chunk, so the files define no functions or tables that the
// call does not need (a top-level closure is rebuilt on every call).
//
// The TakeAll script wraps each file, unchanged, as a function of its own
// KEYS and ARGV (Lua parameters shadow the globals), followed by
// take_all.lua, which calls them: the algorithms are written once. The
// script that runs a batch's decisions together is built the same way,
// with take_each.lua; defining six functions costs it little next to the
// script call it saves each decision.
//
// Conventions of every script: quantities are integer units or
// microseconds, exact in Lua's doubles below 2^53 (sluice.Limit.Validate
// bounds them); numbers go to Redis through string.format('%d'), since
// tostring prints %.14g and loses digits; floor divisions correct the double
// quotient by one where it may round across an integer; every write sets the
// key's TTL to the decision's ResetAfter rounded up to a millisecond, so an
// expired key is exactly a fresh one; peek writes nothing.
var (
	oneScripts = make([]*script, len(scriptFiles))
	// takeAllScript checks several keys, then takes from all or none.
	takeAllScript *script
	// takeEachScript makes several independent decisions in one run: a
	// batch's calls on one server (or one cluster slot).
	takeEachScript *script
)

func init() {
	now := mustRead("now.lua")
	var algs strings.Builder
	algs.WriteString("local ALG = {}\n")
	for a, name := range scriptFiles {
		body := now + mustRead(name)
		oneScripts[a] = newScript(body)
		fmt.Fprintf(&algs, "ALG[%d] = function(KEYS, ARGV)\n%s\nend\n", a, body)
	}
	takeAllScript = newScript(algs.String() + now + mustRead("take_all.lua"))
	takeEachScript = newScript(algs.String() + mustRead("take_each.lua"))
}

func mustRead(name string) string {
	b, err := scriptFS.ReadFile("scripts/" + name)
	if err != nil {
		panic(fmt.Sprintf("redisstore: embedded script %s: %v", name, err)) // a build defect, not a runtime input
	}
	return string(b)
}

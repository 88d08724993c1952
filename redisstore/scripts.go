package redisstore

import (
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice"
)

//go:embed scripts/*.lua
var scriptFS embed.FS

// algorithm is what the Store knows of one algorithm's script.
type algorithm struct {
	file   string // its Lua file in scripts/
	suffix string // ends its Redis keys (see redisKey)
	reply  int    // integers in a take/peek reply: allowed, remaining, retry, reset, and a token where a refund needs one
	// params returns the script's ARGV[3] and ARGV[4] for l.
	params func(l sluice.Limit) (int64, int64)
	script *script // now.lua, then file; built by init
}

// algorithms is indexed by sluice.Algorithm. No suffix contains ':', so
// the text after a key's last ':' names the algorithm and no two (key,
// algorithm) pairs can map to one Redis key (see keyOf).
var algorithms = []algorithm{
	sluice.GCRA:                 {file: "gcra.lua", suffix: "gcra", reply: 4, params: intervalSpan},
	sluice.TokenBucket:          {file: "token_bucket.lua", suffix: "tb", reply: 4, params: intervalCapacity},
	sluice.LeakyBucket:          {file: "leaky_bucket.lua", suffix: "lb", reply: 4, params: intervalCapacity},
	sluice.FixedWindow:          {file: "fixed_window.lua", suffix: "fw", reply: 5, params: periodRate},
	sluice.SlidingWindowLog:     {file: "sliding_window_log.lua", suffix: "swl", reply: 5, params: periodRate},
	sluice.SlidingWindowCounter: {file: "sliding_window_counter.lua", suffix: "swc", reply: 5, params: periodRate},
}

func intervalSpan(l sluice.Limit) (int64, int64) {
	iv := l.Interval().Microseconds()
	return iv, l.Capacity() * iv
}

func intervalCapacity(l sluice.Limit) (int64, int64) {
	return l.Interval().Microseconds(), l.Capacity()
}

func periodRate(l sluice.Limit) (int64, int64) {
	return l.Period.Microseconds(), l.Rate
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

// newTakeScript is newScript for a script that takes (or grants, or
// acquires): a Lua shebang declares it, with no flags, so Redis refuses the
// whole script while it is out of memory (OOM), before it writes anything.
// Without one, Redis checks only the script's first write: a take whose
// first write may not grow memory (a DEL of an expired window, a ZREM) went
// on to create keys past maxmemory. Scripts that free memory (a release, a
// Reset) keep running.
func newTakeScript(src string) *script { return newScript("#!lua\n" + src) }

// Each algorithm's file, after now.lua (the clock every script reads), is
// its one-key script: every EVALSHA runs the whole chunk, so the files
// define no functions or tables that the call does not need (a top-level
// closure is rebuilt on every call).
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
// tostring prints %.14g and loses digits; integer division is floordiv;
// every write sets the key's TTL to the decision's ResetAfter rounded up to
// a millisecond (ttlms), so an expired key is exactly a fresh one; peek
// writes nothing.
var (
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
	for a := range algorithms {
		body := now + mustRead(algorithms[a].file)
		algorithms[a].script = newTakeScript(body)
		fmt.Fprintf(&algs, "ALG[%d] = function(KEYS, ARGV)\n%s\nend\n", a, body)
	}
	takeAllScript = newTakeScript(algs.String() + now + mustRead("take_all.lua"))
	takeEachScript = newTakeScript(algs.String() + mustRead("take_each.lua"))
}

// maxSkewName, in a script, stands for sluice.MaxClockSkew in µs.
const maxSkewName = "MAX_CLOCK_SKEW_US"

// mustRead returns an embedded script with its macros expanded and
// maxSkewName replaced by its value.
func mustRead(name string) string {
	b, err := scriptFS.ReadFile("scripts/" + name)
	if err == nil {
		var src string
		if src, err = expand(string(b)); err == nil {
			return strings.ReplaceAll(src, maxSkewName, strconv.FormatInt(sluice.MaxClockSkew.Microseconds(), 10))
		}
	}
	panic(fmt.Sprintf("redisstore: embedded script %s: %v", name, err)) // a build defect, not a runtime input
}

// The scripts' macros, written once here and expanded into each script
// as it is loaded, so that Redis runs plain statements: as Lua functions
// they would be rebuilt as closures on every EVALSHA and called, 2-4 % more
// instructions per call (BENCHMARKS.md, "floordiv and ttlms").
//
// A macro is a statement of its own line:
//
//	[local ]q = floordiv(a, b)
//
// sets q to ⌊a/b⌋ (b > 0), as memory's floorDiv: the double quotient,
// corrected by one where it rounds across an integer. a and b are names or
// integer literals, neither of them q.
//
//	local t = ttlms(us)
//
// sets t to us microseconds rounded up to whole milliseconds: a key's TTL.
// us is any expression.
//
//	expire(key, us)
//
// gives key a TTL of us microseconds (ttlms), or deletes it when us is not
// positive: the key is fresh again. key and us are names.
//
//	local w, skew = window(sw, period)
//
// sets w to the fixed window of now, or refunding, of the take's now
// (ARGV[6]), in windows of period; sw is the stored window. A caller whose
// clock is behind sw (another host's clock, or TIME after a failover) is
// charged in that newer window, as at its start: an older window must never
// replace a newer one, which would admit its whole rate again. now moves to
// the start of sw, and skew is what it moved, to turn durations back into
// the caller's. Only as far as a clock lagging by sluice.MaxClockSkew can
// explain, counted in windows as memory's lagging does: an sw further ahead
// counts windows of another period (the limit changed), and the script
// reads it as any window but w, as nothing.
//
//	local reset = swcreset(cur, prev, w, period)
//
// sets reset to the time from now until a sliding window counter whose
// window w counts cur and whose window before counts prev is fresh: the end
// of w+1 while cur counts, of w while only prev does, else 0. All are names.
//
//	local n, last = loadbucket(key, fresh)
//
// reads a bucket's state, the HASH key of fields named as n (a whole count
// at least 0) and last (a time, µs), as the token and leaky buckets keep
// it: state that is not two integers below 2^53 is an error; no state is a
// fresh bucket, n = fresh and last = now, or, refunding, nothing to give
// back (the script returns {}). fresh is a name or an integer literal, the
// others names.
//
//	storebucket(key, n, last, reset)
//
// writes it back for a decision whose ResetAfter is reset µs: with a TTL
// of reset (ttlms), or, when reset is not positive, deleting the key (the
// bucket is fresh again). All are names.
const (
	floordivLua = `$q = math.floor($a / $b)
if $q * $b > $a then
  $q = $q - 1
elseif ($q + 1) * $b <= $a then
  $q = $q + 1
end`
	ttlmsLua = `local $t_us = $us + 999
local $t = floordiv($t_us, 1000)`
	expireLua = `if $us > 0 then
  local ttl = ttlms($us)
  redis.call('PEXPIRE', $key, string.format('%d', ttl))
else
  redis.call('DEL', $key)
end`
	swcresetLua = `local $r = 0
if $cur > 0 then
  $r = ($w + 2) * $period - now
elseif $prev > 0 then
  $r = ($w + 1) * $period - now
end`
	loadbucketLua = `local h = redis.call('HMGET', $key, '$n', '$last')
local $n, $last
if h[1] or h[2] then
  $n, $last = tonumber(h[1]), tonumber(h[2])
  if $n == nil or $last == nil or not ($n >= 0 and $n < 9007199254740992) or $n % 1 ~= 0 or not ($last > -9007199254740992 and $last < 9007199254740992) or $last % 1 ~= 0 then
    error({err = 'ERR sluice: corrupt state in ' .. $key})
  end
elseif mode == 'refund' then
  return {}
else
  $n, $last = $fresh, now
end`
	storebucketLua = `if $reset > 0 then
  local ttl = ttlms($reset)
  redis.call('HSET', $key, '$n', string.format('%d', $n), '$last', string.format('%d', $last))
  redis.call('PEXPIRE', $key, string.format('%d', ttl))
else
  redis.call('DEL', $key)
end`
	windowLua = `local at = now
if mode == 'refund' then
  at = tonumber(ARGV[6])
end
local $w = floordiv(at, $period)
local $skew = 0
if mode ~= 'refund' and $sw and $sw > $w then
  local lag = floordiv(MAX_CLOCK_SKEW_US, $period)
  if $sw - $w <= 1 + lag then
    $skew = $sw * $period - now
    now, $w = $sw * $period, $sw
  end
end`
)

var (
	floordivCall    = regexp.MustCompile(`^(\s*)(local )?([A-Za-z_]\w*) = floordiv\(([A-Za-z_]\w*|\d+), ([A-Za-z_]\w*|\d+)\)$`)
	ttlmsCall       = regexp.MustCompile(`^(\s*)local ([A-Za-z_]\w*) = ttlms\((.+)\)$`)
	expireCall      = regexp.MustCompile(`^(\s*)expire\(([A-Za-z_]\w*), ([A-Za-z_]\w*)\)$`)
	windowCall      = regexp.MustCompile(`^(\s*)local ([A-Za-z_]\w*), ([A-Za-z_]\w*) = window\(([A-Za-z_]\w*), ([A-Za-z_]\w*)\)$`)
	swcresetCall    = regexp.MustCompile(`^(\s*)local ([A-Za-z_]\w*) = swcreset\(([A-Za-z_]\w*), ([A-Za-z_]\w*), ([A-Za-z_]\w*), ([A-Za-z_]\w*)\)$`)
	loadbucketCall  = regexp.MustCompile(`^(\s*)local ([A-Za-z_]\w*), ([A-Za-z_]\w*) = loadbucket\(([A-Za-z_]\w*), ([A-Za-z_]\w*|\d+)\)$`)
	storebucketCall = regexp.MustCompile(`^(\s*)storebucket\(([A-Za-z_]\w*), ([A-Za-z_]\w*), ([A-Za-z_]\w*), ([A-Za-z_]\w*)\)$`)
	macroName       = regexp.MustCompile(`\b(floordiv|ttlms|expire|window|swcreset|loadbucket|storebucket)\(`)
)

// expand replaces every macro statement in src by its definition.
func expand(src string) (string, error) {
	var out strings.Builder
	lines := strings.Split(src, "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		code, comment, _ := strings.Cut(line, "--")
		if !macroName.MatchString(code) {
			out.WriteString(line)
			if i < len(lines)-1 {
				out.WriteByte('\n')
			}
			continue
		}
		code = strings.TrimRight(code, " \t")
		var body string
		if m := floordivCall.FindStringSubmatch(code); m != nil {
			q, a, b := m[3], m[4], m[5]
			if q == a || q == b {
				return "", fmt.Errorf("floordiv assigns to its own operand: %s", strings.TrimSpace(line))
			}
			body = m[2] + strings.NewReplacer("$q", q, "$a", a, "$b", b).Replace(floordivLua)
		} else if m := ttlmsCall.FindStringSubmatch(code); m != nil {
			body = strings.NewReplacer("$t", m[2], "$us", m[3]).Replace(ttlmsLua)
		} else if m := expireCall.FindStringSubmatch(code); m != nil {
			body = strings.NewReplacer("$key", m[2], "$us", m[3]).Replace(expireLua)
		} else if m := swcresetCall.FindStringSubmatch(code); m != nil {
			body = strings.NewReplacer("$r", m[2], "$cur", m[3], "$prev", m[4], "$w", m[5], "$period", m[6]).Replace(swcresetLua)
		} else if m := loadbucketCall.FindStringSubmatch(code); m != nil {
			body = strings.NewReplacer("$n", m[2], "$last", m[3], "$key", m[4], "$fresh", m[5]).Replace(loadbucketLua)
		} else if m := storebucketCall.FindStringSubmatch(code); m != nil {
			body = strings.NewReplacer("$key", m[2], "$n", m[3], "$last", m[4], "$reset", m[5]).Replace(storebucketLua)
		} else if m := windowCall.FindStringSubmatch(code); m != nil {
			body = strings.NewReplacer("$w", m[2], "$skew", m[3], "$sw", m[4], "$period", m[5]).Replace(windowLua)
		} else {
			return "", fmt.Errorf("a macro outside its statement form: %s", strings.TrimSpace(line))
		}
		indent := line[:len(line)-len(strings.TrimLeft(line, " \t"))]
		expanded := strings.Split(body, "\n")
		for j := range expanded {
			expanded[j] = indent + expanded[j]
		}
		if comment != "" {
			expanded[0] += " --" + comment
		}
		// Splice the expansion in place, to be read again: a macro may use
		// another.
		lines = append(lines[:i], append(expanded, lines[i+1:]...)...)
		i--
	}
	return out.String(), nil
}

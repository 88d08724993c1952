package redisstore

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
)

// writeScripts, when set, names a directory to which TestScripts writes
// every script as Redis receives it (bench/scriptcost.sh measures those).
var writeScripts = flag.String("write-scripts", "", "directory to write the composed scripts to")

func TestExpand(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, src, want string
	}{
		{"plain", "local a = 1\nreturn a", "local a = 1\nreturn a"},
		{"floordiv", "  local w = floordiv(at, period)", `  local w = math.floor(at / period)
  if w * period > at then
    w = w - 1
  elseif (w + 1) * period <= at then
    w = w + 1
  end`},
		{"floordiv assigns", "w = floordiv(at, 10)", `w = math.floor(at / 10)
if w * 10 > at then
  w = w - 1
elseif (w + 1) * 10 <= at then
  w = w + 1
end`},
		{"ttlms", "local ttl = ttlms(reset + skew) -- why", `local ttl_us = reset + skew + 999 -- why
local ttl = math.floor(ttl_us / 1000)
if ttl * 1000 > ttl_us then
  ttl = ttl - 1
elseif (ttl + 1) * 1000 <= ttl_us then
  ttl = ttl + 1
end`},
		{"expire", "  expire(key, reset)", `  if reset > 0 then
    local ttl_us = reset + 999
    local ttl = math.floor(ttl_us / 1000)
    if ttl * 1000 > ttl_us then
      ttl = ttl - 1
    elseif (ttl + 1) * 1000 <= ttl_us then
      ttl = ttl + 1
    end
    redis.call('PEXPIRE', key, string.format('%d', ttl))
  else
    redis.call('DEL', key)
  end`},
		{"window", "local w, skew = window(sw, period)", `local at = now
if mode == 'refund' then
  at = tonumber(ARGV[6])
end
local w = math.floor(at / period)
if w * period > at then
  w = w - 1
elseif (w + 1) * period <= at then
  w = w + 1
end
local skew = 0
if mode ~= 'refund' and sw and sw > w then
  local lag = math.floor(MAX_CLOCK_SKEW_US / period)
  if lag * period > MAX_CLOCK_SKEW_US then
    lag = lag - 1
  elseif (lag + 1) * period <= MAX_CLOCK_SKEW_US then
    lag = lag + 1
  end
  if sw - w <= 1 + lag then
    skew = sw * period - now
    now, w = sw * period, sw
  end
end`},
		{"swcreset", "local reset = swcreset(cur, prev, w, period)", `local reset = 0
if cur > 0 then
  reset = (w + 2) * period - now
elseif prev > 0 then
  reset = (w + 1) * period - now
end`},
		{"loadbucket", "local level, last = loadbucket(key, 0)", `local h = redis.call('HMGET', key, 'level', 'last')
local level, last
if h[1] or h[2] then
  level, last = tonumber(h[1]), tonumber(h[2])
  if level == nil or last == nil or not (level >= 0 and level < 9007199254740992) or level % 1 ~= 0 or not (last > -9007199254740992 and last < 9007199254740992) or last % 1 ~= 0 then
    error({err = 'ERR sluice: corrupt state in ' .. key})
  end
elseif mode == 'refund' then
  return {}
else
  level, last = 0, now
end`},
		{"storebucket", "  storebucket(key, tokens, last, reset)", `  if reset > 0 then
    local ttl_us = reset + 999
    local ttl = math.floor(ttl_us / 1000)
    if ttl * 1000 > ttl_us then
      ttl = ttl - 1
    elseif (ttl + 1) * 1000 <= ttl_us then
      ttl = ttl + 1
    end
    redis.call('HSET', key, 'tokens', string.format('%d', tokens), 'last', string.format('%d', last))
    redis.call('PEXPIRE', key, string.format('%d', ttl))
  else
    redis.call('DEL', key)
  end`},
		{"comment mentions a macro", "-- floordiv(a, b) is a macro", "-- floordiv(a, b) is a macro"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := expand(tt.src)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("expand(%q) =\n%s\nwant\n%s", tt.src, got, tt.want)
			}
		})
	}
	for _, bad := range []string{
		"return floordiv(a, b)",
		"local q = floordiv(a + 1, b)",
		"local q = floordiv(q, b)",
		"redis.call('PEXPIRE', key, ttlms(reset))",
		"expire(key, reset + 1)",
		"local w = window(sw, period)",
		"local n, last = loadbucket(key, capacity + 1)",
		"storebucket(key, n, last)",
	} {
		if got, err := expand(bad); err == nil {
			t.Errorf("expand(%q) = %q, want an error", bad, got)
		}
	}
}

// TestScripts checks that every script Redis receives is expanded, and
// writes them out under -write-scripts.
func TestScripts(t *testing.T) {
	t.Parallel()
	all := map[string]*script{"take_all.lua": takeAllScript, "take_each.lua": takeEachScript, "reset.lua": resetScript}
	for a, alg := range algorithms {
		if alg.script == nil || alg.file == "" || alg.suffix == "" || alg.params == nil {
			t.Fatalf("algorithms[%v] is incomplete", sluice.Algorithm(a))
		}
		all[alg.file] = alg.script
	}
	for name, sc := range all {
		if m := macroName.FindString(sc.src); m != "" {
			t.Errorf("%s: %q survived expansion", name, m)
		}
		if strings.Contains(sc.src, maxSkewName) {
			t.Errorf("%s: %s survived", name, maxSkewName)
		}
		if *writeScripts != "" {
			if err := os.WriteFile(filepath.Join(*writeScripts, name), []byte(sc.src), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
